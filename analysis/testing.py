"""Test helpers shipped with the package: build small synthetic event logs by hand.

``LogBuilder`` writes the lines of docs/events.md with every field filled the way the simulator
fills them, so a test states only what it is about::

    log = LogBuilder(slo_p99_ms=100.0, window_s=10.0)
    log.run_started("headroom")
    log.window("headroom", "r1", 0.0, latencies_ms=[50.0] * 99 + [500.0], value_total=10.0)
    metrics = compute_metrics(log.events)

``sketch_dict`` builds a docs/messages.md sketch from raw samples (bin key ``ceil(ln x / ln
gamma)``, gamma = (1+alpha)/(1-alpha), zeros counted apart), independently of
``headroom.kernel.sketch``, so tests check the analyzer against the wire format rather than against
the sketch's own encoder.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from headroom.analysis.events import EventWriter

DEFAULT_ALPHA = 0.01


def sketch_dict(samples_ms: Iterable[float], alpha: float = DEFAULT_ALPHA) -> dict[str, Any]:
    """A docs/messages.md latency sketch of these samples (values ≤ 0 count as zeros)."""
    log_gamma = math.log((1 + alpha) / (1 - alpha))
    bins: Counter[int] = Counter()
    zeros = 0
    for x in samples_ms:
        if x <= 0:
            zeros += 1
        else:
            bins[math.ceil(math.log(x) / log_gamma)] += 1
    return {"alpha": alpha, "bins": {str(k): v for k, v in sorted(bins.items())}, "zeros": zeros}


def arm(values: Sequence[float]) -> dict[str, float]:
    """The ``{n, value_sum, value_sq_sum}`` sums of some observed request values."""
    return {
        "n": len(values),
        "value_sum": float(sum(values)),
        "value_sq_sum": float(sum(v * v for v in values)),
    }


class LogBuilder:
    """Collects events in ``self.events`` (dicts, in order); :meth:`write` saves them as a log."""

    def __init__(
        self,
        *,
        scenario: str = "synthetic",
        seed: int = 1,
        slo_p99_ms: float = 200.0,
        window_s: float = 10.0,
        duration_s: float = 600.0,
        t0: float = 1_796_000_000.0,
        segments: Sequence[str] = ("casual", "premium"),
        regions: Sequence[str] = ("r1",),
        levers: Sequence[str] = ("rma", "sbm"),
        precompute_enabled: bool = False,
    ) -> None:
        self.scenario = scenario
        self.seed = seed
        self.slo_p99_ms = slo_p99_ms
        self.window_s = window_s
        self.duration_s = duration_s
        self.t0 = t0
        self.segments = tuple(segments)
        self.regions = tuple(regions)
        self.levers = tuple(levers)
        self.precompute_enabled = precompute_enabled
        self.events: list[dict[str, Any]] = []

    def event(
        self,
        kind: str,
        policy: str | None,
        region: str | None = None,
        *,
        t: float = 0.0,
        source: str = "sim",
        **fields: Any,
    ) -> dict[str, Any]:
        """Any event: the common fields (v, ts = t0 + t, kind, source, policy, region) + fields."""
        e: dict[str, Any] = {
            "v": 1,
            "ts": self.t0 + t,
            "kind": kind,
            "source": source,
            "policy": policy,
            "region": region,
        }
        e.update(fields)
        self.events.append(e)
        return e

    def run_started(self, policy: str | None, **overrides: Any) -> dict[str, Any]:
        fields: dict[str, Any] = {
            "scenario": self.scenario,
            "seed": self.seed,
            "duration_s": self.duration_s,
            "t0": self.t0,
            "slo": {"p99_ms": self.slo_p99_ms, "window_s": self.window_s},
            "segments": list(self.segments),
            "regions": list(self.regions),
            "levers": list(self.levers),
            "precompute_enabled": self.precompute_enabled,
        }
        fields.update(overrides)
        return self.event("run.started", policy, None, **fields)

    def run_finished(self, policy: str | None, *, wall_s: float = 1.0) -> dict[str, Any]:
        return self.event(
            "run.finished", policy, None, t=self.duration_s, wall_s=wall_s, sim_s=self.duration_s
        )

    def oracle(
        self,
        policy: str | None,
        total: float,
        by_lever: Mapping[str, float] | None = None,
        region: str | None = None,
    ) -> dict[str, Any]:
        levers = dict(by_lever) if by_lever is not None else {"rma": total, "sbm": 0.0}
        levers.setdefault("precompute", 0.0)
        return self.event("oracle.bound", policy, region, oracle_incremental=total, by_lever=levers)

    def window(
        self,
        policy: str,
        region: str,
        t_start: float,
        *,
        latencies_ms: Sequence[float] = (),
        base_latencies_ms: Sequence[float] | None = None,
        requests: int | None = None,
        errors: int = 0,
        timeouts: int = 0,
        value_total: float = 0.0,
        value_baseline: float = 0.0,
        inc: Mapping[str, float] | None = None,
        value_lost: float = 0.0,
        arms: Mapping[str, Mapping[str, Mapping[str, float]]] | None = None,
        segments: Mapping[str, Mapping[str, float]] | None = None,
        offered: Mapping[str, float] | None = None,
        used: Mapping[str, float] | None = None,
        targets: Mapping[str, float] | None = None,
        capacity: Mapping[str, float] | None = None,
        precompute: Mapping[str, Any] | None = None,
        source: str = "sim",
    ) -> dict[str, Any]:
        """One ``window`` line; ``requests`` defaults to the number of latency samples."""
        t_end = t_start + self.window_s
        base = base_latencies_ms if base_latencies_ms is not None else latencies_ms
        fields: dict[str, Any] = {
            "t_start": t_start,
            "t_end": t_end,
            "requests": len(latencies_ms) if requests is None else requests,
            "errors": errors,
            "timeouts": timeouts,
            "sketch": sketch_dict(latencies_ms),
            "sketch_base": sketch_dict(base),
            "value_total": value_total,
            "value_baseline": value_baseline,
            "inc": {"rma": 0.0, "sbm": 0.0, "precompute": 0.0, **(inc or {})},
            "value_lost": value_lost,
            "arms": {k: dict(v) for k, v in (arms or {}).items()},
            "segments": {k: dict(v) for k, v in (segments or {}).items()},
            "offered_unit_s": {"cpu": 0.0, "accelerator": 0.0, **(offered or {})},
            "used_unit_s": {"cpu": 0.0, "accelerator": 0.0, **(used or {})},
            "targets": {"rma_candidates": 0, "sbm_coverage": 0.0, **(targets or {})},
            "capacity": {"cpu": 0.0, "accelerator": 0.0, **(capacity or {})},
        }
        if precompute is not None:
            fields["precompute"] = dict(precompute)
        return self.event("window", policy, region, t=t_end, source=source, **fields)

    def write(self, path: str | Path) -> Path:
        path = Path(path)
        with EventWriter(path) as writer:
            for e in self.events:
                writer.write(e)
        return path


def synthetic_run(
    *,
    seed: int = 0,
    policies: Sequence[str] = ("static", "greedy", "headroom", "oracle"),
    regions: Sequence[str] = ("r1", "r2"),
    duration_s: float = 1800.0,
    window_s: float = 10.0,
    requests_per_window: int = 400,
    precompute: bool = False,
) -> LogBuilder:
    """A plausible multi-policy log of every event kind, for smoke tests, demos and benchmarks.

    Not a simulation: latencies, values and decisions are drawn from simple seeded distributions
    (``numpy.random.default_rng(seed)``) so that each plot of the report has something to show.
    Opportunistic capacity halves at the middle of the run (a reclaim in every region).
    """
    import numpy as np

    rng = np.random.default_rng(seed)
    segments = ("casual", "premium")
    log = LogBuilder(
        scenario="synthetic-run",
        seed=seed,
        slo_p99_ms=200.0,
        window_s=window_s,
        duration_s=duration_s,
        segments=segments,
        regions=regions,
        levers=("rma", "sbm", "precompute") if precompute else ("rma", "sbm"),
        precompute_enabled=precompute,
    )
    # How aggressive each policy is with optional work (0 = baseline only).
    appetite = {"static": 0.0, "greedy": 1.0, "headroom": 0.6, "oracle": 0.75}
    for policy in policies:
        log.run_started(policy)
        log.oracle(policy, 0.9 * duration_s, {"rma": 0.6 * duration_s, "sbm": 0.3 * duration_s})
    half = duration_s / 2
    n_windows = int(duration_s // window_s)
    for policy in policies:
        a = appetite.get(policy, 0.5)
        for region in regions:
            for i in range(n_windows):
                t = i * window_s
                cap_cpu, cap_acc = (8.0, 2.0) if t < half else (4.0, 1.0)
                # greedy overshoots after the reclaim: a slow tail for a few minutes
                hot = policy == "greedy" and half <= t < half + 300
                n = requests_per_window
                lat = rng.lognormal(math.log(60.0 + 40.0 * a), 0.35, n)
                if hot:
                    lat[: n // 20] *= 4.0
                base_lat = lat[: n // 3] / (1.0 + 0.3 * a)
                rma = 0.5 * a * (1.0 if t < half else 0.5)
                sbm = 0.3 * a * (1.0 if t < half else 0.5)
                arms: dict[str, dict[str, dict[str, float]]] = {}
                seg_exposure: dict[str, dict[str, float]] = {}
                for s_i, seg in enumerate(segments):
                    mean = 1.0 + s_i
                    control = rng.normal(mean, 0.5, 8)
                    arms[seg] = {"control": arm(list(control))}
                    if a > 0:
                        arms[seg]["rma"] = arm(list(rng.normal(mean + 0.02, 0.5, 80)))
                        arms[seg]["sbm"] = arm(list(rng.normal(mean + 0.03, 0.5, 40)))
                    seg_exposure[seg] = {
                        "requests": n // 2,
                        "sbm": int(n // 2 * 0.2 * a),
                        "inc": (rma + sbm) / 2,
                    }
                pre = None
                if precompute:
                    pre = {
                        "jobs": 20,
                        "used": 12,
                        "expired_unused": 6,
                        "visits": 40,
                        "hits": 12,
                        "wasted_partial": 2,
                        "staleness_s": [float(x) for x in rng.uniform(0, 600, 4)],
                    }
                log.window(
                    policy,
                    region,
                    t,
                    latencies_ms=list(lat),
                    base_latencies_ms=list(base_lat),
                    errors=int(hot) * 3,
                    value_total=float(n) + rma + sbm + (0.1 * a if precompute else 0.0),
                    value_baseline=float(n),
                    inc={"rma": rma, "sbm": sbm, "precompute": 0.1 * a if precompute else 0.0},
                    arms=arms,
                    segments=seg_exposure,
                    offered={"cpu": cap_cpu * window_s, "accelerator": cap_acc * window_s},
                    used={"cpu": a * cap_cpu * window_s, "accelerator": a * cap_acc * window_s},
                    targets={"rma_candidates": int(400 + 800 * a), "sbm_coverage": 0.2 * a},
                    capacity={"cpu": cap_cpu, "accelerator": cap_acc},
                    precompute=pre,
                )
            if a > 0:
                for step in range(int(duration_s // 60)):
                    t = step * 60.0
                    fallback = "stale_value" if 600 <= t < 720 else None
                    log.event(
                        "target.issued",
                        policy,
                        region,
                        t=t,
                        source="controller",
                        epoch=step,
                        rma_candidates=int(400 + 800 * a),
                        sbm_coverage=0.2 * a,
                        reason="pid",
                        fallback=fallback,
                        allocation=[
                            {"lever": "rma", "cpu": 6 * a, "accelerator": 1.0 * a},
                            {"lever": "sbm", "cpu": 0.5 * a, "accelerator": 0.8 * a},
                        ],
                    )
                    if fallback:
                        log.event("allocator.fallback", policy, region, t=t, reason=fallback)
                log.event("allocator.cap_bound", policy, region, t=120.0, lever="rma", cap=0.7)
            log.event(
                "capacity.reclaimed",
                policy,
                region,
                t=half,
                resource="cpu",
                hardware="any",
                pool="opportunistic",
                units_before=8.0,
                units_after=4.0,
            )
            if a > 0:
                for side in ("server", "client"):
                    log.event("shedding.started", policy, region, t=half, side=side, lever="rma")
                log.event(
                    "optional.released",
                    policy,
                    region,
                    t=half + 0.005,
                    resource="cpu",
                    hardware="any",
                    release_ms=float(rng.uniform(1.0, 8.0)) * (5.0 if policy == "greedy" else 1.0),
                    dropped={"rma_candidates": 400, "sbm_requests": 10, "precompute_jobs": 0},
                )
    log.event("future.kind", None, None, t=1.0, note="kinds unknown to this analyzer are kept")
    for policy in policies:
        log.run_finished(policy)
    return log
