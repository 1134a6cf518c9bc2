"""Recorded traffic into the simulator: what ``headroom simulate SCENARIO --replay FILE`` runs on.

A recording read by :mod:`headroom.sim.replay_read` (its header is the reading algorithm: time,
arrivals, capacity levels, regions, bad recordings) replaces the scenario's traffic and
opportunistic traces; the scenario still gives the slo, world, models, segments and the dedicated
capacity of each region. This module turns a :class:`~headroom.sim.replay_read.Recording` into
the engine's inputs: the scenario a recording implies (:func:`derived_scenario`, also what
``headroom scenario from-recording`` writes), the population of recorded requests, the traces
and the run context. docs/replay.md is the user's guide.

Requests: segment, value, eligibility
-------------------------------------
The engine simulates requests as population cells, segment × K equal-probability value bins
(sim/population.py). :class:`RecordedPopulation` builds those cells from the recorded requests:
segment shares are the recorded shares, and each segment's value distribution is its recorded
histogram on a log grid of relative width ``α`` (``value_alpha`` = 0.5 %: bin ``i ≥ 1`` covers
``[v_min·γ^(i−1), v_min·γ^i)``, ``γ = (1+α)/(1−α)``, log-uniform inside; bin 0 covers
``[0, v_min)``, uniform inside). Cell ``k`` of a segment is the quantile range
``[k/K, (k+1)/K]`` of that histogram; its moments are exact integrals over it::

    E[Vʲ | cell] = K · Σ_i m_i · (bʲ − aʲ) / (j · ln(hi_i/lo_i))

over the part ``[a, b]`` of each log bin ``i`` (mass share ``m_i``) inside the cell. The share of
eligible requests is the recorded one (``SimConfig.eligible_share``). What the cell model cannot
hold: the segment mix and the value distribution are pooled over regions and time (per-region,
per-step *counts* stay exact), and eligibility is independent of segment and value.

The derived scenario (:func:`derived_scenario`) carries all of it — the recorded shares, each
segment's histogram (``value.csv``, rows at the bins' middles: :func:`value_histogram`), the
eligible share and the arrivals per second (``traffic.arrivals``) — and a scenario with value
histograms gets these very cells (:meth:`RecordedPopulation.from_histograms`), so for one seed
``simulate DERIVED`` and ``simulate BASE --replay FILE`` are the same simulation.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np
import numpy.typing as npt
from scipy.special import ndtr

from headroom.kernel.errors import ConfigError
from headroom.kernel.scenario import (
    Dedicated,
    Opportunistic,
    Point,
    Region,
    Scenario,
    Segment,
    Traffic,
    ValueDist,
)
from headroom.kernel.traces import PoolKey, ScenarioTraces
from headroom.sim.config import SimConfig
from headroom.sim.context import Curves, SimContext
from headroom.sim.population import Population
from headroom.sim.replay_read import (
    V_MIN,
    VALUE_ALPHA,
    ProgressFn,
    Recording,
    ReplayConfig,
    ValueGrid,
    read_replay,
)
from headroom.streams.messages import Capacity, Request
from headroom.streams.recording import Envelope

__all__ = [
    "ABSENT_SHARE",
    "RecordedPopulation",
    "ReplayContext",
    "ReplayTraces",
    "derived_scenario",
    "recorded_segments",
    "replay_context",
    "scenario_regions_text",
    "value_histogram",
    "write_feed_recording",
]

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]


# --------------------------------------------------------------------------------------------
# The scenario a recording implies
# --------------------------------------------------------------------------------------------


def derived_scenario(
    base: Scenario,
    recording: Recording,
    *,
    default_dedicated: str | None = None,
    name: str | None = None,
    traffic_csv: Mapping[str, str] | None = None,
    pool_csv: Mapping[tuple[str, PoolKey], str] | None = None,
    arrivals_csv: Mapping[str, str] | None = None,
    value_csv: Mapping[str, str] | None = None,
) -> Scenario:
    """The base's slo, world and models with the recording's segment mix and values
    (:func:`recorded_segments`), regions, traffic (rate trace and the arrivals per second) and
    opportunistic capacity (level traces), lasting the recording's span, no events.

    ``traffic_csv`` / ``pool_csv`` / ``arrivals_csv`` / ``value_csv`` only name the CSV files a
    written copy uses (so the loaded file compares equal). :class:`ConfigError` for a recorded
    region the base does not list, unless ``default_dedicated`` names the base region whose
    dedicated capacity it gets.
    """
    by_name = {r.name: r for r in base.regions}
    problems = []
    fallback: Dedicated | None = None
    if default_dedicated is not None:
        if default_dedicated not in by_name:
            problems.append(
                f"--default-dedicated: {default_dedicated!r} is not a region of scenario "
                f"{base.name!r} ({', '.join(by_name)})"
            )
        else:
            fallback = by_name[default_dedicated].dedicated
    regions = []
    for rname in recording.regions:
        region = by_name.get(rname)
        dedicated = region.dedicated if region is not None else fallback
        if dedicated is None:
            if default_dedicated is None:
                problems.append(
                    f"--replay: region {rname!r} of the recording (first at line "
                    f"{recording.first_line[rname]}) is not in scenario {base.name!r}'s regions "
                    f"({', '.join(by_name)}); add it with its dedicated capacity, or pass "
                    "--default-dedicated REGION to give it that region's"
                )
            continue
        csv_name = traffic_csv.get(rname) if traffic_csv else None
        per_second = recording.step_s == 1.0
        traffic = Traffic(
            csv=csv_name,
            trace=recording.rate_points[rname],
            arrivals_csv=arrivals_csv.get(rname) if arrivals_csv and per_second else None,
            arrivals=(
                tuple((float(k), float(n)) for k, n in enumerate(recording.arrivals[rname]))
                if per_second
                else None
            ),
        )
        pools = tuple(
            Opportunistic(
                resource=p.key.resource,  # type: ignore[arg-type]  # checked when read
                hardware=p.key.hardware,
                trace=p.points,
                expires_in_s=p.expires_in_s,
                remote=p.key.remote,
                csv=pool_csv.get((rname, p.key)) if pool_csv else None,
            )
            for p in recording.pools[rname]
        )
        regions.append(
            Region(name=rname, dedicated=dedicated, traffic=traffic, opportunistic=pools)
        )
    if problems:
        raise ConfigError(problems)
    return Scenario(
        name=name or _name(f"{base.name}-replay"),
        seed=base.seed,
        duration_s=recording.span_s,
        slo=base.slo,
        world=base.world,
        models=base.models,
        segments=recorded_segments(base.segments, recording, value_csv),
        regions=tuple(regions),
        events=(),
        control=base.control,
        source=recording.path,
        eligible_share=recording.eligible_share,
    )


# a scenario segment no recorded request belongs to keeps this share (shares must be > 0)
ABSENT_SHARE = 1e-9


def recorded_segments(
    base: Sequence[Segment],
    recording: Recording,
    value_csv: Mapping[str, str] | None = None,
) -> tuple[Segment, ...]:
    """The base's segments with the recording's share and value distribution each.

    ``share`` is the segment's share of the recorded requests (exactly the replay's); ``value``
    is the recorded histogram (:func:`value_histogram`, the replay's cells exactly) summarised by
    the log-normal with the recorded mean (``mean`` = Σv / n, zeros included) and the recorded
    spread of ``ln v`` over the values above 0 (``sigma``, at most 5). ``base_error`` and
    ``strong_error`` are the base's (the ranking world is not in a recording). A segment
    without a recorded request keeps the base's value and gets share :data:`ABSENT_SHARE`.
    ``value_csv`` only names the files a written copy uses, per segment.
    """
    counts = np.asarray(recording.value_counts, dtype=np.int64).sum(axis=1)
    total = int(counts.sum())
    sums = recording.value_sums
    if total == 0 or sums.shape != (len(base), 4):
        return tuple(base)
    out = []
    for s, seg in enumerate(base):
        n = int(counts[s])
        if n == 0:
            out.append(replace(seg, share=ABSENT_SHARE))
            continue
        total_v, n_pos, sum_l, sum_l2 = (float(x) for x in sums[s])
        mean = total_v / n
        value = seg.value
        if mean > 0.0 and n_pos > 0:
            var = max(sum_l2 / n_pos - (sum_l / n_pos) ** 2, 0.0)
            value = ValueDist(
                mean=mean,
                sigma=min(math.sqrt(var), 5.0),
                csv=value_csv.get(seg.name) if value_csv else None,
                histogram=value_histogram(recording, s),
            )
        out.append(replace(seg, share=n / total, value=value))
    return tuple(out)


def value_histogram(recording: Recording, s: int) -> tuple[Point, ...]:
    """Segment ``s``'s recorded values as ``(value, requests)`` rows: one per non-empty bin of
    the value grid, at the bin's middle (log middle; bin 0, below ``V_MIN``, its linear one), so
    that each row reads back into its own bin."""
    row = np.asarray(recording.value_counts[s])
    idx = np.nonzero(row)[0]
    mids = recording.grid.at(idx, np.full(idx.size, 0.5))
    return tuple((float(v), float(n)) for v, n in zip(mids, row[idx], strict=True))


def _name(text: str) -> str:
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in text)
    return safe[:64] or "replay"


# --------------------------------------------------------------------------------------------
# The population of recorded requests
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True, eq=False, kw_only=True)
class RecordedPopulation(Population):
    """Population cells whose segment shares and value distributions are a recording's.

    ``cdf[s, i]`` is the share of segment ``s``'s requests valued below ``grid.edges[i]``; the
    parametric methods of :class:`Population` are replaced by exact ones on that histogram.
    A segment with no recorded request has share 0 and the scenario's log-normal (so every
    array stays defined).
    """

    grid: ValueGrid
    cdf: FloatArray  # (S, B + 1)
    recorded: IntArray  # (S,) requests per segment

    @classmethod
    def from_histograms(
        cls, scenario: Scenario, bins: int, alpha: float = VALUE_ALPHA
    ) -> RecordedPopulation:
        """The cells of a scenario whose segments carry recorded value histograms
        (``value.csv``): each row's requests in the grid bin of its value; the segment shares
        are the scenario's (normalised only when they do not sum to 1 within 1e-12); a segment
        without a histogram keeps its log-normal."""
        grid = ValueGrid.make(alpha)
        counts = np.zeros((len(scenario.segments), grid.n_bins), dtype=np.int64)
        for s, seg in enumerate(scenario.segments):
            if seg.value.histogram is not None:
                h = np.asarray(seg.value.histogram, dtype=np.float64)
                idx = grid.index(h[:, 0])
                counts[s] = np.bincount(idx, weights=h[:, 1], minlength=grid.n_bins).astype(
                    np.int64
                )
        shares = np.array([seg.share for seg in scenario.segments], dtype=np.float64)
        total = float(shares.sum())
        if abs(total - 1.0) > 1e-12:
            shares = shares / total
        return cls.from_counts(scenario.segments, counts, grid, bins, shares=shares)

    @classmethod
    def from_counts(
        cls,
        segments: Sequence[Segment],
        counts: npt.NDArray[np.int64],
        grid: ValueGrid,
        bins: int,
        *,
        shares: FloatArray | None = None,
    ) -> RecordedPopulation:
        """``shares``: the segment shares (default: the recorded ones, ``counts`` per segment
        over the total)."""
        if bins < 1:
            raise ValueError(f"bins: must be >= 1, got {bins}")
        n_seg = len(segments)
        counts = np.asarray(counts, dtype=np.int64)
        per_seg = counts.sum(axis=1)
        total = int(per_seg.sum())
        cdf = np.zeros((n_seg, grid.edges.size))
        for s, spec in enumerate(segments):
            if per_seg[s] > 0:
                cdf[s, 1:] = np.cumsum(counts[s]) / per_seg[s]
            else:
                sig = max(spec.value.sigma, 1e-12)
                mu = math.log(spec.value.mean) - 0.5 * sig * sig
                with np.errstate(divide="ignore"):
                    z = (np.log(np.maximum(grid.edges, 1e-300)) - mu) / sig
                cdf[s] = np.where(grid.edges > 0, ndtr(z), 0.0)
                cdf[s, -1] = 1.0
        cdf[:, -1] = 1.0
        if shares is not None:
            seg_share = np.asarray(shares, dtype=np.float64)
        elif total > 0:
            seg_share = per_seg / total
        else:
            seg_share = np.array([s.share for s in segments], dtype=np.float64)
        seg_share = np.asarray(seg_share, dtype=np.float64)
        n_cells = n_seg * bins
        moments = np.zeros((4, n_cells))
        v_lo = np.zeros(n_cells)
        v_hi = np.zeros(n_cells)
        mu_s = np.zeros(n_seg)
        sigma_s = np.zeros(n_seg)
        for s in range(n_seg):
            mass = np.diff(cdf[s])
            for k in range(bins):
                c = s * bins + k
                qa, qb = k / bins, (k + 1) / bins
                v_lo[c] = float(_quantile(grid, cdf[s], np.array([qa]))[0])
                v_hi[c] = float(_quantile(grid, cdf[s], np.array([qb]))[0])
                lo_q = np.maximum(cdf[s, :-1], qa)
                hi_q = np.minimum(cdf[s, 1:], qb)
                inside = (hi_q > lo_q) & (mass > 0)
                if not inside.any():
                    moments[:, c] = v_lo[c] ** np.arange(1, 5)
                    continue
                idx = np.nonzero(inside)[0]
                m = mass[idx]
                xa = (lo_q[idx] - cdf[s, idx]) / m
                xb = (hi_q[idx] - cdf[s, idx]) / m
                a = grid.at(idx, xa)
                b = grid.at(idx, xb)
                for j in range(1, 5):
                    moments[j - 1, c] = bins * float((m * grid.power_integral(idx, a, b, j)).sum())
            # informational log-normal fit of the segment (mean and spread of ln v)
            mid = grid.at(np.arange(mass.size), np.full(mass.size, 0.5))
            lv = np.log(np.maximum(mid, V_MIN))
            mu_s[s] = float((mass * lv).sum())
            sigma_s[s] = float(np.sqrt(max((mass * lv * lv).sum() - mu_s[s] ** 2, 0.0)))
        seg = np.repeat(np.arange(n_seg), bins).astype(np.int64)
        return cls(
            segments=tuple(x.name for x in segments),
            bins=bins,
            seg=seg,
            share=(seg_share[seg] / bins).astype(np.float64),
            v_mean=moments[0].copy(),
            v_moments=moments,
            v_lo=v_lo,
            v_hi=v_hi,
            mu=mu_s,
            sigma=sigma_s,
            seg_share=seg_share,
            grid=grid,
            cdf=cdf,
            recorded=per_seg.astype(np.int64),
        )

    # -- the histogram's own distribution functions ------------------------------------------

    def segment_cdf(self, s: int, v: float) -> float:
        """Share of segment ``s``'s requests valued below ``v``."""
        if v <= 0.0:
            return 0.0
        i = self.grid.index(np.array([v]))
        x = self.grid.local(i, np.array([v]))
        row = self.cdf[s]
        return float(row[i[0]] + x[0] * (row[i[0] + 1] - row[i[0]]))

    def value_cdf(self, v: float) -> float:
        return float(
            sum(self.seg_share[s] * self.segment_cdf(s, v) for s in range(self.n_segments))
        )

    def value_quantile(self, q: float) -> float:
        if q <= 0.0:
            return 0.0
        if q >= 1.0:
            return math.inf
        mix = self.seg_share @ self.cdf  # (B + 1,): linear in each bin's local coordinate
        return float(_quantile(self.grid, mix, np.array([q]))[0])

    def share_above(self, v: float) -> FloatArray:
        if v <= 0.0:
            return np.ones(self.n_cells)
        if math.isinf(v):
            return np.zeros(self.n_cells)
        u = np.array([self.segment_cdf(s, v) for s in range(self.n_segments)])[self.seg]
        k = np.arange(self.n_cells) % self.bins
        return np.asarray(np.clip(((k + 1) / self.bins - u) * self.bins, 0.0, 1.0))

    def sample_values(self, cells: IntArray, u: FloatArray) -> FloatArray:
        cells = np.asarray(cells, dtype=np.int64)
        k = cells % self.bins
        q = (k + np.clip(u, 1e-12, 1 - 1e-12)) / self.bins
        out = np.empty(cells.size)
        s_of = self.seg[cells]
        for s in np.unique(s_of):
            sel = s_of == s
            out[sel] = _quantile(self.grid, self.cdf[s], q[sel])
        return out


