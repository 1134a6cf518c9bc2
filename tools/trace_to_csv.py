#!/usr/bin/env python3
"""Turn public cluster and web traces into headroom scenario CSV traces.

Standard library only (no headroom, no numpy), so it runs anywhere Python 3.11 does. Each
subcommand writes one CSV in the format scenario files read (docs/scenarios.md):
``t_s,rps`` for traffic, ``t_s,units`` for capacity levels, ``t_s`` from 0.

worldcup
    HTTP requests per minute to the 1998 FIFA World Cup web site (ITA WorldCup98 logs, as
    aggregated by nimamahmoudi/worldcup98-dataset, MIT). A window of ``--hours`` starting at
    ``--start`` is scaled so that its busiest minute is ``--peak-rps``; duplicate minutes in the
    source are summed, as its README says. Output: one row per minute (or per ``--step-s``,
    averaging the minutes inside each step).

google-pool
    Google cluster-usage traces 2011 (CC-BY 4.0), machine events. A window of ``--hours``
    starting ``--start-h`` hours into the trace; the pool is the machines REMOVEd in the
    ``--burst-rank``-th largest ``--burst-s`` burst of REMOVE events inside the window (at most
    ``--machines`` of them, the first removed first). Each machine is present from the window's
    start (or its ADD) until its REMOVE and again after a later ADD, so the pool's level follows
    the owner's real reclaims and returns. Level = ``--units`` × (machines present / machines in
    the pool), rounded to ``--round``; a row is written whenever the level changes.

alibaba-gpus
    Alibaba cluster-trace-gpu-v2023 nodes (CC-BY 4.0): prints the GPU models and how many nodes
    and GPUs of each the cluster has, to choose realistic accelerator ``hardware`` names.

Examples (the commands that built scenarios/traces/ are in docs/scenarios.md)::

    python tools/trace_to_csv.py worldcup --start "1998-06-18 00:00" --hours 24 \\
        --peak-rps 450 --out scenarios/traces/worldcup98-eu-west-rps.csv
    python tools/trace_to_csv.py google-pool --start-h 600 --hours 24 --burst-rank 1 \\
        --machines 40 --units 12 --out scenarios/traces/google2011-eu-west-cpu.csv
"""

from __future__ import annotations

import argparse
import csv
import itertools
import math
import os
import sys
from collections import Counter, defaultdict
from datetime import datetime, timedelta
from pathlib import Path

# where the downloaded public traces sit: $HEADROOM_TRACES, else a folder traces/ in the current one
DEFAULT_TRACES = Path(os.environ.get("HEADROOM_TRACES", "traces"))
GOOGLE_ADD, GOOGLE_REMOVE = 0, 1


def _fail(message: str) -> None:
    print(f"trace_to_csv: {message}", file=sys.stderr)
    raise SystemExit(2)


