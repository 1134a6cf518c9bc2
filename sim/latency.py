"""Latency of the simulated ranking path: a queue per stage, and a window's latency sample.

Pure: no clock, no global random state.

A request's latency (ms)::

    L = overhead + F_cpu + W_cpu + F_acc + W_acc + S·J + penalty

* ``S`` is the request's own service time: its CPU work divided by the threads that score its
  candidates in parallel (:attr:`LatencyConfig.cpu_parallelism`), plus its accelerator work (one
  device scores one request's batch). ``J`` is a log-normal jitter with mean 1 and coefficient of
  variation :attr:`LatencyConfig.service_cv` (real forward passes and feature look-ups vary).
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
separately — baseline work on the dedicated capacity, optional work on the opportunistic quota —
but requests share one queue, so the stage's throughput is set by whichever is more loaded::

    ρ = max(baseline offered / dedicated, optional offered / quota)

Optional work beyond its quota is therefore *slowed* (it never runs on dedicated capacity), and
because everybody waits in the same queue, queueing grows for every request (logical isolation,
DESIGN §2).

:func:`sample_window` draws a fixed number of latencies for one SLO window, stratified by
(step, request class) and weighted by the class counts, and :func:`in_time_probability` gives
the share of a class that finishes within the timeout, from the same model in closed form (the
value a request delivers counts only if it finishes in time).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from streams.sketch import bin_keys

__all__ = [
    "RHO_FLUID_CAP",
    "RHO_QUEUE_CAP",
    "LatencyConfig",
    "StageState",
    "Stratum",
    "WaitParams",
    "in_time_probability",
    "sample_window",
    "sketch_from_keys",
    "wait_params",
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
    """Sakasegawa / Allen–Cunneen wait of an M/G/c stage (module docstring)."""
    if rho <= 0.0 or mean_service_ms <= 0.0 or servers <= 0.0:
        return NO_WAIT
    r = min(rho, RHO_QUEUE_CAP)
    c = max(servers, 1.0)
    p = r ** (math.sqrt(2.0 * (c + 1.0)) - 1.0)
    rate = 2.0 * c * (1.0 - r) / (mean_service_ms * (1.0 + cs2))
    return WaitParams(min(p, 1.0), rate)


@dataclass(frozen=True, slots=True)
class Stratum:
    """Requests of one class over one step: how many, and what they go through."""

    count: float
    service_ms: float  # mean own service time (CPU / parallelism + accelerator)
    f_cpu: tuple[float, float]  # fluid backlog of the CPU stage at the step's start and end (s)
    f_acc: tuple[float, float]  # same for the accelerator stage the class uses
    w_cpu: WaitParams
    w_acc: WaitParams
    penalty_ms: float = 0.0  # fixed extra (a failed strong attempt, a downgrade)
    path: int = 0  # 0 base, 1 rma, 2 sbm


def _jitter_sigma(cv: float) -> float:
    return math.sqrt(math.log1p(cv * cv))


def sample_window(
    strata: list[Stratum],
    cfg: LatencyConfig,
    timeout_ms: float,
    uniforms: FloatArray,
) -> tuple[FloatArray, FloatArray, IntArray]:
    """Latencies (ms, capped at the timeout), their weights, and their path, for one window.

    ``uniforms`` has shape (4, samples_per_window): the window's random numbers, drawn by the
    caller from a stream every policy shares (common random numbers). Samples are allocated to
    strata by count (largest remainder, at least one per non-empty stratum), so each sample
    stands for ``count / samples`` requests of its stratum.
    """
    counts = np.array([s.count for s in strata], dtype=np.float64)
    total = float(counts.sum())
    m = uniforms.shape[1]
    if total <= 0.0 or not strata:
        empty = np.zeros(0)
        return empty, empty, np.zeros(0, dtype=np.int64)
    alloc = _allocate(counts, m)
    idx = np.repeat(np.arange(len(strata)), alloc)
    k = idx.size
    u_pos, u_w1, u_w2, u_j = uniforms[:, :k]
    svc = np.array([s.service_ms for s in strata])[idx]
    pen = np.array([s.penalty_ms for s in strata])[idx]
    fc0 = np.array([s.f_cpu[0] for s in strata])[idx]
    fc1 = np.array([s.f_cpu[1] for s in strata])[idx]
    fa0 = np.array([s.f_acc[0] for s in strata])[idx]
    fa1 = np.array([s.f_acc[1] for s in strata])[idx]
    p1 = np.array([s.w_cpu.p for s in strata])[idx]
    r1 = np.array([s.w_cpu.rate for s in strata])[idx]
    p2 = np.array([s.w_acc.p for s in strata])[idx]
    r2 = np.array([s.w_acc.rate for s in strata])[idx]
    fluid_ms = 1000.0 * (fc0 + (fc1 - fc0) * u_pos + fa0 + (fa1 - fa0) * u_pos)
    w1 = _exp_wait(u_w1, p1, r1)
    w2 = _exp_wait(u_w2, p2, r2)
    sj = _jitter_sigma(cfg.service_cv)
    jitter = np.exp(sj * _ndtri(u_j) - 0.5 * sj * sj)
    lat = cfg.overhead_ms + fluid_ms + w1 + w2 + svc * jitter + pen
    np.minimum(lat, timeout_ms, out=lat)
    weights = counts[idx] / alloc[idx]
    paths = np.array([s.path for s in strata], dtype=np.int64)[idx]
    return lat, weights, paths


def _ndtri(u: FloatArray) -> FloatArray:
    from scipy.special import ndtri

    return np.asarray(ndtri(np.clip(u, 1e-12, 1 - 1e-12)))


def _exp_wait(u: FloatArray, p: FloatArray, rate: FloatArray) -> FloatArray:
    """Inverse CDF of the wait: 0 with probability 1 − p, else Exp(rate) (one uniform each)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        tail = (1.0 - u) / np.where(p > 0, p, 1.0)
        w = np.where(u > 1.0 - p, -np.log(np.clip(tail, 1e-300, 1.0)) / rate, 0.0)
    return np.asarray(w)


