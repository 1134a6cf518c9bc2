"""Run several policies on one scenario and seed: events, metrics, report.

Pure apart from writing its output files: no wall clock (pass ``clock`` to have ``run.finished``
carry the wall time a policy took), no global random state. Every policy is simulated against
the same :class:`headroom.sim.engine.SimContext` — the same requests, noise and capacity (common
random numbers) — and the oracle's bound is computed once and written for every policy.

The metrics are computed the way ``headroom analyze`` computes them: by reading back the event
log this run wrote (:func:`headroom.analysis.metrics.compute_metrics`), so ``analyze`` on the same
log gives the same ``metrics.json``.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from headroom.analysis.events import EventLog, EventWriter
from headroom.analysis.metrics import compute_metrics
from headroom.kernel.scenario import Scenario
from headroom.sim.config import SimConfig
from headroom.sim.context import Curves, SimContext
from headroom.sim.engine import run_policy
from headroom.sim.fanout import default_jobs
from headroom.sim.oracle import oracle_for
from headroom.sim.policies import POLICIES, PolicyFactory
from headroom.sim.runtime import estimate_run

__all__ = ["RunResult", "build_context", "run_simulation"]

ProgressFn = Callable[[str, int, int], None]


@dataclass(frozen=True, slots=True)
class RunResult:
    out_dir: Path
    events_path: Path
    metrics_path: Path
    metrics: dict[str, Any]
    report_path: Path | None


def build_context(
    scenario: Scenario,
    *,
    seed: int | None = None,
    config: SimConfig | None = None,
    curves: Curves | None = None,
    control_curves: Curves | None = None,
) -> SimContext:
    """The shared context of a run; the value curves are measured on the scenario's world (for
    ``seed`` when given) or taken from the cache (:func:`headroom.world.curves.curves_for`).
    ``control_curves``: the curves the control plane plans RMA with, if not these
    (:class:`headroom.sim.context.SimContext`)."""
    if curves is None:
        from headroom.world.curves import curves_for

        curves = curves_for(scenario, seed=seed)
    if scenario.eligible_share is not None:  # the scenario's own share of eligible requests
        config = (config or SimConfig()).with_overrides(eligible_share=scenario.eligible_share)
    return SimContext(scenario, curves, seed=seed, config=config, control_curves=control_curves)


def run_simulation(
    scenario: Scenario,
    policies: Sequence[str],
    out_dir: Path,
    *,
    seed: int | None = None,
    config: SimConfig | None = None,
    curves: Curves | None = None,
    context: SimContext | None = None,
    plots: bool = True,
    progress: ProgressFn | None = None,
    clock: Callable[[], float] | None = None,
    compress_events: bool | None = None,
    jobs: int | None = None,
) -> RunResult:
    """Simulate ``policies`` side by side and write ``events.jsonl``, ``metrics.json`` and (with
    ``plots``) the PNG plots and ``report.html`` into ``out_dir``. ``compress_events``: write the
    log gzip-compressed (None: when its plain size would exceed
    :data:`headroom.sim.runtime.COMPRESS_ABOVE_BYTES`, i.e. long runs). ``jobs``: processes
    simulating a policy's regions side by side (None: :func:`headroom.sim.fanout.default_jobs`;
    the log is the same whatever the number)."""
    unknown = [p for p in policies if p not in POLICIES]
    if unknown:
        raise ValueError(f"unknown policies {unknown} (known: {', '.join(POLICIES)})")
    ctx = context or build_context(scenario, seed=seed, config=config, curves=curves)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    events_path = out_dir / "events.jsonl"
    if compress_events is None:
        compress_events = estimate_run(scenario, policies, duration_s=ctx.duration_s).compress
    if jobs is None:
        jobs = default_jobs(len(ctx.regions))
    oracle = oracle_for(ctx)
    with EventWriter(events_path, compress=compress_events) as writer:
        writer.write(
            {
                "v": 1,
                "ts": ctx.t0,
                "kind": "run.started",
                "source": "sim",
                "policy": None,
                "region": None,
                "scenario": scenario.name,
                "seed": ctx.seed,
                "duration_s": ctx.duration_s,
                "t0": ctx.t0,
                "slo": {"p99_ms": scenario.slo.p99_ms, "window_s": scenario.slo.window_s},
                "segments": list(ctx.segment_names),
                "regions": [r.name for r in scenario.regions],
                # precompute only where the scenario has its fields (sim/precompute_sim.py)
                "levers": ["rma", "sbm", "precompute"]
                if scenario.precompute_enabled
                else ["rma", "sbm"],
                "precompute_enabled": bool(scenario.precompute_enabled),
                "policies": list(policies),
            }
        )

        def write_bound(name: str) -> None:
            """The oracle's bounds, before the policy's events. They are computed once, while
            the first policy's regions run (their processes do not need them)."""
            bound = oracle.bound()
            feasible = oracle.feasible()
            writer.write(
                {
                    "v": 1,
                    "ts": ctx.t0,
                    "kind": "oracle.bound",
                    "source": "sim",
                    "policy": name,
                    "region": None,
                    "oracle_incremental": bound.total,
                    "by_lever": dict(bound.by_lever),
                    "relief": bound.relief,
                    "by_region": {
                        r.name: v for r, v in zip(scenario.regions, bound.per_region, strict=True)
                    },
                    # the bound under the engine's own rules (sim/oracle.py, *feasible bound*)
                    "feasible_bound": feasible.total,
                    "feasible_by_lever": dict(feasible.by_lever),
                }
            )

        for name in policies:
            factory = PolicyFactory(name, ctx)
            started = clock() if clock is not None else None

            def tick(done: int, total: int, name: str = name) -> None:
                if progress is not None:
                    progress(name, done, total)

            run_policy(
                ctx,
                name,
                factory.region,
                writer.write,
                control_interval_s=factory.interval_s,
                progress=tick,
                jobs=jobs,
                meanwhile=functools.partial(write_bound, name),
            )
            finished: dict[str, Any] = {
                "v": 1,
                "ts": ctx.t0 + ctx.duration_s,
                "kind": "run.finished",
                "source": "sim",
                "policy": name,
                "region": None,
                "sim_s": ctx.duration_s,
                "wall_s": (clock() - started)
                if clock is not None and started is not None
                else None,
            }
            writer.write(finished)
    metrics = compute_metrics(EventLog(events_path))
    from headroom.analysis.metrics import write_metrics

    metrics_path = write_metrics(metrics, out_dir / "metrics.json")
    report_path = None
    if plots:
        from headroom.analysis.report import write_report

        report_path = write_report(metrics, events_path, out_dir)
    return RunResult(out_dir, events_path, metrics_path, metrics, report_path)
