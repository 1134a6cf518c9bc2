"""Millisecond-scale local defences: server-side and client-side shedding of optional work.

Pure code: no asyncio, no Kafka, no wall clock, no global random state. Time is passed in as
``now`` (seconds, event time or virtual time), so the simulator and the ranking-server worker
drive the same objects. Every object snapshots to plain JSON-able data and restores exactly.
This module holds the shared vocabulary and the server side; the client side is
:mod:`headroom.defences.client_shedding`, the decaying histogram behind both
:mod:`headroom.defences.histogram`, and CoDel's drop times in closed form
:mod:`headroom.defences.codel`.

Vocabulary
==========
*Baseline work* is the base candidate count on the base model: a fixed promise, never touched
here. *Optional work* is what the levers add to a request: RMA extra candidates (divisible, one
candidate at a time) and SBM routing to the strong model (indivisible: the request is either
scored by the strong model or downgraded to the base model). Costs are milliseconds of work per
resource (``cpu``, ``accelerator``), e.g. ``extra × cpu_ms_per_candidate``.

Server side: :class:`ServerShedder`
===================================
One decision per request, an enum (:class:`Decision`, after Envoy's ``RequestForwardingAction``):
``ADMIT`` (all optional work as asked), ``TRIM`` (extra candidates trimmed to ``n``),
``DOWNGRADE`` (strong model → base model; extras kept, possibly trimmed), ``SHED`` (all optional
work dropped). A request without optional work is always ``ADMIT``: baseline work is never shed
for optional work.

Three mechanisms decide, in this order:

1. **Hard stops.** A resource whose free slots are exhausted (``free ≤ reserve_slots``) or whose
   opportunistic level is zero takes no optional work at all.
2. **Value threshold, lowest value per unit of compute first.** Every optional request's value
   per unit of compute, ``vpc = value / (w_cpu·cpu_ms + w_acc·accelerator_ms)``, goes into a
   decaying, cost-weighted log-histogram (:class:`DecayedLogHistogram`). The threshold θ is its
   τ-quantile: the cheapest-to-lose τ share of recent optional *work* lies below θ and is shed.
   τ = max(τ_overload, τ_budget):

   * τ_overload follows CoDel (Nichols & Jacobson, "Controlling Queue Delay", ACM Queue 2012):
     overload is declared when the queueing delay has stayed above ``target_queue_ms`` for a full
     ``interval_ms`` (defaults 5 ms and 100 ms, CoDel's published constants). While overloaded,
     τ rises by ``shed_step`` at CoDel's control law times ``interval / sqrt(count)``; once the
     delay falls below the target it decays linearly at ``recovery_per_s`` (hysteresis, so the
     threshold does not whipsaw). The drop times are ``t_c = t_1 + interval·(H(c) − 1)`` with
     ``H(c) = Σ_{k≤c} k^(−1/2)``, so under sustained overload their count grows with the square of
     the time spent dropping; :func:`codel_catch_up` finds the next one in closed form (the
     Euler–Maclaurin expansion of ``H``) instead of stepping through every one in between, so an
     :meth:`~ServerShedder.observe` call costs O(1) however long the overload lasts.
   * τ_budget = max_r (1 − capacity_r / demand_r): the share of offered optional work that cannot
     fit the opportunistic level, from a time-decayed rate of offered optional cost per resource.
3. **Token bucket per resource.** The opportunistic level (units: cores or device equivalents =
   ms of work per ms) refills a bucket of depth ``level × burst_ms`` (at least ``min_depth_ms``
   while the level is positive, so a fractional level still pays for one whole request that
   cannot be trimmed, a strong-model request). Admitted optional work spends
   it: the strong part first (all or nothing → ``DOWNGRADE``), then as many extra candidates as
   the remaining tokens pay for (``TRIM``). This is the hard guarantee that optional work stays
   within the announced capacity; the threshold in (2) makes the bucket value-aware.

A capacity drop acts at once: :meth:`ServerShedder.on_capacity` clamps the buckets to the new
depth, so the very next decision sees it, and :meth:`ServerShedder.trim_inflight` says which work
already running to cut (lowest value per unit of occupied capacity first) so the remainder fits
the new level. No timer is involved anywhere.

:meth:`ServerShedder.decide_batch` takes numpy arrays for requests that arrive in the same step
(the simulator cannot afford a Python call per request): it orders them by ``vpc`` and fills the
buckets greedily, so within a batch optional work is shed strictly lowest ``vpc`` first.

Client side: :class:`ClientShedder`
===================================
An optional-work multiplier ``m ∈ [0, 1]`` per server, from the health carried in every response
(overload flag, queueing delay). AIMD after Chiu & Jain (1989) and TCP congestion avoidance:
multiplicative decrease ``m ← m·β`` on an overloaded response (β = 0.5, TCP's halving), at most once
per ``decrease_interval_ms`` so a burst of responses from one overload episode counts once (TCP
reduces once per round trip); additive recovery ``m ← m + recovery_per_s·Δt`` while responses are
healthy, so recovery is rate-limited in time rather than in responses. The multiplier is spent
lowest value first: a request keeps its optional work only if its value rank (its CDF among recent
requests, :class:`ValueRanker`) is ≥ 1 − m. :meth:`ClientShedder.on_response` returns a
:class:`ShedTransition` when shedding starts or stops so the caller can log ``shedding.started`` /
``shedding.stopped`` with how much optional work was dropped.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import IntEnum, StrEnum
from typing import Any, NamedTuple

import numpy as np
import numpy.typing as npt

from headroom.defences.codel import CODEL_STEPS, codel_catch_up
from headroom.defences.histogram import DecayedLogHistogram, HistogramConfig
from headroom.kernel.checks import FieldChecker
from headroom.kernel.errors import ConfigError
from headroom.kernel.jsonstate import json_float

# A request's optional parts (RMA's extra candidates) wait for capacity at low priority for at
# most this share of the SLO, counted from the request's arrival at its server: extras that cannot
# start by then are dropped and the baseline answer goes back. The rule of both engines (the
# streaming client sends the budget with every request and its server drops the extras; the
# simulator's latency model does the same, sim/latency.py *Optional budget*).
OPTIONAL_BUDGET_SHARE = 0.5


def optional_budget_ms(slo_p99_ms: float, share: float = OPTIONAL_BUDGET_SHARE) -> float:
    """How long (ms) a request's optional parts may wait for capacity before they are dropped."""
    return float(slo_p99_ms) * share


