"""Latency of the simulated ranking path: a queue per stage, and a window's latency sample.

Pure: no clock, no global random state.

A request's latency (ms)::

    L = overhead + F_cpu + W_cpu + F_acc + W_acc + S·J + penalty

* ``S`` is the request's own service time: its CPU work divided by the threads that score its
  candidates in parallel (:attr:`LatencyConfig.cpu_parallelism`), plus its accelerator work (one
  device scores one request's batch); an RMA request's extras run on what its mixed replica's
  quota of the opportunistic level leaves them, trimmed to the optional budget
  (:func:`headroom.sim.context.build_mix`, the rule of :mod:`headroom.defences.replicas`).
  ``J`` is a log-normal jitter with mean 1 and coefficient of variation
  :attr:`LatencyConfig.service_cv` (real forward passes and feature look-ups vary).
* ``F`` is the *fluid* backlog of its stage: while a stage is offered more work than it can do,
  the delay of a new arrival grows by ``ρ − 1`` seconds per second (``ρ`` = offered / capacity of
  the binding resource, capped at :data:`RHO_FLUID_CAP`) and drains at ``1 − ρ`` afterwards. It
  never exceeds :attr:`StageState.max_backlog_s` (servers drop requests past their deadline, so
  a backlog older than the timeout holds nothing).
* ``W`` is the stochastic wait of an ``M/G/c`` queue at the (capped) utilisation, Sakasegawa's
  approximation (H. Sakasegawa, "An approximation formula Lq ≈ α·ρ^β/(1−ρ)", Ann. Inst. Stat.
  Math. 29, 1977) with the Allen–Cunneen factor ``(1 + C_s²)/2`` for general service times::

      P(wait) = ρ^(√(2(c+1)) − 1),      wait | wait ~ Exp(rate = 2·c·(1−ρ) / (E[S]·(1 + C_s²)))

  so ``E[W] = P(wait) / rate`` is Sakasegawa's ``Lq/λ`` for ``c`` servers; it works for a
  fractional ``c`` (a pool of 2.5 device equivalents), which Erlang's formula does not.

Stages: the CPU stage and the accelerator stage of the *mixed* replicas (dedicated capacity plus
the opportunistic quota RMA holds), and the accelerator stage of the *strong* replicas (SBM's
opportunistic devices only). On the mixed replicas the two kinds of work are accounted
separately — baseline work on the dedicated capacity, optional work on the opportunistic quota.

Baseline first. A mixed replica serves every request's *baseline part* (its base candidates)
before any *optional part* (RMA's extra candidates), and optional work never holds more than its
quota (the streaming server's slot pools, headroom.workers.server, do the same):

* a baseline part waits in an ``M/G/c`` queue of the baseline work alone, on the dedicated
  servers plus the quota's servers optional work leaves idle (:func:`baseline_wait_params`):
  never longer than under static, where it has the dedicated servers only. Its fluid backlog is
  the baseline work's on the dedicated capacity (``baseline offered / dedicated``), as static's;
* an optional part waits at low priority in the whole stage, whose throughput is set by
  whichever kind of work is more loaded, ``ρ = max(baseline offered / dedicated, optional
  offered / quota)``: the stage's wait stretched by ``1 / (1 − ρ_H)`` (non-preemptive priority,
  Cobham's formula; ``ρ_H`` the share of the stage the baseline keeps busy,
  :func:`low_priority_factor`). Optional work beyond its quota is *slowed* (it never runs on
  dedicated capacity) and its fluid backlog is its own: it delays the requests that carry
  optional work, never a request without it;
* a request with optional work waits for both parts, one after the other
  (:func:`serial_waits` folds the two waits of a stage into one).

Optional budget. A request's optional part that cannot start within its *optional budget*
(:func:`headroom.defences.shedding.optional_budget_ms`: ``OPTIONAL_BUDGET_SHARE`` of the SLO,
counted from the request's arrival at its server, here from the end of its baseline CPU part) is
dropped and the request goes on with its baseline answer, as the streaming servers drop extras
still waiting at the deadline. RMA's extras (the droppable parts, :class:`Strata` ``po``…
``budget_ms``) wait at low priority on both mixed stages, one wait standing for the two
(:func:`serial_waits`) plus their own fluid backlog; the request's baseline parts keep the
baseline waits. A sampled request adds that wait when it is within the budget, else the budget
minus the optional service it then never gets (:func:`sample_window`), and
:func:`optional_outcome` gives, per stratum, the in-time share and the share of it whose extras
started (the rest delivered the baseline value; the engine credits RMA only with those). The
SBM path's CPU work is not droppable: a strong attempt falls back as a whole.

:func:`sample_window` draws a fixed number of latencies for one SLO window, stratified by
(step, request class) and weighted by the class counts, and :func:`in_time_probability` gives
the share of a class that finishes within the timeout, from the same model in closed form (the
value a request delivers counts only if it finishes in time).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import numpy.typing as npt
from scipy.special import ndtri

from headroom.kernel.sketch import bin_keys

__all__ = [
    "RHO_FLUID_CAP",
    "RHO_QUEUE_CAP",
    "STRATA_FIELDS",
    "LatencyConfig",
    "StageState",
    "Strata",
    "WaitParams",
    "allocate_samples",
    "baseline_wait_params",
    "in_time_probability",
    "low_priority_factor",
    "optional_outcome",
    "sample_window",
    "serial_waits",
    "sketch_from_keys",
    "sketch_from_mass",
    "speed",
    "wait_params",
    "wait_params_array",
]

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]

# The stochastic wait uses ρ ≤ 0.99: beyond it the fluid backlog carries the delay (a queue at
# ρ ≥ 1 has no steady state; Sakasegawa's formula diverges).
RHO_QUEUE_CAP = 0.99
# The fluid backlog grows at ρ − 1 s/s with ρ capped here: capacity that vanished entirely
# (ρ = ∞) makes the delay reach any timeout within a fraction of a second, which is what it does.
RHO_FLUID_CAP = 20.0


@dataclass(frozen=True, slots=True)
class LatencyConfig:
    overhead_ms: float = 5.0  # network, (de)serialisation, blending: paid by every request
    cpu_parallelism: float = 4.0  # threads scoring one request's candidates
    service_cv: float = 0.25  # coefficient of variation of a service time
    samples_per_window: int = 2048  # latencies drawn per region per SLO window


@dataclass(slots=True)
class StageState:
    """Fluid backlog of one stage, in seconds of delay for a new arrival."""

    backlog_s: float = 0.0
    max_backlog_s: float = 1.0

    def advance(self, rho: float, dt: float) -> tuple[float, float]:
        """Move ``dt`` seconds at utilisation ``rho``; returns the backlog at start and end."""
        b0 = self.backlog_s
        r = min(rho, RHO_FLUID_CAP)
        b1 = min(max(b0 + (r - 1.0) * dt, 0.0), self.max_backlog_s)
        self.backlog_s = b1
        return b0, b1


@dataclass(frozen=True, slots=True)
class WaitParams:
    """Stochastic wait of one stage over one step: P(wait > 0) and the exponential rate (1/ms)."""

    p: float
    rate: float

    @property
    def mean_ms(self) -> float:
        return self.p / self.rate if self.rate > 0 else 0.0


NO_WAIT = WaitParams(0.0, 1.0)


def wait_params(rho: float, servers: float, mean_service_ms: float, cs2: float) -> WaitParams:
    """Sakasegawa / Allen–Cunneen wait of an M/G/c stage (module docstring).

    A stage of fewer than one unit (a slice of a device) is one server of that speed: its service
    times stretch by ``1/servers`` (:func:`speed`), and so does the wait.
    """
    if rho <= 0.0 or mean_service_ms <= 0.0 or servers <= 0.0:
        return NO_WAIT
    return WaitParams(*wait_pair(rho, servers, mean_service_ms, cs2))


def wait_pair(
    rho: float, servers: float, mean_service_ms: float, cs2: float
) -> tuple[float, float]:
    """:func:`wait_params` as a plain ``(p, rate)`` pair (the engine's per-step health reading
    takes three a step)."""
    if rho <= 0.0 or mean_service_ms <= 0.0 or servers <= 0.0:
        return NO_WAIT.p, NO_WAIT.rate
    r = min(rho, RHO_QUEUE_CAP)
    c = max(servers, 1.0)
    mean = mean_service_ms / speed(servers)
    p = r ** (math.sqrt(2.0 * (c + 1.0)) - 1.0)
    rate = 2.0 * c * (1.0 - r) / (mean * (1.0 + cs2))
    return min(p, 1.0), rate


def wait_params_array(
    rho: FloatArray,
    servers: FloatArray,
    mean_service_ms: float | FloatArray,
    cs2: float | FloatArray,
) -> tuple[FloatArray, FloatArray]:
    """:func:`wait_params` over arrays of utilisations and server counts: ``(p, rate)``. The
    mean service time and its squared variation may be arrays too (one per entry)."""
    rho = np.asarray(rho, dtype=np.float64)
    servers = np.broadcast_to(np.asarray(servers, dtype=np.float64), rho.shape)
    live = (rho > 0.0) & (servers > 0.0)
    if isinstance(mean_service_ms, np.ndarray):
        live &= mean_service_ms > 0.0
    elif mean_service_ms <= 0.0:
        return np.zeros(rho.shape), np.ones(rho.shape)
    r = np.minimum(rho, RHO_QUEUE_CAP)
    c = np.maximum(servers, 1.0)
    mean = mean_service_ms / np.where(servers > 0, np.minimum(servers, 1.0), 1.0)
    with np.errstate(divide="ignore", invalid="ignore"):
        p = np.where(live, np.minimum(r ** (np.sqrt(2.0 * (c + 1.0)) - 1.0), 1.0), 0.0)
        rate = np.where(live, 2.0 * c * (1.0 - r) / (mean * (1.0 + cs2)), 1.0)
    return p, rate


def baseline_wait_params(
    rho: FloatArray,
    dedicated: float,
    servers: FloatArray,
    rho_optional: FloatArray,
    mean_service_ms: float,
    cs2: float,
) -> tuple[FloatArray, FloatArray]:
    """Wait ``(p, rate)`` of the baseline parts on a mixed stage of ``servers`` servers (module
    docstring, *Baseline first*): the ``dedicated`` servers plus the ``servers − dedicated``
    quota servers, of which optional work keeps ``rho_optional`` busy, at the utilisation the
    baseline work (``rho`` of the dedicated servers) gives them. Optional work never holds more
    than its quota, so a baseline part always finds the dedicated servers, as under static, and
    the idle opportunistic ones besides: its wait is never longer than static's."""
    rho = np.asarray(rho, dtype=np.float64)
    spare = np.maximum(np.asarray(servers) - dedicated, 0.0) * np.clip(1.0 - rho_optional, 0, 1)
    eff = dedicated + spare
    with np.errstate(divide="ignore", invalid="ignore"):
        r = np.where(eff > 0, rho * dedicated / np.where(eff > 0, eff, 1.0), rho)
    return wait_params_array(r, eff, mean_service_ms, cs2)


