"""PNG plots and a self-contained ``report.html`` from a metrics document and its event log.

``write_report(metrics, events_path, out_dir)`` reads the log once more
(:func:`headroom.analysis.report_data.collect`), draws the plots (:mod:`headroom.analysis.plots`),
writes them to ``out_dir/plots/*.png`` and inlines them as base64 in ``out_dir/report.html``, so the
report is one file that opens anywhere with no external asset.


The plots are listed in :mod:`headroom.analysis.plots`.
"""

from __future__ import annotations

import base64
import html
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from headroom.analysis.events import EventLog
from headroom.analysis.plots import Plot, render_plots
from headroom.analysis.report_data import RAW_SAMPLES_PER_KIND, ReportData, collect
from headroom.analysis.table import fmt_value
from headroom.kernel.errors import HeadroomError

# q grid for the CDFs: dense in the tail, where the SLO lives.

# the precompute counters of window lines the report plots (docs/events.md)


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
        levers = (
            v["incremental_rma"]
            + v["incremental_sbm"]
            + v["incremental_precompute"]
            + v.get("incremental_lost", 0.0)
        )
        tolerance = 1e-6 * max(1.0, abs(v["incremental"]), abs(v["baseline"]))
        if abs(v["incremental"] - levers) > tolerance:
            found.append(
                f"{name}: incremental value {v['incremental']:.6g} differs from the sum over "
                f"levers and lost value {levers:.6g} (value_total − value_baseline vs inc and "
                "value_lost in the window lines)"
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
