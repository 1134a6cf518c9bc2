"""``headroom analyze EVENTS.jsonl [--out DIR] [--no-plots] [--partial]``.

Reads any event log (docs/events.md) — written by the simulator or by the streaming workers —
and writes ``metrics.json`` (docs/analysis.md), the PNG plots and a self-contained ``report.html``
into ``--out`` (default: the log's directory). Prints the summary table and, as the last line, the
report's path (or the metrics path with ``--no-plots``).

Corrupt lines and lines of unknown kinds are counted and reported on stderr. A missing log, or a
log that is not a headroom event log at all (no policy, no ``run.started``), exits 2.

A policy whose run is incomplete — no ``run.finished`` line, windows missing or stopping short of
the run's duration, or corrupt lines that name it — is named on stderr with what is missing, and
``analyze`` exits 1 without writing anything, unless ``--partial`` is given: then the outputs are
written with ``complete: false`` and ``duration_s`` the span the windows cover for that policy.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from headroom.analysis.events import EventLog
from headroom.analysis.metrics import MetricsAccumulator, incomplete_policies, write_metrics
from headroom.analysis.table import closing_lines, format_table


def analyze(args: argparse.Namespace) -> int:
    events_path = Path(args.events)
    log = EventLog(events_path)  # ConfigError (exit 2) when missing
    out_dir = Path(args.out) if args.out else events_path.resolve().parent
    partial = bool(getattr(args, "partial", False))

    if getattr(args, "no_plots", False):
        acc = MetricsAccumulator()
        for event in log:
            acc.add(event)
        print(f"analyze: {log.stats.summary()}", file=sys.stderr)
        metrics = acc.result(log.stats)
        if not _complete_enough(metrics, partial):
            return 1
        metrics_path = write_metrics(metrics, out_dir / "metrics.json")
        print(format_table(metrics))
        print("\n".join(closing_lines(metrics, [("metrics", metrics_path)])))
        return 0

    from headroom.analysis.report import render_report
    from headroom.analysis.report_data import collect

    data = collect(log)  # one pass: the metrics and the report's series together
    data.stats = log.stats
    print(f"analyze: {log.stats.summary()}", file=sys.stderr)
    metrics = data.acc.result(log.stats)
    if not _complete_enough(metrics, partial):
        return 1
    metrics_path = write_metrics(metrics, out_dir / "metrics.json")
    print(format_table(metrics))
    report = render_report(metrics, data, events_path, out_dir)
    print("\n".join(closing_lines(metrics, [("metrics", metrics_path), ("report", report)])))
    return 0


def _complete_enough(metrics: Mapping[str, Any], partial: bool) -> bool:
    """Name every incomplete policy on stderr; False (exit 1) when there is one and not
    ``--partial``."""
    incomplete = incomplete_policies(metrics)
    for name, problems in incomplete.items():
        print(f"analyze: policy {name} is incomplete: {'; '.join(problems)}", file=sys.stderr)
    if not incomplete:
        return True
    names = ", ".join(incomplete)
    if partial:
        print(
            f"analyze: --partial: writing {names} with complete: false (its figures cover only "
            "the span its windows cover)",
            file=sys.stderr,
        )
        return True
    print(
        f"analyze: incomplete run ({names}): nothing written; pass --partial to analyse what "
        "the log holds",
        file=sys.stderr,
    )
    return False
