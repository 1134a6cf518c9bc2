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
from typing import Any

import numpy as np
import numpy.typing as npt

from headroom.kernel.scenario import Scenario
from headroom.world.ranking import Model

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

CURVES_VERSION = 1  # bump when the world or the measurement changes what a cached file means

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]


@dataclass(frozen=True, eq=False)
class ValueCurves:
    """Measured quality of the top-ranked ad, per model, segment and candidate count.

    Arrays (read-only):

    * ``n_grid`` (G,) int, strictly increasing, ``base_candidates`` … ``max_candidates``;
    * ``mean``, ``std`` (2, S, G): over sampled users, the quality (normalised true utility,
      in (0, 1]) of the ad the model ranks first among the top-N retrieved candidates;
      axis 0 is :class:`Model` (0 base, 1 strong), axis 1 the segment in scenario order;
    * ``age_grid_s`` (A,) ascending from 0, and ``precompute_mean``, ``precompute_std`` (S, A):
      the quality, *at visit time*, of the ad a strong-model ranking of ``precompute_n``
      candidates put first ``age`` seconds earlier (flat when the world does not drift).

    Look-ups clamp N to ``[n_grid[0], n_grid[-1]]`` and age to ``[0, age_grid_s[-1]]``.
    """

    segments: tuple[str, ...]
    n_grid: IntArray
    mean: FloatArray
    std: FloatArray
    age_grid_s: FloatArray
    precompute_mean: FloatArray
    precompute_std: FloatArray
    precompute_n: int
    samples_per_segment: int
    key: str = ""

    def __post_init__(self) -> None:
        s, g = len(self.segments), len(self.n_grid)
        a = len(self.age_grid_s)
        if g < 1 or np.any(np.diff(self.n_grid) <= 0):
            raise ValueError("n_grid must be non-empty and strictly increasing")
        if self.mean.shape != (2, s, g) or self.std.shape != (2, s, g):
            raise ValueError(f"mean and std must have shape (2, {s}, {g})")
        if a < 1 or self.age_grid_s[0] != 0 or np.any(np.diff(self.age_grid_s) <= 0):
            raise ValueError("age_grid_s must start at 0 and be strictly increasing")
        if self.precompute_mean.shape != (s, a) or self.precompute_std.shape != (s, a):
            raise ValueError(f"precompute_mean and precompute_std must have shape ({s}, {a})")
        for arr in (self.n_grid, self.mean, self.std, self.age_grid_s):
            arr.setflags(write=False)
        self.precompute_mean.setflags(write=False)
        self.precompute_std.setflags(write=False)

    # -- look-ups ---------------------------------------------------------------------------------

    @property
    def base_candidates(self) -> int:
        return int(self.n_grid[0])

    @property
    def max_candidates(self) -> int:
        return int(self.n_grid[-1])

    def segment_index(self, name: str) -> int:
        try:
            return self.segments.index(name)
        except ValueError:
            raise KeyError(f"unknown segment {name!r}; curves have {self.segments}") from None

    def mean_quality(
        self, segment_idx: npt.ArrayLike, model: Model | str | int | npt.ArrayLike, n: npt.ArrayLike
    ) -> FloatArray:
        """Mean top-ad quality; arguments broadcast together (``model``: name, or 0/1 array)."""
        return self._lookup(self.mean, segment_idx, model, n)

    def std_quality(
        self, segment_idx: npt.ArrayLike, model: Model | str | int | npt.ArrayLike, n: npt.ArrayLike
    ) -> FloatArray:
        """Standard deviation of the top-ad quality across users (per-request spread)."""
        return self._lookup(self.std, segment_idx, model, n)

    def uplift(self, segment_idx: npt.ArrayLike, n: npt.ArrayLike) -> FloatArray:
        """Mean quality gained by ranking N candidates with the strong model instead of the base."""
        return self.mean_quality(segment_idx, Model.STRONG, n) - self.mean_quality(
            segment_idx, Model.BASE, n
        )

    def baseline_quality(self, segment_idx: npt.ArrayLike) -> FloatArray:
        """Mean quality of the baseline (base model, base candidates)."""
        return self.mean_quality(segment_idx, Model.BASE, self.base_candidates)

    def precompute_quality(self, segment_idx: npt.ArrayLike, age_s: npt.ArrayLike) -> FloatArray:
        """Mean quality at visit time of a precomputed strong ranking that is ``age_s`` old."""
        return self._age_lookup(self.precompute_mean, segment_idx, age_s)

    def precompute_quality_std(
        self, segment_idx: npt.ArrayLike, age_s: npt.ArrayLike
    ) -> FloatArray:
        return self._age_lookup(self.precompute_std, segment_idx, age_s)

    def _lookup(
        self,
        table: FloatArray,
        segment_idx: npt.ArrayLike,
        model: Model | str | int | npt.ArrayLike,
        n: npt.ArrayLike,
    ) -> FloatArray:
        m: Any
        if isinstance(model, str | Model):
            m = int(Model.of(model))
        else:
            m = np.asarray(model, dtype=np.int64)
        s = np.asarray(segment_idx, dtype=np.int64)
        grid = self.n_grid
        x = np.clip(np.asarray(n, dtype=np.float64), grid[0], grid[-1])
        if len(grid) == 1:
            return np.asarray(table[m, s, 0] + 0.0 * x, dtype=np.float64)
        j = np.clip(np.searchsorted(grid, x, side="right") - 1, 0, len(grid) - 2)
        lo = grid[j]
        w = (x - lo) / (grid[j + 1] - lo)
        v0 = table[m, s, j]
        v1 = table[m, s, j + 1]
        return np.asarray(v0 + w * (v1 - v0), dtype=np.float64)

    def _age_lookup(
        self, table: FloatArray, segment_idx: npt.ArrayLike, age_s: npt.ArrayLike
    ) -> FloatArray:
        s = np.asarray(segment_idx, dtype=np.int64)
        grid = self.age_grid_s
        x = np.clip(np.asarray(age_s, dtype=np.float64), 0.0, grid[-1])
        if len(grid) == 1:
            return np.asarray(table[s, 0] + 0.0 * x, dtype=np.float64)
        j = np.clip(np.searchsorted(grid, x, side="right") - 1, 0, len(grid) - 2)
        lo = grid[j]
        w = (x - lo) / (grid[j + 1] - lo)
        v0 = table[s, j]
        v1 = table[s, j + 1]
        return np.asarray(v0 + w * (v1 - v0), dtype=np.float64)

    # -- persistence ------------------------------------------------------------------------------

    def save(self, path: Path) -> None:
        """Write atomically (a temporary file renamed into place)."""
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        with tmp.open("wb") as f:
            np.savez(
                f,
                version=np.int64(CURVES_VERSION),
                segments=np.array(json.dumps(list(self.segments))),
                n_grid=self.n_grid,
                mean=self.mean,
                std=self.std,
                age_grid_s=self.age_grid_s,
                precompute_mean=self.precompute_mean,
                precompute_std=self.precompute_std,
                precompute_n=np.int64(self.precompute_n),
                samples_per_segment=np.int64(self.samples_per_segment),
                key=np.array(self.key),
            )
        tmp.replace(path)

    @classmethod
    def load(cls, path: Path) -> ValueCurves:
        """Read a file written by :meth:`save`; ValueError if it is not one (or another version)."""
        with np.load(path, allow_pickle=False) as z:
            if int(z["version"]) != CURVES_VERSION:
                raise ValueError(
                    f"{path}: curves version {int(z['version'])}, need {CURVES_VERSION}"
                )
            return cls(
                segments=tuple(json.loads(str(z["segments"]))),
                n_grid=np.array(z["n_grid"], dtype=np.int64),
                mean=np.array(z["mean"], dtype=np.float64),
                std=np.array(z["std"], dtype=np.float64),
                age_grid_s=np.array(z["age_grid_s"], dtype=np.float64),
                precompute_mean=np.array(z["precompute_mean"], dtype=np.float64),
                precompute_std=np.array(z["precompute_std"], dtype=np.float64),
                precompute_n=int(z["precompute_n"]),
                samples_per_segment=int(z["samples_per_segment"]),
                key=str(z["key"]),
            )


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
    from headroom.world.ranking import WORLD_VERSION, WorldParams

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
    from headroom.world.ranking import RankingWorld

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
    from headroom.world.ranking import RankingWorld

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
