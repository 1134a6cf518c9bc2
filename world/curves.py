"""Value and cost curves measured on the ranking world, for the simulator and the controllers.

The simulator cannot afford to rank every simulated request for real (millions per run), so it
asks the world once, up front, what a ranking is worth: :func:`measure_curves` samples users of
every segment, runs the real retrieval and the real base and strong models
(:mod:`headroom.world.ranking`) at every candidate count of a grid from ``world.base_candidates`` to
``world.max_candidates``, and records the mean and standard deviation of the *quality* of the ad
ranked first (its true utility normalised by the best ad of the corpus for that user, so 1 is a
perfect pick; see docs/world.md). The same users are used at every N and for both models (common
random numbers), so the differences along N and between models are measured precisely even with a
modest sample. It also measures how a precomputed ranking (strong model, ``max_candidates``)
loses quality as the world drifts, against its age, for precompute expiry.

Curves are cached as ``.npz`` in ``$HEADROOM_CACHE_DIR`` (default ``~/.cache/headroom``), keyed by
a hash of every world parameter that changes them and the seed, so later runs load them in
milliseconds. :class:`ValueCurves` answers vectorised look-ups (linear interpolation in N) fast
enough for the simulator's inner loop.

:func:`measure_cost` times the real forward passes on this machine (ms per candidate), to print
beside the scenario's declared costs; this is the one place that reads the wall clock.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt

from headroom.kernel.scenario import Scenario
from headroom.kernel.vocab import Model
from headroom.world.ranking import WORLD_VERSION, RankingWorld, WorldParams
from headroom.world.values import CURVES_VERSION, ValueCurves

__all__ = [
    "CURVES_VERSION",
    "CostMeasurement",
    "Model",
    "ValueCurves",
    "cache_dir",
    "curves_for",
    "measure_cost",
    "measure_curves",
]


FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]


@dataclass(frozen=True)
class CostMeasurement:
    """Real compute per candidate on this machine, in milliseconds (see :func:`measure_cost`)."""

    retrieval_ms_per_candidate: float  # corpus scan + top-N selection, divided by N
    base_ms_per_candidate: float  # base model forward pass
    strong_ms_per_candidate: float  # strong model forward pass
    candidates: int  # N used for the measurement
    repeats: int

    @property
    def strong_to_base(self) -> float:
        return self.strong_ms_per_candidate / max(self.base_ms_per_candidate, 1e-12)


def cache_dir() -> Path:
    """``$HEADROOM_CACHE_DIR``, else ``~/.cache/headroom`` (``$XDG_CACHE_HOME`` respected)."""
    env = os.environ.get("HEADROOM_CACHE_DIR")
    if env:
        return Path(env).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "headroom"


def curves_key(scenario: Scenario, seed: int | None = None, samples: int | None = None) -> str:
    """Hash of everything that changes the curves: world, models' shape, segments, seed."""
    params = WorldParams.from_scenario(scenario, seed=seed)
    blob = json.dumps(
        {
            "curves": CURVES_VERSION,
            "world": WORLD_VERSION,
            "params": params.fingerprint(),
            "samples": samples,
        },
        sort_keys=True,
    )
    return hashlib.sha256(blob.encode()).hexdigest()[:20]


def measure_curves(
    scenario: Scenario,
    *,
    seed: int | None = None,
    samples_per_segment: int | None = None,
    grid_points: int = 17,
) -> ValueCurves:
    """Measure the curves on the world of ``scenario`` (``seed`` overrides the scenario's)."""
    world = RankingWorld.from_scenario(scenario, seed=seed)
    return world.measure_curves(samples_per_segment=samples_per_segment, grid_points=grid_points)


def curves_for(
    scenario: Scenario,
    *,
    seed: int | None = None,
    samples_per_segment: int | None = None,
    use_cache: bool = True,
) -> ValueCurves:
    """The curves for this scenario and seed: from the cache when present, else measured and
    cached. A corrupt or outdated cache file is measured again and overwritten."""
    key = curves_key(scenario, seed, samples_per_segment)
    path = cache_dir() / f"curves-{key}.npz"
    if use_cache and path.exists():
        try:
            curves = ValueCurves.load(path)
            if curves.key == key:
                return curves
        except (OSError, ValueError, KeyError):
            pass  # measured again below
    curves = measure_curves(scenario, seed=seed, samples_per_segment=samples_per_segment)
    curves = _with_key(curves, key)
    if use_cache:
        # A read-only home is not a reason to fail a run; the curves are still good.
        with contextlib.suppress(OSError):
            curves.save(path)
    return curves


def _with_key(curves: ValueCurves, key: str) -> ValueCurves:
    return ValueCurves(
        segments=curves.segments,
        n_grid=curves.n_grid,
        mean=curves.mean,
        std=curves.std,
        age_grid_s=curves.age_grid_s,
        precompute_mean=curves.precompute_mean,
        precompute_std=curves.precompute_std,
        precompute_n=curves.precompute_n,
        samples_per_segment=curves.samples_per_segment,
        key=key,
    )


def measure_cost(
    scenario: Scenario, *, seed: int | None = None, repeats: int = 100
) -> CostMeasurement:
    """Time the real retrieval and forward passes of both models on ``max_candidates``
    candidates, best of ``repeats`` (the least disturbed run on a shared machine)."""
    world = RankingWorld.from_scenario(scenario, seed=seed)
    n = world.params.max_candidates
    seg = 0
    best = {"retrieve": float("inf"), "base": float("inf"), "strong": float("inf")}
    for r in range(repeats + 1):
        users = world.users([1_000_003 + r], seg)
        t0 = time.perf_counter()
        cands = world.retrieve_batch(users, n)
        t1 = time.perf_counter()
        world.score_batch(users, seg, cands, Model.BASE)
        t2 = time.perf_counter()
        world.score_batch(users, seg, cands, Model.STRONG)
        t3 = time.perf_counter()
        if r == 0:
            continue  # warm-up: caches, BLAS threads
        best["retrieve"] = min(best["retrieve"], t1 - t0)
        best["base"] = min(best["base"], t2 - t1)
        best["strong"] = min(best["strong"], t3 - t2)
    return CostMeasurement(
        retrieval_ms_per_candidate=best["retrieve"] * 1e3 / n,
        base_ms_per_candidate=best["base"] * 1e3 / n,
        strong_ms_per_candidate=best["strong"] * 1e3 / n,
        candidates=n,
        repeats=repeats,
    )
