"""The report's plots, drawn from a :class:`~headroom.analysis.report_data.ReportData` with
matplotlib's Agg renderer (no display, no pyplot global state) into PNG files.

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

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from headroom.analysis.report_data import ReportData
from headroom.kernel.errors import HeadroomError
from headroom.kernel.vocab import LEVERS

RELEASE_GOAL_MS = 10.0  # the simulator's goal for release_ms_p99 (docs/simulator.md)
RELEASE_FLOOR_MS = 0.1  # release times below this are drawn at it (the axis is logarithmic)
# q grid for the CDFs: dense in the tail, where the SLO lives.
CDF_QS = np.concatenate([np.linspace(0.0, 0.9, 46), 1 - np.logspace(-1, -4, 60)])
VALUE_PERCENTILES = (1.0, 99.0)  # the value-over-time scale: these percentiles of the buckets


@dataclass(frozen=True)
class Style:
    """How one policy is drawn in every plot: colour, line style, marker, bar hatch, width."""

    colour: str
    ls: Any
    marker: str
    hatch: str
    lw: float = 1.3

    def line(self) -> dict[str, Any]:
        return {"color": self.colour, "ls": self.ls, "lw": self.lw}

    def bar(self) -> dict[str, Any]:
        return {"color": self.colour, "hatch": self.hatch, "edgecolor": "white", "linewidth": 0}


# One fixed style per policy, used by every plot (colour-blind-safe hues; the line style and the
# bar hatch tell policies apart in grey too).
_POLICY_STYLES = {
    "static": Style("#7f7f7f", ":", "o", "||"),
    "greedy": Style("#d55e00", (0, (6, 2)), "s", "//"),
    "central-only": Style("#e69f00", "-.", "^", "\\\\"),
    "aimd": Style("#cc79a7", (0, (2, 1)), "v", ".."),
    "gradient": Style("#6a3d9a", (0, (6, 1, 1, 1, 1, 1)), "D", "xx"),
    "envoy": Style("#56b4e9", (0, (3, 2)), "P", "--"),
    "sre-throttle": Style("#8c6d31", (0, (8, 2, 2, 2)), "X", "++"),
    "headroom": Style("#0072b2", "-", "*", "", lw=2.0),
    "oracle": Style("#009e73", (0, (10, 3)), "h", "oo"),
}
_EXTRA_STYLES = [
    Style("#17becf", (0, (1, 1)), "p", "|"),
    Style("#bcbd22", (0, (4, 1, 1, 1)), "<", "-"),
    Style("#e377c2", (0, (12, 2)), ">", "**"),
    Style("#393b79", (0, (1, 2)), "d", "O"),
]
_LEVER_COLOURS = {"rma": "#0072b2", "sbm": "#e69f00", "precompute": "#009e73", "lost": "#999999"}
_LEGEND = {"fontsize": 8, "frameon": False}


def policy_style(policy: str, order: Sequence[str]) -> Style:
    """The policy's fixed style (a policy without one gets the next of a spare list, by its
    position among such policies in ``order``)."""
    if policy in _POLICY_STYLES:
        return _POLICY_STYLES[policy]
    extras = [p for p in order if p not in _POLICY_STYLES]
    i = extras.index(policy) if policy in extras else 0
    return _EXTRA_STYLES[i % len(_EXTRA_STYLES)]


def policy_colour(policy: str, order: Sequence[str]) -> str:
    return policy_style(policy, order).colour


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
    """PNG, cropped to what was drawn plus a margin, so no title or label is cut off."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(
        path, format="png", metadata={"Software": None}, bbox_inches="tight", pad_inches=0.1
    )


def _plain_ticks(axis: Any) -> None:
    """Log axes labelled 50, 100, 200 rather than 5×10¹, 10², 2×10²."""
    from matplotlib.ticker import LogLocator, NullFormatter, ScalarFormatter

    formatter = ScalarFormatter()
    formatter.set_scientific(False)
    axis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
    axis.set_major_formatter(formatter)
    axis.set_minor_formatter(NullFormatter())


