"""The terminal summary: a verdict on the featured policy, then one row per policy, side by side.

``format_table(metrics)`` takes the metrics document (docs/analysis.md) and returns plain text (no
colour codes, so it can be piped or pasted): first the verdict — two lines on the ``headroom``
policy (else the first policy that is not ``static``): its value added, the share of idle capacity
it used, its latency and release time against ``static``'s, its SLO violations, and the result of
every consistency check (:mod:`headroom.analysis.checks`) — then a title line with the scenario,
seed and SLO, a header, one row per policy in the document's order, a legend, and every failed check
in a sentence. A field the document lacks prints as "–", never as a made-up 0.

``closing_lines`` gives the output-path lines the commands print after it, with the checks' result
just before the last one (the last line stays the report's path, or the metrics path).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from headroom.analysis.checks import Check, checks_notice, failed, run_checks

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


MISSING = "–"  # a field the metrics document does not carry (or carries as null)


def _pct(x: float | None) -> str:
    return MISSING if x is None else f"{100.0 * x:.2f}%"


def _num(d: Any, *path: str) -> float | None:
    """The number at ``path``, else None (missing, null, not a number)."""
    cur: Any = d
    for key in path:
        if not isinstance(cur, Mapping) or key not in cur:
            return None
        cur = cur[key]
    if isinstance(cur, bool) or not isinstance(cur, int | float):
        return None
    return float(cur)


def _val(x: float | None) -> str:
    return MISSING if x is None else fmt_value(x)


def _signed(x: float | None) -> str:
    if x is None:
        return MISSING
    return ("+" if x > 0 else "") + fmt_value(x)


def _ms(x: float | None, digits: int = 1) -> str:
    return MISSING if x is None else f"{x:.{digits}f} ms"


def _int(x: float | None) -> str:
    return MISSING if x is None else f"{int(x):,}"


def _interval(m: Any, key: str = "estimated_ci95") -> tuple[float, float] | None:
    ci = m.get(key) if isinstance(m, Mapping) else None
    if not isinstance(ci, Sequence) or len(ci) != 2:
        return None
    low, high = _num({"x": ci[0]}, "x"), _num({"x": ci[1]}, "x")
    return None if low is None or high is None else (low, high)


def release_text(m: Mapping[str, Any], digits: int = 2) -> str:
    """``release p99 1.44 ms over 13 releases``, ``no releases``, or "–" for an older document
    that does not say how many releases there were."""
    n = _num(m, "reclaims", "releases")
    p99 = _num(m, "reclaims", "release_ms_p99")
    if n is None:
        return f"release p99 {_ms(p99, digits)} (n {MISSING})"
    if n == 0:
        return "no releases"
    return f"release p99 {_ms(p99, digits)} over {int(n):,} release{'s' if n != 1 else ''}"


def featured_policy(metrics: Mapping[str, Any]) -> str | None:
    """The policy the verdict is about: ``headroom``, else the first that is not ``static``."""
    policies = metrics.get("policies")
    if not isinstance(policies, Mapping) or not policies:
        return None
    names = [str(p) for p in policies]
    if "headroom" in names:
        return "headroom"
    return next((p for p in names if p != "static"), names[0])


@dataclass(frozen=True)
class Verdict:
    """The answer first: the featured policy's figures as short phrases (plain text)."""

    policy: str
    value: str
    estimate: str
    capacity: str
    latency: str
    release: str
    slo: str
    checks: str
    incomplete: bool = False  # the policy's log misses part of its run

    def label(self) -> str:
        return f"{self.policy} (incomplete run)" if self.incomplete else self.policy

    def lines(self) -> list[str]:
        return [
            f"verdict — {self.label()}: {self.value}, {self.estimate}; {self.capacity}",
            f"  {self.latency}; {self.release}; {self.slo}; {self.checks}",
        ]


def _against_static(
    metrics: Mapping[str, Any], policy: str, fmt: Callable[[float | None], str], *path: str
) -> str:
    policies = metrics.get("policies") or {}
    if policy == "static" or "static" not in policies:
        return ""
    return f" (static {fmt(_num(policies['static'], *path))})"


def _checks_phrase(checks: Sequence[Check], where: str) -> str:
    bad = failed(checks)
    if not checks:
        return "no checks could be run"
    if not bad:
        return f"checks: all {len(checks)} passed"
    return f"checks: {len(bad)} of {len(checks)} FAILED ({where})"


