"""The client plan: which requests get optional work. One rule, for both engines.

Pure: no clock, no I/O, no global random state (the per-request form draws from an injected
``numpy.random.Generator``). The streaming client (:mod:`headroom.workers.client`) plans each
request with :class:`RequestPlanner`; the simulator (:mod:`headroom.sim.engine`) plans the shares
of its population's cells with :class:`CellPlanner`. Both read the rule from one
:class:`PlanRule`, so the engines cannot drift apart.

The rule
========
A request of segment ``s`` has a value, and a *value bin* ``k`` (its **stratum**): one of
``K`` (:data:`VALUE_BINS`) equal-probability bins of its value rank *within its segment*,
``k = min(K − 1, ⌊K · rank⌋)`` (:func:`value_stratum`). The target in force gives the RMA
candidates, the SBM coverage and each segment's routing probability ``p_s``; the client-side
multipliers ``m_rma``, ``m_sbm`` (AIMD on the health of responses,
:class:`headroom.defences.client_shedding.ClientShedder`) scale what is asked of the replicas.

1. **Holdout.** A share ``holdout`` (``world.holdout``) of all requests is the control arm: no
   optional work at all, whatever the target. Everything below is about the *treatment*
   requests, the other ``1 − holdout``.
2. **SBM routing.** ``p_s`` (0 while the target's coverage is 0; clipped to [0, 1]) is spent on
   the segment's highest values, bin by bin: an eligible request of bin ``k`` is routed with
   probability ``clip(k + 1 − (1 − p_s)·K, 0, 1)`` (:meth:`PlanRule.sbm_shares`) — the bins above
   value rank ``1 − p_s`` all, the bin holding it a random part, lower bins none; over the
   ``K`` bins that is a share ``p_s`` of the segment. Random *within* a bin, so that in every
   bin the routed requests (SBM's intent-to-treat group) and the others (RMA's) are random
   samples of the bin and the holdout estimate post-stratified on the bin stays unbiased.
   ``value_ranked_sbm=False`` routes a uniform share ``p_s`` of every bin instead. So does a
   segment the router is only *exploring*: with the target's exploration floor ``f``
   (``sbm.explore``; absent: 0), a segment with ``0 < p_s ≤ f`` has its share drawn at random
   from every bin — exploration measures the strong model on the segment, it need not take its
   highest values from RMA, whose levels pay most there.
3. **The strong replica's multiplier.** A routed request is *taken* by the strong model if its
   value rank among all recent requests is ≥ ``1 − m_sbm`` (the client shedder's rule: lowest
   value dropped first). A routed request not taken goes on to RMA like any other.
4. **RMA.** ``wanted = min(candidates, max) − base`` extra candidates per treatment request, times
   ``m_rma``, is a *budget* (:meth:`PlanRule.rma`). Value-ranked (the default): the share
   ``s = m_rma · wanted / (max − base)`` of all treatment requests gets ``max − base`` extras,
   spent highest value first on the requests the strong model did not take: the top
   ``min(1, s / left)`` of them by value, ``left`` the share of treatment requests not taken
   (:func:`rma_among`) — the same mean work per treatment request, where a better ad is worth
   most. Uniform (``value_ranked_rma=False``): every request not taken asks for ``wanted``
   extras and keeps them if its value rank is ≥ ``1 − m_rma`` (the client shedder's rule).
   **Per-stratum levels** (a target carrying ``rma.levels``, set by the control plane from the
   value curves; docs/controllers.md, "RMA levels"): a request the strong model did not take
   gets its stratum's level — segment ``s``'s entry for bin ``k``, clamped to [0, ``max −
   base``] (:meth:`PlanRule.level`) — and keeps it if its value rank is ≥ ``1 − m_rma`` (the
   client shedder's rule, lowest values shed first). The levels spend the target's mean; with
   no RMA budget (``candidates ≤ base``) nothing is spent, levels or not.
5. **Stored results.** Where the scenario enables precompute, the request's user is looked up in
   the result store *after* the plan is drawn, with the plan's holdout draw: a treatment request
   whose user has a servable stored result (unexpired, of its segment) is a *hit* and is served
   from that result — nothing of its plan runs live: no server call, so neither the baseline
   ranking nor RMA or SBM (:func:`serves_from_store`). A holdout request is ranked live whatever
   the store holds. The plan was drawn before the look-up, so the rankers and the routed share
   above count hits like any treatment request; a hit's planned optional work is simply not run.

The two forms
=============
*Per request* (:class:`RequestPlanner`, the client): two uniform draws per request, one for the
arm and one for SBM, drawn whatever the rule so the random stream does not depend on it. The
bin comes from the request's rank among recent requests of its segment, the strong multiplier's
keep from its rank among all recent requests (the caller's rankers); RMA's ``left`` is
``1 − r̂``, ``r̂`` the recent share of treatment requests the strong model took
(:class:`RoutedShare`), and "the top ``min(1, s/left)`` by value" is the request's rank among
recent not-taken treatment requests (a :class:`~headroom.defences.histogram.ValueRanker` that
observes each one before ranking it) being ≥ ``1 − min(1, s/left)``.

*Vectorised* (:class:`CellPlanner`, the simulator): the same rule as shares of the cells of a
:class:`ValueCells` population (segment × value bin, the value distribution known per cell):
``routed[c] = eligible · sbm_share(k, p_s)``; the strong replica keeps the share
``A_s[c] = P(V ≥ θ_s | c)`` of a cell, ``θ_s`` the value at global rank ``1 − m_sbm``, so it
takes ``routed · A_s``; a value threshold ``θ`` gives a cell's not-taken requests above it as
``(1 − routed) · A(θ) + routed · max(0, A(θ) − A_s)`` (routing is random within a bin, the
multiplier cuts by value), and value-ranked RMA's ``θ`` solves ``Σ_c share_c · that = s`` (every
not-taken request when ``s`` exceeds them: ``min(1, s/left)`` again). With levels, a cell's
not-taken requests above the multiplier's threshold get its level (:attr:`CellPlan.levels`; the
engine makes one request class per level in use). That is the exact expectation of the
per-request rule under the cell model. Step 5 vectorised (:meth:`CellPlan.live`): a share
``hit[c]`` of a cell's treatment requests served from the store is a random sample of the cell's
treatment requests whatever their plan (the plan is drawn before the look-up; whether a user has
a stored result does not depend on the request's value), so every lever's share of the cell keeps
``1 − hit[c]`` (:func:`live_share`).

A held target
=============
A target's routing probabilities are shares of the traffic it was sized for: the strong model's
devices were assigned for ``coverage × rate`` requests per second. While targets arrive every
control interval the controller re-sizes them as traffic moves. A target *held* past
:data:`HELD_AFTER_INTERVALS` intervals (the control plane is late or out; the TTL fallback still
ends it) keeps that absolute rate instead: its segment probabilities are multiplied by
``rate_then / rate_now`` (:func:`held_scale`; ``rate_then`` the client's request rate when it
applied the target, ``rate_now`` its rate now, both from a :class:`RateMeter`), clipped to [0, 1]
(:func:`held_shares`). Traffic that fell (a surge ending during an outage) leaves the devices as
busy as planned instead of idle; traffic that rose does not push the strong replicas past what
they were given. The factor moves down to a step of :data:`HELD_STEP`, is 1 within
:data:`HELD_DEADBAND` of equal rates, and stays within ``[1/HELD_MAX, HELD_MAX]``. RMA's levels
are per request and kept: its servers trim extras to what their level pays for.

Exploration is not the plan's: the controller's router keeps every segment's ``p_s`` at its
exploration floor while SBM runs (controllers/router.py), and the plan spends ``p_s`` as given.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

from headroom.defences.histogram import HistogramConfig, ValueRanker
from headroom.kernel.checks import FieldChecker
from headroom.kernel.errors import ConfigError

__all__ = [
    "HELD_AFTER_INTERVALS",
    "HELD_DEADBAND",
    "HELD_MAX",
    "HELD_STEP",
    "VALUE_BINS",
    "CellPlan",
    "CellPlanner",
    "PlanRule",
    "PlanTarget",
    "RateMeter",
    "RequestPlan",
    "RequestPlanner",
    "RmaSpend",
    "RoutedShare",
    "ValueCells",
    "held_rate_meter",
    "held_scale",
    "held_shares",
    "live_share",
    "rma_among",
    "serves_from_store",
    "value_stratum",
]

FloatArray = npt.NDArray[np.float64]

# Value bins per segment: the strata of the value signals (``ValueSignal.stratum``) and the bins
# SBM routing is spent over. The simulator's default ``value_bins``, so both engines hand the
# control plane the same strata.
VALUE_BINS = 8

# cached threshold results kept at most (the arrays are read-only)
_CACHE_MAX = 20_000


def value_stratum(segment_rank: float, bins: int = VALUE_BINS) -> int:
    """The value bin of a request whose value rank within its segment is ``segment_rank``:
    ``min(bins − 1, floor(bins · rank))`` (a rank outside [0, 1] or NaN is clamped)."""
    r = segment_rank if segment_rank == segment_rank else 0.0  # NaN -> the lowest bin
    return min(bins - 1, max(0, math.floor(bins * min(max(r, 0.0), 1.0))))


def _unit(x: float) -> float:
    """``x`` clipped to [0, 1]; NaN is 0."""
    return min(max(x, 0.0), 1.0) if x == x else 0.0


def _bin_share(k: Any, q: Any, bins: int) -> Any:
    """The part of value bin ``k``'s ranks ``[k/K, (k+1)/K)`` at or above ``1 − q``:
    ``clip(k + 1 − (1 − q)·K, 0, 1)``. Floats (one request) or numpy arrays (broadcast)."""
    x = (k + 1.0) - (1.0 - q) * bins
    if isinstance(x, float):  # one request: no numpy call on its path
        return min(max(x, 0.0), 1.0)
    return np.clip(x, 0.0, 1.0)


# a segment probability within this factor of the exploration floor is the floor (float noise)
_EXPLORE_TOL = 1.0 + 1e-9


# A target older than this many control intervals is held (module docstring, *A held target*).
HELD_AFTER_INTERVALS = 1.5
HELD_MAX = 2.0  # the held factor stays within [1/HELD_MAX, HELD_MAX]
HELD_DEADBAND = 0.1  # rates within 10 % of each other: factor 1
HELD_STEP = 0.05  # the factor moves in steps of this size


def held_scale(age_s: float, interval_s: float, rate_then: float, rate_now: float) -> float:
    """The factor on a target's segment probabilities ``age_s`` after it was issued (module
    docstring, *A held target*): 1 while it is not held or a rate is unknown (≤ 0 or not
    finite)."""
    if not age_s > HELD_AFTER_INTERVALS * interval_s:
        return 1.0
    if not (0.0 < rate_then < math.inf and 0.0 < rate_now < math.inf):
        return 1.0
    ratio = min(max(rate_then / rate_now, 1.0 / HELD_MAX), HELD_MAX)
    if abs(ratio - 1.0) < HELD_DEADBAND:
        return 1.0
    # down to a step: the strong model is never asked for more than the planned rate
    return max(math.floor(ratio / HELD_STEP + 1e-9) * HELD_STEP, 1.0 / HELD_MAX)


def held_shares(
    segments: Mapping[str, float], coverage: float, scale: float
) -> tuple[dict[str, float], float]:
    """A held target's segment probabilities and coverage: ``scale`` times the target's, each
    clipped to [0, 1]."""
    return {s: _unit(p * scale) for s, p in segments.items()}, _unit(coverage * scale)


class RateMeter:
    """A request rate (per second of scenario time): arrivals decayed ``e^(−age/tau_s)``, divided
    by the decayed time they cover, so a steady rate reads exactly from the first second."""

    def __init__(self, tau_s: float, now: float) -> None:
        if not (math.isfinite(tau_s) and tau_s > 0.0):
            raise ConfigError(f"tau_s: must be > 0, got {tau_s}")
        self.tau_s = float(tau_s)
        self._start = float(now)
        self._t = float(now)
        self._sum = 0.0

    def _advance(self, now: float) -> None:
        if now > self._t:
            self._sum *= math.exp(-(now - self._t) / self.tau_s)
            self._t = now

    def add(self, now: float, n: float = 1.0) -> None:
        """Count ``n`` arrivals at ``now`` (times never go back; an older one counts as now)."""
        self._advance(now)
        self._sum += n

    def add_spread(self, times: FloatArray, counts: FloatArray) -> None:
        """Count ``counts[j]`` arrivals at ``times[j]`` (ascending), at once."""
        if times.size == 0:
            return
        end = float(times[-1])
        self._advance(end)
        ages = np.maximum(end - times, 0.0)
        self._sum += float((counts * np.exp(-ages / self.tau_s)).sum())

    def rate(self, now: float) -> float:
        """Arrivals per second around ``now`` (0.0 before any time has passed)."""
        self._advance(now)
        covered = self.tau_s * -math.expm1(-(now - self._start) / self.tau_s)
        return self._sum / covered if covered > 0.0 else 0.0


def held_rate_meter(slo_window_s: float, now: float) -> RateMeter:
    """The request rate a held target is judged by: a :class:`RateMeter` over one SLO window
    (both engines measure it so)."""
    return RateMeter(slo_window_s, now)


def _explore(target: PlanTarget) -> float:
    """The target's exploration floor, in [0, 1] (0: none, every share value-ranked)."""
    return _unit(float(target.sbm_explore))


