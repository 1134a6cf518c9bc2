"""Precompute benchmarks: jobs per second per core, and the look-up cost per request.

``precompute_jobs_per_s_per_core`` — what one core of a precompute worker delivers: the
planner picks users (:class:`headroom.controllers.precompute.PrecomputePlanner` over a book of about
66,000 users: 100,000 draws among the scenario's 111,000), the real strong-model ranking of the
reference scenario's world runs for them in batches of 64 (corpus scan of 20,000 ads, top-400
selection, the strong model's forward pass: :func:`headroom.workers.precompute.rank_batch`), and
each result becomes a validated, encoded ``headroom.precompute`` message. Jobs per *CPU* second of
the process (``time.process_time``), so BLAS threads cannot inflate it; the wall-clock rate and
the planner's share are reported beside.

``precompute_lookup_us`` — the client's cost per request: :meth:`PrecomputeCache.visit` (look-up,
expiry check, hit accounting) on a cache of 100,000 results, half of the requests hitting;
amortised over the loop. The pure read (:meth:`PrecomputeCache.lookup`) is reported beside.
"""

from __future__ import annotations

import time

import numpy as np

from headroom.bench.runner import BenchContext, BenchResult
from headroom.controllers.precompute import PrecomputeConfig, PrecomputePlanner, UpliftModel
from headroom.kernel.scenario_load import load_scenario
from headroom.kernel.settings import PACKAGE_DIR
from headroom.streams import messages
from headroom.workers.precompute import rank_batch
from headroom.workers.precompute_lookup import PrecomputeCache
from headroom.world.ranking import RankingWorld

SCENARIO = PACKAGE_DIR.parent / "scenarios" / "precompute-remote.yaml"
BOOK_USERS = 100_000
BATCH = 64


def jobs_per_s_per_core(ctx: BenchContext) -> BenchResult:
    from headroom.world.curves import curves_for

    scenario = load_scenario(SCENARIO)
    world = RankingWorld.from_scenario(scenario)
    cfg = PrecomputeConfig.from_scenario(scenario)
    planner = PrecomputePlanner(
        cfg, UpliftModel.from_curves(curves_for(scenario), cfg), np.random.default_rng(0)
    )
    rng = np.random.default_rng(1)
    users = rng.integers(0, scenario.world.users or BOOK_USERS, BOOK_USERS)
    segments = (rng.random(BOOK_USERS) < 0.85).astype(int)
    for u, s in zip(users.tolist(), segments.tolist(), strict=True):
        planner.users.observe(u, s, 0.0)
    cost = messages.Cost(
        cpu_ms=cfg.job_cost.cpu_s * 1e3, accelerator_ms=cfg.job_cost.accelerator_s * 1e3
    )
    rounds = 3 if ctx.quick else 20
    rank_batch(world, [1, 2], 1, cfg.candidates, 0.0, cfg.keep)  # warm-up: caches, BLAS
    jobs = 0
    select_cpu = 0.0
    t = 3600.0
    wall0 = time.perf_counter()
    cpu0 = time.process_time()
    for _ in range(rounds):
        t += 1.0
        s0 = time.process_time()
        picks = planner.select(t, BATCH)
        select_cpu += time.process_time() - s0
        by_seg: dict[int, list[int]] = {}
        for p in picks:
            by_seg.setdefault(p.segment, []).append(p.user)
            planner.users.set_inflight(p.user, True)
        for seg, ids in by_seg.items():
            for user, ranking in zip(
                ids, rank_batch(world, ids, seg, cfg.candidates, t, cfg.keep), strict=True
            ):
                msg = messages.Precompute(
                    ts=t,
                    region="us-east",
                    user=user,
                    segment=cfg.segment_names[seg],
                    model="strong",
                    expires_at=t + planner.uplift.lifetime(seg),
                    ranking=ranking,
                    cost=cost,
                )
                messages.encode(msg)
                jobs += 1
    cpu = time.process_time() - cpu0
    wall = time.perf_counter() - wall0
    return BenchResult(
        value=round(jobs / cpu, 1),
        unit="jobs/s/core",
        extra={
            "jobs": jobs,
            "wall_jobs_per_s": round(jobs / wall, 1),
            "planner_share_of_cpu": round(select_cpu / cpu, 3),
            "candidates_per_job": cfg.candidates,
            "ads": scenario.world.ads,
            "book_users": len(planner.users),
        },
    )


def lookup_us(ctx: BenchContext) -> BenchResult:
    region = "us-east"
    cache = PrecomputeCache(region)
    cost = messages.Cost(cpu_ms=42.0, accelerator_ms=40.0)
    n_results = 20_000 if ctx.quick else BOOK_USERS
    for user in range(n_results):
        msg = messages.Precompute(
            ts=0.0,
            region=region,
            user=user,
            segment="casual",
            model="strong",
            expires_at=1e9,
            ranking=(1, 2, 3, 4),
            cost=cost,
        )
        cache.apply(msg.key(), msg, now=0.0)
    n = 50_000 if ctx.quick else 500_000
    users = np.random.default_rng(2).integers(0, 2 * n_results, n).tolist()  # half hit
    visit = cache.visit
    start = time.perf_counter()
    for i, user in enumerate(users):
        visit(user, 10.0 + i * 1e-6)
    per_visit = (time.perf_counter() - start) / n * 1e6
    lookup = cache.lookup
    start = time.perf_counter()
    for user in users:
        lookup(user, 10.0)
    per_lookup = (time.perf_counter() - start) / n * 1e6
    hits = cache.store.counts.hits
    return BenchResult(
        value=round(per_visit, 3),
        unit="µs",
        extra={
            "lookup_only_us": round(per_lookup, 3),
            "results": n_results,
            "requests": n,
            "hit_rate": round(hits / n, 3),
        },
    )


BENCHMARKS = {
    "precompute_jobs_per_s_per_core": jobs_per_s_per_core,
    "precompute_lookup_us": lookup_us,
}
