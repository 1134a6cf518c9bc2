"""Benchmarks of the ranking world and its curves (docs/world.md).

* ``world_rank_ms`` — one live ranking of the quickstart scenario's world: retrieval over the
  20,000-ad corpus, the strong model over ``max_candidates`` (1,200) candidates, and the
  full-corpus normaliser of the quality; ms per request, best of a few rounds. What a ranking
  server's request costs in real numpy compute.
* ``curves_lookup_ns`` — ``ValueCurves.mean_quality`` on a batch of 100,000 requests (random
  segment, model and N), nanoseconds per request: what the simulator pays per request for its
  value. Goal ≤ 100 ns.
* ``curves_measure_s`` — measuring the curves of diurnal-3region (3 segments, 256 users each, 17
  candidate counts, both models), seconds, uncached. Goal ≤ 5 s ("a few seconds").

Each figure is the best of a few rounds: the least disturbed by other processes on a shared
machine.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from headroom.bench.runner import BenchContext, BenchResult
from headroom.kernel.scenario_load import load_scenario
from headroom.world.curves import measure_curves
from headroom.world.ranking import RankingWorld

SCENARIOS = Path(__file__).resolve().parent.parent / "scenarios"


def world_rank_ms(ctx: BenchContext) -> BenchResult:
    scenario = load_scenario(SCENARIOS / "quickstart.yaml")
    world = RankingWorld.from_scenario(scenario)
    n = scenario.world.max_candidates
    rounds, per_round = (2, 5) if ctx.quick else (5, 40)
    best = float("inf")
    user = 0
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(per_round):
            world.rank(user, user % len(scenario.segments), n, "strong")
            user += 1
        best = min(best, (time.perf_counter() - start) / per_round)
    return BenchResult(value=round(best * 1e3, 4), unit="ms", extra={"candidates": n})


def curves_lookup_ns(ctx: BenchContext) -> BenchResult:
    scenario = load_scenario(SCENARIOS / "quickstart.yaml")
    curves = measure_curves(scenario, samples_per_segment=32)
    rng = np.random.default_rng(1)
    size = 10_000 if ctx.quick else 100_000
    seg = rng.integers(0, len(curves.segments), size)
    model = rng.integers(0, 2, size)
    n = rng.integers(curves.base_candidates, curves.max_candidates + 1, size)
    best = float("inf")
    for _ in range(3 if ctx.quick else 10):
        start = time.perf_counter()
        curves.mean_quality(seg, model, n)
        best = min(best, time.perf_counter() - start)
    return BenchResult(value=round(best / size * 1e9, 2), unit="ns", goal=100.0)


def curves_measure_s(ctx: BenchContext) -> BenchResult:
    scenario = load_scenario(SCENARIOS / "diurnal-3region.yaml")
    samples = 64 if ctx.quick else None
    best = float("inf")
    for _ in range(1 if ctx.quick else 2):
        start = time.perf_counter()
        measure_curves(scenario, samples_per_segment=samples)
        best = min(best, time.perf_counter() - start)
    return BenchResult(value=round(best, 3), unit="s", goal=5.0)


BENCHMARKS = {
    "world_rank_ms": world_rank_ms,
    "curves_lookup_ns": curves_lookup_ns,
    "curves_measure_s": curves_measure_s,
}