def _write(path: Path, header: tuple[str, str], rows: list[tuple[float, float]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(header)
        for t, v in rows:
            w.writerow([f"{t:g}", f"{v:.6g}"])
    print(f"wrote {path} ({len(rows)} rows)", file=sys.stderr)


# ------------------------------------------------------------------------------------------------


def worldcup(args: argparse.Namespace) -> None:
    source = Path(args.source or DEFAULT_TRACES / "worldcup98_requests_per_minute.csv")
    try:
        start = datetime.strptime(args.start, "%Y-%m-%d %H:%M")
    except ValueError:
        _fail(f"--start: expected 'YYYY-MM-DD HH:MM', got {args.start!r}")
    end = start + timedelta(hours=args.hours)
    per_minute: Counter[datetime] = Counter()
    with source.open(newline="") as f:
        for row in csv.DictReader(f):
            t = datetime.strptime(row["period"], "%Y-%m-%d %H:%M:%S")
            if start <= t < end:
                per_minute[t] += int(row["count"])  # a minute may appear twice: sum them
    minutes = int(args.hours * 60)
    counts = [per_minute.get(start + timedelta(minutes=i), 0) for i in range(minutes)]
    missing = sum(1 for i in range(minutes) if start + timedelta(minutes=i) not in per_minute)
    if missing:
        print(f"note: {missing} minutes absent from the source are counted as 0", file=sys.stderr)
    if not any(counts):
        _fail(f"no requests in {args.start} + {args.hours} h")
    step = max(1, round(args.step_s / 60))
    rows: list[tuple[float, float]] = []
    for i in range(0, minutes, step):
        chunk = counts[i : i + step]
        rows.append((i * 60.0, sum(chunk) / len(chunk)))
    scale = args.peak_rps / max(v for _, v in rows)
    _write(Path(args.out), ("t_s", "rps"), [(t, v * scale) for t, v in rows])
    mean = sum(v for _, v in rows) / len(rows) * scale
    print(
        f"peak {args.peak_rps:g} rps, mean {mean:.1f} rps, scale {scale:.6g} rps per "
        "request/minute",
        file=sys.stderr,
    )


# ------------------------------------------------------------------------------------------------


def google_pool(args: argparse.Namespace) -> None:
    source = Path(args.source or DEFAULT_TRACES / "google2011_machine_events.csv")
    w0 = args.start_h * 3600.0
    events = _google_events(source, w0, w0 + args.hours * 3600.0)
    pool = _google_burst_pool(events, args)
    out = _google_levels(events, pool, args)
    _write(Path(args.out), ("t_s", "units"), out)
    drops = sum(1 for a, b in itertools.pairwise(out) if b[1] < a[1])
    print(
        f"{len(out)} levels, {drops} steps down, min {min(v for _, v in out):g}, "
        f"max {max(v for _, v in out):g}",
        file=sys.stderr,
    )


def _google_events(source: Path, w0: float, w1: float) -> list[tuple[float, int, int]]:
    """The ADD and REMOVE machine events in the window [w0, w1) s, as (t_s in the window,
    machine, type), in time order."""
    events: list[tuple[float, int, int]] = []
    with source.open(newline="") as f:
        for row in csv.reader(f):
            if not row or row[0].startswith("#"):
                continue
            t = float(row[0]) / 1e6
            kind = int(row[2])
            if kind in (GOOGLE_ADD, GOOGLE_REMOVE) and w0 <= t < w1:
                events.append((t - w0, int(row[1]), kind))
    events.sort()
    return events


def _google_burst_pool(events: list[tuple[float, int, int]], args: argparse.Namespace) -> list[int]:
    """The pool: the machines REMOVEd in the ``--burst-rank``-th largest ``--burst-s`` burst,
    at most ``--machines`` of them, the first removed first."""
    removes = [(t, m) for t, m, k in events if k == GOOGLE_REMOVE]
    if not removes:
        _fail("no REMOVE events in the window")
    bursts: dict[int, list[tuple[float, int]]] = defaultdict(list)
    for t, m in removes:
        bursts[int(t // args.burst_s)].append((t, m))
    ranked = sorted(bursts.items(), key=lambda kv: (-len(kv[1]), kv[0]))
    if args.burst_rank > len(ranked):
        _fail(f"--burst-rank {args.burst_rank}: the window has only {len(ranked)} bursts")
    index, burst = ranked[args.burst_rank - 1]
    pool: list[int] = []
    for _, m in burst:
        if m not in pool:
            pool.append(m)
    pool = pool[: args.machines]
    print(
        f"burst #{args.burst_rank}: {len(burst)} REMOVE events in "
        f"[{index * args.burst_s:g}, {(index + 1) * args.burst_s:g}) s; pool of {len(pool)} "
        "machines",
        file=sys.stderr,
    )
    return pool


def _google_levels(
    events: list[tuple[float, int, int]], pool: list[int], args: argparse.Namespace
) -> list[tuple[float, float]]:
    """The pool's level over the window, a row whenever it changes (whole seconds)."""
    members = set(pool)
    # A machine whose first event in the window is an ADD was absent before it.
    present: dict[int, bool] = {}
    for _t, m, k in events:
        if m in members and m not in present:
            present[m] = k == GOOGLE_REMOVE
    for m in pool:
        present.setdefault(m, True)

    def level() -> float:
        share = sum(present.values()) / len(pool)
        return round(args.units * share / args.round) * args.round

    rows: list[tuple[float, float]] = [(0.0, level())]
    for t, m, k in events:
        if m not in members:
            continue
        present[m] = k == GOOGLE_ADD
        v = level()
        t_row = math.floor(t)  # the source has ~1-10 s precision; whole seconds are honest
        if rows[-1][0] == t_row:
            rows[-1] = (t_row, v)
        elif v != rows[-1][1]:
            rows.append((float(t_row), v))
    # Collapse rows that a same-second update turned into repeats.
    out: list[tuple[float, float]] = []
    for t, v in rows:
        if not out or v != out[-1][1]:
            out.append((t, v))
    return out


# ------------------------------------------------------------------------------------------------


def alibaba_gpus(args: argparse.Namespace) -> None:
    source = Path(args.source or DEFAULT_TRACES / "alibaba_gpu2023_nodes.csv")
    nodes: Counter[str] = Counter()
    gpus: Counter[str] = Counter()
    with source.open(newline="") as f:
        for row in csv.DictReader(f):
            model = row["model"] or "(none)"
            nodes[model] += 1
            gpus[model] += int(row["gpu"] or 0)
    print("model,nodes,gpus")
    for model, n in nodes.most_common():
        print(f"{model},{n},{gpus[model]}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="trace_to_csv.py",
        description="Turn public traces into headroom scenario CSVs (t_s,rps or t_s,units).",
    )
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("worldcup", help="WorldCup98 requests per minute -> t_s,rps")
    p.add_argument(
        "--source", help="worldcup98_requests_per_minute.csv (default: in $HEADROOM_TRACES)"
    )
    p.add_argument("--start", required=True, help="window start, 'YYYY-MM-DD HH:MM'")
    p.add_argument("--hours", type=float, default=24.0, help="window length (default 24)")
    p.add_argument("--peak-rps", type=float, required=True, help="the busiest step's rate")
    p.add_argument("--step-s", type=float, default=60.0, help="row spacing (default 60)")
    p.add_argument("--out", required=True, help="CSV to write")
    p.set_defaults(func=worldcup)

    p = sub.add_parser("google-pool", help="Google 2011 machine events -> t_s,units")
    p.add_argument("--source", help="google2011_machine_events.csv (default: in $HEADROOM_TRACES)")
    p.add_argument("--start-h", type=float, required=True, help="window start, trace hours")
    p.add_argument("--hours", type=float, default=24.0, help="window length (default 24)")
    p.add_argument("--burst-s", type=float, default=300.0, help="burst bucket (default 300 s)")
    p.add_argument("--burst-rank", type=int, default=1, help="1 = the largest burst")
    p.add_argument("--machines", type=int, default=40, help="pool size cap (default 40)")
    p.add_argument("--units", type=float, required=True, help="level with every machine present")
    p.add_argument("--round", type=float, default=0.5, help="level granularity (default 0.5)")
    p.add_argument("--out", required=True, help="CSV to write")
    p.set_defaults(func=google_pool)

    p = sub.add_parser("alibaba-gpus", help="Alibaba GPU 2023 nodes: GPU models and counts")
    p.add_argument("--source", help="alibaba_gpu2023_nodes.csv (default: in $HEADROOM_TRACES)")
    p.set_defaults(func=alibaba_gpus)

    args = parser.parse_args(argv)
    for name in ("hours", "peak_rps", "step_s", "burst_s", "units", "round"):
        value = getattr(args, name, None)
        if value is not None and not (value > 0 and math.isfinite(value)):
            _fail(f"--{name.replace('_', '-')}: must be a positive number, got {value}")
    for name in ("burst_rank", "machines"):
        value = getattr(args, name, None)
        if value is not None and value < 1:
            _fail(f"--{name.replace('_', '-')}: must be >= 1, got {value}")
    try:
        args.func(args)
    except FileNotFoundError as exc:
        _fail(f"{exc.filename}: no such file (pass --source)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
