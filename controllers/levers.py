"""One lever interface, what optional work costs, and how its value is estimated.

A *lever* is a kind of optional work that can turn spare capacity into value. The allocator
(controllers/allocator.py) knows nothing about RMA or SBM: it asks every registered lever five
questions and solves one linear program over the answers.

1. **Cost** — :meth:`Lever.unit_cost`: core-seconds of CPU and device-seconds of accelerator per
   *unit of work* (RMA: one extra candidate for one request; SBM: one request on the strong
   model; precompute: one job).
2. **Capacity it may use** — :attr:`Lever.use` (``LIVE``: only pools not marked ``remote``;
   ``ASYNC``: any pool), :attr:`Lever.hardware` (accelerator types it runs on; ``None`` = any),
   :attr:`Lever.min_durability_s` (a pool expiring sooner is useless to it: the strong model's
   ``load_s`` for SBM).
3. **Demand** — :meth:`Lever.demand`: the most units per second that are useful right now.
4. **Value** — :meth:`Lever.estimate`: incremental value per unit of work, from the holdout A/B
   sums in a :class:`ValueBook`, with a standard error and a lower confidence bound.
5. **Apply and shed** — :meth:`Lever.rate_for` turns a granted budget into a work rate;
   :attr:`Lever.shed_action` says what local shedding drops first (trim candidates, downgrade to
   the base model, stop jobs).

Costs live here and nowhere else (:class:`CostModel`): the simulator and the workers reuse them.
docs/scenarios.md: a request's CPU work is candidates × ``cpu_ms_per_candidate``, its accelerator
work candidates × ``accelerator_ms_per_candidate`` of the model that ranks it. Hence, per unit:

* RMA, one extra candidate ranked by the base model: base ``cpu_ms`` + base ``accelerator_ms``.
* SBM, one request ranked by the strong model on opportunistic replicas: ``base_candidates`` ×
  strong ``cpu_ms`` (its own feature work) and × strong ``accelerator_ms``. Retrieval stays on the
  dedicated path and the base model's share is given back there, so it is not counted.
* Precompute, one job: retrieval and features done ahead of the visit (``base_candidates`` × base
  ``cpu_ms``) plus strong-model ranking (× strong ``cpu_ms`` and ``accelerator_ms``).

**Value estimate.** Value signals arrive as per-window sums per (segment, lever, arm). A
:class:`ValueBook` keeps exponentially discounted sums, ``S <- γ·S + new`` with
``γ = 0.5 ** (window_s / half_life_s)``, so an estimate follows a drifting world with a known
memory. Per segment the uplift per treated request is ``d_s = mean_t - mean_c`` with variance
``var_t/n_t + var_c/n_c`` (the stratum term of the one holdout estimator,
:func:`headroom.kernel.estimate.adjusted_difference`, which the analyzer uses too, with its
regression term on the request's value signal where the signals carry the signal sums); a
lever's uplift pools segments by their treatment counts (``w_s = n_t,s / Σ n_t``; stratified,
so a control arm with a different segment mix cannot bias it), ``Δ = Σ w_s d_s``,
``se² = Σ w_s² v_s``. Divided by the units of work behind one treated request
(:meth:`Lever.units_per_treated`: RMA the extra candidates in force, SBM one request,
precompute the jobs run per request), that is the value per unit of work, and
``lcb = mean - z·se`` (``z`` = 1.645, one-sided 95 %). Below ``min_samples`` effective samples in
either arm there is no estimate.

**Discounting and the effective count.** A discounted sum weighs a request seen ``a`` windows
ago ``w = γ^a``. Its mean is a weighted mean, whose variance is ``σ² · Σw² / (Σw)²`` =
``σ² / n_eff`` with Kish's effective count ``n_eff = (Σw)² / Σw²`` — not ``σ² / Σw``: with every
``w ≤ 1``, ``n_eff ≥ Σw``, and in a steady state ``n_eff = (1 + γ)·Σw`` (about twice the
discounted count), so dividing by ``Σw`` overstated the variance about twofold and a lever took
that much longer to prove. The book keeps ``Σw²`` per row (decay multiplies it by ``γ²``, a new
request adds 1) and hands the estimator every sum times ``Σw / Σw²`` (means and slopes
unchanged, counts the effective ones). ``tests/unit/test_value_power.py`` checks the lower bound
stays one (coverage on synthetic worlds with a known lift) and records the power.

Two refinements (docs/controllers.md, "Value estimates"): the book's keys may be strata of a
segment (``"casual#3"``, a value bin), and where the value signals carry the ``cost`` of the work
their treatment requests received, value per unit comes from the strata where the lever worked
only, ``r_s = n_t,s·d_s / u_s``, combined by inverse variance (:meth:`ValueBook.per_unit`);
otherwise the uplift is divided by the units the book's own requests received (a discounted
units book, :meth:`ValueBook.mean_units`), not by the units in force now. The same ratios,
fitted to a model of the uplift (proportional to the request's value signal), give a scale
``κ`` that values work in any stratum (:meth:`ValueBook.scaled`): SBM's per-stratum tranches.

Adding a lever: subclass :class:`Lever`, give it a name, costs and a demand, and register it in
a :class:`LeverRegistry` passed to the control plane (docs/controllers.md has a worked example).
"""

from __future__ import annotations

import functools
import itertools
import math
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence, Set
from dataclasses import dataclass, field
from enum import Enum
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from headroom.controllers.types import (
    LEVER_PRECOMPUTE,
    LEVER_RMA,
    LEVER_SBM,
    ArmStats,
    ValueKey,
    segment_of,
    stratum_key,
)
from headroom.defences.admission import admissible_utilization
from headroom.defences.plan import VALUE_BINS
from headroom.kernel.estimate import Moments, adjusted_difference, slope, slope_variance
from headroom.kernel.jsonstate import Snapshotting

if TYPE_CHECKING:
    from headroom.kernel.scenario import Models

__all__ = [
    "CapacityUse",
    "CostModel",
    "Lever",
    "LeverContext",
    "LeverRegistry",
    "PrecomputeLever",
    "QualityCurves",
    "ResourceCost",
    "RmaCurve",
    "RmaLever",
    "SbmLever",
    "ShedAction",
    "Tranche",
    "Uplift",
    "ValueBook",
    "ValueEstimate",
    "bin_means",
    "concave_tranches",
]


class CapacityUse(Enum):
    """Which capacity a lever may run on."""

    LIVE = "live"  # on the request path: never on a ``remote`` pool
    ASYNC = "async"  # ahead of the request: any pool, remote included


class ShedAction(Enum):
    """What local shedding does to this lever's work (lowest value first)."""

    TRIM_CANDIDATES = "trim_candidates"  # RMA: rank fewer extra candidates
    DOWNGRADE_MODEL = "downgrade_model"  # SBM: send the request back to the base model
    STOP_JOBS = "stop_jobs"  # precompute: stop running jobs (a half-done job is wasted)
    DROP = "drop"  # generic optional work: do not do it


@dataclass(frozen=True, slots=True)
class ResourceCost:
    """Resources one unit of work takes: core-seconds of CPU, device-seconds of accelerator."""

    cpu_s: float
    accelerator_s: float

    def __mul__(self, k: float) -> ResourceCost:
        return ResourceCost(self.cpu_s * k, self.accelerator_s * k)

    def __add__(self, other: ResourceCost) -> ResourceCost:
        return ResourceCost(self.cpu_s + other.cpu_s, self.accelerator_s + other.accelerator_s)


