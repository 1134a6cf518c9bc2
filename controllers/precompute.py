"""The precompute policy: whom to rank ahead of a visit, for how long to keep it, where to run it.

Precompute ranks a returning user's candidates with the strong model *before* the user's next
visit, on capacity the live path cannot use (``remote`` pools, windows too short for the strong
model's load), and stores the result until it expires. This module is the pure core of that
lever: it never reads a clock (``now`` is the record's event time, passed in), never draws from a
global random state (an injected ``numpy.random.Generator`` breaks ties and explores), and
snapshots and restores its state exactly. ``workers/precompute.py`` drives it on Kafka; the
simulator can drive the same objects in virtual time.

The algorithm
-------------

**1. Value of a stored result as it ages.** A visit served from a result ``a`` seconds old
delivers the true utility, *at visit time*, of the ad the stored ranking put first. The ranking
world measures this (:class:`headroom.world.curves.ValueCurves`): ``P_s(a)`` is the mean quality of
a strong ranking of ``precompute_n`` candidates that is ``a`` seconds old, ``Q_s^strong(n)`` the
quality of a fresh strong ranking of ``n`` candidates, ``B_s`` the quality of the live baseline
(base model, base candidates). A job here ranks ``n`` = :attr:`PrecomputeConfig.candidates`;
drift erodes any ranking alike, so its quality at age ``a`` is taken as
``Q_s^strong(n) · ρ_s(a)`` with the measured decay ratio ``ρ_s(a) = P_s(a) / P_s(0)`` (exact when
``n = precompute_n``). The uplift per served visit, in value units (``v̄_s`` = the segment's
mean request value, scenario ``segments[].value.mean``; ``k_s`` a calibration factor, 1 unless
measured value signals rescale it, :meth:`UpliftModel.with_measured`)::

    Δ_s(a) = k_s · v̄_s · (Q_s^strong(n) · ρ_s(a) − B_s − m)

where ``m`` = :attr:`PrecomputeConfig.expiry_margin` (quality units, default 0).

**2. Expiry.** A stored result is worth serving while it beats what the live base ranking would
deliver, so its lifetime is the first age at which the expected stored value falls to the live
one, or a cap::

    L_s = min( inf{a ≥ 0 : Δ_s(a) ≤ 0},  max_ttl_s )          expires_at = as_of + L_s

``L_s = 0`` (the strong model does not beat the baseline in segment ``s``) means the segment is
never precomputed. Without drift ``ρ ≡ 1`` and the cap decides. The cap (default 4 h) bounds how
long a result can be trusted beyond what the curves measured for *this* world, and the compacted
topic's size; :attr:`PrecomputeConfig.max_ttl_s` changes it.

**3. Visits.** Users return as a Poisson process (docs/scenarios.md): at ``r_s`` visits per hour
(``segments[].return_rate_per_h``), so ``P(visit within h) = 1 − exp(−r_s·h)``
(:func:`visit_probability`) and the expected number of visits within ``h`` is ``r_s·h``.
:attr:`VisitModel.GAMMA_POISSON` is the frequency-aware variant: users of a segment differ, with
rates ``λ ~ Gamma(shape κ, mean r_s)`` (the negative-binomial model of repeat visits,
Ehrenberg 1959); a user seen ``n`` times over an exposure of ``T`` seconds (since the book
started watching) has the posterior mean rate::

    λ̂_u = (κ + n_u) / (κ / r_s + T_u)

A *recency*-aware variant is deliberately not offered: for a Poisson process, given ``n`` and
``T`` the visit times carry no further information (memorylessness), so recency would only
matter under a churn model (BG/NBD), which the scenario's world does not have.

**4. Whom to precompute for.** Every visit that finds an unexpired result is served from it
(docs/scenarios.md), so a result computed now earns ``Δ_s(a)`` on each visit at age ``a < L_s``;
with Poisson visits at rate ``λ`` its expected value is ``λ·F_s(L_s)`` with
``F_s(x) = ∫_0^x Δ_s(a) da``. A user whose stored result is already ``a₀`` old would keep
earning ``λ·(F_s(L_s) − F_s(a₀))`` from it anyway, so recomputing gains only the difference::

    gain_u = λ_u · F_s(min(a₀, L_s))          (a₀ = ∞ when the user has no live result)

which reduces to "expected visits within the lifetime × mean uplift per visit" for a user with
no result, the ranking the brief asks for (the first-visit form ``P(visit within L)·E[Δ | visit]``
counts only one of those visits). Each job costs the same resources (:func:`job_cost`), so the
value per unit of cost ranks users exactly as ``gain`` does; the planner takes the ``k`` users
with the highest gain that the budget allows, skipping users with a job in flight, users whose
result is younger than ``refresh_after · L_s`` (default 0.15: a result is kept fresh rather than
left to age; 0.5 left the remote pool idle between bursts), and gains at or below ``min_gain``.
Ties (every user of a segment has the same gain under plain Poisson) are broken at random with
the injected generator, and ``explore_share`` of the picks may go to uniformly drawn eligible
users.

A hit runs nothing of its plan live, so the uplift that matters is over the visit's *live
alternative* ``ℓ_s`` (what the live levers would add to it), not over the base ranking:
:meth:`UpliftModel.against_live` shifts ``Δ_s`` to ``Δ_s(a) − ℓ_s`` (lifetimes and gains follow;
a segment whose fresh result does not beat ``ℓ_s`` is never precomputed), and
:func:`rma_live_alternative` computes ``ℓ_s`` from a control plane's targets (live RMA's gain per
request of the segment at its per-bin levels).

**5. Budget.** A token bucket at ``jobs_per_s`` with a burst of ``burst_s`` seconds of work. The
rate is the controller's precompute budget when its target carries one (in *lever* jobs, costed
by :class:`headroom.controllers.levers.PrecomputeLever` at ``base_candidates``; converted to this
job's size by the binding resource, :func:`own_rate`), else
:attr:`PrecomputeConfig.default_jobs_per_s`.

**6. Where jobs run.** Any *opportunistic* pool (never dedicated: that is the baseline's) whose
hardware the strong model supports, ``remote`` pools included (precompute is asynchronous: the
only lever allowed there, :func:`eligible_pool`), whose remaining lifetime covers one job, with
``units × (1 − safety_margin)`` usable (the allocator's guardrail). Jobs run as batches of
``job_duration_s``: a job drawing ``cpu_s / job_duration_s`` cores and
``accelerator_s / job_duration_s`` devices from one CPU pool and one accelerator pool for that
long, remote pools preferred (nothing else can use them), then the longest-lived. A pool whose
level drops below what its jobs draw stops the most recently started ones *at once*
(:meth:`JobBook.set_pools`): a half-done job delivers nothing and is counted as
``wasted_partial``.

Steps 1–4 live here; the budget (5) and where jobs run (6) in
:mod:`headroom.controllers.precompute_jobs`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from headroom.controllers.levers import CostModel, ResourceCost, RmaCurve, bin_means
from headroom.kernel.checks import FieldChecker
from headroom.kernel.errors import ConfigError
from headroom.kernel.jsonstate import (
    Snapshotting,
    decode_big_ints,
    encode_big_ints,
    json_float,
    unjson_float,
)

if TYPE_CHECKING:
    from headroom.kernel.scenario import Scenario
    from headroom.world.curves import ValueCurves

__all__ = [
    "JobOutcome",
    "Pick",
    "PrecomputeConfig",
    "PrecomputePlanner",
    "UpliftModel",
    "UserBook",
    "VisitModel",
    "job_cost",
    "live_alternative",
    "own_rate",
    "rma_live_alternative",
    "visit_probability",
]

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]

_PREFIX = "precompute"
_AGE_POINTS = 513  # grid of Δ and F per segment: 4 h / 512 ≈ 28 s steps, below the drift's 60 s
_EPS = 1e-9  # slack on capacity comparisons (floating sums of draws)


class VisitModel(Enum):
    """How a user's return rate is predicted (see the module docstring, step 3)."""

    POISSON = "poisson"  # every user of a segment returns at the segment's rate
    GAMMA_POISSON = "gamma_poisson"  # the segment's rate, updated by the user's own visit count


