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
out. The holdout estimator only ever sees these observed sums, and the value signal ``x = value``
(known before ranking) for its regression adjustment. :func:`arm_signal_sums` draws
``(Σy, Σy², Σx, Σx², Σxy)`` of ``n`` requests: exactly, request by request, for small arms (the
control arm of a window is a few dozen requests); for large arms from the normal limit of the five
sums (central limit theorem), with the exact mean vector and covariance from the moments of the
value (up to the 4th), of the quality and the in-time probability — the estimator's input has the
right joint distribution at a fraction of the cost. :func:`arm_sums` is its first two sums.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt
from scipy.special import ndtr, ndtri

from headroom.kernel.scenario import Scenario

__all__ = ["EXACT_BELOW", "Population", "arm_signal_sums", "arm_sums", "searchable"]

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
    """Observed ``(Σy, Σy²)`` per group (:func:`arm_signal_sums` without the signal sums)."""
    s = arm_signal_sums(rng, pop, n, weights, part_seg, part_cell, q_mean, q_sd, in_time)
    return s[0], s[1]


# The sums of a group as powers of (value V, realised quality U) and an indicator of one request
# (0: none, 1: in time I, 2: late 1 − I): y = V·U·I, y², x = V, x², x·y, and of the late ones
# their count, Σx and Σx².
_SUM_POWERS = (
    (1, 1, 1),
    (2, 2, 1),
    (1, 0, 0),
    (2, 0, 0),
    (2, 1, 1),
    (0, 0, 2),
    (1, 0, 2),
    (2, 0, 2),
)
N_SUMS = len(_SUM_POWERS)


def _both(i: int, j: int) -> int:
    """The indicator of a product of two (``-1``: I·(1 − I) = 0)."""
    if i == 0 or i == j:
        return j
    if j == 0:
        return i
    return -1


# The covariance of the sums needs the mean of every product of two of them: the (i ≤ j) pairs
# with the powers of their product (indicator -1: it vanishes); every distinct mean the sums and
# their products need (``_MOMENTS``), as index arrays into the per-part powers; the rows of
# ``_MOMENTS`` the sums' own means are; per pair, its row (one past the last: a zero row).
_PAIRS = [
    (i, j, (ai + aj, bi + bj, _both(ii, ij)))
    for i, (ai, bi, ii) in enumerate(_SUM_POWERS)
    for j, (aj, bj, ij) in enumerate(_SUM_POWERS)
    if j >= i
]
_MOMENTS = sorted({*_SUM_POWERS, *(t for _, _, t in _PAIRS if t[2] >= 0)})
_ROW_OF = {t: r for r, t in enumerate(_MOMENTS)}
_M_V, _M_U, _M_I = (np.array([t[x] for t in _MOMENTS], dtype=np.intp) for x in range(3))
_MU_ROWS = np.array([_ROW_OF[t] for t in _SUM_POWERS], dtype=np.intp)
_PAIR_I = np.array([i for i, _, _ in _PAIRS], dtype=np.intp)
_PAIR_J = np.array([j for _, j, _ in _PAIRS], dtype=np.intp)
_PAIR_ROW = np.array(
    [_ROW_OF[t] if t[2] >= 0 else len(_MOMENTS) for _, _, t in _PAIRS], dtype=np.intp
)


def _order_by_group(group: IntArray) -> npt.NDArray[np.intp]:
    """``np.argsort(group, kind="stable")`` of small non-negative group indices: the stable order
    is one permutation whatever the integer type, and numpy sorts 16-bit integers by radix
    (linear time; the 64-bit ones by merging)."""
    if group.size and int(group.min()) >= 0 and int(group.max()) < 2**15:
        return np.argsort(group.astype(np.int16), kind="stable")
    return np.argsort(group, kind="stable")


def searchable(weights: FloatArray, firsts: slice | npt.NDArray[np.intp]) -> npt.NDArray[np.bool_]:
    """The parts an exact draw (:func:`_exact`) can pick: every part with weight, the first part
    of each group (``firsts``: where each group's parts begin, in the order the draw searches
    them) and the last part of all. A weightless part has its predecessor's cumulative weight,
    so the draw's search lands on it only where it begins its group or ends the array; leaving
    the others out changes no pick and no sum (adding 0 changes none)."""
    keep: npt.NDArray[np.bool_] = np.asarray(weights != 0.0)
    if keep.size:
        keep[firsts] = True
        keep[-1] = True
    return keep