def verdict(
    metrics: Mapping[str, Any],
    checks: Sequence[Check] | None = None,
    where: str = "listed below",
) -> Verdict | None:
    """The verdict on :func:`featured_policy`, or None for a document with no policy; ``where``
    says where the failed checks are listed."""
    policy = featured_policy(metrics)
    if policy is None:
        return None
    m: Mapping[str, Any] = (metrics.get("policies") or {})[policy]
    if checks is None:
        checks = run_checks(metrics)
    inc = _num(m, "value", "incremental")
    baseline = _num(m, "value", "baseline")
    share = inc / baseline if inc is not None and baseline else None
    value = (
        f"{_signed(inc)} value ({'+' if share and share > 0 else ''}{_pct(share)} over "
        f"baseline {_val(baseline)})"
    )
    est = _num(m, "value", "estimated_incremental")
    ci = _interval(m.get("value"))
    ci_text = f" [{fmt_value(ci[0])}, {fmt_value(ci[1])}]" if ci is not None else ""
    estimate = f"holdout estimate {_signed(est)}{ci_text if est is not None else ''}"
    cpu = _num(m, "capacity", "captured_share", "cpu")
    acc = _num(m, "capacity", "captured_share", "accelerator")
    capacity = f"used {_pct1(cpu)} of idle CPU, {_pct1(acc)} of idle accelerator"
    base_p99 = _num(m, "latency", "baseline_only_p99_ms")
    latency = f"baseline-only p99 {_ms(base_p99)}" + _against_static(
        metrics, policy, _ms, "latency", "baseline_only_p99_ms"
    )
    viol = _num(m, "slo", "violation_fraction")
    slo = f"SLO violations {_pct(viol)} of windows" + _against_static(
        metrics, policy, _pct, "slo", "violation_fraction"
    )
    return Verdict(
        policy=policy,
        value=value,
        estimate=estimate,
        capacity=capacity,
        latency=latency,
        release=release_text(m),
        slo=slo,
        checks=_checks_phrase(checks, where),
        incomplete=m.get("complete") is False,
    )


def _row(
    name: str,
    m: Mapping[str, Any],
    with_precompute: bool,
    with_lost: bool,
    with_feasible: bool = False,
) -> list[str]:
    ci = _interval(m.get("value"))
    half = (ci[1] - ci[0]) / 2.0 if ci is not None else None
    errors = _num(m, "requests", "errors")
    capture = _num(m, "value", "capture_ratio")
    row = [
        name if m.get("complete", True) is not False else f"{name} (incomplete)",
        _pct(_num(m, "slo", "violation_fraction")),
        MISSING if (w := _num(m, "slo", "worst_window_p99_ms")) is None else f"{w:.1f}",
        _int(errors),
        _val(_num(m, "value", "incremental")),
        _val(_num(m, "value", "incremental_rma")),
        _val(_num(m, "value", "incremental_sbm")),
    ]
    if with_precompute:
        row.append(_val(_num(m, "value", "incremental_precompute")))
    if with_lost:
        row.append(_val(_num(m, "value", "incremental_lost")))
    cpu = _num(m, "capacity", "captured_share", "cpu")
    acc = _num(m, "capacity", "captured_share", "accelerator")
    releases = _num(m, "reclaims", "releases")
    p99 = _num(m, "reclaims", "release_ms_p99")
    row += [
        _val(_num(m, "value", "oracle_incremental")),
        MISSING if capture is None else f"{capture:.3f}",
    ]
    if with_feasible:
        cap_f = _num(m, "value", "capture_feasible")
        row += [
            _val(_num(m, "value", "feasible_bound")),
            MISSING if cap_f is None else f"{cap_f:.3f}",
        ]
    row += [
        f"{_val(_num(m, 'value', 'estimated_incremental'))} ± {_val(half)}",
        f"{_pct0(cpu)}/{_pct0(acc)}",
        MISSING if (b := _num(m, "latency", "baseline_only_p99_ms")) is None else f"{b:.1f}",
        "no releases" if releases == 0 else f"{_release_ms(p99)} ({_int(releases)})",
        f"{_int(_num(m, 'shedding', 'server_activations'))}"
        f"/{_int(_num(m, 'shedding', 'client_activations'))}",
    ]
    if with_precompute:
        row.append(_pct(_num(m, "precompute", "hit_rate")) if "precompute" in m else "-")
    return row