@dataclass(frozen=True, slots=True)
class CostModel:
    """Per-candidate costs of the two models, in milliseconds, and the base candidate count.

    The single source of what work costs (see the module docstring for the accounting)."""

    base_cpu_ms: float
    base_accelerator_ms: float
    strong_cpu_ms: float
    strong_accelerator_ms: float
    base_candidates: int
    base_hardware: tuple[str, ...]
    strong_hardware: tuple[str, ...]
    strong_load_s: float = 0.0

    @classmethod
    def from_models(cls, models: Models, base_candidates: int) -> CostModel:
        return cls(
            base_cpu_ms=models.base.cpu_ms_per_candidate,
            base_accelerator_ms=models.base.accelerator_ms_per_candidate,
            strong_cpu_ms=models.strong.cpu_ms_per_candidate,
            strong_accelerator_ms=models.strong.accelerator_ms_per_candidate,
            base_candidates=base_candidates,
            base_hardware=tuple(models.base.hardware),
            strong_hardware=tuple(models.strong.hardware),
            strong_load_s=models.strong.load_s,
        )

    def request(self, candidates: float, model: str = "base") -> ResourceCost:
        """All the work of one request ranking ``candidates`` with ``model`` (base or strong):
        retrieval and features on CPU, inference on the accelerator."""
        if model == "base":
            return ResourceCost(
                candidates * self.base_cpu_ms / 1e3, candidates * self.base_accelerator_ms / 1e3
            )
        if model == "strong":
            return ResourceCost(
                candidates * (self.base_cpu_ms + self.strong_cpu_ms) / 1e3,
                candidates * self.strong_accelerator_ms / 1e3,
            )
        raise ValueError(f"model must be 'base' or 'strong', got {model!r}")

    @property
    def rma_per_candidate(self) -> ResourceCost:
        """One extra candidate for one request, ranked by the base model."""
        return ResourceCost(self.base_cpu_ms / 1e3, self.base_accelerator_ms / 1e3)

    @property
    def sbm_per_request(self) -> ResourceCost:
        """One request moved to the strong model's opportunistic replicas (base candidates)."""
        n = self.base_candidates
        return ResourceCost(n * self.strong_cpu_ms / 1e3, n * self.strong_accelerator_ms / 1e3)

    @property
    def precompute_per_job(self) -> ResourceCost:
        """One precompute job: retrieval and features, then strong-model ranking."""
        return self.request(self.base_candidates, "strong")


@dataclass(frozen=True, slots=True)
class LeverContext:
    """What a lever may look at to size its demand and interpret its value signals."""

    request_rps: float
    eligible_rps: float
    rma_extra_candidates: float = 0.0  # extra candidates per request in force (target - base)
    precompute_jobs_per_s: float = 0.0  # job rate in force
    # request rate per segment (the allocator's tranches: empty = one tranche per lever)
    segment_rps: Mapping[str, float] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Tranche:
    """One segment's part of a lever's demand, with its own value per unit of work: the
    allocator's piecewise-linear value of the lever (module docstring, "Tranches")."""

    segment: str | None  # None: the whole lever (no segments)
    demand: float  # most units of work per second this segment can use (the lever's whole
    # demand still bounds the sum of its tranches)
    estimate: ValueEstimate
    requests: float  # the segment's request rate (the per-request row of exclusive levers)
    own: bool = True  # the estimate is the segment's own (False: the lever's pooled one)
    # (stratum key, requests one unit of this tranche's work treats there): a tranche of a
    # stratum that another lever's tranches name as their segment (RMA's bands), for the
    # allocator's per-stratum request rows
    strata: tuple[tuple[str, float], ...] = ()


@dataclass(frozen=True, slots=True)
class Uplift:
    """Incremental value per treated request (treatment - control), pooled over segments."""

    mean: float
    se: float
    n_treatment: float
    n_control: float


@dataclass(frozen=True, slots=True)
class ValueEstimate:
    """Incremental value per unit of work; ``known`` is False until both arms have data."""

    mean: float
    se: float
    lcb: float
    ucb: float
    n_treatment: float
    n_control: float
    known: bool

    @classmethod
    def unknown(cls, n_treatment: float = 0.0, n_control: float = 0.0) -> ValueEstimate:
        return cls(0.0, math.inf, -math.inf, math.inf, n_treatment, n_control, False)


def _moments(a: list[float]) -> Moments:
    """The estimator's sums of a book row [n, s, q, cpu, acc, Σx, Σx², Σxy, Σw²] (the signal
    sums 0 where the value signals carry none: then no regression term), rescaled to the row's
    effective count (module docstring, *Discounting and the effective count*): every sum times
    ``k = Σw / Σw²``, so means and the slope are unchanged and the variance of a mean is
    ``σ² / n_eff``."""
    k = a[0] / a[8] if a[8] > 0.0 else 1.0
    if not (math.isfinite(k) and k > 0.0):
        k = 1.0
    return Moments(k * a[0], k * a[1], k * a[2], k * a[5], k * a[6], k * a[7])


@dataclass(frozen=True, slots=True)
class _Worked:
    """One stratum where a lever worked (:meth:`ValueBook._worked_strata`)."""

    segment: str
    n_t: float  # treatment requests
    n_c: float  # control requests
    units: float  # units of work the treatment requests received
    ratio: float  # measured value per unit of work, n_t · d / u
    variance: float  # of ``ratio``
    signal: float  # mean value signal of the treatment requests (0: none carried)


# a stratum's control arm below this many (discounted) requests is merged with the other such
# strata of its segment (:meth:`ValueBook._pairs`): the estimator's own rule
MIN_STRATUM_CONTROLS = 2.0
_UNITS_ARM = "units"  # snapshot rows of the units book (no real arm is called that)


