"""Test doubles for the control cores, shipped in the package (as structlog ships ``testing``).

* :class:`LatencyPlant` — a small plant model of a region's ranking path: p99 latency as a
  function of candidates per request and the cores serving them, with the lag of targets
  reaching clients and optional noise. Closed-loop tests and the docs' step responses run the
  RMA loop against it.
* :func:`arm_stats` — holdout sums (:class:`~headroom.controllers.types.ArmStats`) of ``n``
requests with
  a given mean and standard deviation, drawn from an injected generator.
* :func:`observation` — a :class:`~headroom.controllers.types.RegionObservation` with sensible
defaults,
  so a test states only what it is about.

Nothing here reads a clock or a global random state.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from headroom.controllers.types import ArmStats, CapacityLevel, RegionObservation, ValueKey

__all__ = ["LatencyPlant", "arm_stats", "capacity", "observation"]


@dataclass
class LatencyPlant:
    """p99 of the ranking path versus candidates per request and serving cores.

    The model: a request ranking ``n`` candidates takes ``fixed_ms + n·ms_per_candidate`` of
    work on an idle fleet; the fleet's utilisation is ``ρ = rps · n · cpu_ms_per_candidate /
    (1000 · cores)``; queueing stretches the candidate-dependent part by ``1/(1 - ρ)`` (the
    M/M/1 factor), so::

        p99(n) = fixed_ms + n · ms_per_candidate / (1 - ρ)          (ρ capped at 0.995)

    Convex and steep near saturation, like a real tail. ``lag`` is the share of a window still
    served at the previous target (targets take time to reach every client); ``noise`` is the
    relative standard deviation of a multiplicative log-normal error per reading, drawn from
    ``rng``. Defaults are the quickstart region's: 300 rps, 32 cores (24 dedicated + 8 spare),
    0.1 ms of CPU per candidate, so the quickstart setpoint of 170 ms is met at ~605 candidates.
    """

    request_rps: float = 300.0
    cores: float = 32.0
    cpu_ms_per_candidate: float = 0.1
    fixed_ms: float = 30.0
    ms_per_candidate: float = 0.1
    lag: float = 0.3
    noise: float = 0.0
    rng: np.random.Generator | None = None
    _last_n: float | None = field(default=None, repr=False)

    def utilisation(self, candidates: float) -> float:
        if self.cores <= 0.0:
            return 0.995
        rho = self.request_rps * candidates * self.cpu_ms_per_candidate / (1000.0 * self.cores)
        return min(max(rho, 0.0), 0.995)

    def steady_p99(self, candidates: float) -> float:
        """p99 once every client runs ``candidates``."""
        return self.fixed_ms + candidates * self.ms_per_candidate / (
            1.0 - self.utilisation(candidates)
        )

    def candidates_for(self, p99_ms: float, lo: float = 0.0, hi: float = 1e6) -> float:
        """The candidate count whose steady p99 is ``p99_ms`` (bisection; p99 is increasing)."""
        if self.steady_p99(lo) >= p99_ms:
            return lo
        for _ in range(200):
            mid = 0.5 * (lo + hi)
            if self.steady_p99(mid) < p99_ms:
                lo = mid
            else:
                hi = mid
        return 0.5 * (lo + hi)

    def measure(self, candidates: float) -> float:
        """The p99 reported for the window after the target moved to ``candidates``."""
        prev = self._last_n if self._last_n is not None else candidates
        effective = self.lag * prev + (1.0 - self.lag) * candidates
        self._last_n = candidates
        p99 = self.steady_p99(effective)
        if self.noise > 0.0:
            if self.rng is None:
                raise ValueError("LatencyPlant.noise > 0 needs an injected rng")
            p99 *= math.exp(self.noise * float(self.rng.standard_normal()) - self.noise**2 / 2)
        return p99


def arm_stats(
    rng: np.random.Generator,
    n: int,
    mean: float,
    sd: float,
    cpu_ms: float = 0.0,
    accelerator_ms: float = 0.0,
) -> ArmStats:
    """Sums of ``n`` request values drawn from N(mean, sd²)."""
    if n <= 0:
        return ArmStats()
    x = rng.normal(mean, sd, size=n)
    return ArmStats(n, float(x.sum()), float((x * x).sum()), cpu_ms, accelerator_ms)


def capacity(
    cpu: float = 0.0,
    accelerator: float = 0.0,
    *,
    hardware: str = "gpu-b",
    expires_in_s: float | None = None,
    remote: bool = False,
    ts: float = 0.0,
) -> tuple[CapacityLevel, ...]:
    """Opportunistic levels of one CPU pool and one accelerator pool (omitted when 0)."""
    out = []
    if cpu > 0.0:
        out.append(CapacityLevel("cpu", "any", "opportunistic", cpu, None, remote, ts))
    if accelerator > 0.0:
        out.append(
            CapacityLevel(
                "accelerator", hardware, "opportunistic", accelerator, expires_in_s, remote, ts
            )
        )
    return tuple(out)


def observation(
    now: float,
    *,
    region: str = "us-east",
    p99_ms: float | None = 100.0,
    p99_sbm_ms: float | None = None,
    request_rps: float = 300.0,
    eligible_rps: float | None = None,
    segment_rps: Mapping[str, float] | None = None,
    capacity: Sequence[CapacityLevel] = (),
    value: Mapping[ValueKey, ArmStats] | None = None,
    observed_coverage: float | None = None,
    value_age_s: float | None = None,
    window_s: float = 60.0,
) -> RegionObservation:
    """A region observation with defaults for everything a test does not care about."""
    return RegionObservation(
        region=region,
        now=now,
        window_s=window_s,
        p99_ms={"all": p99_ms, "sbm": p99_sbm_ms},
        request_rps=request_rps,
        eligible_rps=request_rps if eligible_rps is None else eligible_rps,
        segment_rps=dict(segment_rps or {}),
        capacity=tuple(capacity),
        value=dict(value or {}),
        observed_coverage=observed_coverage,
        value_age_s=value_age_s,
    )