def extras_within_budget(
    extra: int,
    left_ms: float,
    phases: Sequence[tuple[float, float]],
) -> int:
    """The most of ``extra`` candidates whose optional phases finish within ``left_ms`` (what
    is left of the request's optional budget after its baseline parts): ``phases`` gives, per
    phase in order (CPU, then accelerator), the work of one extra candidate (ms at unit speed)
    and the units the phase may run on (what the opportunistic level leaves it). Optional work
    that cannot finish in time is never started: it would be dropped at the deadline with its
    work wasted and its request held back (the baseline answer goes back at once instead)."""
    per_ms = 0.0
    for work_ms, units in phases:
        if work_ms <= 0.0:
            continue
        if units <= 0.0:
            return 0
        per_ms += work_ms / units
    if per_ms <= 0.0:
        return max(0, int(extra))
    if not left_ms > 0.0:
        return 0
    fit = min(float(extra), left_ms / per_ms + 1e-9)  # capped first: per_ms may be tiny
    return max(0, math.floor(fit))


__all__ = [
    "OPTIONAL_BUDGET_SHARE",
    "BatchVerdict",
    "Decision",
    "InflightCut",
    "InflightWork",
    "OptionalCapacity",
    "OptionalWork",
    "OverloadTransition",
    "ServerShedConfig",
    "ServerShedStats",
    "ServerShedder",
    "ShedEvent",
    "ShedTransition",
    "Verdict",
    "extras_within_budget",
    "optional_budget_ms",
]

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]
CodeArray = npt.NDArray[np.int8]

_INF = math.inf
_EPS = 1e-9  # ms: rounding slack when comparing costs with bucket contents (same everywhere)


# --------------------------------------------------------------------------------------------
# Decisions and events
# --------------------------------------------------------------------------------------------


class Decision(IntEnum):
    """What happens to one request's optional work (the codes of :meth:`decide_batch`)."""

    ADMIT = 0  # all optional work as asked (or the request had none)
    TRIM = 1  # extra candidates trimmed to Verdict.extra; strong model kept if asked
    DOWNGRADE = 2  # strong model → base model; any extras asked for kept, maybe trimmed (> 0)
    SHED = 3  # the extra candidates asked for all dropped, and the strong model if asked


class ShedEvent(StrEnum):
    """Transitions worth an event-log line (docs/events.md)."""

    STARTED = "shedding.started"
    STOPPED = "shedding.stopped"
    OVERLOAD_ENTERED = "overload.entered"
    OVERLOAD_LEFT = "overload.left"


@dataclass(frozen=True, slots=True)
class ShedTransition:
    """Shedding started or stopped on one side; ``dropped`` = optional work dropped so far in the
    episode (server: requests with some optional work cut; client: requests that lost theirs)."""

    event: ShedEvent
    side: str  # "server" | "client"
    now: float
    dropped: int
    dropped_extra_candidates: int = 0
    dropped_strong: int = 0
    multiplier: float | None = None  # client side: the multiplier after the transition

    @property
    def lever(self) -> str | None:
        """``rma`` / ``sbm`` from what was dropped (``rma,sbm`` for both; None when unknown)."""
        if self.dropped_extra_candidates and self.dropped_strong:
            return "rma,sbm"
        if self.dropped_extra_candidates:
            return "rma"
        if self.dropped_strong:
            return "sbm"
        return None

    def event_fields(self, lever: str | None = None) -> dict[str, Any]:
        """The fields of a ``shedding.started`` / ``shedding.stopped`` line (docs/events.md);
        ``lever`` overrides the inferred one (a client knows which lever it sheds)."""
        fields: dict[str, Any] = {
            "kind": self.event.value,
            "side": self.side,
            "lever": lever or self.lever,
            "dropped": self.dropped,
            "dropped_extra_candidates": self.dropped_extra_candidates,
            "dropped_strong": self.dropped_strong,
        }
        if self.multiplier is not None:
            fields["multiplier"] = self.multiplier
        return fields


@dataclass(frozen=True, slots=True)
class OverloadTransition:
    """The server entered or left its overloaded state (CoDel or exhausted slots)."""

    event: ShedEvent  # OVERLOAD_ENTERED | OVERLOAD_LEFT
    now: float
    queue_ms: float
    reason: str  # "queue_delay" | "slots_exhausted" | "recovered"

    def event_fields(self) -> dict[str, Any]:
        """The fields of an ``overload.entered`` / ``overload.left`` line (docs/events.md)."""
        return {"kind": self.event.value, "queue_ms": self.queue_ms, "reason": self.reason}


# --------------------------------------------------------------------------------------------
# Inputs and outputs
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class OptionalCapacity:
    """Opportunistic level optional work may use on this server: cores and device equivalents."""

    cpu: float
    accelerator: float

    def __post_init__(self) -> None:
        problems = [
            f"{name}: must be a finite number ≥ 0 (got {value!r})"
            for name, value in (("cpu", self.cpu), ("accelerator", self.accelerator))
            if not (math.isfinite(value) and value >= 0.0)
        ]
        if problems:
            raise ConfigError(problems)


@dataclass(frozen=True, slots=True)
class OptionalWork:
    """One request's optional work, as the server sees it on arrival.

    ``extra_*_ms`` are the total costs of all ``extra`` candidates (per-candidate cost × extra);
    ``strong_*_ms`` the *incremental* cost of the strong model over the base model (zero unless
    ``strong``). ``value`` is the request's value signal (non-negative). Not validated, for
    speed: a NaN or negative value never passes the threshold, so such a request loses its
    optional work and nothing else.
    """

    value: float
    extra: int = 0
    extra_cpu_ms: float = 0.0
    extra_accelerator_ms: float = 0.0
    strong: bool = False
    strong_cpu_ms: float = 0.0
    strong_accelerator_ms: float = 0.0