def _decade_ticks(axis: Any) -> None:
    """A log axis over many decades: ticks at 0.1, 1, 10, 100, 1k … labelled plainly."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    axis.set_major_locator(LogLocator(base=10.0))
    axis.set_major_formatter(
        FuncFormatter(lambda x, _pos: f"{x / 1000:g}k" if x >= 1000 else f"{x:g}")
    )
    axis.set_minor_formatter(NullFormatter())


def _integer_ticks(axis: Any) -> None:
    """Counts: ticks on whole numbers only."""
    from matplotlib.ticker import MaxNLocator

    axis.set_major_locator(MaxNLocator(integer=True))


def _thousands(axis: Any) -> None:
    """Large values as 20k, -60k rather than 20000 or an offset."""
    from matplotlib.ticker import FuncFormatter

    def fmt(x: float, _pos: int) -> str:
        if abs(x) >= 1e6:
            return f"{x / 1e6:g}M"
        if abs(x) >= 1e3:
            return f"{x / 1e3:g}k"
        return f"{x:g}"

    axis.set_major_formatter(FuncFormatter(fmt))


def _legend(ax: Any, **kwargs: Any) -> None:
    """A legend beside the axes (right, outside the data) when it has labelled artists."""
    if ax.get_legend_handles_labels()[0]:
        options = {**_LEGEND, "loc": "upper left", "bbox_to_anchor": (1.01, 1.0)}
        ax.legend(**{**options, **kwargs})


def _fig_legend(fig: Any, handles: list[Any], labels: list[str], **kwargs: Any) -> None:
    """One legend for the whole figure, outside every axes (right of them)."""
    if handles:
        fig.legend(handles, labels, **{**_LEGEND, "loc": "outside right upper", **kwargs})


def _grid(n: int, max_cols: int = 4) -> tuple[int, int]:
    cols = min(max_cols, max(1, n))
    return math.ceil(n / cols), cols


def _bottom_labels(flat: Any, n: int, cols: int, label: str) -> None:
    """In a grid of ``n`` panels sharing x: the x label and tick labels on the lowest panel of
    each column only."""
    for i in range(n):
        if i + cols >= n:
            flat[i].set_xlabel(label)
            flat[i].xaxis.set_tick_params(labelbottom=True)


def _policy_ticks(ax: Any, x: np.ndarray, pols: Sequence[str], rotation: float = 30) -> None:
    ax.set_xticks(x, pols, rotation=rotation, ha="right", rotation_mode="anchor")


def plot_summary(metrics: Mapping[str, Any], data: ReportData, path: Path) -> None:
    """Value by lever (positive parts stacked up, negative parts down, lost value its own
    segment), the net incremental value and the oracle bound per policy; SLO violations."""
    pols = data.policies
    m = metrics["policies"]
    fig = _figure(12, 4.2)
    ax1, ax2 = fig.subplots(1, 2, width_ratios=[2.2, 1])
    x = np.arange(len(pols))

    def field(p: str, name: str) -> float:
        v = (m.get(p) or {}).get("value") or {}
        x = v.get(name)
        return float(x) if isinstance(x, int | float) and not isinstance(x, bool) else 0.0

    up = np.zeros(len(pols))
    down = np.zeros(len(pols))
    for lever in (*LEVERS, "lost"):
        v = np.array([field(p, f"incremental_{lever}") for p in pols])
        if not np.any(v):
            continue
        pos, neg = np.clip(v, 0, None), np.clip(v, None, 0)
        kw: dict[str, Any] = {"color": _LEVER_COLOURS[lever], "width": 0.7}
        if lever == "lost":
            kw["hatch"] = "//"
            kw["edgecolor"] = "#555555"
            label = "lost (failed or timed out)"
        else:
            label = lever
        # only the non-zero parts: an empty bar would still pin the axis (its sticky edge)
        shown = pos > 0
        if np.any(shown):
            ax1.bar(x[shown], pos[shown], bottom=up[shown], label=label, **kw)
            label = "_" + label
        shown = neg < 0
        if np.any(shown):
            ax1.bar(x[shown], neg[shown], bottom=down[shown], label=label, **kw)
        up += pos
        down += neg
    net = np.array([field(p, "incremental") for p in pols])
    ax1.scatter(x, net, marker="D", s=36, color="black", label="net incremental", zorder=4)
    oracle = np.array([field(p, "oracle_incremental") for p in pols])
    ax1.hlines(oracle, x - 0.4, x + 0.4, colors="#009e73", lw=2.5, label="oracle bound", zorder=3)
    ax1.axhline(0, color="black", lw=0.6)
    _policy_ticks(ax1, x, pols)
    ax1.set_ylabel("incremental value (value units)")
    _thousands(ax1.yaxis)
    ax1.set_title("incremental value by lever against the oracle bound")
    _legend(ax1)
    viol = [
        100.0 * float((m.get(p) or {}).get("slo", {}).get("violation_fraction", 0.0)) for p in pols
    ]
    for i, p in enumerate(pols):
        ax2.bar([i], [viol[i]], width=0.7, **policy_style(p, pols).bar())
        if viol[i] == 0:
            ax2.annotate("0", (i, 0), ha="center", va="bottom", fontsize=7, color="#555555")
    _policy_ticks(ax2, x, pols, rotation=45)
    ax2.set_ylabel("SLO windows over the p99 limit (%)")
    ax2.set_ylim(0, max(5.0, max(viol, default=0.0) * 1.1))
    ax2.set_title("SLO violations")
    _save(fig, path)


def plot_p99(metrics: Mapping[str, Any], data: ReportData, path: Path) -> None:
    regions = data.regions or ["?"]
    fig = _figure(12, 2.8 * len(regions) + 0.8)
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
            ax.plot(tx, worst, label=p, **policy_style(p, data.policies).line())
            slo = (
                metrics["policies"][p]["slo"].get("p99_ms", slo)
                if p in metrics["policies"]
                else slo
            )
        if slo is not None:
            ax.axhline(slo, color="black", ls="--", lw=1, label=f"SLO p99 ({slo:g} ms)")
        ax.set_ylabel("window p99 (ms)")
        ax.set_title(f"region {region}: worst window p99 per {data.bin_s:g} s bucket", fontsize=10)
        ax.set_yscale("log")
        _plain_ticks(ax.yaxis)
    handles, labels = axes[0].get_legend_handles_labels()
    _fig_legend(fig, handles, labels)
    axes[-1].set_xlabel(label)
    _save(fig, path)


def plot_cdf(metrics: Mapping[str, Any], data: ReportData, path: Path) -> None:
    from matplotlib.lines import Line2D

    pols = [p for p in data.policies if (p, "all") in data.sketches]
    rows, cols = _grid(len(pols) or 1)
    fig = _figure(3.2 * cols + 1.6, 2.8 * rows + 0.4)
    axes = np.atleast_2d(fig.subplots(rows, cols, sharex=True, sharey=True, squeeze=False))
    flat = axes.ravel()
    y = -np.log10(1.0 - np.minimum(CDF_QS, 1 - 1e-4))
    ticks = [0.0, 1.0, 2.0, 3.0, 4.0]
    slo = None
    for ax, p in zip(flat, pols, strict=False):
        slo = metrics["policies"].get(p, {}).get("slo", {}).get("p99_ms", slo)
        style = policy_style(p, data.policies)
        counts = []
        for which, ls in (("all", "-"), ("base", "--")):
            acc = data.sketches.get((p, which))
            sk = acc.sketch() if acc is not None else None
            if sk is None or sk.count == 0:
                counts.append("0")
                continue
            xs = np.array(sk.quantiles(list(CDF_QS)), dtype=float)
            ax.plot(xs, y, ls, color=style.colour, lw=1.5)
            counts.append(f"{sk.count:,}")
        if slo:
            ax.axvline(slo, color="black", lw=0.8, ls=":")
        ax.set_title(f"{p}\nn = {counts[0]} all, {counts[1]} without", fontsize=9)
        ax.set_xscale("log")
        _plain_ticks(ax.xaxis)
        ax.set_yticks(ticks, ["0", "90%", "99%", "99.9%", "99.99%"])
    for ax in flat[len(pols) :]:
        ax.set_visible(False)
    _bottom_labels(flat, len(pols), cols, "latency (ms)")
    for ax in axes[:, 0]:
        ax.set_ylabel("quantile")
    handles = [
        Line2D([], [], color="black", ls="-", label="all requests"),
        Line2D([], [], color="black", ls="--", label="requests with no optional work"),
        Line2D([], [], color="black", ls=":", label=f"SLO p99 ({slo:g} ms)" if slo else "SLO"),
    ]
    _fig_legend(fig, handles, [str(h.get_label()) for h in handles])
    _save(fig, path)


def plot_targets(data: ReportData, featured: str | None, path: Path) -> None:
    regions = data.regions or ["?"]
    fig = _figure(4.6 * len(regions) + 2.4, 8.4)
    axes = fig.subplots(3, len(regions), sharex=True, squeeze=False)
    tx, label = _time_axis(data)
    scale = _time_scale(data)
    for j, region in enumerate(regions):
        ax_cap, ax_rma, ax_sbm = axes[:, j]
        if featured is not None and (featured, region) in data.window:
            w = data.window[(featured, region)]
            for r, colour, unit in (
                ("cpu", "#0072b2", "cores"),
                ("accelerator", "#d55e00", "devices"),
            ):
                ax_cap.plot(
                    tx,
                    w.mean(f"capacity_{r}"),
                    color=colour,
                    lw=1.4,
                    label=f"{r} available ({unit})",
                )
                ax_cap.plot(
                    tx,
                    w.mean(f"used_{r}"),
                    color=colour,
                    lw=1.0,
                    ls="--",
                    label=f"{r} used by optional work",
                )
            for k, t in enumerate(data.reclaims.get((featured, region), [])):
                ax_cap.axvline(
                    t / scale,
                    color="black",
                    lw=0.5,
                    alpha=0.35,
                    label="reclaim" if k == 0 else None,
                )
        ax_cap.set_title(f"{region}: opportunistic capacity ({featured})", fontsize=10)
        ax_cap.set_ylabel("cores / devices")
        for p in data.policies:
            pw = data.window.get((p, region))
            if pw is None:
                continue
            style = policy_style(p, data.policies).line()
            ax_rma.plot(tx, pw.mean("rma_candidates"), label=p, **style)
            ax_sbm.plot(tx, 100.0 * pw.mean("sbm_coverage"), label=p, **style)
        ax_rma.set_title(f"{region}: RMA target", fontsize=10)
        ax_rma.set_ylabel("candidates ranked per request")
        ax_sbm.set_title(f"{region}: SBM target", fontsize=10)
        ax_sbm.set_ylabel("coverage (% of requests)")
        ax_sbm.set_xlabel(label)
    _legend(axes[0, -1])
    _legend(axes[1, -1])
    _save(fig, path)


def _robust_limits(panels: Sequence[tuple[np.ndarray, np.ndarray]]) -> tuple[float, float]:
    """y-limits for the value-over-time panels from percentiles of every bucket's stacked
    positive and negative totals (so one extreme bucket does not squash the rest), always
    including 0, with a margin."""
    tops = np.concatenate([top for top, _ in panels]) if panels else np.zeros(1)
    bottoms = np.concatenate([bottom for _, bottom in panels]) if panels else np.zeros(1)
    hi = float(np.nanpercentile(tops, VALUE_PERCENTILES[1])) if tops.size else 0.0
    lo = float(np.nanpercentile(bottoms, VALUE_PERCENTILES[0])) if bottoms.size else 0.0
    hi, lo = max(hi, 0.0), min(lo, 0.0)
    span = hi - lo
    if span <= 0:
        return -1.0, 1.0
    return lo - 0.12 * span, hi + 0.12 * span


def plot_value(data: ReportData, path: Path) -> None:
    from matplotlib.patches import Patch

    pols = [p for p in data.policies if p in data.value]
    rows, cols = _grid(len(pols) or 1)
    fig = _figure(3.2 * cols + 1.6, 2.6 * rows + 0.6)
    axes = np.atleast_2d(fig.subplots(rows, cols, sharex=True, sharey=True, squeeze=False))
    flat = axes.ravel()
    tx, label = _time_axis(data)
    stacks = []
    seen: dict[str, str] = {}
    for p in pols:
        vb = data.value[p]
        levers = [lv for lv in LEVERS if lv in vb.sums] + [lv for lv in vb.sums if lv not in LEVERS]
        ys = [vb.total(lv) for lv in levers]
        pos = [np.clip(y, 0, None) for y in ys]
        neg = [np.clip(y, None, 0) for y in ys]
        top = np.sum(pos, axis=0) if pos else np.zeros(data.n_bins)
        bottom = np.sum(neg, axis=0) if neg else np.zeros(data.n_bins)
        stacks.append((levers, pos, neg, top, bottom))
    low, high = _robust_limits([(top, bottom) for *_, top, bottom in stacks])
    for ax, p, (levers, pos, neg, top, bottom) in zip(flat, pols, stacks, strict=False):
        colours = [_LEVER_COLOURS.get(lv, "#999999") for lv in levers]
        for lv, c in zip(levers, colours, strict=True):
            seen.setdefault(lv, c)
        ax.stackplot(tx, *pos, colors=colours, alpha=0.85)
        if any(np.any(n < 0) for n in neg):
            ax.stackplot(tx, *neg, colors=colours, alpha=0.45)
        ax.axhline(0, color="black", lw=0.5)
        clipped_hi, clipped_lo = top > high, bottom < low
        if np.any(clipped_hi):
            ax.plot(tx[clipped_hi], np.full(int(clipped_hi.sum()), high), "^", color="black", ms=4)
        if np.any(clipped_lo):
            ax.plot(tx[clipped_lo], np.full(int(clipped_lo.sum()), low), "v", color="black", ms=4)
        n_clipped = int(clipped_hi.sum() + clipped_lo.sum())
        note = f" ({n_clipped} off scale)" if n_clipped else ""
        ax.set_title(p + note, fontsize=10)
        ax.set_ylim(low, high)
        _thousands(ax.yaxis)
    for ax in flat[len(pols) :]:
        ax.set_visible(False)
    _bottom_labels(flat, len(pols), cols, label)
    for ax in axes[:, 0]:
        ax.set_ylabel(f"value units per {data.bin_s:g} s")
    handles: list[Any] = [Patch(color=c, label=lv) for lv, c in seen.items()]
    from matplotlib.lines import Line2D

    handles.append(
        Line2D([], [], marker="^", ls="", color="black", ms=4, label="bucket beyond the scale")
    )
    _fig_legend(fig, handles, [str(h.get_label()) for h in handles])
    _save(fig, path)


def plot_release(data: ReportData, path: Path) -> None:
    """Every release time as a point per policy (a strip, with its n, p50 and p99), and the
    shedding activations over time."""
    fig = _figure(12, max(3.6, 0.45 * len(data.policies) + 1.6))
    ax1, ax2 = fig.subplots(1, 2)
    rng = np.random.default_rng(0)  # the jitter only: the plot is the same on every run
    labels = []
    any_release = False
    for i, p in enumerate(data.policies):
        values = np.sort(np.asarray(data.release_ms.get(p, []), dtype=float))
        values = values[np.isfinite(values)]
        style = policy_style(p, data.policies)
        if values.size == 0:
            labels.append(f"{p} (no releases)")
            continue
        any_release = True
        labels.append(f"{p} (n={values.size:,})")
        shown = np.maximum(values, RELEASE_FLOOR_MS)
        jitter = rng.uniform(-0.18, 0.18, size=values.size) if values.size > 1 else np.zeros(1)
        ax1.scatter(
            shown, i + jitter, s=18, color=style.colour, marker=style.marker, alpha=0.8, zorder=3
        )
        for q, mark in ((0.5, "|"), (0.99, "d")):
            k = max(0, math.ceil(q * values.size) - 1)  # nearest rank, as the metrics do
            ax1.plot(
                [max(values[k], RELEASE_FLOOR_MS)],
                [i],
                mark,
                color="black",
                mfc="none",
                ms=12,
                mew=1.2,
            )
    ax1.axvline(RELEASE_GOAL_MS, color="black", ls="--", lw=1)
    ax1.set_yticks(np.arange(len(data.policies)), labels)
    ax1.set_ylim(len(data.policies) - 0.5, -0.5)
    ax1.set_xscale("log")
    _decade_ticks(ax1.xaxis)
    ax1.set_xlabel(
        f"release time (ms, log scale): reclaim → optional work fits; < {RELEASE_FLOOR_MS:g} ms "
        "drawn at it"
    )
    ax1.set_title(
        "release times, one point per release"
        + ("" if any_release else " (no releases in the log)"),
        fontsize=10,
    )
    if not any_release:
        ax1.set_xlim(RELEASE_FLOOR_MS, 10 * RELEASE_GOAL_MS)
    from matplotlib.lines import Line2D

    handles = [
        Line2D([], [], marker="|", ls="", color="black", ms=10, mew=1.5, label="p50"),
        Line2D([], [], marker="d", ls="", color="black", mfc="none", ms=8, label="p99"),
        Line2D([], [], color="black", ls="--", lw=1, label=f"goal p99 ≤ {RELEASE_GOAL_MS:g} ms"),
    ]
    ax1.legend(handles=handles, **{**_LEGEND, "loc": "upper left", "bbox_to_anchor": (1.01, 1)})
    tx, label = _time_axis(data)
    for p in data.policies:
        sb = data.shedding.get(p)
        if sb is None:
            continue
        total = sum((sb.total(side) for side in sb.sums), np.zeros(data.n_bins))
        ax2.plot(tx, np.cumsum(total), label=p, **policy_style(p, data.policies).line())
    ax2.set_xlabel(label)
    ax2.set_ylabel("activations (cumulative count)")
    ax2.set_ylim(bottom=0)
    _integer_ticks(ax2.yaxis)
    ax2.set_title(
        "local shedding: server + client activations"
        + ("" if data.shedding else " (none in the log)"),
        fontsize=10,
    )
    _legend(ax2)
    _save(fig, path)


def plot_segments(metrics: Mapping[str, Any], data: ReportData, path: Path) -> None:
    pols = data.policies
    m = metrics["policies"]
    segments: list[str] = []
    for p in pols:
        for s in m[p].get("segments", {}):
            if s not in segments:
                segments.append(s)
    fig = _figure(12, 3.8)
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
        bar = policy_style(p, pols).bar()
        offset = x - 0.4 + (i + 0.5) * width
        ax1.bar(offset, [100 * s for s in share], width, label=p, **bar)
        ax2.bar(offset, per_k, width, **bar)
        ax3.bar(offset, 100 * req / total if total else req, width, **bar)
    for ax, title, ylabel in (
        (ax1, "SBM share of requests", "% of the segment's requests"),
        (ax2, "incremental value per 1,000 requests", "value units per 1,000 requests"),
        (ax3, "share of traffic", "% of all requests"),
    ):
        ax.set_xticks(x, segments)
        ax.set_title(title, fontsize=10)
        ax.set_ylabel(ylabel)
        ax.set_xlabel("segment")
    ax2.axhline(0, color="black", lw=0.5)
    handles, labels = ax1.get_legend_handles_labels()
    _fig_legend(fig, handles, labels)
    _save(fig, path)


def plot_allocator(
    metrics: Mapping[str, Any], data: ReportData, featured: str | None, path: Path
) -> None:
    fig = _figure(12, 6.8)
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
    fb = data.fallbacks.get(featured)
    if fb is not None:
        any_fb = sum((fb.total(r) for r in fb.sums), np.zeros(data.n_bins))
        marks = tx[any_fb > 0]
        ax.plot(marks, np.zeros_like(marks), "|", color="red", ms=12, label="fallback")
    ax.set_title(f"{featured}: {resource} allocated by lever (all regions)", fontsize=10)
    ax.set_xlabel(label)
    ax.set_ylabel("devices" if resource == "accelerator" else "cores")
    _legend(ax)


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
                label=p,
                **policy_style(p, pols).bar(),
            )
        ax.set_xticks(x, names, rotation=15)
        ax.set_title(title + ("" if names else " (none)"), fontsize=10)
        ax.set_ylabel("count (control steps)")
        ax.set_ylim(bottom=0)
        _integer_ticks(ax.yaxis)
    if reasons or caps:
        _legend(ax4 if caps else ax3)


def plot_precompute(data: ReportData, path: Path) -> None:
    """Hit rate, staleness at use, jobs and wasted jobs over time, per precompute policy."""
    from matplotlib.lines import Line2D

    fig = _figure(12, 6.8)
    (ax1, ax2), (ax3, ax4) = fig.subplots(2, 2, sharex=True)
    tx, label = _time_axis(data)
    pols = [p for p in data.policies if p in data.precompute]
    for p in pols:
        pb = data.precompute[p]
        style = policy_style(p, data.policies)
        c = style.colour
        visits = pb.total("visits")
        with np.errstate(invalid="ignore", divide="ignore"):
            ax1.plot(
                tx, np.where(visits > 0, 100.0 * pb.total("hits") / visits, np.nan), **style.line()
            )
        ax2.plot(tx, pb.mean("staleness_p50") / 60.0, **style.line())
        span = pb.total("_span")
        with np.errstate(invalid="ignore", divide="ignore"):
            ax3.plot(tx, np.where(span > 0, pb.total("jobs") / span, np.nan), **style.line())
        ax4.plot(tx, np.cumsum(pb.total("wasted_partial")), color=c, ls="-")
        ax4.plot(tx, np.cumsum(pb.total("expired_unused")), color=c, ls="--")
        ax4.plot(tx, np.cumsum(pb.total("dropped_unused")), color=c, ls=":")
    ax1.set_ylabel("hit rate (% of visits)")
    ax1.set_ylim(0, 100)
    ax1.set_title("visits served from a stored result", fontsize=10)
    ax2.set_ylabel("staleness (min)")
    ax2.set_title("age of results at use (median per window)", fontsize=10)
    ax3.set_ylabel("jobs / s")
    ax3.set_title("results computed", fontsize=10)
    ax4.set_ylabel("jobs (cumulative count)")
    ax4.set_ylim(bottom=0)
    _integer_ticks(ax4.yaxis)
    ax4.set_title("wasted jobs (cumulative)", fontsize=10)
    for ax in (ax3, ax4):
        ax.set_xlabel(label)
    handles: list[Any] = [
        Line2D([], [], label=p, **policy_style(p, data.policies).line()) for p in pols
    ]
    handles += [
        Line2D([], [], color="black", ls="-", label="wasted: stopped mid-way"),
        Line2D([], [], color="black", ls="--", label="wasted: expired unserved"),
        Line2D([], [], color="black", ls=":", label="wasted: superseded unserved"),
    ]
    _fig_legend(fig, handles, [str(h.get_label()) for h in handles])
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
            "baseline would have delivered for the same requests), by lever: gains stacked above "
            "zero, losses below, and value lost to failed and timed-out requests as its own "
            "hatched segment; the black diamond is the net incremental value, the green bar the "
            "oracle bound (perfect foresight, no control lag) — no policy should pass it. "
            "Right: share of SLO windows whose p99, over every request of the window from "
            "the merged sketches of all sources, exceeded the limit.",
            lambda p: plot_summary(metrics, data, p),
        ),
        (
            "p99_over_time",
            "Tail latency over time",
            f"Each line is the worst window p99 in each {data.bin_s:g} s bucket of scenario time, "
            f"per region and policy (log scale; each policy has one colour and line style in "
            f"every plot); the dashed line is the SLO ({p99_limit} ms). A "
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
            "work that made ranking worse) is drawn below zero. The scale covers the "
            f"{VALUE_PERCENTILES[0]:g}th to {VALUE_PERCENTILES[1]:g}th percentile of the buckets "
            "of every panel, so one extreme bucket does not flatten the rest; buckets beyond it "
            "are marked with a triangle at the edge and counted in the panel's title.",
            lambda p: plot_value(data, p),
        ),
        (
            "release_times",
            "Giving capacity back",
            "Left: every release time — from a reclaim taking effect to optional work fitting "
            "inside the remaining capacity — as one point per release and policy (n beside the "
            "policy's name; the bar marks the p50, the diamond the p99, nearest rank); the goal "
            f"is p99 ≤ {RELEASE_GOAL_MS:g} ms. Right: cumulative server- and client-side shedding "
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