def _release_ms(x: float | None) -> str:
    if x is None:
        return MISSING
    return f"{x:.2f}" if abs(x) < 1000 else f"{x:,.0f}"


def _pct1(x: float | None) -> str:
    return MISSING if x is None else f"{100.0 * x:.1f}%"


def _pct0(x: float | None) -> str:
    return MISSING if x is None else f"{100.0 * x:.0f}%"


def format_table(metrics: Mapping[str, Any]) -> str:
    """The verdict, the side-by-side summary of every policy, and every failed check."""
    policies: Mapping[str, Any] = metrics.get("policies") or {}
    checks = run_checks(metrics)
    with_precompute = any(isinstance(m, Mapping) and "precompute" in m for m in policies.values())
    with_lost = any(_num(m, "value", "incremental_lost") is not None for m in policies.values())
    with_feasible = any(_num(m, "value", "feasible_bound") is not None for m in policies.values())
    header = ["policy", "viol", "worst p99", "errors", "incremental", "rma", "sbm"]
    if with_precompute:
        header.append("precomp")
    if with_lost:
        header.append("lost")
    header += [
        "oracle",
        "capture",
        *(["feasible", "cap.f"] if with_feasible else []),
        "estimate ± 95%",
        "idle cpu/acc",
        "base p99",
        "release p99 (n)",
        "shed s/c",
    ]
    if with_precompute:
        header.append("hit rate")
    rows = [
        _row(name, m, with_precompute, with_lost, with_feasible) for name, m in policies.items()
    ]
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]

    def line(cells: Sequence[str]) -> str:
        first = cells[0].ljust(widths[0])
        rest = (c.rjust(w) for c, w in zip(cells[1:], widths[1:], strict=True))
        return "  ".join([first, *rest]).rstrip()

    first: Mapping[str, Any] = next(iter(policies.values()), {})
    slo_doc = first.get("slo") if isinstance(first, Mapping) else None
    slo: Mapping[str, Any] = slo_doc if isinstance(slo_doc, Mapping) else {}
    title = (
        f"scenario {metrics.get('scenario')}  seed {metrics.get('seed')}  "
        f"SLO p99 ≤ {slo.get('p99_ms', '?')} ms per {slo.get('window_s', '?')} s "
        "window"
    )
    v = verdict(metrics, checks)
    out = [*v.lines(), ""] if v is not None else []
    out += [title, line(header), "  ".join("-" * w for w in widths)]
    out += [line(r) for r in rows]
    out.append(
        "viol: share of SLO windows over the p99 limit; worst p99 in ms; incremental value by "
        "lever (ground truth"
        + ("; lost: failed and timed-out requests" if with_lost else "")
        + "); capture = incremental / oracle (– where the bound is ~0);"
        + (
            " feasible: the bound under the engine's own rules, cap.f = incremental / feasible;"
            if with_feasible
            else ""
        )
    )
    if any(isinstance(m, Mapping) and m.get("complete") is False for m in policies.values()):
        out.append("(incomplete): the log misses part of that policy's run; its figures cover less")
    out.append(
        "estimate: holdout A/B estimate of the incremental value with its 95% half-width; "
        "idle cpu/acc: share of the idle (opportunistic) capacity optional work used; base p99: "
        "ms, requests with no optional work;"
    )
    out.append(
        "release p99 (n): ms from a reclaim to optional work fitting, over n releases; "
        "shed s/c: server/client shedding activations; –: not in the metrics"
    )
    bad = failed(checks)
    if bad:
        out.append("")
        out.append(f"failed checks ({len(bad)} of {len(checks)}):")
        out += [f"  ✗ {c.policy} ({c.name}): {c.detail}" for c in bad]
    return "\n".join(out)


def closing_lines(metrics: Mapping[str, Any], paths: Sequence[tuple[str, object]]) -> list[str]:
    """The ``label: path`` lines a command prints after the summary, with the checks' result
    (``checks: 2 of 14 failed — see above and report.html``) just before the last one, so the
    last line stays the path scripts read."""
    lines = [f"{label}: {path}" for label, path in paths]
    where = "above and in report.html" if any(lb == "report" for lb, _ in paths) else "above"
    notice = checks_notice(run_checks(metrics), where)
    return [*lines[:-1], notice, *lines[-1:]]
