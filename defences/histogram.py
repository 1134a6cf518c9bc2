"""A decaying log-histogram: running quantiles and ranks in O(1) per sample.

:class:`DecayedLogHistogram` keeps cost-weighted counts in logarithmic bins that decay with time;
the server's shedder takes its value threshold from it and the client's :class:`ValueRanker` ranks
a request's value among recent ones with it. Pure code: time is passed in, state snapshots to
plain JSON-able data.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from headroom.kernel.checks import FieldChecker
from headroom.kernel.errors import ConfigError

__all__ = ["DecayedLogHistogram", "HistogramConfig", "ValueRanker"]

FloatArray = npt.NDArray[np.float64]

_INF = math.inf


@dataclass(frozen=True, slots=True)
class HistogramConfig:
    """Log-spaced bins over ``[10**log10_min, 10**log10_max]``; values outside are clamped into the
    end bins. ``half_life`` is in samples, whatever their weights: a sample counts half as much
    once that many more have arrived."""

    log10_min: float = -6.0
    log10_max: float = 6.0
    bins: int = 240  # 0.05 decade per bin: ≈12% resolution before in-bin interpolation
    half_life: float = 2000.0

    def validate(self, prefix: str) -> list[str]:
        c = FieldChecker(prefix)
        c.require(math.isfinite(self.log10_min), "log10_min", "must be finite", self.log10_min)
        c.require(
            not math.isfinite(self.log10_min) or self.log10_max > self.log10_min,
            "log10_max",
            "must be finite and > log10_min",
            self.log10_max,
        )
        c.integer("bins", self.bins, 2)
        c.positive("half_life", self.half_life)
        return c.problems


class DecayedLogHistogram:
    """Exponentially decaying histogram of positive values on log-spaced bins.

    Decay is applied lazily by growing the weight of new samples by ``g = 2**(1/half_life)`` per
    sample instead of shrinking every bin (the "forward decay" trick of Cormode et al.,
    ICDE 2009); bins are rescaled when the running weight grows too large, so an update is O(1).
    Quantile and CDF queries interpolate linearly in log space inside a bin.
    """

    _RESCALE_AT = 1e100

    def __init__(self, config: HistogramConfig | None = None) -> None:
        self.config = config or HistogramConfig()
        problems = self.config.validate("histogram")
        if problems:
            raise ConfigError(problems)
        c = self.config
        self._lo = c.log10_min
        self._span = c.log10_max - c.log10_min
        self._scale = c.bins / self._span
        self._ln_g = math.log(2.0) / c.half_life
        self._g = math.exp(self._ln_g)
        self.counts: FloatArray = np.zeros(c.bins, dtype=np.float64)
        self._w = 1.0  # weight of a unit sample added now (grows instead of decaying the past)
        self.total = 0.0

    def _bin(self, value: float) -> int:
        if value <= 0.0:
            return 0
        b = int((math.log10(value) - self._lo) * self._scale)
        if b < 0:
            return 0
        last = self.config.bins - 1
        return last if b > last else b

    def add(self, value: float, weight: float = 1.0) -> None:
        """Fold one value in, counting ``weight`` (e.g. its cost) toward quantiles."""
        if weight <= 0.0 or not math.isfinite(value):
            return
        w = self._w * weight
        self.counts[self._bin(value)] += w
        self.total += w
        self._w *= self._g
        if self._w > self._RESCALE_AT:
            self._rescale()

    def add_many(self, values: npt.ArrayLike, weights: npt.ArrayLike | None = None) -> None:
        """Fold many values in at once (all counted as of now: no decay inside one call)."""
        vals = np.asarray(values, dtype=np.float64)
        if vals.size == 0:
            return
        wts = np.ones_like(vals) if weights is None else np.asarray(weights, dtype=np.float64)
        # the smallest weight fails ``> 0`` when any does (NaN included), as in the mask
        if not (np.isfinite(vals).all() and wts.min() > 0.0):
            ok = np.isfinite(vals) & (wts > 0.0)
            vals, wts = vals[ok], wts[ok]
            if vals.size == 0:
                return
        logs = np.log10(np.maximum(vals, 1e-300))
        bins = ((logs - self._lo) * self._scale).astype(np.int64)
        np.maximum(bins, 0, out=bins)  # as np.clip, without its wrapper's cost
        np.minimum(bins, self.config.bins - 1, out=bins)
        np.add.at(self.counts, bins, wts * self._w)
        self.total += float(wts.sum()) * self._w
        # Past e^300 the older mass is gone anyway; the cap keeps the weight finite.
        self._w *= math.exp(min(300.0, self._ln_g * vals.size))
        if self._w > self._RESCALE_AT:
            self._rescale()

    def _rescale(self) -> None:
        self.counts /= self._w
        self.total /= self._w
        self._w = 1.0

    def quantile(self, q: float) -> float:
        """The value below which a share ``q`` of the (decayed) weight lies; 0.0 when empty."""
        if self.total <= 0.0:
            return 0.0
        if q <= 0.0:
            return 0.0
        if q >= 1.0:
            return _INF
        cum = np.cumsum(self.counts)
        goal = q * cum[-1]
        b = int(np.searchsorted(cum, goal, side="left"))
        b = min(b, self.config.bins - 1)
        before = float(cum[b - 1]) if b > 0 else 0.0
        inside = float(self.counts[b])
        frac = (goal - before) / inside if inside > 0 else 0.0
        return float(10.0 ** (self._lo + (b + frac) / self._scale))

    def cdf(self, value: float) -> float:
        """Share of the (decayed) weight below ``value``; 0.5 when empty (no information)."""
        if self.total <= 0.0:
            return 0.5
        if value <= 0.0:
            return 0.0
        pos = (math.log10(value) - self._lo) * self._scale
        b = int(pos)
        if b < 0:
            return 0.0
        if b >= self.config.bins:
            return 1.0
        below = float(self.counts[:b].sum()) + float(self.counts[b]) * (pos - b)
        return min(1.0, max(0.0, below / self.total))

    def snapshot(self) -> dict[str, Any]:
        """Raw bins and the running weight, so a restored histogram answers bit for bit alike."""
        return {"counts": self.counts.tolist(), "total": self.total, "w": self._w}

    def restore(self, state: Mapping[str, Any]) -> None:
        counts = np.asarray(state["counts"], dtype=np.float64)
        if counts.shape != self.counts.shape:
            raise ValueError(
                f"histogram snapshot has {counts.size} bins, config says {self.counts.size}"
            )
        self.counts = counts.copy()
        self.total = float(state["total"])
        self._w = float(state["w"])


class ValueRanker:
    """Rank of a request's value among recent requests (a CDF estimate in [0, 1]).

    Clients use it to spend their optional-work multiplier lowest value first.
    """

    def __init__(self, config: HistogramConfig | None = None) -> None:
        self._hist = DecayedLogHistogram(config)

    def observe(self, value: float) -> None:
        self._hist.add(value)

    def observe_many(self, values: npt.ArrayLike) -> None:
        self._hist.add_many(np.asarray(values, dtype=np.float64))

    def rank(self, value: float) -> float:
        return self._hist.cdf(value)

    def snapshot(self) -> dict[str, Any]:
        return self._hist.snapshot()

    def restore(self, state: Mapping[str, Any]) -> None:
        self._hist.restore(state)