def low_priority_factor(
    rho_base: FloatArray, base_servers: float, servers: FloatArray
) -> FloatArray:
    """``1 − ρ_H``, the factor on the wait rate of a stage's low-priority (optional) parts:
    ``ρ_H`` is the share of the whole stage (``servers``) the baseline keeps busy (``rho_base``
    of its ``base_servers``). Never below ``1 − RHO_QUEUE_CAP``: beyond, the fluid backlog
    carries the delay."""
    with np.errstate(divide="ignore", invalid="ignore"):
        rho_h = np.where(
            servers > 0, rho_base * base_servers / np.where(servers > 0, servers, 1.0), 1.0
        )
    return np.asarray(np.clip(1.0 - rho_h, 1.0 - RHO_QUEUE_CAP, 1.0))


def serial_waits(
    p1: FloatArray, r1: FloatArray, p2: FloatArray, r2: FloatArray
) -> tuple[FloatArray, FloatArray]:
    """One wait (an atom at 0 and an exponential) standing for two consecutive ones: the same
    chance of waiting at all and the same mean wait (the shape of the tail is approximate:
    given a wait, one exponential is more spread than a sum of two with the same mean)."""
    p = 1.0 - (1.0 - p1) * (1.0 - p2)
    with np.errstate(divide="ignore", invalid="ignore"):
        mean = np.where(p1 > 0, p1 / r1, 0.0) + np.where(p2 > 0, p2 / r2, 0.0)
        rate = np.where((p > 0) & (mean > 0), p / np.where(mean > 0, mean, 1.0), 1.0)
    return np.asarray(p), np.asarray(rate)