def rma_among(share: float, left: float) -> float:
    """The part of the requests the strong model did not take that value-ranked RMA treats: a
    budget of ``share`` (of all treatment requests) over ``left`` (the share not taken),
    ``min(1, share / left)`` — every one of them when the budget covers them."""
    if share <= 0.0:
        return 0.0
    return 1.0 if left <= share else share / left


def serves_from_store(*, control: bool, found: bool) -> bool:
    """Step 5 of the rule (module docstring), per request: whether a request whose plan put it in
    the holdout (``control``) and whose look-up ``found`` a servable stored result is served from
    that result — then nothing of its plan runs live (no server call: no baseline ranking, no
    RMA, no SBM). A holdout request never is."""
    return found and not control


def live_share(hit: npt.ArrayLike) -> FloatArray:
    """Step 5 vectorised: of the treatment requests of a cell (or segment), the share that still
    runs its plan live when a share ``hit`` of them is served from the store, ``1 − hit`` clipped
    to [0, 1] (NaN: no hit). The same share of every class of the plan: the hits are a random
    sample of the cell's treatment requests (:meth:`CellPlan.live`)."""
    h = np.nan_to_num(np.asarray(hit, dtype=np.float64), nan=0.0)
    return np.asarray(np.clip(1.0 - h, 0.0, 1.0), dtype=np.float64)