class ValueBook:
    """Discounted holdout sums per (segment, lever, arm); see the module docstring."""

    __slots__ = (
        "_controls_cache",
        "_estimates",
        "_means_cache",
        "_slopes_cache",
        "_sums",
        "_units",
        "_worked_cache",
    )

    def __init__(self) -> None:
        self._sums: dict[ValueKey, list[float]] = {}
        # per lever, the control strata's slopes and their variances (unchanged by decay:
        # every sum scales alike, and :func:`_moments` rescales to the effective count)
        self._slopes_cache: dict[tuple[str, str], dict[str, float]] = {}
        # per lever, the moments of its control strata (:meth:`_controls`), until the sums next
        # change (the slopes and their variances both read them)
        self._controls_cache: dict[str, dict[str, list[Moments]]] = {}
        # uplift and per_unit answers until the sums next change (a control step asks the same
        # lever and segment several times: the pooled estimate, each tranche, the allocator)
        self._estimates: dict[tuple[str, str, object, str | None], Uplift | None] = {}
        # the worked strata behind per_unit and scaled, until the sums next change
        self._worked_cache: dict[tuple[str, ResourceCost, str | None], list[_Worked] | None] = {}
        # signal_means per min_n, until the sums next change
        self._means_cache: dict[float, dict[str, float]] = {}
        # per lever: discounted [treated requests, units of work behind them], so value per
        # unit divides the book's uplift by the units *the book's requests* received, not by
        # the units in force now (RMA's extra candidates change every interval)
        self._units: dict[str, list[float]] = {}

    def decay(self, factor: float) -> None:
        """Multiply every sum by ``factor`` in [0, 1] (call once per window before adding)."""
        if factor >= 1.0:
            return
        self._forget()
        for a in self._sums.values():
            for i in range(8):
                a[i] *= factor
            a[8] *= factor * factor  # Σw²: every request's weight times the factor
        for u in self._units.values():
            u[0] *= factor
            u[1] *= factor

    def add_units(self, lever: str, treated: float, units_per_treated: float) -> None:
        """Record that ``treated`` treatment requests of ``lever`` each got
        ``units_per_treated`` units of work (the targets in force over the window)."""
        if not (treated > 0.0 and math.isfinite(units_per_treated) and units_per_treated >= 0.0):
            return
        u = self._units.setdefault(lever, [0.0, 0.0])
        u[0] += treated
        u[1] += treated * units_per_treated

    def mean_units(self, lever: str) -> float | None:
        """Units of work per treated request over the book's (discounted) memory, or None."""
        u = self._units.get(lever)
        if u is None or u[0] <= 0.0 or u[1] <= 0.0:
            return None  # no work on record: a ratio near 0 would inflate value per unit
        return u[1] / u[0]

    @staticmethod
    def treated(value: Mapping[ValueKey, ArmStats], lever: str) -> float:
        """Treatment requests of ``lever`` in one window's sums."""
        return float(sum(st.n for k, st in value.items() if k[1] == lever and k[2] == "treatment"))

    def add(self, value: Mapping[ValueKey, ArmStats]) -> None:
        self._slopes_cache.clear()
        self._forget()
        for key, st in value.items():
            if st.n <= 0 or not (math.isfinite(st.value_sum) and math.isfinite(st.value_sq_sum)):
                continue
            cpu = st.cpu_ms if math.isfinite(st.cpu_ms) and st.cpu_ms > 0.0 else 0.0
            acc = (
                st.accelerator_ms
                if math.isfinite(st.accelerator_ms) and st.accelerator_ms > 0.0
                else 0.0
            )
            sig = (st.signal_sum, st.signal_sq_sum, st.signal_value_sum)
            if not all(math.isfinite(v) for v in sig):
                sig = (0.0, 0.0, 0.0)
            a = self._sums.get(key)
            if a is None:
                self._sums[key] = [
                    float(st.n), st.value_sum, max(st.value_sq_sum, 0.0), cpu, acc, *sig,
                    float(st.n),
                ]  # fmt: skip
            else:
                a[8] += st.n  # new requests weigh 1: Σw² grows by their count
                a[0] += st.n
                a[1] += st.value_sum
                a[2] += max(st.value_sq_sum, 0.0)
                a[3] += cpu
                a[4] += acc
                a[5] += sig[0]
                a[6] += sig[1]
                a[7] += sig[2]

    def segments(self, lever: str) -> list[str]:
        """The segments ``lever`` has sums for (strata folded into their segment)."""
        return sorted({segment_of(k[0]) for k in self._sums if k[1] == lever})

    def _strata(self, lever: str, segment: str | None) -> list[str]:
        keys = {k[0] for k in self._sums if k[1] == lever}
        if segment is not None:
            keys = {k for k in keys if segment_of(k) == segment}
        return sorted(keys)

    def _pairs(
        self, lever: str, segment: str | None, col: int | None = None
    ) -> list[tuple[str, list[float], list[float]]]:
        """``(segment, treatment row, control row)`` per stratum of ``lever`` with treated
        requests (with ``col``: only those whose treatment sums carry cost in that column);
        strata whose control arm holds fewer than :data:`MIN_STRATUM_CONTROLS` requests are
        merged per segment (their sums add), as the estimator merges strata without a control,
        rather than left out. (Merging below 20 controls cut the lower bound's false proofs in
        the first two minutes of a null world from 12.5 % to 8.5 % but cost headroom 1.1k of
        21k on quickstart seed 1 and 1.1k on seed 5: not kept.)"""
        out: list[tuple[str, list[float], list[float]]] = []
        merged: dict[str, tuple[list[float], list[float]]] = {}
        for key in self._strata(lever, segment):
            t = self._sums.get((key, lever, "treatment"))
            if t is None or (col is not None and t[col] <= 0.0):
                continue
            c = self._sums.get((key, lever, "control"))
            seg = segment_of(key)
            if c is not None and c[0] >= MIN_STRATUM_CONTROLS:
                out.append((seg, t, c))
                continue
            mt, mc = merged.setdefault(seg, ([0.0] * len(t), [0.0] * len(t)))
            for i, v in enumerate(t):
                mt[i] += v
            if c is not None:
                for i, v in enumerate(c):
                    mc[i] += v
        out += [(seg, mt, mc) for seg, (mt, mc) in sorted(merged.items())]
        return out

    def uplift(self, lever: str, segment: str | None = None) -> Uplift:
        """Stratified uplift of ``lever`` per treated request (one segment, or all pooled).

        Strata are the book's keys: segments, or (segment, value bin) strata where the value
        signals carry them — each stratum's difference of means weighted by its treated count
        (post-stratification: the between-strata spread of request values leaves the variance).
        """
        key = ("uplift", lever, None, segment)
        got = self._estimates.get(key)
        if got is None:
            got = self._estimates[key] = self._uplift(lever, segment)
        return got

    def _uplift(self, lever: str, segment: str | None) -> Uplift:
        """The uncached :meth:`uplift`."""
        theta = self._slopes(lever)
        slope_var = self._slope_vars(lever)
        parts: list[tuple[float, float, float]] = []  # (n_t, d, v)
        n_t_total = 0.0
        n_c_total = 0.0
        for seg, t, c in self._pairs(lever, segment):
            n_t, n_c = t[0], c[0]
            if n_t < 2.0 or n_c < 2.0:
                continue
            th = theta.get(seg, 0.0)
            mt, mc = _moments(t), _moments(c)
            d, v = adjusted_difference(mt, mc, th)
            v += (mt.mean_x - mc.mean_x) ** 2 * slope_var.get(seg, 0.0)
            parts.append((n_t, d, v))
            n_t_total += n_t
            n_c_total += n_c
        if not parts:
            return Uplift(0.0, math.inf, n_t_total, n_c_total)
        mean = 0.0
        var = 0.0
        for n_t, d, v in parts:
            w = n_t / n_t_total
            mean += w * d
            var += w * w * v
        if not (math.isfinite(mean) and math.isfinite(var)):
            # sums so large they overflowed: no usable estimate rather than NaN downstream
            return Uplift(0.0, math.inf, n_t_total, n_c_total)
        return Uplift(mean, math.sqrt(var), n_t_total, n_c_total)

    def _forget(self) -> None:
        """Drop the answers kept until the sums next change (they just did)."""
        self._estimates.clear()
        self._worked_cache.clear()
        self._means_cache.clear()
        self._controls_cache.clear()

    def _controls(self, lever: str) -> dict[str, list[Moments]]:
        """Per segment, the moments of ``lever``'s control strata (kept until the sums next
        change)."""
        got = self._controls_cache.get(lever)
        if got is not None:
            return got
        controls: dict[str, list[Moments]] = {}
        for (key, lv, arm), a in self._sums.items():
            if lv == lever and arm == "control":
                controls.setdefault(segment_of(key), []).append(_moments(a))
        self._controls_cache[lever] = controls
        return controls

    def _slopes(self, lever: str) -> dict[str, float]:
        """Per segment, the control arm's slope of value on the value signal, pooled within its
        strata (:func:`headroom.kernel.estimate.slope`; 0 without signal sums)."""
        got = self._slopes_cache.get((lever, "slope"))
        if got is None:
            controls = self._controls(lever)
            got = {seg: slope(ms) for seg, ms in controls.items()}
            self._slopes_cache[(lever, "slope")] = got
        return got

    def _slope_vars(self, lever: str) -> dict[str, float]:
        """Per segment, the variance of its slope (:func:`headroom.kernel.estimate.
        slope_variance`): a stratum's difference carries ``(x̄_t − x̄_c)²`` of it."""
        got = self._slopes_cache.get((lever, "variance"))
        if got is None:
            theta = self._slopes(lever)
            controls = self._controls(lever)
            got = {seg: slope_variance(ms, theta.get(seg, 0.0)) for seg, ms in controls.items()}
            self._slopes_cache[(lever, "variance")] = got
        return got

    def per_unit(self, lever: str, unit: ResourceCost, segment: str | None = None) -> Uplift | None:
        """Value per unit of work over the strata where ``lever`` did work, or None when its
        treatment sums carry no cost (then :meth:`uplift` and the units book serve).

        The value signals' ``cost`` says how much work the treatment requests of a stratum
        received. A stratum where the lever did nothing (no cost) differs from its control by
        noise only — with value-ranked levers that is most strata — so it is left out. Each
        stratum ``s`` with work gives ``r_s = n_t,s · d_s / u_s`` with variance
        ``w_s⁻¹ = n_t,s² · v_s / u_s²``, and the strata are combined by inverse variance::

            value per unit = Σ_s w_s · r_s / Σ_s w_s,   se² = 1 / Σ_s w_s

        where ``u_s`` is the stratum's work in units (its cost on the lever's dominant resource
        over that resource's cost per unit). ``n_treatment`` of the result is the treated
        requests of those strata. Where value per unit differs across strata (it rises with the
        value bin) this reads below the work-weighted mean ``Σ n_t,s·d_s / Σ u_s``, since the
        quiet low-value strata weigh most (BENCHMARKS.md, *Simulator outcome targets*).
        """
        key = ("per_unit", lever, unit, segment)
        if key in self._estimates:
            return self._estimates[key]
        got = self._estimates[key] = self._per_unit(lever, unit, segment)
        return got

    def _per_unit(self, lever: str, unit: ResourceCost, segment: str | None) -> Uplift | None:
        """The uncached :meth:`per_unit`."""
        parts = self._worked_strata(lever, unit, segment)
        if parts is None:
            return None
        num = var = total_units = n_t_total = n_c_total = 0.0
        for w in parts:
            num += w.ratio / w.variance
            var += 1.0 / w.variance
            total_units += w.units
            n_t_total += w.n_t
            n_c_total += w.n_c
        if total_units <= 0.0 or var <= 0.0 or not math.isfinite(num):
            return Uplift(0.0, math.inf, n_t_total, n_c_total)
        return Uplift(num / var, math.sqrt(1.0 / var), n_t_total, n_c_total)

    def scaled(
        self,
        lever: str,
        unit: ResourceCost,
        gain: Callable[[str, float], float],
        segment: str | None = None,
    ) -> Uplift | None:
        """The measured value per unit of work as a multiple ``κ`` of what a model predicts,
        over the strata where ``lever`` worked (docs/controllers.md, "Value estimates").

        ``gain(segment, e)``: the model's uplift per unit of value signal for a request that
        received ``e`` units of work (RMA: the quality curve at ``e`` extra candidates; SBM:
        ``e``, the share of the request the strong model served). A stratum ``s`` predicts
        ``p_s = x̄_s · gain(seg, u_s/n_t,s) · n_t,s/u_s`` per unit, ``x̄_s`` the mean value
        signal of its treatment requests, and measures ``r_s`` (:meth:`per_unit`'s ratio, with
        its variance ``v_s``). Weighted least squares through the origin::

            κ = Σ_s r_s·p_s/v_s / Σ_s p_s²/v_s,     se(κ)² = 1 / Σ_s p_s²/v_s

        Unlike :meth:`per_unit`'s inverse-variance mean of ``r_s``, which the quiet low-value
        strata pull towards *their* value per unit, ``κ`` is unbiased for every stratum when
        the uplift is proportional to the request's value (delivered value is the value signal
        times the quality of the ad shown, docs/world.md), so ``κ · p`` values work in any
        stratum, worked or not. None when the treatment sums carry no cost or no value
        signal (then :meth:`per_unit` serves)."""
        parts = self._worked_strata(lever, unit, segment)
        if parts is None:
            return None
        num = den = n_t_total = n_c_total = 0.0
        for w in parts:
            if not w.signal > 0.0:
                continue
            p = w.signal * gain(w.segment, w.units / w.n_t) * w.n_t / w.units
            if not (p > 0.0 and math.isfinite(p)):
                continue
            num += w.ratio * p / w.variance
            den += p * p / w.variance
            n_t_total += w.n_t
            n_c_total += w.n_c
        if not any(w.signal > 0.0 for w in parts):
            return None  # the signals carry no value signal: nothing to scale
        if not (den > 0.0 and math.isfinite(num) and math.isfinite(den)):
            return Uplift(0.0, math.inf, n_t_total, n_c_total)
        return Uplift(num / den, math.sqrt(1.0 / den), n_t_total, n_c_total)

    def _worked_strata(
        self, lever: str, unit: ResourceCost, segment: str | None
    ) -> list[_Worked] | None:
        """Per stratum where ``lever`` worked (its treatment sums carry cost on the lever's
        dominant resource), the measured value per unit of work and its variance; None when no
        treatment sum carries cost. Strata with fewer than two requests in an arm, or a
        variance that is not positive, are left out. Kept until the sums next change."""
        key = (lever, unit, segment)
        if key in self._worked_cache:
            return self._worked_cache[key]
        got = self._worked_cache[key] = self._worked_strata_uncached(lever, unit, segment)
        return got

    def _worked_strata_uncached(
        self, lever: str, unit: ResourceCost, segment: str | None
    ) -> list[_Worked] | None:
        """The uncached :meth:`_worked_strata`."""
        if unit.cpu_s >= unit.accelerator_s and unit.cpu_s > 0.0:
            col, per_unit_ms = 3, unit.cpu_s * 1000.0
        elif unit.accelerator_s > 0.0:
            col, per_unit_ms = 4, unit.accelerator_s * 1000.0
        else:
            return None
        seen_cost = False
        theta = self._slopes(lever)
        slope_var = self._slope_vars(lever)
        out: list[_Worked] = []
        for seg, t, c in self._pairs(lever, segment, col):
            seen_cost = True
            n_t, n_c = t[0], c[0]
            if n_t < 2.0 or n_c < 2.0:
                continue
            mt, mc = _moments(t), _moments(c)
            d, v_d = adjusted_difference(mt, mc, theta.get(seg, 0.0))
            v_d += (mt.mean_x - mc.mean_x) ** 2 * slope_var.get(seg, 0.0)
            u = t[col] / per_unit_ms
            v = n_t * n_t * v_d / (u * u)
            if not (v > 0.0 and math.isfinite(v)):
                continue
            out.append(_Worked(seg, n_t, n_c, u, n_t * d / u, v, t[5] / n_t))
        return out if seen_cost else None

    def worked(self, lever: str, unit: ResourceCost) -> dict[str, tuple[float, float]]:
        """Per stratum (book key) where ``lever``'s treatment sums carry cost: (treated
        requests, units of work they received), the work on the lever's dominant resource over
        its cost per unit (as in :meth:`per_unit`)."""
        if unit.cpu_s >= unit.accelerator_s and unit.cpu_s > 0.0:
            col, per_unit_ms = 3, unit.cpu_s * 1000.0
        elif unit.accelerator_s > 0.0:
            col, per_unit_ms = 4, unit.accelerator_s * 1000.0
        else:
            return {}
        return {
            key: (a[0], a[col] / per_unit_ms)
            for (key, lv, arm), a in self._sums.items()
            if lv == lever and arm == "treatment" and a[0] > 0.0 and a[col] > 0.0
        }

    def signal_means(self, min_n: float = 2.0) -> dict[str, float]:
        """Per book key (segment or stratum), the mean value signal of its requests over every
        lever and arm: the signal is known before any work is done, so no arm biases it (the
        RMA levels' value of a stratum). Keys with fewer than ``min_n`` (discounted) requests
        carrying signal sums are left out. Kept until the sums next change (a copy is
        returned)."""
        got = self._means_cache.get(min_n)
        if got is None:
            got = self._means_cache[min_n] = self._signal_means(min_n)
        return dict(got)

    def _signal_means(self, min_n: float) -> dict[str, float]:
        """The uncached :meth:`signal_means`."""
        n: dict[str, float] = {}
        x: dict[str, float] = {}
        for (key, _lever, _arm), a in self._sums.items():
            if a[0] > 0.0 and a[5] > 0.0:
                n[key] = n.get(key, 0.0) + a[0]
                x[key] = x.get(key, 0.0) + a[5]
        return {k: x[k] / n[k] for k in n if n[k] >= min_n and math.isfinite(x[k] / n[k])}

    def pooled_sd(self) -> float:
        """Standard deviation of one request's value over everything seen (0 if nothing)."""
        n = s = q = 0.0
        for a in self._sums.values():
            n += a[0]
            s += a[1]
            q += a[2]
        if n < 2.0:
            return 0.0
        mean = s / n
        return math.sqrt(max(q / n - mean * mean, 0.0))

    def snapshot(self) -> dict[str, Any]:
        """``{"rows": [[segment, lever, arm, n, sum, sum_sq, cpu_ms, accelerator_ms, signal_sum,
        signal_sq_sum, signal_value_sum, n_sq], …]}`` (``n_sq`` = Σw², the effective count's
        denominator); the
        units book as rows of arm ``"units"`` (``["", lever, "units", treated, units, 0.0]``)."""
        rows = [[k[0], k[1], k[2], *a] for k, a in sorted(self._sums.items())]
        rows += [
            ["", lever, _UNITS_ARM, u[0], u[1], 0.0] for lever, u in sorted(self._units.items())
        ]
        return {"rows": rows}

    def restore(self, state: Mapping[str, Any] | Iterable[Iterable[Any]]) -> None:
        """Replace the sums with those of a :meth:`snapshot`. Also reads the forms stored by
        earlier versions: the bare list of rows (no ``{"rows": …}`` around it), rows without
        the two cost columns (cost 0), rows without the signal columns (0) and rows without
        ``n_sq`` (taken as ``n``: every request weighing 1, the variance as before)."""
        rows: Iterable[Any] = state["rows"] if isinstance(state, Mapping) else state
        sums: dict[ValueKey, list[float]] = {}
        units: dict[str, list[float]] = {}
        for row in rows:
            seg, lever, arm, n, s, q, *cost = row
            if arm == _UNITS_ARM:
                units[str(lever)] = [float(n), float(s)]
                continue
            cpu, acc = (float(cost[0]), float(cost[1])) if len(cost) >= 2 else (0.0, 0.0)
            sig = [float(v) for v in cost[2:5]] if len(cost) >= 5 else [0.0, 0.0, 0.0]
            n_sq = float(cost[5]) if len(cost) >= 6 else float(n)
            sums[(str(seg), str(lever), str(arm))] = [
                float(n), float(s), float(q), cpu, acc, *sig, n_sq
            ]  # fmt: skip
        self._sums = sums
        self._units = units
        self._slopes_cache.clear()
        self._forget()