def speed(units: float) -> float:
    """Relative speed of one server of a stage with ``units`` units (1 from one unit up)."""
    return min(1.0, units) if units > 0 else 1.0


@dataclass(frozen=True, slots=True)
class Strata:
    """Requests of several (step, class) strata, one array entry each: how many, and what they
    go through. Times: ``service_ms``/``penalty_ms`` in ms, fluid backlogs in s."""

    count: FloatArray
    service_ms: FloatArray  # mean own service time (CPU / parallelism + accelerator)
    penalty_ms: FloatArray  # fixed extra (a failed strong attempt, a downgrade)
    fc0: FloatArray  # fluid backlog of the CPU stage at the step's start and end (s)
    fc1: FloatArray
    fa0: FloatArray  # same for the accelerator stage the class uses
    fa1: FloatArray
    p1: FloatArray  # CPU stage wait: P(wait > 0) and exponential rate (1/ms)
    r1: FloatArray
    p2: FloatArray  # accelerator stage wait
    r2: FloatArray
    path: IntArray  # 0 base, 1 rma, 2 sbm
    # The optional part a request may drop (module docstring, *Optional budget*): its wait for
    # capacity at low priority, P(wait > 0) and rate (1/ms) and its fluid backlog (s, at the
    # step's start and end), its own service time (ms, inside ``service_ms``) and the longest it
    # may wait (ms; inf: nothing to drop). None: no stratum has a droppable part.
    po: FloatArray | None = None
    ro: FloatArray | None = None
    fo0: FloatArray | None = None
    fo1: FloatArray | None = None
    opt_ms: FloatArray | None = None
    budget_ms: FloatArray | None = None

    @property
    def size(self) -> int:
        return int(self.count.size)

    @property
    def droppable(self) -> bool:
        return self.budget_ms is not None

    def take(self, mask: npt.NDArray[np.bool_]) -> Strata:
        return self._select(mask)

    def take_index(self, idx: IntArray) -> Strata:
        return self._select(idx)

    def _select(self, sel: npt.NDArray[Any]) -> Strata:
        picked: dict[str, Any] = {}
        for f in STRATA_FIELDS:
            x = getattr(self, f)
            picked[f] = None if x is None else x[sel]
        return Strata(**picked)

    def optional(
        self,
    ) -> tuple[FloatArray, FloatArray, FloatArray, FloatArray, FloatArray, FloatArray]:
        """``(po, ro, fo0, fo1, opt_ms, budget_ms)``; zeros and an infinite budget (nothing to
        drop) where the strata carry none."""
        if (
            self.po is None
            or self.ro is None
            or self.fo0 is None
            or self.fo1 is None
            or self.opt_ms is None
            or self.budget_ms is None
        ):
            z = np.zeros(self.size)
            return z, np.ones(self.size), z, z, z, np.full(self.size, np.inf)
        return self.po, self.ro, self.fo0, self.fo1, self.opt_ms, self.budget_ms

    def with_optional(self) -> Strata:
        """The same strata with the optional-part fields filled (nothing to drop where None)."""
        if self.droppable:
            return self
        po, ro, fo0, fo1, opt_ms, budget_ms = self.optional()
        return replace(self, po=po, ro=ro, fo0=fo0, fo1=fo1, opt_ms=opt_ms, budget_ms=budget_ms)


