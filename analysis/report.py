"""PNG plots and a self-contained ``report.html`` from a metrics document and its event log.

``write_report(metrics, events_path, out_dir)`` reads the log once more (streaming, bounded
memory: every time series is binned into at most ``MAX_BINS`` buckets of scenario time), draws the
plots with matplotlib's Agg renderer (no display, no pyplot global state), writes them to
``out_dir/plots/*.png`` and inlines them as base64 in ``out_dir/report.html``, so the report is
one file that opens anywhere with no external asset.

The plots (each explained under its image in the report):

* summary — incremental value by lever per policy against the oracle bound, and SLO violations;
* p99 over time — per region, per policy: the worst window p99 in each time bucket, SLO line;
* latency CDFs — per policy, all requests vs requests that ran without optional work, from the
  merged window sketches (``sketch`` and ``sketch_base``) of the whole run;
* targets against capacity — per region: opportunistic capacity and what optional work used,
  then each policy's RMA candidate target and SBM coverage target;
* value by lever over time — per policy, incremental value per bucket stacked by lever;
* release times — distribution of ``release_ms`` per policy against the 10 ms goal, and
  shedding activations over time;
* segment exposure — SBM share and incremental value per request, per segment and policy;
* allocator decisions — the allocator's split of opportunistic capacity between levers over time,
  fallbacks and cap hits;
* precompute — only when some window line carries ``precompute`` sums: per policy, hit rate,
  staleness of the results served, jobs and wasted jobs (stopped mid-way, expired or superseded
  unserved) over time.
"""

from __future__ import annotations

import base64
import html
import itertools
import math
from collections import Counter, defaultdict
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from headroom.analysis.events import KNOWN_KINDS, EventLog, LogStats
from headroom.analysis.metrics import MetricsAccumulator
from headroom.analysis.table import fmt_value
from headroom.kernel.errors import HeadroomError
from headroom.kernel.vocab import LEVERS

PEEK_EVENTS = 10_000  # events held back while looking for run.started
MAX_BINS = 480  # time buckets per series: 3 minutes over 24 h, one per window over an hour
RAW_SAMPLES_PER_KIND = 3  # unknown-kind lines shown verbatim in the report
RAW_KINDS = 10
RELEASE_GOAL_MS = 10.0  # the simulator's goal for release_ms_p99 (docs/simulator.md)
# q grid for the CDFs: dense in the tail, where the SLO lives.
CDF_QS = np.concatenate([np.linspace(0.0, 0.9, 46), 1 - np.logspace(-1, -4, 60)])

_POLICY_COLOURS = {
    "static": "#7f7f7f",
    "greedy": "#d62728",
    "central-only": "#ff7f0e",
    "aimd": "#9467bd",
    "gradient": "#8c564b",
    "headroom": "#1f77b4",
    "oracle": "#2ca02c",
}
_EXTRA_COLOURS = ["#17becf", "#bcbd22", "#e377c2", "#393b79", "#637939", "#843c39"]
# the precompute counters of window lines the report plots (docs/events.md)
_PRECOMPUTE_SERIES = (
    "visits", "hits", "jobs", "wasted_partial", "expired_unused", "dropped_unused",
)  # fmt: skip
_LEVER_COLOURS = {"rma": "#1f77b4", "sbm": "#ff7f0e", "precompute": "#2ca02c"}


def policy_colour(policy: str, order: Sequence[str]) -> str:
    if policy in _POLICY_COLOURS:
        return _POLICY_COLOURS[policy]
    extras = [p for p in order if p not in _POLICY_COLOURS]
    i = extras.index(policy) if policy in extras else 0
    return _EXTRA_COLOURS[i % len(_EXTRA_COLOURS)]


# ---------------------------------------------------------------------------------------------
# One pass over the log: binned series
# ---------------------------------------------------------------------------------------------