def _allocate(counts: FloatArray, m: int) -> IntArray:
    """Integer sample counts ∝ ``counts`` summing to ≈ m, at least 1 per non-empty stratum."""
    nz = counts > 0
    share = counts / counts.sum() * m
    base = np.floor(share).astype(np.int64)
    rem = m - int(base.sum())
    if rem > 0:
        order = np.argsort(-(share - base), kind="stable")[:rem]
        base[order] += 1
    base[nz & (base == 0)] = 1
    base[~nz] = 0
    return base


def in_time_probability(s: Stratum, cfg: LatencyConfig, timeout_ms: float) -> float:
    """Share of a stratum's requests that finish within ``timeout_ms`` (closed form).

    Averages, over the arrival's position in the step (5-point Gauss–Legendre) and the service
    jitter (3-point Gauss–Hermite), the tail of the two stochastic waits: with
    ``x = timeout − overhead − fluid − S·J − penalty``,
    ``P(W1 + W2 > x) = p1(1−p2)e^{−r1x} + p2(1−p1)e^{−r2x} + p1p2·P(E1 + E2 > x)``
    (hypoexponential tail for the last term).
    """
    if s.count <= 0:
        return 1.0
    fixed = cfg.overhead_ms + s.penalty_ms
    f_hi = 1000.0 * (max(s.f_cpu) + max(s.f_acc))
    # quick exit: even the slowest case leaves a margin the waits almost never cover
    j_hi = math.exp(3.0 * _jitter_sigma(cfg.service_cv))
    margin = timeout_ms - fixed - f_hi - s.service_ms * j_hi
    if margin > 0:
        bound = s.w_cpu.p * math.exp(-s.w_cpu.rate * margin / 2.0) + s.w_acc.p * math.exp(
            -s.w_acc.rate * margin / 2.0
        )
        if bound < 1e-9:
            return 1.0
    sj = _jitter_sigma(cfg.service_cv)
    total = 0.0
    for pos, wp in _GL5:
        f_cpu = s.f_cpu[0] + (s.f_cpu[1] - s.f_cpu[0]) * pos
        fluid = 1000.0 * (f_cpu + s.f_acc[0] + (s.f_acc[1] - s.f_acc[0]) * pos)
        for z, wj in _GH3:
            svc = s.service_ms * math.exp(sj * z - 0.5 * sj * sj)
            x = timeout_ms - fixed - fluid - svc
            total += wp * wj * (1.0 - _tail2(x, s.w_cpu, s.w_acc))
    return min(1.0, max(0.0, total))


def _tail2(x: float, a: WaitParams, b: WaitParams) -> float:
    """P(W_a + W_b > x) for two independent atom-at-zero + exponential waits."""
    if x <= 0.0:
        return 1.0
    p1, r1, p2, r2 = a.p, a.rate, b.p, b.rate
    e1 = math.exp(-r1 * x) if p1 > 0 else 0.0
    e2 = math.exp(-r2 * x) if p2 > 0 else 0.0
    both = 0.0
    if p1 > 0 and p2 > 0:
        if abs(r1 - r2) < 1e-9 * max(r1, r2):
            both = (1.0 + r1 * x) * e1
        else:
            both = (r2 * e1 - r1 * e2) / (r2 - r1)
    return p1 * (1 - p2) * e1 + p2 * (1 - p1) * e2 + p1 * p2 * both


# 5-point Gauss–Legendre on [0, 1] (position in the step) and 3-point Gauss–Hermite
# (probabilists' weights) for the jitter: exact for the linear fluid term, plenty for the rest.
_GL5 = [
    (0.5 - 0.4530899229693320, 0.1184634425280945),
    (0.5 - 0.2692346550528416, 0.2393143352496832),
    (0.5, 0.2844444444444444),
    (0.5 + 0.2692346550528416, 0.2393143352496832),
    (0.5 + 0.4530899229693320, 0.1184634425280945),
]
_GH3 = [(-math.sqrt(3.0), 1.0 / 6.0), (0.0, 2.0 / 3.0), (math.sqrt(3.0), 1.0 / 6.0)]


def sketch_from_keys(
    keys: IntArray, weights: FloatArray, total: int, alpha: float
) -> dict[str, object]:
    """A CONTRACT §2 sketch dict whose integer counts add up to ``total``: the weighted bin
    masses rounded by largest remainder (so a window's sketch holds one count per request)."""
    if total <= 0 or keys.size == 0:
        return {"alpha": alpha, "bins": {}, "zeros": 0}
    uniq, inv = np.unique(keys, return_inverse=True)
    mass = np.bincount(inv, weights=weights)
    mass = mass * (total / mass.sum())
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
