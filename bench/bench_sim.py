"""Simulator speed: how many simulated seconds one wall-clock second buys (BENCHMARKS.md).

``sim_speedup_diurnal_3region`` — the diurnal-3region scenario (24 h, 3 regions) under the
headroom policy as ``headroom simulate`` runs it: building the run's context (traces,
arrivals), computing the oracle's bounds (every run writes them; the parent process computes
them while the regions run) and simulating every window into an event log on disk, the regions
in parallel processes (:func:`headroom.sim.fanout.default_jobs`: one per region on this
machine's cores). Measuring the world's value curves is
not counted (they are cached per world seed); nor is the analysis afterwards. Goal: ≥ 1,440×
real time, i.e. a simulated day in a minute. The same run in one process is measured right
after, side by side (``extra.one_process_x``: the speed of the code itself, what a one-core
machine gets). ``--quick`` simulates the first two hours only.

``sim_event_log_mb_day`` — the size of the event log ``headroom simulate`` writes for a simulated
day of diurnal-3region with every policy side by side (the run compresses it: its plain log is
over :data:`headroom.sim.runtime.COMPRESS_ABOVE_BYTES`). The benchmark simulates the first
:data:`LOG_HOURS` hours of every policy through :func:`headroom.sim.run.run_simulation` exactly as
the command does and scales the bytes to 24 h (the log is one window line per policy, region and
SLO window, so its size is linear in simulated time). Goal: ≤ 100 MB. ``--quick``: half an hour.
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
    from headroom.sim.context import SimContext
    from headroom.sim.engine import run_policy
    from headroom.sim.fanout import default_jobs, usable_cores
    from headroom.sim.oracle import oracle_for
    from headroom.sim.policies import PolicyFactory
    from headroom.world.curves import curves_for

    scenario = load_scenario(_scenario_path("diurnal-3region"))
    if ctx.quick:
        scenario = dataclasses.replace(scenario, duration_s=7200.0)
    curves = curves_for(scenario)  # cached per world seed; not part of the measurement
    jobs = default_jobs(len(scenario.regions))

    def run(jobs: int) -> float:
        with tempfile.TemporaryDirectory() as tmp:
            started = time.perf_counter()
            sim = SimContext(scenario, curves)
            oracle = oracle_for(sim)

            def bounds() -> None:  # as `simulate` does: while the regions run
                oracle.bound()
                oracle.feasible()

            factory = PolicyFactory("headroom", sim)
            with EventWriter(Path(tmp) / "events.jsonl") as writer:
                run_policy(
                    sim,
                    "headroom",
                    factory.region,
                    writer.write,
                    control_interval_s=factory.interval_s,
                    jobs=jobs,
                    meanwhile=bounds,
                )
            return time.perf_counter() - started

    wall = run(jobs)
    one = run(1) if jobs > 1 else wall
    return BenchResult(
        value=scenario.duration_s / wall,
        unit="x real time",
        goal=GOAL,
        extra={
            "simulated_s": scenario.duration_s,
            "wall_s": wall,
            "regions": len(scenario.regions),
            "policy": "headroom",
            "jobs": jobs,
            "cores": usable_cores(),
            "one_process_x": scenario.duration_s / one,
            "one_process_wall_s": one,
        },
    )


LOG_GOAL_MB = 100.0
LOG_HOURS = 3.0


def sim_event_log_mb_day(ctx: BenchContext) -> BenchResult:
    from headroom.sim.policies import POLICIES
    from headroom.sim.run import run_simulation
    from headroom.sim.runtime import estimate_run
    from headroom.world.curves import curves_for

    day = load_scenario(_scenario_path("diurnal-3region"))
    policies = list(POLICIES)
    compress = estimate_run(day, policies).compress  # what `simulate` decides for the whole day
    hours = 0.5 if ctx.quick else LOG_HOURS
    scenario = dataclasses.replace(day, duration_s=3600.0 * hours)
    curves = curves_for(scenario)
    with tempfile.TemporaryDirectory() as tmp:
        started = time.perf_counter()
        run = run_simulation(
            scenario, policies, Path(tmp), curves=curves, plots=False, compress_events=compress
        )
        wall = time.perf_counter() - started
        size = run.events_path.stat().st_size
        plain = sum(len(line) for line in _plain_lines(run.events_path))
    scale = day.duration_s / scenario.duration_s
    return BenchResult(
        value=size * scale / 1e6,
        unit="MB",
        goal=LOG_GOAL_MB,
        extra={
            "simulated_s": scenario.duration_s,
            "scaled_to_s": day.duration_s,
            "policies": len(policies),
            "regions": len(day.regions),
            "compressed": compress,
            "plain_mb_day": plain * scale / 1e6,
            "wall_s": wall,
        },
    )


def _plain_lines(path: Path) -> list[bytes]:
    import gzip

    with open(path, "rb") as fh:
        head = fh.read(2)
    opener = gzip.open if head == b"\x1f\x8b" else open
    with opener(path, "rb") as fh:
        return list(fh)


BENCHMARKS = {
    "sim_speedup_diurnal_3region": sim_speedup_diurnal_3region,
    "sim_event_log_mb_day": sim_event_log_mb_day,
}