class PlanTarget(Protocol):
    """What the plan reads of a target (the client's ``TargetState``, the simulator's
    ``Targets``)."""

    @property
    def rma_candidates(self) -> int: ...

    @property
    def sbm_coverage(self) -> float: ...

    @property
    def sbm_segments(self) -> Mapping[str, float]: ...

    @property
    def rma_levels(self) -> Mapping[str, Sequence[int]]: ...

    @property
    def sbm_explore(self) -> float: ...


@dataclass(frozen=True, slots=True)
class RmaSpend:
    """What RMA asks under a target: ``extra`` candidates for each request that gets RMA (0: no
    RMA); value-ranked, ``share`` of all treatment requests get them (the budget); uniform, the
    requests not taken by the strong model whose value rank is ≥ ``1 − multiplier``."""

    extra: int
    share: float
    multiplier: float
    ranked: bool


@dataclass(frozen=True, slots=True)
class PlanRule:
    """The plan's settings: the holdout share, the candidate range and the two ranking rules.

    ``bins`` is the number of value bins per segment (:data:`VALUE_BINS` for the client; the
    simulator's population's ``value_bins``)."""

    holdout: float
    base: int
    max: int
    value_ranked_rma: bool = True
    value_ranked_sbm: bool = True
    bins: int = VALUE_BINS

    def __post_init__(self) -> None:
        c = FieldChecker()
        c.between("world.holdout", self.holdout, 0.0, 1.0, hi_open=True)
        c.integer("world.base_candidates", self.base, 0)
        c.integer("value_bins", self.bins, 1)
        if isinstance(self.bins, int):
            c.at_most("value_bins", self.bins, 64)
        c.raise_if_any()
        object.__setattr__(self, "max", max(self.base, self.max))

    @property
    def treat(self) -> float:
        """The treatment share, ``1 − holdout``."""
        return 1.0 - self.holdout

    @property
    def span(self) -> int:
        """Extra candidates a value-ranked RMA request gets: ``max − base``."""
        return self.max - self.base

    def segment_probability(self, target: PlanTarget | None, segment: str) -> float:
        """``p_s``: the target's routing probability of ``segment``, clipped to [0, 1]; 0 with no
        target, while its coverage is 0, or for a segment it does not name."""
        if target is None or not target.sbm_coverage > 0.0:
            return 0.0
        return _unit(float(target.sbm_segments.get(segment, 0.0)))

    def sbm_shares(self, p: npt.ArrayLike, explore: float = 0.0) -> FloatArray:
        """Per value bin, the share of an eligible treatment request routed to the strong model,
        for segment probabilities ``p`` (any shape; the bins are a new last axis of length
        ``bins``). Value-ranked: :func:`_bin_share`, which averages to ``p`` over the bins;
        uniform: ``p`` in every bin — also, value-ranked, for a segment only being explored
        (``0 < p ≤ explore``, the router's floor; module docstring, step 2)."""
        q = np.clip(np.nan_to_num(np.asarray(p, dtype=np.float64), nan=0.0), 0.0, 1.0)[..., None]
        if not self.value_ranked_sbm:
            return np.repeat(q, self.bins, axis=-1)
        k = np.arange(self.bins, dtype=np.float64)
        ranked = np.asarray(_bin_share(k, q, self.bins), dtype=np.float64)
        if explore > 0.0:
            ranked = np.where(q <= explore * _EXPLORE_TOL, q, ranked)
        return np.asarray(ranked, dtype=np.float64)

    def sbm_share(self, stratum: int, p: float, explore: float = 0.0) -> float:
        """:meth:`sbm_shares` for one request of value bin ``stratum``."""
        q = _unit(p)
        if not self.value_ranked_sbm or (explore > 0.0 and q <= explore * _EXPLORE_TOL):
            return q
        return float(_bin_share(float(stratum), q, self.bins))  # the same formula, one bin

    def level(self, levels: Mapping[str, Sequence[int]], segment: str, stratum: int) -> int:
        """Extra candidates a request of ``segment``'s value bin ``stratum`` gets under the
        target's per-stratum ``levels`` (module docstring, step 4): the segment's entry for the
        bin (a list of another length is read by value rank: entry ``⌊stratum·len/bins⌋``),
        clamped to [0, ``span``]; 0 for a segment the levels do not name."""
        row = levels.get(segment)
        if not row:
            return 0
        n = len(row)
        i = stratum if n == self.bins else (stratum * n) // self.bins
        x = row[min(max(i, 0), n - 1)]
        return min(max(int(x), 0), self.span) if x == x else 0

    def levels_by_cell(
        self, levels: Mapping[str, Sequence[int]], segments: Sequence[str]
    ) -> npt.NDArray[np.int64]:
        """:meth:`level` of every cell (segment ``s`` × value bin ``k``, index ``s·bins + k``)."""
        return np.array(
            [self.level(levels, seg, k) for seg in segments for k in range(self.bins)],
            dtype=np.int64,
        )

    def rma(self, candidates: int, multiplier: float) -> RmaSpend:
        """What RMA asks when the target asks for ``candidates`` and the client-side multiplier
        of the dedicated replicas is ``multiplier`` (module docstring, step 4)."""
        m = _unit(multiplier)
        wanted = max(0, min(candidates, self.max) - self.base)
        if wanted <= 0:
            return RmaSpend(0, 0.0, m, self.value_ranked_rma)
        if self.value_ranked_rma:
            return RmaSpend(self.span, m * wanted / self.span, m, True)
        return RmaSpend(wanted, m, m, False)


