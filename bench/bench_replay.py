"""Benchmark of recordings into the simulator (docs/replay.md).

* ``replay_msgs_per_s`` — recorded messages per second from a file on disk to a simulator
  context ready to run (:func:`headroom.sim.replay.replay_context`: both streaming passes, the
  derived scenario, the recorded population and traces). The recording is ten minutes of the
  quickstart scenario as ``headroom feed`` publishes it (118,154 messages, 36 MB; ``--quick``: two
  minutes), written by :func:`headroom.sim.replay.write_feed_recording`. ``baseline``: the same file
  through :func:`headroom.streams.recording.read_recording` alone (envelopes parsed once, nothing
  decoded), in the same run; ``ratio`` = replay / baseline. The value curves are measured (or
  taken from the cache) before the clock starts: they are the scenario's, not the recording's.

Best of a few rounds: the least disturbed by other processes on a shared machine.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

from headroom.bench.runner import BenchContext, BenchResult
from headroom.kernel.scenario_load import load_scenario
from headroom.sim.replay import replay_context, write_feed_recording
from headroom.streams.recording import read_recording
from headroom.world.curves import curves_for

SCENARIOS = Path(__file__).resolve().parent.parent / "scenarios"


def replay_msgs_per_s(ctx: BenchContext) -> BenchResult:
    scenario = load_scenario(SCENARIOS / "quickstart.yaml")
    curves = curves_for(scenario)
    seconds = 120.0 if ctx.quick else 600.0
    rounds = 1 if ctx.quick else 3
    with tempfile.TemporaryDirectory(prefix="bench-replay-") as tmp:
        path = Path(tmp) / "quickstart.jsonl"
        with path.open("wb") as f:
            written = write_feed_recording(scenario, f, duration_s=seconds)
        n = sum(written.values())
        best = best_parse = float("inf")
        for _ in range(rounds):
            start = time.perf_counter()
            with path.open("rb") as f:
                for _item in read_recording(f):
                    pass
            best_parse = min(best_parse, time.perf_counter() - start)
            start = time.perf_counter()
            _, rctx = replay_context(scenario, path, curves=curves)
            best = min(best, time.perf_counter() - start)
            assert rctx.recording.requests == written["requests"]
        size = path.stat().st_size
    value = n / best
    baseline = n / best_parse
    return BenchResult(
        value=round(value),
        unit="msg/s",
        baseline=round(baseline),
        ratio=round(value / baseline, 3),
        extra={"messages": n, "file_bytes": size, "recorded_s": seconds},
    )


BENCHMARKS = {"replay_msgs_per_s": replay_msgs_per_s}
