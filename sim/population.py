"""The simulated request population: segments × value bins, and the value signals it produces.

Pure: no clock, no global random state; every draw comes from a generator passed in.

Why cells
---------
A day of the diurnal scenario is about 70 million requests; a Python call (or even a numpy row)
per request is out of the question. Requests are therefore simulated as *cells*: segment ``s``
× value bin ``k`` of ``K`` equal-probability bins of the segment's log-normal value
(``value = exp(N(μ_s, σ_s))`` with ``μ_s = ln(mean_s) − σ_s²/2``, so ``E[value] = mean_s``). A
step's arrivals are spread over the cells by their shares ``share_s / K``; every decision a policy
takes (RMA candidates, SBM routing, shedding lowest value first) is a *fraction* of each cell's
requests (the clients' part of it is the plan's, :class:`headroom.defences.plan.CellPlanner`,
which reads the value distribution through :meth:`Population.share_above` and
:meth:`Population.keep_top`). Ground truth is exact for that model: the value of a cell's
request is known only through its bin, so
``E[value × quality | cell, option] = E[value | bin] × Q(option)`` with the bin's conditional
moments computed in closed form::

    E[Vʲ | bin k] = exp(jμ + j²σ²/2) · K · (Φ(z_{k+1} − jσ) − Φ(z_k − jσ)),   z_k = Φ⁻¹(k/K)

Value signals (what clients report)
-----------------------------------
Ground truth uses mean qualities ``Q`` (the curves' conditional expectation). What a client
*observes* for one request is ``y = value × u`` with ``u`` the realised quality of the ad shown,
``u ~ N(Q, sd)`` (``sd`` = the curves' per-request spread), and ``y = 0`` for a request that timed
out. The holdout estimator only ever sees these observed sums. :func:`arm_sums` draws
``(n, Σy, Σy²)`` of ``n`` requests: exactly, request by request, for small arms (the control arm
of a window is a few dozen requests); for large arms from the bivariate normal limit of the two
sums (central limit theorem), with the exact mean vector and covariance from the first four
moments of ``y`` — the estimator's input has the right distribution at a fraction of the cost.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt
from scipy.special import ndtr, ndtri

from headroom.kernel.scenario import Scenario

__all__ = ["EXACT_BELOW", "Population", "arm_sums"]

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]

# Arms with fewer requests than this are drawn request by request; larger arms use the
# bivariate normal limit of (Σy, Σy²). 64 keeps the control arm of a window exact.
EXACT_BELOW = 64


@dataclass(frozen=True, eq=False)
class Population:
    """Cells of a scenario's request population (index ``c = s·K + k``)."""

    segments: tuple[str, ...]
    bins: int
    seg: IntArray  # (C,) segment index of each cell
    share: FloatArray  # (C,) share of all requests
    v_mean: FloatArray  # (C,) E[V | cell]
    v_moments: FloatArray  # (4, C) E[V^j | cell], j = 1..4
    v_lo: FloatArray  # (C,) lower value bound of the bin
    v_hi: FloatArray  # (C,) upper value bound (inf for the top bin)
    mu: FloatArray  # (S,) log-normal parameters per segment
    sigma: FloatArray
    seg_share: FloatArray  # (S,)
    _keep_cache: dict[float, FloatArray] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        for arr in (self.seg, self.share, self.v_mean, self.v_moments, self.v_lo, self.v_hi):
            arr.setflags(write=False)

    @property
    def _ones(self) -> FloatArray:
        return np.ones(self.n_cells)

    @property
    def _zeros(self) -> FloatArray:
        return np.zeros(self.n_cells)

    @classmethod
    def from_scenario(cls, scenario: Scenario, bins: int = 8) -> Population:
        if bins < 1:
            raise ValueError(f"bins: must be >= 1, got {bins}")
        if any(s.value.histogram is not None for s in scenario.segments):
            # recorded value histograms: the recorded population's cells (sim/replay.py)
            from headroom.sim.replay import RecordedPopulation

            return RecordedPopulation.from_histograms(scenario, bins)
        names = tuple(s.name for s in scenario.segments)
        shares = np.array([s.share for s in scenario.segments], dtype=np.float64)
        shares = shares / shares.sum()
        sig = np.array([max(s.value.sigma, 0.0) for s in scenario.segments], dtype=np.float64)
        mean = np.array([s.value.mean for s in scenario.segments], dtype=np.float64)
        mu = np.log(mean) - 0.5 * sig * sig
        n_seg = len(names)
        z = ndtri(np.arange(bins + 1) / bins)  # -inf … +inf
        seg = np.repeat(np.arange(n_seg), bins)
        k = np.tile(np.arange(bins), n_seg)
        moments = np.empty((4, n_seg * bins))
        for j in range(1, 5):
            s = sig[seg]
            m = np.exp(j * mu[seg] + 0.5 * j * j * s * s)
            with np.errstate(invalid="ignore"):
                mass = ndtr(z[k + 1] - j * s) - ndtr(z[k] - j * s)
            moments[j - 1] = m * bins * mass
        # a degenerate (sigma 0) segment: every bin is the mean
        flat = sig[seg] == 0.0
        for j in range(1, 5):
            moments[j - 1, flat] = mean[seg[flat]] ** j
        with np.errstate(over="ignore"):
            v_lo = np.exp(mu[seg] + sig[seg] * z[k])
            v_hi = np.exp(mu[seg] + sig[seg] * z[k + 1])
        return cls(
            segments=names,
            bins=bins,
            seg=seg.astype(np.int64),
            share=(shares[seg] / bins).astype(np.float64),
            v_mean=moments[0].copy(),
            v_moments=moments,
            v_lo=v_lo,
            v_hi=v_hi,
            mu=mu,
            sigma=sig,
            seg_share=shares,
        )

    @property
    def n_cells(self) -> int:
        return int(self.seg.size)

    @property
    def n_segments(self) -> int:
        return len(self.segments)

    def value_cdf(self, v: float) -> float:
        """Share of all requests with a value ≤ ``v`` (mixture over segments)."""
        if v <= 0.0:
            return 0.0
        x = math.log(v)
        total = 0.0
        for s in range(self.n_segments):
            if self.sigma[s] > 0:
                total += self.seg_share[s] * float(ndtr((x - self.mu[s]) / self.sigma[s]))
            else:
                total += self.seg_share[s] * float(x >= self.mu[s])
        return total

    def value_quantile(self, q: float) -> float:
        """The value below which a share ``q`` of all requests lies (bisection on ln v)."""
        if q <= 0.0:
            return 0.0
        if q >= 1.0:
            return math.inf
        lo, hi = self.ln_value_range()
        for _ in range(60):
            mid = 0.5 * (lo + hi)
            if self.value_cdf(math.exp(mid)) < q:
                lo = mid
            else:
                hi = mid
        return math.exp(0.5 * (lo + hi))

    def ln_value_range(self) -> tuple[float, float]:
        """A bracket of ``ln v`` for bisections: ``μ ∓ (8σ + 1)`` over the segments."""
        lo = float((self.mu - 8.0 * self.sigma - 1.0).min())
        hi = float((self.mu + 8.0 * self.sigma + 1.0).max())
        return lo, hi

    def share_above(self, v: float) -> FloatArray:
        """Per cell, the share of its requests whose value is ≥ ``v``."""
        if v <= 0.0:
            return np.ones(self.n_cells)
        if math.isinf(v):
            return np.zeros(self.n_cells)
        k = np.arange(self.n_cells) % self.bins
        s = self.seg
        with np.errstate(divide="ignore"):
            u = np.where(
                self.sigma[s] > 0,
                ndtr((math.log(v) - self.mu[s]) / np.where(self.sigma[s] > 0, self.sigma[s], 1.0)),
                (math.log(v) > self.mu[s]).astype(np.float64),
            )
        return np.asarray(np.clip(((k + 1) / self.bins - u) * self.bins, 0.0, 1.0))

    def keep_top(self, share: float) -> FloatArray:
        """Per cell, the share of its requests among the top ``share`` of all requests by value
        (what a client-side multiplier keeps: value rank ≥ 1 − multiplier; the plan's
        :class:`headroom.defences.plan.CellPlanner` spends it).
        Cached by ``share`` rounded to 1e-4 (the arrays are read-only)."""
        if share >= 1.0:
            return self._ones
        if share <= 0.0:
            return self._zeros
        key = round(share, 4)
        got = self._keep_cache.get(key)
        if got is None:
            got = self.share_above(self.value_quantile(1.0 - key))
            got.setflags(write=False)
            if len(self._keep_cache) < 20_000:
                self._keep_cache[key] = got
        return got

    def sample_values(self, cells: IntArray, u: FloatArray) -> FloatArray:
        """Values of requests of the given cells; ``u`` (uniform in [0, 1)) places each in a bin."""
        k = cells % self.bins
        s = self.seg[cells]
        q = (k + np.clip(u, 1e-12, 1 - 1e-12)) / self.bins
        return np.asarray(np.exp(self.mu[s] + self.sigma[s] * ndtri(q)))


