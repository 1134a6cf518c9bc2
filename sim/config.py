"""Settings of the fleet model that a scenario file does not carry (docs/simulator.md §Model).

Frozen, validated once: a bad value raises :class:`headroom.kernel.errors.ConfigError` with one
line per problem naming the field (``sim.step_s: must be > 0, got 0``). Every default says where it
comes from; the scenarios' numbers (costs, capacity, traffic) stay in the scenario file.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from typing import Any

from headroom.defences.replicas import DEDICATED_REPLICAS
from headroom.kernel.checks import FieldChecker
from headroom.kernel.errors import ConfigError
from headroom.sim.latency import LatencyConfig

__all__ = ["SimConfig"]

_PREFIX = "sim"


@dataclass(frozen=True, slots=True)
class SimConfig:
    """The simulator's own model settings (the scenario gives costs, capacity and traffic)."""

    # Base time step of the fluid model. One second resolves queues that build over a second and
    # keeps a 24 h, 3-region day at ~260k region-steps; reclaims are resolved finer (sub-steps).
    step_s: float = 1.0
    # Equal-probability value bins per segment (population cells): 8 resolves "lowest value
    # first" to 1/8 of a segment, and the client's value-rank rule is applied exactly inside a bin.
    value_bins: int = 8
    latency: LatencyConfig = field(default_factory=LatencyConfig)
    # A request slower than timeout_factor × SLO is abandoned by its client (a timeout).
    timeout_factor: float = 2.0
    # Controller publish → client apply. Loopback Kafka measures ~10 ms (target_propagation bench);
    # a fleet of clients polling a compacted topic takes seconds: 2 s is a conservative middle.
    propagation_s: float = 2.0
    # Share of requests that may be routed to the strong model (docs/messages.md ``eligible``), when
    # the scenario gives no ``eligible_share``; the streaming side's default is 1.0 as well.
    eligible_share: float = 1.0
    # A request routed to strong replicas that are gone fails fast (connection refused) and is
    # retried on the base path: this is what the failed attempt costs.
    failover_ms: float = 20.0
    # A strong request downgraded by the strong server's admission control goes back at once.
    downgrade_ms: float = 1.0
    # While a server sheds or is overloaded the engine steps this finely (CoDel's interval is
    # 100 ms; one reading per second cannot resolve its control law).
    hot_step_s: float = 0.1
    # Event-loop turns of a ranking server per request (arrival, CPU → accelerator hand-off,
    # response): a server notices a reclaim at its next turn (docs/simulator.md §Reclaims).
    server_turns_per_request: float = 3.0
    # Peer policies: a region is modelled as servers of this many dedicated cores, each with the
    # same limit (Netflix/Envoy limits are per server); the limit sees this many samples a step.
    cores_per_server: float = 8.0
    peer_samples_per_step: int = 16
    # Mixed (RMA) replicas per region, each with an even share of the opportunistic levels: an
    # RMA request's extras run on its threads within its replica's quota, and what would not
    # finish within the optional budget there is trimmed (headroom.defences.replicas, the rule
    # `headroom up` starts its replicas by: 2, its --dedicated-replicas default).
    mixed_replicas: int = DEDICATED_REPLICAS

    def __post_init__(self) -> None:
        problems = self.problems()
        if problems:
            raise ConfigError(problems)

    def problems(self) -> list[str]:
        c = FieldChecker(_PREFIX)
        c.positive("step_s", self.step_s)
        c.integer("value_bins", self.value_bins, 1)
        if isinstance(self.value_bins, int):
            c.at_most("value_bins", self.value_bins, 64)
        if not isinstance(self.latency, LatencyConfig):
            c.fail("latency", "must be a LatencyConfig", self.latency)
        else:
            lat = self.latency
            c.nonnegative("latency.overhead_ms", lat.overhead_ms)
            c.positive("latency.cpu_parallelism", lat.cpu_parallelism)
            c.nonnegative("latency.service_cv", lat.service_cv)
            c.integer("latency.samples_per_window", lat.samples_per_window, 64)
        c.at_least("timeout_factor", self.timeout_factor, 1.0)
        c.nonnegative("propagation_s", self.propagation_s)
        c.share("eligible_share", self.eligible_share)
        c.nonnegative("failover_ms", self.failover_ms)
        c.nonnegative("downgrade_ms", self.downgrade_ms)
        c.positive("hot_step_s", self.hot_step_s)
        c.positive("server_turns_per_request", self.server_turns_per_request)
        c.positive("cores_per_server", self.cores_per_server)
        c.integer("peer_samples_per_step", self.peer_samples_per_step, 1)
        c.integer("mixed_replicas", self.mixed_replicas, 1)
        return c.problems

    def with_overrides(self, **overrides: Any) -> SimConfig:
        """A copy with some fields replaced; unknown names raise ConfigError."""
        known = {f.name for f in fields(self)}
        unknown = sorted(set(overrides) - known)
        if unknown:
            raise ConfigError(
                [
                    f"{_PREFIX}.{u}: unknown setting (known: {', '.join(sorted(known))})"
                    for u in unknown
                ]
            )
        return replace(self, **overrides)