_SNAPSHOTTING: tuple[type[Snapshotting], ...] = (ValueBook,)  # checked by mypy


class QualityCurves(Protocol):
    """What :meth:`RmaCurve.from_curves` reads of the ranking world's measured curves
    (:class:`headroom.world.values.ValueCurves`): mean top-ad quality per segment index, model
    (0 base) and candidate count."""

    def mean_quality(self, segment_idx: Any, model: Any, n: Any) -> Any: ...


@dataclass(frozen=True, slots=True)
class RmaCurve:
    """RMA's value curve: per segment, the mean quality the base model gains by ranking
    ``extras[j]`` more candidates than the base count (``extras[0] = 0``, gain 0 there)."""

    extras: tuple[int, ...]
    gains: Mapping[str, tuple[float, ...]]

    def __post_init__(self) -> None:
        if (
            not self.extras
            or self.extras[0] != 0
            or any(b <= a for a, b in zip(self.extras, self.extras[1:], strict=False))
        ):
            raise ValueError("extras must start at 0 and increase strictly")
        for seg, g in self.gains.items():
            if len(g) != len(self.extras):
                raise ValueError(f"gains[{seg!r}]: {len(g)} points for {len(self.extras)} extras")

    def hull(self, segment: str) -> tuple[tuple[float, float, float], ...]:
        """The rising tranches of ``segment``'s concave hull (:func:`concave_tranches`); a
        stratum worth ``V > 0`` per unit of gain has the same tranches, slopes times ``V``."""
        return _hull_of(self.extras, tuple(self.gains[segment]))

    def gain(self, segment: str, extra: float) -> float:
        """The curve's gain of ``segment`` at ``extra`` extras (linear between its points)."""
        return float(np.interp(extra, self.extras, self.gains[segment]))

    def gain_or_zero(self, segment: str, extra: float) -> float:
        """:meth:`gain`, 0 for a segment the curve does not know (no prediction there)."""
        return self.gain(segment, extra) if segment in self.gains else 0.0

    @classmethod
    def from_curves(
        cls,
        curves: QualityCurves,
        segments: Sequence[str],
        base: int,
        max_candidates: int,
        steps: int = 16,
    ) -> RmaCurve:
        """The curve at ``steps`` equal steps of ``[0, max − base]`` (segments in the curves'
        order)."""
        span = max(int(max_candidates) - int(base), 0)
        extras = sorted({round(span * j / max(steps, 1)) for j in range(max(steps, 1) + 1)})
        n = np.asarray([base + e for e in extras], dtype=np.float64)
        gains = {}
        for i, seg in enumerate(segments):
            q = np.asarray(curves.mean_quality(i, 0, n), dtype=np.float64)
            gains[seg] = tuple(float(x - q[0]) for x in q)
        return cls(tuple(int(e) for e in extras), gains)