# ------------------------------------------------------------------------------------------------
# Per request (the streaming client)
# ------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RequestPlan:
    """What one request asks for: the control arm gets nothing optional."""

    control: bool
    strong: bool
    extra: int

    @property
    def lever(self) -> str | None:
        if self.strong:
            return "sbm"
        if self.extra > 0:
            return "rma"
        return None


class RoutedShare:
    """The recent share of treatment requests the strong model took, ``r̂``: a mean of the 0/1
    outcomes weighted ``2^(−age / half_life)``, age in treatment requests (the
    :class:`ValueRanker`'s horizon, ``HistogramConfig.half_life``). Normalised by the decayed
    count, so it has no start-up bias (0.0 before any request)."""

    def __init__(self, half_life: float = HistogramConfig().half_life) -> None:
        if not (math.isfinite(half_life) and half_life > 0.0):
            raise ConfigError(f"half_life: must be > 0, got {half_life}")
        self.half_life = half_life
        self._decay = 2.0 ** (-1.0 / half_life)
        self._routed = 0.0
        self._count = 0.0

    def add(self, routed: bool) -> float:
        """Count one treatment request; return the share with it counted."""
        self._routed = self._routed * self._decay + (1.0 if routed else 0.0)
        self._count = self._count * self._decay + 1.0
        return self.value

    @property
    def value(self) -> float:
        return self._routed / self._count if self._count > 0.0 else 0.0


