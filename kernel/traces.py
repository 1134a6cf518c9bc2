"""Traffic and opportunistic capacity over time, from a scenario: what the simulated fleet is fed.

Pure: no clock, no global random state. Everything random is drawn once, up front, from the
generator passed in, so every policy simulated on the same :class:`ScenarioTraces` sees the same
traffic, the same arrivals and the same capacity (common random numbers).

Traffic (per region, docs/scenarios.md)
---------------------------------
*Synthetic*: ``rate(t) = rps · (1 + a·cos(2π(t − peak_s)/period_s)) · noise(t)``. *Trace*: the
``(t_s, rps)`` points, linear between rows, held flat before the first and after the last.
``noise(t) = exp(σ·ε(t) − σ²/2)`` with ``σ = traffic.noise`` and ``ε`` a standard normal drawn
every :data:`NOISE_PERIOD_S` seconds and linear in between: the slow, correlated wobble of real
request rates (the −σ²/2 keeps the mean at 1). A ``surge`` event multiplies a region's rate by
its ``factor`` over ``[at_s, at_s + duration_s)``; overlapping surges multiply.

The rate is evaluated at the middle of every step of ``step_s`` seconds, and the step's
arrivals are a Poisson draw of ``rate · step_s`` (the request count of a real step is random
even at a known rate) — unless the traffic has recorded ``arrivals`` (counts per second, what
``scenario from-recording`` writes): then they are those counts, scaled only where noise or a
surge moves the rate off its trace.

Capacity (per region and opportunistic pool)
--------------------------------------------
A pool is one ``(resource, hardware, remote)`` entry of ``regions[].opportunistic``. Its level is
piecewise constant: every trace point and every ``preempt`` / ``grant`` event naming the pool is a
*change* that sets the level at once (docs/scenarios.md: a level, not a delta). Changes at the same
instant apply in file order, trace points before events (events are "on top of the traces").
Before a pool's first change its level is 0.

Control outages: ``control_outage`` silences the central controllers of its region (every region
when ``region`` is null) over ``[at_s, at_s + duration_s)``; so do the controller's kills and
pauses and the broker's restarts. Fault events (:mod:`headroom.kernel.faults`) also give each
region its baseline-only spans (its client killed or paused) and its capacity silences.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from headroom.kernel import faults
from headroom.kernel.scenario import Opportunistic, Region, Scenario

__all__ = [
    "NOISE_PERIOD_S",
    "CapacityChange",
    "PoolKey",
    "PoolTrace",
    "RegionTraces",
    "ScenarioTraces",
]

# Request-rate noise keeps one value per minute: rates wobble over minutes, not per request
# (per-step randomness is the Poisson draw of the arrivals).
NOISE_PERIOD_S = 60.0

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]


@dataclass(frozen=True, slots=True)
class PoolKey:
    """One opportunistic pool of a region."""

    resource: str  # "cpu" | "accelerator"
    hardware: str
    remote: bool = False

    def label(self) -> str:
        return f"{self.resource}/{self.hardware}{' (remote)' if self.remote else ''}"


@dataclass(frozen=True, slots=True)
class PoolTrace:
    """Level changes of one pool: ``times`` ascending, ``levels[i]`` in force from ``times[i]``."""

    key: PoolKey
    times: FloatArray
    levels: FloatArray
    expires_in_s: float | None

    def level_at(self, t: float) -> float:
        """Level in force at ``t`` (a change at exactly ``t`` is already in force)."""
        i = int(np.searchsorted(self.times, t, side="right")) - 1
        return float(self.levels[i]) if i >= 0 else 0.0

    def levels_at(self, t: npt.ArrayLike) -> FloatArray:
        idx = np.searchsorted(self.times, np.asarray(t, dtype=np.float64), side="right") - 1
        out = np.where(idx >= 0, self.levels[np.maximum(idx, 0)], 0.0)
        return np.asarray(out, dtype=np.float64)

    def min_over(self, t0: float, t1: float) -> float:
        """Lowest level in force at any instant of ``[t0, t1]`` (0 before the first change)."""
        lo = self.level_at(t0)
        if t1 <= t0:
            return lo
        i0 = int(np.searchsorted(self.times, t0, side="right"))
        i1 = int(np.searchsorted(self.times, t1, side="right"))
        if i1 > i0:
            lo = min(lo, float(self.levels[i0:i1].min()))
        return lo


@dataclass(frozen=True, slots=True)
class CapacityChange:
    """A pool's level changed at ``t`` (scenario seconds)."""

    t: float
    region: int
    pool: int  # index into RegionTraces.pools
    before: float
    after: float

    @property
    def is_reclaim(self) -> bool:
        return self.after < self.before