def _quantile(grid: ValueGrid, cdf: FloatArray, q: FloatArray) -> FloatArray:
    """Inverse of a piecewise (log-)linear CDF on the grid, at shares ``q``."""
    q = np.clip(np.asarray(q, dtype=np.float64), 0.0, 1.0)
    # the bin whose [cdf_i, cdf_{i+1}) holds q; empty bins are stepped over
    i = np.searchsorted(cdf, q, side="right") - 1
    i = np.clip(i, 0, grid.n_bins - 1)
    lo = cdf[i]
    hi = cdf[i + 1]
    with np.errstate(divide="ignore", invalid="ignore"):
        x = np.where(hi > lo, (q - lo) / (hi - lo), 0.0)
    return grid.at(i, np.clip(x, 0.0, 1.0))


# --------------------------------------------------------------------------------------------
# Into the engine
# --------------------------------------------------------------------------------------------


class ReplayTraces(ScenarioTraces):
    """:class:`ScenarioTraces` of the derived scenario with the recorded arrivals per step.

    The rate (from the traffic trace) and the pools (from the opportunistic traces) are the
    derived scenario's, built by the parent; only the Poisson arrival draws are replaced by the
    recorded counts, so the generator passed in affects nothing the engine reads.
    """

    def __init__(self, scenario: Scenario, recording: Recording, rng: np.random.Generator) -> None:
        super().__init__(scenario, rng, recording.step_s)
        regions = []
        for rt in self.regions:
            counts = np.asarray(recording.arrivals[rt.name], dtype=np.int64)
            if counts.size != self.n_steps:
                raise ValueError(
                    f"recording binned into {counts.size} steps, the run has {self.n_steps}"
                )
            regions.append(replace(rt, arrivals=counts))
        self.regions = tuple(regions)
        self.recording = recording


