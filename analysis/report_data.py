"""The report's data: one streaming pass over an event log, every series binned in scenario time.

:func:`collect` reads the log once (bounded memory: every time series is binned into at most
``MAX_BINS`` buckets of scenario time) into a :class:`ReportData` — per policy and region the
window p99s, capacity offered and used, targets, value by lever, releases, shedding, allocator
decisions, precompute sums and the merged latency sketches — that :mod:`headroom.analysis.plots`
draws and :mod:`headroom.analysis.report` writes out.
"""

from __future__ import annotations

import itertools
import math
from collections import defaultdict
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import orjson

from headroom.analysis.events import KNOWN_KINDS, LogStats
from headroom.analysis.metrics import MetricsAccumulator, SketchSum

PEEK_EVENTS = 10_000  # events held back while looking for run.started
MAX_BINS = 480  # time buckets per series: 3 minutes over 24 h, one per window over an hour
RAW_SAMPLES_PER_KIND = 3  # unknown-kind lines shown verbatim in the report
RAW_KINDS = 10
# q grid for the CDFs: dense in the tail, where the SLO lives.

# the precompute counters of window lines the report plots (docs/events.md)
_PRECOMPUTE_SERIES = (
    "visits", "hits", "jobs", "wasted_partial", "expired_unused", "dropped_unused",
)  # fmt: skip


# ---------------------------------------------------------------------------------------------
# One pass over the log: binned series
# ---------------------------------------------------------------------------------------------


@dataclass
class _Binned:
    """Sums and counts of some named quantities per time bucket (plain lists while filling:
    scalar updates of numpy arrays cost several times more)."""

    n_bins: int
    sums: dict[str, list[float]] = field(default_factory=dict)
    counts: dict[str, list[int]] = field(default_factory=dict)

    def add(self, name: str, b: int, value: float) -> None:
        s = self.sums.get(name)
        if s is None:
            s = self.sums[name] = [0.0] * self.n_bins
            self.counts[name] = [0] * self.n_bins
        s[b] += value
        self.counts[name][b] += 1

    def mean(self, name: str) -> np.ndarray:
        s = self.sums.get(name)
        if s is None:
            return np.full(self.n_bins, np.nan)
        c = np.asarray(self.counts[name], dtype=float)
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(c > 0, np.asarray(s) / np.maximum(c, 1), np.nan)

    def total(self, name: str) -> np.ndarray:
        s = self.sums.get(name)
        return np.asarray(s, dtype=float) if s is not None else np.zeros(self.n_bins)