class JobOutcome(Enum):
    """How a job ended."""

    COMPLETED = "completed"  # ran to the end: its result is delivered
    STOPPED = "stopped"  # its capacity was reclaimed mid-way: nothing delivered (wasted_partial)


# -- configuration -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PrecomputeConfig:
    """Settings of the precompute policy; validated once, errors name ``precompute.<field>``.

    Build from a scenario with :meth:`from_scenario` (which fills ``candidates``, ``costs``
    and the segments' values and rates) and override any field by keyword.
    """

    costs: CostModel
    candidates: int  # candidates ranked per job; default: the base count (the lever's costing)
    segment_names: tuple[str, ...]
    segment_values: tuple[float, ...]  # v̄_s: mean request value per segment
    return_rates_per_h: tuple[float, ...]  # r_s per segment; 0 = never precomputed
    keep: int = 16  # ad ids stored per result: the served slate (the top ad decides the value)
    max_ttl_s: float = 4 * 3600.0  # lifetime cap (module docstring, step 2)
    expiry_margin: float = 0.0  # quality a stored result must keep above the live baseline
    visit_model: VisitModel = VisitModel.POISSON
    rate_shape: float = 1.0  # κ of GAMMA_POISSON: 1 = exponentially distributed user rates
    refresh_after: float = 0.15  # recompute a live result only once this share of L_s has passed
    min_gain: float = 0.0  # expected value a job must add (value units)
    explore_share: float = 0.0  # share of picks drawn uniformly among eligible users
    # Rate when no target carries a precompute budget: conservative, 20 jobs of 400 candidates
    # draw 0.8 gpu-b devices and 0.84 cores (quickstart costs), within one spare device.
    default_jobs_per_s: float = 20.0
    burst_s: float = 1.0  # token bucket depth, in seconds of the rate
    job_duration_s: float = 1.0  # one batch of jobs runs this long on its pools
    safety_margin: float = 0.1  # as the allocator: trust announced units only to (1 - margin)
    max_users: int = 250_000  # users remembered (least recently seen evicted beyond)

    def __post_init__(self) -> None:
        c = FieldChecker(_PREFIX)
        c.integer("candidates", self.candidates, 1)
        c.integer("keep", self.keep, 1)
        self._check_segments(c)
        c.positive("max_ttl_s", self.max_ttl_s)
        c.share("expiry_margin", self.expiry_margin)
        c.require(
            isinstance(self.visit_model, VisitModel),
            "visit_model",
            f"must be one of {[m.value for m in VisitModel]}",
            self.visit_model,
        )
        c.at_least("rate_shape", self.rate_shape, 1e-6)
        c.share("refresh_after", self.refresh_after)
        c.nonnegative("min_gain", self.min_gain)
        c.share("explore_share", self.explore_share)
        c.nonnegative("default_jobs_per_s", self.default_jobs_per_s)
        c.between("burst_s", self.burst_s, 1e-3, 3600.0)
        c.between("job_duration_s", self.job_duration_s, 1e-3, 3600.0)
        c.between("safety_margin", self.safety_margin, 0.0, 0.999)
        c.integer("max_users", self.max_users, 1)
        c.raise_if_any()

    def _check_segments(self, c: FieldChecker) -> None:
        """One name, value and return rate per segment: at least one segment, values and rates
        finite and not negative (rates at most one a second)."""
        n = len(self.segment_names)
        c.require(n > 0, "segment_names", "must name at least one segment", self.segment_names)
        c.require(
            len(self.segment_values) == n and len(self.return_rates_per_h) == n,
            "segment_values",
            f"segment_values and return_rates_per_h need {n} entries (one per segment)",
            (len(self.segment_values), len(self.return_rates_per_h)),
        )
        for i, v in enumerate(self.segment_values):
            c.nonnegative(f"segment_values[{i}]", v)
        for i, r in enumerate(self.return_rates_per_h):
            c.between(f"return_rates_per_h[{i}]", r, 0.0, 3600.0)

    @classmethod
    def from_scenario(cls, scenario: Scenario, **overrides: Any) -> PrecomputeConfig:
        """The scenario's costs, segments and return rates, with ``overrides`` on top.

        Unknown override names are rejected (``precompute.<name>: unknown setting``)."""
        known = set(cls.__dataclass_fields__)
        unknown = sorted(set(overrides) - known)
        if unknown:
            raise ConfigError([f"{_PREFIX}.{k}: unknown setting" for k in unknown])
        if "visit_model" in overrides and isinstance(overrides["visit_model"], str):
            try:
                overrides["visit_model"] = VisitModel(overrides["visit_model"])
            except ValueError:
                raise ConfigError(
                    f"{_PREFIX}.visit_model: must be one of {[m.value for m in VisitModel]}, "
                    f"got {overrides['visit_model']!r}"
                ) from None
        w = scenario.world
        base: dict[str, Any] = {
            "costs": CostModel.from_models(scenario.models, w.base_candidates),
            "candidates": w.base_candidates,
            "segment_names": tuple(s.name for s in scenario.segments),
            "segment_values": tuple(float(s.value.mean) for s in scenario.segments),
            "return_rates_per_h": tuple(
                float(s.return_rate_per_h or 0.0) for s in scenario.segments
            ),
        }
        base.update(overrides)
        return cls(**base)

    @property
    def job_cost(self) -> ResourceCost:
        return job_cost(self.costs, self.candidates)

    def segment_index(self, name: str) -> int:
        try:
            return self.segment_names.index(name)
        except ValueError:
            raise KeyError(f"unknown segment {name!r}") from None