@functools.lru_cache(maxsize=256)
def _hull_of(x: tuple[int, ...], y: tuple[float, ...]) -> tuple[tuple[float, float, float], ...]:
    return tuple(concave_tranches(x, y))


def concave_tranches(x: Sequence[float], y: Sequence[float]) -> list[tuple[float, float, float]]:
    """The rising part of the upper concave hull of the points ``(x, y)`` (``x`` increasing),
    as tranches ``(from, to, slope)`` with decreasing positive slopes."""
    hull: list[tuple[float, float]] = []
    for p in zip(x, y, strict=True):
        while len(hull) >= 2:
            (x0, y0), (x1, y1) = hull[-2], hull[-1]
            if (x1 - x0) * (p[1] - y0) - (y1 - y0) * (p[0] - x0) >= 0.0:
                hull.pop()  # the middle point is on or under the chord: not a vertex
            else:
                break
        hull.append(p)
    out = []
    for (x0, y0), (x1, y1) in itertools.pairwise(hull):
        slope = (y1 - y0) / (x1 - x0)
        if not (slope > 0.0 and math.isfinite(slope)):
            break
        out.append((x0, x1, slope))
    return out


class Lever(ABC):
    """One kind of optional work; see the module docstring for the five questions."""

    name: str
    use: CapacityUse = CapacityUse.LIVE
    shed_action: ShedAction = ShedAction.DROP
    hardware: tuple[str, ...] | None = None  # accelerator types it may use; None = any
    min_durability_s: float = 0.0  # pools expiring sooner than this are useless to it
    # seconds an accelerator new to the lever idles before it does work (the strong model's
    # load): the allocator prices such units below the ones it already holds
    load_s: float = 0.0
    # True when its treatment value signals carry the ``cost`` of the work they received (the
    # live levers' servers report it): then treatment sums without cost mean it did no work
    costed_signals: bool = False

    @abstractmethod
    def unit_cost(self) -> ResourceCost:
        """Resources per unit of work (core-seconds, device-seconds)."""

    @abstractmethod
    def demand(self, ctx: LeverContext) -> float:
        """Most units of work per second that are useful now (>= 0)."""

    def units_per_treated(self, ctx: LeverContext) -> float:
        """Units of work behind one treated request, to turn uplift per request into value per
        unit of work. Default: one."""
        return 1.0

    def work_in_window(self, ctx: LeverContext, window_s: float, treated: float) -> float:
        """Units of work done over a window whose value signals counted ``treated`` treatment
        requests, with ``ctx`` in force (the units book's input). Default: ``treated`` ×
        :meth:`units_per_treated`; a lever whose work is not done per treated request
        (precompute: jobs run whether or not a visit finds their result) overrides it."""
        return treated * self.units_per_treated(ctx)

    def can_use_accelerator(self, hardware: str) -> bool:
        return self.hardware is None or hardware in self.hardware

    def usable_share(self, resource: str, units: float) -> float:
        """The share in (0, 1] of ``units`` held units of a ``resource`` pool ("cpu" or
        "accelerator") this lever can turn into work: the allocator values a held unit at this
        share of a used one. Default 1; SBM's strong replicas only admit work up to the
        admissible utilisation of that many devices (defences/admission.py)."""
        return 1.0

    def min_hold(self, resource: str) -> float:
        """The fewest units of a ``resource`` pool this lever can hold at all (0: any slice).
        SBM: one whole accelerator device, since a strong replica needs one. The allocator gives
        such a lever either nothing of a pool or at least this much (or the whole pool when it
        is smaller: a slice), never a share the replicas' placement would round away."""
        return 0.0

    def estimate(
        self,
        book: ValueBook,
        ctx: LeverContext,
        z: float,
        min_samples: float,
        segment: str | None = None,
    ) -> ValueEstimate:
        """Value per unit of work from the book (see the module docstring), over all segments
        or over one ``segment``'s strata."""
        direct = book.per_unit(self.name, self.unit_cost(), segment)
        if direct is None and self.costed_signals:
            # its signals carry cost whenever it works, and no stratum's treatment sums carry
            # any: it did no work on record, so treatment and control differ by noise only.
            # Unknown (so it is explored), not the noise divided by the units in force.
            up = book.uplift(self.name, segment)
            return ValueEstimate.unknown(up.n_treatment, up.n_control)
        if direct is not None:
            up = direct
            units = 1.0  # already per unit of work
        else:
            up = book.uplift(self.name, segment)
            book_units = book.mean_units(self.name)
            units = book_units if book_units is not None else self.units_per_treated(ctx)
            units = max(units, 1e-12)
        if up.n_treatment < min_samples or up.n_control < min_samples or not math.isfinite(up.se):
            return ValueEstimate.unknown(up.n_treatment, up.n_control)
        mean = up.mean / units
        se = up.se / units
        return ValueEstimate(
            mean, se, mean - z * se, mean + z * se, up.n_treatment, up.n_control, True
        )

    def requests_per_unit(self) -> float | None:
        """Requests one unit of work takes whole, for levers that exclude one another on a
        request (a request gets RMA or the strong model, never both): the allocator's
        per-segment request row. None (default): the lever's work is not per request."""
        return None

    def tranches(
        self, book: ValueBook, ctx: LeverContext, z: float, min_samples: float
    ) -> list[Tranche]:
        """The lever's demand split by segment, each part valued by its own segment's estimate
        (diminishing returns: the allocator fills the most valuable part first). A lever whose
        work is not per request, or a context without segment rates, is one tranche at the
        pooled estimate. A segment without an estimate of its own is valued at the pooled one
        (what every segment got before it had data)."""
        pooled = self.estimate(book, ctx, z, min_samples)
        total = sum(r for r in ctx.segment_rps.values() if math.isfinite(r) and r > 0.0)
        if self.requests_per_unit() is None or total <= 0.0:
            return [Tranche(None, self.demand(ctx), pooled, max(ctx.request_rps, 0.0))]
        out = []
        for seg, rps in sorted(ctx.segment_rps.items()):
            if not (math.isfinite(rps) and rps > 0.0):
                continue
            est = self.estimate(book, ctx, z, min_samples, seg)
            cap = self.segment_demand(ctx, rps, total)
            out.append(Tranche(seg, cap, est if est.known else pooled, rps, est.known))
        return out

    def segment_demand(self, ctx: LeverContext, rps: float, total_rps: float) -> float:
        """Most units of work per second a segment of ``rps`` requests can use. Default: its
        share of :meth:`demand`."""
        return self.demand(ctx) * rps / total_rps if total_rps > 0.0 else 0.0

    def rate_for(self, cpu: float, accelerator: float) -> float:
        """Apply: the work rate (units/s) a budget of ``cpu`` cores and ``accelerator`` devices
        pays for — the binding resource decides."""
        cost = self.unit_cost()
        rate = math.inf
        if cost.cpu_s > 0.0:
            rate = min(rate, max(cpu, 0.0) / cost.cpu_s)
        if cost.accelerator_s > 0.0:
            rate = min(rate, max(accelerator, 0.0) / cost.accelerator_s)
        return 0.0 if math.isinf(rate) else rate


