"""Catching up: a client that lags behind its requests sheds their optional work and paces them.

Pure code (no asyncio, Kafka, wall clock or global random state): the client worker
(:mod:`headroom.workers.client`) drives it with its own clock.

A client that was down (a restart after ``kill -9``, a long pause) or fell behind finds requests
waiting in its topic. Read and sent as fast as the consumer hands them out, that backlog reaches
the servers at once. The client's in-flight limit bounds how many requests are out, not how fast
they go: it is sized for the region's peak rate at the SLO (Little's law,
:func:`headroom.workers.client.in_flight_limit`), so a backlog keeps every one of those slots
full at the servers for as long as it lasts, and their queues grow to ``limit × service time``
per replica — past the SLO when the host is slow. The latency of a request is measured from its
dispatch, so the time a request waited in the topic is not what hurts: the burst is.

The rule, per request, from its *lag* (wall seconds from its ``ts`` to the moment the client
takes it):

* **late** — a request that waited longer than ``lag_s`` is late. Optional work is optional: a
  late request is served baseline-only (no RMA extras, no strong model), as under an expired
  target — the local defence sheds optional work first. Its holdout draw is unchanged, so the
  arms stay a uniform random split;
* **paced** — late requests are dispatched no faster than ``rate`` per wall second (a token
  bucket of ``burst`` requests). The rate is a share (``utilisation``) of what the region's
  dedicated capacity serves of baseline-only requests, and at least ``drain`` × the region's peak
  rate, so that the backlog drains while new requests keep arriving
  (:func:`catch_up_rate`). A request that is not late is never held.

With several clients per region each paces its own backlog at that rate: the rule assumes that
one client at a time is catching up (a restart), not all of them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from headroom.kernel.checks import FieldChecker
from headroom.kernel.scenario import Scenario

__all__ = ["CatchUp", "CatchUpConfig", "baseline_capacity_rps", "catch_up_rate", "peak_rps"]


@dataclass(frozen=True, slots=True)
class CatchUpConfig:
    """When a request is late, and how fast late requests are dispatched (module docstring)."""

    rate: float  # late requests dispatched per wall second at most
    lag_s: float = 1.0  # a request that waited longer than this (wall seconds) is late
    burst: int = 4  # late requests that may go at once (the token bucket's depth)

    def __post_init__(self) -> None:
        c = FieldChecker("catch_up")
        c.positive("rate", self.rate)
        c.positive("lag_s", self.lag_s)
        c.integer("burst", self.burst, 1)
        c.raise_if_any()


class CatchUp:
    """The catch-up rule of one client: :meth:`late` says whether a request is late,
    :meth:`wait` how long a late request must wait before its dispatch (a token bucket; the
    token is taken at once, so the caller dispatches after sleeping that long)."""

    def __init__(self, config: CatchUpConfig, now: float) -> None:
        self.config = config
        self._tokens = float(config.burst)
        self._t = now
        self.late_requests = 0  # requests found late so far

    def late(self, request_ts: float, now: float) -> bool:
        """True for a request sent at ``request_ts`` and taken at ``now`` more than ``lag_s``
        later."""
        late = now - request_ts > self.config.lag_s
        if late:
            self.late_requests += 1
        return late

    def wait(self, now: float) -> float:
        """Seconds a late request taken at ``now`` waits before its dispatch (0: at once).
        Successive calls queue up behind each other: the n-th waits for the n-th token."""
        rate = self.config.rate
        if now > self._t:
            self._tokens = min(float(self.config.burst), self._tokens + (now - self._t) * rate)
            self._t = now
        self._tokens -= 1.0
        if self._tokens >= 0.0:
            return 0.0
        return -self._tokens / rate


def peak_rps(scenario: Scenario, region: str) -> float:
    """The region's peak request rate (scenario seconds): the trace's highest rate, or ``rps``
    at the top of its daily swing with two standard deviations of noise; surges multiply it."""
    r = scenario.region(region)
    t = r.traffic
    if t.trace:
        peak = max(rps for _t, rps in t.trace)
    else:
        peak = float(t.rps or 0.0) * (1.0 + t.daily_amplitude) * math.exp(2.0 * t.noise)
    for e in scenario.events:
        if e.kind == "surge" and e.region == region and e.factor:
            peak *= max(1.0, e.factor)
    return peak


def baseline_capacity_rps(scenario: Scenario, region: str) -> float:
    """Baseline-only requests per second the region's dedicated capacity serves at full use: the
    slower of its CPU and accelerator stages (``units × 1000 / (base candidates × ms per
    candidate)``); ``inf`` when neither stage costs anything."""
    d = scenario.region(region).dedicated
    base = scenario.world.base_candidates
    model = scenario.models.base
    rates = [
        units * 1000.0 / (base * ms)
        for units, ms in (
            (d.cpu, model.cpu_ms_per_candidate),
            (d.accelerator, model.accelerator_ms_per_candidate),
        )
        if ms > 0.0
    ]
    return min(rates) if rates else math.inf


def catch_up_rate(
    scenario: Scenario,
    region: str,
    *,
    speed: float = 1.0,
    utilisation: float = 0.8,
    drain: float = 1.25,
) -> float:
    """Late requests per wall second a client of ``region`` dispatches at most:
    ``utilisation`` of the dedicated capacity's baseline rate (:func:`baseline_capacity_rps`),
    but at least ``drain`` × the peak rate (:func:`peak_rps`, × ``speed`` scenario seconds per
    wall second) so that a backlog shrinks even at the peak; at least 1."""
    capacity = baseline_capacity_rps(scenario, region)
    floor = drain * peak_rps(scenario, region) * speed
    if math.isinf(capacity):
        return max(1.0, floor)
    return max(1.0, utilisation * capacity, floor)