def job_cost(costs: CostModel, candidates: int) -> ResourceCost:
    """One job: retrieval and features for ``candidates`` ads, then the strong model on them
    (:meth:`headroom.controllers.levers.CostModel.request`, model ``strong``)."""
    return costs.request(candidates, "strong")


def own_rate(budget_jobs_per_s: float, lever_job: ResourceCost, own_job: ResourceCost) -> float:
    """Convert a budget in lever jobs/s (costed ``lever_job`` each) into jobs of ``own_job``:
    the same resources, the binding one decides."""
    if not (math.isfinite(budget_jobs_per_s) and budget_jobs_per_s > 0.0):
        return 0.0
    rate = math.inf
    if own_job.cpu_s > 0.0:
        rate = min(rate, budget_jobs_per_s * lever_job.cpu_s / own_job.cpu_s)
    if own_job.accelerator_s > 0.0:
        rate = min(rate, budget_jobs_per_s * lever_job.accelerator_s / own_job.accelerator_s)
    return budget_jobs_per_s if math.isinf(rate) else rate


def rma_live_alternative(
    curve: RmaCurve,
    segments: Sequence[str],
    levels: Mapping[str, Sequence[int]],
    bin_values: Mapping[str, Sequence[float]],
    mean_extras: float,
) -> FloatArray:
    """Per segment (``segments`` order), what live RMA adds to one of its treatment requests
    under the targets in force, in value units: the mean over the segment's value bins (equal
    shares: they are quantiles) of the bin's mean value times the RMA curve's quality gain at
    the bin's extra candidates (``levels``, the targets' per-bin levels; a segment without them
    gets ``mean_extras`` in every bin). ``bin_values``: the measured mean value per bin
    (:func:`headroom.controllers.levers.bin_means`); a segment without them, or not on the
    curve, gets 0. The live alternative a precompute hit gives up
    (:meth:`UpliftModel.against_live`)."""
    out = np.zeros(len(segments))
    for i, seg in enumerate(segments):
        vals = bin_values.get(seg)
        if not vals or seg not in curve.gains:
            continue
        lv = levels.get(seg)
        extras = list(lv) if lv else [mean_extras] * len(vals)
        n = min(len(extras), len(vals))
        pairs = zip(vals[:n], extras[:n], strict=True)
        gains = [max(v, 0.0) * max(curve.gain(seg, float(e)), 0.0) for v, e in pairs]
        out[i] = sum(gains) / n if n else 0.0
    return out