class RmaLever(Lever):
    """Rank More Ads: extra candidates per request, retrieval CPU plus base-model accelerator."""

    name = LEVER_RMA
    use = CapacityUse.LIVE
    shed_action = ShedAction.TRIM_CANDIDATES
    costed_signals = True

    def __init__(
        self,
        costs: CostModel,
        base_candidates: int,
        max_candidates: int,
        step_headroom: float | None = None,
        curve: RmaCurve | None = None,
    ) -> None:
        self.costs = costs
        self.hardware = costs.base_hardware
        self.span = max(max_candidates - base_candidates, 0)
        self.curve = curve
        # The latency loop moves the target up by at most one rate-limit step per interval, so
        # capacity beyond (extra in force + one step) would sit idle in RMA's budget while
        # another lever could use it. None: no such limit (the whole span).
        self.step_headroom = step_headroom

    def unit_cost(self) -> ResourceCost:
        return self.costs.rma_per_candidate

    def demand(self, ctx: LeverContext) -> float:
        extra = float(self.span)
        if self.step_headroom is not None:
            extra = min(extra, max(ctx.rma_extra_candidates, 0.0) + self.step_headroom)
        return max(ctx.request_rps, 0.0) * extra

    def units_per_treated(self, ctx: LeverContext) -> float:
        return max(ctx.rma_extra_candidates, 1.0)

    def requests_per_unit(self) -> float | None:
        # value-ranked spend: a request that gets RMA gets the whole span of extras
        return 1.0 / self.span if self.span > 0 else None

    def segment_demand(self, ctx: LeverContext, rps: float, total_rps: float) -> float:
        # a segment's requests can each take the span; the rate-limit step bounds the lever
        # as a whole (its demand row), not how it is spread over segments
        return max(rps, 0.0) * self.span

    def estimate(
        self,
        book: ValueBook,
        ctx: LeverContext,
        z: float,
        min_samples: float,
        segment: str | None = None,
    ) -> ValueEstimate:
        """With a curve and value signals: the value per candidate of the work on record,
        measured as ``κ`` times what the curve predicts for it (:meth:`ValueBook.scaled` with
        the curve's gain as the model, times :meth:`predicted`). The strata then weigh by what
        they hold on the curve, not by how quiet they are: the inverse-variance mean of
        :meth:`Lever.estimate` reads RMA's work far below its worth once its levels reach
        many low-value strata (docs/controllers.md, "Value estimates"). Without a curve, or
        before the book holds a prediction: :meth:`Lever.estimate`."""
        curve = self.curve
        if curve is None:
            return super().estimate(book, ctx, z, min_samples, segment)
        predicted = self.predicted(book, curve, book.signal_means(), segment)
        kappa = book.scaled(self.name, self.unit_cost(), curve.gain_or_zero, segment)
        if kappa is None or not predicted > 0.0:
            return super().estimate(book, ctx, z, min_samples, segment)
        known = _known(kappa, min_samples)
        if known is None:
            return ValueEstimate.unknown(kappa.n_treatment, kappa.n_control)
        return _scaled_estimate(known, predicted, z)

    def predicted(
        self,
        book: ValueBook,
        curve: RmaCurve,
        means: Mapping[str, float],
        segment: str | None = None,
    ) -> float:
        """The value per candidate ``curve`` predicts for the work on record (of one
        ``segment``, or all): every worked stratum's mean value signal (``means``,
        :meth:`ValueBook.signal_means`) times the curve's gain at the extras its treated
        requests received, over the candidates they received; 0 without any."""
        num = units = 0.0
        for key, (n_t, u) in book.worked(self.name, self.unit_cost()).items():
            v = means.get(key)
            seg = segment_of(key)
            if (segment is not None and seg != segment) or v is None or seg not in curve.gains:
                continue
            if n_t > 0.0:
                num += n_t * v * curve.gain(seg, u / n_t)
                units += u
        return num / units if units > 0.0 else 0.0

    def tranches(
        self, book: ValueBook, ctx: LeverContext, z: float, min_samples: float
    ) -> list[Tranche]:
        """With a curve: RMA's value as concave tranches over the strata (docs/controllers.md,
        "RMA levels"). Every stratum ``c`` (segment × value bin) gains ``V_c · G_s(e)`` per
        request with ``e`` extras (``V_c`` its mean value signal, ``G_s`` the curve's
        quality gain); the rising tranches of each stratum's concave hull, ``rps_c · (b − a)``
        candidates/s at ``V_c · slope`` per candidate, are the bands, sorted by that value
        (``rma-band-0`` the most valuable). Each band names its stratum and the requests one
        candidate/s of it treats there (``1/(b − a)``, :attr:`Tranche.strata`), so the
        allocator keeps RMA off the requests of a stratum the strong model's tranches take
        (a request gets one of the two). The measured value calibrates the curve: every
        band's estimate is ``V_c · slope`` times the lever's pooled estimate over the value
        the curve predicts for the work on record (:meth:`ValueBook.worked`), so its LCB is
        the measured LCB in the curve's shape. Without a curve, a pooled estimate, a value
        signal for every stratum of a segment with traffic, or a positive prediction: the
        per-segment tranches."""
        curve = self.curve
        pooled = self.estimate(book, ctx, z, min_samples)
        if curve is None or not pooled.known:
            return super().tranches(book, ctx, z, min_samples)
        means = book.signal_means()
        # (value per candidate, candidates/s, stratum, requests one candidate/s of the piece
        # treats: a piece from a to b extras gives each of its requests b − a of them)
        rows: list[tuple[float, float, str, float]] = []
        for seg, rps in sorted(ctx.segment_rps.items()):
            if not (math.isfinite(rps) and rps > 0.0) or seg not in curve.gains:
                continue
            bins = bin_means(means, seg)
            if bins is None:
                return super().tranches(book, ctx, z, min_samples)
            for k, mean in enumerate(bins):
                if mean > 0.0:
                    rows += [
                        (
                            mean * rise,
                            rps / VALUE_BINS * (b - a),
                            stratum_key(seg, k),
                            1.0 / (b - a),
                        )
                        for a, b, rise in curve.hull(seg)
                    ]
        predicted = self.predicted(book, curve, means)
        if not rows or not predicted > 0.0:
            return super().tranches(book, ctx, z, min_samples)
        rows.sort(key=lambda r: -r[0])
        out: list[Tranche] = []
        for i, (v, d, key, per) in enumerate(rows):
            value = v / predicted
            est = ValueEstimate(
                pooled.mean * value,
                pooled.se * value,
                pooled.lcb * value,
                pooled.ucb * value,
                pooled.n_treatment,
                pooled.n_control,
                True,
            )
            out.append(Tranche(f"rma-band-{i}", d, est, 0.0, True, ((key, per),)))
        return out