class ReplayContext(SimContext):
    """The shared context of a replayed run: a :class:`SimContext` of the derived scenario whose
    traces carry the recorded arrivals and whose population is the recorded requests'.

    ``t0`` is the recording's first ts (scenario time 0 on the recording's clock).
    """

    def __init__(
        self,
        scenario: Scenario,
        recording: Recording,
        curves: Curves,
        *,
        seed: int | None = None,
        config: SimConfig | None = None,
    ) -> None:
        cfg = config or SimConfig()
        if cfg.step_s != recording.step_s:
            raise ConfigError(
                f"sim.step_s: {cfg.step_s} differs from the step the recording was binned in "
                f"({recording.step_s}); read it with ReplayConfig(step_s={cfg.step_s})"
            )
        share = recording.eligible_share
        if share is not None:
            cfg = cfg.with_overrides(eligible_share=share)
        super().__init__(scenario, curves, seed=seed, config=cfg)
        layout = self.pop.seg
        pools = [r.pools for r in self.regions]
        # the derived scenario's traces, with the recorded arrivals; the generator's draws are
        # all replaced (ReplayTraces), so a fixed seed is as good as any
        self.traces = ReplayTraces(scenario, recording, np.random.default_rng(0))
        self.pop = RecordedPopulation.from_counts(
            scenario.segments, recording.value_counts, recording.grid, cfg.value_bins
        )
        if not np.array_equal(layout, self.pop.seg) or pools != [
            tuple(p.key for p in rt.pools) for rt in self.traces.regions
        ]:
            raise RuntimeError("replay: the recorded population or pools do not fit the engine")
        self.recording = recording
        self.t0 = recording.t0