def _group_sums(index: IntArray, weights: FloatArray, n_groups: int) -> FloatArray:
    """``np.bincount(index, weights=row, minlength=n_groups)`` of every row of ``weights``
    (rows × parts) in one call: row ``r``'s parts go to bins ``r·n_groups + index``, and
    ``bincount`` adds each bin's weights in their order, so every sum is the one row's own."""
    rows = weights.shape[0]
    keys = (np.arange(rows)[:, None] * n_groups + index).ravel()
    flat = np.bincount(keys, weights=weights.ravel(), minlength=rows * n_groups)
    return np.asarray(flat, dtype=np.float64).reshape(rows, n_groups)


def arm_signal_sums(
    rng: np.random.Generator,
    pop: Population,
    n: IntArray,
    weights: FloatArray,
    part_seg: IntArray,
    part_cell: IntArray,
    q_mean: FloatArray,
    q_sd: FloatArray,
    in_time: FloatArray,
) -> FloatArray:
    """Observed sums ``(Σy, Σy², Σx, Σx², Σxy, n_late, Σx_late, Σx²_late)`` (an (8, G) array)
    per group of ``n[g]`` requests drawn from a mixture of parts; ``x`` is the request's value
    signal (its value ``V``), *late* the requests that did not finish in time (they report 0).

    Parts are (cell, option) pairs: ``weights`` their shares (normalised per group here),
    ``part_seg`` the group they belong to (any index below ``n.size``: a segment, or a segment
    of one arm), ``part_cell`` their cell, ``q_mean``/``q_sd`` the quality they deliver and
    ``in_time`` the probability a request of the part finishes in time (else it reports 0).
    Groups of fewer than :data:`EXACT_BELOW` requests are drawn request by request; the others
    from the normal limit of the five sums with the mixture's exact mean vector and covariance
    (every entry a product of moments of ``V`` up to the 4th, of ``U ~ N(q, sd)`` up to the 4th,
    and the in-time probability).
    """
    n_seg = int(np.asarray(n).size)
    n = np.asarray(n, dtype=np.int64)
    out = np.zeros((N_SUMS, n_seg))
    w = np.asarray(weights, dtype=np.float64)
    seg_w = np.bincount(part_seg, weights=w, minlength=n_seg)
    live = (n > 0) & (seg_w > 0)
    if not live.any():
        return out
    p = w / np.where(seg_w[part_seg] > 0, seg_w[part_seg], 1.0)
    exact = live & (n < EXACT_BELOW)
    if exact.any():
        _exact(rng, pop, np.where(exact, n, 0), p, part_seg, part_cell, q_mean, q_sd, in_time, out)
    clt = live & ~exact
    if clt.any():
        # only the parts of the groups drawn here, and only those with requests: a part of
        # weight 0 adds 0 to every moment (a sum never changes by adding 0), so leaving it out
        # changes nothing
        sel = clt[part_seg] & (w != 0.0)
        ps = part_seg[sel]
        m, sd = q_mean[sel], q_sd[sel]
        v2 = sd * sd
        # E[V^a | cell] for a = 0..4 and E[U^b] for b = 0..4 (normal U), per part
        vm = np.vstack([np.ones(ps.size), pop.v_moments[:, part_cell[sel]]])
        um = np.stack(
            [
                np.ones_like(m),
                m,
                m * m + v2,
                m**3 + 3 * m * v2,
                m**4 + 6 * m * m * v2 + 3 * v2 * v2,
            ]
        )
        it = in_time[sel]
        ind = np.stack((np.ones_like(it), it, 1.0 - it))
        k = len(_SUM_POWERS)
        # every E[·] of one request, per group (one bincount per distinct moment, in one call)
        moments = _group_sums(ps, vm[_M_V] * um[_M_U] * ind[_M_I] * p[sel], n_seg)
        # the groups drawn here only (each group's matrix and draw is its own; the normal
        # numbers are drawn for every group, so the stream moves on as it always did)
        g = np.flatnonzero(clt)
        mu = moments[_MU_ROWS][:, g]  # (N_SUMS, G')
        second = np.vstack([moments[:, g], np.zeros(g.size)])[_PAIR_ROW]
        c = (second - mu[_PAIR_I] * mu[_PAIR_J]).T
        cov = np.empty((g.size, k, k))
        cov[:, _PAIR_I, _PAIR_J] = c
        cov[:, _PAIR_J, _PAIR_I] = c
        # a PSD square root (the matrix is singular where a part has no spread)
        evals, evecs = np.linalg.eigh(cov)
        root = evecs * np.sqrt(np.maximum(evals, 0.0))[:, None, :]
        z = rng.standard_normal((n_seg, k))[g]
        nf = n[g].astype(np.float64)
        draw = nf * mu + np.sqrt(nf) * np.einsum("gij,gj->ig", root, z)
        y1 = np.maximum(draw[0], 0.0)
        x1 = np.maximum(draw[2], 0.0)
        with np.errstate(divide="ignore", invalid="ignore"):
            inv_n = np.where(nf > 0, 1.0 / np.where(nf > 0, nf, 1.0), 0.0)
        y2 = np.maximum(draw[1], y1 * y1 * inv_n)  # no negative variance
        x2 = np.maximum(draw[3], x1 * x1 * inv_n)
        nl = np.clip(np.round(draw[5]), 0.0, nf)
        xl = np.clip(draw[6], 0.0, x1)
        x2l = np.clip(draw[7], 0.0, x2)
        out[:, g] = np.stack([y1, y2, x1, x2, draw[4], nl, xl, x2l])
    return out


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
    out: FloatArray,
) -> None:
    """Request-by-request draws for the groups with ``n > 0`` (sums added in place)."""
    total = int(n.sum())
    seg_of_req = np.repeat(np.arange(n.size), n)
    # one CDF over parts sorted by segment: segment s occupies (s, s + 1] after the offset
    order = _order_by_group(part_seg)
    ps = p[order]
    seg_sorted = part_seg[order]
    # the parts the search below can pick (every pick the same part as over all parts)
    starts = np.concatenate(([0], np.flatnonzero(seg_sorted[1:] != seg_sorted[:-1]) + 1))
    keep = searchable(ps, starts)
    order, ps, seg_sorted = order[keep], ps[keep], seg_sorted[keep]
    # the parts of one segment are contiguous once sorted: cumulate each run on its own
    cum = _run_cumsum(ps, seg_sorted)
    key = seg_sorted + np.minimum(cum, 1.0)
    u = rng.random((4, total))
    pick = np.searchsorted(key, seg_of_req + u[0] * (1 - 1e-12), side="left")
    pick = order[np.minimum(pick, order.size - 1)]
    v = pop.sample_values(part_cell[pick], u[1])
    quality = q_mean[pick] + q_sd[pick] * _norm(u[2])
    ok = u[3] < in_time[pick]
    y = np.where(ok, v * quality, 0.0)
    late = (~ok).astype(np.float64)
    cols = np.stack((y, y * y, v, v * v, v * y, late, v * late, v * v * late))
    out += _group_sums(seg_of_req, cols, n.size)


def _run_cumsum(x: FloatArray, run: IntArray) -> FloatArray:
    """The cumulative sum of ``x`` restarted at every run of equal ``run`` values (``run``
    sorted): ``np.cumsum`` of each run, all at once — the runs laid out as the rows of a
    zero-padded matrix, cumulated along the rows (a cumulative sum adds one element after the
    other, so each row's sums are its run's own)."""
    if x.size == 0:
        return np.zeros_like(x)
    starts = np.flatnonzero(np.concatenate(([True], run[1:] != run[:-1])))
    lengths = np.diff(np.append(starts, x.size))
    row = np.repeat(np.arange(starts.size), lengths)
    pos = np.arange(x.size) - starts[row]
    grid = np.zeros((starts.size, int(lengths.max())))
    grid[row, pos] = x
    return np.asarray(np.cumsum(grid, axis=1)[row, pos])


def _norm(u: FloatArray) -> FloatArray:
    return np.asarray(ndtri(np.clip(u, 1e-12, 1 - 1e-12)))
