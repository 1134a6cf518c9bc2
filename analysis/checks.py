"""The consistency checks a reader should see before trusting a metrics document.

One list of checks, used by the terminal summary (:mod:`headroom.analysis.table`), the commands
that print it (``simulate``, ``analyze``, ``up``: failed checks are listed and named in the line
before the output paths) and ``report.html`` (:mod:`headroom.analysis.report`). Every check is run
per policy and gives a :class:`Check` whether it passed or failed, so "all passed" is a statement
about a known set; a check whose inputs are missing from the document (an older log) is left out
rather than passed.

The checks:

* ``complete`` — the policy's run finished and every window is in the log (``complete``);
* ``levers add up`` — ``incremental`` equals ``incremental_rma + incremental_sbm +
  incremental_precompute + incremental_lost`` (the last read as 0 where absent) within 1e-6 of the
  baseline value;
* ``under the oracle bound`` — ``incremental`` does not exceed ``oracle_incremental``;
* ``holdout covers truth`` — the holdout estimate's 95 % interval covers the true incremental value
  (left out when the estimate is exactly 0: no control arm said anything);
* ``every segment estimated`` — no segment was left out of the estimate for want of a control arm;
* ``window lines sound`` — no window line arrived late or carried a malformed sketch.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["Check", "checks_notice", "consistency_checks", "failed", "run_checks"]

RELATIVE_TOLERANCE = 1e-6  # of the baseline value (at least 1 value unit), for the lever sum


@dataclass(frozen=True)
class Check:
    """One check of one policy: its short name, whether it passed, and a sentence saying what
    was found (for a failure: what a reader should know)."""

    policy: str
    name: str
    passed: bool
    detail: str

    def sentence(self) -> str:
        return f"{self.policy}: {self.detail}"


def _num(x: Any) -> float | None:
    if isinstance(x, bool) or not isinstance(x, int | float):
        return None
    return float(x)


def _get(d: Any, *path: str) -> Any:
    for key in path:
        if not isinstance(d, Mapping) or key not in d:
            return None
        d = d[key]
    return d


def _policy_checks(name: str, m: Mapping[str, Any]) -> list[Check]:
    out: list[Check] = []
    complete = m.get("complete")
    if isinstance(complete, bool):
        problems = _get(m, "completeness", "problems")
        lacks = "; ".join(str(p) for p in problems) if isinstance(problems, list) else ""
        out.append(
            Check(
                name,
                "complete",
                complete,
                "the run finished and every window is in the log"
                if complete
                else f"incomplete run ({lacks or 'no run.finished or missing windows'}): its "
                "figures cover less than the run",
            )
        )
    v = m.get("value")
    if not isinstance(v, Mapping):
        return out
    inc = _num(v.get("incremental"))
    parts = [_num(v.get(f"incremental_{k}")) for k in ("rma", "sbm", "precompute")]
    lost = _num(v.get("incremental_lost"))
    baseline = _num(v.get("baseline")) or 0.0
    if inc is not None and all(p is not None for p in parts):
        levers = sum(p for p in parts if p is not None) + (lost or 0.0)
        tolerance = RELATIVE_TOLERANCE * max(1.0, abs(baseline), abs(inc))
        ok = abs(inc - levers) <= tolerance
        what = "levers + lost" if lost is not None else "levers"
        out.append(
            Check(
                name,
                "levers add up",
                ok,
                f"incremental value {inc:.6g} equals the sum over {what} {levers:.6g}"
                if ok
                else f"incremental value {inc:.6g} differs from the sum over {what} "
                f"{levers:.6g} by {inc - levers:.6g}",
            )
        )
    oracle = _num(v.get("oracle_incremental"))
    if inc is not None and oracle:
        tolerance = RELATIVE_TOLERANCE * max(1.0, abs(baseline), abs(inc))
        ok = inc <= oracle + tolerance
        out.append(
            Check(
                name,
                "under the oracle bound",
                ok,
                f"incremental value {inc:.6g} is within the oracle bound {oracle:.6g}"
                if ok
                else f"incremental value {inc:.6g} exceeds the oracle bound {oracle:.6g}: "
                "the bound is not an upper bound",
            )
        )
    est = _num(v.get("estimated_incremental"))
    ci = v.get("estimated_ci95")
    if inc is not None and est and isinstance(ci, Sequence) and len(ci) == 2:
        low, high = _num(ci[0]), _num(ci[1])
        if low is not None and high is not None:
            ok = low <= inc <= high
            out.append(
                Check(
                    name,
                    "holdout covers truth",
                    ok,
                    f"the holdout estimate's 95% interval [{low:.6g}, {high:.6g}] "
                    + ("covers" if ok else "does not cover")
                    + f" the true incremental value {inc:.6g}",
                )
            )
    unusable = v.get("estimate_unusable_segments")
    if isinstance(unusable, list):
        out.append(
            Check(
                name,
                "every segment estimated",
                not unusable,
                "every segment has a control arm in the estimate"
                if not unusable
                else "segments left out of the estimate (no control arm): "
                + ", ".join(str(s) for s in unusable),
            )
        )
    late, bad = _get(m, "slo", "late_window_lines"), _get(m, "slo", "bad_sketches")
    if isinstance(late, int) or isinstance(bad, int):
        late_n, bad_n = late or 0, bad or 0
        ok = not late_n and not bad_n
        out.append(
            Check(
                name,
                "window lines sound",
                ok,
                "no window line was late or malformed"
                if ok
                else f"{late_n} late window line(s) and {bad_n} malformed sketch(es) left out of "
                "window p99s",
            )
        )
    return out


def run_checks(metrics: Mapping[str, Any]) -> list[Check]:
    """Every check of every policy of a metrics document, in policy order."""
    policies = metrics.get("policies")
    if not isinstance(policies, Mapping):
        return []
    out: list[Check] = []
    for name, m in policies.items():
        if isinstance(m, Mapping):
            out += _policy_checks(str(name), m)
    return out


def failed(checks: Sequence[Check]) -> list[Check]:
    return [c for c in checks if not c.passed]


def consistency_checks(metrics: Mapping[str, Any]) -> list[str]:
    """What a reader should know before trusting the figures: one sentence per failed check."""
    return [c.sentence() for c in failed(run_checks(metrics))]


def checks_notice(checks: Sequence[Check], where: str = "above") -> str:
    """The one-line result: ``checks: all 14 passed`` or ``checks: 2 of 14 failed — see …``."""
    bad = failed(checks)
    if not checks:
        return "checks: none could be run (the metrics carry none of their fields)"
    if not bad:
        return f"checks: all {len(checks)} passed"
    return f"checks: {len(bad)} of {len(checks)} failed — see {where}"
