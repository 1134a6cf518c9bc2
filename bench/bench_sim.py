"""Simulator speed: how many simulated seconds one wall-clock second buys (BENCHMARKS.md).

``sim_speedup_diurnal_3region`` — the diurnal-3region scenario (24 h, 3 regions) under the
headroom policy on one core: building the run's context (traces, arrivals), computing the
oracle's bound (every run writes it) and simulating every window into an event log on disk.
Measuring the world's value curves is not counted (they are cached per world seed); nor is the
analysis afterwards. Goal: ≥ 1,440× real time, i.e. a simulated day in a minute. ``--quick``
simulates the first two hours only.
"""

from __future__ import annotations

import dataclasses
import tempfile
import time
from pathlib import Path

from headroom.analysis.events import EventWriter
from headroom.bench.runner import BenchContext, BenchResult
from headroom.kernel.scenario_load import load_scenario
from headroom.kernel.settings import PACKAGE_DIR

GOAL = 1440.0


def _scenario_path(name: str) -> Path:
    repo = PACKAGE_DIR.parent / "scenarios" / f"{name}.yaml"
    return repo if repo.exists() else PACKAGE_DIR / "scenarios" / f"{name}.yaml"


def sim_speedup_diurnal_3region(ctx: BenchContext) -> BenchResult:
    from headroom.sim.engine import SimContext, run_policy
    from headroom.sim.oracle import oracle_for
    from headroom.sim.policies import PolicyFactory
    from headroom.world.curves import curves_for

    scenario = load_scenario(_scenario_path("diurnal-3region"))
    if ctx.quick:
        scenario = dataclasses.replace(scenario, duration_s=7200.0)
    curves = curves_for(scenario)  # cached per world seed; not part of the measurement
    with tempfile.TemporaryDirectory() as tmp:
        started = time.perf_counter()
        sim = SimContext(scenario, curves)
        oracle_for(sim).bound()
        factory = PolicyFactory("headroom", sim)
        with EventWriter(Path(tmp) / "events.jsonl") as writer:
            run_policy(
                sim, "headroom", factory.region, writer.write, control_interval_s=factory.interval_s
            )
        wall = time.perf_counter() - started
    speedup = scenario.duration_s / wall
    return BenchResult(
        value=speedup,
        unit="x real time",
        goal=GOAL,
        extra={
            "simulated_s": scenario.duration_s,
            "wall_s": wall,
            "regions": len(scenario.regions),
            "policy": "headroom",
        },
    )


BENCHMARKS = {"sim_speedup_diurnal_3region": sim_speedup_diurnal_3region}