class Verdict(NamedTuple):
    """A decision and what remains of the optional work: extras allowed, strong model kept."""

    decision: Decision
    extra: int
    strong: bool


class BatchVerdict(NamedTuple):
    """:meth:`ServerShedder.decide_batch` output: one entry per request."""

    codes: CodeArray  # Decision values as int8
    extra: IntArray  # extra candidates allowed
    strong: BoolArray  # strong model kept


@dataclass(frozen=True, slots=True)
class InflightWork:
    """Optional work already running on the server.

    ``cpu`` / ``accelerator`` are the opportunistic units its optional part occupies right now
    (e.g. 1 core while its extra candidates are scored on one worker thread; the simulator's
    fluid model uses cost rate). ``extra`` / ``strong`` say what the optional part is.
    """

    id: Hashable
    value: float
    cpu: float
    accelerator: float
    extra: int = 0
    strong: bool = False


@dataclass(frozen=True, slots=True)
class InflightCut:
    """Cut one in-flight request's optional part: ``SHED`` (stop scoring its extra candidates,
    and drop the strong model if it had it) or ``DOWNGRADE`` (strong-only: re-run on base)."""

    id: Hashable
    decision: Decision
    value: float


@dataclass(frozen=True, slots=True)
class ServerShedStats:
    """Counters since construction (they survive snapshot/restore)."""

    decisions: int
    admitted: int
    trimmed: int
    downgraded: int
    shed: int
    dropped_extra_candidates: int
    dropped_strong: int
    inflight_cut: int


# --------------------------------------------------------------------------------------------
# Server side
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ServerShedConfig:
    """Server-side shedding settings. Defaults cite their source in the module docstring."""

    target_queue_ms: float = 5.0  # CoDel target
    interval_ms: float = 100.0  # CoDel interval
    shed_step: float = 0.1  # τ_overload raised by this at each CoDel drop time
    max_shed_quantile: float = 1.0  # τ_overload never exceeds this
    recovery_per_s: float = 0.5  # τ_overload decay once the delay is back under target
    burst_ms: float = 50.0  # token-bucket depth: level × burst_ms of work
    # ... but at least this many ms of work while the level is > 0: the largest request that
    # cannot be trimmed (a strong-model request), so a small level still serves one at a time
    min_depth_ms: float = 0.0
    demand_window_ms: float = 1000.0  # time constant of the offered-demand rate estimate
    budget_aware: bool = True  # include τ_budget in the threshold
    reserve_slots: int = 0  # free slots ≤ this = exhausted (kept for baseline bursts)
    cpu_cost_weight: float = 1.0  # w_cpu in vpc = value / (w_cpu·cpu_ms + w_acc·acc_ms)
    accelerator_cost_weight: float = 1.0  # w_acc
    shed_quiet_ms: float = 1000.0  # no drop for this long ends a shedding episode
    threshold_refresh: int = 64  # recompute θ at least every this many optional requests
    histogram: HistogramConfig = field(default_factory=HistogramConfig)

    def __post_init__(self) -> None:
        p = "shedding.server"
        c = FieldChecker(p)
        c.nonnegative("target_queue_ms", self.target_queue_ms)
        c.positive("interval_ms", self.interval_ms)
        c.between("shed_step", self.shed_step, 0.0, 1.0, lo_open=True)
        c.share("max_shed_quantile", self.max_shed_quantile)
        c.nonnegative("recovery_per_s", self.recovery_per_s)
        c.positive("burst_ms", self.burst_ms)
        c.nonnegative("min_depth_ms", self.min_depth_ms)
        c.positive("demand_window_ms", self.demand_window_ms)
        c.nonnegative("cpu_cost_weight", self.cpu_cost_weight)
        c.nonnegative("accelerator_cost_weight", self.accelerator_cost_weight)
        c.nonnegative("shed_quiet_ms", self.shed_quiet_ms)
        c.integer("reserve_slots", self.reserve_slots, 0)
        c.integer("threshold_refresh", self.threshold_refresh, 1)
        c.require(
            self.cpu_cost_weight + self.accelerator_cost_weight > 0.0,
            "cpu_cost_weight",
            "at least one cost weight must be > 0",
            self.cpu_cost_weight,
        )
        c.problems += self.histogram.validate(f"{p}.histogram")
        c.raise_if_any()