@dataclass(frozen=True, slots=True)
class RegionTraces:
    name: str
    rate: FloatArray  # rps per step (at the step's middle), surges included
    arrivals: IntArray  # requests arriving in each step
    pools: tuple[PoolTrace, ...]
    changes: tuple[CapacityChange, ...]  # every level change of every pool, by time
    outages: tuple[tuple[float, float], ...]  # control-plane silences [start, end)
    baseline_only: tuple[tuple[float, float], ...] = ()  # the region's client down [start, end)
    silences: tuple[tuple[float, float], ...] = ()  # capacity feed silent [start, end)

    def pool_index(self, key: PoolKey) -> int:
        for i, p in enumerate(self.pools):
            if p.key == key:
                return i
        raise KeyError(key.label())

    def in_outage(self, t: float) -> bool:
        return any(a <= t < b for a, b in self.outages)

    def in_baseline_only(self, t: float) -> bool:
        return any(a <= t < b for a, b in self.baseline_only)

    def level_seen(self, pool: int, t: float, level: float) -> float:
        """The level of ``pool`` the controllers know at ``t``: ``level`` (the one in force),
        or during a capacity silence the level in force when the silence began."""
        for a, b in self.silences:
            if a <= t < b:
                return self.pools[pool].level_at(a)
        return level