STRATA_FIELDS = (
    "count", "service_ms", "penalty_ms", "fc0", "fc1", "fa0", "fa1", "p1", "r1", "p2", "r2",
    "path", "po", "ro", "fo0", "fo1", "opt_ms", "budget_ms",
)  # fmt: skip


def _jitter_sigma(cv: float) -> float:
    return math.sqrt(math.log1p(cv * cv))


def sample_window(
    st: Strata,
    cfg: LatencyConfig,
    timeout_ms: float,
    uniforms: FloatArray,
    *,
    allocated: bool = False,
    index: IntArray | None = None,
) -> tuple[FloatArray, FloatArray, IntArray]:
    """Latencies (ms, capped at the timeout), their weights, and their path, for one window.

    ``uniforms`` has shape (4, samples): the window's random numbers, drawn by the caller from
    a stream every policy shares (common random numbers). Samples are allocated to strata by
    count (largest remainder, at least one per non-empty stratum), so each sample stands for
    ``count / samples`` requests of its stratum. ``allocated``: one sample per stratum, the
    caller allocated them; ``index``: one sample per entry, of the stratum it names (the same
    as ``allocated`` on ``st.take_index(index)``, without copying every field first).
    """
    m = uniforms.shape[1]
    if index is not None:
        idx = index
        counts = st.count[idx]  # per sample: its stratum's count (one sample each)
    else:
        counts = st.count
    total = float(counts.sum()) if counts.size else 0.0
    if total <= 0.0:
        empty = np.zeros(0)
        return empty, empty, np.zeros(0, dtype=np.int64)
    if index is None:
        # allocated: one sample per stratum entry, the caller allocated them
        alloc = np.ones(counts.size, dtype=np.int64) if allocated else allocate_samples(counts, m)
        idx = np.repeat(np.arange(counts.size), alloc)
    k = idx.size
    u_pos, u_w1, u_w2, u_j = uniforms[:, :k]
    fc0 = st.fc0[idx]
    fa0 = st.fa0[idx]
    fluid_ms = 1000.0 * (
        fc0 + (st.fc1[idx] - fc0) * u_pos
        + fa0 + (st.fa1[idx] - fa0) * u_pos
    )  # fmt: skip
    w1 = _exp_wait(u_w1, st.p1[idx], st.r1[idx])
    w2 = _exp_wait(u_w2, st.p2[idx], st.r2[idx])
    sj = _jitter_sigma(cfg.service_cv)
    jitter = np.exp(sj * _ndtri(u_j) - 0.5 * sj * sj)
    lat = cfg.overhead_ms + fluid_ms + w1 + w2 + st.service_ms[idx] * jitter + st.penalty_ms[idx]
    if st.droppable:
        at, delay = _optional_delay(st, idx, u_pos, u_w1, u_w2, jitter)
        lat[at] += delay
    np.minimum(lat, timeout_ms, out=lat)
    weights = counts / 1.0 if index is not None else counts[idx] / alloc[idx]
    return lat, weights, st.path[idx]