def merge_uncontested(
    tranches: Sequence[Tranche], contested: Set[str], bands: int
) -> list[Tranche]:
    """``tranches`` (in value order, best first) with every run of consecutive ones whose
    strata (:attr:`Tranche.strata`) are all outside ``contested`` merged into bands of at least
    ``1/bands`` of the whole demand: a merged band is worth its parts' demand-weighted value
    and treats their requests in proportion. A tranche on a contested stratum (another lever
    serves it too: the allocator's per-stratum rows must see it alone) or without strata stays
    as it is; a merged band keeps its first part's name. The allocator's LP stays small, and
    where only the pools and the demand bind, a band filled in part is the same spend as its
    parts filled best first but for the order inside it (RMA's bands before they were split
    per stratum)."""
    total = sum(t.demand for t in tranches)
    per_band = total / max(bands, 1)
    out: list[Tranche] = []
    run: list[Tranche] = []

    def flush() -> None:
        if run:
            out.append(_band(run))
            run.clear()

    for t in tranches:
        if not t.strata or any(k in contested for k, _ in t.strata):
            flush()
            out.append(t)
            continue
        run.append(t)
        if sum(r.demand for r in run) >= per_band * (1.0 - 1e-9):
            flush()
    flush()
    return out


def _band(parts: Sequence[Tranche]) -> Tranche:
    """One tranche for consecutive ``parts``: their demand, their demand-weighted estimate,
    and the requests a unit of the whole treats in each of their strata."""
    if len(parts) == 1:
        return parts[0]
    d = sum(t.demand for t in parts)
    if not d > 0.0:
        return parts[0]

    def avg(get: Callable[[ValueEstimate], float]) -> float:
        return sum(get(t.estimate) * t.demand for t in parts) / d

    first = parts[0].estimate
    est = ValueEstimate(
        avg(lambda e: e.mean),
        avg(lambda e: e.se),
        avg(lambda e: e.lcb),
        avg(lambda e: e.ucb),
        first.n_treatment,
        first.n_control,
        all(t.estimate.known for t in parts),
    )
    strata: dict[str, float] = {}
    for t in parts:
        for k, r in t.strata:
            strata[k] = strata.get(k, 0.0) + r * t.demand / d
    return Tranche(
        parts[0].segment,
        d,
        est,
        sum(t.requests for t in parts),
        all(t.own for t in parts),
        tuple(sorted(strata.items())),
    )


def _known(kappa: Uplift | None, min_samples: float) -> Uplift | None:
    """``kappa`` when it rests on ``min_samples`` requests in both arms and has a finite
    standard error, else None."""
    if kappa is None or not math.isfinite(kappa.se):
        return None
    if kappa.n_treatment < min_samples or kappa.n_control < min_samples:
        return None
    return kappa


def _scaled_estimate(kappa: Uplift, value: float, z: float) -> ValueEstimate:
    """The estimate of work predicted to be worth ``value`` per unit (value signal times the
    model's gain) when the measured value is ``κ`` times the prediction
    (:meth:`ValueBook.scaled`)."""
    mean = kappa.mean * value
    se = kappa.se * value
    return ValueEstimate(
        mean, se, mean - z * se, mean + z * se, kappa.n_treatment, kappa.n_control, True
    )