class RequestPlanner:
    """The plan of one request at a time (module docstring, *Per request*).

    ``rng`` is the only source of randomness: one uniform for the arm, one for SBM, both drawn
    for every request whatever the rule, so the stream is the same under either.
    :attr:`rma_ranker` holds the values of recent not-taken treatment requests (value-ranked
    RMA's order), :attr:`routed_share` ``r̂`` over the same horizon.
    """

    def __init__(
        self,
        rule: PlanRule,
        rng: np.random.Generator,
        histogram: HistogramConfig | None = None,
    ) -> None:
        self.rule = rule
        self.rng = rng
        self.rma_ranker = ValueRanker(histogram)
        self.routed_share = RoutedShare((histogram or HistogramConfig()).half_life)

    def plan(
        self,
        *,
        segment: str,
        eligible: bool,
        target: PlanTarget,
        rma_multiplier: float,
        sbm_keeps: bool,
        sbm_available: bool,
        rma_keeps: bool = True,
        value: float | None = None,
        segment_rank: float = 1.0,
    ) -> RequestPlan:
        """``sbm_keeps`` / ``rma_keeps``: the strong / dedicated replica's client-side multiplier
        keeps a request of this value rank (``ClientShedder.keeps``; ``rma_keeps`` matters to
        uniform RMA only); ``sbm_available``: a strong replica is reachable at all; ``value``:
        the request's value (value-ranked RMA ranks it among the not-taken treatment requests;
        None, in tests only: not observed, ranked at the top); ``segment_rank``: its value rank
        within its segment (the value bin)."""
        rule = self.rule
        u_arm, u_sbm = self.rng.random(2)
        if u_arm < rule.holdout:
            return RequestPlan(control=True, strong=False, extra=0)
        p = rule.segment_probability(target, segment)
        stratum = value_stratum(segment_rank, rule.bins)
        routed = bool(u_sbm < rule.sbm_share(stratum, p, _explore(target)))
        strong = eligible and sbm_available and routed and sbm_keeps
        r_hat = self.routed_share.add(strong)
        if strong:
            return RequestPlan(control=False, strong=True, extra=0)
        rank = 1.0
        if value is not None:
            self.rma_ranker.observe(value)
            rank = self.rma_ranker.rank(value)
        spend = rule.rma(target.rma_candidates, rma_multiplier)
        if spend.extra <= 0:
            return RequestPlan(control=False, strong=False, extra=0)
        levels = target.rma_levels
        if levels:
            extra = rule.level(levels, segment, stratum)
            return RequestPlan(control=False, strong=False, extra=extra if rma_keeps else 0)
        if not spend.ranked:
            return RequestPlan(control=False, strong=False, extra=spend.extra if rma_keeps else 0)
        among = rma_among(spend.share, 1.0 - r_hat)
        extra = spend.extra if among > 0.0 and rank >= 1.0 - among else 0
        return RequestPlan(control=False, strong=False, extra=extra)