def replay_context(
    base: Scenario,
    path: str | Path,
    *,
    seed: int | None = None,
    config: SimConfig | None = None,
    replay_config: ReplayConfig | None = None,
    curves: Curves | None = None,
    default_dedicated: str | None = None,
    progress: ProgressFn | None = None,
) -> tuple[Scenario, ReplayContext]:
    """Read ``path`` and build the context every policy of a replayed run shares.

    Returns the derived scenario (pass it to :func:`headroom.sim.run.run_simulation` with the
    context) and the context; the recording (with its :class:`ReplaySummary`) is ``ctx.recording``.
    """
    cfg = config or SimConfig()
    rcfg = replay_config or ReplayConfig(step_s=cfg.step_s)
    recording = read_replay(path, [s.name for s in base.segments], config=rcfg, progress=progress)
    scenario = derived_scenario(base, recording, default_dedicated=default_dedicated)
    if curves is None:
        from headroom.world.curves import curves_for

        curves = curves_for(scenario, seed=seed)
    return scenario, ReplayContext(scenario, recording, curves, seed=seed, config=cfg)


def scenario_regions_text(recording: Recording) -> list[str]:
    """One line per region: requests and pools (the CLI prints it)."""
    out = []
    for r in recording.regions:
        n = int(recording.arrivals[r].sum())
        pools = ", ".join(f"{p.key.label()} ({len(p.points)} level(s))" for p in recording.pools[r])
        out.append(f"  {r}: {n} request(s); opportunistic: {pools or 'none'}")
    return out