class SbmLever(Lever):
    """Serve Better Models: a share of eligible requests on the strong model's replicas."""

    name = LEVER_SBM
    use = CapacityUse.LIVE
    shed_action = ShedAction.DOWNGRADE_MODEL
    costed_signals = True

    def __init__(
        self, costs: CostModel, max_coverage: float = 1.0, wait_budget_ms: float | None = None
    ) -> None:
        self.costs = costs
        self.hardware = costs.strong_hardware
        self.min_durability_s = costs.strong_load_s
        self.load_s = costs.strong_load_s
        self.max_coverage = max_coverage
        # the strong replicas' mean-wait budget (coverage ``wait_budget_share`` × setpoint):
        # they admit work up to the utilisation whose queue stays within it; None: no limit
        self.wait_budget_ms = wait_budget_ms

    def unit_cost(self) -> ResourceCost:
        return self.costs.sbm_per_request

    def usable_share(self, resource: str, units: float) -> float:
        if resource != "accelerator" or self.wait_budget_ms is None or not units > 0.0:
            return 1.0
        service_ms = self.costs.sbm_per_request.accelerator_s * 1000.0
        return admissible_utilization(units, service_ms, self.wait_budget_ms)

    def min_hold(self, resource: str) -> float:
        return 1.0 if resource == "accelerator" else 0.0

    def demand(self, ctx: LeverContext) -> float:
        return max(ctx.eligible_rps, 0.0) * self.max_coverage

    def requests_per_unit(self) -> float | None:
        return 1.0

    def tranches(
        self, book: ValueBook, ctx: LeverContext, z: float, min_samples: float
    ) -> list[Tranche]:
        """Per stratum (segment × value bin): the plan routes a segment's share to the strong
        model highest value bins first (defences/plan.py, step 2), so SBM's next request in a
        segment is worth less the more of it SBM serves. A request of bin ``k`` is worth
        ``κ_s · V_k`` per unit (``V_k`` the bin's mean value signal, ``κ_s`` the segment's
        measured uplift per unit of value signal, :meth:`ValueBook.scaled`; the pooled ``κ``
        for a segment without its own, which makes its tranches not ``own``), and each bin can
        use ``1/K`` of the segment's demand. A segment without value signals, or without any
        known ``κ``, keeps its one tranche (:meth:`Lever.tranches`)."""
        base = super().tranches(book, ctx, z, min_samples)
        if len(base) == 1 and base[0].segment is None:
            return base
        cost = self.unit_cost()
        means = book.signal_means()
        pooled = _known(book.scaled(self.name, cost, _served, None), min_samples)
        out: list[Tranche] = []
        for t in base:
            seg = str(t.segment)
            bins = bin_means(means, seg)
            own = _known(book.scaled(self.name, cost, _served, seg), min_samples)
            kappa = own if own is not None else pooled
            if bins is None or kappa is None:
                out.append(t)
                continue
            for k, v in enumerate(bins):
                est = _scaled_estimate(kappa, max(v, 0.0), z)
                out.append(
                    Tranche(
                        stratum_key(seg, k),
                        t.demand / VALUE_BINS,
                        est,
                        t.requests / VALUE_BINS,
                        own is not None,
                    )
                )
        return out


def _served(segment: str, units: float) -> float:
    """SBM's model for :meth:`ValueBook.scaled`: a request's uplift is its value signal times
    the share of it the strong model served (one unit of work is one whole request)."""
    return units


class PrecomputeLever(Lever):
    """Precompute: rank a returning user's candidates with the strong model ahead of a visit."""

    name = LEVER_PRECOMPUTE
    use = CapacityUse.ASYNC
    shed_action = ShedAction.STOP_JOBS

    def __init__(self, costs: CostModel, max_jobs_per_request: float = 1.0) -> None:
        self.costs = costs
        self.hardware = costs.strong_hardware
        self.max_jobs_per_request = max_jobs_per_request

    def unit_cost(self) -> ResourceCost:
        return self.costs.precompute_per_job

    def demand(self, ctx: LeverContext) -> float:
        # at most one stored result per upcoming visit is worth computing
        return max(ctx.request_rps, 0.0) * self.max_jobs_per_request

    def units_per_treated(self, ctx: LeverContext) -> float:
        if ctx.request_rps <= 0.0 or ctx.precompute_jobs_per_s <= 0.0:
            return 1.0
        return ctx.precompute_jobs_per_s / ctx.request_rps

    def work_in_window(self, ctx: LeverContext, window_s: float, treated: float) -> float:
        # the jobs run in the window, served or not: a hit's value pays for every job, so
        # value per job = uplift per hit × hits / jobs (not per request: that would overstate
        # it by 1 / hit rate)
        return max(ctx.precompute_jobs_per_s, 0.0) * max(window_s, 0.0)


class LeverRegistry:
    """An immutable, ordered set of levers by name, passed to the control plane (never global)."""

    __slots__ = ("_levers",)

    def __init__(self, levers: Iterable[Lever] = ()) -> None:
        items: dict[str, Lever] = {}
        for lever in levers:
            if not getattr(lever, "name", ""):
                raise ValueError(f"lever {lever!r} has no name")
            if lever.name in items:
                raise ValueError(f"lever {lever.name!r} registered twice")
            items[lever.name] = lever
        self._levers = items

    @classmethod
    def standard(
        cls,
        costs: CostModel,
        base_candidates: int,
        max_candidates: int,
        *,
        max_coverage: float = 1.0,
        precompute: bool = False,
        rma_step_headroom: float | None = None,
        strong_wait_budget_ms: float | None = None,
        rma_curve: RmaCurve | None = None,
    ) -> LeverRegistry:
        """RMA and SBM, plus precompute when the scenario allows it. ``rma_step_headroom``:
        extra candidates the RMA loop may add in one step (its demand stops there);
        ``strong_wait_budget_ms``: the strong replicas' mean-wait budget (SBM's usable share)."""
        levers: list[Lever] = [
            RmaLever(costs, base_candidates, max_candidates, rma_step_headroom, rma_curve),
            SbmLever(costs, max_coverage, strong_wait_budget_ms),
        ]
        if precompute:
            levers.append(PrecomputeLever(costs))
        return cls(levers)

    def with_lever(self, lever: Lever) -> LeverRegistry:
        return LeverRegistry([*self._levers.values(), lever])

    def __getitem__(self, name: str) -> Lever:
        return self._levers[name]

    def get(self, name: str) -> Lever | None:
        return self._levers.get(name)

    def __contains__(self, name: object) -> bool:
        return name in self._levers

    def __iter__(self) -> Iterator[Lever]:
        return iter(self._levers.values())

    def __len__(self) -> int:
        return len(self._levers)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(self._levers)


def bin_means(means: Mapping[str, float], segment: str) -> list[float] | None:
    """A segment's mean value signal per value bin (``means``: :meth:`ValueBook.signal_means`),
    a bin without a mean of its own (too few requests so far) taking the mean of the nearest
    bins below and above it that have one (the one side at an edge): the bins are value
    quantiles, so a neighbour is the best guess of a sparse bin's value, and one sparse bin does
    not cancel the per-stratum view. None when no bin of the segment has a mean. RMA's tranches
    and the control plane's per-stratum levels both read the bins through it."""
    row = [means.get(stratum_key(segment, k)) for k in range(VALUE_BINS)]
    known = [k for k, v in enumerate(row) if v is not None]
    if not known:
        return None
    out: list[float] = []
    for k, v in enumerate(row):
        if v is not None:
            out.append(v)
            continue
        below = max((j for j in known if j < k), default=None)
        above = min((j for j in known if j > k), default=None)
        sides = [float(row[j] or 0.0) for j in (below, above) if j is not None]
        out.append(sum(sides) / len(sides))
    return out
