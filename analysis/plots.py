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
_LEVER_COLOURS = {"rma": "#1f77b4", "sbm": "#ff7f0e", "precompute": "#2ca02c", "lost": "#7f7f7f"}


def policy_colour(policy: str, order: Sequence[str]) -> str:
    if policy in _POLICY_COLOURS:
        return _POLICY_COLOURS[policy]
    extras = [p for p in order if p not in _POLICY_COLOURS]
    i = extras.index(policy) if policy in extras else 0
    return _EXTRA_COLOURS[i % len(_EXTRA_COLOURS)]


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
    # gains stack up from 0 and losses down from 0, so the bar spans the parts that add up to
    # the incremental value (the lost value of failed and timed-out requests its own segment)
    up = np.zeros(len(pols))
    down = np.zeros(len(pols))
    for lever in (*LEVERS, "lost"):
        v = np.array([m[p]["value"].get(f"incremental_{lever}", 0.0) for p in pols])
        if not np.any(v):
            continue
        base = np.where(v >= 0, up, down)
        ax1.bar(x, v, bottom=base, color=_LEVER_COLOURS[lever], label=lever)
        up += np.maximum(v, 0.0)
        down += np.minimum(v, 0.0)
    total = np.array([m[p]["value"].get("incremental", 0.0) for p in pols])
    ax1.scatter(x, total, marker="o", s=18, color="white", edgecolors="black", zorder=4,
                label="incremental (net)")  # fmt: skip
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
            "baseline would have delivered for the same requests), stacked by lever, gains up "
            "and losses down from 0, with the value lost to failed and timed-out requests as its "
            "own grey segment and a dot at the net figure; the black "
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
