"""PNG plots and a self-contained ``report.html`` from a metrics document and its event log.

``write_report(metrics, events_path, out_dir)`` reads the log once more
(:func:`headroom.analysis.report_data.collect`), draws the plots (:mod:`headroom.analysis.plots`),
writes them to ``out_dir/plots/*.png`` and inlines them as base64 in ``out_dir/report.html``, so the
report is one file that opens anywhere with no external asset.

The page opens with the verdict on the featured policy (the terminal summary's, from
:mod:`headroom.analysis.table`) and the result of every consistency check
(:mod:`headroom.analysis.checks`), listed in full in its Checks section. The plots are listed in
:mod:`headroom.analysis.plots`.
"""

from __future__ import annotations

import base64
import html
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from headroom.analysis.checks import Check, consistency_checks, failed, run_checks
from headroom.analysis.events import EventLog
from headroom.analysis.plots import Plot, render_plots
from headroom.analysis.report_data import RAW_SAMPLES_PER_KIND, ReportData, collect
from headroom.analysis.table import MISSING, fmt_value, verdict
from headroom.kernel.errors import HeadroomError

# consistency_checks lives in headroom.analysis.checks; it stays importable from here too
__all__ = ["consistency_checks", "render_html", "render_report", "write_report"]

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
td{white-space:nowrap}
td:first-child,th:first-child{text-align:left}
img{max-width:100%;border:1px solid #eee}.caption{color:#444;max-width:60em}
.muted{color:#777}pre{background:#f7f7f7;padding:.5em;overflow-x:auto;font-size:12px}
.bad{color:#b00}.ok{color:#070}.scroll{overflow-x:auto;max-width:100%}
.verdict{background:#f4f8fc;border-left:4px solid #1f77b4;padding:.6em 1em;margin:1em 0}
.verdict p{margin:.2em 0}.verdict.failing{border-left-color:#b00}
"""


def _e(x: Any) -> str:
    return html.escape(str(x))


def _table(header: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    head = "".join(f"<th>{_e(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{_e(c)}</td>" for c in r) + "</tr>" for r in rows)
    return (
        f"<div class='scroll'><table><thead><tr>{head}</tr></thead><tbody>{body}</tbody>"
        "</table></div>"
    )


def _n(d: Any, *path: str) -> float | None:
    for key in path:
        if not isinstance(d, Mapping) or key not in d:
            return None
        d = d[key]
    return None if isinstance(d, bool) or not isinstance(d, int | float) else float(d)


def _v(x: float | None) -> str:
    return MISSING if x is None else fmt_value(x)


def _p(x: float | None, digits: int = 2) -> str:
    return MISSING if x is None else f"{100 * x:.{digits}f}%"


def _f(x: float | None, digits: int = 1) -> str:
    return MISSING if x is None else f"{x:.{digits}f}"


def _i(x: float | None) -> str:
    return MISSING if x is None else f"{int(x):,}"


def _summary_rows(metrics: Mapping[str, Any]) -> list[list[str]]:
    rows = []
    for name, m in metrics["policies"].items():
        v = m.get("value") or {}
        ci = v.get("estimated_ci95")
        ci_text = (
            f" [{_v(_n({'x': ci[0]}, 'x'))}, {_v(_n({'x': ci[1]}, 'x'))}]"
            if isinstance(ci, list | tuple) and len(ci) == 2
            else ""
        )
        complete = m.get("complete")
        releases = _n(m, "reclaims", "releases")
        release = (
            "no releases"
            if releases == 0
            else f"{_f(_n(m, 'reclaims', 'release_ms_p50'), 2)} / "
            f"{_f(_n(m, 'reclaims', 'release_ms_p99'), 2)} / "
            f"{_f(_n(m, 'reclaims', 'release_ms_max'), 2)}"
        )
        rows.append(
            [
                name,
                MISSING if not isinstance(complete, bool) else ("yes" if complete else "NO"),
                _p(_n(m, "slo", "violation_fraction")),
                _f(_n(m, "slo", "worst_window_p99_ms")),
                _i(_n(m, "requests", "total")),
                _i(_n(m, "requests", "errors")),
                _i(_n(m, "requests", "timeouts")),
                _v(_n(v, "incremental")),
                _v(_n(v, "incremental_rma")),
                _v(_n(v, "incremental_sbm")),
                _v(_n(v, "incremental_precompute")),
                _v(_n(v, "incremental_lost")),
                _v(_n(v, "oracle_incremental")),
                _f(_n(v, "capture_ratio"), 3),
                f"{_v(_n(v, 'estimated_incremental'))}{ci_text}",
                f"{_p(_n(m, 'capacity', 'captured_share', 'cpu'), 1)} / "
                f"{_p(_n(m, 'capacity', 'captured_share', 'accelerator'), 1)}",
                f"{_f(_n(m, 'latency', 'all_p99_ms'))} / "
                f"{_f(_n(m, 'latency', 'baseline_only_p99_ms'))}",
                _i(_n(m, "reclaims", "count")),
                _i(releases),
                release,
                f"{_i(_n(m, 'shedding', 'server_activations'))} / "
                f"{_i(_n(m, 'shedding', 'client_activations'))}",
            ]
        )
    return rows


_SUMMARY_HEADER = [
    "policy",
    "complete",
    "SLO violations",
    "worst p99 (ms)",
    "requests",
    "errors",
    "timeouts",
    "incremental",
    "RMA",
    "SBM",
    "precompute",
    "lost",
    "oracle",
    "capture",
    "holdout estimate [95% CI]",
    "idle CPU / accelerator used",
    "p99 all / baseline-only (ms)",
    "reclaims",
    "releases",
    "release ms p50 / p99 / max",
    "shedding server / client",
]


def _lever_estimates(metrics: Mapping[str, Any]) -> str:
    """Per policy and lever: the holdout estimate with its interval, beside the truth."""
    rows = []
    for name, m in metrics["policies"].items():
        by_lever = (m.get("value") or {}).get("estimated_by_lever")
        if not isinstance(by_lever, Mapping):
            continue
        for lever, est in by_lever.items():
            ci = est.get("ci95") if isinstance(est, Mapping) else None
            ok = isinstance(ci, list | tuple) and len(ci) == 2
            rows.append(
                [
                    name,
                    lever,
                    _v(_n(m, "value", f"incremental_{lever}")),
                    _v(_n(est, "estimate")),
                    f"[{_v(_n({'x': ci[0]}, 'x'))}, {_v(_n({'x': ci[1]}, 'x'))}]"
                    if ok and ci is not None
                    else MISSING,
                ]
            )
    if not rows:
        return ""
    return "<h3>Holdout estimate by lever</h3>" + _table(
        ["policy", "lever", "true incremental", "holdout estimate", "95% interval"], rows
    )


def _verdict(metrics: Mapping[str, Any], checks: list[Check]) -> str:
    """The answer first: the featured policy's figures and every check's result."""
    v = verdict(metrics, checks, where="see Checks")
    if v is None:
        return ""
    bad = failed(checks)
    names = "".join(f"<li><a href='#checks'>{_e(c.policy)}: {_e(c.name)}</a></li>" for c in bad)
    checks_html = (
        f"<p class='bad'><b>{len(bad)} of {len(checks)} checks failed:</b></p><ul class='bad'>"
        f"{names}</ul>"
        if bad
        else f"<p class='ok'><b>All {len(checks)} checks passed</b> "
        "(<a href='#checks'>list</a>).</p>"
    )
    cls = "verdict failing" if bad else "verdict"
    return (
        f"<div class='{cls}' id='verdict'><p><b>{_e(v.label())}</b>: {_e(v.value)}, "
        f"{_e(v.estimate)}; {_e(v.capacity)}.</p><p>{_e(v.latency)}; {_e(v.release)}; "
        f"{_e(v.slo)}.</p>{checks_html}</div>"
    )


def render_html(
    metrics: Mapping[str, Any], plots: Sequence[Plot], data: ReportData, events_path: Path
) -> str:
    first: Mapping[str, Any] = next(iter(metrics["policies"].values()), {})
    slo = first.get("slo", {})
    checks = run_checks(metrics)
    parts = [
        "<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>",
        f"<title>headroom report — {_e(metrics.get('scenario'))}</title>",
        f"<style>{_CSS}</style></head><body>",
        f"<h1>headroom report — {_e(metrics.get('scenario'))}</h1>",
        f"<p class='muted'>seed {_e(metrics.get('seed'))} · {len(metrics['policies'])} "
        f"policies · {data.duration_s:g} s of scenario time · SLO p99 ≤ {_e(slo.get('p99_ms'))} "
        f"ms per {_e(slo.get('window_s'))} s window · log {_e(events_path.name)} "
        f"({_e(data.stats.summary())})</p>",
        _verdict(metrics, checks),
        "<h2>Side by side</h2>",
        _table(_SUMMARY_HEADER, _summary_rows(metrics)),
        "<p class='caption'>Incremental value is ground truth (value delivered above what the "
        "baseline would have delivered for the same requests); capture = incremental / oracle "
        "bound; the holdout estimate is what the A/B control arm alone says, with its 95% "
        "interval, so the estimator can be checked against the truth; lost = value of failed "
        "and timed-out requests against the baseline's; idle used = share of the opportunistic "
        "unit-seconds optional work used; baseline-only p99 = requests with no optional work; "
        f"{MISSING} = not in the metrics. Definitions: docs/analysis.md.</p>",
        _lever_estimates(metrics),
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
    parts.append(_checks(checks))
    parts.append(_diagnostics(data))
    parts.append("</body></html>")
    return "\n".join(parts)


def _checks(checks: list[Check]) -> str:
    """Every check of every policy, failed ones first."""
    head = "<h2 id='checks'>Checks</h2>"
    if not checks:
        return head + "<p>The metrics carry none of the fields the checks need.</p>"
    bad = failed(checks)
    summary = (
        f"<p class='bad'>{len(bad)} of {len(checks)} checks failed.</p>"
        if bad
        else f"<p class='ok'>All {len(checks)} checks passed.</p>"
    )
    ordered = sorted(checks, key=lambda c: c.passed)
    rows = "".join(
        f"<tr class='{'ok' if c.passed else 'bad'}'><td>{_e(c.policy)}</td><td>{_e(c.name)}</td>"
        f"<td>{'passed' if c.passed else 'FAILED'}</td><td>{_e(c.detail)}</td></tr>"
        for c in ordered
    )
    table = (
        "<div class='scroll'><table><thead><tr><th>policy</th><th>check</th><th>result</th>"
        f"<th>found</th></tr></thead><tbody>{rows}</tbody></table></div>"
    )
    return head + summary + table


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