class ScenarioTraces:
    """Every region's traffic, arrivals and capacity for one scenario and one random draw."""

    def __init__(self, scenario: Scenario, rng: np.random.Generator, step_s: float = 1.0) -> None:
        if not (math.isfinite(step_s) and step_s > 0):
            raise ValueError(f"step_s: must be a finite number > 0, got {step_s!r}")
        self.scenario = scenario
        self.duration_s = float(scenario.duration_s)
        self.step_s = float(step_s)
        self.n_steps = max(1, math.ceil(self.duration_s / self.step_s - 1e-9))
        # the last step may be shorter than step_s
        edges = np.minimum(np.arange(self.n_steps + 1) * self.step_s, self.duration_s)
        self.step_edges: FloatArray = edges
        self.step_len: FloatArray = np.diff(edges)
        mids = 0.5 * (edges[:-1] + edges[1:])
        regions = []
        for ri, region in enumerate(scenario.regions):
            # one child generator per region and purpose: adding a region never changes another's
            noise_rng, arrival_rng = rng.spawn(2)
            rate = self._rate(region, mids, noise_rng) * self._surge(region.name, mids)
            if region.traffic.arrivals is not None:
                arrivals = self._recorded_arrivals(region, mids, rate, arrival_rng)
            else:
                arrivals = arrival_rng.poisson(np.maximum(rate, 0.0) * self.step_len)
            pools, changes = self._pools(ri, region)
            outages = faults.control_outages(scenario, region.name)
            regions.append(
                RegionTraces(
                    name=region.name,
                    rate=rate,
                    arrivals=np.asarray(arrivals, dtype=np.int64),
                    pools=pools,
                    changes=changes,
                    outages=outages,
                    baseline_only=faults.baseline_only_spans(scenario, region.name),
                    silences=faults.capacity_silences(scenario, region.name),
                )
            )
        self.regions: tuple[RegionTraces, ...] = tuple(regions)

    # -- traffic ----------------------------------------------------------------------------------

    def _rate(self, region: Region, t: FloatArray, rng: np.random.Generator | None) -> FloatArray:
        """The rate at ``t`` before surges; without ``rng``, before noise as well."""
        tr = region.traffic
        if tr.trace is not None:
            pts = np.asarray(tr.trace, dtype=np.float64)
            base = np.interp(t, pts[:, 0], pts[:, 1])
        else:
            rps = float(tr.rps or 0.0)
            period = tr.period_s if tr.period_s > 0 else 86400.0
            base = rps * (1.0 + tr.daily_amplitude * np.cos(2.0 * np.pi * (t - tr.peak_s) / period))
        sigma = float(tr.noise)
        if sigma > 0.0 and rng is not None:
            knots = np.arange(0.0, self.duration_s + NOISE_PERIOD_S, NOISE_PERIOD_S)
            eps = rng.standard_normal(knots.size)
            base = base * np.exp(sigma * np.interp(t, knots, eps) - 0.5 * sigma * sigma)
        return np.maximum(np.asarray(base, dtype=np.float64), 0.0)

    def _recorded_arrivals(
        self, region: Region, mids: FloatArray, rate: FloatArray, rng: np.random.Generator
    ) -> IntArray:
        """A region's recorded arrivals (``traffic.arrivals``): the counts per second, scaled
        where noise or a surge moves the rate off the traffic trace (``rate / trace``): a factor
        ``f > 1`` adds a Poisson draw of ``(f − 1)·count``, ``f < 1`` keeps each request with
        probability ``f``. Without noise and surges the arrivals are the counts exactly."""
        if self.step_s != 1.0:
            raise ValueError(
                f"region {region.name}: recorded arrivals are per second; step_s must be 1, "
                f"got {self.step_s!r}"
            )
        counts = np.zeros(self.n_steps, dtype=np.int64)
        for t, n in region.traffic.arrivals or ():
            if int(t) < self.n_steps:
                counts[int(t)] = int(n)
        plain = self._rate(region, mids, None)
        with np.errstate(divide="ignore", invalid="ignore"):
            factor = np.where(plain > 0, rate / np.where(plain > 0, plain, 1.0), 1.0)
        if np.all(factor == 1.0):
            return counts
        extra = rng.poisson(np.maximum(factor - 1.0, 0.0) * counts)
        kept = rng.binomial(counts, np.clip(factor, 0.0, 1.0))
        return np.asarray(np.where(factor >= 1.0, counts + extra, kept), dtype=np.int64)

    def _surge(self, region: str, t: FloatArray) -> FloatArray:
        factor = np.ones_like(t)
        for e in self.scenario.events:
            if e.kind == "surge" and e.region == region:
                inside = (t >= e.at_s) & (t < e.at_s + (e.duration_s or 0.0))
                factor = np.where(inside, factor * float(e.factor or 1.0), factor)
        return factor

    # -- capacity ---------------------------------------------------------------------------------

    def _pools(
        self, ri: int, region: Region
    ) -> tuple[tuple[PoolTrace, ...], tuple[CapacityChange, ...]]:
        entries: dict[PoolKey, Opportunistic] = {}
        points: dict[PoolKey, list[tuple[float, int, float]]] = {}
        for o in region.opportunistic:
            key = PoolKey(o.resource, o.hardware, o.remote)
            entries[key] = o
            # (time, order, level): order keeps trace points before events at the same instant
            points.setdefault(key, []).extend((float(t), 0, float(u)) for t, u in o.trace)
        for n, e in enumerate(self.scenario.events):
            if e.kind in ("preempt", "grant") and e.region == region.name:
                key = PoolKey(str(e.resource), str(e.hardware), bool(e.remote))
                points.setdefault(key, []).append((float(e.at_s), 1 + n, float(e.units or 0.0)))
        pools: list[PoolTrace] = []
        changes: list[CapacityChange] = []
        for pi, (key, pts) in enumerate(points.items()):
            pts.sort(key=lambda p: (p[0], p[1]))
            times: list[float] = []
            levels: list[float] = []
            before = 0.0
            for t, _, level in pts:
                if t > self.duration_s:
                    break
                if times and times[-1] == t:
                    levels[-1] = level  # the later change at the same instant wins
                else:
                    times.append(t)
                    levels.append(level)
            for t, level in zip(times, levels, strict=True):
                if level != before:
                    changes.append(CapacityChange(t, ri, pi, before, level))
                before = level
            entry = entries.get(key)
            pools.append(
                PoolTrace(
                    key=key,
                    times=np.asarray(times, dtype=np.float64),
                    levels=np.asarray(levels, dtype=np.float64),
                    expires_in_s=entry.expires_in_s if entry is not None else None,
                )
            )
        changes.sort(key=lambda c: (c.t, c.pool))
        return tuple(pools), tuple(changes)

    # -- helpers ----------------------------------------------------------------------------------

    def step_of(self, t: float) -> int:
        """Index of the step containing ``t`` (clamped to the run)."""
        return min(self.n_steps - 1, max(0, int(t / self.step_s + 1e-9)))

    def offered_unit_s(self, region: int, t0: float, t1: float) -> dict[str, float]:
        """Opportunistic unit-seconds offered over ``[t0, t1)``, per resource (remote included)."""
        out = {"cpu": 0.0, "accelerator": 0.0}
        for p in self.regions[region].pools:
            out[p.key.resource] += _integral(p, t0, t1)
        return out


def _integral(p: PoolTrace, t0: float, t1: float) -> float:
    if t1 <= t0:
        return 0.0
    i0 = int(np.searchsorted(p.times, t0, side="right"))
    i1 = int(np.searchsorted(p.times, t1, side="left"))
    cuts = [t0, *p.times[i0:i1].tolist(), t1]
    total = 0.0
    for a, b in itertools.pairwise(cuts):
        total += p.level_at(a) * (b - a)
    return total