# ------------------------------------------------------------------------------------------------
# Vectorised over a population's cells (the simulator)
# ------------------------------------------------------------------------------------------------


class ValueCells(Protocol):
    """A request population as cells, segment ``s`` × value bin ``k`` of ``bins``
    equal-probability bins of the segment's value (index ``s·bins + k``), with its value
    distribution: :class:`headroom.sim.population.Population`."""

    @property
    def segments(self) -> tuple[str, ...]: ...

    @property
    def bins(self) -> int: ...

    @property
    def n_cells(self) -> int: ...

    @property
    def share(self) -> FloatArray: ...  # (C,) share of all requests in each cell

    def share_above(self, v: float) -> FloatArray:
        """Per cell, the share of its requests whose value is ≥ ``v``."""
        ...

    def keep_top(self, share: float) -> FloatArray:
        """Per cell, the share of its requests among the top ``share`` of all by value."""
        ...

    def ln_value_range(self) -> tuple[float, float]:
        """Bounds of ``ln v`` holding every value that matters (a bisection's bracket)."""
        ...


@dataclass(frozen=True, slots=True)
class CellPlan:
    """Per cell, shares of its *treatment* requests (the holdout gets nothing)."""

    routed: FloatArray  # (C,) routed to the strong model by the target
    sbm: FloatArray  # (C,) taken by the strong model (routed, kept by its multiplier)
    rma: FloatArray  # (C,) given ``extra`` extra candidates (``levels[c]`` with levels)
    extra: int  # extra candidates of an RMA request (0: no RMA; the largest level with levels)
    levels: npt.NDArray[np.int64] | None = None  # (C,) per-stratum levels (None: one ``extra``)

    def live(self, hit: npt.ArrayLike) -> CellPlan:
        """The plan as it runs live when a share ``hit`` (per cell, or one share for all) of each
        cell's treatment requests is served from the store (module docstring, step 5): routed,
        taken and RMA shares times :func:`live_share` (the hits leave the plan: they make no server
        call). ``self`` when nothing hits."""
        keep = live_share(hit)
        if bool((keep >= 1.0).all()):
            return self
        return CellPlan(
            routed=self.routed * keep,
            sbm=self.sbm * keep,
            rma=self.rma * keep,
            extra=self.extra,
            levels=self.levels,
        )


