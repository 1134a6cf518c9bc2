"""Allocator: splits a region's opportunistic capacity between the registered levers.

The problem
-----------
A region announces opportunistic *pools*: (resource, hardware, remote, remaining lifetime,
units). Each registered lever (controllers/levers.py) costs ``cpu_l`` core-seconds and ``acc_l``
device-seconds per unit of work, is worth ``v_l`` per unit (its estimated **mean**, once its
**lower confidence bound** is above 0: a lever must prove its value before it gets capacity, and
a proven one is then valued at what it is expected to be worth), and can absorb at most ``D_l``
units/s.
Which pools a lever may use:

* **hardware** — an accelerator pool only if its type is in ``lever.hardware`` (SBM and
  precompute: the strong model's types; RMA: the base model's);
* **durability** — no pool whose remaining lifetime is below ``lever.min_durability_s`` (SBM: the
  strong model's ``load_s``: capacity that vanishes before the model is loaded is worth nothing);
* **remote** — pools marked ``remote`` only for ``ASYNC`` levers (precompute), never for the
  live path;
* **resource mix** — a lever costing both CPU and accelerator (RMA) gets a variable per
  (CPU pool, accelerator pool) pair, so it runs only where both exist.

Guardrails: every pool counts ``units × (1 - safety_margin)``; a lever may take at most
``cap_l`` of any pool that another lever could also use (a cap on a pool nobody else can use
would only waste it); and value signals that are missing, stale or too uncertain trigger a
conservative fallback (below).

The solution: an exact linear program
-------------------------------------
With values linear in work, the best split is the LP::

    maximise   Σ_j v_j x_j                         x_j = work rate of one (lever, pool pair)
    subject to Σ_j use_jp x_j ≤ units_p            every pool p (after the safety margin)
               Σ_{j ∈ l} x_j ≤ D_l                 every lever's demand
               Σ_{j ∈ l} use_jp x_j ≤ cap_l·units_p  every contested (lever, pool)
               x ≥ 0

All coefficients and bounds are non-negative, so the origin is feasible and a single-phase
simplex suffices. It is solved exactly by :func:`solve_lp`, a dense tableau simplex (Dantzig's
rule, Bland's rule after too many degenerate pivots so it cannot cycle), eliminating only
where the pivot row and column are non-zero in a large tableau (a small one is updated whole:
fewer numpy calls, the same arithmetic), and with no tableau at all when every variable it
would enter is held at 0 by a row with no room. A region's LP takes about 30 microseconds
with a lever per pool (the median over the LPs of a 3 h diurnal-3region run) and 1.2 ms with
RMA's bands on three segments' contested strata (160–250 rows, ~37 pivots) — scipy's
``linprog`` gives the same optimum (a unit test checks it on random instances) but costs a
millisecond per call in set-up alone. The exploration and top-up LPs are not built at all
where they can give none of their levers anything (:func:`_spent`). A greedy by value per
resource unit is *not* exact here: RMA is CPU-heavy, SBM and precompute accelerator-heavy, and
the optimum often splits a pool between two levers that each use both resources.

Each lever's value enters as ``v_l`` per unit of work; variables are scaled to the lever's
dominant resource so the tableau is well conditioned. ``LeverShare.value_per_unit_lcb`` reports
the LCB per core-second or device-second of that dominant resource.

**Proven by the LCB, valued at the mean.** The LCB decides which levers and tranches get
capacity at all (``lcb > 0``); among those the LP weighs each at its mean. Weighing them at
their LCBs too would favour whichever lever is measured more precisely, not the one worth more:
a lever measured on a thin slice of a contested pool has an LCB far below its mean.

Exploration and fallback
------------------------
* A lever not proven valuable (LCB ≤ 0) but not proven harmful (UCB > 0, or no estimate yet)
  first gets ``explore_share`` of every pool it can use (split equally among such levers), so its
  value signals keep arriving; the LP then splits the rest between the proven levers.
* Remote pools the proven levers left go whole to those unproven levers (equal parts), in a
  fallback too: the live path may not touch them, so measuring on all of them costs nothing.
  Outside a fallback the live capacity the proven levers left idle goes to them too
  (``explore_idle``): idle units earn nothing, the work is samples that settle the lever's value
  sooner, and the servers' admission rule bounds how busy the pools run either way. What they
  leave of it goes to the proven levers, up to their demand: a lever whose LCB has just crossed
  0, worth almost nothing in the LP, keeps about what it held unproven (no cliff at the proof).
* **A whole device** (a lever that needs one, SBM): the lever is pinned to it or dropped from
  the pool, one (lever, pool) at a time. A lever being measured is pinned (it must work to be
  measured), unless that leaves an unknown lever measured on the pool nothing of it. A proven
  one is pinned when that is worth more than what the others make of the pool, and not when it
  would shut out of the pool a lever measured but not proven either way whose work there is
  worth more at its estimated mean (its demand counted): else a lever not yet proven when the
  other was pinned to the only pool it can use would get no samples again. A proven lever
  that holds at least the device is pinned to it too, outside a fallback and while no lever is
  being measured: the pin prices the devices it holds at their own usable share and its units
  of the rest of the pool at the chord of its usable units (more devices run busier at the same
  wait), and its slot is filled by the value-ordered LP, so its work there is named by stratum.
* **Fallback** — when value signals never arrived (``no_value``), are older than
  ``value_stale_s`` (``stale_value``), or leave no lever with a positive LCB while some could
  still be positive (``uncertain_value``), the allocator hands ``fallback_share`` of the safe
  capacity to the eligible levers in equal parts of each pool and nothing more. When the
  capacity left after the safety margin is below ``min_pool_units`` everywhere, nothing is
  allocated (``below_safety_margin``).

Loading
-------
A device new to the strong model idles for the model's load (``lever.load_s``) before it serves:
of a pool that lives ``lifetime`` more seconds it works ``lifetime − load_s`` of them. Given what
the last split gave each lever (``held``, :meth:`Allocation.held`), the value-ordered LP prices a
lever's units of a pool beyond the ones it holds at ``1 − load_s / lifetime`` of a loaded one (a
second copy of its variables there, the first limited to the held units). So devices move to
the strong model only for a gain that pays the load, not back and forth on a knife edge between
it and RMA; a pool of unknown lifetime, or a call without ``held``, prices every unit as
loaded.

Every result says whether it fell back and why, and which levers' caps bound, so the event log
can disclose the allocator's failure bounds.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum

import numpy as np
import numpy.typing as npt

from headroom.controllers.config import AllocatorSettings, ValueSettings
from headroom.controllers.levers import (
    CapacityUse,
    Lever,
    LeverContext,
    LeverRegistry,
    QualityCurves,
    RmaCurve,
    Tranche,
    ValueBook,
    ValueEstimate,
    concave_tranches,
    merge_uncontested,
)
from headroom.controllers.types import CapacityLevel, LeverShare
from headroom.defences.capacity import CapacityBook

__all__ = [
    "Allocation",
    "Allocator",
    "FallbackReason",
    "Pool",
    "PoolUse",
    "QualityCurves",
    "RmaCurve",
    "fill_levels",
    "pools_from_capacity",
    "solve_lp",
    "stratum_levels",
]

_EPS = 1e-9
# (lever, resource, hardware, remote): a lever's part of one kind of pool, across calls
PoolUse = tuple[str, str, str, bool]
# an LP's solution below this many resource units (cores, devices) is what the tableau's
# rounding leaves, not work: a lever is not booked a 1e-17 share of a pool (:meth:`Allocator._book`)
_ROUNDING = 1e-12
# tableaux of at most this many entries are updated whole at each pivot (:func:`solve_lp`)
_WHOLE_TABLEAU = 1000


def _proven(est: ValueEstimate) -> bool:
    """A lever (or tranche) is proven once its LCB is above 0."""
    return est.known and est.lcb > 0.0


def _worth_of(est: ValueEstimate) -> float:
    """What the LP weighs a unit of a lever's work at: its mean once it is proven, else its LCB
    (a lever not proven gets no variable; module docstring)."""
    return est.mean if _proven(est) else est.lcb


class FallbackReason(Enum):
    NO_VALUE = "no_value"
    STALE_VALUE = "stale_value"
    UNCERTAIN_VALUE = "uncertain_value"
    BELOW_SAFETY_MARGIN = "below_safety_margin"


@dataclass(frozen=True, slots=True)
class Pool:
    """One opportunistic pool of a region, after the safety margin."""

    resource: str
    hardware: str
    units: float  # usable: announced × (1 - safety_margin)
    announced: float
    remote: bool
    lifetime_s: float  # remaining expected lifetime (inf when unknown)


# a lever's tranches that name their stratum are merged into at most this many bands where no
# other lever competes for their stratum's requests (:meth:`Allocator._tranches`)
BANDS = 8


def held_units(budget: float, safety_margin: float) -> float:
    """The units a lever's replicas hold for a ``budget`` the allocator counted after the
    ``safety_margin``: ``budget ÷ (1 − safety_margin)``, i.e. the announced units behind it. The
    margin is slack inside the quota (the replicas run it at most ``1 − margin`` busy), taken
    once: the LP values a held unit at most one used unit, the control plane sizes SBM's coverage
    at the devices the strong replicas hold, and the simulator's replicas hold these units.
    ``safety_margin`` is below 1 (the configuration's rule)."""
    return budget / (1.0 - safety_margin)


def pools_from_capacity(
    capacity: Iterable[CapacityLevel], now: float, safety_margin: float
) -> list[Pool]:
    """The usable opportunistic pools at ``now``: the levels in force of a
    :class:`~headroom.defences.capacity.CapacityBook` of ``capacity`` (newest per (resource,
    hardware, remote); a lapsed level is 0 units), with their remaining lifetime."""
    pools = []
    for c in CapacityBook(capacity).levels(now):
        if c.pool != "opportunistic":
            continue
        life = math.inf if c.expires_in_s is None else c.expires_in_s
        pools.append(
            Pool(c.resource, c.hardware, c.units * (1.0 - safety_margin), c.units, c.remote, life)
        )
    return pools


def solve_lp(
    c: Sequence[float], a: np.ndarray, b: Sequence[float] | np.ndarray, max_iter: int = 500
) -> tuple[np.ndarray, float]:
    """Maximise ``c·x`` subject to ``a x ≤ b``, ``x ≥ 0``, for ``a ≥ 0``, ``b ≥ 0`` and every
    variable bounded by some row. Returns ``(x, objective)``. Dense tableau simplex; Dantzig's
    rule, switching to Bland's rule (which cannot cycle) after ``m + n`` pivots."""
    m, n = a.shape
    if n == 0 or m == 0:
        return np.zeros(n), 0.0
    cost = np.asarray(c, dtype=float)
    # the optimum does not depend on the objective's scale, but the pivot tolerance does: a
    # value of 1e-7 per unit (an LCB per candidate times seconds per candidate) must not
    # look like zero, so solve with the largest coefficient scaled to 1
    c_scale = float(np.max(np.abs(cost))) if n else 0.0
    if c_scale <= 0.0:
        return np.zeros(n), 0.0
    scaled = cost / c_scale
    if _held_at_zero(scaled, a, np.asarray(b, dtype=float)):
        return np.zeros(n), 0.0
    t = np.zeros((m + 1, n + m + 1))
    t[:m, :n] = a
    t[np.arange(m), n + np.arange(m)] = 1.0
    t[:m, -1] = b
    t[m, :n] = -scaled
    basis = np.arange(n, n + m)
    bland_after = m + n
    rhs = t[:m, -1]
    row_obj = t[m, :-1]
    # a small tableau is cheapest updated whole; a large one only where the pivot row and
    # column are non-zero: everywhere else the update subtracts 0, and the tableau of these LPs
    # stays mostly zeros. Either way every entry gets the same arithmetic, so the pivots and
    # the optimum are the same
    whole = (m + 1) * (n + m + 1) <= _WHOLE_TABLEAU
    for it in range(max_iter):
        if it < bland_after:
            col = int(row_obj.argmin())
            if row_obj[col] >= -_EPS:
                break
        else:
            neg = (row_obj < -_EPS).nonzero()[0]
            if neg.size == 0:
                break
            col = int(neg[0])
        column = t[:m, col]
        positive = (column > _EPS).nonzero()[0]
        if positive.size == 0:  # unbounded: cannot happen with every variable in a row
            raise ValueError("unbounded linear program")
        ratios = rhs[positive] / column[positive]
        best = ratios.min()
        ties = positive[ratios <= best + _EPS * max(1.0, abs(best))]
        row = int(ties[0]) if ties.size == 1 else int(ties[basis[ties].argmin()])
        t[row] /= t[row, col]
        pivot = t[row]
        factors = t[:, col].copy()
        factors[row] = 0.0
        if whole:
            t -= np.multiply.outer(factors, pivot)
        else:
            rows = factors.nonzero()[0]
            cols = pivot.nonzero()[0]
            t[rows[:, None], cols] -= np.multiply.outer(factors[rows], pivot[cols])
        basis[row] = col
    else:
        raise RuntimeError("simplex did not converge")
    x = np.zeros(n + m)
    x[basis] = np.maximum(t[:m, -1], 0.0)
    return x[:n], float(t[m, -1]) * c_scale


def _held_at_zero(cost: np.ndarray, a: np.ndarray, b: np.ndarray) -> bool:
    """Whether the origin is the optimum :func:`solve_lp` reaches without a pivot that moves:
    every variable it would enter (scaled cost above the tolerance) uses a row with no room
    (``b = 0``), and no row the ratio test would call a tie with it (room below the
    tolerance but not 0) could take it off 0. Most of the allocator's top-up LPs are such
    (the lever's demand met, or nothing left where it may run): they need no tableau."""
    live = cost > _EPS
    if not live.any():
        return True
    uses = a[:, live] > _EPS
    full = b == 0.0
    if not (uses & full[:, None]).any(axis=0).all():
        return False
    tiny = (b > 0.0) & (b <= _EPS * a[:, live].max(axis=1, initial=0.0))
    return not (uses & tiny[:, None]).any()


def _spent(
    name: str,
    vs: Sequence[_Var],
    demand: Mapping[str, float],
    acc: _Acc,
    limits: Sequence[float],
    room: Sequence[float],
) -> bool:
    """Whether an LP with a row per pool (``limits``), a cap row per pool (``room``) and a
    demand row can give lever ``name`` nothing: its demand is met, or each of its variables
    ``vs`` uses a pool with nothing left or no room under its cap. Its optimum is then 0 for
    the lever; the simplex would give it at most what rounding leaves (a tie with a row of
    1e-16 left), so the LP is not built."""
    if demand[name] - acc.rates.get(name, 0.0) <= 0.0:
        return True
    return all(
        any(
            i is not None and (limits[i] <= 0.0 or room[i] <= 0.0) for i in (v.cpu_pool, v.acc_pool)
        )
        for v in vs
    )


def _left(acc: _Acc, pools: Sequence[Pool], share: float, remote_only: bool) -> list[float] | None:
    """``share`` of what is left of every pool (of the remote ones alone, with
    ``remote_only``); None when that is nothing anywhere."""
    limits = [
        c * share if p.remote or not remote_only else 0.0
        for c, p in zip(acc.left, pools, strict=True)
    ]
    return limits if any(x > 0.0 for x in limits) else None


@dataclass(frozen=True, slots=True)
class Allocation:
    """The allocator's decision for one region."""

    shares: tuple[LeverShare, ...]  # one per (lever, accelerator type) with a non-zero slice
    rates: Mapping[str, float]  # units of work per second per lever
    budgets: Mapping[str, tuple[float, float]]  # (cpu cores, accelerator devices) per lever
    estimates: Mapping[str, ValueEstimate]
    fallback: FallbackReason | None
    cap_bound: tuple[str, ...]  # levers whose per-pool cap was binding
    explored: tuple[str, ...]  # levers that got an exploration (or fallback) share
    safe_cpu: float  # usable opportunistic cores after the safety margin
    safe_accelerator: float  # usable opportunistic devices after the safety margin
    pools: tuple[Pool, ...] = ()
    # (lever, index into pools, units of that pool's resource used)
    pool_use: tuple[tuple[str, int, float], ...] = ()
    # (lever, segment, units of work per second) the value-ordered LP gave each tranche
    tranche_rates: tuple[tuple[str, str | None, float], ...] = ()
    # per lever, the segments whose tranche had no estimate of its own (valued at the pooled one)
    unmeasured: Mapping[str, tuple[str, ...]] = field(default_factory=dict)

    def budget(self, lever: str) -> tuple[float, float]:
        return self.budgets.get(lever, (0.0, 0.0))

    def held(self) -> dict[PoolUse, float]:
        """The units of each pool every lever was given, by (lever, resource, hardware,
        remote): what the next call's ``held`` says (:meth:`Allocator.allocate`)."""
        out: dict[PoolUse, float] = {}
        for lever, i, units in self.pool_use:
            if 0 <= i < len(self.pools) and units > 0.0:
                p = self.pools[i]
                key = (lever, p.resource, p.hardware, p.remote)
                out[key] = out.get(key, 0.0) + units
        return out

    @property
    def total_cpu(self) -> float:
        return sum(b[0] for b in self.budgets.values())

    @property
    def total_accelerator(self) -> float:
        return sum(b[1] for b in self.budgets.values())


@dataclass(slots=True)
class _Var:
    lever: str
    cpu_pool: int | None
    acc_pool: int | None
    cpu: float  # resource use per unit of the (scaled) variable
    acc: float
    scale: float  # units of work per unit of the scaled variable (1 / dominant cost)
    tranche: int = -1  # index into the lever's tranches (-1: the lever as a whole)


class _Columns:
    """An LP's variables as arrays, to write its rows with: the lever of each (a code into
    ``names``, in order of first appearance), its pools (-1: none), its use of each and its
    scale, and its tranche (-1: the lever as a whole)."""

    __slots__ = ("acc", "acc_pool", "cpu", "cpu_pool", "lever", "names", "scale", "tranche")

    def __init__(self, vs: Sequence[_Var]) -> None:
        self.names = list(dict.fromkeys(v.lever for v in vs))
        code = {n: k for k, n in enumerate(self.names)}
        self.lever = np.array([code[v.lever] for v in vs])
        self.cpu_pool = np.array([-1 if v.cpu_pool is None else v.cpu_pool for v in vs])
        self.acc_pool = np.array([-1 if v.acc_pool is None else v.acc_pool for v in vs])
        self.cpu = np.array([v.cpu for v in vs], dtype=float)
        self.acc = np.array([v.acc for v in vs], dtype=float)
        self.scale = np.array([v.scale for v in vs], dtype=float)
        self.tranche = np.array([v.tranche for v in vs])

    def pool_rows(self, npool: int) -> np.ndarray:
        """Every pool's LP row: what each variable uses of pool ``i``, row ``i``."""
        ids = np.arange(npool)[:, None]
        return np.where(self.cpu_pool == ids, self.cpu, 0.0) + np.where(
            self.acc_pool == ids, self.acc, 0.0
        )


class _Rows:
    """An LP's constraint rows and their limits, appended in blocks."""

    __slots__ = ("blocks", "rhs")

    def __init__(self) -> None:
        self.blocks: list[np.ndarray] = []
        self.rhs: list[float] = []

    @property
    def count(self) -> int:
        """Rows so far (one limit each)."""
        return len(self.rhs)

    def add(self, block: np.ndarray, rhs: Sequence[float]) -> None:
        if block.shape[0]:
            self.blocks.append(block)
            self.rhs.extend(rhs)

    def add_sparse(
        self, coefs: Sequence[Mapping[int, float]], rhs: Sequence[float], n: int
    ) -> None:
        """Rows given as {column: coefficient}, of ``n`` columns."""
        block = np.zeros((len(coefs), n))
        for r, coef in enumerate(coefs):
            block[r, list(coef)] = list(coef.values())
        self.add(block, rhs)

    def matrix(self) -> tuple[np.ndarray, np.ndarray]:
        return np.concatenate(self.blocks), np.array(self.rhs)


@dataclass(frozen=True, slots=True)
class _Slot:
    """A pool as one run of the LPs sees it: all of an announced pool, or the part of it
    reserved for one lever (``owner``) that must hold at least that much there."""

    origin: int  # index into the region's pools
    units: float
    owner: str | None
    devices: float  # the units a lever's usable share is evaluated at


@dataclass(slots=True)
class _Acc:
    """What the LPs of one call have allocated so far."""

    left: list[float]  # capacity left per slot
    origin: list[int] = field(default_factory=list)  # slot -> pool
    budgets: dict[str, list[float]] = field(default_factory=dict)
    rates: dict[str, float] = field(default_factory=dict)
    per_hw: dict[tuple[str, str | None], list[float]] = field(default_factory=dict)
    pool_use: dict[tuple[str, int], float] = field(default_factory=dict)
    # (lever, segment) -> units of work per second the tranches of the optimising LP got
    tranche_rates: dict[tuple[str, str | None], float] = field(default_factory=dict)


@dataclass(slots=True)
class _Run:
    """One split of the region (the whole-device rule compares a few)."""

    acc: _Acc
    fallback: FallbackReason | None
    cap_bound: list[str]
    explored: list[str]


def _pool_units(slots: Sequence[_Slot]) -> list[float]:
    """Per slot, the units of its whole pool (its own and every pinned slot of the pool): a
    lever's cap is a share of the pool, whichever levers are pinned to parts of it."""
    whole: dict[int, float] = {}
    for sl in slots:
        whole[sl.origin] = whole.get(sl.origin, 0.0) + sl.units
    return [whole[sl.origin] for sl in slots]


def _pinned_beside(slots: Sequence[_Slot]) -> dict[tuple[str, int], float]:
    """(lever, shared slot) -> the units the lever holds pinned in the same pool: a lever's cap
    of a pool counts what it is pinned to there."""
    out: dict[tuple[str, int], float] = {}
    for sl in slots:
        if sl.owner is None:
            continue
        for k, other in enumerate(slots):
            if other.owner is None and other.origin == sl.origin:
                out[(sl.owner, k)] = out.get((sl.owner, k), 0.0) + sl.units
    return out


class Allocator:
    """Stateless: every call solves the region's split afresh from what it is given."""

    __slots__ = ("levers", "settings", "value")

    def __init__(
        self, settings: AllocatorSettings, value: ValueSettings, levers: LeverRegistry
    ) -> None:
        self.settings = settings
        self.value = value
        self.levers = levers

    def eligible(self, lever: Lever, pool: Pool) -> bool:
        """May ``lever`` run on ``pool`` (hardware, remote and durability rules)?"""
        if pool.remote and lever.use is not CapacityUse.ASYNC:
            return False
        if pool.lifetime_s < lever.min_durability_s:
            return False
        return pool.resource != "accelerator" or lever.can_use_accelerator(pool.hardware)

    def _variables(self, lever: Lever, pools: Sequence[Pool], slots: Sequence[_Slot]) -> list[_Var]:
        cost = lever.unit_cost()
        need_cpu = cost.cpu_s > 0.0
        need_acc = cost.accelerator_s > 0.0
        if not (need_cpu or need_acc):
            return []  # free work needs no capacity: nothing to allocate
        dominant = max(cost.cpu_s, cost.accelerator_s)
        # the devices the lever is pinned to, per pool
        pinned_devices = {sl.origin: sl.devices for sl in slots if sl.owner == lever.name}

        def open_to(k: int, resource: str) -> float:
            """The share of slot ``k`` the lever can use (0: it may not use the slot)."""
            slot = slots[k]
            pool = pools[slot.origin]
            if (
                pool.resource != resource
                or slot.units < self.settings.min_pool_units
                or slot.owner not in (None, lever.name)
                or not self.eligible(lever, pool)
            ):
                return 0.0
            u = lever.usable_share(resource, slot.devices)
            held = pinned_devices.get(slot.origin, 0.0) if slot.owner is None else 0.0
            if 0.0 < held < slot.devices:
                # the rest of a pool where the lever holds its pinned devices: each unit it
                # adds there lets it use more of those too (a queue of more servers runs
                # busier at the same wait), so its units there are worth the chord of its
                # usable units from the pinned devices to the whole pool, not their average
                u = (u * slot.devices - lever.usable_share(resource, held) * held) / (
                    slot.devices - held
                )
            if not (u > 0.0 and math.isfinite(u)):
                return 0.0
            # ``u`` is a share of the *announced* units, the slot's units are what is left of
            # them after the safety margin: the margin is taken once, as a ceiling (a held
            # unit turns into at most one used unit), not a second time on top of ``u``
            return min(held_units(u, self.settings.safety_margin), 1.0)

        cpu_pools: list[tuple[int | None, float]] = [(None, 1.0)]
        acc_pools: list[tuple[int | None, float]] = [(None, 1.0)]
        if need_cpu:
            cpu_pools = [(k, u) for k in range(len(slots)) if (u := open_to(k, "cpu")) > 0.0]
        if need_acc:
            acc_pools = [
                (k, u) for k in range(len(slots)) if (u := open_to(k, "accelerator")) > 0.0
            ]
        # a variable is one resource unit of the dominant resource *used*; a pool where only a
        # share u of a held unit can be used is charged 1/u held units per used unit. One unit
        # of work passes through all the lever's stages, so the stage admitting the smallest
        # share sets the rate for the pair and every resource is held in its cost ratio to it:
        # SBM's CPU is held per held device (not per used one), else its CPU stage would be
        # sized to run 100 % busy behind a device run at its admissible utilisation
        return [
            _Var(
                lever.name,
                ci,
                ai,
                cost.cpu_s / dominant / min(cu, au),
                cost.accelerator_s / dominant / min(cu, au),
                1.0 / dominant,
            )
            for ci, cu in cpu_pools
            for ai, au in acc_pools
        ]

    def need(self, lever: Lever, pool: Pool) -> float:
        """The fewest usable units of ``pool`` that ``lever`` can hold (0: any share): its
        :meth:`Lever.min_hold` in announced units, at most the whole pool (a slice), after the
        safety margin like the pool's own units."""
        hold = lever.min_hold(pool.resource)
        if not (hold > 0.0 and pool.announced > 0.0):
            return 0.0
        return min(hold, pool.announced) * pool.units / pool.announced

    def allocate(
        self,
        capacity: Iterable[CapacityLevel],
        now: float,
        ctx: LeverContext,
        book: ValueBook,
        value_age_s: float | None,
        held: Mapping[PoolUse, float] | None = None,
    ) -> Allocation:
        """Split the region's opportunistic ``capacity`` (see the module docstring). ``held``:
        what the last split gave each lever (:meth:`Allocation.held`), for the levers whose new
        devices must first load (*Loading*); None prices every unit as loaded."""
        s = self.settings
        pools = pools_from_capacity(capacity, now, s.safety_margin)
        resident = self._resident(pools, held)
        usable = [p.units >= s.min_pool_units for p in pools]
        safe_cpu = sum(
            p.units for p, u in zip(pools, usable, strict=True) if u and p.resource == "cpu"
        )
        safe_acc = sum(
            p.units for p, u in zip(pools, usable, strict=True) if u and p.resource == "accelerator"
        )
        estimates = {
            lever.name: lever.estimate(book, ctx, self.value.lcb_z, self.value.min_samples)
            for lever in self.levers
        }
        tranches = self._tranches(book, ctx)
        demand: dict[str, float] = {}
        for lever in self.levers:
            d = lever.demand(ctx)
            if d > 0.0 and math.isfinite(d):
                demand[lever.name] = d

        def done(run: _Run | None) -> Allocation:
            shares = []
            acc = run.acc if run is not None else _Acc(left=[])
            for (name, hw), (cpu, a) in sorted(
                acc.per_hw.items(), key=lambda kv: (kv[0][0], kv[0][1] or "")
            ):
                if cpu <= 0.0 and a <= 0.0:
                    continue
                est = estimates[name]
                cost = self.levers[name].unit_cost()
                dominant = max(cost.cpu_s, cost.accelerator_s)
                lcb = est.lcb / dominant if est.known else 0.0
                shares.append(LeverShare(name, cpu, a, hw, lcb))
            return Allocation(
                shares=tuple(shares),
                rates=dict(acc.rates),
                budgets={k: (v[0], v[1]) for k, v in acc.budgets.items()},
                estimates=estimates,
                fallback=run.fallback if run is not None else None,
                cap_bound=tuple(sorted(set(run.cap_bound))) if run is not None else (),
                explored=tuple(sorted(set(run.explored))) if run is not None else (),
                safe_cpu=safe_cpu,
                safe_accelerator=safe_acc,
                pools=tuple(pools),
                pool_use=tuple((k[0], k[1], v) for k, v in sorted(acc.pool_use.items())),
                tranche_rates=tuple(
                    (k[0], k[1], v)
                    for k, v in sorted(acc.tranche_rates.items(), key=lambda kv: str(kv[0]))
                ),
                unmeasured={
                    n: tuple(t.segment for t in ts if t.segment is not None and not t.own)
                    for n, ts in tranches.items()
                },
            )

        if not any(usable):
            announced = any(p.announced > 0.0 for p in pools)
            below = FallbackReason.BELOW_SAFETY_MARGIN if announced else None
            return done(_Run(_Acc(left=[]), below, [], []))

        # The whole-device rule, decided here rather than by the replicas' placement: a lever
        # holding a share of a pool below what it can hold (SBM: one device) is either pinned
        # to that much or dropped from the pool, whichever is worth more; one (lever, pool) at
        # a time, each decision a constraint of the next run. A proven lever holding at least
        # that much, with no lever being measured, is pinned to it (it keeps the pool either
        # way; the pin prices its first devices apart from the rest, :meth:`_short_hold`).
        pinned: list[tuple[str, int]] = []
        dropped: set[tuple[str, int]] = set()
        priced: set[tuple[str, int]] = set()  # pinned because they held their need

        def split(
            pins: Sequence[tuple[str, int]],
            drops: set[tuple[str, int]],
            prices: Collection[tuple[str, int]],
        ) -> _Run:
            args = (pools, usable, demand, estimates, value_age_s, pins, drops, tranches, prices)
            return self._run(*args, resident=resident)

        run = split(pinned, dropped, priced)
        for _ in range(len(self.levers) * len(pools)):
            short = self._short_hold(run, pools, pinned, dropped)
            if short is None:
                break
            key, holds = short
            pin = split([*pinned, key], dropped, priced | {key} if holds else priced)
            if holds:
                # it keeps the pool either way, and no lever is measured (so no explorer to
                # keep): the pin only reprices it
                pinned.append(key)
                priced.add(key)
                run = pin
                continue
            keeps = self._keeps_explorers(run, pin, key, pools, estimates)
            drop = split(pinned, dropped | {key}, priced)
            exploring = not _proven(estimates[key[0]])
            if keeps and (
                exploring
                or (
                    run.fallback is None
                    and self._pin_worth_more(pin, drop, key, estimates, tranches)
                )
            ):
                # a lever being explored (unknown, or not proven either way) must be able to
                # do work to be measured — in a fallback too, else it could never end it; a
                # proven one is pinned only outside a fallback and when the whole device is
                # worth more to it than what the others make of it (at the LP's weights), the
                # levers it would shut out of the pool included
                pinned.append(key)
                run = pin
            else:
                dropped.add(key)
                run = drop
        return done(run)

    def _short_hold(
        self,
        run: _Run,
        pools: Sequence[Pool],
        pinned: Sequence[tuple[str, int]],
        dropped: set[tuple[str, int]],
    ) -> tuple[tuple[str, int], bool] | None:
        """The first (lever, pool) holding more than nothing of a pool where it needs whole
        devices, not yet pinned there or dropped from it, and whether it holds its need: below
        it the lever cannot hold that share at all. At or above it, outside a fallback and with
        no lever being measured (they get the capacity the proven levers leave idle, and a pin
        leaves none on its devices), the pin prices the lever's first devices apart from the
        rest of the pool, which it then holds at the chord of its usable units
        (:meth:`_variables`): a queue of more devices runs busier at the same wait, so the
        first device is worth less to it than the average and each further one more."""
        for (name, i), units in sorted(run.acc.pool_use.items()):
            if (name, i) in dropped or (name, i) in pinned or units <= _EPS:
                continue
            need = self.need(self.levers[name], pools[i])
            if units < need * (1.0 - 1e-6):
                return (name, i), False
            if need > 0.0 and run.fallback is None and not run.explored:
                return (name, i), True
        return None

    def _tranches(self, book: ValueBook, ctx: LeverContext) -> dict[str, list[Tranche]]:
        """Every lever's tranches; those that name their stratum (RMA's bands) merged into at
        most :data:`BANDS` bands where no other lever's valued tranche serves their stratum
        (:func:`headroom.controllers.levers.merge_uncontested`): only the contested ones need a
        variable and a request row of their own."""
        z, n = self.value.lcb_z, self.value.min_samples
        out = {lever.name: lever.tranches(book, ctx, z, n) for lever in self.levers}
        contested = {
            str(t.segment)
            for lever in self.levers
            if lever.requests_per_unit() is not None
            for t in out[lever.name]
            if t.segment is not None
            and not t.strata
            and t.estimate.known
            and t.estimate.lcb > 0.0
            and t.demand > 0.0
        }
        for name, ts in out.items():
            if any(t.strata for t in ts):
                out[name] = merge_uncontested(ts, contested, BANDS)
        return out

    def _keeps_explorers(
        self,
        before: _Run,
        after: _Run,
        key: tuple[str, int],
        pools: Sequence[Pool],
        estimates: Mapping[str, ValueEstimate],
    ) -> bool:
        """Pinning ``key`` leaves every unknown lever that is measured on the pool — it has a
        share there and on no other pool of that resource — a positive share of it."""
        lever, i = key
        resource = pools[i].resource

        b = before.acc.pool_use  # keyed by (lever, pool)
        a = after.acc.pool_use
        for (name, j), units in b.items():
            if name == lever or j != i or units <= _EPS or estimates[name].known:
                continue
            elsewhere = any(
                n == name and jj != i and u > _EPS and pools[jj].resource == resource
                for (n, jj), u in b.items()
            )
            if not elsewhere and a.get((name, i), 0.0) <= _EPS:
                return False
        return True

    def _pin_worth_more(
        self,
        pin: _Run,
        drop: _Run,
        key: tuple[str, int],
        estimates: Mapping[str, ValueEstimate],
        tranches: Mapping[str, Sequence[Tranche]],
    ) -> bool:
        """Whether pinning the proven lever ``key`` to its whole device is worth more than
        dropping it from the pool, at the LP's weights — and more than what the levers it would
        shut out of the pool, measured but not proven either way (``lcb ≤ 0``), would make of
        the pool without it at their estimated means. The device goes whole to one of them, so
        the choice is made on what each is expected to be worth; a shut-out lever is counted
        for the work it does without the pin (its demand counted: a lever that could use only
        a sliver of the device does not take it). Without the second test a lever not yet
        proven when another is pinned to the only pool it can use gets no samples again, and
        its estimate only ages (docs/controllers.md, *Guardrails*)."""
        lever, i = key
        shut_out = 0.0
        for (name, j), units in drop.acc.pool_use.items():
            est = estimates[name]
            if (
                name == lever
                or j != i
                or units <= _EPS
                or not (est.known and est.lcb <= 0.0 < est.mean)
                or pin.acc.pool_use.get((name, i), 0.0) > _EPS
            ):
                continue
            more = drop.acc.rates.get(name, 0.0) - pin.acc.rates.get(name, 0.0)
            shut_out += max(more, 0.0) * est.mean
        w_pin = self._worth(pin, estimates, tranches)
        w_drop = self._worth(drop, estimates, tranches)
        return w_pin > w_drop and w_pin >= w_drop + shut_out

    @staticmethod
    def _worth(
        run: _Run,
        estimates: Mapping[str, ValueEstimate],
        tranches: Mapping[str, Sequence[Tranche]],
    ) -> float:
        """Value per second of a run's work at the LP's weights (unknown or unproven levers
        count 0): each proven tranche's work at its own mean, the rest of a lever's work at the
        lever's."""
        total = 0.0
        in_tranches: dict[str, float] = {}
        for (name, seg), rate in run.acc.tranche_rates.items():
            for t in tranches.get(name, ()):
                if t.segment == seg and _proven(t.estimate):
                    total += t.estimate.mean * rate
            in_tranches[name] = in_tranches.get(name, 0.0) + rate
        for name, rate in run.acc.rates.items():
            rate = max(rate - in_tranches.get(name, 0.0), 0.0)
            est = estimates[name]
            if _proven(est):
                total += est.mean * rate
        return total

    def _run(
        self,
        pools: Sequence[Pool],
        usable: Sequence[bool],
        demand: Mapping[str, float],
        estimates: Mapping[str, ValueEstimate],
        value_age_s: float | None,
        pinned: Sequence[tuple[str, int]],
        dropped: set[tuple[str, int]],
        tranches: Mapping[str, Sequence[Tranche]] | None = None,
        priced: Collection[tuple[str, int]] = (),
        *,
        resident: Mapping[tuple[str, int], float] | None = None,
    ) -> _Run:
        """One split: fallback or exploration, then the LP, on the pools as ``pinned`` and
        ``dropped`` reshape them (a pinned lever's need is a slot only it may use). The pins
        of ``priced`` (made because the lever held its need, :meth:`_short_hold`) are filled
        by the value-ordered LP, the others first, by the lever's own."""
        s = self.settings
        slots = self._slots(pools, usable, pinned)
        dropped_slots = {
            (name, k) for k, sl in enumerate(slots) for name, i in dropped if sl.origin == i
        }
        variables: dict[str, list[_Var]] = {}
        for lever in self.levers:
            if lever.name not in demand:
                continue
            vs = [
                v
                for v in self._variables(lever, pools, slots)
                if (v.lever, v.cpu_pool) not in dropped_slots
                and (v.lever, v.acc_pool) not in dropped_slots
            ]
            if vs:
                variables[lever.name] = vs
        slot_pools = [pools[sl.origin] for sl in slots]
        acc = _Acc(left=[sl.units for sl in slots], origin=[sl.origin for sl in slots])
        run = _Run(acc, None, [], [])
        if not variables:
            return run

        proven = [n for n in variables if _proven(estimates[n])]
        hopeful = [n for n in variables if not estimates[n].known or estimates[n].ucb > 0.0]
        fallback = self._fallback(variables, estimates, value_age_s, proven, hopeful)
        # pinned slots first: their lever gets what it can use there and holds the rest — but
        # the slot of a proven lever pinned because it held its need goes into the
        # value-ordered LP with the rest of its pools (only it can use the slot), so its best
        # strata get the slot's work and the router is told which strata that work serves; it
        # holds what the LP leaves after it
        late = {key for key in priced if key[0] in proven} if fallback is None else set()
        self._fill_pinned(pools, slots, variables, demand, acc, skip=late)
        if fallback is not None:
            measured = list(variables) if fallback is FallbackReason.NO_VALUE else hopeful
            self._flat(measured, variables, demand, slot_pools, acc, s.fallback_share)
            run.fallback = fallback
        else:
            measured = [n for n in hopeful if n not in proven]
            if measured and s.explore_share > 0.0:
                self._flat(measured, variables, demand, slot_pools, acc, s.explore_share)
            beside = _pinned_beside(slots)
            run.cap_bound = self._optimise(
                proven,
                variables,
                demand,
                estimates,
                slot_pools,
                _pool_units(slots),
                acc,
                tranches or {},
                beside,
                self._loading(pools, slots, resident, beside),
            )
            self._fill_pinned(pools, slots, variables, demand, acc, only=late)
        # remote capacity the proven levers left is worth nothing to them and the live path
        # cannot touch it: the levers being measured that may run there get all of it; outside
        # a fallback, so does the live capacity the LP left idle (``explore_idle``); what they
        # leave of it goes to the proven levers, so one proven with an LCB near 0 keeps what it
        # held unproven
        idle_live = fallback is None and s.explore_idle
        self._flat(measured, variables, demand, slot_pools, acc, 1.0, remote_only=not idle_live)
        if fallback is None:
            self._top_up(proven, variables, demand, slot_pools, slots, acc, not idle_live)
        run.explored = measured
        return run

    def _resident(
        self, pools: Sequence[Pool], held: Mapping[PoolUse, float] | None
    ) -> dict[tuple[str, int], float] | None:
        """(lever, pool) -> the units of the pool the lever held after the last split, for the
        levers whose new devices must first load (accelerator pools only); None: not known."""
        if held is None:
            return None
        out: dict[tuple[str, int], float] = {}
        for lever in self.levers:
            if lever.load_s <= 0.0:
                continue
            for i, p in enumerate(pools):
                if p.resource == "accelerator":
                    units = held.get((lever.name, p.resource, p.hardware, p.remote), 0.0)
                    out[(lever.name, i)] = units if math.isfinite(units) and units > 0 else 0.0
        return out

    def _loading(
        self,
        pools: Sequence[Pool],
        slots: Sequence[_Slot],
        resident: Mapping[tuple[str, int], float] | None,
        beside: Mapping[tuple[str, int], float],
    ) -> dict[tuple[str, int], tuple[float, float]]:
        """(lever, shared slot) -> (the units of it the lever holds loaded, what a unit
        beyond them is worth against one of those): ``1 − load_s / lifetime`` of the pool
        (*Loading*). Only where that is below 1 and the slot has units beyond the held ones.
        ``beside``: :func:`_pinned_beside` of ``slots`` (a lever's pinned devices of the pool
        are the first it holds)."""
        out: dict[tuple[str, int], tuple[float, float]] = {}
        if resident is None:
            return out
        for lever in self.levers:
            if lever.load_s <= 0.0:
                continue
            for k, sl in enumerate(slots):
                got = resident.get((lever.name, sl.origin))
                life = pools[sl.origin].lifetime_s
                if sl.owner is not None or got is None or not math.isfinite(life) or life <= 0.0:
                    continue
                here = max(got - beside.get((lever.name, k), 0.0), 0.0)
                if here < sl.units:
                    out[(lever.name, k)] = (here, max(1.0 - lever.load_s / life, 0.0))
        return out

    def _slots(
        self,
        pools: Sequence[Pool],
        usable: Sequence[bool],
        pinned: Sequence[tuple[str, int]],
    ) -> list[_Slot]:
        """Every pool as the LPs see it: a slot per lever pinned there (its need, as far as the
        pool reaches), then the rest (nothing of a pool that is not usable)."""
        slots: list[_Slot] = []
        for i, p in enumerate(pools):
            rest = p.units if usable[i] else 0.0
            for name, j in pinned:
                if j != i:
                    continue
                lever = self.levers[name]
                need = min(self.need(lever, p), rest)
                devices = min(lever.min_hold(p.resource), p.announced)
                slots.append(_Slot(i, need, name, devices))
                rest -= need
            slots.append(_Slot(i, max(rest, 0.0), None, p.announced))
        return slots

    def _fill_pinned(
        self,
        pools: Sequence[Pool],
        slots: Sequence[_Slot],
        variables: Mapping[str, list[_Var]],
        demand: Mapping[str, float],
        acc: _Acc,
        *,
        skip: Collection[tuple[str, int]] = (),
        only: Collection[tuple[str, int]] | None = None,
    ) -> None:
        """Each pinned slot to its lever (but the (lever, pool) pins of ``skip``; those of
        ``only`` alone when given): what the lever can use there by an LP of its own, and the
        rest of the slot held for it all the same."""
        slot_pools = [pools[sl.origin] for sl in slots]
        for k, sl in enumerate(slots):
            if sl.owner is None or sl.owner not in variables:
                continue
            if (sl.owner, sl.origin) in skip or (
                only is not None and (sl.owner, sl.origin) not in only
            ):
                continue
            mine = [v for v in variables[sl.owner] if k in (v.cpu_pool, v.acc_pool)]
            if mine:
                self._solve(
                    [sl.owner],
                    {sl.owner: mine},
                    demand,
                    {sl.owner: 1.0},
                    slot_pools,
                    list(acc.left),
                    acc,
                    caps={sl.owner: 1.0},
                    cap_units=[x.units for x in slots],
                    contested=[False] * len(slots),
                )
            held = acc.left[k]
            if held > 0.0:
                acc.left[k] = 0.0
                key = (sl.owner, sl.origin)
                acc.pool_use[key] = acc.pool_use.get(key, 0.0) + held
                col = 0 if pools[sl.origin].resource == "cpu" else 1
                acc.budgets.setdefault(sl.owner, [0.0, 0.0])[col] += held
                hw = None if col == 0 else pools[sl.origin].hardware
                acc.per_hw.setdefault((sl.owner, hw), [0.0, 0.0])[col] += held

    def _fallback(
        self,
        variables: Mapping[str, list[_Var]],
        estimates: Mapping[str, ValueEstimate],
        value_age_s: float | None,
        proven: Sequence[str],
        hopeful: Sequence[str],
    ) -> FallbackReason | None:
        """Which fallback, if any: no value estimate at all, a stale one, or none proven."""
        any_known = any(estimates[n].known for n in variables)
        if value_age_s is None or not any_known:
            return FallbackReason.NO_VALUE
        if not math.isfinite(value_age_s) or value_age_s > self.settings.value_stale_s:
            return FallbackReason.STALE_VALUE
        if not proven and hopeful:
            return FallbackReason.UNCERTAIN_VALUE
        return None

    # -- the two LPs -----------------------------------------------------------------------

    def _flat(
        self,
        names: Sequence[str],
        variables: Mapping[str, list[_Var]],
        demand: Mapping[str, float],
        pools: Sequence[Pool],
        acc: _Acc,
        share: float,
        *,
        remote_only: bool = False,
    ) -> None:
        """Equal parts of ``share`` of every pool (of every ``remote`` one, with
        ``remote_only``) to ``names``: the LP with a flat value per resource unit and each of
        the k levers on a pool capped at 1/k of its share."""
        if share <= 0.0 or not names:
            return
        limits = _left(acc, pools, share, remote_only)
        if limits is None:
            return  # nothing to hand out (a region without remote pools): no LP to solve
        users = [0] * len(pools)
        for n in names:
            touched: set[int] = set()
            for v in variables[n]:
                touched.update(i for i in (v.cpu_pool, v.acc_pool) if i is not None)
            for i in touched:
                users[i] += 1
        cap_units = [limits[i] / users[i] if users[i] else 0.0 for i in range(len(pools))]
        self._solve_flat(names, variables, demand, pools, limits, acc, cap_units)

    def _solve_flat(
        self,
        names: Sequence[str],
        variables: Mapping[str, list[_Var]],
        demand: Mapping[str, float],
        pools: Sequence[Pool],
        limits: Sequence[float],
        acc: _Acc,
        cap_units: Sequence[float],
    ) -> None:
        """The LP of :meth:`_flat` and :meth:`_top_up`: a flat value per resource unit for
        ``names``, within ``limits`` of every pool, each lever within ``cap_units`` of each.
        Not built when it can give none of them anything (:meth:`_spent`)."""
        if all(_spent(n, variables[n], demand, acc, limits, cap_units) for n in names):
            return
        self._solve(
            names,
            variables,
            demand,
            dict.fromkeys(names, 1.0),
            pools,
            limits,
            acc,
            caps=dict.fromkeys(names, 1.0),
            cap_units=cap_units,
            contested=None,
        )

    def _top_up(
        self,
        names: Sequence[str],
        variables: Mapping[str, list[_Var]],
        demand: Mapping[str, float],
        pools: Sequence[Pool],
        slots: Sequence[_Slot],
        acc: _Acc,
        remote_only: bool,
    ) -> None:
        """What is left of the pools (of the remote ones, with ``remote_only``) to the proven
        ``names`` in turn, each up to its demand and, on a contested pool, its cap less what
        it holds there already."""
        contested = self._contested(variables, len(pools))
        wholes = _pool_units(slots)
        for n in names:
            limits = _left(acc, pools, 1.0, remote_only)
            if limits is None:
                return
            cap = self.settings.cap(n)
            room = [
                max(cap * whole - acc.pool_use.get((n, sl.origin), 0.0), 0.0)
                if contested[k] and cap < 1.0
                else limits[k]
                for k, (sl, whole) in enumerate(zip(slots, wholes, strict=True))
            ]
            self._solve_flat([n], {n: variables[n]}, demand, pools, limits, acc, room)

    @staticmethod
    def _contested(variables: Mapping[str, list[_Var]], npool: int) -> list[bool]:
        """The pools at least two levers' variables use: where a lever's cap binds."""
        return [
            sum(1 for vs in variables.values() if any(i in (v.cpu_pool, v.acc_pool) for v in vs))
            >= 2
            for i in range(npool)
        ]

    def _optimise(
        self,
        names: Sequence[str],
        variables: Mapping[str, list[_Var]],
        demand: Mapping[str, float],
        estimates: Mapping[str, ValueEstimate],
        pools: Sequence[Pool],
        units: Sequence[float],
        acc: _Acc,
        tranches: Mapping[str, Sequence[Tranche]],
        pinned_units: Mapping[tuple[str, int], float] | None = None,
        loading: Mapping[tuple[str, int], tuple[float, float]] | None = None,
    ) -> list[str]:
        if not names:
            return []
        values = {}
        for n in names:
            cost = self.levers[n].unit_cost()
            # a scaled unit is one resource unit of the dominant resource, i.e. 1/dominant units
            # of work: value per scaled unit = value per unit of work / dominant cost, at the
            # mean once proven (the module docstring), else at the LCB (≤ 0: no variable)
            values[n] = _worth_of(estimates[n]) / max(cost.cpu_s, cost.accelerator_s)
        # a cap binds only on pools another lever that could run here could also use
        contested = self._contested(variables, len(pools))
        return self._solve(
            names,
            variables,
            demand,
            values,
            pools,
            list(acc.left),
            acc,
            caps={n: self.settings.cap(n) for n in names},
            cap_units=list(units),
            contested=contested,
            tranches={n: tranches[n] for n in names if n in tranches},
            pinned_units=pinned_units,
            loading=loading,
        )

    def _solve(
        self,
        names: Sequence[str],
        variables: Mapping[str, list[_Var]],
        demand: Mapping[str, float],
        values: Mapping[str, float],
        pools: Sequence[Pool],
        limits: Sequence[float],
        acc: _Acc,
        *,
        caps: Mapping[str, float],
        cap_units: Sequence[float],
        contested: Sequence[bool] | None,
        tranches: Mapping[str, Sequence[Tranche]] | None = None,
        pinned_units: Mapping[tuple[str, int], float] | None = None,
        loading: Mapping[tuple[str, int], tuple[float, float]] | None = None,
    ) -> list[str]:
        """Build and solve one LP and add its solution to ``acc``; returns the levers whose
        cap row was tight. ``contested=None`` puts a cap row on every (lever, pool).
        ``tranches``: levers valued piecewise (a copy of the lever's variables per tranche,
        each at its tranche's LCB and limited to its share of the demand; the tranches of
        levers that take a request whole share a per-segment request row). ``loading[(lever,
        slot)] = (held, worth)``: the lever's units of the slot beyond the ``held`` ones are
        worth ``worth`` of a held one (*Loading*: a copy of each of its variables there at that
        value, the originals limited to ``held`` units)."""
        vs: list[_Var] = []
        coef: list[float] = []
        parts = tranches or {}
        for n in names:
            ts = parts.get(n)
            if not ts or (len(ts) == 1 and ts[0].segment is None):
                if values[n] > 0.0:
                    vs += variables[n]
                    coef += [values[n]] * len(variables[n])
                continue
            cost = self.levers[n].unit_cost()
            dominant = max(cost.cpu_s, cost.accelerator_s)
            for k, t in enumerate(ts):
                if not (_proven(t.estimate) and t.demand > 0.0):
                    continue
                for v in variables[n]:
                    vs.append(_Var(v.lever, v.cpu_pool, v.acc_pool, v.cpu, v.acc, v.scale, k))
                    coef.append(t.estimate.mean / dominant)
        if not vs:
            return []
        held_cols: dict[tuple[str, int], list[int]] = {}
        if loading:
            for j in range(len(vs)):
                v = vs[j]
                if v.acc_pool is None:
                    continue
                key = (v.lever, v.acc_pool)
                got = loading.get(key)
                if got is not None:
                    held_cols.setdefault(key, []).append(j)
                    vs.append(v)  # the same work on units the lever must first load
                    coef.append(coef[j] * got[1])
        cols = _Columns(vs)
        rows = _Rows()
        use = cols.pool_rows(len(limits))
        live = use.any(axis=1)
        rows.add(use[live], [max(limits[i], 0.0) for i in np.flatnonzero(live).tolist()])
        if held_cols and loading:
            rows.add_sparse(
                [{j: vs[j].acc for j in js} for js in held_cols.values()],
                [max(loading[key][0], 0.0) for key in held_cols],
                len(vs),
            )
        cap_rows = self._lever_rows(
            cols, use, demand, acc, caps, cap_units, contested, rows, parts, pinned_units
        )
        self._request_rows(vs, parts, rows)
        a, b = rows.matrix()
        x, _ = solve_lp(coef, a, b)
        used = a @ x
        bound = [n for r, n in cap_rows if b[r] > 0.0 and used[r] >= b[r] * (1.0 - 1e-7)]
        self._book(vs, x, pools, acc, parts)
        return bound

    def _request_rows(
        self, vs: Sequence[_Var], tranches: Mapping[str, Sequence[Tranche]], rows: _Rows
    ) -> None:
        """A request gets one of the levers that take it whole (RMA's extras or the strong
        model): per segment or stratum, the requests the levers' tranches of that name treat
        ≤ its rate. A tranche that names the stratum it works in (RMA's bands,
        :attr:`Tranche.strata`) gets a row of its own with the other levers' tranches there:
        the requests it treats plus theirs ≤ the stratum's rate. (One row per band, not one
        per stratum: a request that gets RMA's 150th extra candidate also got its first.)"""
        # the columns of each (lever, tranche), in the order of ``vs``
        groups: dict[tuple[str, int], list[int]] = {}
        for j, v in enumerate(vs):
            if v.tranche >= 0:
                groups.setdefault((v.lever, v.tranche), []).append(j)
        per_request = {lever: self.levers[lever].requests_per_unit() for lever, _ in groups}
        segs: dict[str, float] = {}
        for lever, k in groups:
            t = tranches[lever][k]
            if t.segment is not None and per_request[lever] is not None:
                segs[t.segment] = t.requests
        if not segs:
            return
        whole: dict[str, dict[int, float]] = {seg: {} for seg in segs}
        users: dict[str, set[str]] = {seg: set() for seg in segs}
        bands: dict[tuple[str, str, int], dict[int, float]] = {}
        for (lever, k), js in groups.items():
            per = per_request[lever]
            if per is None:
                continue
            t = tranches[lever][k]
            if t.segment in segs:
                whole[str(t.segment)].update({j: vs[j].scale * per for j in js})
                users[str(t.segment)].add(lever)
            for key, r in t.strata:
                if key in segs:
                    bands.setdefault((key, lever, k), {}).update({j: vs[j].scale * r for j in js})
        coefs: list[Mapping[int, float]] = []
        limits: list[float] = []
        for seg, requests in sorted(segs.items()):
            if len(users[seg]) >= 2:  # one lever alone is bounded by its own demand row
                coefs.append(whole[seg])
                limits.append(max(requests, 0.0))
        for (key, lever, _), coef in sorted(bands.items()):
            if users[key] - {lever}:
                coefs.append({**whole[key], **coef})
                limits.append(max(segs[key], 0.0))
        rows.add_sparse(coefs, limits, len(vs))

    @staticmethod
    def _lever_rows(
        cols: _Columns,
        use: np.ndarray,
        demand: Mapping[str, float],
        acc: _Acc,
        caps: Mapping[str, float],
        cap_units: Sequence[float],
        contested: Sequence[bool] | None,
        rows: _Rows,
        tranches: Mapping[str, Sequence[Tranche]] | None = None,
        pinned_units: Mapping[tuple[str, int], float] | None = None,
    ) -> list[tuple[int, str]]:
        """Append each lever's demand row and its cap rows (on the contested pools, or every
        pool with ``contested=None``) to ``rows``; returns the cap rows as (row index, lever).
        ``use``: every pool's row (:meth:`_Columns.pool_rows`). ``cap_units[i]``: the units a
        lever's cap of slot ``i`` is a share of (its whole pool, :func:`_pool_units`, pinned
        slots included). ``pinned_units[(lever, slot)]``: what the lever holds pinned beside
        that slot, in the same pool — its cap there is its cap of the whole pool less that."""
        cap_rows: list[tuple[int, str]] = []
        for code, n in enumerate(cols.names):
            mine = cols.lever == code
            # every variable of a lever has the same scale (work units per scaled unit), so the
            # demand row Σ x·scale ≤ D is written Σ x ≤ D / scale, in resource units like the rest
            scale = float(cols.scale[int(np.argmax(mine))])
            rows.add(
                mine[None, :].astype(float), [max(demand[n] - acc.rates.get(n, 0.0), 0.0) / scale]
            )
            if tranches is not None and n in tranches:
                # and one per tranche: what its segment can use
                ks = sorted(set(cols.tranche[mine].tolist()) - {-1})
                if ks:
                    block = ((cols.tranche[None, :] == np.array(ks)[:, None]) & mine).astype(float)
                    rows.add(block, [max(tranches[n][k].demand, 0.0) / scale for k in ks])
            cap = caps.get(n, 1.0)
            if contested is not None and cap >= 1.0:
                continue
            own = np.where(mine, use, 0.0)
            keep = own.any(axis=1)
            if contested is not None:
                keep &= np.asarray(contested, dtype=bool)
            limits: list[float] = []
            for i in np.flatnonzero(keep).tolist():
                cap_rows.append((rows.count + len(limits), n))
                held = (pinned_units or {}).get((n, i), 0.0)
                limits.append(max(cap * cap_units[i] - held, 0.0))
            rows.add(own[keep], limits)
        return cap_rows

    @staticmethod
    def _book(
        vs: Sequence[_Var],
        x: np.ndarray,
        pools: Sequence[Pool],
        acc: _Acc,
        tranches: Mapping[str, Sequence[Tranche]] | None = None,
    ) -> None:
        """Add an LP's solution ``x`` to ``acc``: capacity left, pool use, budgets, rates (an entry
        of at most :data:`_ROUNDING` is the tableau's rounding, not work)."""
        for j, v in enumerate(vs):
            xj = float(x[j])
            if xj <= _ROUNDING:
                continue
            if v.tranche >= 0 and tranches is not None:
                tkey = (v.lever, tranches[v.lever][v.tranche].segment)
                acc.tranche_rates[tkey] = acc.tranche_rates.get(tkey, 0.0) + xj * v.scale
            cpu = xj * v.cpu
            a_ = xj * v.acc
            if v.cpu_pool is not None:
                acc.left[v.cpu_pool] = max(acc.left[v.cpu_pool] - cpu, 0.0)
                key = (v.lever, acc.origin[v.cpu_pool])
                acc.pool_use[key] = acc.pool_use.get(key, 0.0) + cpu
            if v.acc_pool is not None:
                acc.left[v.acc_pool] = max(acc.left[v.acc_pool] - a_, 0.0)
                key = (v.lever, acc.origin[v.acc_pool])
                acc.pool_use[key] = acc.pool_use.get(key, 0.0) + a_
            bud = acc.budgets.setdefault(v.lever, [0.0, 0.0])
            bud[0] += cpu
            bud[1] += a_
            acc.rates[v.lever] = acc.rates.get(v.lever, 0.0) + xj * v.scale
            hw = None if v.acc_pool is None else pools[v.acc_pool].hardware
            slot = acc.per_hw.setdefault((v.lever, hw), [0.0, 0.0])
            slot[0] += cpu
            slot[1] += a_


# ------------------------------------------------------------------------------------------------
# RMA per stratum: the level each value bin gets (docs/controllers.md, "RMA levels")
# ------------------------------------------------------------------------------------------------


def stratum_levels(
    budget: float,
    share: npt.ArrayLike,
    free: npt.ArrayLike,
    gain: npt.ArrayLike,
    extras: Sequence[float],
) -> npt.NDArray[np.float64] | None:
    """Extra candidates per stratum that spend ``budget`` extras per treatment request where
    they are worth most (docs/controllers.md, "RMA levels").

    ``share[c]``: stratum ``c``'s share of the treatment requests; ``free[c]``: the share of
    them RMA may serve (the strong model takes the rest); ``gain[c, j]``: the value one request
    of ``c`` gains with ``extras[j]`` extras. Each stratum's gain is replaced by its concave
    hull and its rising tranches are filled by value per extra candidate, best first (the
    LP's optimum for a concave, separable objective under one budget row: every stratum ends
    at the level where its marginal value per candidate meets one price); the last tranche may
    be filled in part. A stratum nobody serves (``free = 0``) gets the level of that price too.
    None when no tranche pays (no gain anywhere: nothing to order by)."""
    g = np.nan_to_num(np.asarray(gain, dtype=np.float64))
    x = [float(e) for e in extras]
    hulls = [concave_tranches(x, [float(v) for v in row]) for row in g]
    return fill_levels(budget, share, free, hulls)


def fill_levels(
    budget: float,
    share: npt.ArrayLike,
    free: npt.ArrayLike,
    hulls: Sequence[Sequence[tuple[float, float, float]]],
) -> npt.NDArray[np.float64] | None:
    """:func:`stratum_levels` from each stratum's rising hull tranches ``(from, to, value per
    candidate)`` (:func:`~headroom.controllers.levers.concave_tranches`), so a caller that has
    them (a curve's hull scaled by a stratum's value) does not compute them again."""
    w = np.clip(np.nan_to_num(np.asarray(share, dtype=np.float64)), 0.0, None)
    w = w * np.clip(np.nan_to_num(np.asarray(free, dtype=np.float64)), 0.0, 1.0)
    n_cells = w.size
    tranches: list[tuple[float, int, float, float]] = []  # (-slope, cell, from, to)
    for c in range(n_cells):
        tranches += [(-slope, c, a, b) for a, b, slope in hulls[c]]
    if not tranches:
        return None
    tranches.sort()
    level = np.zeros(n_cells)
    left = max(float(budget), 0.0) if math.isfinite(budget) else 0.0
    price = 0.0
    for neg, c, a, b in tranches:
        if w[c] <= 0.0:
            continue
        if left <= 0.0:
            break
        price = -neg
        cost = w[c] * (b - a)
        if cost <= left:
            level[c] = b
            left -= cost
        else:
            level[c] = a + left / w[c]
            left = 0.0
    for c in range(n_cells):
        if w[c] <= 0.0:
            level[c] = max(
                (b for a, b, slope in hulls[c] if slope >= price and price > 0.0), default=0.0
            )
    return level
