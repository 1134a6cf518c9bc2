"""``headroom up SCENARIO [--out DIR] [--speed X]``: run the whole streaming stack on Kafka.

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
from pathlib import Path

from headroom.logs import configure
from headroom.scenario import Scenario
from headroom.scenario_load import load_scenario
from streams.kafka import KafkaTarget
from workers.up import StackConfig, UpResult, run_stack


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
        return await run_stack(config, scenario)
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)


def up(args: argparse.Namespace) -> int:
    configure()
    from analysis.cli import write_metrics
    from analysis.table import format_table

    scenario_path = Path(args.scenario).resolve()
    scenario = load_scenario(scenario_path)
    kafka = KafkaTarget.from_args(args)
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    out_dir = Path(args.out) if args.out else Path("runs") / f"{scenario.name}-up-{stamp}"
    config = StackConfig(
        scenario_path=scenario_path,
        out_dir=out_dir.resolve(),
        kafka=kafka,
        speed=float(args.speed or 1.0),
        interval_s=args.interval,
    )
    print(
        f"up: {scenario.name}, {scenario.duration_s:g} s of scenario at speed {config.speed:g} "
        f"against {kafka.bootstrap} (prefix {kafka.prefix}); logs in {config.out_dir / 'logs'}",
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
    print(format_table(result.metrics))
    if args.no_plots:
        print(f"metrics: {metrics_path}")
        return 0
    from analysis.report import write_report

    report = write_report(result.metrics, result.events_path, result.out_dir)
    print(f"metrics: {metrics_path}")
    print(f"report: {report}")
    return 0