def _optional_delay(
    st: Strata,
    idx: IntArray,
    u_pos: FloatArray,
    u_w1: FloatArray,
    u_w2: FloatArray,
    jitter: FloatArray,
) -> tuple[IntArray, FloatArray]:
    """What a droppable optional part adds to its request (module docstring, *Optional
    budget*): its wait when it starts within its budget, else the budget, minus the optional
    service it then never gets. Its own uniform is ``(u_w1 + u_w2) mod 1``, uniform and
    independent of either wait's uniform, which keeps the policies' common random numbers as
    they were. Returns the samples it adds to and what it adds: a stratum whose optional part
    has no chance of waiting, no backlog and a budget it cannot miss adds exactly 0."""
    po, ro, fo0, fo1, opt_ms, budget_ms = st.optional()
    adds = (po > 0.0) | (fo0 != 0.0) | (fo1 != 0.0) | ~(budget_ms >= 0.0)
    at = np.flatnonzero(adds[idx])
    i = idx[at]
    fo = 1000.0 * (fo0[i] + (fo1[i] - fo0[i]) * u_pos[at])
    w = fo + _exp_wait(np.mod(u_w1[at] + u_w2[at], 1.0), po[i], ro[i])
    budget = budget_ms[i]
    kept = w <= budget
    return at, np.where(kept, w, budget - opt_ms[i] * jitter[at])


def _ndtri(u: FloatArray) -> FloatArray:
    return np.asarray(ndtri(np.clip(u, 1e-12, 1 - 1e-12)))


def _exp_wait(u: FloatArray, p: FloatArray, rate: FloatArray) -> FloatArray:
    """Inverse CDF of the wait: 0 with probability 1 − p, else Exp(rate) (one uniform each).
    The logarithm is taken only of the uniforms that wait (most do not)."""
    waits = u > 1.0 - p
    w = np.zeros(np.shape(waits))
    at = np.flatnonzero(waits)
    if at.size:
        uw, pw = u[at], p[at]
        with np.errstate(divide="ignore", invalid="ignore"):
            tail = (1.0 - uw) / np.where(pw > 0, pw, 1.0)
            w[at] = -np.log(np.clip(tail, 1e-300, 1.0)) / rate[at]
    return w


def allocate_samples(counts: FloatArray, m: int) -> IntArray:
    """Integer sample counts ∝ ``counts`` summing to ≤ m, at least 1 per non-empty stratum."""
    nz = counts > 0
    share = counts / counts.sum() * m
    base = np.floor(share).astype(np.int64)
    rem = m - int(base.sum())
    if rem > 0:
        order = np.argsort(-(share - base), kind="stable")[:rem]
        base[order] += 1
    base[nz & (base == 0)] = 1
    base[~nz] = 0
    excess = int(base.sum()) - m
    if excess > 0:  # the one-per-stratum floor overshot: take from the largest allocations
        for i in np.argsort(-base, kind="stable"):
            if excess <= 0:
                break
            take = min(excess, int(base[i]) - 1)
            base[i] -= take
            excess -= take
    return np.asarray(base, dtype=np.int64)


