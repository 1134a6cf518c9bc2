"""The measured value curves: what a ranking is worth, per model, segment and candidate count.

:class:`ValueCurves` holds what :func:`headroom.world.curves.measure_curves` measured on the
ranking world (see that module for how) and answers vectorised look-ups — linear interpolation in
the candidate count — fast enough for the simulator's inner loop. It is plain data: it can be
saved to and loaded from ``.npz`` and imports nothing of the world that measured it.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from headroom.kernel.vocab import Model

__all__ = ["CURVES_VERSION", "ValueCurves"]

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