def arm_sums(
    rng: np.random.Generator,
    pop: Population,
    n: IntArray,
    weights: FloatArray,
    part_seg: IntArray,
    part_cell: IntArray,
    q_mean: FloatArray,
    q_sd: FloatArray,
    in_time: FloatArray,
) -> tuple[FloatArray, FloatArray]:
    """Observed ``(Σy, Σy²)`` per group of ``n[g]`` requests drawn from a mixture of parts.

    Parts are (cell, option) pairs: ``weights`` their shares (normalised per group here),
    ``part_seg`` the group they belong to (any index below ``n.size``: a segment, or a segment
    of one arm), ``part_cell`` their cell, ``q_mean``/``q_sd`` the quality they deliver and
    ``in_time`` the probability a request of the part finishes in time (else it reports 0).
    Groups of fewer than :data:`EXACT_BELOW` requests are drawn request by request; the others
    from the bivariate normal limit of the two sums with the mixture's exact moments.
    """
    n_seg = int(np.asarray(n).size)
    n = np.asarray(n, dtype=np.int64)
    s1 = np.zeros(n_seg)
    s2 = np.zeros(n_seg)
    w = np.asarray(weights, dtype=np.float64)
    seg_w = np.bincount(part_seg, weights=w, minlength=n_seg)
    live = (n > 0) & (seg_w > 0)
    if not live.any():
        return s1, s2
    p = w / np.where(seg_w[part_seg] > 0, seg_w[part_seg], 1.0)
    exact = live & (n < EXACT_BELOW)
    if exact.any():
        _exact(
            rng, pop, np.where(exact, n, 0), p, part_seg, part_cell, q_mean, q_sd, in_time, s1, s2
        )
    clt = live & ~exact
    if clt.any():
        vm = pop.v_moments[:, part_cell]  # (4, P)
        m, sd = q_mean, q_sd
        um = np.stack(
            [m, m * m + sd * sd, m**3 + 3 * m * sd * sd, m**4 + 6 * m * m * sd * sd + 3 * sd**4]
        )
        part_m = vm * um * in_time * p  # (4, P), summed per segment = E[y^j] of one request
        ym = np.stack([np.bincount(part_seg, weights=row, minlength=n_seg) for row in part_m])
        m1, m2, m3, m4 = ym
        var1 = np.maximum(m2 - m1 * m1, 0.0)
        var2 = np.maximum(m4 - m2 * m2, 0.0)
        cov = m3 - m1 * m2
        a = np.sqrt(var1)
        b = np.where(a > 0, cov / np.where(a > 0, a, 1.0), 0.0)
        c = np.sqrt(np.maximum(var2 - b * b, 0.0))
        z = rng.standard_normal((2, n_seg))
        nf = n.astype(np.float64)
        rt = np.sqrt(nf)
        t1 = np.maximum(nf * m1 + rt * a * z[0], 0.0)
        t2 = nf * m2 + rt * (b * z[0] + c * z[1])
        with np.errstate(divide="ignore", invalid="ignore"):
            t2 = np.maximum(t2, np.where(nf > 0, t1 * t1 / nf, 0.0))  # no negative variance
        s1 = np.where(clt, t1, s1)
        s2 = np.where(clt, t2, s2)
    return s1, s2