def live_alternative(
    curve: RmaCurve,
    segments: Sequence[str],
    levels: Mapping[str, Sequence[int]],
    signal_means: Mapping[str, float],
    mean_extras: float,
) -> FloatArray | None:
    """The live alternative of the targets in force (:func:`rma_live_alternative`), with each
    segment's value per bin read from ``signal_means`` (a value book's
    :meth:`~headroom.controllers.levers.ValueBook.signal_means`, through
    :func:`~headroom.controllers.levers.bin_means`); None while no segment has a bin's mean yet.
    The simulator's headroom policy and the streaming precompute worker both ask it."""
    vals = {s: v for s in segments if (v := bin_means(signal_means, s)) is not None}
    if not vals:
        return None
    return rma_live_alternative(curve, segments, levels, vals, mean_extras)


def visit_probability(rate_per_s: npt.ArrayLike, horizon_s: npt.ArrayLike) -> FloatArray:
    """``1 − exp(−r·h)``: the chance a Poisson visitor at rate ``r`` returns within ``h``."""
    r = np.asarray(rate_per_s, dtype=np.float64)
    h = np.asarray(horizon_s, dtype=np.float64)
    return np.asarray(-np.expm1(-np.maximum(r, 0.0) * np.maximum(h, 0.0)), dtype=np.float64)


