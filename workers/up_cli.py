"""``headroom up SCENARIO [--out DIR] [--speed X]``: run the whole streaming stack on Kafka.

Writes ``DIR/events.jsonl``, ``DIR/metrics.json`` (policy ``headroom``), the plots and
``DIR/report.html`` (like ``simulate``), prints the summary table and, last, the report path (or the
metrics path with ``--no-plots``). Without a reachable broker it exits 1 saying how to start one.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path

from headroom.logs import configure
from headroom.scenario_load import load_scenario
from streams.kafka import KafkaTarget


def up(args: argparse.Namespace) -> int:
    configure()
    from analysis.cli import write_metrics
    from analysis.table import format_table
    from workers.up import StackConfig, run_stack

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
    result = asyncio.run(run_stack(config, scenario))
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
