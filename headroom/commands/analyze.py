"""``headroom analyze EVENTS.jsonl [--out DIR] [--no-plots]``.

Reads any event log (docs/events.md) — written by the simulator or by the streaming workers —
and writes ``metrics.json`` (docs/analysis.md), the PNG plots and a self-contained ``report.html``
into ``--out`` (default: the log's directory). Prints the summary table and, as the last line, the
report's path (or the metrics path with ``--no-plots``).

Corrupt lines and lines of unknown kinds are counted and reported on stderr, never fatal. A missing
log, or a log that is not a headroom event log at all (no policy, no ``run.started``), exits 2.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from headroom.analysis.events import EventLog
from headroom.analysis.metrics import MetricsAccumulator, write_metrics
from headroom.analysis.table import closing_lines, format_table


def analyze(args: argparse.Namespace) -> int:
    events_path = Path(args.events)
    log = EventLog(events_path)  # ConfigError (exit 2) when missing
    out_dir = Path(args.out) if args.out else events_path.resolve().parent

    if getattr(args, "no_plots", False):
        acc = MetricsAccumulator()
        for event in log:
            acc.add(event)
        print(f"analyze: {log.stats.summary()}", file=sys.stderr)
        metrics = acc.result()
        metrics_path = write_metrics(metrics, out_dir / "metrics.json")
        print(format_table(metrics))
        print("\n".join(closing_lines(metrics, [("metrics", metrics_path)])))
        return 0

    from headroom.analysis.report import render_report
    from headroom.analysis.report_data import collect

    data = collect(log)  # one pass: the metrics and the report's series together
    data.stats = log.stats
    print(f"analyze: {log.stats.summary()}", file=sys.stderr)
    metrics = data.acc.result()
    metrics_path = write_metrics(metrics, out_dir / "metrics.json")
    print(format_table(metrics))
    report = render_report(metrics, data, events_path, out_dir)
    print("\n".join(closing_lines(metrics, [("metrics", metrics_path), ("report", report)])))
    return 0