# -- uplift and expiry ---------------------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class UpliftModel:
    """``Δ_s(a)`` per segment on an age grid, its integral ``F_s`` and the lifetimes ``L_s``.

    Build with :meth:`from_curves` (the world's measured curves) or :meth:`from_tables`
    (given quality tables, for tests and what-if studies). Arrays are read-only.
    """

    ages_s: FloatArray  # (A,) 0 … max_ttl_s
    delta: FloatArray  # (S, A) value per served visit, Δ_s(a)
    cumulative: FloatArray  # (S, A) F_s(a) = ∫_0^a max(Δ_s, 0), flat beyond L_s
    lifetimes_s: FloatArray  # (S,) L_s

    def __post_init__(self) -> None:
        for arr in (self.ages_s, self.delta, self.cumulative, self.lifetimes_s):
            arr.setflags(write=False)

    @classmethod
    def from_tables(
        cls,
        config: PrecomputeConfig,
        fresh_quality: Sequence[float],
        baseline_quality: Sequence[float],
        decay_ages_s: Sequence[float],
        decay_quality: Sequence[Sequence[float]],
        scales: Sequence[float] | None = None,
    ) -> UpliftModel:
        """``fresh_quality`` = ``Q_s^strong(n)``, ``baseline_quality`` = ``B_s``, and the decay
        of a stored ranking's quality ``P_s(a)`` on ``decay_ages_s`` (ascending from 0)."""
        n_seg = len(config.segment_names)
        q = np.asarray(fresh_quality, dtype=np.float64)
        b = np.asarray(baseline_quality, dtype=np.float64)
        grid = np.asarray(decay_ages_s, dtype=np.float64)
        p = np.asarray(decay_quality, dtype=np.float64)
        k = np.ones(n_seg) if scales is None else np.asarray(scales, dtype=np.float64)
        if q.shape != (n_seg,) or b.shape != (n_seg,) or k.shape != (n_seg,):
            raise ValueError(f"need one fresh, baseline and scale value per segment ({n_seg})")
        if grid.ndim != 1 or len(grid) < 1 or grid[0] != 0.0 or np.any(np.diff(grid) <= 0):
            raise ValueError("decay_ages_s must start at 0 and increase strictly")
        if p.shape != (n_seg, len(grid)):
            raise ValueError(f"decay_quality must have shape ({n_seg}, {len(grid)})")
        if not (np.all(np.isfinite(q)) and np.all(np.isfinite(b)) and np.all(np.isfinite(p))):
            raise ValueError("quality tables must be finite")
        if np.any(k < 0.0) or not np.all(np.isfinite(k)):
            raise ValueError("scales must be finite and >= 0")
        ages = np.linspace(0.0, config.max_ttl_s, _AGE_POINTS)
        values = np.asarray(config.segment_values, dtype=np.float64)
        delta = np.empty((n_seg, len(ages)))
        cum = np.empty((n_seg, len(ages)))
        life = np.empty(n_seg)
        for s in range(n_seg):
            p0 = p[s, 0]
            rho = np.interp(ages, grid, p[s]) / p0 if p0 > 0.0 else np.zeros(len(ages))
            margin_q = q[s] * rho - b[s] - config.expiry_margin  # quality above the live one
            life[s] = _first_crossing(ages, margin_q)
            delta[s] = k[s] * values[s] * margin_q
            cum[s] = _integral_to(ages, np.maximum(delta[s], 0.0), life[s])
        return cls(ages, delta, cum, life)

    @classmethod
    def from_curves(
        cls, curves: ValueCurves, config: PrecomputeConfig, scales: Sequence[float] | None = None
    ) -> UpliftModel:
        """From the ranking world's measured curves (segments in the config's order)."""
        idx = [curves.segment_index(name) for name in config.segment_names]
        fresh = [float(curves.mean_quality(i, "strong", config.candidates)) for i in idx]
        base = [float(curves.baseline_quality(i)) for i in idx]
        decay = [list(curves.precompute_mean[i]) for i in idx]
        return cls.from_tables(config, fresh, base, list(curves.age_grid_s), decay, scales)

    def with_measured(self, segment: int, uplift_per_visit: float, at_age_s: float) -> UpliftModel:
        """Rescale one segment so ``Δ_s(at_age_s)`` equals a measured uplift per served visit
        (value signals: treatment − control of lever ``precompute``, at the measured median
        staleness). The shape, and so the lifetime, stays the curves'; a measured uplift at or
        below zero switches the segment off (``k_s = 0``)."""
        predicted = float(np.interp(at_age_s, self.ages_s, self.delta[segment]))
        if not (math.isfinite(uplift_per_visit) and math.isfinite(predicted)):
            raise ValueError("uplift_per_visit and the prediction must be finite")
        k = 0.0 if uplift_per_visit <= 0.0 or predicted <= 0.0 else uplift_per_visit / predicted
        delta = self.delta.copy()
        cum = self.cumulative.copy()
        delta[segment] *= k
        cum[segment] *= k
        return UpliftModel(self.ages_s, delta, cum, self.lifetimes_s)

    def against_live(self, live: npt.ArrayLike) -> UpliftModel:
        """The uplift over the *live alternative*: ``Δ_s(a) − ℓ_s``, where ``ℓ_s`` (value units,
        per visit, ``≥ 0``) is what a visit of segment ``s`` would otherwise gain from the live
        levers over the base ranking. A hit runs nothing live (defences/plan.py, step 5), so a
        stored result is worth serving only while it beats that, and its lifetime becomes the
        first age at which ``Δ_s(a) ≤ ℓ_s`` (at most the curves' ``L_s``); a segment whose fresh
        result does not beat its live alternative gets ``L_s = 0`` and is never precomputed.
        Applied to the curves' (or measured) model each time, never to one already shifted."""
        ell = np.maximum(np.nan_to_num(np.asarray(live, dtype=np.float64), nan=0.0), 0.0)
        if ell.shape != self.lifetimes_s.shape:
            raise ValueError(f"need one live alternative per segment ({self.lifetimes_s.size})")
        if not np.any(ell > 0.0):
            return self
        delta = self.delta - ell[:, None]
        cum = np.empty_like(self.cumulative)
        life = np.empty_like(self.lifetimes_s)
        for s in range(delta.shape[0]):
            life[s] = min(_first_crossing(self.ages_s, delta[s]), float(self.lifetimes_s[s]))
            cum[s] = _integral_to(self.ages_s, np.maximum(delta[s], 0.0), life[s])
        return UpliftModel(self.ages_s, delta, cum, life)

    def lifetime(self, segment: int) -> float:
        return float(self.lifetimes_s[segment])

    def uplift(self, segment: int, age_s: npt.ArrayLike) -> FloatArray:
        """``Δ_s(a)``: expected value a visit gains from a result ``a`` seconds old."""
        a = np.asarray(age_s, dtype=np.float64)
        return np.asarray(np.interp(a, self.ages_s, self.delta[segment]), dtype=np.float64)

    def integral(self, segment: int, age_s: npt.ArrayLike) -> FloatArray:
        """``F_s(min(a, L_s))``."""
        a = np.asarray(age_s, dtype=np.float64)
        return np.asarray(np.interp(a, self.ages_s, self.cumulative[segment]), dtype=np.float64)