class _SketchSum:
    """Adds many contract sketches (one alpha) fast: keys and counts are buffered as the log
    gives them and folded with numpy in batches — exact, like ``LatencySketch.merge``."""

    FLUSH = 1 << 20

    def __init__(self) -> None:
        self.alpha: float | None = None
        self.zeros = 0
        self.mismatched = 0  # sketches of another alpha (left out)
        self._keys: list[str] = []
        self._counts: list[int] = []
        self.bins: Counter[int] = Counter()

    def add(self, d: Any) -> None:
        if not isinstance(d, dict):
            return
        alpha = d.get("alpha")
        bins = d.get("bins")
        if not isinstance(bins, dict) or not isinstance(alpha, float | int):
            return
        if self.alpha is None:
            self.alpha = float(alpha)
        elif alpha != self.alpha:
            self.mismatched += 1
            return
        zeros = d.get("zeros", 0)
        if type(zeros) is int and zeros > 0:
            self.zeros += zeros
        self._keys.extend(bins)
        self._counts.extend(bins.values())
        if len(self._keys) >= self.FLUSH:
            self._flush()

    def _flush(self) -> None:
        if not self._keys:
            return
        try:
            keys = np.fromiter(map(int, self._keys), dtype=np.int64, count=len(self._keys))
            counts = np.asarray(self._counts, dtype=np.int64)
        except (TypeError, ValueError):  # a malformed sketch somewhere: fold one by one
            for k, c in zip(self._keys, self._counts, strict=True):
                try:
                    if int(c) > 0:
                        self.bins[int(k)] += int(c)
                except (TypeError, ValueError):
                    continue
        else:
            uniq, inverse = np.unique(keys, return_inverse=True)
            sums = np.bincount(inverse, weights=counts)
            for k, c in zip(uniq.tolist(), sums.tolist(), strict=True):
                if c > 0:
                    self.bins[k] += int(c)
        self._keys.clear()
        self._counts.clear()

    def sketch(self) -> Any:
        """The merged ``LatencySketch`` (None when nothing was added)."""
        from headroom.kernel.sketch import LatencySketch

        self._flush()
        if self.alpha is None:
            return None
        return LatencySketch.from_dict(
            {
                "alpha": self.alpha,
                "bins": {str(k): c for k, c in self.bins.items()},
                "zeros": self.zeros,
            }
        )


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
    sketches: dict[tuple[str, str], _SketchSum] = field(default_factory=dict)  # (policy, all|base)
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
        durations = [_num(m.get("duration_s")) for m in policies_m.values()]
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
    """A ``window`` line: its levels, value by lever, precompute sums and sketches."""
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
    pre = e.get("precompute")
    if isinstance(pre, dict):
        _window_precompute(data.binned(data.precompute, policy), pre, b, length)
    for which, key in (("all", "sketch"), ("base", "sketch_base")):
        sk = e.get(key)
        if sk is not None:
            s = data.sketches.get((policy, which))
            if s is None:
                s = data.sketches[(policy, which)] = _SketchSum()
            s.add(sk)


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


# ---------------------------------------------------------------------------------------------
# Plots
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Plot:
    name: str
    title: str
    path: Path
    caption: str


def _figure(width: float, height: float) -> Any:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), dpi=100, layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def _time_axis(data: ReportData) -> tuple[np.ndarray, str]:
    t = data.bin_times()
    if data.duration_s >= 3 * 3600:
        return t / 3600.0, "scenario time (h)"
    return t / 60.0, "scenario time (min)"


def _time_scale(data: ReportData) -> float:
    return 3600.0 if data.duration_s >= 3 * 3600 else 60.0


def _save(fig: Any, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, format="png", metadata={"Software": None})


def _plain_ticks(axis: Any) -> None:
    """Log axes labelled 50, 100, 200 rather than 5×10¹, 10², 2×10²."""
    from matplotlib.ticker import LogLocator, NullFormatter, ScalarFormatter

    formatter = ScalarFormatter()
    formatter.set_scientific(False)
    axis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
    axis.set_major_formatter(formatter)
    axis.set_minor_formatter(NullFormatter())


def _legend(ax: Any, **kwargs: Any) -> None:
    """A legend when the axes has labelled artists (matplotlib warns on an empty one)."""
    if ax.get_legend_handles_labels()[0]:
        ax.legend(**kwargs)


def _grid(n: int, max_cols: int = 4) -> tuple[int, int]:
    cols = min(max_cols, max(1, n))
    return math.ceil(n / cols), cols


def plot_summary(metrics: Mapping[str, Any], data: ReportData, path: Path) -> None:
    pols = data.policies
    m = metrics["policies"]
    fig = _figure(11, 3.8)
    ax1, ax2 = fig.subplots(1, 2, width_ratios=[2, 1])
    x = np.arange(len(pols))
    bottom = np.zeros(len(pols))
    for lever in LEVERS:
        v = np.array([m[p]["value"].get(f"incremental_{lever}", 0.0) for p in pols])
        if not np.any(v):
            continue
        ax1.bar(x, v, bottom=bottom, color=_LEVER_COLOURS[lever], label=lever)
        bottom += v
    oracle = np.array([m[p]["value"].get("oracle_incremental", 0.0) for p in pols])
    ax1.scatter(x, oracle, marker="_", s=900, color="black", label="oracle bound", zorder=3)
    ax1.set_xticks(x, pols, rotation=20)
    ax1.set_ylabel("incremental value")
    ax1.set_title("incremental value by lever vs the oracle bound")
    _legend(ax1, fontsize=8)
    viol = [100.0 * m[p]["slo"]["violation_fraction"] for p in pols]
    ax2.bar(x, viol, color=[policy_colour(p, pols) for p in pols])
    ax2.set_xticks(x, pols, rotation=20)
    ax2.set_ylabel("% of SLO windows over the p99 limit")
    ax2.set_title("SLO violations")
    _save(fig, path)


