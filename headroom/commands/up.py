"""``headroom up SCENARIO [--out DIR] [--speed X] [--interval S] [--ttl S] [--controllers N]
[--clients-per-region M]``: run the whole streaming stack on Kafka, its controller on the
scenario's control clock (``control``; the flags override it, in scenario seconds).
``--controllers N`` runs N controller processes that split the regions, ``--clients-per-region M``
M clients per region that split its requests (both integers >= 1, default 1; docs/streaming.md,
*Scaling out*).

Writes ``DIR/events.jsonl``, ``DIR/metrics.json`` (policy ``headroom``), the plots and
``DIR/report.html`` (like ``simulate``), prints the summary table and, last, the report path (or the
metrics path with ``--no-plots``). Without a reachable broker it exits 1 saying how to start one.
SIGINT (Ctrl-C) or SIGTERM stop every process it started and exit 130.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from headroom.analysis.events import EventLog
from headroom.analysis.metrics import compute_metrics
from headroom.kernel.logs import configure, get_logger
from headroom.kernel.scenario import Scenario
from headroom.kernel.scenario_load import control_with_flags, load_scenario
from headroom.kernel.settings import resolve_scenario
from headroom.streams.kafka import KafkaTarget
from headroom.workers.up import Action, Stack, StackConfig, run_stack

__all__ = ["UpResult", "oracle_events", "run_up", "up"]

log = get_logger("up")


@dataclass
class UpResult:
    out_dir: Path
    events_path: Path
    metrics: dict[str, Any]
    stack: Stack


async def run_up(
    config: StackConfig,
    scenario: Scenario,
    *,
    actions: Sequence[tuple[float, Action]] = (),
) -> UpResult:
    """What ``headroom up`` does: run the stack (:func:`headroom.workers.up.run_stack`), add the
    oracle's bound from the simulator, and compute the metrics of the collected events."""
    stack = await run_stack(config, scenario, actions=actions)
    oracle = oracle_events(scenario)
    if oracle:
        stack.add_events(oracle)
    metrics = compute_metrics(EventLog(stack.events_path))
    return UpResult(config.out_dir, stack.events_path, metrics, stack)


def oracle_events(scenario: Scenario) -> list[dict[str, Any]]:
    """The ``oracle.bound`` line: the simulator's oracle on this scenario. The feed plays the
    simulator's own traffic draw (same seed, same arrivals per second), so the bound is for the
    requests this run served. Nothing when the simulator cannot compute it here."""
    try:
        from headroom.sim.oracle import oracle_for
        from headroom.sim.run import build_context

        oracle = oracle_for(build_context(scenario))
        bound = oracle.bound()
        feasible = oracle.feasible()
    except Exception as exc:  # a reference figure: never fail the run for it
        log.warning("up.oracle.unavailable", error=f"{type(exc).__name__}: {exc}")
        return []
    return [
        {
            "v": 1,
            "ts": time.time(),
            "kind": "oracle.bound",
            "source": "sim",
            "policy": "headroom",
            "region": None,
            "oracle_incremental": float(bound.total),
            "by_lever": dict(bound.by_lever),
            "feasible_bound": float(feasible.total),
            "feasible_by_lever": dict(feasible.by_lever),
        }
    ]


async def _run_until_signal(config: StackConfig, scenario: Scenario) -> UpResult:
    """Run the stack; SIGINT/SIGTERM cancel it, which stops every process it started first
    (its children run in their own sessions, so a Ctrl-C reaches only `up`)."""
    task = asyncio.current_task()
    assert task is not None
    loop = asyncio.get_running_loop()
    interrupted = False

    def on_signal() -> None:
        nonlocal interrupted
        if not interrupted:  # a second Ctrl-C must not cut the clean-up short
            interrupted = True
            task.cancel()

    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, on_signal)
    try:
        return await run_up(config, scenario)
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)


def _security_text(kafka: KafkaTarget) -> str:
    """How the run talks to Kafka, for the start-up line (never a password)."""
    sec = kafka.security
    if sec.username is None:
        return sec.protocol
    return f"{sec.protocol} {sec.mechanism} as {sec.username}"


# a run expected to take longer than this says so at start
LONG_RUN_S = 60.0


def _minutes(seconds: float) -> str:
    if seconds >= 5400:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 60:.0f} min" if seconds >= 120 else f"{seconds:.0f} s"


def up(args: argparse.Namespace) -> int:
    configure()
    from headroom.analysis.metrics import incomplete_policies, write_metrics
    from headroom.analysis.table import closing_lines, format_table

    scenario_path = resolve_scenario(args.scenario).resolve()
    scenario = load_scenario(scenario_path)
    # the control clock (scenario seconds) of the scenario or of --interval / --ttl; bad values
    # exit 2 before any process starts
    control = control_with_flags(
        scenario.control,
        args.interval,
        getattr(args, "ttl", None),
        window_s=scenario.slo.window_s,
    )
    kafka = KafkaTarget.from_args(args)
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    out_dir = Path(args.out) if args.out else Path("runs") / f"{scenario.name}-up-{stamp}"
    config = StackConfig(
        scenario_path=scenario_path,
        out_dir=out_dir.resolve(),
        kafka=kafka,
        speed=float(args.speed or 1.0),
        interval_s=args.interval,
        ttl_s=getattr(args, "ttl", None),
        broker_state_dir=(
            Path(args.broker_state_dir).expanduser()
            if getattr(args, "broker_state_dir", None)
            else None
        ),
        controllers=int(getattr(args, "controllers", 1) or 1),
        clients_per_region=int(getattr(args, "clients_per_region", 1) or 1),
    )
    print(
        f"up: {scenario.name}, {scenario.duration_s:g} s of scenario at speed {config.speed:g} "
        f"against {kafka.bootstrap} (prefix {kafka.prefix}, {_security_text(kafka)}), control "
        f"every {control.interval_s:g} s (targets live {control.target_ttl_s:g} s), "
        f"{config.controllers} controller(s), {config.clients_per_region} client(s) per region; "
        "logs in "
        f"{config.out_dir / 'logs'}",
        file=sys.stderr,
        flush=True,
    )
    real_s = scenario.duration_s / config.speed  # the stack runs in real time (× speed)
    if real_s > LONG_RUN_S:
        print(
            f"up: this run takes about {_minutes(real_s)} of real time ({scenario.duration_s:g} "
            f"scenario s at speed {config.speed:g}), plus start-up and analysis; --speed X runs "
            "it X times faster",
            file=sys.stderr,
            flush=True,
        )
    try:
        result = asyncio.run(_run_until_signal(config, scenario))
    except asyncio.CancelledError:
        print(
            f"up: interrupted; every process it started was stopped (events and logs so far: "
            f"{config.out_dir})",
            file=sys.stderr,
        )
        return 130
    metrics_path = write_metrics(result.metrics, result.out_dir / "metrics.json")
    for name, problems in incomplete_policies(result.metrics).items():  # e.g. events lost
        print(f"up: policy {name} is incomplete: {'; '.join(problems)}", file=sys.stderr)
    print(format_table(result.metrics))
    if args.no_plots:
        print("\n".join(closing_lines(result.metrics, [("metrics", metrics_path)])))
        return 0
    from headroom.analysis.report import write_report

    report = write_report(result.metrics, result.events_path, result.out_dir)
    print("\n".join(closing_lines(result.metrics, [("metrics", metrics_path), ("report", report)])))
    return 0
