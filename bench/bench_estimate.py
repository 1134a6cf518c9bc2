"""The holdout estimate against the truth over seeds (BENCHMARKS.md, docs/analysis.md).

``estimate_halfwidth_quickstart`` — quickstart, seeds 1–10 (``--quick``: 1–3), policies static
and headroom, simulated as ``headroom simulate quickstart --policy static,headroom --seed N``
does (no plots). Per policy: how many seeds' 95 % interval (``value.estimated_ci95``) covers the
true incremental value (``value.incremental``; 0 for static), and the median half-width. The
figure is headroom's median half-width over its median true incremental value (goal ≤ 0.30);
the coverage counts (goal ≥ 9 of 10 for each policy) and a per-seed table are in ``extra``.
"""

from __future__ import annotations

import statistics
import tempfile
from pathlib import Path
from typing import Any

from headroom.bench.runner import BenchContext, BenchResult
from headroom.kernel.scenario_load import load_scenario
from headroom.kernel.settings import PACKAGE_DIR

GOAL = 0.30
POLICIES = ("static", "headroom")


def _scenario_path(name: str) -> Path:
    repo = PACKAGE_DIR.parent / "scenarios" / f"{name}.yaml"
    return repo if repo.exists() else PACKAGE_DIR / "scenarios" / f"{name}.yaml"


def coverage_table(
    seeds: range, policies: tuple[str, ...] = POLICIES, scenario: str = "quickstart"
) -> dict[str, list[dict[str, Any]]]:
    """Per policy, one row per seed: truth, estimate, interval, covered, half-width."""
    from headroom.sim.run import run_simulation

    sc = load_scenario(_scenario_path(scenario))
    rows: dict[str, list[dict[str, Any]]] = {p: [] for p in policies}
    with tempfile.TemporaryDirectory() as tmp:
        for seed in seeds:
            res = run_simulation(sc, list(policies), Path(tmp) / str(seed), seed=seed, plots=False)
            for p in policies:
                v = res.metrics["policies"][p]["value"]
                low, high = v["estimated_ci95"]
                rows[p].append(
                    {
                        "seed": seed,
                        "truth": v["incremental"],
                        "estimate": v["estimated_incremental"],
                        "ci95": [low, high],
                        "covered": low <= v["incremental"] <= high,
                        "half_width": (high - low) / 2.0,
                    }
                )
    return rows


def estimate_halfwidth_quickstart(ctx: BenchContext) -> BenchResult:
    seeds = range(1, 4) if ctx.quick else range(1, 11)
    rows = coverage_table(seeds)
    summary: dict[str, Any] = {}
    for p, rs in rows.items():
        summary[p] = {
            "covered": sum(r["covered"] for r in rs),
            "seeds": len(rs),
            "median_half_width": statistics.median(r["half_width"] for r in rs),
            "median_truth": statistics.median(r["truth"] for r in rs),
        }
    h = summary["headroom"]
    ratio = h["median_half_width"] / h["median_truth"] if h["median_truth"] > 0 else None
    return BenchResult(
        value=ratio,
        unit="median half-width / median true incremental (headroom)",
        goal=GOAL,
        extra={"scenario": "quickstart", "summary": summary, "rows": rows},
    )


BENCHMARKS = {"estimate_halfwidth_quickstart": estimate_halfwidth_quickstart}