class ServerShedder:
    """Server-side shedding core for one ranking server (see the module docstring).

    Call :meth:`observe` with each health reading (queueing delay, free slots),
    :meth:`on_capacity` whenever the opportunistic level changes, :meth:`decide` (or
    :meth:`decide_batch`) for each arriving request, :meth:`trim_inflight` after a capacity drop,
    and :meth:`poll` now and then for ``shedding.started`` / ``shedding.stopped`` transitions.
    """

    def __init__(
        self,
        config: ServerShedConfig | None = None,
        capacity: OptionalCapacity | None = None,
        now: float = 0.0,
    ) -> None:
        cfg = config or ServerShedConfig()
        self.config = cfg
        cap = capacity or OptionalCapacity(0.0, 0.0)
        self._wc = cfg.cpu_cost_weight
        self._wa = cfg.accelerator_cost_weight
        # Opportunistic level (units = ms of work per ms) and token buckets (ms of work).
        self._cap_cpu = cap.cpu
        self._cap_acc = cap.accelerator
        self._burst = cfg.burst_ms
        self._min_depth = cfg.min_depth_ms
        self._tok_cpu = self._depth(cap.cpu)  # a new server starts with full buckets
        self._tok_acc = self._depth(cap.accelerator)
        self._t = now  # time the buckets, τ decay and demand decay were last brought up to
        # Offered optional demand, time-decayed sums of ms (rate = sum / demand_window_ms).
        self._dem_cpu = 0.0
        self._dem_acc = 0.0
        # CoDel state.
        self._first_above: float | None = None
        self._dropping = False
        self._count = 0
        self._drop_next = 0.0
        self._queue_ms = 0.0
        self._exh_cpu = False
        self._exh_acc = False
        self._reported_overload = False
        self._codel_steps = 0  # loop iterations spent on CoDel drop times (cost, not state)
        # τ_overload and the cached threshold θ.
        self._tau_over = 0.0
        self._hist = DecayedLogHistogram(cfg.histogram)
        self._theta = 0.0
        self._theta_tau = 0.0
        self._since_refresh = 0
        self._dirty = True
        # Shedding episode (for poll()).
        self._shedding = False
        self._last_drop = -_INF
        self._ep_dropped = 0
        self._ep_extra = 0
        self._ep_strong = 0
        # Counters.
        self._n = [0, 0, 0, 0]  # per Decision
        # Config scalars, read on every decision (attribute look-ups are the hot path's cost).
        self._window = cfg.demand_window_ms
        self._recovery = cfg.recovery_per_s
        self._budget_aware = cfg.budget_aware
        self._refresh = cfg.threshold_refresh
        self._dropped_extra = 0
        self._dropped_strong = 0
        self._inflight_cut = 0

    def _depth(self, level: float) -> float:
        """A bucket's depth for ``level``: ``level × burst_ms``, at least ``min_depth_ms``."""
        if not level > 0.0:
            return 0.0
        depth = level * self._burst
        return depth if depth >= self._min_depth else self._min_depth

    # -- time -----------------------------------------------------------------------------

    def _advance(self, now: float) -> None:
        """Bring buckets, τ_overload and the demand estimate up to ``now``.

        Time never runs backwards here: an older ``now`` (out-of-order readings) changes nothing.
        """
        dt = now - self._t
        if dt <= 0.0:
            return
        self._t = now
        dt_ms = dt * 1000.0
        cap = self._cap_cpu
        if cap > 0.0:
            tok = self._tok_cpu + cap * dt_ms
            depth = cap * self._burst
            if depth < self._min_depth:
                depth = self._min_depth
            self._tok_cpu = depth if tok > depth else tok
        cap = self._cap_acc
        if cap > 0.0:
            tok = self._tok_acc + cap * dt_ms
            depth = cap * self._burst
            if depth < self._min_depth:
                depth = self._min_depth
            self._tok_acc = depth if tok > depth else tok
        if self._dem_cpu > 0.0 or self._dem_acc > 0.0:
            decay = math.exp(-dt_ms / self._window)
            self._dem_cpu *= decay
            self._dem_acc *= decay
        if self._tau_over > 0.0 and not self._dropping:
            tau = self._tau_over - self._recovery * dt
            self._tau_over = tau if tau > 0.0 else 0.0
            self._dirty = True

    # -- inputs ---------------------------------------------------------------------------

    def on_capacity(self, level: OptionalCapacity, now: float) -> bool:
        """Set the opportunistic level; takes effect on the very next decision.

        A bucket keeps its fill fraction when its level falls (tokens × new/old, so a drop to
        zero empties it at once) and gains the new depth when its level rises (granted capacity
        is usable at once). Returns True when the level went down on some resource (the caller
        should then call :meth:`trim_inflight`).
        """
        self._advance(now)
        burst = self._burst
        reduced = False

        def rebucket(tokens: float, old: float, new: float) -> float:
            if new < old:
                return tokens * (new / old) if old > 0.0 else 0.0
            if self._min_depth > 0.0:
                return min(self._depth(new), tokens + self._depth(new) - self._depth(old))
            return min(new * burst, tokens + (new - old) * burst)

        if level.cpu != self._cap_cpu:
            reduced |= level.cpu < self._cap_cpu
            self._tok_cpu = rebucket(self._tok_cpu, self._cap_cpu, level.cpu)
            self._cap_cpu = level.cpu
        if level.accelerator != self._cap_acc:
            reduced |= level.accelerator < self._cap_acc
            self._tok_acc = rebucket(self._tok_acc, self._cap_acc, level.accelerator)
            self._cap_acc = level.accelerator
        self._dirty = True
        return reduced

    @property
    def capacity(self) -> OptionalCapacity:
        return OptionalCapacity(self._cap_cpu, self._cap_acc)

    def set_min_depth(self, depth_ms: float) -> None:
        """Set the buckets' least depth (``ServerShedConfig.min_depth_ms``) from now on: a
        server whose largest burst follows its capacity (a strong replica's devices) sets it on
        every capacity change. Tokens above a smaller depth are cut the next time the buckets
        refill (time moves on, or a batch is decided); a larger one fills at the level, never at
        once."""
        if not (math.isfinite(depth_ms) and depth_ms >= 0.0):
            raise ValueError(f"depth_ms: must be a finite number ≥ 0 (got {depth_ms!r})")
        self._min_depth = depth_ms

    @property
    def min_depth_ms(self) -> float:
        return self._min_depth

    def observe(
        self,
        now: float,
        queue_ms: float,
        free_slots: Mapping[str, float] | None = None,
    ) -> OverloadTransition | None:
        """Feed one health reading: the queueing delay (CoDel: the sojourn time of the request
        just dequeued) and, optionally, free slots per resource (``"cpu"``, ``"accelerator"``).
        Returns a transition when the overloaded state changes."""
        if not math.isfinite(queue_ms) or queue_ms < 0.0:
            raise ValueError(f"queue_ms: must be a finite number ≥ 0 (got {queue_ms!r})")
        self._advance(now)
        cfg = self.config
        self._queue_ms = queue_ms
        if queue_ms < cfg.target_queue_ms:
            self._first_above = None
            self._dropping = False
        elif self._first_above is None:
            self._first_above = now + cfg.interval_ms / 1000.0
        elif not self._dropping:
            if now >= self._first_above:
                self._dropping = True
                self._count = 1
                self._raise_tau()
                self._drop_next = now + cfg.interval_ms / 1000.0
        elif now >= self._drop_next:
            self._pass_drop_times(now)
        if free_slots is not None:
            for key, free in free_slots.items():
                if key == "cpu":
                    self._exh_cpu = free <= cfg.reserve_slots
                elif key == "accelerator":
                    self._exh_acc = free <= cfg.reserve_slots
                else:
                    raise ValueError(f"free_slots: unknown resource {key!r} (cpu, accelerator)")
        overloaded = self.overloaded
        if overloaded == self._reported_overload:
            return None
        self._reported_overload = overloaded
        if overloaded:
            reason = "queue_delay" if self._dropping else "slots_exhausted"
            return OverloadTransition(ShedEvent.OVERLOAD_ENTERED, now, queue_ms, reason)
        return OverloadTransition(ShedEvent.OVERLOAD_LEFT, now, queue_ms, "recovered")

    def _raise_tau(self) -> None:
        cfg = self.config
        self._tau_over = min(cfg.max_shed_quantile, self._tau_over + cfg.shed_step)
        self._dirty = True

    def _pass_drop_times(self, now: float) -> None:
        """Every CoDel drop time ``≤ now`` raises τ_overload by one step (CoDel's control law).

        The first :data:`CODEL_STEPS` drop times are stepped through one at a time (bit for bit
        the textbook loop); beyond that the count is found in closed form, and τ is raised only
        until it stops moving (at ``max_shed_quantile``), so the work is bounded per call.
        """
        interval = self.config.interval_ms / 1000.0
        count = self._count
        drop_next = self._drop_next
        steps = 0
        while now >= drop_next and steps < CODEL_STEPS:
            count += 1
            drop_next += interval / math.sqrt(count)
            steps += 1
        if now >= drop_next:
            jump = codel_catch_up(count, drop_next, now, interval)
            count, drop_next = jump.drops, jump.drop_next
            steps += jump.steps
        passed = count - self._count
        self._count = count
        self._drop_next = drop_next
        if passed > 0:
            # Raising τ repeatedly is a no-op once it reaches its ceiling: stop there.
            cap = self.config.max_shed_quantile
            step = self.config.shed_step
            tau = self._tau_over
            for _ in range(passed):
                raised = min(cap, tau + step)
                steps += 1
                if raised == tau:
                    break
                tau = raised
            self._tau_over = tau
            self._dirty = True
        self._codel_steps += steps

    # -- the threshold --------------------------------------------------------------------

    def _tau(self) -> float:
        tau = self._tau_over
        if self._budget_aware:
            dem = self._dem_cpu
            if dem > 0.0:
                b = 1.0 - self._cap_cpu * self._window / dem
                if b > tau:
                    tau = b
            dem = self._dem_acc
            if dem > 0.0:
                b = 1.0 - self._cap_acc * self._window / dem
                if b > tau:
                    tau = b
        return 1.0 if tau > 1.0 else (tau if tau > 0.0 else 0.0)

    def _current_threshold(self) -> float:
        tau = self._tau()
        moved = tau - self._theta_tau
        if self._dirty or self._since_refresh >= self._refresh or moved > 0.01 or moved < -0.01:
            self._theta = self._hist.quantile(tau) if tau > 0.0 else 0.0
            self._theta_tau = tau
            self._since_refresh = 0
            self._dirty = False
        return self._theta

    # -- decisions ------------------------------------------------------------------------

    def decide(self, now: float, work: OptionalWork) -> Verdict:
        """Decide one request's optional work (arrival order; see :meth:`decide_batch`)."""
        extra = work.extra
        strong = work.strong
        if extra <= 0 and not strong:
            self._n[0] += 1
            return _ADMIT_NOTHING
        if now > self._t:
            self._advance(now)
        ec = work.extra_cpu_ms if extra > 0 else 0.0
        ea = work.extra_accelerator_ms if extra > 0 else 0.0
        sc = work.strong_cpu_ms if strong else 0.0
        sa = work.strong_accelerator_ms if strong else 0.0
        cpu = ec + sc
        acc = ea + sa
        cost = self._wc * cpu + self._wa * acc
        self._dem_cpu += cpu
        self._dem_acc += acc
        self._since_refresh += 1
        # θ comes from the requests before this one, so the decision is monotone in its value.
        theta = self._current_threshold()
        if cost > 0.0:
            vpc = work.value / cost
            self._hist.add(vpc, cost)
        else:
            vpc = _INF

        keep_strong = False
        n = 0
        if vpc >= theta:
            tok_cpu = 0.0 if self._exh_cpu else self._tok_cpu
            tok_acc = 0.0 if self._exh_acc else self._tok_acc
            if strong and sc <= tok_cpu + _EPS and sa <= tok_acc + _EPS:
                keep_strong = True
                tok_cpu -= sc
                tok_acc -= sa
                self._tok_cpu -= sc
                self._tok_acc -= sa
            if extra > 0:
                n = extra
                # Only a bucket short of the full cost limits n (and the ratio is then < extra,
                # so it cannot overflow whatever the costs).
                if tok_cpu + _EPS < ec:
                    n = min(n, int(max(0.0, tok_cpu) * extra / ec + 1e-9))
                if tok_acc + _EPS < ea:
                    n = min(n, int(max(0.0, tok_acc) * extra / ea + 1e-9))
                if n > 0:
                    self._tok_cpu -= ec * n / extra
                    self._tok_acc -= ea * n / extra
        return self._verdict(now, extra, strong, n, keep_strong)

    def _verdict(self, now: float, extra: int, strong: bool, n: int, keep_strong: bool) -> Verdict:
        lost_strong = strong and not keep_strong
        lost_extra = extra - n if extra > 0 else 0
        if not lost_strong and lost_extra <= 0:
            self._n[0] += 1
            return Verdict(_ADMIT, n, keep_strong)
        if lost_strong:
            decision, code = (_DOWNGRADE, 2) if (n > 0 or extra <= 0) else (_SHED, 3)
        else:
            decision, code = (_TRIM, 1) if (n > 0 or keep_strong) else (_SHED, 3)
        self._n[code] += 1
        self._dropped_extra += lost_extra
        self._dropped_strong += lost_strong
        self._ep_dropped += 1
        self._ep_extra += lost_extra
        self._ep_strong += lost_strong
        self._last_drop = now
        return Verdict(decision, n, keep_strong)

    def decide_batch(
        self,
        now: float,
        value: npt.ArrayLike,
        extra: npt.ArrayLike,
        extra_cpu_ms: npt.ArrayLike,
        extra_accelerator_ms: npt.ArrayLike,
        strong: npt.ArrayLike,
        strong_cpu_ms: npt.ArrayLike,
        strong_accelerator_ms: npt.ArrayLike,
        span_s: float = 0.0,
    ) -> BatchVerdict:
        """Decide many requests that arrive together (same ``now``).

        ``span_s`` > 0 says the batch stands for the arrivals of ``(now − span_s, now]`` (a
        simulator step): the buckets then also pay for what the level can do during the span,
        ``level × span``, on top of what they hold (a fluid approximation; without it a batch
        could never use more than ``burst_ms`` of work).

        All arrays have one entry per request (costs as in :class:`OptionalWork`). The batch is
        served in decreasing value per cost: the strong parts fill the buckets first, then the
        extra candidates, the first request that no longer fits is trimmed to what remains and
        the ones after it are shed. So within a batch, no request keeps optional work while one
        with a higher vpc and the same needs lost it.
        """
        value = np.asarray(value, dtype=np.float64)
        m = value.shape[0]
        extra_i = np.asarray(extra, dtype=np.int64)
        strong_b = np.asarray(strong, dtype=np.bool_)
        has_extra = extra_i > 0
        # a batch of one kind (the simulator's servers decide extras and strong requests in
        # batches of their own) skips the other kind's arrays: adding +0.0 changes nothing
        any_strong = bool(strong_b.any())
        optional = has_extra | strong_b if any_strong else has_extra
        n_opt = int(np.count_nonzero(optional))
        self._n[0] += m - n_opt
        if n_opt == 0:
            if now > self._t:
                self._advance(now)
            return BatchVerdict(
                np.zeros(m, dtype=np.int8), np.zeros(m, dtype=np.int64), np.zeros(m, dtype=np.bool_)
            )
        self._refill(now, span_s)

        # without strong parts the optional requests are those with extras (n_opt > 0)
        any_extra = bool(has_extra.any()) if any_strong else True
        zeros = np.zeros(m)
        ec = (
            np.where(has_extra, np.asarray(extra_cpu_ms, dtype=np.float64), 0.0)
            if any_extra
            else zeros
        )
        ea = (
            np.where(has_extra, np.asarray(extra_accelerator_ms, dtype=np.float64), 0.0)
            if any_extra
            else zeros
        )
        if any_strong:
            sc = np.where(strong_b, np.asarray(strong_cpu_ms, dtype=np.float64), 0.0)
            sa = np.where(strong_b, np.asarray(strong_accelerator_ms, dtype=np.float64), 0.0)
            cpu = ec + sc
            acc = ea + sa
        else:
            sc = sa = zeros
            cpu = ec + 0.0
            acc = ea + 0.0
        cost = self._wc * cpu + self._wa * acc
        priced = cost > 0.0
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            vpc = np.where(priced, value / np.where(priced, cost, 1.0), _INF)
        # the demand estimate is a time-decayed sum: a batch that stands for the arrivals of a
        # span enters it as those arrivals would have, spread over the span and decayed to
        # ``now``, not as if all had arrived at ``now`` (which overstated a steady rate by
        # 1 / (1 − e^(−span/window)): 1.58× for a 1 s span and a 1 s window, so τ shed a third
        # of the offered work on a level that could hold all of it)
        spread = self._spread(span_s)
        self._dem_cpu += float(cpu[optional].sum()) * spread
        self._dem_acc += float(acc[optional].sum()) * spread
        self._since_refresh += n_opt
        theta = self._current_threshold()  # from the requests before this batch
        priced &= optional
        self._hist.add_many(vpc[priced], cost[priced])

        idx = np.flatnonzero(optional & (vpc >= theta))
        idx = idx[np.argsort(-vpc[idx], kind="stable")]
        tok_cpu = 0.0 if self._exh_cpu else self._tok_cpu
        tok_acc = 0.0 if self._exh_acc else self._tok_acc
        keep_strong, n, spent_cpu, spent_acc = self._fill(
            m, idx, tok_cpu, tok_acc, extra_i, has_extra, ec, ea, strong_b, sc, sa, any_strong
        )
        self._tok_cpu = min(self._depth(self._cap_cpu), self._tok_cpu - spent_cpu)
        self._tok_acc = min(self._depth(self._cap_acc), self._tok_acc - spent_acc)

        codes = np.zeros(m, dtype=np.int8)  # Decision.ADMIT unless set below
        lost_extra = np.where(has_extra, extra_i - n, 0)
        if any_strong:
            lost_strong = strong_b & ~keep_strong
            trimmed = optional & ~lost_strong & (lost_extra > 0)
            codes[trimmed] = np.where((n[trimmed] > 0) | keep_strong[trimmed], 1, 3)
            codes[lost_strong] = np.where((n[lost_strong] > 0) | ~has_extra[lost_strong], 2, 3)
            lost_s = int(np.count_nonzero(lost_strong))
            counts = np.bincount(codes[optional], minlength=4).tolist()
        else:
            # no strong part: nothing lost on the strong side, a trimmed request keeps extras
            # (TRIM) or none (SHED)
            trimmed = lost_extra > 0  # only optional requests lose extras
            kept_some = n[trimmed] > 0
            codes[trimmed] = np.where(kept_some, 1, 3)
            lost_s = 0
            n_trim = int(np.count_nonzero(kept_some))
            n_shed = int(kept_some.size) - n_trim
            counts = [n_opt - n_trim - n_shed, n_trim, 0, n_shed]
        for d in range(4):
            self._n[d] += counts[d]
        n_dropped = n_opt - counts[0]
        if n_dropped:
            lost_e = int(lost_extra.sum())
            self._dropped_extra += lost_e
            self._dropped_strong += lost_s
            self._ep_dropped += n_dropped
            self._ep_extra += lost_e
            self._ep_strong += lost_s
            self._last_drop = now
        # (``n`` is 0 wherever no extras were asked: only requests with extras are filled)
        return BatchVerdict(codes, n, keep_strong)

    def _spread(self, span_s: float) -> float:
        """The weight in the decayed demand sum of work offered evenly over the last
        ``span_s`` seconds: ``(w/s)·(1 − e^(−s/w))`` for the demand window ``w`` (1 for a
        single arrival, ``span_s`` 0)."""
        span_ms = span_s * 1000.0
        if not span_ms > 0.0:
            return 1.0
        x = span_ms / self._window
        return -math.expm1(-x) / x

    def _refill(self, now: float, span_s: float) -> None:
        """Bring the buckets to ``now``; a batch that stands for ``(now − span_s, now]`` also
        gets what the level can do during the span (see :meth:`decide_batch`)."""
        if span_s > 0.0:
            start = max(self._t, now - span_s)  # never pay twice for time already counted
            self._advance(start)
            start_cpu, start_acc = self._tok_cpu, self._tok_acc
            self._advance(now)
            span_ms = max(0.0, now - start) * 1000.0
            self._tok_cpu = start_cpu + self._cap_cpu * span_ms
            self._tok_acc = start_acc + self._cap_acc * span_ms
        elif now > self._t:
            self._advance(now)

    @staticmethod
    def _fill(
        m: int,
        idx: npt.NDArray[np.intp],
        tok_cpu: float,
        tok_acc: float,
        extra_i: npt.NDArray[np.int64],
        has_extra: npt.NDArray[np.bool_],
        ec: npt.NDArray[np.float64],
        ea: npt.NDArray[np.float64],
        strong_b: npt.NDArray[np.bool_],
        sc: npt.NDArray[np.float64],
        sa: npt.NDArray[np.float64],
        any_strong: bool = True,
    ) -> tuple[npt.NDArray[np.bool_], npt.NDArray[np.int64], float, float]:
        """Fill the tokens with the admitted requests ``idx`` of the ``m`` in their order
        (decreasing vpc):
        the strong parts first, then the extras, the first extra that no longer fits trimmed.
        Returns which keep the strong model, the extras each keeps, and the CPU and accelerator
        spent. ``any_strong`` False: no request has a strong part (``idx`` are then requests
        with extras only)."""
        keep_strong = np.zeros(m, dtype=np.bool_)
        n = np.zeros(m, dtype=np.int64)
        spent_cpu = spent_acc = 0.0
        if idx.size:
            # Strong parts: indivisible, greedy prefix in vpc order.
            s_idx = idx[strong_b[idx]] if any_strong else idx[:0]
            if s_idx.size:
                cc = np.cumsum(sc[s_idx])
                ca = np.cumsum(sa[s_idx])
                fits = (cc <= tok_cpu + _EPS) & (ca <= tok_acc + _EPS)
                k = int(np.argmin(fits)) if not fits.all() else fits.size
                keep_strong[s_idx[:k]] = True
                if k:
                    spent_cpu, spent_acc = float(cc[k - 1]), float(ca[k - 1])
            # Extras: divisible, greedy prefix; the first that does not fit is trimmed.
            e_idx = idx[has_extra[idx]] if any_strong else idx
            if e_idx.size:
                rem_cpu = tok_cpu - spent_cpu
                rem_acc = tok_acc - spent_acc
                cc = np.cumsum(ec[e_idx])
                ca = np.cumsum(ea[e_idx])
                fits = (cc <= rem_cpu + _EPS) & (ca <= rem_acc + _EPS)
                k = int(np.argmin(fits)) if not fits.all() else fits.size
                n[e_idx[:k]] = extra_i[e_idx[:k]]
                if k:
                    spent_cpu += float(cc[k - 1])
                    spent_acc += float(ca[k - 1])
                if k < e_idx.size:
                    j = int(e_idx[k])
                    part = int(extra_i[j])
                    left_cpu = tok_cpu - spent_cpu
                    left_acc = tok_acc - spent_acc
                    if left_cpu + _EPS < ec[j]:
                        part = min(part, int(max(0.0, left_cpu) * extra_i[j] / ec[j] + 1e-9))
                    if left_acc + _EPS < ea[j]:
                        part = min(part, int(max(0.0, left_acc) * extra_i[j] / ea[j] + 1e-9))
                    if part > 0:
                        n[j] = part
                        spent_cpu += float(ec[j]) * part / float(extra_i[j])
                        spent_acc += float(ea[j]) * part / float(extra_i[j])
        return keep_strong, n, spent_cpu, spent_acc

    def trim_inflight(
        self,
        now: float,
        inflight: Sequence[InflightWork],
        level: OptionalCapacity | None = None,
    ) -> list[InflightCut]:
        """Which running optional work to cut so the rest fits the current level (or ``level``:
        a server that runs optional work at full speed and holds only its *rate* to the level the
        buckets refill at fits what it runs to its physical level).

        Cuts go lowest value per unit of occupied capacity first, and only items that occupy a
        resource still over its level are cut (cutting the others would free nothing useful).
        Each cut drops the item's whole optional part: ``DOWNGRADE`` for strong-model-only work,
        ``SHED`` otherwise.
        """
        if not inflight:
            return []
        value = np.fromiter((w.value for w in inflight), dtype=np.float64, count=len(inflight))
        cpu = np.fromiter((w.cpu for w in inflight), dtype=np.float64, count=len(inflight))
        acc = np.fromiter((w.accelerator for w in inflight), dtype=np.float64, count=len(inflight))
        cut = self.trim_inflight_batch(now, value, cpu, acc, level)
        out = []
        for i in np.flatnonzero(cut):
            w = inflight[int(i)]
            decision = Decision.DOWNGRADE if (w.strong and w.extra <= 0) else Decision.SHED
            out.append(InflightCut(w.id, decision, w.value))
        return out

    def trim_inflight_batch(
        self,
        now: float,
        value: npt.ArrayLike,
        cpu: npt.ArrayLike,
        accelerator: npt.ArrayLike,
        level: OptionalCapacity | None = None,
    ) -> BoolArray:
        """Array form of :meth:`trim_inflight`: a mask of the in-flight items to cut."""
        self._advance(now)
        value = np.asarray(value, dtype=np.float64)
        cpu = np.asarray(cpu, dtype=np.float64)
        acc = np.asarray(accelerator, dtype=np.float64)
        cut = np.zeros(value.shape[0], dtype=np.bool_)
        fit_cpu, fit_acc = (
            (self._cap_cpu, self._cap_acc) if level is None else (level.cpu, level.accelerator)
        )
        over_cpu = float(cpu.sum()) - fit_cpu
        over_acc = float(acc.sum()) - fit_acc
        eps = 1e-9
        if over_cpu <= eps and over_acc <= eps:
            return cut
        occupied = self._wc * cpu + self._wa * acc
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            vpc = np.where(occupied > 0.0, value / np.where(occupied > 0.0, occupied, 1.0), _INF)
        for i in np.argsort(vpc, kind="stable"):
            helps = (over_cpu > eps and cpu[i] > 0.0) or (over_acc > eps and acc[i] > 0.0)
            if not helps:
                continue
            cut[i] = True
            over_cpu -= float(cpu[i])
            over_acc -= float(acc[i])
            if over_cpu <= eps and over_acc <= eps:
                break
        n_cut = int(cut.sum())
        if n_cut:
            self._inflight_cut += n_cut
            self._ep_dropped += n_cut
            self._last_drop = now
        return cut

    def poll(self, now: float) -> ShedTransition | None:
        """``shedding.started`` after the first drop of an episode, ``shedding.stopped`` once no
        optional work has been dropped for ``shed_quiet_ms`` (the totals of the episode)."""
        if not self._shedding:
            if self._ep_dropped > 0:
                self._shedding = True
                return ShedTransition(
                    ShedEvent.STARTED, "server", now, self._ep_dropped, self._ep_extra,
                    self._ep_strong,
                )  # fmt: skip
            return None
        if (now - self._last_drop) * 1000.0 >= self.config.shed_quiet_ms:
            t = ShedTransition(
                ShedEvent.STOPPED, "server", now, self._ep_dropped, self._ep_extra, self._ep_strong
            )
            self._shedding = False
            self._ep_dropped = self._ep_extra = self._ep_strong = 0
            return t
        return None

    # -- introspection and state ----------------------------------------------------------

    @property
    def overloaded(self) -> bool:
        """CoDel says the queue has stood above target for an interval, or slots are exhausted."""
        return self._dropping or self._exh_cpu or self._exh_acc

    @property
    def shedding(self) -> bool:
        return self._shedding

    @property
    def codel_steps(self) -> int:
        """Loop iterations spent passing CoDel drop times since construction: a cost counter
        (bounded per :meth:`observe` call), not part of the snapshot."""
        return self._codel_steps

    @property
    def threshold(self) -> float:
        """Current value-per-cost threshold θ (0 = everything passes)."""
        return self._current_threshold()

    @property
    def shed_quantile(self) -> float:
        """τ: the share of recent optional work (by cost, lowest vpc first) being shed."""
        return self._tau()

    @property
    def tokens(self) -> tuple[float, float]:
        """Token-bucket contents (cpu ms, accelerator ms)."""
        return (self._tok_cpu, self._tok_acc)

    @property
    def stats(self) -> ServerShedStats:
        return ServerShedStats(
            decisions=sum(self._n),
            admitted=self._n[Decision.ADMIT],
            trimmed=self._n[Decision.TRIM],
            downgraded=self._n[Decision.DOWNGRADE],
            shed=self._n[Decision.SHED],
            dropped_extra_candidates=self._dropped_extra,
            dropped_strong=self._dropped_strong,
            inflight_cut=self._inflight_cut,
        )

    _STATE = (
        "_cap_cpu", "_cap_acc", "_tok_cpu", "_tok_acc", "_t", "_dem_cpu", "_dem_acc",
        "_first_above", "_dropping", "_count", "_drop_next", "_queue_ms", "_exh_cpu", "_exh_acc",
        "_reported_overload", "_tau_over", "_theta", "_theta_tau", "_since_refresh", "_dirty",
        "_shedding", "_last_drop", "_ep_dropped", "_ep_extra", "_ep_strong", "_dropped_extra",
        "_dropped_strong", "_inflight_cut",
    )  # fmt: skip

    def snapshot(self) -> dict[str, Any]:
        """Everything the next decisions depend on, as plain data (JSON-able except ±inf)."""
        state: dict[str, Any] = {k.lstrip("_"): json_float(getattr(self, k)) for k in self._STATE}
        state["n"] = list(self._n)
        state["hist"] = self._hist.snapshot()
        return state

    def restore(self, state: Mapping[str, Any]) -> None:
        """Resume exactly from :meth:`snapshot` (the config is this object's own)."""
        for k in self._STATE:
            v = state[k.lstrip("_")]
            setattr(self, k, float(v) if isinstance(v, str) else v)
        self._n = [int(x) for x in state["n"]]
        self._hist.restore(state["hist"])


_ADMIT_NOTHING = Verdict(Decision.ADMIT, 0, False)
_ADMIT, _TRIM, _DOWNGRADE, _SHED = Decision.ADMIT, Decision.TRIM, Decision.DOWNGRADE, Decision.SHED
