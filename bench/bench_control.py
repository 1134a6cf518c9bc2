"""``control_step_100_regions_ms``: one control interval for 100 regions (goal ≤ 100 ms).

The whole :meth:`headroom.controllers.plane.ControlPlane.step` — value book update, allocator (the
LP over RMA, SBM and precompute), RMA PID, SBM coverage and the Thompson router — for 100 regions,
each with three segments, a CPU pool, two accelerator pools (gpu-a for RMA only, gpu-b for the
strong model, one of them expiring), a remote pool for precompute, and a full set of value signals
(3 segments × 3 levers × 2 arms) every interval. The plane is warmed up for 5 intervals first,
so the value estimates are known and the allocator solves its real LP rather than falling back.

``value`` is the median over the timed intervals; ``p90_ms`` is reported beside it.
"""

from __future__ import annotations

import time

import numpy as np

from headroom.bench.runner import BenchContext, BenchResult
from headroom.controllers.config import ControlConfig, SegmentInfo
from headroom.controllers.levers import CostModel
from headroom.controllers.plane import ControlPlane
from headroom.controllers.testing import arm_stats
from headroom.controllers.types import CapacityLevel, RegionObservation

GOAL_MS = 100.0
REGIONS = 100
SEGMENTS = (("premium", 0.1), ("regular", 0.4), ("casual", 0.5))
# (cpu_ms, accelerator_ms) one treated request's optional work costs, per lever (_config's costs)
_WORK_MS = {"rma": (200 * 0.1, 200 * 0.02), "sbm": (400 * 0.005, 400 * 0.1), "precompute": (0, 0)}


def _config() -> ControlConfig:
    return ControlConfig(
        slo_p99_ms=200.0,
        base_candidates=400,
        max_candidates=1200,
        costs=CostModel(0.1, 0.02, 0.005, 0.1, 400, ("gpu-a", "gpu-b"), ("gpu-b",), 120.0),
        segments=tuple(SegmentInfo(n, s) for n, s in SEGMENTS),
        precompute_enabled=True,
    )


def _observations(rng: np.random.Generator, interval: int) -> list[RegionObservation]:
    out = []
    now = 1_796_000_000.0 + 60.0 * interval
    for r in range(REGIONS):
        rps = 200.0 + 5.0 * r
        value = {}
        for seg, _ in SEGMENTS:
            for lever, uplift in (("rma", 0.05), ("sbm", 0.2), ("precompute", 0.1)):
                # the work the treated requests received, as the servers report it (RMA: 200
                # extra candidates; SBM: 400 on the strong model; precompute: none on the
                # request); costless RMA/SBM signals would read as no work: unknown value
                cpu, acc = _WORK_MS[lever]
                value[(seg, lever, "treatment")] = arm_stats(
                    rng, 400, 1.0 + uplift, 0.5, 400 * cpu, 400 * acc
                )
                value[(seg, lever, "control")] = arm_stats(rng, 40, 1.0, 0.5)
        out.append(
            RegionObservation(
                region=f"region-{r:03d}",
                now=now,
                window_s=60.0,
                p99_ms={"all": 150.0 + float(rng.normal(0, 10)), "sbm": 120.0},
                request_rps=rps,
                eligible_rps=0.9 * rps,
                segment_rps={seg: share * rps for seg, share in SEGMENTS},
                capacity=(
                    CapacityLevel("cpu", "any", "opportunistic", 8.0 + r % 5, None, False, now),
                    CapacityLevel("accelerator", "gpu-a", "opportunistic", 2.0, 600.0, False, now),
                    CapacityLevel("accelerator", "gpu-b", "opportunistic", 3.0, 3600.0, False, now),
                    CapacityLevel("accelerator", "gpu-b", "opportunistic", 4.0, None, True, now),
                ),
                value=value,
                observed_coverage=None,
                value_age_s=5.0,
            )
        )
    return out


def control_step_100_regions_ms(ctx: BenchContext) -> BenchResult:
    rng = np.random.default_rng(7)
    plane = ControlPlane(_config(), np.random.default_rng(0))
    warmup, timed = 5, (5 if ctx.quick else 40)
    # observations are built before timing: only the plane's work is measured
    batches = [_observations(rng, i) for i in range(warmup + timed)]
    for obs in batches[:warmup]:
        for o in obs:
            plane.step(o)
    times = []
    for obs in batches[warmup:]:
        start = time.perf_counter()
        for o in obs:
            plane.step(o)
        times.append((time.perf_counter() - start) * 1e3)
    fallbacks = sum(
        1 for o in batches[-1] if (d := plane.decision(o.region)) and d.allocation.fallback
    )
    return BenchResult(
        value=round(float(np.median(times)), 3),
        unit="ms",
        goal=GOAL_MS,
        extra={
            "p90_ms": round(float(np.percentile(times, 90)), 3),
            "regions": REGIONS,
            "intervals_timed": timed,
            "levers": list(plane.levers.names),
            "regions_in_fallback": fallbacks,
        },
    )


BENCHMARKS = {"control_step_100_regions_ms": control_step_100_regions_ms}