@dataclass
class ReportData:
    """Everything the plots need, collected in one pass over the log."""

    duration_s: float
    bin_s: float
    n_bins: int
    policies: list[str]
    regions: list[str]
    stats: LogStats
    acc: MetricsAccumulator
    window: dict[tuple[str, str], _Binned] = field(default_factory=dict)  # (policy, region)
    value: dict[str, _Binned] = field(default_factory=dict)  # policy -> inc by lever
    shedding: dict[str, _Binned] = field(default_factory=dict)  # policy -> server/client
    allocation: dict[tuple[str, str], _Binned] = field(default_factory=dict)  # (policy, region)
    fallbacks: dict[str, _Binned] = field(default_factory=dict)  # policy -> reason counts
    precompute: dict[str, _Binned] = field(default_factory=dict)  # policy -> precompute sums
    sketches: dict[tuple[str, str], SketchSum] = field(default_factory=dict)  # (policy, all|base)
    release_ms: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    reclaims: dict[tuple[str, str], list[float]] = field(default_factory=lambda: defaultdict(list))
    raw_unknown: dict[str, list[bytes]] = field(default_factory=dict)

    def bin_of(self, t: float) -> int:
        if not math.isfinite(t):
            return 0
        return min(self.n_bins - 1, max(0, int(t // self.bin_s)))

    def binned(self, table: dict[Any, _Binned], key: Any) -> _Binned:
        b = table.get(key)
        if b is None:
            b = table[key] = _Binned(self.n_bins)
        return b

    def bin_times(self) -> np.ndarray:
        return (np.arange(self.n_bins) + 0.5) * self.bin_s


def _num(x: Any) -> float:
    if isinstance(x, bool) or not isinstance(x, int | float) or not math.isfinite(x):
        return math.nan
    return float(x)


def collect(
    events: Iterable[Mapping[str, Any]],
    metrics: Mapping[str, Any] | None = None,
    stats: LogStats | None = None,
) -> ReportData:
    """One pass over the events: binned time series, merged sketches, release times, and (in
    ``data.acc``) the metrics themselves, so ``headroom analyze`` reads a log once.

    The time buckets come from ``metrics`` when given (the longest policy's ``duration_s``),
    else from the ``run.started`` lines among the first ``PEEK_EVENTS`` events (held back until
    the buckets are known), else from the span of those events.
    """
    it = iter(events)
    head, data = _buckets(it, metrics, stats)
    t0: dict[str | None, float] = {}
    regions: dict[str, None] = {}
    for e in itertools.chain(head, it):
        data.acc.add(e)
        kind = e.get("kind")
        policy = e.get("policy")
        region = e.get("region")
        if kind == "window":
            if isinstance(policy, str):
                if isinstance(region, str):
                    regions.setdefault(region)
                _collect_window(data, e, policy, region)
        elif kind == "run.started":
            t0[policy if isinstance(policy, str) else None] = _num(e.get("t0"))
            for r in e.get("regions") or []:
                if isinstance(r, str):
                    regions.setdefault(r)
        elif isinstance(policy, str):
            _collect_event(data, e, policy, region, t0)
        elif kind not in KNOWN_KINDS:
            _keep_raw(data, e)
    for p in data.acc.policy_names():
        if p not in data.policies:
            data.policies.append(p)
        # the run-wide sketches the metrics merged (the latency figures): one merge for both
        for which, merged in zip(("all", "base"), data.acc.latency_sums(p), strict=True):
            if merged.alpha is not None:
                data.sketches[(p, which)] = merged
    data.regions = list(regions)
    data.acc.flush()  # judges the windows still open, so every p99 is in the series
    return data


def _buckets(
    it: Iterator[Mapping[str, Any]],
    metrics: Mapping[str, Any] | None,
    stats: LogStats | None,
) -> tuple[list[Mapping[str, Any]], ReportData]:
    """The empty report with its time buckets (see :func:`collect`), and the events read from
    ``it`` to find them (to be collected first)."""
    head: list[Mapping[str, Any]] = []
    if metrics is not None:
        policies_m: Mapping[str, Any] = metrics.get("policies") or {}
        # the planned duration (an incomplete policy's duration_s is only the span covered)
        durations = [
            _num((m.get("completeness") or {}).get("planned_s", m.get("duration_s")))
            for m in policies_m.values()
        ]
        windows = [_num((m.get("slo") or {}).get("window_s")) for m in policies_m.values()]
        order = list(policies_m)
    else:
        for e in it:
            head.append(e)
            if e.get("kind") == "run.started" or len(head) >= PEEK_EVENTS:
                break
        starts = [e for e in head if e.get("kind") == "run.started"]
        durations = [_num(e.get("duration_s")) for e in starts]
        windows = [_num((e.get("slo") or {}).get("window_s")) for e in starts]
        if not starts:
            durations = [_num(e.get("t_end")) for e in head if e.get("kind") == "window"]
        order = []
    duration = max([d for d in durations if d > 0] or [1.0])
    window_s = min([w for w in windows if w > 0] or [duration / MAX_BINS])
    n_bins = max(1, min(MAX_BINS, math.ceil(duration / window_s)))
    data = ReportData(
        duration_s=duration,
        bin_s=duration / n_bins,
        n_bins=n_bins,
        policies=order,
        regions=[],
        stats=stats if stats is not None else LogStats(),
        acc=MetricsAccumulator(),
    )
    return head, data


def _collect_window(data: ReportData, e: Mapping[str, Any], policy: str, region: Any) -> None:
    """A ``window`` line: its levels, value by lever, precompute sums (its sketches are merged
    by the metrics: ``data.acc``)."""
    t_start = _num(e.get("t_start"))
    t_end = _num(e.get("t_end"))
    length = t_end - t_start if t_end > t_start else data.bin_s
    b = data.bin_of(t_start)
    _window_levels(data.binned(data.window, (policy, str(region))), e, b, length)
    inc = e.get("inc")
    if isinstance(inc, dict):
        vb = data.binned(data.value, policy)
        for lever, v in inc.items():
            x = _num(v)
            if math.isfinite(x):
                vb.add(str(lever), b, x)
    lost = _num(e.get("value_lost"))  # failed and timed-out requests' value, beside the levers
    if math.isfinite(lost) and lost != 0.0:
        data.binned(data.value, policy).add("lost", b, lost)
    pre = e.get("precompute")
    if isinstance(pre, dict):
        _window_precompute(data.binned(data.precompute, policy), pre, b, length)


def _window_levels(w: _Binned, e: Mapping[str, Any], b: int, length: float) -> None:
    """A window's targets, capacity, and used and offered rates, per resource."""
    targets = e.get("targets") or {}
    capacity = e.get("capacity") or {}
    used = e.get("used_unit_s") or {}
    offered = e.get("offered_unit_s") or {}
    for name, source in (
        ("rma_candidates", targets),
        ("sbm_coverage", targets),
    ):
        v = _num(source.get(name)) if isinstance(source, dict) else math.nan
        if math.isfinite(v):
            w.add(name, b, v)
    for r in ("cpu", "accelerator"):
        for prefix, source, scale in (
            ("capacity_", capacity, 1.0),
            ("used_", used, 1.0 / length),
            ("offered_", offered, 1.0 / length),
        ):
            v = _num(source.get(r)) if isinstance(source, dict) else math.nan
            if math.isfinite(v):
                w.add(prefix + r, b, v * scale)


def _window_precompute(pb: _Binned, pre: Mapping[str, Any], b: int, length: float) -> None:
    """A window's precompute sums and the median age of what it served."""
    pb.add("_span", b, length)  # seconds of windows in the bucket
    for name in _PRECOMPUTE_SERIES:
        x = _num(pre.get(name))
        if math.isfinite(x):
            pb.add(name, b, x)
    samples = [x for x in (pre.get("staleness_s") or []) if math.isfinite(_num(x))]
    if samples:  # the window's median age at use, averaged per bucket
        pb.add("staleness_p50", b, float(np.median(np.asarray(samples, float))))


def _collect_event(
    data: ReportData,
    e: Mapping[str, Any],
    policy: str,
    region: Any,
    t0: Mapping[str | None, float],
) -> None:
    """A timed line of one policy (release, reclaim, shedding, target, fallback), binned at its
    ``t`` (else its ``ts`` less the run's start); an unknown kind is kept raw."""
    kind = e.get("kind")
    t = _num(e.get("t"))
    if not math.isfinite(t):
        base = t0.get(policy, t0.get(None, math.nan))
        t = _num(e.get("ts")) - base
    b = data.bin_of(t)
    if kind == "optional.released":
        v = _num(e.get("release_ms"))
        if math.isfinite(v):
            data.release_ms[policy].append(v)
    elif kind == "capacity.reclaimed":
        data.reclaims[(policy, str(region))].append(t)
    elif kind == "shedding.started":
        side = e.get("side")
        data.binned(data.shedding, policy).add(str(side), b, 1.0)
    elif kind == "target.issued":
        _collect_target(data, e, policy, region, b)
    elif kind == "allocator.fallback":
        data.binned(data.fallbacks, policy).add("allocator", b, 1.0)
    elif kind not in KNOWN_KINDS:
        _keep_raw(data, e)


def _collect_target(
    data: ReportData, e: Mapping[str, Any], policy: str, region: Any, b: int
) -> None:
    """A ``target.issued`` line: the allocation by lever and resource, and its fallback flag."""
    alloc = data.binned(data.allocation, (policy, str(region)))
    alloc.add("_steps", b, 1.0)
    for share in e.get("allocation") or []:
        if not isinstance(share, dict):
            continue
        lever = str(share.get("lever"))
        for r in ("cpu", "accelerator"):
            v = _num(share.get(r))
            if math.isfinite(v):
                alloc.add(f"{lever}:{r}", b, v)
    if e.get("fallback"):
        data.binned(data.fallbacks, policy).add("target", b, 1.0)


def _keep_raw(data: ReportData, e: Mapping[str, Any]) -> None:
    kind = str(e.get("kind"))
    samples = data.raw_unknown.get(kind)
    if samples is None:
        if len(data.raw_unknown) >= RAW_KINDS:
            return
        samples = data.raw_unknown[kind] = []
    if len(samples) < RAW_SAMPLES_PER_KIND:
        samples.append(orjson.dumps(e, option=orjson.OPT_SERIALIZE_NUMPY))
