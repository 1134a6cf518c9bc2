"""Allocator: splits a region's opportunistic capacity between the registered levers.

The problem
-----------
A region announces opportunistic *pools*: (resource, hardware, remote, remaining lifetime,
units). Each registered lever (controllers/levers.py) costs ``cpu_l`` core-seconds and ``acc_l``
device-seconds per unit of work, is worth ``v_l`` per unit (its **lower confidence bound**, so a
lever must prove its value before it gets capacity), and can absorb at most ``D_l`` units/s.
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
rule, Bland's rule after too many degenerate pivots so it cannot cycle), a few dozen
microseconds for the handful of levers and pools a region has — scipy's ``linprog`` gives the
same optimum (a unit test checks it on random instances) but costs a millisecond per call in
set-up alone, ten times the whole control step's budget. A greedy by value per resource unit
is *not* exact here: RMA is CPU-heavy, SBM and precompute accelerator-heavy, and the optimum
often splits a pool between two levers that each use both resources.

Each lever's value enters as ``v_l`` per unit of work; variables are scaled to the lever's
dominant resource so the tableau is well conditioned. ``LeverShare.value_per_unit_lcb`` reports
the LCB per core-second or device-second of that dominant resource.

Exploration and fallback
------------------------
* A lever not proven valuable (LCB ≤ 0) but not proven harmful (UCB > 0, or no estimate yet)
  first gets ``explore_share`` of every pool it can use (split equally among such levers), so its
  value signals keep arriving; the LP then splits the rest between the proven levers.
* **Fallback** — when value signals never arrived (``no_value``), are older than
  ``value_stale_s`` (``stale_value``), or leave no lever with a positive LCB while some could
  still be positive (``uncertain_value``), the allocator hands ``fallback_share`` of the safe
  capacity to the eligible levers in equal parts of each pool and nothing more. When the
  capacity left after the safety margin is below ``min_pool_units`` everywhere, nothing is
  allocated (``below_safety_margin``).

Every result says whether it fell back and why, and which levers' caps bound, so the event log
can disclose the allocator's failure bounds (issue 7 §6).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum

import numpy as np

from controllers.config import AllocatorSettings, ValueSettings
from controllers.levers import (
    CapacityUse,
    Lever,
    LeverContext,
    LeverRegistry,
    ValueBook,
    ValueEstimate,
)
from controllers.types import CapacityLevel, LeverShare

__all__ = [
    "Allocation",
    "Allocator",
    "FallbackReason",
    "Pool",
    "pools_from_capacity",
    "solve_lp",
]

_EPS = 1e-9


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


def pools_from_capacity(
    capacity: Iterable[CapacityLevel], now: float, safety_margin: float
) -> list[Pool]:
    """The usable opportunistic pools, newest level per (resource, hardware, remote)."""
    newest: dict[tuple[str, str, bool], CapacityLevel] = {}
    for c in capacity:
        if c.pool != "opportunistic":
            continue
        key = (c.resource, c.hardware, c.remote)
        old = newest.get(key)
        if old is None or c.ts >= old.ts:
            newest[key] = c
    pools = []
    for (resource, hardware, remote), c in sorted(newest.items()):
        units = c.units if math.isfinite(c.units) and c.units > 0.0 else 0.0
        if c.expires_in_s is None or not math.isfinite(c.expires_in_s):
            life = math.inf
        else:
            elapsed = now - c.ts if 0.0 < c.ts <= now else 0.0
            life = max(c.expires_in_s - elapsed, 0.0)
        pools.append(Pool(resource, hardware, units * (1.0 - safety_margin), units, remote, life))
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
    t = np.zeros((m + 1, n + m + 1))
    t[:m, :n] = a
    t[:m, n : n + m] = np.eye(m)
    t[:m, -1] = b
    t[m, :n] = -np.asarray(c, dtype=float)
    basis = list(range(n, n + m))
    bland_after = m + n
    for it in range(max_iter):
        row_obj = t[m, :-1]
        if it < bland_after:
            col = int(np.argmin(row_obj))
            if row_obj[col] >= -_EPS:
                break
        else:
            neg = np.flatnonzero(row_obj < -_EPS)
            if neg.size == 0:
                break
            col = int(neg[0])
        column = t[:m, col]
        positive = column > _EPS
        if not positive.any():  # unbounded: cannot happen with every variable in a row
            raise ValueError("unbounded linear program")
        ratios = np.full(m, np.inf)
        ratios[positive] = t[:m, -1][positive] / column[positive]
        best = ratios.min()
        ties = np.flatnonzero(ratios <= best + _EPS * max(1.0, abs(best)))
        row = int(min(ties, key=lambda r: basis[r]))
        t[row] /= t[row, col]
        factors = t[:, col].copy()
        factors[row] = 0.0
        t -= np.outer(factors, t[row])
        basis[row] = col
    else:
        raise RuntimeError("simplex did not converge")
    x = np.zeros(n + m)
    for r, j in enumerate(basis):
        x[j] = max(t[r, -1], 0.0)
    return x[:n], float(t[m, -1])


@dataclass(frozen=True, slots=True)
class Allocation:
    """The allocator's decision for one region."""

    shares: tuple[LeverShare, ...]
    rates: Mapping[str, float]  # units of work per second per lever
    budgets: Mapping[str, tuple[float, float]]  # (cpu cores, accelerator devices) per lever
    estimates: Mapping[str, ValueEstimate]
    fallback: FallbackReason | None
    cap_bound: tuple[str, ...]  # levers whose per-pool cap was binding
    explored: tuple[str, ...]  # levers that got an exploration share
    safe_cpu: float
    safe_accelerator: float
    pools: tuple[Pool, ...] = field(default=())

    def budget(self, lever: str) -> tuple[float, float]:
        return self.budgets.get(lever, (0.0, 0.0))

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

    def _variables(self, lever: Lever, pools: Sequence[Pool]) -> list[_Var]:
        cost = lever.unit_cost()
        need_cpu = cost.cpu_s > 0.0
        need_acc = cost.accelerator_s > 0.0
        if not (need_cpu or need_acc):
            return []
        dominant = max(cost.cpu_s, cost.accelerator_s)
        cpu = cost.cpu_s / dominant
        acc = cost.accelerator_s / dominant
        cpu_pools: list[int | None] = [None]
        acc_pools: list[int | None] = [None]
        if need_cpu:
            cpu_pools = [
                i for i, p in enumerate(pools) if p.resource == "cpu" and self.eligible(lever, p)
            ]
        if need_acc:
            acc_pools = [
                i
                for i, p in enumerate(pools)
                if p.resource == "accelerator" and self.eligible(lever, p)
            ]
        return [
            _Var(lever.name, ci, ai, cpu, acc, 1.0 / dominant)
            for ci in cpu_pools
            for ai in acc_pools
        ]

    def allocate(
        self,
        capacity: Iterable[CapacityLevel],
        now: float,
        ctx: LeverContext,
        book: ValueBook,
        value_age_s: float | None,
    ) -> Allocation:
        s = self.settings
        pools = pools_from_capacity(capacity, now, s.safety_margin)
        usable = [p.units >= s.min_pool_units for p in pools]
        safe_cpu = sum(
            p.units for p, u in zip(pools, usable, strict=True) if u and p.resource == "cpu"
        )
        safe_acc = sum(
            p.units for p, u in zip(pools, usable, strict=True) if u and p.resource == "accelerator"
        )
        z = self.value.lcb_z
        estimates = {
            lever.name: lever.estimate(book, ctx, z, self.value.min_samples)
            for lever in self.levers
        }
        # levers that could run at all: demand and at least one usable variable
        variables: dict[str, list[_Var]] = {}
        demand: dict[str, float] = {}
        usable_pools = [p if u else _empty(p) for p, u in zip(pools, usable, strict=True)]
        for lever in self.levers:
            d = lever.demand(ctx)
            if not (d > 0.0 and math.isfinite(d)):
                continue
            vs = [
                v
                for v in self._variables(lever, usable_pools)
                if (v.cpu_pool is None or usable[v.cpu_pool])
                and (v.acc_pool is None or usable[v.acc_pool])
            ]
            if vs:
                variables[lever.name] = vs
                demand[lever.name] = d

        def result(
            budgets: dict[str, list[float]],
            rates: dict[str, float],
            per_hw: dict[tuple[str, str | None], list[float]],
            fallback: FallbackReason | None,
            cap_bound: Iterable[str] = (),
            explored: Iterable[str] = (),
        ) -> Allocation:
            shares = []
            for (name, hw), (cpu, acc) in sorted(
                per_hw.items(), key=lambda kv: (kv[0][0], kv[0][1] or "")
            ):
                if cpu <= 0.0 and acc <= 0.0:
                    continue
                est = estimates[name]
                cost = self.levers[name].unit_cost()
                dominant = max(cost.cpu_s, cost.accelerator_s)
                lcb = est.lcb / dominant if est.known else 0.0
                shares.append(LeverShare(name, cpu, acc, hw, lcb))
            return Allocation(
                shares=tuple(shares),
                rates=rates,
                budgets={k: (v[0], v[1]) for k, v in budgets.items()},
                estimates=estimates,
                fallback=fallback,
                cap_bound=tuple(sorted(set(cap_bound))),
                explored=tuple(sorted(set(explored))),
                safe_cpu=safe_cpu,
                safe_accelerator=safe_acc,
                pools=tuple(pools),
            )

        budgets: dict[str, list[float]] = {}
        rates: dict[str, float] = {}
        per_hw: dict[tuple[str, str | None], list[float]] = {}
        if not any(usable):
            reason = (
                FallbackReason.BELOW_SAFETY_MARGIN
                if any(p.announced > 0.0 for p in pools)
                else None
            )
            return result(budgets, rates, per_hw, reason)
        if not variables:
            return result(budgets, rates, per_hw, None)

        # which fallback, if any
        fallback: FallbackReason | None = None
        any_known = any(estimates[n].known for n in variables)
        proven = [n for n in variables if estimates[n].known and estimates[n].lcb > 0.0]
        hopeful = [n for n in variables if not estimates[n].known or estimates[n].ucb > 0.0]
        if value_age_s is None or not any_known:
            fallback = FallbackReason.NO_VALUE
        elif not math.isfinite(value_age_s) or value_age_s > s.value_stale_s:
            fallback = FallbackReason.STALE_VALUE
        elif not proven and hopeful:
            fallback = FallbackReason.UNCERTAIN_VALUE

        capacity_left = [p.units if u else 0.0 for p, u in zip(pools, usable, strict=True)]
        if fallback is not None:
            names = hopeful if fallback is not FallbackReason.NO_VALUE else list(variables)
            self._flat(
                names,
                variables,
                demand,
                pools,
                capacity_left,
                s.fallback_share,
                budgets,
                rates,
                per_hw,
            )
            return result(budgets, rates, per_hw, fallback, explored=names)

        explore = [n for n in hopeful if n not in proven]
        if explore and s.explore_share > 0.0:
            self._flat(
                explore,
                variables,
                demand,
                pools,
                capacity_left,
                s.explore_share,
                budgets,
                rates,
                per_hw,
            )
        cap_bound = self._optimise(
            proven, variables, demand, estimates, pools, capacity_left, budgets, rates, per_hw
        )
        return result(budgets, rates, per_hw, None, cap_bound, explore)

    # -- the two LPs -----------------------------------------------------------------------

    def _flat(
        self,
        names: Sequence[str],
        variables: Mapping[str, list[_Var]],
        demand: Mapping[str, float],
        pools: Sequence[Pool],
        capacity_left: list[float],
        share: float,
        budgets: dict[str, list[float]],
        rates: dict[str, float],
        per_hw: dict[tuple[str, str | None], list[float]],
    ) -> None:
        """Equal parts of ``share`` of every pool to ``names``: the LP with a flat value per
        resource unit and a cap of 1/k of the scaled pool for each of the k levers on it."""
        if share <= 0.0 or not names:
            return
        cap_pool = [c * share for c in capacity_left]
        users = [0] * len(pools)
        for n in names:
            touched: set[int] = set()
            for v in variables[n]:
                touched.update(i for i in (v.cpu_pool, v.acc_pool) if i is not None)
            for i in touched:
                users[i] += 1
        caps = {n: 1.0 for n in names}
        cap_of_pool = [cap_pool[i] / users[i] if users[i] else 0.0 for i in range(len(pools))]
        self._solve(
            names,
            variables,
            demand,
            {n: 1.0 for n in names},
            pools,
            cap_pool,
            capacity_left,
            caps,
            budgets,
            rates,
            per_hw,
            cap_units=cap_of_pool,
        )

    def _optimise(
        self,
        names: Sequence[str],
        variables: Mapping[str, list[_Var]],
        demand: Mapping[str, float],
        estimates: Mapping[str, ValueEstimate],
        pools: Sequence[Pool],
        capacity_left: list[float],
        budgets: dict[str, list[float]],
        rates: dict[str, float],
        per_hw: dict[tuple[str, str | None], list[float]],
    ) -> list[str]:
        if not names:
            return []
        # value per scaled unit = value per unit of work / dominant cost
        values = {}
        for n in names:
            cost = self.levers[n].unit_cost()
            values[n] = estimates[n].lcb * max(cost.cpu_s, cost.accelerator_s)
        caps = {n: self.settings.cap(n) for n in names}
        # a cap binds only on pools another registered lever could also use
        contested = [False] * len(pools)
        for i in range(len(pools)):
            users = sum(
                1 for n in variables if any(i in (v.cpu_pool, v.acc_pool) for v in variables[n])
            )
            contested[i] = users >= 2
        cap_units = [p.units for p in pools]
        return self._solve(
            names,
            variables,
            demand,
            values,
            pools,
            list(capacity_left),
            capacity_left,
            caps,
            budgets,
            rates,
            per_hw,
            cap_units=cap_units,
            contested=contested,
        )

    def _solve(
        self,
        names: Sequence[str],
        variables: Mapping[str, list[_Var]],
        demand: Mapping[str, float],
        values: Mapping[str, float],
        pools: Sequence[Pool],
        limits: Sequence[float],
        capacity_left: list[float],
        caps: Mapping[str, float],
        budgets: dict[str, list[float]],
        rates: dict[str, float],
        per_hw: dict[tuple[str, str | None], list[float]],
        *,
        cap_units: Sequence[float],
        contested: Sequence[bool] | None = None,
    ) -> list[str]:
        """Build and solve one LP; add its allocation to the accumulators; subtract what it used
        from ``capacity_left``; return the levers whose cap row was tight."""
        vs: list[_Var] = []
        for n in names:
            if values[n] > 0.0:
                vs.extend(variables[n])
        if not vs:
            return []
        npool = len(limits)
        rows: list[list[float]] = []
        rhs: list[float] = []
        kinds: list[tuple[str, str, int]] = []
        for i in range(npool):
            row = [0.0] * len(vs)
            for j, v in enumerate(vs):
                if v.cpu_pool == i:
                    row[j] += v.cpu
                if v.acc_pool == i:
                    row[j] += v.acc
            if any(row):
                rows.append(row)
                rhs.append(max(limits[i], 0.0))
                kinds.append(("pool", "", i))
        for n in dict.fromkeys(v.lever for v in vs):
            # every variable of a lever has the same scale (work units per scaled unit), so the
            # demand row Σ x·scale ≤ D is written Σ x ≤ D / scale, in resource units like the rest
            lever_vars = [v for v in vs if v.lever == n]
            rows.append([1.0 if v.lever == n else 0.0 for v in vs])
            rhs.append(demand[n] / lever_vars[0].scale)
            kinds.append(("demand", n, -1))
            cap = caps.get(n, 1.0)
            for i in range(npool):
                if contested is not None and not contested[i]:
                    continue
                if contested is not None and cap >= 1.0:
                    continue
                row = [0.0] * len(vs)
                for j, v in enumerate(vs):
                    if v.lever != n:
                        continue
                    if v.cpu_pool == i:
                        row[j] += v.cpu
                    if v.acc_pool == i:
                        row[j] += v.acc
                if any(row):
                    rows.append(row)
                    rhs.append(max(cap * cap_units[i], 0.0))
                    kinds.append(("cap", n, i))
        a = np.array(rows)
        b = np.array(rhs)
        c = [values[v.lever] for v in vs]
        x, _ = solve_lp(c, a, b)
        used = a @ x
        bound = []
        for r, (kind, n, _i) in enumerate(kinds):
            if (
                kind == "cap"
                and contested is not None
                and used[r] >= b[r] * (1.0 - 1e-7)
                and b[r] > 0
            ):
                bound.append(n)
        for j, v in enumerate(vs):
            xj = float(x[j])
            if xj <= 0.0:
                continue
            cpu = xj * v.cpu
            acc = xj * v.acc
            if v.cpu_pool is not None:
                capacity_left[v.cpu_pool] = max(capacity_left[v.cpu_pool] - cpu, 0.0)
            if v.acc_pool is not None:
                capacity_left[v.acc_pool] = max(capacity_left[v.acc_pool] - acc, 0.0)
            bud = budgets.setdefault(v.lever, [0.0, 0.0])
            bud[0] += cpu
            bud[1] += acc
            rates[v.lever] = rates.get(v.lever, 0.0) + xj * v.scale
            hw = None if v.acc_pool is None else pools[v.acc_pool].hardware
            key = (v.lever, hw)
            acc_hw = per_hw.setdefault(key, [0.0, 0.0])
            acc_hw[0] += cpu
            acc_hw[1] += acc
        return bound


def _empty(p: Pool) -> Pool:
    return Pool(p.resource, p.hardware, 0.0, p.announced, p.remote, p.lifetime_s)