def plot_p99(metrics: Mapping[str, Any], data: ReportData, path: Path) -> None:
    regions = data.regions or ["?"]
    fig = _figure(11, 2.8 * len(regions) + 0.6)
    axes = np.atleast_1d(fig.subplots(len(regions), 1, sharex=True, squeeze=False)[:, 0])
    tx, label = _time_axis(data)
    slo = None
    for ax, region in zip(axes, regions, strict=True):
        for p in data.policies:
            if p not in data.acc.policy_names() or region not in data.acc.regions(p):
                continue
            series = data.acc.window_series(p, region)
            if not len(series.p99_ms):
                continue
            worst = np.full(data.n_bins, np.nan)
            idx = np.minimum(
                data.n_bins - 1, (np.asarray(series.t_start) // data.bin_s).astype(int)
            )
            np.fmax.at(worst, idx, np.asarray(series.p99_ms))
            ax.plot(tx, worst, lw=1.0, color=policy_colour(p, data.policies), label=p)
            slo = (
                metrics["policies"][p]["slo"].get("p99_ms", slo)
                if p in metrics["policies"]
                else slo
            )
        if slo is not None:
            ax.axhline(slo, color="black", ls="--", lw=1, label="SLO p99")
        ax.set_ylabel("window p99 (ms)")
        ax.set_title(f"region {region}: worst window p99 per {data.bin_s:g} s bucket", fontsize=10)
        ax.set_yscale("log")
        _plain_ticks(ax.yaxis)
    _legend(axes[0], fontsize=8, ncol=4)
    axes[-1].set_xlabel(label)
    _save(fig, path)


def plot_cdf(metrics: Mapping[str, Any], data: ReportData, path: Path) -> None:
    pols = [p for p in data.policies if (p, "all") in data.sketches]
    rows, cols = _grid(len(pols) or 1)
    fig = _figure(3.2 * cols + 0.5, 2.8 * rows + 0.4)
    axes = np.atleast_1d(fig.subplots(rows, cols, sharex=True, sharey=True, squeeze=False)).ravel()
    y = -np.log10(1.0 - np.minimum(CDF_QS, 1 - 1e-4))
    ticks = [0.0, 1.0, 2.0, 3.0, 4.0]
    for ax, p in zip(axes, pols, strict=False):
        slo = metrics["policies"].get(p, {}).get("slo", {}).get("p99_ms")
        for which, style, label in (
            ("all", "-", "all requests"),
            ("base", "--", "no optional work"),
        ):
            acc = data.sketches.get((p, which))
            sk = acc.sketch() if acc is not None else None
            if sk is None or sk.count == 0:
                continue
            xs = np.array(sk.quantiles(list(CDF_QS)), dtype=float)
            ax.plot(
                xs,
                y,
                style,
                color=policy_colour(p, data.policies),
                label=f"{label} (n={sk.count:,})",
            )
        if slo:
            ax.axvline(slo, color="black", lw=0.8, ls=":")
        ax.set_title(p, fontsize=10)
        ax.set_xscale("log")
        _plain_ticks(ax.xaxis)
        ax.set_yticks(ticks, ["0", "90%", "99%", "99.9%", "99.99%"])
        _legend(ax, fontsize=7, loc="lower right")
    for ax in axes[len(pols) :]:
        ax.set_visible(False)
    for ax in axes[: len(pols)]:
        ax.set_xlabel("latency (ms)")
    _save(fig, path)


def plot_targets(data: ReportData, featured: str | None, path: Path) -> None:
    regions = data.regions or ["?"]
    fig = _figure(4.2 * len(regions) + 0.5, 8)
    axes = fig.subplots(3, len(regions), sharex=True, squeeze=False)
    tx, label = _time_axis(data)
    scale = _time_scale(data)
    for j, region in enumerate(regions):
        ax_cap, ax_rma, ax_sbm = axes[:, j]
        if featured is not None and (featured, region) in data.window:
            w = data.window[(featured, region)]
            for r, colour in (("cpu", "#1f77b4"), ("accelerator", "#d62728")):
                ax_cap.plot(
                    tx, w.mean(f"capacity_{r}"), color=colour, lw=1.2, label=f"{r} available"
                )
                ax_cap.plot(
                    tx, w.mean(f"used_{r}"), color=colour, lw=0.8, ls="--", label=f"{r} used"
                )
            for t in data.reclaims.get((featured, region), []):
                ax_cap.axvline(t / scale, color="black", lw=0.4, alpha=0.3)
        ax_cap.set_title(f"{region}: opportunistic capacity ({featured})", fontsize=10)
        ax_cap.set_ylabel("units")
        for p in data.policies:
            pw = data.window.get((p, region))
            if pw is None:
                continue
            colour = policy_colour(p, data.policies)
            ax_rma.plot(tx, pw.mean("rma_candidates"), color=colour, lw=1, label=p)
            ax_sbm.plot(tx, pw.mean("sbm_coverage"), color=colour, lw=1, label=p)
        ax_rma.set_ylabel("RMA candidates target")
        ax_sbm.set_ylabel("SBM coverage target")
        ax_sbm.set_xlabel(label)
    _legend(axes[0, 0], fontsize=7)
    _legend(axes[1, 0], fontsize=7, ncol=2)
    _save(fig, path)


def plot_value(data: ReportData, path: Path) -> None:
    pols = [p for p in data.policies if p in data.value]
    rows, cols = _grid(len(pols) or 1)
    fig = _figure(3.2 * cols + 0.5, 2.6 * rows + 0.4)
    axes = np.atleast_1d(fig.subplots(rows, cols, sharex=True, sharey=True, squeeze=False)).ravel()
    tx, label = _time_axis(data)
    for ax, p in zip(axes, pols, strict=False):
        vb = data.value[p]
        levers = [lv for lv in LEVERS if lv in vb.sums] + [lv for lv in vb.sums if lv not in LEVERS]
        ys = [vb.total(lv) for lv in levers]
        pos = [np.clip(y, 0, None) for y in ys]
        neg = [np.clip(y, None, 0) for y in ys]
        colours = [_LEVER_COLOURS.get(lv, "#999999") for lv in levers]
        ax.stackplot(tx, *pos, labels=levers, colors=colours, alpha=0.85)
        if any(np.any(n < 0) for n in neg):
            ax.stackplot(tx, *neg, colors=colours, alpha=0.4)
        ax.axhline(0, color="black", lw=0.5)
        ax.set_title(p, fontsize=10)
        _legend(ax, fontsize=7, loc="upper left")
        ax.set_xlabel(label)
    for ax in axes[len(pols) :]:
        ax.set_visible(False)
    axes[0].set_ylabel(f"incremental value per {data.bin_s:g} s")
    _save(fig, path)


def plot_release(data: ReportData, path: Path) -> None:
    fig = _figure(11, 3.6)
    ax1, ax2 = fig.subplots(1, 2)
    any_release = False
    for p in data.policies:
        values = np.sort(np.asarray(data.release_ms.get(p, []), dtype=float))
        if values.size == 0:
            continue
        any_release = True
        ax1.ecdf(values, color=policy_colour(p, data.policies), label=f"{p} (n={values.size})")
    ax1.axvline(
        RELEASE_GOAL_MS, color="black", ls="--", lw=1, label=f"goal p99 ≤ {RELEASE_GOAL_MS:g} ms"
    )
    ax1.set_xlabel("release time (ms): reclaim → optional work fits")
    ax1.set_ylabel("share of releases")
    ax1.set_title(
        "release-time distribution" + ("" if any_release else " (no releases in the log)")
    )
    if any_release:
        from matplotlib.ticker import ScalarFormatter

        ax1.set_xscale("symlog", linthresh=1.0)
        ax1.xaxis.set_major_formatter(ScalarFormatter())
    _legend(ax1, fontsize=7)
    tx, label = _time_axis(data)
    for p in data.policies:
        sb = data.shedding.get(p)
        if sb is None:
            continue
        total = sum((sb.total(side) for side in sb.sums), np.zeros(data.n_bins))
        ax2.plot(tx, np.cumsum(total), color=policy_colour(p, data.policies), label=p)
    ax2.set_xlabel(label)
    ax2.set_ylabel("shedding activations (cumulative)")
    ax2.set_title("local shedding: server + client activations")
    _legend(ax2, fontsize=7)
    _save(fig, path)


def plot_segments(metrics: Mapping[str, Any], data: ReportData, path: Path) -> None:
    pols = data.policies
    m = metrics["policies"]
    segments: list[str] = []
    for p in pols:
        for s in m[p].get("segments", {}):
            if s not in segments:
                segments.append(s)
    fig = _figure(11, 3.6)
    ax1, ax2, ax3 = fig.subplots(1, 3)
    x = np.arange(len(segments))
    width = 0.8 / max(1, len(pols))
    for i, p in enumerate(pols):
        segs = m[p].get("segments", {})
        share = [segs.get(s, {}).get("sbm_share", 0.0) for s in segments]
        req = np.array([segs.get(s, {}).get("requests", 0) for s in segments], dtype=float)
        inc = np.array([segs.get(s, {}).get("incremental", 0.0) for s in segments])
        per_k = np.where(req > 0, 1000.0 * inc / np.maximum(req, 1), 0.0)
        total = req.sum()
        colour = policy_colour(p, pols)
        offset = x - 0.4 + (i + 0.5) * width
        ax1.bar(offset, [100 * s for s in share], width, color=colour, label=p)
        ax2.bar(offset, per_k, width, color=colour)
        ax3.bar(offset, 100 * req / total if total else req, width, color=colour)
    for ax, title in (
        (ax1, "SBM share of requests (%)"),
        (ax2, "incremental value per 1,000 requests"),
        (ax3, "share of requests (%)"),
    ):
        ax.set_xticks(x, segments)
        ax.set_title(title, fontsize=10)
    _legend(ax1, fontsize=7)
    _save(fig, path)


def plot_allocator(
    metrics: Mapping[str, Any], data: ReportData, featured: str | None, path: Path
) -> None:
    fig = _figure(11, 6.4)
    (ax1, ax2), (ax3, ax4) = fig.subplots(2, 2)
    if featured is not None:
        for ax, resource in ((ax1, "accelerator"), (ax2, "cpu")):
            _plot_allocated(ax, data, featured, resource)
    _plot_allocator_counts(ax3, ax4, metrics, data.policies)
    _save(fig, path)


def _allocated_by_lever(data: ReportData, policy: str, resource: str) -> dict[str, np.ndarray]:
    """Per lever, the units of ``resource`` allocated to it in each bucket, summed over regions."""
    per_lever: dict[str, np.ndarray] = {}
    for region in data.regions:
        alloc = data.allocation.get((policy, region))
        if alloc is None:
            continue
        steps = alloc.total("_steps")
        for name in alloc.sums:
            if not name.endswith(f":{resource}"):
                continue
            lever = name.split(":", 1)[0]
            # a target stays in force until the next one: carry it over empty buckets
            mean = _carry_forward(alloc.total(name), steps)
            per_lever[lever] = per_lever.get(lever, np.zeros(data.n_bins)) + mean
    return per_lever


def _plot_allocated(ax: Any, data: ReportData, featured: str, resource: str) -> None:
    """The featured policy's allocation of one resource, stacked by lever, fallbacks marked."""
    tx, label = _time_axis(data)
    per_lever = _allocated_by_lever(data, featured, resource)
    if per_lever:
        levers = sorted(per_lever, key=lambda lv: (lv not in LEVERS, lv))
        ax.stackplot(
            tx,
            *[per_lever[lv] for lv in levers],
            labels=levers,
            colors=[_LEVER_COLOURS.get(lv, "#999999") for lv in levers],
            alpha=0.85,
        )
        _legend(ax, fontsize=7, loc="upper left")
    fb = data.fallbacks.get(featured)
    if fb is not None:
        any_fb = sum((fb.total(r) for r in fb.sums), np.zeros(data.n_bins))
        marks = tx[any_fb > 0]
        ax.plot(marks, np.zeros_like(marks), "|", color="red", ms=12, label="fallback")
    ax.set_title(f"{featured}: allocated {resource} by lever (all regions)", fontsize=10)
    ax.set_xlabel(label)
    ax.set_ylabel("units")


def _plot_allocator_counts(ax3: Any, ax4: Any, metrics: Mapping[str, Any], pols: list[str]) -> None:
    """Fallbacks by reason and share caps reached by lever, a bar per policy."""
    reasons: list[str] = []
    caps: list[str] = []
    for p in pols:
        for r in metrics["policies"][p].get("allocator", {}).get("fallbacks", {}):
            if r not in reasons:
                reasons.append(r)
        for c in metrics["policies"][p].get("allocator", {}).get("cap_bounds", {}):
            if c not in caps:
                caps.append(c)
    width = 0.8 / max(1, len(pols))
    for ax, names, key, title in (
        (ax3, reasons, "fallbacks", "allocator fallbacks by reason"),
        (ax4, caps, "cap_bounds", "lever share cap reached, by lever"),
    ):
        x = np.arange(len(names))
        for i, p in enumerate(pols):
            counts = metrics["policies"][p].get("allocator", {}).get(key, {})
            ax.bar(
                x - 0.4 + (i + 0.5) * width,
                [counts.get(n, 0) for n in names],
                width,
                color=policy_colour(p, pols),
                label=p,
            )
        ax.set_xticks(x, names, rotation=15)
        ax.set_title(title + ("" if names else " (none)"), fontsize=10)
        ax.set_ylabel("count")
    if reasons:
        _legend(ax3, fontsize=7)


def plot_precompute(data: ReportData, path: Path) -> None:
    """Hit rate, staleness at use, jobs and wasted jobs over time, per precompute policy."""
    fig = _figure(11, 6.4)
    (ax1, ax2), (ax3, ax4) = fig.subplots(2, 2, sharex=True)
    tx, label = _time_axis(data)
    pols = [p for p in data.policies if p in data.precompute]
    for p in pols:
        pb = data.precompute[p]
        c = policy_colour(p, data.policies)
        visits = pb.total("visits")
        with np.errstate(invalid="ignore", divide="ignore"):
            ax1.plot(tx, np.where(visits > 0, pb.total("hits") / visits, np.nan), color=c, label=p)
        ax2.plot(tx, pb.mean("staleness_p50") / 60.0, color=c, label=p)
        span = pb.total("_span")
        with np.errstate(invalid="ignore", divide="ignore"):
            ax3.plot(tx, np.where(span > 0, pb.total("jobs") / span, np.nan), color=c, label=p)
        ax4.plot(tx, np.cumsum(pb.total("wasted_partial")), color=c, ls="-", label=f"{p}: stopped")
        ax4.plot(tx, np.cumsum(pb.total("expired_unused")), color=c, ls="--", label=f"{p}: expired")
        ax4.plot(
            tx, np.cumsum(pb.total("dropped_unused")), color=c, ls=":", label=f"{p}: superseded"
        )
    ax1.set_ylabel("hit rate (hits / visits)")
    ax1.set_ylim(0, 1)
    ax1.set_title("visits served from a stored result")
    ax2.set_ylabel("minutes")
    ax2.set_title("staleness at use (median per window)")
    ax3.set_ylabel("jobs / s")
    ax3.set_title("results computed")
    ax4.set_ylabel("jobs (cumulative)")
    ax4.set_title("wasted jobs: stopped mid-way, expired or superseded unserved")
    for ax in (ax1, ax2, ax3, ax4):
        _legend(ax, fontsize=7)
    for ax in (ax3, ax4):
        ax.set_xlabel(label)
    _save(fig, path)


def _carry_forward(sums: np.ndarray, steps: np.ndarray) -> np.ndarray:
    """Per bucket: the mean of the values issued in it, else the last bucket's (0 before any)."""
    present = steps > 0
    values = np.where(present, sums / np.maximum(steps, 1), 0.0)
    last = np.maximum.accumulate(np.where(present, np.arange(present.size), -1))
    return np.where(last >= 0, values[np.maximum(last, 0)], 0.0)


def _featured(data: ReportData) -> str | None:
    if "headroom" in data.policies:
        return "headroom"
    issued = {
        p: sum(int(b.total("_steps").sum()) for (q, _), b in data.allocation.items() if q == p)
        for p in data.policies
    }
    best = max(issued.items(), key=lambda kv: kv[1], default=(None, 0))
    return best[0] if best[1] > 0 else (data.policies[0] if data.policies else None)


def render_plots(metrics: Mapping[str, Any], data: ReportData, plot_dir: Path) -> list[Plot]:
    """Draw every plot into ``plot_dir``; returns them in report order."""
    featured = _featured(data)
    first: Mapping[str, Any] = next(iter(metrics["policies"].values()), {})
    p99_limit = first.get("slo", {}).get("p99_ms")
    specs: list[tuple[str, str, str, Any]] = [
        (
            "summary",
            "Summary: value captured and SLO kept",
            "Left: ground-truth incremental value of each policy (value delivered minus what the "
            "baseline would have delivered for the same requests), stacked by lever; the black "
            "bar is the oracle bound (perfect foresight, no control lag) — no policy should pass "
            "it. Right: share of SLO windows whose p99, over every request of the window from "
            "the merged sketches of all sources, exceeded the limit.",
            lambda p: plot_summary(metrics, data, p),
        ),
        (
            "p99_over_time",
            "Tail latency over time",
            f"Each line is the worst window p99 in each {data.bin_s:g} s bucket of scenario time, "
            f"per region and policy (log scale); the dashed line is the SLO ({p99_limit} ms). A "
            "window's p99 comes from the merged sketches of every source that saw it, never from "
            "averaged percentiles. Spikes that cross the line are SLO violations.",
            lambda p: plot_p99(metrics, data, p),
        ),
        (
            "latency_cdf",
            "Latency distribution with and without optional work",
            "Quantile curves over the whole run from the merged window sketches: solid = every "
            "request, dashed = requests that ran with no optional work (holdout and "
            "baseline-only). The vertical axis is stretched towards the tail (90%, 99%, 99.9%); "
            "the dotted line is the SLO. The gap between the curves is what optional work cost "
            "in latency.",
            lambda p: plot_cdf(metrics, data, p),
        ),
        (
            "targets_vs_capacity",
            "Targets against capacity",
            f"Top row: opportunistic capacity available per resource (solid) and the part "
            f"optional work used (dashed), for the {featured} policy, with reclaims as thin "
            "vertical lines. Below: each policy's RMA candidate target and SBM coverage target "
            "in force, averaged per bucket. Targets should follow capacity down at once and up "
            "with care.",
            lambda p: plot_targets(data, featured, p),
        ),
        (
            "value_over_time",
            "Incremental value by lever over time",
            f"Ground-truth incremental value per {data.bin_s:g} s bucket, stacked by lever (RMA, "
            "SBM, precompute), one panel per policy on a shared scale. Negative value (optional "
            "work that made ranking worse) is drawn below zero.",
            lambda p: plot_value(data, p),
        ),
        (
            "release_times",
            "Giving capacity back",
            "Left: distribution of release times — from a reclaim taking effect to optional work "
            f"fitting inside the remaining capacity — per policy; the goal is p99 ≤ "
            f"{RELEASE_GOAL_MS:g} ms. Right: cumulative server- and client-side shedding "
            "activations (the millisecond-scale defences firing).",
            lambda p: plot_release(data, p),
        ),
        (
            "segment_exposure",
            "Per-segment exposure",
            "Per request segment: the share of requests served by the stronger model, the "
            "ground-truth incremental value per 1,000 requests, and the segment's share of "
            "traffic. Value-aware shedding must not silently starve a segment: a segment whose "
            "SBM share drops to zero under one policy but not others is being starved.",
            lambda p: plot_segments(metrics, data, p),
        ),
        (
            "allocator",
            "Allocator decisions",
            f"Top: how the {featured} policy's allocator split opportunistic accelerator and CPU "
            "capacity between levers over time (mean of the targets issued in each bucket, "
            "summed over regions); red ticks mark buckets where it fell back to the safe "
            "baseline. Bottom: fallbacks by reason and lever-share cap hits, per policy.",
            lambda p: plot_allocator(metrics, data, featured, p),
        ),
    ]
    if any(pb.sums.get("visits") for pb in data.precompute.values()):
        specs.append(
            (
                "precompute",
                "Precompute: hits, staleness and waste",
                "For each policy that ran precompute jobs: the share of visits served from a "
                "stored result; the median age of the results served (a stored ranking loses "
                "value as the world drifts: docs/precompute.md); results computed per second; "
                "and wasted jobs, cumulative — stopped mid-way by a reclaim (nothing delivered), "
                "expired before any visit, or superseded by a newer result before any visit. "
                "Precompute's value over time is in the value-by-lever plot above.",
                lambda p: plot_precompute(data, p),
            )
        )
    plots: list[Plot] = []
    for name, title, caption, draw in specs:
        path = plot_dir / f"{name}.png"
        try:
            draw(path)
        except Exception as exc:  # say which plot failed, whatever the cause
            raise HeadroomError(
                f"report: drawing {name} failed: {type(exc).__name__}: {exc}"
            ) from exc
        plots.append(Plot(name, title, path, caption))
    return plots


# ---------------------------------------------------------------------------------------------
# HTML
# ---------------------------------------------------------------------------------------------

_CSS = """
body{font:14px/1.45 -apple-system,Segoe UI,Helvetica,Arial,sans-serif;margin:2em auto;
max-width:1200px;color:#222;padding:0 1em}
h1{font-size:1.6em;margin-bottom:.2em}
h2{font-size:1.2em;margin-top:2em;border-bottom:1px solid #ddd}
table{border-collapse:collapse;font-size:13px;margin:.6em 0}
th,td{border:1px solid #ddd;padding:3px 8px;text-align:right}th{background:#f4f4f4}
td:first-child,th:first-child{text-align:left}
img{max-width:100%;border:1px solid #eee}.caption{color:#444;max-width:60em}
.muted{color:#777}pre{background:#f7f7f7;padding:.5em;overflow-x:auto;font-size:12px}
.bad{color:#b00}
"""


def _e(x: Any) -> str:
    return html.escape(str(x))


def _table(header: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    head = "".join(f"<th>{_e(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{_e(c)}</td>" for c in r) + "</tr>" for r in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _summary_rows(metrics: Mapping[str, Any]) -> list[list[str]]:
    rows = []
    for name, m in metrics["policies"].items():
        v = m["value"]
        ci = v.get("estimated_ci95", [0.0, 0.0])
        rows.append(
            [
                name,
                f"{100 * m['slo']['violation_fraction']:.2f}%",
                f"{m['slo']['worst_window_p99_ms']:.1f}",
                f"{m['requests']['total']:,}",
                f"{m['requests']['errors']:,}",
                f"{m['requests']['timeouts']:,}",
                fmt_value(v["incremental"]),
                fmt_value(v["incremental_rma"]),
                fmt_value(v["incremental_sbm"]),
                fmt_value(v["incremental_precompute"]),
                fmt_value(v["oracle_incremental"]),
                f"{v['capture_ratio']:.3f}",
                f"{fmt_value(v['estimated_incremental'])} [{fmt_value(ci[0])}, {fmt_value(ci[1])}]",
                f"{m['reclaims']['count']}",
                f"{m['reclaims']['release_ms_p50']:.2f} / {m['reclaims']['release_ms_p99']:.2f} / "
                f"{m['reclaims']['release_ms_max']:.2f}",
                f"{m['shedding']['server_activations']} / {m['shedding']['client_activations']}",
            ]
        )
    return rows


_SUMMARY_HEADER = [
    "policy",
    "SLO violations",
    "worst p99 (ms)",
    "requests",
    "errors",
    "timeouts",
    "incremental",
    "RMA",
    "SBM",
    "precompute",
    "oracle",
    "capture",
    "holdout estimate [95% CI]",
    "reclaims",
    "release ms p50 / p99 / max",
    "shedding server / client",
]


def render_html(
    metrics: Mapping[str, Any], plots: Sequence[Plot], data: ReportData, events_path: Path
) -> str:
    first: Mapping[str, Any] = next(iter(metrics["policies"].values()), {})
    slo = first.get("slo", {})
    parts = [
        "<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>",
        f"<title>headroom report — {_e(metrics.get('scenario'))}</title>",
        f"<style>{_CSS}</style></head><body>",
        f"<h1>headroom report — {_e(metrics.get('scenario'))}</h1>",
        f"<p class='muted'>seed {_e(metrics.get('seed'))} · {len(metrics['policies'])} "
        f"policies · {data.duration_s:g} s of scenario time · SLO p99 ≤ {_e(slo.get('p99_ms'))} "
        f"ms per {_e(slo.get('window_s'))} s window · log {_e(events_path.name)} "
        f"({_e(data.stats.summary())})</p>",
        "<h2>Side by side</h2>",
        _table(_SUMMARY_HEADER, _summary_rows(metrics)),
        "<p class='caption'>Incremental value is ground truth (value delivered above what the "
        "baseline would have delivered for the same requests); capture = incremental / oracle "
        "bound; the holdout estimate is what the A/B control arm alone says, with its 95% "
        "interval, so the estimator can be checked against the truth. Definitions: "
        "docs/analysis.md.</p>",
    ]
    pre_rows = [
        [
            name,
            m["precompute"]["jobs"],
            m["precompute"]["used"],
            m["precompute"]["expired_unused"],
            f"{100 * m['precompute']['hit_rate']:.2f}%",
            f"{m['precompute']['staleness_s_p50']:.1f}",
        ]
        for name, m in metrics["policies"].items()
        if "precompute" in m
    ]
    if pre_rows:
        parts.append("<h3>Precompute</h3>")
        parts.append(
            _table(
                ["policy", "jobs", "used", "expired unused", "hit rate", "staleness p50 (s)"],
                pre_rows,
            )
        )
    for plot in plots:
        encoded = base64.b64encode(plot.path.read_bytes()).decode("ascii")
        parts.append(f"<h2 id='{_e(plot.name)}'>{_e(plot.title)}</h2>")
        parts.append(f"<img alt='{_e(plot.title)}' src='data:image/png;base64,{encoded}'>")
        parts.append(f"<p class='caption'>{_e(plot.caption)}</p>")
    parts.append("<h2>Per region</h2>")
    region_rows = []
    for name, m in metrics["policies"].items():
        for region, r in m["slo"].get("by_region", {}).items():
            region_rows.append(
                [
                    name,
                    region,
                    r["windows"],
                    f"{100 * r['violation_fraction']:.2f}%",
                    f"{r['worst_window_p99_ms']:.1f}",
                    r.get("late_window_lines", 0),
                    r.get("bad_sketches", 0),
                ]
            )
    parts.append(
        _table(
            [
                "policy",
                "region",
                "windows",
                "violations",
                "worst p99 (ms)",
                "late lines",
                "bad sketches",
            ],
            region_rows,
        )
    )
    parts.append(_checks(metrics))
    parts.append(_diagnostics(data))
    parts.append("</body></html>")
    return "\n".join(parts)


def consistency_checks(metrics: Mapping[str, Any]) -> list[str]:
    """What a reader should know before trusting the figures: one sentence per finding."""
    found: list[str] = []
    for name, m in metrics["policies"].items():
        v = m["value"]
        levers = v["incremental_rma"] + v["incremental_sbm"] + v["incremental_precompute"]
        tolerance = 1e-6 * max(1.0, abs(v["incremental"]))
        if abs(v["incremental"] - levers) > tolerance:
            found.append(
                f"{name}: incremental value {v['incremental']:.6g} differs from the sum over "
                f"levers {levers:.6g} (value_total − value_baseline vs inc in the window lines)"
            )
        if v["oracle_incremental"] and v["incremental"] > v["oracle_incremental"] + tolerance:
            found.append(
                f"{name}: incremental value {v['incremental']:.6g} exceeds the oracle bound "
                f"{v['oracle_incremental']:.6g}: the bound is not an upper bound"
            )
        low, high = v["estimated_ci95"]
        if v["estimated_incremental"] and not low <= v["incremental"] <= high:
            found.append(
                f"{name}: the holdout estimate's 95% interval [{low:.6g}, {high:.6g}] does not "
                f"cover the true incremental value {v['incremental']:.6g}"
            )
        if v.get("estimate_unusable_segments"):
            segs = ", ".join(v["estimate_unusable_segments"])
            found.append(f"{name}: segments left out of the estimate (no control arm): {segs}")
        slo = m["slo"]
        if slo.get("late_window_lines") or slo.get("bad_sketches"):
            found.append(
                f"{name}: {slo.get('late_window_lines', 0)} late window line(s) and "
                f"{slo.get('bad_sketches', 0)} malformed sketch(es) left out of window p99s"
            )
    return found


def _checks(metrics: Mapping[str, Any]) -> str:
    found = consistency_checks(metrics)
    if not found:
        return (
            "<h2>Checks</h2><p>Incremental value equals the sum over levers, no policy passes the "
            "oracle bound, every holdout interval covers the truth, no window line was late or "
            "malformed.</p>"
        )
    items = "".join(f"<li>{_e(f)}</li>" for f in found)
    return f"<h2>Checks</h2><ul class='bad'>{items}</ul>"


def _diagnostics(data: ReportData) -> str:
    stats = data.stats
    out = ["<h2>The log</h2>", f"<p>{_e(stats.summary())}.</p>"]
    if stats.kinds:
        out.append(_table(["kind", "lines"], sorted(stats.kinds.items())))
    if stats.problems:
        out.append("<p class='bad'>Corrupt lines (skipped):</p>")
        out.append(_table(["line", "problem"], stats.problems))
    if data.raw_unknown:
        out.append(
            "<p>Lines of kinds this analyzer does not know (kept here, otherwise ignored; up to "
            f"{RAW_SAMPLES_PER_KIND} per kind):</p>"
        )
        for kind, lines in data.raw_unknown.items():
            body = "\n".join(line.decode("utf-8", "replace") for line in lines)
            out.append(f"<p><code>{_e(kind)}</code></p><pre>{_e(body)}</pre>")
    return "\n".join(out)


def write_report(metrics: Mapping[str, Any], events_path: Path, out_dir: Path) -> Path:
    """Plots into ``out_dir/plots/``, a self-contained ``out_dir/report.html``; returns its path.

    Reads ``events_path`` once (the time series); ``metrics`` is the document
    ``compute_metrics`` made of the same log.
    """
    events_path = Path(events_path)
    log = EventLog(events_path)
    data = collect(log, metrics)
    data.stats = log.stats  # filled while iterating
    return render_report(metrics, data, events_path, Path(out_dir))


def render_report(
    metrics: Mapping[str, Any], data: ReportData, events_path: Path, out_dir: Path
) -> Path:
    """Draw the plots and write ``report.html`` from already collected data."""
    plots = render_plots(metrics, data, out_dir / "plots")
    page = render_html(metrics, plots, data, events_path)
    path = out_dir / "report.html"
    try:
        path.write_text(page, encoding="utf-8")
    except OSError as exc:
        raise HeadroomError(f"cannot write {path}: {exc.strerror}") from exc
    return path