def _exact(
    rng: np.random.Generator,
    pop: Population,
    n: IntArray,
    p: FloatArray,
    part_seg: IntArray,
    part_cell: IntArray,
    q_mean: FloatArray,
    q_sd: FloatArray,
    in_time: FloatArray,
    s1: FloatArray,
    s2: FloatArray,
) -> None:
    """Request-by-request draws for the segments with ``n > 0`` (sums added in place)."""
    total = int(n.sum())
    seg_of_req = np.repeat(np.arange(n.size), n)
    # one CDF over parts sorted by segment: segment s occupies (s, s + 1] after the offset
    order = np.argsort(part_seg, kind="stable")
    ps = p[order]
    seg_sorted = part_seg[order]
    cum = np.zeros_like(ps)
    for s in np.unique(seg_sorted):
        sel = seg_sorted == s
        cum[sel] = np.cumsum(ps[sel])
    key = seg_sorted + np.minimum(cum, 1.0)
    u = rng.random((4, total))
    pick = np.searchsorted(key, seg_of_req + u[0] * (1 - 1e-12), side="left")
    pick = order[np.minimum(pick, order.size - 1)]
    v = pop.sample_values(part_cell[pick], u[1])
    quality = q_mean[pick] + q_sd[pick] * _norm(u[2])
    y = np.where(u[3] < in_time[pick], v * quality, 0.0)
    s1 += np.bincount(seg_of_req, weights=y, minlength=n.size)
    s2 += np.bincount(seg_of_req, weights=y * y, minlength=n.size)


def _norm(u: FloatArray) -> FloatArray:
    return np.asarray(ndtri(np.clip(u, 1e-12, 1 - 1e-12)))
