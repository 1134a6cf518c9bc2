"""The oracle: the most incremental value any policy could draw from a run's capacity.

Pure: no clock, no randomness. It knows everything in advance — every step's arrivals, every
pool's level at every instant, the value curves — and has no control lag.

The bound
---------
Take one stretch of time of length ``dt`` inside step ``t`` over which every pool's level is
constant (steps are split at capacity changes and at the instants a strong model could finish
loading). The treatment requests arriving in it are ``N = A_t · (dt / len_t) · (1 − holdout)``,
spread over the population cells with shares ``sh_c``. Each may be served one of the options
``o``: the baseline, RMA with ``e_k`` extra candidates (a grid of levels), or the strong model
(eligible requests only). With per-request gains ``g_{c,o} = E[value | c] · (Q_o(c) − Q_base(c))``
(the measured curves) and per-request costs, the best any allocation can do is the LP

    maximise    N · Σ_c sh_c Σ_o g_{c,o} x_{c,o}
    subject to  Σ_o x_{c,o} ≤ 1,   x_{c,strong} ≤ eligible share,   x ≥ 0       (every cell)
                CPU:             Σ sh_c (Σ_k e_k·cpu_b·x_{c,k} + n0·cpu_s·x_{c,S}) ≤ b_cpu
                RMA devices:     Σ sh_c Σ_k e_k·acc_b·x_{c,k}                 ≤ b_R
                strong devices:  Σ sh_c n0·acc_s·x_{c,S}                      ≤ b_S
                both:            RMA devices + strong devices                   ≤ b_RS

with per-request budgets ``b = units × 1000 × dt / N`` (ms of work per request): ``b_cpu`` from
the CPU pools, ``b_R`` from the accelerator pools the base model runs on, ``b_S`` from the
strong-capable pools' *loaded* units — a unit counts only if it has been present for the whole
``load_s`` before (``min`` of the level over ``[t − load_s, t]``; no policy can load faster) —
and ``b_RS = b_R + loaded units of strong-only pools`` (the Hall condition that lets the two
levers share a pool both can use). Remote pools serve only asynchronous work and are left out.

**Relief.** One effect escapes the LP: a request routed to the strong model no longer uses the
dedicated accelerators, so when the *baseline itself* overloads its pool (a surge at peak), a
policy can make base requests time out less than the static configuration does, and that
counts as incremental value. No policy can win back more than static loses, so the bound adds
the baseline value static loses to its own queues (:meth:`Oracle.static_losses`, computed with
the engine's own queue model); it is 0 whenever the dedicated pools keep up.

**Why no policy can exceed it.** In the engine (sim/engine.py) every policy's optional work in a
stretch is executed only on the opportunistic capacity its lever holds, which is at most the
pools' levels (the quota model: work beyond a quota is slowed, never run on dedicated capacity),
and strong-model work only on loaded replicas, which exist only ``load_s`` after their capacity
appeared. A request's ground-truth gain is ``E[value | c] · (Q_o − Q_base)`` for the option it
got, counted only if it finished in time (anything else only lowers it), and each request gets
at most one option. So any policy's allocation in the stretch is a feasible point of the LP (its
fractions per cell are the ``x``), and its credited gain is at most the LP's optimum. Summing over
stretches gives the bound. The one coupling between stretches, a backlog carried over a
boundary, lasts less than the timeout (requests older than that are dropped) and only exists
while a policy's optional work exceeds its quota, which costs it more (time-outs) than the
carried work could add. A policy's incremental value splits into its optional gains (at most the
LP) and the change in its base requests' timeouts against static (at most static's losses:
the relief term). ``oracle ≥ every policy`` is checked on every reference scenario by the
simulation tests.

**Precompute** (scenarios with the precompute fields, regions that can run it). A visit that
finds a stored result is served from it instead of the live path (sim/precompute_sim.py), so
each cell gets one more option, ``pre``, worth ``Δ*_s`` per request (the most a stored result
ever adds to a visit of segment ``s``), costing no live capacity, with ``x_{c,pre} ≤ ρ_{w,s}``:
the share of the window's treatment visits of the segment whose user visited in an earlier
window (:func:`headroom.sim.precompute_sim.returning_share`; no policy can serve another visit from
a result). A policy whose hits are ``h_s ≤ ρ_{w,s}`` of a segment's visits in a window earns
``(1 − h_s)·(live gain) + h_s·(hit gain)`` per request: the live allocation scaled by
``1 − h_s`` still fits the budgets and ``x_{c,pre} = h_s`` is feasible, so the joint LP bounds
it. Stretches are also cut at window edges (one ``ρ`` each). Counting every visit at ``Δ*``
*on top of* the live LP, as before, counted a hit's request twice.

**Computing it exactly and fast.** The LP depends on the stretch only through ``b`` (per-request
budgets). ``b`` is rounded *down* onto a log grid (ratio :data:`GRID_RATIO`) and the LP is solved
once per grid point with HiGHS (scipy). The primal solution at the rounded-down point is feasible
at the real ``b`` (it uses less), so the oracle *policy* runs it. The *bound* at the real ``b`` is
the Lagrangian dual evaluated with that grid point's optimal prices ``y ≥ 0``::

    D(y; b) = y·b + Σ_c sh_c φ_c(y),   φ_c(y) = e·max(0, r_S, R) + (1 − e)·max(0, R),
    r_o = g_{c,o} − y·cost_o,  R = max_k r_{c,k}

which is an upper bound for *any* ``y ≥ 0`` (weak duality) and equals the LP optimum at the grid
point (strong duality), so it is a valid, tight bound (the slack is ``y·Δb`` for a budget gap
``Δb`` under 0.5 %). With precompute, ``φ_c`` also weighs the ``pre`` option up to its cap
(:meth:`Oracle._h_pre`: the options by reduced value, each up to its cap, a fractional knapsack
of size one) and is evaluated at the real ``ρ``; those LPs only supply prices, so they are solved
on a coarser grid (:data:`RHO_GRID`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
from scipy.optimize import linprog

from headroom.sim.context import Plan, SimContext, baseline_plan, build_mix
from headroom.sim.latency import StageState, Strata, in_time_probability, wait_params_array
from headroom.sim.precompute_sim import precompute_capable, precompute_static, returning_share

__all__ = ["GRID_RATIO", "Oracle", "OracleBound", "oracle_for"]

FloatArray = npt.NDArray[np.float64]

# Budgets are rounded down to powers of this ratio: 0.5 % apart, so the oracle policy gives up at
# most ~0.5 % of a budget and the number of LPs per run stays in the hundreds.
GRID_RATIO = 1.005
_LOG_RATIO = math.log(GRID_RATIO)
# RMA options: extra candidates in this many equal steps from base to max.
RMA_LEVELS = 8
# The LPs with the precompute option only supply prices (the bound is the dual at the real
# budgets and returning shares, valid for any prices): they are solved on a coarse grid —
# returning shares rounded up to 1/RHO_GRID, budgets down to every _PRE_KEY_STEPS-th grid point
# (about 10 % apart). On precompute-remote this costs 0.02 % of the bound and saves 5/6 of the
# solves (235 instead of 1,593).
RHO_GRID = 10
_PRE_KEY_STEPS = 20
_ZERO_KEY = -(10**9)


@dataclass(frozen=True, slots=True)
class OracleBound:
    total: float
    by_lever: dict[str, float]
    per_region: tuple[float, ...]
    relief: float = 0.0  # the static configuration's own timeout losses (module docstring)


@dataclass(frozen=True, slots=True)
class _Solution:
    x_rma: FloatArray  # (J, C)
    x_sbm: FloatArray  # (C,)
    y: FloatArray  # (4,) prices of cpu, R, S, RS (value per ms per request)
    h: float  # Σ sh φ(y)
    value: float  # LP optimum per treatment request at the grid point
    value_rma: float
    value_sbm: float
    value_pre: float = 0.0


class Oracle:
    """LP plans and the bound for one :class:`SimContext` (module docstring)."""

    def __init__(self, ctx: SimContext) -> None:
        self.ctx = ctx
        pop = ctx.pop
        costs = ctx.costs
        n0 = ctx.n0
        span = ctx.nmax - n0
        levels = sorted({round(span * (k + 1) / RMA_LEVELS) for k in range(RMA_LEVELS)} - {0})
        self.levels = tuple(int(e) for e in levels)
        g = []
        for e in self.levels:
            q, _ = ctx.rma_quality(e)
            g.append(pop.v_mean * (q - ctx.q_base))
        self.g_rma = np.array(g) if g else np.zeros((0, pop.n_cells))  # (J, C)
        self.g_sbm = pop.v_mean * (ctx.q_strong - ctx.q_base)  # (C,)
        ex = np.array(self.levels, dtype=np.float64)
        # per-request costs (ms) of each option on the four constrained resources
        self.c_rma = np.stack(
            [
                ex * costs.base_cpu_ms,
                ex * costs.base_accelerator_ms,
                0 * ex,
                ex * costs.base_accelerator_ms,
            ]
        )  # (4, J)
        self.c_sbm = np.array(
            [
                n0 * costs.strong_cpu_ms,
                0.0,
                n0 * costs.strong_accelerator_ms,
                n0 * costs.strong_accelerator_ms,
            ]
        )
        self.share = pop.share / pop.share.sum()
        self.elig = ctx.eligible
        self._solutions: dict[tuple[tuple[int, ...], tuple[int, ...] | None], _Solution] = {}
        self._plans: dict[tuple[int, ...], Plan] = {}
        static = precompute_static(ctx)
        # Δ*_s per cell: the most a stored result adds to one visit (0 without precompute)
        self.pre_gain = None if static is None else np.asarray(static.best_gain[pop.seg])
        self._lp: tuple[Any, ...] = self._build_lp(pre=False)
        self._lp_pre: tuple[Any, ...] | None = None  # built at the first joint solve
        self._bound: OracleBound | None = None
        self._caps = [self._capacity_series(r) for r in range(len(ctx.regions))]

    # -- capacity --------------------------------------------------------------------------

    def _capacity_series(self, r: int) -> tuple[FloatArray, FloatArray]:
        """Breakpoints and the 4 capacities (cpu, R, S loaded, RS) in force from each."""
        ctx = self.ctx
        st = ctx.regions[r]
        rt = ctx.traces.regions[r]
        load = float(ctx.scenario.models.strong.load_s)
        pts = {0.0}
        for p in rt.pools:
            for t in p.times.tolist():
                pts.add(float(t))
                if load > 0:
                    pts.add(float(t) + load)
        times = np.array(sorted(x for x in pts if 0.0 <= x < ctx.duration_s))
        caps = np.zeros((times.size, 4))
        for j, t in enumerate(times.tolist()):
            cpu = r_cap = s_cap = s_only = 0.0
            for i, p in enumerate(rt.pools):
                key = p.key
                if key.remote:
                    continue
                level = p.level_at(t)
                if key.resource == "cpu":
                    cpu += level
                    continue
                loaded = p.min_over(t - load, t) if load > 0 else level
                if t - load < 0:
                    loaded = 0.0 if load > 0 else loaded
                if st.base_ok[i]:
                    r_cap += level
                if st.strong_ok[i]:
                    s_cap += loaded
                    if not st.base_ok[i]:
                        s_only += loaded
            caps[j] = (cpu, r_cap, s_cap, r_cap + s_only)
        return times, caps

    def capacity_at(self, r: int, t: float) -> FloatArray:
        times, caps = self._caps[r]
        j = int(np.searchsorted(times, t, side="right")) - 1
        return np.asarray(caps[max(j, 0)], dtype=np.float64)

    # -- the LP ------------------------------------------------------------------------------

    def _build_lp(self, pre: bool) -> tuple[Any, ...]:
        """Objective and constraint matrix; variables cell-major, per cell ``[rma_0 ..
        rma_{J-1}, sbm]`` and, with ``pre``, the stored-result option last (gain Δ*, no live
        cost; its bound, the returning share, is set per solve)."""
        c_n = self.share.size
        j_n = len(self.levels)
        w = j_n + (2 if pre else 1)
        obj = np.zeros(c_n * w)
        a_ub = np.zeros((c_n + 4, c_n * w))
        for c in range(c_n):
            base = c * w
            obj[base : base + j_n] = -self.share[c] * self.g_rma[:, c]
            obj[base + j_n] = -self.share[c] * self.g_sbm[c]
            if pre:
                assert self.pre_gain is not None
                obj[base + j_n + 1] = -self.share[c] * self.pre_gain[c]
            a_ub[c, base : base + w] = 1.0
            a_ub[c_n:, base : base + j_n] = self.share[c] * self.c_rma
            a_ub[c_n:, base + j_n] = self.share[c] * self.c_sbm
        return obj, a_ub

    def _bounds(self, rho: FloatArray | None) -> list[tuple[float, float]]:
        """Variable bounds (the layout of :meth:`_build_lp`); ``rho``: the returning share of
        each segment (the stored-result option's cap), None for the live LP."""
        seg = self.ctx.pop.seg
        out: list[tuple[float, float]] = []
        for c in range(self.share.size):
            out += [(0.0, 1.0)] * len(self.levels) + [(0.0, self.elig)]
            if rho is not None:
                out.append((0.0, min(float(rho[int(seg[c])]), 1.0)))
        return out

    def _solve(self, key: tuple[int, ...], rho_key: tuple[int, ...] | None = None) -> _Solution:
        """The LP at a budget grid point; with ``rho_key``, the joint LP with the stored-result
        option open to ``rho_key / RHO_GRID`` of each segment's requests (its ``h`` then
        depends on the real returning shares: :meth:`_h_pre`)."""
        got = self._solutions.get((key, rho_key))
        if got is not None:
            return got
        pre = rho_key is not None
        lp = self._lp_pre if pre else self._lp
        if lp is None:
            lp = self._lp_pre = self._build_lp(pre=True)
        obj, a_ub = lp
        b = np.array([0.0 if k == _ZERO_KEY else GRID_RATIO**k for k in key])
        c_n = self.share.size
        j_n = len(self.levels)
        b_ub = np.concatenate([np.ones(c_n), b])
        bounds = self._bounds(None if rho_key is None else np.array(rho_key) / RHO_GRID)
        res = linprog(obj, A_ub=a_ub, b_ub=b_ub, bounds=bounds, method="highs")
        if res.status != 0:  # pragma: no cover - the origin is always feasible
            raise RuntimeError(f"oracle LP failed: {res.message}")
        x = np.clip(res.x.reshape(c_n, j_n + (2 if pre else 1)), 0.0, None)
        y = np.clip(-np.asarray(res.ineqlin.marginals[c_n:]), 0.0, None)
        v_rma = float((self.share[:, None] * x[:, :j_n] * self.g_rma.T).sum())
        v_sbm = float((self.share * x[:, j_n] * self.g_sbm).sum())
        v_pre = float((self.share * x[:, j_n + 1] * self.pre_gain).sum()) if pre else 0.0
        sol = _Solution(
            x_rma=x[:, :j_n].T.copy(),
            x_sbm=x[:, j_n].copy(),
            y=y,
            h=0.0 if pre else self._h(y),
            value=v_rma + v_sbm + v_pre,
            value_rma=v_rma,
            value_sbm=v_sbm,
            value_pre=v_pre,
        )
        self._solutions[(key, rho_key)] = sol
        return sol

    def _h_pre(self, y: FloatArray, rho: FloatArray) -> FloatArray:
        """``Σ_c sh_c φ_c(y)`` for each row of returning shares ``rho`` (n, S): per cell the
        best use of one request at prices ``y`` — the options by reduced value, each up to its
        cap (RMA 1, strong the eligible share, precompute the returning share), until the
        request is used up (a fractional knapsack of size one: exact). Without precompute
        (no stored-result gain, or ``rho`` 0) it is the live LP's ``h``."""
        r_rma = self.g_rma - (y @ self.c_rma)[:, None]
        r_best = r_rma.max(axis=0) if r_rma.size else np.zeros(self.share.size)
        pre = self.pre_gain if self.pre_gain is not None else np.zeros(self.share.size)
        vals = np.maximum(
            np.stack([r_best, self.g_sbm - float(y @ self.c_sbm), pre]), 0.0
        )  # (3, C)
        n = rho.shape[0]
        c_n = self.share.size
        caps = np.stack(
            [np.ones((n, c_n)), np.full((n, c_n), self.elig), rho[:, self.ctx.pop.seg]], axis=1
        )  # (n, 3, C)
        order = np.argsort(-vals, axis=0)
        v_sorted = np.take_along_axis(vals, order, axis=0)
        c_sorted = np.take_along_axis(caps, np.broadcast_to(order, caps.shape), axis=1)
        left = np.ones((n, c_n))
        phi = np.zeros((n, c_n))
        for i in range(3):
            take = np.minimum(c_sorted[:, i], left)
            phi += v_sorted[i] * take
            left -= take
        return np.asarray(phi @ self.share, dtype=np.float64)

    def _key(self, b: FloatArray) -> tuple[int, ...]:
        out = []
        for v in b.tolist():
            out.append(_ZERO_KEY if v <= 0 else math.floor(math.log(v) / _LOG_RATIO + 1e-12))
        return tuple(out)

    def _h(self, y: FloatArray) -> float:
        """The live LP's ``h``: :meth:`_h_pre` with no stored result."""
        return float(self._h_pre(y, np.zeros((1, len(self.ctx.segment_names))))[0])

    def budgets(self, caps: FloatArray, arrivals_per_s: float) -> FloatArray:
        """Per treatment request: ms of work each resource affords at this arrival rate."""
        n = arrivals_per_s * self.ctx.treat
        if n <= 0:
            return np.zeros(4)
        return np.asarray(caps * 1000.0 / n, dtype=np.float64)

    # -- the oracle as a policy -----------------------------------------------------------

    def plan(self, r: int, now: float, span: float = 0.0) -> Plan:
        """The LP plan for ``[now, now + span)``: the capacity in force at ``now`` (the engine
        splits at every change) and the busiest step's arrivals, so the plan fits every step."""
        ctx = self.ctx
        tr = ctx.traces
        i0 = tr.step_of(now)
        i1 = tr.step_of(max(now + span - 1e-9, now))
        arr = tr.regions[r].arrivals[i0 : i1 + 1] / np.maximum(tr.step_len[i0 : i1 + 1], 1e-12)
        lam = float(arr.max()) if arr.size else 0.0
        key = self._key(self.budgets(self.capacity_at(r, now), lam))
        plan = self._plans.get(key)
        if plan is None:
            sol = self._solve(key)
            used = [j for j in range(len(self.levels)) if sol.x_rma[j].sum() > 1e-12]
            pop_c = self.share.size
            rma = sol.x_rma[used] if used else np.zeros((0, pop_c))
            z = np.zeros(pop_c)
            plan = Plan(tuple(self.levels[j] for j in used), rma, sol.x_sbm, z, z)
            self._plans[key] = plan
        return plan

    # -- the bound ----------------------------------------------------------------------------

    def bound(self) -> OracleBound:
        """The upper bound on incremental value for the run (module docstring)."""
        if self._bound is not None:
            return self._bound
        ctx = self.ctx
        tr = ctx.traces
        total_rma = total_sbm = relief_total = total_pre = 0.0
        per_region = []
        for r in range(len(ctx.regions)):
            times, caps = self._caps[r]
            rho_w = returning_share(ctx, r) if precompute_capable(ctx, r) else None
            edges = np.union1d(tr.step_edges, times)
            if rho_w is not None:  # a stretch lies inside one window: one returning share
                edges = np.union1d(edges, np.arange(rho_w.shape[0] + 1) * ctx.window_s)
            edges = edges[(edges >= 0) & (edges <= ctx.duration_s)]
            a, b = edges[:-1], edges[1:]
            dt = b - a
            keep = dt > 1e-12
            a, dt = a[keep], dt[keep]
            mid = a + 0.5 * dt
            step = np.minimum(np.searchsorted(tr.step_edges, mid, side="right") - 1, tr.n_steps - 1)
            seg = np.searchsorted(times, mid, side="right") - 1
            length = tr.step_len[step]
            arr = tr.regions[r].arrivals[step].astype(np.float64)
            n_req = arr * dt / length * ctx.treat  # treatment requests in the stretch
            cap = caps[np.maximum(seg, 0)]  # (n, 4)
            with np.errstate(divide="ignore", invalid="ignore"):
                bud = np.where(n_req[:, None] > 0, cap * 1000.0 * dt[:, None] / n_req[:, None], 0.0)
            rho = None
            if rho_w is not None:
                win = np.minimum((mid // ctx.window_s).astype(np.int64), rho_w.shape[0] - 1)
                rho = rho_w[win]  # (n, S)
            region_total = 0.0
            keys: dict[tuple[Any, ...], list[int]] = {}
            for idx in range(bud.shape[0]):
                if n_req[idx] <= 0:
                    continue
                key: tuple[Any, ...] = self._key(bud[idx])
                if rho is not None:
                    coarse = tuple(
                        k if k == _ZERO_KEY else k // _PRE_KEY_STEPS * _PRE_KEY_STEPS for k in key
                    )
                    key = (coarse, tuple(int(k) for k in np.ceil(rho[idx] * RHO_GRID - 1e-9)))
                keys.setdefault(key, []).append(idx)
            for key, idxs in keys.items():
                ii = np.array(idxs)
                nr = n_req[ii]
                # dual bound at the real budgets (and returning shares): Σ N (y·b + h)
                if rho is None:
                    sol = self._solve(key)
                    dual = float((nr * (bud[ii] @ sol.y + sol.h)).sum())
                else:
                    sol = self._solve(*key)
                    dual = float((nr * (bud[ii] @ sol.y + self._h_pre(sol.y, rho[ii]))).sum())
                primal = float(nr.sum()) * sol.value
                region_total += dual
                if primal > 0:
                    total_rma += dual * sol.value_rma / sol.value
                    total_sbm += dual * sol.value_sbm / sol.value
                    total_pre += dual * sol.value_pre / sol.value
            relief = self.static_losses(r)
            per_region.append(region_total + relief)
            relief_total += relief
        total = float(sum(per_region))
        self._bound = OracleBound(
            total=total,
            by_lever={"rma": total_rma, "sbm": total_sbm, "precompute": total_pre},
            per_region=tuple(per_region),
            relief=relief_total,
        )
        return self._bound

    def static_losses(self, r: int) -> float:
        """Baseline value the static configuration loses to its own queues in region ``r``
        (requests that time out on dedicated capacity): the most any policy could win back by
        taking work off the dedicated pool (module docstring, *relief*)."""
        ctx = self.ctx
        tr = ctx.traces
        st = ctx.regions[r]
        rt = tr.regions[r]
        bm = build_mix(ctx, baseline_plan(ctx))
        par = ctx.config.latency.cpu_parallelism
        lam = rt.rate
        dt = tr.step_len
        rho_c = lam * bm.base_cpu / (1000.0 * st.ded_cpu) if st.ded_cpu > 0 else np.zeros_like(lam)
        rho_a = lam * bm.base_acc / (1000.0 * st.ded_acc) if st.ded_acc > 0 else np.zeros_like(lam)
        timeout_s = ctx.timeout_ms / 1000.0

        def fluid(rho: FloatArray) -> tuple[FloatArray, FloatArray]:
            if not (rho > 1.0).any():
                z = np.zeros_like(rho)
                return z, z
            stage = StageState(max_backlog_s=timeout_s)
            b0 = np.empty_like(rho)
            b1 = np.empty_like(rho)
            for j in range(rho.size):
                b0[j], b1[j] = stage.advance(float(rho[j]), float(dt[j]))
            return b0, b1

        c0, c1 = fluid(rho_c)
        a0, a1 = fluid(rho_a)
        p1, r1 = wait_params_array(
            rho_c, np.full_like(lam, st.ded_cpu / par), bm.cpu_mean, bm.cpu_cs2
        )
        p2, r2 = wait_params_array(rho_a, np.full_like(lam, st.ded_acc), bm.acc_mean, bm.acc_cs2)
        strata = Strata(
            count=np.ones_like(lam),
            service_ms=np.full_like(lam, float(bm.service_ms[0])),
            penalty_ms=np.zeros_like(lam),
            fc0=c0,
            fc1=c1,
            fa0=a0,
            fa1=a1,
            p1=p1,
            r1=r1,
            p2=p2,
            r2=r2,
            path=np.zeros(lam.size, dtype=np.int64),
        )
        pi = in_time_probability(strata, ctx.config.latency, ctx.timeout_ms)
        per_request = float(bm.base_value.sum())  # E[value × quality] of a baseline request
        return float((rt.arrivals * (1.0 - pi)).sum()) * per_request


def oracle_for(ctx: SimContext) -> Oracle:
    """The context's oracle (built once, shared by every policy of the run)."""
    got = ctx.oracle_cache.get("oracle")
    if got is None:
        got = Oracle(ctx)
        ctx.oracle_cache["oracle"] = got
    assert isinstance(got, Oracle)
    return got