def _first_crossing(ages: FloatArray, margin: FloatArray) -> float:
    """The first age where ``margin`` (linear between grid points) reaches 0; the last age
    when it never does; 0 when it starts at or below 0."""
    if margin[0] <= 0.0:
        return 0.0
    below = np.flatnonzero(margin <= 0.0)
    if len(below) == 0:
        return float(ages[-1])
    j = int(below[0])
    a0, a1 = ages[j - 1], ages[j]
    m0, m1 = margin[j - 1], margin[j]
    return float(a0 + (a1 - a0) * m0 / (m0 - m1))


def _integral_to(ages: FloatArray, f: FloatArray, upto: float) -> FloatArray:
    """Cumulative trapezoid of ``f`` over ``ages``, integrating only up to ``upto`` (flat after)."""
    x = np.minimum(ages, upto)
    fx = np.interp(x, ages, f)
    steps = 0.5 * (fx[1:] + fx[:-1]) * np.diff(x)
    out = np.empty(len(ages))
    out[0] = 0.0
    np.cumsum(steps, out=out[1:])
    return out


# -- users ---------------------------------------------------------------------------------------


class UserBook:
    """The users seen on ``headroom.requests``: segment, visits, and their stored result.

    Columnar (numpy arrays indexed by slot, a dict from user id to slot) so the planner scores
    every user in one vectorised pass. Bounded by ``max_users``: when full, the least recently
    seen sixteenth is evicted (counted in :attr:`evicted`).
    """

    _COLUMNS = ("ids", "seg", "first", "last", "visits", "cov_at", "cov_until", "inflight")

    def __init__(self, max_users: int, initial: int = 1024) -> None:
        if max_users < 1:
            raise ValueError("max_users must be >= 1")
        self.max_users = max_users
        self._clear(max(1, min(initial, max_users)))

    def _clear(self, cap: int) -> None:
        """No users, room for ``cap`` before the arrays grow."""
        self._slot: dict[int, int] = {}
        self._free: list[int] = []
        self._n = 0  # slots ever handed out (high-water mark)
        self.ids: IntArray = np.zeros(cap, np.int64)
        self.seg: IntArray = np.zeros(cap, np.int64)
        self.first: FloatArray = np.zeros(cap)
        self.last: FloatArray = np.zeros(cap)
        self.visits: IntArray = np.zeros(cap, np.int64)
        self.cov_at: FloatArray = np.full(cap, np.nan)  # as-of time of the live result
        self.cov_until: FloatArray = np.full(cap, -np.inf)  # its expires_at
        self.inflight: npt.NDArray[np.bool_] = np.zeros(cap, bool)
        self.active: npt.NDArray[np.bool_] = np.zeros(cap, bool)
        self.start: float | None = None  # event time of the first observation (exposure origin)
        self.evicted = 0

    def __len__(self) -> int:
        return len(self._slot)

    def __contains__(self, user: object) -> bool:
        return user in self._slot

    @property
    def size(self) -> int:
        """Slots in use or freed (arrays are meaningful up to here; see :attr:`active`)."""
        return self._n

    def slot(self, user: int) -> int | None:
        return self._slot.get(user)

    def observe(self, user: int, segment: int, ts: float) -> None:
        """A visit of ``user`` (segment index ``segment``) at event time ``ts``."""
        if self.start is None or ts < self.start:
            self.start = ts
        i = self._slot.get(user)
        if i is not None:
            self.visits[i] += 1
            self.seg[i] = segment  # the newest classification wins
            if ts > self.last[i]:
                self.last[i] = ts
            self.first[i] = min(self.first[i], ts)
            return
        i = self._new_slot()
        self._slot[user] = i
        self.ids[i] = user
        self.seg[i] = segment
        self.first[i] = ts
        self.last[i] = ts
        self.visits[i] = 1
        self.cov_at[i] = np.nan
        self.cov_until[i] = -np.inf
        self.inflight[i] = False
        self.active[i] = True

    def set_inflight(self, user: int, on: bool) -> None:
        i = self._slot.get(user)
        if i is not None:
            self.inflight[i] = on

    def set_stored(self, user: int, as_of: float, expires_at: float) -> None:
        """A result for ``user`` ranked at ``as_of`` is live until ``expires_at`` (the newest
        ``as_of`` wins, so a re-delivered older result cannot hide a fresher one)."""
        i = self._slot.get(user)
        if i is None:
            return
        if not np.isnan(self.cov_at[i]) and self.cov_at[i] > as_of:
            return
        self.cov_at[i] = as_of
        self.cov_until[i] = expires_at

    def clear_stored(self, user: int) -> None:
        i = self._slot.get(user)
        if i is not None:
            self.cov_at[i] = np.nan
            self.cov_until[i] = -np.inf

    def _new_slot(self) -> int:
        if self._free:
            return self._free.pop()
        if len(self._slot) >= self.max_users:
            self._evict()
            return self._free.pop()
        if self._n == len(self.ids):
            self._grow(min(self.max_users, 2 * len(self.ids)))
        i = self._n
        self._n += 1
        return i

    def _grow(self, cap: int) -> None:
        for name in (*self._COLUMNS, "active"):
            old = getattr(self, name)
            new = np.empty(cap, dtype=old.dtype)
            new[: len(old)] = old
            if name == "cov_at":
                new[len(old) :] = np.nan
            elif name == "cov_until":
                new[len(old) :] = -np.inf
            elif name in ("inflight", "active"):
                new[len(old) :] = False
            else:
                new[len(old) :] = 0
            setattr(self, name, new)

    def _evict(self) -> None:
        n = self._n
        live = np.flatnonzero(self.active[:n])
        count = max(1, len(live) // 16)
        order = live[np.argpartition(self.last[live], count - 1)[:count]]
        for i in order.tolist():
            del self._slot[int(self.ids[i])]
            self.active[i] = False
            self.inflight[i] = False
            self._free.append(i)
        self.evicted += count

    def snapshot(self) -> dict[str, Any]:
        n = self._n
        return {
            "max_users": self.max_users,
            "start": self.start,
            "evicted": self.evicted,
            "free": list(self._free),
            "columns": {
                name: [json_float(x) for x in getattr(self, name)[:n].tolist()]
                for name in (*self._COLUMNS, "active")
            },
        }

    def restore(self, state: Mapping[str, Any]) -> None:
        """Replace the users with those of a :meth:`snapshot`. ``max_users`` stays this book's
        own (the snapshot's is informative): a snapshot holding more users than it allows is
        kept whole, and the least recently seen make room as new users arrive."""
        cols = state["columns"]
        n = len(cols["ids"])
        self._clear(max(n, 1))
        for name in (*self._COLUMNS, "active"):
            arr = getattr(self, name)
            arr[:n] = np.asarray([unjson_float(x) for x in cols[name]], dtype=arr.dtype)
        self._n = n
        self._free = [int(i) for i in state["free"]]
        self.start = None if state["start"] is None else float(state["start"])
        self.evicted = int(state["evicted"])
        self._slot = {int(self.ids[i]): i for i in range(n) if self.active[i]}


# -- the planner ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Pick:
    """One user chosen for a job."""

    user: int
    segment: int
    gain: float  # expected value the job adds (value units), module docstring step 4
    rate_per_s: float  # the user's predicted return rate
    lifetime_s: float  # L_s: the result will expire this long after it is ranked
    visit_probability: float  # P(at least one visit within L_s): the chance it is used
    explored: bool = False  # drawn uniformly (exploration), not by gain


class PrecomputePlanner:
    """Scores the users of a :class:`UserBook` and picks whom to precompute for next."""

    def __init__(
        self,
        config: PrecomputeConfig,
        uplift: UpliftModel,
        rng: np.random.Generator,
        users: UserBook | None = None,
    ) -> None:
        self.config = config
        self.uplift = uplift
        self.rng = rng
        self.users = users if users is not None else UserBook(config.max_users)
        self._rates = np.asarray(config.return_rates_per_h, dtype=np.float64) / 3600.0

    def rates(self, now: float) -> FloatArray:
        """Predicted return rate (visits/s) of every slot of the book."""
        b = self.users
        n = b.size
        seg_rate = self._rates[b.seg[:n]]
        if self.config.visit_model is VisitModel.POISSON:
            return seg_rate
        k = self.config.rate_shape
        exposure = max(now - (b.start if b.start is not None else now), 0.0)
        with np.errstate(divide="ignore", invalid="ignore"):
            lam = (k + b.visits[:n]) / (k / seg_rate + exposure)
        return np.where(seg_rate > 0.0, lam, 0.0)

    def gains(self, now: float) -> tuple[FloatArray, npt.NDArray[np.bool_], FloatArray]:
        """(gain, eligible, rate) for every slot of the book at ``now``."""
        b = self.users
        n = b.size
        seg = b.seg[:n]
        lam = self.rates(now)
        life = self.uplift.lifetimes_s[seg]
        covered = b.cov_until[:n] >= now
        age = np.where(covered, now - np.nan_to_num(b.cov_at[:n], nan=now), np.inf)
        x = np.minimum(age, life)
        f = np.zeros(n)
        for s in range(len(self.config.segment_names)):
            mask = seg == s
            if mask.any():
                f[mask] = self.uplift.integral(s, x[mask])
        gain = lam * f
        eligible = (
            b.active[:n]
            & ~b.inflight[:n]
            & (life > 0.0)
            & (lam > 0.0)
            & (~covered | (age >= self.config.refresh_after * life))
            & (gain > self.config.min_gain)
        )
        return gain, eligible, lam

    def select(self, now: float, k: int) -> list[Pick]:
        """Up to ``k`` users to precompute for now, best first (exploration picks last)."""
        if k <= 0 or len(self.users) == 0:
            return []
        gain, eligible, lam = self.gains(now)
        idx = np.flatnonzero(eligible)
        if len(idx) == 0:
            return []
        idx = idx[self.rng.permutation(len(idx))]  # random order: ties broken at random
        n_explore = 0
        if self.config.explore_share > 0.0:
            want = self.config.explore_share * min(k, len(idx))
            n_explore = int(want) + int(self.rng.random() < want - int(want))
        n_best = min(k - n_explore, len(idx))
        if n_best <= 0:
            best = idx[:0]
        elif n_best < len(idx):
            best = idx[np.argpartition(-gain[idx], n_best - 1)[:n_best]]
        else:
            best = idx
        best = best[np.argsort(-gain[best], kind="stable")]
        picks = [self._pick(int(i), gain, lam, False) for i in best]
        if n_explore > 0:
            rest = np.setdiff1d(idx, best, assume_unique=True)
            if len(rest):
                chosen = self.rng.choice(rest, size=min(n_explore, len(rest)), replace=False)
                picks.extend(self._pick(int(i), gain, lam, True) for i in chosen)
        return picks

    def _pick(self, i: int, gain: FloatArray, lam: FloatArray, explored: bool) -> Pick:
        b = self.users
        s = int(b.seg[i])
        life = self.uplift.lifetime(s)
        return Pick(
            user=int(b.ids[i]),
            segment=s,
            gain=float(gain[i]),
            rate_per_s=float(lam[i]),
            lifetime_s=life,
            visit_probability=float(visit_probability(lam[i], life)),
            explored=explored,
        )

    def expires_at(self, segment: int, as_of: float) -> float:
        return as_of + self.uplift.lifetime(segment)

    def snapshot(self) -> dict[str, Any]:
        return {
            "users": self.users.snapshot(),
            "rng": encode_big_ints(self.rng.bit_generator.state),
        }

    def restore(self, state: Mapping[str, Any]) -> None:
        """Restore the book and the generator's state (config and uplift are given anew)."""
        self.users.restore(state["users"])
        self.rng.bit_generator.state = decode_big_ints(state["rng"])


_SNAPSHOTTING: tuple[type[Snapshotting], ...] = (UserBook, PrecomputePlanner)  # checked by mypy
