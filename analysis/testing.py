"""Test helpers shipped with the package: build small synthetic event logs by hand.

``LogBuilder`` writes the lines of docs/events.md with every field filled the way the simulator
fills them, so a test states only what it is about::

    log = LogBuilder(slo_p99_ms=100.0, window_s=10.0)
    log.run_started("headroom")
    log.window("headroom", "r1", 0.0, latencies_ms=[50.0] * 99 + [500.0], value_total=10.0)
    metrics = compute_metrics(log.events)

``sketch_dict`` builds a CONTRACT §2 sketch from raw samples (bin key ``ceil(ln x / ln gamma)``,
gamma = (1+alpha)/(1-alpha), zeros counted apart), independently of ``streams.sketch``, so tests
check the analyzer against the wire format rather than against the sketch's own encoder.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from analysis.events import EventWriter

DEFAULT_ALPHA = 0.01


def sketch_dict(samples_ms: Iterable[float], alpha: float = DEFAULT_ALPHA) -> dict[str, Any]:
    """A CONTRACT §2 latency sketch of these samples (values ≤ 0 count as zeros)."""
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