def in_time_probability(st: Strata, cfg: LatencyConfig, timeout_ms: float) -> FloatArray:
    """Per stratum, the share of requests that finish within ``timeout_ms`` (closed form).

    Averages, over the arrival's position in the step (5-point Gauss–Legendre) and the service
    jitter (3-point Gauss–Hermite), the tail of the two stochastic waits: with
    ``x = timeout − overhead − fluid − S·J − penalty``,
    ``P(W1 + W2 > x) = p1(1−p2)e^{−r1x} + p2(1−p1)e^{−r2x} + p1p2·P(E1 + E2 > x)``
    (hypoexponential tail for the last term). Strata whose slowest case still leaves a margin
    the waits exceed with probability < 1e-9 are counted as all in time without the quadrature.
    """
    out = np.ones(st.size)
    if st.size == 0:
        return out
    sj = _jitter_sigma(cfg.service_cv)
    fixed = cfg.overhead_ms + st.penalty_ms
    f_hi = 1000.0 * (np.maximum(st.fc0, st.fc1) + np.maximum(st.fa0, st.fa1))
    margin = timeout_ms - fixed - f_hi - st.service_ms * math.exp(3.0 * sj)
    with np.errstate(over="ignore"):
        bound = st.p1 * np.exp(-st.r1 * np.maximum(margin, 0) / 2) + st.p2 * np.exp(
            -st.r2 * np.maximum(margin, 0) / 2
        )
    hot = (st.count > 0) & ((margin <= 0) | (bound >= 1e-9))
    if not hot.any():
        return out
    h = st.take(hot)
    pos = _GL_X[:, None, None]
    wpos = _GL_W[:, None, None]
    z = _GH_X[None, :, None]
    wz = _GH_W[None, :, None]
    fluid = 1000.0 * (h.fc0 + (h.fc1 - h.fc0) * pos + h.fa0 + (h.fa1 - h.fa0) * pos)
    svc = h.service_ms * np.exp(sj * z - 0.5 * sj * sj)
    x = timeout_ms - (cfg.overhead_ms + h.penalty_ms) - fluid - svc  # (5, 3, n)
    tail = _tail2_array(x, h.p1, h.r1, h.p2, h.r2)
    p_in = ((1.0 - tail) * wpos * wz).sum(axis=(0, 1))
    out[hot] = np.clip(p_in, 0.0, 1.0)
    return out


def optional_outcome(
    st: Strata, cfg: LatencyConfig, timeout_ms: float
) -> tuple[FloatArray, FloatArray]:
    """Per stratum, ``(pi, keep)``: the share of requests that finish within ``timeout_ms``
    and, of those, the share whose optional part started within its budget (the rest dropped
    it and delivered the baseline; module docstring, *Optional budget*). Strata with nothing to
    drop: :func:`in_time_probability` and 1.

    Closed form at the step's mid-point backlog ``f``: a part starts in time with probability
    ``κ = 1 − p_o·e^{−r_o(D − f)}`` (0 when ``f > D``); one that starts adds its wait given
    that, one that does not adds ``D`` and loses its optional service."""
    if not st.droppable:
        return in_time_probability(st, cfg, timeout_ms), np.ones(st.size)
    keep = np.ones(st.size)
    drop = np.isfinite(st.optional()[5]) & (st.count > 0)
    if not drop.any():
        return in_time_probability(st, cfg, timeout_ms), keep
    pi = np.ones(st.size)
    pi[~drop] = in_time_probability(st.take(~drop), cfg, timeout_ms)
    h = st.take(drop)
    h_po, h_ro, h_fo0, h_fo1, h_opt, h_budget = h.optional()
    f = 500.0 * (h_fo0 + h_fo1)
    room = h_budget - f
    lim = np.maximum(room, 0.0)
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        e = np.exp(-h_ro * lim)
        kappa = np.where(room < 0.0, 0.0, np.clip(1.0 - h_po * e, 0.0, 1.0))
        # E[X; X ≤ L] for X = 0 w.p. 1 − p, Exp(r) w.p. p: p·(1/r − e^{−rL}(L + 1/r))
        part = np.nan_to_num(h_po * (1.0 / h_ro - e * (lim + 1.0 / h_ro)))
        mean_kept = f + np.where(kappa > 0.0, part / np.maximum(kappa, 1e-300), 0.0)
    plain: dict[str, Any] = dict.fromkeys(STRATA_FIELDS[12:])
    kept = replace(h, penalty_ms=h.penalty_ms + mean_kept, **plain)
    dropped = replace(
        h, service_ms=h.service_ms - h_opt, penalty_ms=h.penalty_ms + h_budget, **plain
    )
    pi_k = in_time_probability(kept, cfg, timeout_ms)
    pi_d = in_time_probability(dropped, cfg, timeout_ms)
    p = kappa * pi_k + (1.0 - kappa) * pi_d
    pi[drop] = p
    with np.errstate(invalid="ignore", divide="ignore"):
        keep[drop] = np.where(p > 0.0, kappa * pi_k / np.where(p > 0.0, p, 1.0), kappa)
    return pi, keep