# --------------------------------------------------------------------------------------------
# A recording without Kafka (tests, benchmarks, demos)
# --------------------------------------------------------------------------------------------


def write_feed_recording(
    scenario: Scenario,
    out: BinaryIO,
    *,
    t0: float = 1_796_000_000.0,
    duration_s: float | None = None,
    seed: int | None = None,
    prefix: str = "headroom.",
    refresh_s: float = 10.0,
) -> Counter[str]:
    """Write what ``headroom feed SCENARIO --speed 1`` publishes, as a recording.

    The messages are the feed's own schedule (:class:`headroom.kernel.schedule.FeedSchedule`:
    capacity levels at 0 and at every change, every level announced again each ``refresh_s``, every
    request), stamped ``ts = t0 + t`` as a feed at speed 1 started at ``t0`` stamps them, in
    time order, one partition per topic. Returns the messages written per topic kind.
    """
    from headroom.kernel.schedule import FeedSchedule
    from headroom.streams.messages import encode
    from headroom.streams.recording import encode_envelope

    schedule = FeedSchedule(scenario, seed)
    end = schedule.duration_s if duration_s is None else min(duration_s, schedule.duration_s)
    updates = [u for u in schedule.capacity_updates() if u.t < end]
    offsets: Counter[str] = Counter()
    written: Counter[str] = Counter()

    def put(kind: str, t: float, msg: Capacity | Request) -> None:
        topic = f"{prefix}{kind}"
        env = Envelope(
            topic=topic,
            partition=0,
            offset=offsets[topic],
            key=msg.region.encode(),
            payload=encode(msg),
            ts=round((t0 + t) * 1000.0),
        )
        offsets[topic] += 1
        written[kind] += 1
        out.write(encode_envelope(env) + b"\n")

    levels: dict[tuple[str, str, str, bool], Any] = {}
    u_next = 0
    next_refresh = refresh_s
    n_cap = 0

    def capacity(t: float, u: Any, reason: str) -> None:
        nonlocal n_cap
        n_cap += 1
        put(
            "capacity",
            t,
            Capacity(
                ts=t0 + t,
                region=u.region,
                resource=u.resource,
                hardware=u.hardware,
                pool="opportunistic",
                units=u.units,
                reason=reason,  # type: ignore[arg-type]  # a CapacityReason
                id=f"c-{n_cap}",
                expires_in_s=u.expires_in_s,
                remote=u.remote,
            ),
        )

    for second in range(math.ceil(end)):
        horizon = min(second + 1.0, end)
        while True:
            t_up = updates[u_next].t if u_next < len(updates) else math.inf
            if min(t_up, next_refresh) >= horizon:
                break
            if t_up <= next_refresh:
                u = updates[u_next]
                u_next += 1
                levels[(u.region, u.resource, u.hardware, u.remote)] = u
                capacity(u.t, u, u.reason)
            else:
                for u in list(levels.values()):
                    capacity(next_refresh, u, "update")
                next_refresh += refresh_s
        for t, region, fields in schedule.requests(second):
            if t < end:
                put("requests", t, Request(ts=t0 + t, region=region, **fields))
    return written