@dataclass
class CellPlanner:
    """The plan over the cells of ``cells`` (module docstring, *Vectorised*); ``eligible`` is
    the share of requests that may go to the strong model (spread evenly over the values).

    ``cache`` holds value-ranked RMA's thresholds, keyed by the budget rounded to 1e-4 and the
    routed and kept shares rounded to 1e-6 (pass one dict to planners of the same population to
    share it)."""

    rule: PlanRule
    cells: ValueCells
    eligible: float = 1.0
    cache: dict[Any, FloatArray] = field(default_factory=dict)
    _levels: tuple[Any, npt.NDArray[np.int64]] | None = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        if self.cells.bins != self.rule.bins:
            raise ConfigError(
                f"value_bins: the plan has {self.rule.bins} bins, the population {self.cells.bins}"
            )

    def cell_levels(self, target: PlanTarget) -> npt.NDArray[np.int64] | None:
        """The target's per-stratum levels of every cell (:meth:`PlanRule.levels_by_cell`; the
        last target's are kept), None when it carries none (one block)."""
        levels = target.rma_levels
        if not levels:
            return None
        last = self._levels
        if last is not None and last[0] is levels:
            return last[1]
        got = self.rule.levels_by_cell(levels, self.cells.segments)
        got.setflags(write=False)
        self._levels = (levels, got)
        return got

    def probabilities(self, target: PlanTarget | None) -> FloatArray:
        """``p_s`` of every segment, in the population's order."""
        return np.array(
            [self.rule.segment_probability(target, s) for s in self.cells.segments],
            dtype=np.float64,
        )

    def routed(self, target: PlanTarget | None) -> FloatArray:
        """Per cell, the share of treatment requests the target routes to the strong model."""
        explore = _explore(target) if target is not None else 0.0
        return self.eligible * self.rule.sbm_shares(self.probabilities(target), explore).ravel()

    def plan(self, target: PlanTarget, m_rma: float = 1.0, m_sbm: float = 1.0) -> CellPlan:
        """The cells' shares under ``target`` and the client-side multipliers."""
        cells = self.cells
        routed = self.routed(target)
        keep_s = cells.keep_top(m_sbm)
        sbm = routed * keep_s
        spend = self.rule.rma(target.rma_candidates, m_rma)
        lv = self.cell_levels(target) if spend.extra > 0 else None
        if lv is not None:
            rma = self._not_taken_above(cells.keep_top(spend.multiplier), routed, keep_s)
            rma = np.where(lv > 0, rma, 0.0)
            top = int(lv.max()) if lv.size else 0
            return CellPlan(routed=routed, sbm=sbm, rma=rma, extra=top, levels=lv)
        if spend.extra <= 0:
            rma = np.zeros(cells.n_cells)
        elif spend.ranked:
            rma = self.top_among(spend.share, routed, keep_s)
        else:
            rma = self._not_taken_above(cells.keep_top(spend.multiplier), routed, keep_s)
        return CellPlan(routed=routed, sbm=sbm, rma=rma, extra=spend.extra)

    @staticmethod
    def _not_taken_above(above: FloatArray, routed: FloatArray, keep_s: FloatArray) -> FloatArray:
        """Per cell, the share of its treatment requests the strong model did not take whose
        value is above a threshold, ``above`` being the cell's share above it: the requests not
        routed (random within the cell) plus the routed ones its multiplier dropped (below
        ``θ_s``)."""
        free = np.clip(1.0 - routed, 0.0, 1.0)
        return np.asarray(free * above + routed * np.maximum(above - keep_s, 0.0))

    def top_among(self, share: float, routed: FloatArray, keep_s: FloatArray) -> FloatArray:
        """Value-ranked RMA over the cells: per cell, the share of its treatment requests that
        get the budget ``share`` (of all treatment requests), spent highest value first on the
        requests the strong model did not take. The threshold ``θ`` solves
        ``Σ_c share_c · not_taken_above_c(θ) = share`` (bisection on ``ln θ``); every request
        not taken when the budget covers them (:func:`rma_among` is 1)."""
        cells = self.cells
        if share <= 0.0:
            return np.zeros(cells.n_cells)
        routed = np.clip(np.asarray(routed, dtype=np.float64), 0.0, 1.0)
        free = np.clip(1.0 - routed, 0.0, 1.0)
        key = (round(share, 4), np.round(free, 6).tobytes(), np.round(keep_s, 6).tobytes())
        got = self.cache.get(key)
        if got is not None:
            return got
        w_free = cells.share * free
        w_routed = cells.share * routed
        left = float((w_free + w_routed * (1.0 - keep_s)).sum())
        if rma_among(share, left) >= 1.0:
            got = free + routed * (1.0 - keep_s)
        else:
            lo, hi = cells.ln_value_range()
            for _ in range(50):
                mid = 0.5 * (lo + hi)
                a = cells.share_above(math.exp(mid))
                if float((w_free * a + w_routed * np.maximum(a - keep_s, 0.0)).sum()) > share:
                    lo = mid
                else:
                    hi = mid
            got = self._not_taken_above(cells.share_above(math.exp(hi)), routed, keep_s)
        got.setflags(write=False)
        if len(self.cache) < _CACHE_MAX:
            self.cache[key] = got
        return got
