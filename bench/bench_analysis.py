"""Benchmark of the analyzer: how fast ``compute_metrics`` reads an event log from disk.

* ``analysis_windows_per_s`` — window lines per second through ``compute_metrics(EventLog(path))``
  (orjson parse, p99 of every window from its sketch, every sum of docs/analysis.md), one core. The
  log is synthetic but shaped like the diurnal 24 h × 3 regions × 7 policies run: one source per
  window, two sketches of ~120 bins each (latencies log-normal around 55 ms), holdout sums for 3
  segments × 3 arms, segment exposure, capacity and targets. Goal: the ~180k windows of that run in
  under 20 s, i.e. ≥ 9,000 windows/s. ``extra.diurnal_estimate_s`` extrapolates to 181,440 windows.

The log is written to a temporary file before the clock starts; the figure is the best of a few
rounds (the least disturbed by the other processes on a shared machine).
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

import numpy as np

from headroom.analysis.events import EventLog, EventWriter, pack_sketch
from headroom.analysis.metrics import compute_metrics
from headroom.analysis.testing import LogBuilder, arm
from headroom.bench.runner import BenchContext, BenchResult
from headroom.kernel.sketch import LatencySketch

_SEED = 20240601
DIURNAL_WINDOWS = 24 * 360 * 3 * 7  # 10 s windows, 3 regions, 7 policies
POLICIES = ("static", "greedy", "central-only", "aimd", "gradient", "headroom", "oracle")
REGIONS = ("us-east", "eu-west", "ap-south")
SEGMENTS = ("premium", "casual", "new")


def write_log(path: Path, windows: int) -> int:
    """A diurnal-shaped event log of about ``windows`` window lines; returns how many."""
    rng = np.random.default_rng(_SEED)
    log = LogBuilder(regions=REGIONS, segments=SEGMENTS, duration_s=86400.0)
    # the sketches as a window line writes them (packed, docs/events.md)
    pool = [
        pack_sketch(LatencySketch.from_values(rng.lognormal(4.0, 0.35, 3000)).to_dict())
        for _ in range(32)
    ]
    arms = {
        s: {
            "control": arm(list(rng.normal(1.0, 0.5, 60))),
            "rma": arm(list(rng.normal(1.1, 0.5, 900))),
            "sbm": arm(list(rng.normal(1.2, 0.5, 300))),
        }
        for s in SEGMENTS
    }
    per_stream = max(1, windows // (len(POLICIES) * len(REGIONS)))
    written = 0
    with EventWriter(path) as out:
        for policy in POLICIES:
            out.write(log.run_started(policy))
            out.write(log.oracle(policy, 1e5))
        for i in range(per_stream):
            for policy in POLICIES:
                for region in REGIONS:
                    e = log.window(
                        policy,
                        region,
                        10.0 * i,
                        requests=3000,
                        value_total=3100.0,
                        value_baseline=3000.0,
                        inc={"rma": 60.0, "sbm": 40.0},
                        arms=arms,
                        segments={s: {"requests": 1000, "sbm": 100, "inc": 33.3} for s in SEGMENTS},
                        offered={"cpu": 80.0, "accelerator": 20.0},
                        used={"cpu": 40.0, "accelerator": 10.0},
                        targets={"rma_candidates": 700, "sbm_coverage": 0.2},
                        capacity={"cpu": 8.0, "accelerator": 2.0},
                    )
                    e["sketch"] = pool[int(rng.integers(len(pool)))]
                    e["sketch_base"] = pool[int(rng.integers(len(pool)))]
                    out.write(e)
                    written += 1
            log.events.clear()
    return written


def bench_analysis_windows_per_s(ctx: BenchContext) -> BenchResult:
    windows = 4_200 if ctx.quick else 42_000
    rounds = 1 if ctx.quick else 3
    with tempfile.TemporaryDirectory(prefix="headroom-bench-") as tmp:
        path = Path(tmp) / "events.jsonl"
        n = write_log(path, windows)
        size = path.stat().st_size
        best = 0.0
        for _ in range(rounds):
            start = time.perf_counter()
            compute_metrics(EventLog(path))
            best = max(best, n / (time.perf_counter() - start))
    return BenchResult(
        value=round(best, 1),
        unit="windows/s",
        goal=DIURNAL_WINDOWS / 20.0,
        extra={
            "windows": n,
            "bytes_per_window": round(size / n),
            "diurnal_estimate_s": round(DIURNAL_WINDOWS / best, 2),
        },
    )


BENCHMARKS = {"analysis_windows_per_s": bench_analysis_windows_per_s}
