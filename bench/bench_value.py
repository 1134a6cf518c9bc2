"""The value targets of every simulator policy, as one recorded table (BENCHMARKS.md).

``sim_value_targets`` — every scenario in ``scenarios/`` (its own seed) and quickstart seeds
1–10, every policy side by side through :func:`headroom.sim.run.run_simulation` (exactly what
``headroom simulate`` does), and per scenario and policy:

* ``capture_feasible`` — incremental value ÷ the feasible bound (``value.feasible_bound``);
* ``violation_fraction`` — the share of SLO windows over the p99 limit, and static's;
* ``baseline_only_p99_ratio`` — ``latency.baseline_only_p99_ms`` ÷ static's;
* ``oracle_over_feasible`` — the oracle policy's incremental value ÷ the feasible bound.

The benchmark's value is headroom's lowest ``capture_feasible`` over the scenarios (goal ≥ 0.85);
the table is in ``extra``. ``--quick``: quickstart seeds 1–2 only. Run as a module
(``python -m headroom.bench.bench_value [--quick] [--policy P,…]``) it prints the table as
Markdown.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import orjson

from headroom.bench.runner import BenchContext, BenchResult
from headroom.kernel.scenario_load import load_scenario
from headroom.kernel.settings import PACKAGE_DIR

GOAL = 0.85
QUICKSTART_SEEDS = tuple(range(1, 11))


def _scenario_dir() -> Path:
    repo = PACKAGE_DIR.parent / "scenarios"
    return repo if repo.exists() else PACKAGE_DIR / "scenarios"


def runs(quick: bool) -> list[tuple[str, Path, int | None]]:
    """(label, scenario file, seed or None for the scenario's own) of every measured run."""
    d = _scenario_dir()
    out: list[tuple[str, Path, int | None]] = []
    if not quick:
        out += [(p.stem, p, None) for p in sorted(d.glob("*.yaml"))]
    seeds = QUICKSTART_SEEDS[:2] if quick else QUICKSTART_SEEDS
    out += [(f"quickstart/seed {s}", d / "quickstart.yaml", s) for s in seeds]
    return out


def _num(x: Any) -> float | None:
    return float(x) if isinstance(x, int | float) and not isinstance(x, bool) else None


def measure(path: Path, seed: int | None, policies: Sequence[str] | None) -> dict[str, Any]:
    """One scenario: the table's figures per policy."""
    from headroom.sim.policies import POLICIES
    from headroom.sim.run import run_simulation

    names = list(policies or POLICIES)
    for needed in ("static", "oracle"):
        if needed not in names:
            names.append(needed)
    scenario = load_scenario(path)
    with tempfile.TemporaryDirectory() as tmp:
        metrics = run_simulation(scenario, names, Path(tmp), seed=seed, plots=False).metrics
    pols = metrics["policies"]
    static = pols["static"]
    s_viol = _num(static["slo"]["violation_fraction"]) or 0.0
    s_base = _num(static["latency"]["baseline_only_p99_ms"])
    s_err = int(static["requests"]["errors"])
    feasible = _num(static["value"].get("feasible_bound"))
    oracle_inc = _num(pols["oracle"]["value"]["incremental"])
    out: dict[str, Any] = {
        "seed": metrics.get("seed"),
        "feasible_bound": feasible,
        "oracle_incremental": _num(static["value"]["oracle_incremental"]),
        "oracle_over_feasible": (
            oracle_inc / feasible if oracle_inc is not None and feasible else None
        ),
        "static": {"violation_fraction": s_viol, "errors": s_err, "baseline_only_p99_ms": s_base},
        "policies": {},
    }
    for name in names:
        m = pols[name]
        base = _num(m["latency"]["baseline_only_p99_ms"])
        viol = _num(m["slo"]["violation_fraction"]) or 0.0
        errors = int(m["requests"]["errors"])
        out["policies"][name] = {
            "incremental": _num(m["value"]["incremental"]),
            "capture_feasible": _num(m["value"].get("capture_feasible")),
            "violation_fraction": viol,
            "errors": errors,
            "baseline_only_p99_ratio": base / s_base if base is not None and s_base else None,
            "slo_kept": viol <= s_viol + 0.001 and errors <= s_err,
        }
    return out


def table(results: dict[str, dict[str, Any]]) -> str:
    """The measured figures as a Markdown table, one row per scenario and policy."""

    def f(x: Any, fmt: str) -> str:
        return "–" if x is None else format(x, fmt)

    lines = [
        "| scenario | policy | incremental | capture_feasible | violations (static) | errors "
        "(static) | baseline-only p99 ÷ static | oracle ÷ feasible |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for label, r in results.items():
        st = r["static"]
        for name, p in r["policies"].items():
            lines.append(
                f"| {label} | {name} | {f(p['incremental'], ',.0f')} "
                f"| {f(p['capture_feasible'], '.3f')} "
                f"| {p['violation_fraction']:.2%} ({st['violation_fraction']:.2%}) "
                f"| {p['errors']:,} ({st['errors']:,}) "
                f"| {f(p['baseline_only_p99_ratio'], '.2f')} "
                f"| {f(r['oracle_over_feasible'], '.3f') if name == 'oracle' else ''} |"
            )
    return "\n".join(lines)


def collect(quick: bool, policies: Sequence[str] | None = None) -> dict[str, dict[str, Any]]:
    return {label: measure(path, seed, policies) for label, path, seed in runs(quick)}


def summary(results: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Headroom's lowest capture over the scenarios' own seeds, and its mean over quickstart's
    with the standard error of that mean (the seeds' sample standard deviation over √n): a
    change to the policy moves each seed's run along another trajectory, so the mean of ten
    seeds moves by about that much whatever the change is worth."""
    own = [
        r["policies"]["headroom"]["capture_feasible"]
        for label, r in results.items()
        if "/seed" not in label and "headroom" in r["policies"]
    ]
    seeds = [
        r["policies"]["headroom"]["capture_feasible"]
        for label, r in results.items()
        if "/seed" in label and "headroom" in r["policies"]
    ]
    own_n = [x for x in own if x is not None]
    seeds_n = [x for x in seeds if x is not None]
    n = len(seeds_n)
    return {
        "headroom_min_capture_feasible": min(own_n + seeds_n) if own_n + seeds_n else None,
        "headroom_mean_capture_feasible_quickstart_seeds": statistics.fmean(seeds_n) if n else None,
        "headroom_mean_capture_feasible_quickstart_seeds_se": (
            statistics.stdev(seeds_n) / math.sqrt(n) if n > 1 else None
        ),
    }


def sim_value_targets(ctx: BenchContext) -> BenchResult:
    results = collect(ctx.quick)
    s = summary(results)
    value = s["headroom_min_capture_feasible"]
    return BenchResult(
        value=float(value) if value is not None else float("nan"),
        unit="capture_feasible (headroom, lowest)",
        goal=GOAL,
        extra={**s, "runs": results},
    )


BENCHMARKS = {"sim_value_targets": sim_value_targets}


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m headroom.bench.bench_value")
    ap.add_argument("--quick", action="store_true", help="quickstart seeds 1-2 only")
    ap.add_argument("--policy", action="append", help="policies (default: all)")
    ap.add_argument("--only", action="append", help="run labels to measure (default: all)")
    ap.add_argument("--out", help="write the figures as JSON to this file after every run")
    args = ap.parse_args(argv)
    pols = [p for item in args.policy or [] for p in item.split(",") if p] or None
    results: dict[str, dict[str, Any]] = {}
    for label, path, seed in runs(args.quick):
        if args.only and label not in args.only:
            continue
        results[label] = measure(path, seed, pols)
        sys.stdout.write(table({label: results[label]}) + "\n")
        sys.stdout.flush()
        if args.out:
            Path(args.out).write_bytes(orjson.dumps(results, option=orjson.OPT_INDENT_2))
    print(table(results))
    print(orjson.dumps(summary(results)).decode())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
