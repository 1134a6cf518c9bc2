"""The terminal summary table: one row per policy, side by side.

``format_table(metrics)`` takes the metrics document (docs/analysis.md) and returns plain text (no
colour codes, so it can be piped or pasted): a title line with the scenario, seed and SLO, then a
header, one row per policy in the document's order, and a legend line per column group.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

_SUFFIXES = ((1e9, "G"), (1e6, "M"), (1e3, "k"))


def fmt_value(x: float) -> str:
    """A value with 3-4 significant digits and a k/M/G suffix: 12345.6 → '12.35k'."""
    if not math.isfinite(x):
        return str(x)
    for scale, suffix in _SUFFIXES:
        if abs(x) >= scale:
            return f"{x / scale:.2f}{suffix}"
    if x == 0:
        return "0"
    if abs(x) >= 100:
        return f"{x:.0f}"
    if abs(x) >= 1:
        return f"{x:.2f}"
    return f"{x:.3f}"


def _pct(x: float) -> str:
    return f"{100.0 * x:.2f}%"


def _g(d: Mapping[str, Any], *path: str, default: Any = 0.0) -> Any:
    cur: Any = d
    for key in path:
        if not isinstance(cur, Mapping) or key not in cur:
            return default
        cur = cur[key]
    return cur


def _row(name: str, m: Mapping[str, Any], with_precompute: bool) -> list[str]:
    ci = _g(m, "value", "estimated_ci95", default=[0.0, 0.0])
    half = (float(ci[1]) - float(ci[0])) / 2.0 if isinstance(ci, Sequence) and len(ci) == 2 else 0.0
    row = [
        name,
        _pct(_g(m, "slo", "violation_fraction")),
        f"{_g(m, 'slo', 'worst_window_p99_ms'):.1f}",
        f"{_g(m, 'requests', 'errors', default=0)}",
        fmt_value(_g(m, "value", "incremental")),
        fmt_value(_g(m, "value", "incremental_rma")),
        fmt_value(_g(m, "value", "incremental_sbm")),
    ]
    if with_precompute:
        row.append(fmt_value(_g(m, "value", "incremental_precompute")))
    row.append(fmt_value(_g(m, "value", "incremental_lost")))
    row += [
        fmt_value(_g(m, "value", "oracle_incremental")),
        f"{_g(m, 'value', 'capture_ratio'):.3f}",
        f"{fmt_value(_g(m, 'value', 'estimated_incremental'))} ± {fmt_value(half)}",
        f"{_g(m, 'reclaims', 'release_ms_p99'):.2f}",
        f"{_g(m, 'shedding', 'server_activations', default=0)}"
        f"/{_g(m, 'shedding', 'client_activations', default=0)}",
    ]
    if with_precompute:
        row.append(_pct(_g(m, "precompute", "hit_rate")) if "precompute" in m else "-")
    return row


def format_table(metrics: Mapping[str, Any]) -> str:
    """The side-by-side summary of every policy in a metrics document."""
    policies: Mapping[str, Any] = metrics.get("policies") or {}
    with_precompute = any(isinstance(m, Mapping) and "precompute" in m for m in policies.values())
    header = ["policy", "viol", "worst p99", "errors", "incremental", "rma", "sbm"]
    if with_precompute:
        header.append("precomp")
    header.append("lost")
    header += ["oracle", "capture", "estimate ± 95%", "release p99", "shed s/c"]
    if with_precompute:
        header.append("hit rate")
    rows = [_row(name, m, with_precompute) for name, m in policies.items()]
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]

    def line(cells: Sequence[str]) -> str:
        first = cells[0].ljust(widths[0])
        rest = (c.rjust(w) for c, w in zip(cells[1:], widths[1:], strict=True))
        return "  ".join([first, *rest]).rstrip()

    first: Mapping[str, Any] = next(iter(policies.values()), {})
    slo = _g(first, "slo", default={})
    title = (
        f"scenario {metrics.get('scenario')}  seed {metrics.get('seed')}  "
        f"SLO p99 ≤ {_g(slo, 'p99_ms', default='?')} ms per {_g(slo, 'window_s', default='?')} s "
        "window"
    )
    out = [title, line(header), "  ".join("-" * w for w in widths)]
    out += [line(r) for r in rows]
    out.append(
        "viol: share of SLO windows over the p99 limit; worst p99 in ms; incremental value by "
        "lever and lost to failed or timed-out requests (ground truth, they add up); "
        "capture = incremental / oracle;"
    )
    out.append(
        "estimate: holdout A/B estimate of the incremental value with its 95% half-width; "
        "release p99: ms from a reclaim to optional work fitting; shed s/c: server/client "
        "shedding activations"
    )
    return "\n".join(out)