def _tail2_array(
    x: FloatArray, p1: FloatArray, r1: FloatArray, p2: FloatArray, r2: FloatArray
) -> FloatArray:
    """P(W_a + W_b > x) for independent atom-at-zero + exponential waits (broadcast)."""
    xp = np.maximum(x, 0.0)
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        e1 = np.where(p1 > 0, np.exp(-r1 * xp), 0.0)
        e2 = np.where(p2 > 0, np.exp(-r2 * xp), 0.0)
        same = np.abs(r1 - r2) < 1e-9 * np.maximum(r1, r2)
        both = np.where(
            same, (1.0 + r1 * xp) * e1, (r2 * e1 - r1 * e2) / np.where(same, 1.0, r2 - r1)
        )
        t = p1 * (1 - p2) * e1 + p2 * (1 - p1) * e2 + p1 * p2 * both
    return np.where(x <= 0.0, 1.0, np.clip(np.nan_to_num(t, nan=1.0), 0.0, 1.0))


# 5-point Gauss–Legendre on [0, 1] (position in the step) and 3-point Gauss–Hermite
# (probabilists' weights) for the jitter: exact for the linear fluid term, plenty for the rest.
_GL_X = 0.5 + np.array(
    [-0.4530899229693320, -0.2692346550528416, 0.0, 0.2692346550528416, 0.4530899229693320]
)
_GL_W = np.array(
    [
        0.1184634425280945,
        0.2393143352496832,
        0.2844444444444444,
        0.2393143352496832,
        0.1184634425280945,
    ]
)
_GH_X = np.array([-math.sqrt(3.0), 0.0, math.sqrt(3.0)])
_GH_W = np.array([1.0 / 6.0, 2.0 / 3.0, 1.0 / 6.0])


def sketch_from_keys(
    keys: IntArray, weights: FloatArray, total: int, alpha: float
) -> dict[str, object]:
    """A docs/messages.md sketch dict whose integer counts add up to ``total``: the weighted bin
    masses rounded by largest remainder (so a window's sketch holds one count per request)."""
    if total <= 0 or keys.size == 0:
        return {"alpha": alpha, "bins": {}, "zeros": 0}
    uniq, inv = np.unique(keys, return_inverse=True)
    mass = np.asarray(np.bincount(inv, weights=weights), dtype=np.float64)
    return sketch_from_mass(uniq, mass, total, alpha)


def sketch_from_mass(
    uniq: IntArray, mass: FloatArray, total: int, alpha: float
) -> dict[str, object]:
    """:func:`sketch_from_keys` from already summed masses per (sorted, unique) key."""
    msum = float(mass.sum()) if mass.size else 0.0
    if total <= 0 or msum <= 0:
        return {"alpha": alpha, "bins": {}, "zeros": 0}
    mass = mass * (total / msum)
    counts = np.floor(mass).astype(np.int64)
    rem = total - int(counts.sum())
    if rem > 0:
        order = np.argsort(-(mass - counts), kind="stable")[:rem]
        counts[order] += 1
    keep = counts > 0
    return {
        "alpha": alpha,
        "bins": dict(zip(map(str, uniq[keep].tolist()), counts[keep].tolist(), strict=True)),
        "zeros": 0,
    }


def keys_of(lat_ms: FloatArray, alpha: float) -> IntArray:
    return np.asarray(bin_keys(lat_ms, alpha), dtype=np.int64)
