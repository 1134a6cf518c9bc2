"""The oracle: the most incremental value any policy could draw from a run's capacity.

Pure: no clock, no randomness. It knows everything in advance — every step's arrivals, every
pool's level at every instant, the value curves — and has no control lag. It gives two bounds,
written on every run's ``oracle.bound`` line: the *loose* bound (``oracle_incremental``: every
unit 100 % busy with no queueing, devices shared between the levers in fractions) and the
*feasible* bound (``feasible_bound``: the same LP under the rules the engine imposes on every
policy), which the ``oracle`` policy runs through the engine's real queues.

The loose bound
---------------
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

The feasible bound
------------------
The same LP, stretch by stretch, with the capacities a policy can actually fill
(:class:`FeasibleRules`):

* **the servers' admission rule.** Every budget is the level times
  :func:`headroom.defences.admission.admitted_share` of its stage, the function and the inputs
  the servers of both engines use: on the mixed replicas' CPU stage ``(dedicated + level) ÷
  parallelism`` servers with a baseline request's CPU time, on their accelerator stage
  ``dedicated + RMA's devices`` with its accelerator time, both for RMA's wait budget
  (``pid.wait_budget_share × setpoint``); on the strong replicas their loaded devices with a
  strong request's accelerator time and the coverage controller's budget
  (``coverage.wait_budget_share × setpoint``; a replica on less than one device is one slower
  server). No safety-margin ceiling: that is a policy's choice, not the engine's rule.
* **at least one whole device, loaded.** On the pools both models may use, the strong model
  takes ``m`` of the devices loaded there (present for the whole ``load_s`` before), the rest
  serve RMA. The engine's rule (``RegionRun._set_assignment``) is the one a replica needs: at
  least one whole device, and above that device equivalents (slices) of any size, so ``m`` is
  0 or any amount in ``[m_lo, L]`` (``L`` the loaded shared devices, ``m_lo`` = 1, or less
  where a shared pool holds less than one device). ``m`` takes a continuum of values, so the
  bound covers ``[m_lo, L]`` with intervals :data:`BOUND_STEP` wide and gives each interval
  ``[m_i, m_{i+1}]`` its *optimistic corner*: RMA the devices it has at ``m_i``, the strong model
  those it has at ``m_{i+1}`` (each budget monotone in ``m``, so every split inside the interval
  fits that option's budgets and the LP is monotone in its budgets); each stretch takes the
  best option. LPs are solved only at ``m`` = 0 and the :data:`PRICE_STEP` grid; a corner's
  bound is the smallest of its duals at those LPs' prices (weak duality: any prices give a
  bound). The corners' slack shrinks with the steps: on quickstart seed 9 the bound is 37.4k
  with whole-device corners, 34.5k with prices every 0.5 device, 32.3k every 0.25 (the oracle
  policy reaches 31.1k through the real queues). Pools only the
  strong model may use give it their loaded units. (Only whole numbers ``m``, as before, left
  out the fractional splits the engine allows: a policy holding 1.8 of 2 shared devices for
  the strong model passed the bound on quickstart seed 9, 1.007 of it.)
* **the fail-safe.** While a control outage has left central targets expired — from the expiry
  (``ttl_s``) of the last targets issued before it to the first ones issued after it reaching
  clients (``propagation_s``) — no optional work: those stretches have no budget.
* **the queues' load.** Per-request budgets divide the capacity by the step's request *rate*,
  which is what the engine's queues are loaded with (the arrivals' Poisson noise is already in
  the queue's stochastic wait); the value still counts the stretch's arrivals.
* **the mixed replicas' quota.** An RMA request's extras run on one mixed replica's quota of
  the region's local levels — its threads, or one device, within ``level ÷ count``
  (:meth:`headroom.defences.replicas.MixedReplicas.extras_units`, :meth:`FeasibleRules.
  extras_units`) — and the extras that could not finish within the optional budget at those
  units are trimmed before any work starts (:func:`headroom.sim.context.run_levels`, the
  engine's own call). The quota follows the pools' levels, not any policy's assignment, so in
  each stretch the bound's RMA options are the grid levels trimmed that way, without repeats
  (:meth:`Oracle.menu_levels`): every policy's RMA request runs, costs and earns one of them
  (or nothing, trimmed to the baseline). On precompute-remote, once the local accelerator
  level halves, a replica's quarter device fits 630 of the 800 extras: the bound falls from
  70.1k to 69.4k.

The relief term and the precompute option are the loose bound's. What it leaves loose: the
split ``m`` may change from one stretch to the next for free (a policy pays a reload when
devices move to the strong model), each split interval's corner (under :data:`SPLIT_STEP` of a
device on either lever), and the precompute option still costs no live capacity (the oracle
policy runs its jobs on the remote pools only).

*The oracle policy* (:meth:`Oracle.plan` with the run) assigns the pools itself every step: CPU
and base-model devices to RMA; on the shared pools the strong model gets the ``m`` (0 or a
point of the :data:`SPLIT_STEP` grid on ``[m_lo, L]``, exact budgets) the best option wants now
or within the next load time, so the devices are loaded when the plan
needs them; strong-only pools to the strong model. A count above the replicas it holds
reloads the rest for ``load_s`` (those devices serve neither lever meanwhile), so it is worth
the change only if the next two load times gain by it (:meth:`FeasibleRules.steady_split`;
chasing each step's best count left a slice reloading for ever when it flipped between two
neighbours: quickstart seed 4's oracle reached 0.928 of the bound, 0.956 with the reload
counted). It then solves the LP on the quotas that assignment really holds (loaded devices
only) scaled by the admission rule, at the busiest step's request rate, with RMA's options
trimmed by the replicas' quota in force and over the requests the precompute store does not
serve in the window (the engine runs a cell's plan on its other ``1 − h`` only; planned over
every request, the plan left most of RMA's budget idle once 80 % of the visits were hits),
and the engine runs that plan through its real queues like any policy's. Its precompute planner
follows the bound's choice between a stored result and the live levers: a visit's live
alternative is, per cell, its best live option net of the capacity it takes at the joint LP's
prices (:meth:`Oracle.live_alternative`), so a segment is precomputed only where a stored result
beats it (on precompute-remote the LP gives premium visits to RMA: its best stored result adds
0.040, live RMA about 0.19), and it times its jobs on the visits to come
(sim/precompute_sim.py, *The oracle policy's jobs*). On precompute-remote (seed 11) that took it
from 59.8k (0.862 of the bound) to 66.7k (0.961).
So where the oracle reaches the bound, the bound is attainable; the gap is what the reloads and
the queues' noise cost.

**Precompute** (scenarios with the precompute fields, regions that can run it). A visit that finds a
stored result is served from it instead of the live path (sim/precompute_sim.py), so each cell gets
one more option, ``pre``, worth ``Δ*_s`` per request (the most a stored result ever adds to a visit
of segment ``s``), costing no live capacity, with ``x_{c,pre} ≤ ρ_{w,s}``: the share of the window's
treatment visits of the segment whose user first visited at least a job's duration and the topic's
delay earlier (:func:`headroom.sim.precompute_sim.returning_share`; no policy can serve another
visit from a result). A policy whose hits are ``h_s ≤ ρ_{w,s}`` of a segment's visits in a window
earns ``(1 − h_s)·(live gain) + h_s·(hit gain)`` per request: the live allocation scaled by
``1 − h_s`` still fits the budgets and ``x_{c,pre} = h_s`` is feasible, so the joint LP bounds it.
Stretches are also cut at window edges (one ``ρ`` each). Counting every visit at ``Δ*`` *on top of*
the live LP, as before, counted a hit's request twice.

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

import itertools
import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
from scipy.optimize import linprog
from scipy.sparse import csc_array

from headroom.controllers.config import ControlConfig
from headroom.defences.admission import admitted_share
from headroom.sim.context import (
    Plan,
    SimContext,
    baseline_plan,
    build_mix,
    extras_units,
    run_levels,
)
from headroom.sim.latency import StageState, Strata, in_time_probability, wait_params_array
from headroom.sim.precompute_sim import precompute_capable, precompute_static, returning_share

__all__ = [
    "BOUND_STEP",
    "GRID_RATIO",
    "PRICE_STEP",
    "SPLIT_STEP",
    "Oracle",
    "OracleBound",
    "oracle_for",
]

FloatArray = npt.NDArray[np.float64]
# per breakpoint, the bound's corner options (n, S, 4): duals at the price options' prices
Corners = FloatArray

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
# The strong model's share of the shared pools (devices above its first whole one) in steps of
# this many devices: the bound's options cover every split between two steps (module docstring,
# *at least one whole device*), the oracle policy picks among the steps themselves.
SPLIT_STEP = 0.125
# The bound's LPs (their prices) are solved at the strong model's shares PRICE_STEP apart; the
# dual is then evaluated, with the prices of the two solved shares around it (the smaller of the
# two duals: each is a bound), on every BOUND_STEP-wide interval's optimistic corner. Budgets
# cost nothing to evaluate, LPs do: this keeps the LPs near the whole-device count and the
# corners' slack small.
PRICE_STEP = 0.25
BOUND_STEP = 1.0 / 32.0
_CORNER_BLOCK = 512  # stretches per block of the corners' duals (memory: block × S × P)
_PRE_KEY_STEPS = 20
_ZERO_KEY = -(10**9)
# the oracle policy plans its live path for the window's precompute hits rounded down to a
# multiple of 1/_HIT_GRID of each segment's treatment requests
_HIT_GRID = 40
# the oracle policy compares its strong-model splits on a grid this many points apart (2.5 %)
_CHOICE_KEY_STEPS = 5


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


def _highs_binding() -> tuple[Any, Any]:
    """The HiGHS binding ``linprog(method="highs")`` itself solves with, and the options it
    passes HiGHS with its defaults (presolve on, the dual simplex, no output): the same solver
    path, so the same answer bit for bit. The oracle solves its thousands of small LPs through
    it directly (:class:`_Lp`). ``(None, None)`` on a scipy without that binding: every LP then
    goes through linprog."""
    try:
        from scipy.optimize._highspy import _core
        from scipy.optimize._linprog_highs import s_c

        opts = _core.HighsOptions()
        opts.presolve = "on"
        opts.highs_debug_level = _core.HighsDebugLevel.kHighsDebugLevelNone
        opts.log_to_console = False
        opts.output_flag = False
        opts.simplex_strategy = s_c.SimplexStrategy.kSimplexStrategyDual
        for name in ("_Highs", "HighsLp", "MatrixFormat", "HighsModelStatus"):
            getattr(_core, name)
    except (ImportError, AttributeError, TypeError):  # pragma: no cover - another scipy
        return None, None
    return _core, opts


_highs, _HIGHS_OPTIONS = _highs_binding()


class _Lp:
    """One of the oracle's LPs, ``min obj·x`` s.t. ``a_ub·x ≤ b_ub``, ``lb ≤ x ≤ ub``, whose
    objective and matrix are fixed and whose right-hand side and bounds change per solve.

    The model is built once, the matrix in HiGHS's column-wise form. :meth:`solve` sets the
    right-hand side and bounds and hands HiGHS the model and options
    ``linprog(method="highs")`` would (so the same solution and duals, bit for bit) without
    linprog's per-call input checks, option validation and result assembly, which cost about
    three times the solve itself at the oracle's sizes. ``via_linprog`` (or a scipy without
    that binding): through :func:`scipy.optimize.linprog` itself."""

    def __init__(self, obj: FloatArray, a_ub: FloatArray) -> None:
        self.obj = obj
        self.a_ub = a_ub
        self._model: Any = None
        if _highs is not None:
            # the model HiGHS is handed (it takes a copy): objective and matrix set once
            csc = csc_array(a_ub)
            n = obj.size
            m = a_ub.shape[0]
            lp = _highs.HighsLp()
            lp.num_col_ = n
            lp.num_row_ = m
            lp.a_matrix_.num_col_ = n
            lp.a_matrix_.num_row_ = m
            lp.a_matrix_.format_ = _highs.MatrixFormat.kColwise
            lp.col_cost_ = obj
            lp.row_lower_ = np.full(m, -np.inf)
            lp.a_matrix_.start_ = csc.indptr
            lp.a_matrix_.index_ = csc.indices
            lp.a_matrix_.value_ = csc.data
            self._model = lp

    def solve(
        self, b_ub: FloatArray, lb: FloatArray, ub: FloatArray, via_linprog: bool = False
    ) -> tuple[FloatArray, FloatArray]:
        """The optimal ``x`` and the inequality rows' duals (``ineqlin.marginals``)."""
        if via_linprog or self._model is None:
            res = linprog(
                self.obj,
                A_ub=self.a_ub,
                b_ub=b_ub,
                bounds=np.column_stack([lb, ub]),
                method="highs",
            )
            if res.status != 0:  # pragma: no cover - the origin is always feasible
                raise RuntimeError(f"oracle LP failed: {res.message}")
            return np.asarray(res.x, dtype=np.float64), np.asarray(
                res.ineqlin.marginals, dtype=np.float64
            )
        lp = self._model
        lp.col_lower_ = lb
        lp.col_upper_ = ub
        lp.row_upper_ = b_ub
        highs = _highs._Highs()
        highs.passOptions(_HIGHS_OPTIONS)
        highs.passModel(lp)
        highs.run()
        status = highs.getModelStatus()
        if status != _highs.HighsModelStatus.kOptimal:  # pragma: no cover - always feasible
            raise RuntimeError(f"oracle LP failed: {highs.modelStatusToString(status)}")
        sol = highs.getSolution()
        return np.array(sol.col_value, dtype=np.float64), np.array(sol.row_dual, dtype=np.float64)


@dataclass(slots=True)
class _Menu:
    """One set of RMA options (extra candidates) with their per-cell gains and per-request
    costs, and its LPs (built at the first solve)."""

    levels: tuple[int, ...]
    g_rma: FloatArray  # (J, C)
    c_rma: FloatArray  # (4, J): ms of cpu, R, S, RS per request
    lp: _Lp | None = None
    lp_pre: _Lp | None = None


class FeasibleRules:
    """The rules the engine imposes on every policy, as capacities for the oracle's LP
    (module docstring, *The feasible bound*): per region and instant, the capacity options
    ``(cpu, R, S, RS)`` a policy could hold, each already scaled by the servers' admission rule
    (:func:`headroom.defences.admission.admitted_share`, the function both engines' servers
    use, with the same inputs), one option per whole number of strong-model devices on the
    pools both models may use, and nothing while central targets are expired."""

    def __init__(self, ctx: SimContext) -> None:
        self.ctx = ctx
        cfg = ControlConfig.from_scenario(ctx.scenario)
        self.rma_budget_ms = cfg.pid.wait_budget_share * cfg.setpoint_ms
        self.sbm_budget_ms = cfg.coverage.wait_budget_share * cfg.setpoint_ms
        self.strong_ms = ctx.n0 * ctx.costs.strong_accelerator_ms
        self.load_s = float(ctx.scenario.models.strong.load_s)
        bm = build_mix(ctx, baseline_plan(ctx))
        self.cpu_mean = bm.cpu_mean
        self.acc_mean = bm.acc_mean
        self.par = ctx.config.latency.cpu_parallelism
        self.expired = self._expired_spans(
            float(cfg.interval_s), float(cfg.ttl_s), float(ctx.config.propagation_s)
        )

    # -- the fail-safe ----------------------------------------------------------------------

    def _expired_spans(
        self, interval: float, ttl: float, propagation: float
    ) -> tuple[tuple[float, float, int | None], ...]:
        """Spans ``[a, b)`` in which a central policy's targets are expired because a control
        outage silenced it (region index, None for every region): from the expiry of the last
        targets issued before the outage to the first ones issued after it reaching clients."""
        out: list[tuple[float, float, int | None]] = []
        names = [r.name for r in self.ctx.scenario.regions]
        for r, rt in enumerate(self.ctx.traces.regions):
            for a, b in rt.outages:
                k_last = math.ceil(a / interval - 1e-9) - 1  # last tick strictly before a
                start = k_last * interval + ttl if k_last >= 1 else a
                # the plane steps as soon as the outage ends (sim/engine.py), tick or not
                end = b + propagation
                if end > start:
                    out.append((max(start, 0.0), min(end, self.ctx.duration_s), r))
        del names
        return tuple(out)

    def expired_edges(self) -> FloatArray:
        return np.array(sorted({x for a, b, _ in self.expired for x in (a, b)}), dtype=np.float64)

    def is_expired(self, r: int, t: float) -> bool:
        return any(a <= t < b and (rr is None or rr == r) for a, b, rr in self.expired)

    # -- the mixed replicas' quota -------------------------------------------------------------

    def extras_units(self, r: int, t: float) -> tuple[float, float]:
        """The CPU and accelerator units one RMA request's extras run on at ``t``, with the
        levels the engine gives them whatever the pools' assignment
        (:func:`headroom.sim.context.extras_units`)."""
        levels = [p.level_at(t) for p in self.ctx.traces.regions[r].pools]
        return extras_units(self.ctx, r, levels)

    # -- admission --------------------------------------------------------------------------

    def caps_for(self, r: int, cpu: float, rma_acc: float, sbm_acc: float) -> FloatArray:
        """``(cpu, R, S, RS)`` optional work the servers admit on these quotas (cores, base-model
        devices, loaded strong devices)."""
        st = self.ctx.regions[r]
        k_c = admitted_share((st.ded_cpu + cpu) / self.par, self.cpu_mean, self.rma_budget_ms)
        k_a = admitted_share(st.ded_acc + rma_acc, self.acc_mean, self.rma_budget_ms)
        k_s = admitted_share(sbm_acc, self.strong_ms, self.sbm_budget_ms) if sbm_acc > 0 else 0.0
        c, ra, sa = cpu * k_c, rma_acc * k_a, sbm_acc * k_s
        return np.array([c, ra, sa, ra + sa], dtype=np.float64)

    def options_at(self, r: int, t: float) -> FloatArray:
        """The bound's capacity options at ``t`` (options, 4): no strong model on the pools both
        models may use, then one per :data:`BOUND_STEP` interval of the strong model's share of
        them (module docstring, *at least one whole device*: each interval's optimistic corner,
        so every split the engine allows fits one option)."""
        price, corners = self.bound_options(r, t)
        return np.vstack([price[:1], corners])

    def bound_options(self, r: int, t: float) -> tuple[FloatArray, FloatArray]:
        """The bound's options at ``t``: ``price`` (P, 4), the exact options at the strong
        model's shares 0 and the :data:`PRICE_STEP` grid (their LPs give the prices), and
        ``corners`` (S, 4), the optimistic corner of every :data:`BOUND_STEP` interval (its dual
        is evaluated with those prices)."""
        pools = self._pools_at(r, t, PRICE_STEP)
        if pools is None:
            return np.zeros((1, 4)), np.zeros((0, 4))
        cpu, base_only, shared, strong_only, pgrid = pools
        fine = self._pools_at(r, t, BOUND_STEP)
        assert fine is not None
        grid = fine[4]
        price = np.stack(
            [self.caps_for(r, cpu, base_only + shared - m, strong_only + m) for m in [0.0, *pgrid]]
        )
        spans = [(grid[0], grid[0])] if len(grid) == 1 else list(itertools.pairwise(grid))
        corners = np.zeros((len(spans), 4))
        for k, (lo, hi) in enumerate(spans):
            corners[k] = self.caps_for(r, cpu, base_only + shared - lo, strong_only + hi)
        return price, corners

    def split_options(self, r: int, t: float) -> tuple[list[float], FloatArray]:
        """Exact capacity options at ``t`` and the devices of the shared pools each gives the
        strong model: none, or a point of the :data:`SPLIT_STEP` grid on ``[m_lo, L]`` (what
        the oracle policy may hold; :meth:`options_at` covers the splits between them)."""
        pools = self._pools_at(r, t, SPLIT_STEP)
        if pools is None:
            return [0.0], np.zeros((1, 4))
        cpu, base_only, shared, strong_only, grid = pools
        ms = [0.0, *grid]
        return ms, np.stack(
            [self.caps_for(r, cpu, base_only + shared - m, strong_only + m) for m in ms]
        )

    def _pools_at(
        self, r: int, t: float, step: float
    ) -> tuple[float, float, float, float, list[float]] | None:
        """``(cpu, base-only devices, shared devices, loaded strong-only devices, grid)`` at
        ``t``, with ``grid`` the strong model's possible shares of the loaded shared devices
        above 0 (``m_lo``, the points ``step`` apart after it, ``L``); None while targets are
        expired."""
        ctx = self.ctx
        st = ctx.regions[r]
        rt = ctx.traces.regions[r]
        if self.is_expired(r, t):
            return None
        cpu = base_only = shared = shared_loaded = strong_only = 0.0
        smallest = math.inf  # the smallest loaded shared pool (a replica may hold all of it)
        for i, p in enumerate(rt.pools):
            key = p.key
            if key.remote:
                continue
            level = p.level_at(t)
            if key.resource == "cpu":
                cpu += level
                continue
            loaded = _loaded_at(p, t, self.load_s)
            if st.base_ok[i] and st.strong_ok[i]:
                shared += level
                shared_loaded += loaded
                if loaded > 1e-9:
                    smallest = min(smallest, loaded)
            elif st.base_ok[i]:
                base_only += level
            elif st.strong_ok[i]:
                strong_only += loaded
        grid: list[float] = []
        if shared_loaded > 1e-9:
            lo = min(1.0, smallest)
            n = math.floor((shared_loaded - lo) / step + 1e-9)
            grid = [lo + k * step for k in range(n + 1)]
            if shared_loaded - grid[-1] > 1e-9:
                grid.append(shared_loaded)
        return cpu, base_only, shared, strong_only, grid

    def shared_split(self, r: int, t: float, lam: float, oracle: Oracle) -> float:
        """Devices of the shared pools the best option at ``t`` gives the strong model, for
        ``lam`` requests per second."""
        ms, opts = self.split_options(r, t)
        lv = oracle.menu_levels(self.extras_units(r, t))
        best, best_v = 0, -1.0
        for o in range(opts.shape[0]):
            v = oracle.solution(oracle.budgets(opts[o], lam), lv).value
            if v > best_v + 1e-12:
                best, best_v = o, v
        return ms[best]

    def steady_split(
        self,
        r: int,
        now: float,
        lam: float,
        oracle: Oracle,
        held: tuple[tuple[float, float], ...] = (),
    ) -> float:
        """Devices of the shared pools to give the strong model at ``now``: the count whose
        plans are worth most over the next two load times (``now`` and seven instants
        ``load_s / 4`` apart, each at its own rate; a count not yet loaded at an instant is
        worth the largest one that is). ``held``: the strong model's replicas on the shared
        pools now, ``(units, loaded_at)`` (the engine's ``RegionRun.tranches``): a count above
        them loads the rest for ``load_s`` — those devices serve neither lever meanwhile — and
        one below keeps the oldest. Counting that reload, instead of chasing the best count of
        every step (which left a slice reloading for ever when the best count flipped between
        two neighbours), is what holds a count."""
        samples = [(now, lam)]
        if self.load_s > 0:
            for k in range(1, 8):
                t = now + 0.25 * k * self.load_s
                if t < self.ctx.duration_s:
                    samples.append((t, oracle.rate_at(r, t)))
        resident = sum(u for u, _ in held)
        cands: set[float] = {0.0}
        pools_at = [self._pools_at(r, t, SPLIT_STEP) for t, _ in samples]
        for pools in pools_at:
            if pools is not None:
                cands.update(pools[4])
        totals = dict.fromkeys(cands, 0.0)
        for (t, rate), pools in zip(samples, pools_at, strict=True):
            if pools is None:
                continue
            cpu, base_only, shared, strong_only, grid = pools
            lv = oracle.menu_levels(self.extras_units(r, t))
            ready = sum(u for u, at in held if at <= t + 1e-9)
            for m in cands:
                m_t = max([0.0, *(g for g in grid if g <= m + 1e-9)])
                if m_t > resident + 1e-9:
                    s = ready + (m_t - resident if t >= now + self.load_s - 1e-9 else 0.0)
                else:
                    s = min(m_t, ready)
                caps = self.caps_for(r, cpu, base_only + shared - m_t, strong_only + min(s, m_t))
                totals[m] += oracle.choice_value(oracle.budgets(caps, rate), lv)
        best, best_v = 0.0, -1.0
        for m in sorted(cands):
            if totals[m] > best_v + 1e-12:
                best, best_v = m, totals[m]
        return best

    def series(self, r: int) -> tuple[FloatArray, FloatArray, Corners, list[tuple[float, float]]]:
        """Breakpoints, the price options in force from each (n, P, 4), the corners (n, S,
        4) (:meth:`bound_options`; a breakpoint with fewer options repeats its first price
        option, which never raises the max) and the units an RMA request's extras run on from
        each (:meth:`extras_units`: they change only with the pools' levels)."""
        ctx = self.ctx
        rt = ctx.traces.regions[r]
        pts = {0.0}
        for p in rt.pools:
            for t in p.times.tolist():
                pts.add(float(t))
                if self.load_s > 0:
                    pts.add(float(t) + self.load_s)
        for a, b, rr in self.expired:
            if rr is None or rr == r:
                pts.update((a, b))
        times = np.array(sorted(x for x in pts if 0.0 <= x < ctx.duration_s))
        opts = [self.bound_options(r, float(t)) for t in times.tolist()]
        n_opt = max(o[0].shape[0] for o in opts)
        n_sub = max(o[1].shape[0] for o in opts)
        caps = np.zeros((times.size, n_opt, 4))
        corners = np.zeros((times.size, n_sub, 4))
        for j, (price, cor) in enumerate(opts):
            caps[j, : price.shape[0]] = price
            caps[j, price.shape[0] :] = price[0]
            corners[j, : cor.shape[0]] = cor
            corners[j, cor.shape[0] :] = price[0]
        return times, caps, corners, [self.extras_units(r, float(t)) for t in times.tolist()]


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
        self.g_sbm = pop.v_mean * (ctx.q_strong - ctx.q_base)  # (C,)
        # per-request costs (ms) of each option on the four constrained resources
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
        self._solutions: dict[
            tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...] | None], _Solution
        ] = {}
        self._plans: dict[
            tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...] | None], Plan
        ] = {}
        static = precompute_static(ctx)
        # Δ*_s per cell: the most a stored result adds to one visit (0 without precompute)
        self.pre_gain = None if static is None else np.asarray(static.best_gain[pop.seg])
        self._menus: dict[tuple[int, ...], _Menu] = {}
        self._menu(self.levels)  # the full grid: the loose bound's (no replica's quota)
        self._bound: OracleBound | None = None
        self._feasible: OracleBound | None = None
        self._losses: dict[int, float] = {}
        self.rules = FeasibleRules(ctx)
        # per region, the budget key and RMA menu of the oracle policy's plan in force
        self._in_force: dict[int, tuple[tuple[int, ...], tuple[int, ...]]] = {}
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
                loaded = _loaded_at(p, t, load)
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

    def _menu(self, levels: tuple[int, ...]) -> _Menu:
        """The RMA options ``levels`` (extra candidates) with their gains and costs, built
        once per distinct set."""
        got = self._menus.get(levels)
        if got is not None:
            return got
        ctx = self.ctx
        costs = ctx.costs
        g = []
        for e in levels:
            q, _ = ctx.rma_quality(e)
            g.append(ctx.pop.v_mean * (q - ctx.q_base))
        ex = np.array(levels, dtype=np.float64)
        menu = _Menu(
            levels=levels,
            g_rma=np.array(g) if g else np.zeros((0, ctx.pop.n_cells)),
            c_rma=np.stack(
                [
                    ex * costs.base_cpu_ms,
                    ex * costs.base_accelerator_ms,
                    0 * ex,
                    ex * costs.base_accelerator_ms,
                ]
            ),
        )
        self._menus[levels] = menu
        return menu

    def _lp(self, menu: _Menu, pre: bool) -> _Lp:
        """``menu``'s live LP (``pre``: the joint one with the stored-result option), built at
        its first use and kept."""
        if pre:
            if menu.lp_pre is None:
                menu.lp_pre = _Lp(*self._build_lp(True, menu.levels))
            return menu.lp_pre
        if menu.lp is None:
            menu.lp = _Lp(*self._build_lp(False, menu.levels))
        return menu.lp

    def menu_levels(self, units: tuple[float, float] | None) -> tuple[int, ...]:
        """The RMA options left when a request's extras run on ``units`` (CPU, accelerator;
        :meth:`headroom.defences.replicas.MixedReplicas.extras_units`): each grid level trimmed
        to the extras that finish within the optional budget on them (:func:`run_levels`, the
        engine's rule), without repeats or 0 (a fully trimmed request is a baseline one).
        None: the full grid."""
        if units is None:
            return self.levels
        return tuple(sorted(set(run_levels(self.ctx, self.levels, units)) - {0}))

    def _build_lp(
        self, pre: bool, levels: tuple[int, ...] | None = None
    ) -> tuple[FloatArray, FloatArray]:
        """Objective and constraint matrix; variables cell-major, per cell ``[rma_0 ..
        rma_{J-1}, sbm]`` and, with ``pre``, the stored-result option last (gain Δ*, no live
        cost; its bound, the returning share, is set per solve). ``levels``: the RMA options
        (None: the full grid)."""
        menu = self._menu(self.levels if levels is None else levels)
        c_n = self.share.size
        j_n = len(menu.levels)
        w = j_n + (2 if pre else 1)
        obj = np.zeros(c_n * w)
        a_ub = np.zeros((c_n + 4, c_n * w))
        for c in range(c_n):
            base = c * w
            obj[base : base + j_n] = -self.share[c] * menu.g_rma[:, c]
            obj[base + j_n] = -self.share[c] * self.g_sbm[c]
            if pre:
                assert self.pre_gain is not None
                obj[base + j_n + 1] = -self.share[c] * self.pre_gain[c]
            a_ub[c, base : base + w] = 1.0
            a_ub[c_n:, base : base + j_n] = self.share[c] * menu.c_rma
            a_ub[c_n:, base + j_n] = self.share[c] * self.c_sbm
        return obj, a_ub

    def _bounds(self, rho: FloatArray | None, j_n: int | None = None) -> list[tuple[float, float]]:
        """Variable bounds (the layout of :meth:`_build_lp`); ``rho``: the returning share of
        each segment (the stored-result option's cap), None for the live LP; ``j_n``: the
        number of RMA options (None: the full grid's)."""
        lb, ub = self._bound_arrays(rho, j_n)
        return list(zip(lb.tolist(), ub.tolist(), strict=True))

    def _bound_arrays(
        self, rho: FloatArray | None, j_n: int | None = None
    ) -> tuple[FloatArray, FloatArray]:
        """:meth:`_bounds` as the lower and the upper bounds' arrays."""
        j_n = len(self.levels) if j_n is None else j_n
        c_n = self.share.size
        cols = [np.ones((c_n, j_n)), np.full((c_n, 1), float(self.elig))]
        if rho is not None:
            rho_c = np.asarray(rho, dtype=np.float64)[self.ctx.pop.seg]
            cols.append(np.minimum(rho_c, 1.0)[:, None])
        ub = np.hstack(cols).reshape(-1)
        return np.zeros(ub.size), ub

    def _solve(
        self,
        key: tuple[int, ...],
        rho_key: tuple[int, ...] | None = None,
        levels: tuple[int, ...] | None = None,
    ) -> _Solution:
        """The LP at a budget grid point with the RMA options ``levels`` (None: the full
        grid); with ``rho_key``, the joint LP with the stored-result option open to ``rho_key
        / RHO_GRID`` of each segment's requests (its ``h`` then depends on the real returning
        shares: :meth:`_h_pre`)."""
        lv = self.levels if levels is None else levels
        got = self._solutions.get((lv, key, rho_key))
        if got is not None:
            return got
        pre = rho_key is not None
        menu = self._menu(lv)
        b = np.array([0.0 if k == _ZERO_KEY else GRID_RATIO**k for k in key])
        c_n = self.share.size
        j_n = len(lv)
        b_ub = np.concatenate([np.ones(c_n), b])
        lb, ub = self._bound_arrays(None if rho_key is None else np.array(rho_key) / RHO_GRID, j_n)
        x_all, duals = self._lp(menu, pre).solve(b_ub, lb, ub)
        x = np.clip(x_all.reshape(c_n, j_n + (2 if pre else 1)), 0.0, None)
        y = np.clip(-duals[c_n:], 0.0, None)
        v_rma = float((self.share[:, None] * x[:, :j_n] * menu.g_rma.T).sum())
        v_sbm = float((self.share * x[:, j_n] * self.g_sbm).sum())
        v_pre = float((self.share * x[:, j_n + 1] * self.pre_gain).sum()) if pre else 0.0
        sol = _Solution(
            x_rma=x[:, :j_n].T.copy(),
            x_sbm=x[:, j_n].copy(),
            y=y,
            h=0.0 if pre else self._h(y, lv),
            value=v_rma + v_sbm + v_pre,
            value_rma=v_rma,
            value_sbm=v_sbm,
            value_pre=v_pre,
        )
        self._solutions[(lv, key, rho_key)] = sol
        return sol

    def _h_pre(
        self, y: FloatArray, rho: FloatArray, levels: tuple[int, ...] | None = None
    ) -> FloatArray:
        """``Σ_c sh_c φ_c(y)`` for each row of returning shares ``rho`` (n, S): per cell the
        best use of one request at prices ``y`` — the options by reduced value, each up to its
        cap (RMA 1, strong the eligible share, precompute the returning share), until the
        request is used up (a fractional knapsack of size one: exact). Without precompute
        (no stored-result gain, or ``rho`` 0) it is the live LP's ``h``. ``levels``: the RMA
        options (None: the full grid)."""
        return np.asarray(self._phi(y, rho, levels) @ self.share, dtype=np.float64)

    def _phi(
        self, y: FloatArray, rho: FloatArray, levels: tuple[int, ...] | None = None
    ) -> FloatArray:
        """``φ_c(y)`` per row of ``rho`` and per cell (n, C): :meth:`_h_pre` before its sum."""
        menu = self._menu(self.levels if levels is None else levels)
        r_rma = menu.g_rma - (y @ menu.c_rma)[:, None]
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
        return phi

    def _key(self, b: FloatArray) -> tuple[int, ...]:
        out = []
        for v in b.tolist():
            out.append(_ZERO_KEY if v <= 0 else math.floor(math.log(v) / _LOG_RATIO + 1e-12))
        return tuple(out)

    def _h(self, y: FloatArray, levels: tuple[int, ...] | None = None) -> float:
        """The live LP's ``h``: :meth:`_h_pre` with no stored result."""
        return float(self._h_pre(y, np.zeros((1, len(self.ctx.segment_names))), levels)[0])

    def budgets(self, caps: FloatArray, arrivals_per_s: float) -> FloatArray:
        """Per treatment request: ms of work each resource affords at this arrival rate."""
        n = arrivals_per_s * self.ctx.treat
        if n <= 0:
            return np.zeros(4)
        return np.asarray(caps * 1000.0 / n, dtype=np.float64)

    # -- the oracle as a policy -----------------------------------------------------------

    def solution(self, b: FloatArray, levels: tuple[int, ...] | None = None) -> _Solution:
        """The LP's solution at the budgets ``b`` rounded down onto the grid."""
        return self._solve(self._key(b), levels=levels)

    def choice_value(self, b: FloatArray, levels: tuple[int, ...] | None = None) -> float:
        """The LP's value at the budgets ``b`` rounded down onto every
        :data:`_CHOICE_KEY_STEPS`-th grid point: cheap (few distinct LPs), for comparing the
        oracle policy's splits only; its plan is solved at the fine grid."""
        key = tuple(
            k if k == _ZERO_KEY else k // _CHOICE_KEY_STEPS * _CHOICE_KEY_STEPS
            for k in self._key(b)
        )
        return self._solve(key, levels=levels).value

    def _plan_of(
        self,
        key: tuple[int, ...],
        levels: tuple[int, ...] | None = None,
        hit_key: tuple[int, ...] | None = None,
    ) -> Plan:
        """The plan of the LP at the budget grid point ``key`` with the RMA options ``levels``;
        ``hit_key``: the share of each segment's treatment requests the precompute store
        serves, in steps of 1/:data:`_HIT_GRID` (:meth:`_live_x`)."""
        lv = self.levels if levels is None else levels
        plan = self._plans.get((lv, key, hit_key))
        if plan is None:
            if hit_key is None:
                sol = self._solve(key, levels=lv)
                x_rma, x_sbm = sol.x_rma, sol.x_sbm
            else:
                x_rma, x_sbm = self._live_x(key, lv, hit_key)
            used = [j for j in range(len(lv)) if x_rma[j].sum() > 1e-12]
            pop_c = self.share.size
            rma = x_rma[used] if used else np.zeros((0, pop_c))
            z = np.zeros(pop_c)
            plan = Plan(tuple(lv[j] for j in used), rma, x_sbm, z, z)
            self._plans[(lv, key, hit_key)] = plan
        return plan

    def _live_x(
        self, key: tuple[int, ...], levels: tuple[int, ...], hit_key: tuple[int, ...]
    ) -> tuple[FloatArray, FloatArray]:
        """The live LP's plan when a share ``h_s = hit_key_s / _HIT_GRID`` of segment ``s``'s
        treatment requests is served from the precompute store: the engine runs a cell's plan
        on its other ``1 − h`` only (:func:`headroom.defences.plan.live_share`), so the LP
        allocates the budgets (per treatment request) over those — each cell's options sum to
        at most ``1 − h``, the strong model's to ``eligible × (1 − h)`` — and the plan is that
        allocation over ``1 − h`` (what the engine scales back by it). ``h`` is rounded down:
        the engine then runs at most the LP's allocation."""
        lp = self._lp(self._menu(levels), pre=False)
        seg = self.ctx.pop.seg
        keep = 1.0 - np.array(hit_key, dtype=np.float64)[seg] / _HIT_GRID  # (C,)
        b = np.array([0.0 if k == _ZERO_KEY else GRID_RATIO**k for k in key])
        c_n = self.share.size
        j_n = len(levels)
        ub = np.hstack([np.repeat(keep[:, None], j_n, axis=1), (self.elig * keep)[:, None]])
        x_all, _ = lp.solve(np.concatenate([keep, b]), np.zeros(ub.size), ub.reshape(-1))
        x = np.clip(x_all.reshape(c_n, j_n + 1), 0.0, None)
        with np.errstate(divide="ignore", invalid="ignore"):
            x = np.where(keep[:, None] > 0, x / keep[:, None], 0.0)
        return np.clip(x[:, :j_n].T, 0.0, 1.0), np.clip(x[:, j_n], 0.0, self.elig)

    def rate_at(self, r: int, t: float) -> float:
        """The request rate of the step holding ``t``."""
        return float(self.ctx.traces.regions[r].rate[self.ctx.traces.step_of(t)])

    def _peak_rate(self, r: int, now: float, span: float, by_rate: bool = False) -> float:
        """The busiest step's arrival rate over ``[now, now + span)`` (``by_rate``: the
        request rate the engine's queues see)."""
        tr = self.ctx.traces
        i0 = tr.step_of(now)
        i1 = tr.step_of(max(now + span - 1e-9, now))
        if by_rate:
            arr = tr.regions[r].rate[i0 : i1 + 1]
        else:
            arr = tr.regions[r].arrivals[i0 : i1 + 1] / np.maximum(tr.step_len[i0 : i1 + 1], 1e-12)
        return float(arr.max()) if arr.size else 0.0

    def plan(self, r: int, now: float, span: float = 0.0, run: Any = None) -> Plan | None:
        """The LP plan for ``[now, now + span)`` at the busiest step's arrivals, so the plan
        fits every step (the engine splits at every capacity change).

        Without ``run``: the loose bound's plan (the capacity in force at ``now``, every unit
        busy). With ``run`` (a :class:`headroom.sim.engine.RegionRun`): the feasible plan, run
        through the engine's real queues — the oracle assigns every pool (CPU and base-model
        devices to RMA; on the pools both models may use, the whole devices the best feasible
        option wants now or within one load time go to the strong model, so they are loaded
        when it needs them), and plans on the quotas that assignment really holds (loaded
        devices only), scaled by the servers' admission rule. Nothing (None: the baseline)
        while a central policy's targets would be expired."""
        lam = self._peak_rate(r, now, span, by_rate=run is not None)
        if run is None:
            return self._plan_of(self._key(self.budgets(self.capacity_at(r, now), lam)))
        rules = self.rules
        if rules.is_expired(r, now):
            return None
        m = rules.steady_split(r, now, lam, self, self._held(run))
        self._assign(run, now, m)
        q = run.quotas
        caps = rules.caps_for(r, q.rma_cpu + q.sbm_cpu, q.rma_acc, q.sbm_acc)
        # RMA's options trimmed as the engine trims a request's extras on its replica's quota
        lv = self.menu_levels(run.extras_units)
        key = self._key(self.budgets(caps, lam))
        self._in_force[r] = (key, lv)
        return self._plan_of(key, lv, self._hit_key(run))

    def live_alternative(self, r: int, now: float) -> FloatArray | None:
        """Per segment, what the live levers add to one treatment visit over the base ranking in
        the bound's plan at the budgets of the oracle policy's plan in force (region ``r``,
        window of ``now``): per cell ``φ_c(y)`` with no stored result, at the prices ``y`` of
        the joint LP with the stored-result option (each visit's best live option net of the
        capacity it takes, :meth:`_h_pre`), averaged over the segment's cells. A hit runs
        nothing live, so a stored result is worth serving only where it beats this: the LP
        gives the stored result the visits where it does (module docstring, *Precompute*), and
        the precompute planner follows it (:meth:`headroom.controllers.precompute.UpliftModel.
        against_live`). None before the first plan or without precompute."""
        got = self._in_force.get(r)
        rho_w = returning_share(self.ctx, r)
        if got is None or rho_w is None or self.pre_gain is None:
            return None
        key, lv = got
        w = min(max(int(now // self.ctx.window_s), 0), rho_w.shape[0] - 1)
        rho_key = tuple(int(k) for k in np.ceil(rho_w[w] * RHO_GRID - 1e-9).tolist())
        coarse = tuple(k if k == _ZERO_KEY else k // _PRE_KEY_STEPS * _PRE_KEY_STEPS for k in key)
        sol = self._solve(coarse, rho_key, lv)
        n_s = self.ctx.pop.n_segments
        phi = self._phi(sol.y, np.zeros((1, n_s)), lv)[0]  # (C,)
        seg = self.ctx.pop.seg
        num = np.bincount(seg, weights=self.share * phi, minlength=n_s)
        den = np.bincount(seg, weights=self.share, minlength=n_s)
        return np.asarray(np.where(den > 0, num / np.maximum(den, 1e-300), 0.0), dtype=np.float64)

    @staticmethod
    def _held(run: Any) -> tuple[tuple[float, float], ...]:
        """The strong model's replicas on ``run``'s shared pools, ``(units, loaded_at)``."""
        st = run.static
        out: list[tuple[float, float]] = []
        for i, key in enumerate(st.pools):
            if not key.remote and key.resource != "cpu" and st.base_ok[i] and st.strong_ok[i]:
                out += [(float(u), float(at)) for u, at in run.tranches[i]]
        return tuple(out)

    def _hit_key(self, run: Any) -> tuple[int, ...] | None:
        """The share of each segment's treatment requests the precompute store serves in the
        window ``run`` is in (the engine draws a window's visits when it opens), rounded down
        to a multiple of 1/:data:`_HIT_GRID`; None without hits."""
        hit = getattr(run, "_hit", None)
        if hit is None:
            return None
        seg = self.ctx.pop.seg
        h = np.zeros(self.ctx.pop.n_segments)
        np.maximum.at(h, seg, np.asarray(hit, dtype=np.float64))
        key = tuple(int(k) for k in np.floor(np.clip(h, 0.0, 1.0) * _HIT_GRID + 1e-9).tolist())
        return key if any(key) else None

    @staticmethod
    def _assign(run: Any, now: float, strong_shared: float) -> None:
        """Assign every pool of ``run``'s region (see :meth:`plan`) and refresh its quotas."""
        st = run.static
        left = strong_shared
        for i, key in enumerate(st.pools):
            level = run.level[i]
            if key.remote:
                rma, sbm = 0.0, 0.0
            elif key.resource == "cpu" or (st.base_ok[i] and not st.strong_ok[i]):
                rma, sbm = level, 0.0
            elif st.base_ok[i]:
                sbm = min(left, level)
                left -= sbm
                rma = level - sbm
            else:
                rma, sbm = 0.0, level
            run._set_assignment(i, rma, sbm, now)
        run._refresh_quotas(now, False)

    # -- the bound ----------------------------------------------------------------------------

    def _menus_of(
        self, units: list[tuple[float, float]] | None, seg: npt.NDArray[np.int64]
    ) -> tuple[list[tuple[int, ...]], npt.NDArray[np.int64]]:
        """The distinct RMA menus of the breakpoints' ``units`` (:meth:`menu_levels`) and, per
        stretch (its breakpoint ``seg``), the index of its menu; one full-grid menu without
        ``units``."""
        if units is None:
            return [self.levels], np.zeros(seg.size, dtype=np.int64)
        per_bp = [self.menu_levels(u) for u in units]
        menus = sorted(set(per_bp))
        idx = np.array([menus.index(m) for m in per_bp], dtype=np.int64)
        return menus, idx[seg]

    def _stretch_duals(
        self,
        r: int,
        times: FloatArray,
        caps: FloatArray,
        extra_edges: FloatArray | None = None,
        by_rate: bool = False,
        coarse: bool = False,
        corners: Corners | None = None,
        units: list[tuple[float, float]] | None = None,
    ) -> tuple[FloatArray, FloatArray, FloatArray]:
        """Per stretch of region ``r`` (the steps cut at every capacity breakpoint ``times``,
        the window edges with precompute and ``extra_edges``) and per capacity option (``caps``:
        (breakpoints, options, 4)), the dual bound of the stretch's LP at its real budgets.
        Returns ``dual`` (stretches, options) and the lever shares of each (stretches, options,
        3: rma, sbm, precompute) as ``(dual, shares, n_req)``. ``by_rate``: the per-request
        budgets divide the capacity by the step's request *rate* (what the engine's queues are
        loaded with), while the value still counts its arrivals. ``coarse``: prices from every
        :data:`_PRE_KEY_STEPS`-th grid point (the dual at the real budgets stays a valid bound,
        a little looser; far fewer LPs to solve). ``corners`` (:meth:`FeasibleRules.series`):
        more options, each evaluated at the prices of every option of ``caps`` in its stretch
        (the smallest of those duals; no LP of their own); they follow ``caps``'s options in
        the result. ``units`` (:meth:`FeasibleRules.series`): per breakpoint, the units an RMA
        request's extras run on, which trim the RMA options (:meth:`menu_levels`); None: the
        full grid."""
        ctx = self.ctx
        tr = ctx.traces
        rho_w = returning_share(ctx, r) if precompute_capable(ctx, r) else None
        edges = np.union1d(tr.step_edges, times)
        if extra_edges is not None and extra_edges.size:
            edges = np.union1d(edges, extra_edges)
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
        menus, menu_of = self._menus_of(units, np.maximum(seg, 0))
        length = tr.step_len[step]
        arr = tr.regions[r].arrivals[step].astype(np.float64)
        n_req = arr * dt / length * ctx.treat  # treatment requests in the stretch
        n_load = tr.regions[r].rate[step] * dt * ctx.treat if by_rate else n_req
        n_opt = caps.shape[1]
        duals = np.zeros((dt.size, n_opt))
        shares = np.zeros((dt.size, n_opt, 3))
        prices = np.zeros((dt.size, n_opt, 4))  # each stretch's prices y and h per option
        h_of = np.zeros((dt.size, n_opt))
        rho = None
        if rho_w is not None:
            win = np.minimum((mid // ctx.window_s).astype(np.int64), rho_w.shape[0] - 1)
            rho = rho_w[win]  # (n, S)
        for o in range(n_opt):
            cap = caps[np.maximum(seg, 0), o]  # (n, 4)
            with np.errstate(divide="ignore", invalid="ignore"):
                bud = np.where(
                    n_load[:, None] > 0, cap * 1000.0 * dt[:, None] / n_load[:, None], 0.0
                )
            live = (n_req > 0) & (n_load > 0)
            with np.errstate(divide="ignore", invalid="ignore"):
                kf = np.where(
                    bud > 0, np.floor(np.log(np.where(bud > 0, bud, 1.0)) / _LOG_RATIO + 1e-12), 0
                ).astype(np.int64)
            kf = np.where(bud > 0, kf, _ZERO_KEY)
            if rho is not None or coarse:
                # prices only: every _PRE_KEY_STEPS-th grid point (the dual stays valid)
                kf = np.where(kf == _ZERO_KEY, kf, kf // _PRE_KEY_STEPS * _PRE_KEY_STEPS)
            cols = np.hstack([kf, menu_of[:, None]])
            if rho is not None:
                cols = np.hstack([cols, np.ceil(rho * RHO_GRID - 1e-9).astype(np.int64)])
            rows = np.flatnonzero(live)
            if rows.size == 0:
                continue
            if rho is None and len(menus) < 128:
                # one int64 per row (14 bits a budget: grid keys stay within ±8,000, i.e.
                # budgets 1e-17 .. 1e17 ms; 0 budgets get their own code; 7 bits the menu)
                packed = np.zeros(rows.size, dtype=np.int64)
                for j in range(4):
                    col = np.where(kf[rows, j] == _ZERO_KEY, -8191, kf[rows, j])
                    packed = (packed << 14) | (np.clip(col, -8191, 8191) + 8192)
                packed |= menu_of[rows] << 56
                _, first, inv = np.unique(packed, return_index=True, return_inverse=True)
                uniq = cols[rows[first]]
            else:
                uniq, inv = np.unique(cols[rows], axis=0, return_inverse=True)
            inv = inv.reshape(-1)
            order = np.argsort(inv, kind="stable")
            bounds_ = np.searchsorted(inv[order], np.arange(uniq.shape[0] + 1))
            for g in range(uniq.shape[0]):
                ii = rows[order[bounds_[g] : bounds_[g + 1]]]
                key = tuple(int(k) for k in uniq[g, :4])
                lv = menus[int(uniq[g, 4])]
                nr = n_req[ii]
                # dual bound at the real budgets (and returning shares): Σ N (y·b + h)
                if rho is None:
                    sol = self._solve(key, levels=lv)
                    h_of[ii, o] = sol.h
                else:
                    sol = self._solve(key, tuple(int(k) for k in uniq[g, 5:]), lv)
                    h_of[ii, o] = self._h_pre(sol.y, rho[ii], lv)
                prices[ii, o] = sol.y
                duals[ii, o] = nr * (bud[ii] @ sol.y + h_of[ii, o])
                if sol.value > 0:
                    shares[ii, o] = (
                        np.array([sol.value_rma, sol.value_sbm, sol.value_pre]) / sol.value
                    )
        if corners is not None and corners.shape[1]:
            # one more column: the best corner of each stretch, its dual the smallest over every
            # option's prices (each is a bound), in blocks of stretches
            best = np.zeros(dt.size)
            best_sh = np.zeros((dt.size, 3))
            live = (n_req > 0) & (n_load > 0)
            scale = np.where(live, 1000.0 * dt / np.where(live, n_load, 1.0), 0.0)
            segs = np.maximum(seg, 0)
            for i0 in range(0, dt.size, _CORNER_BLOCK):
                sl = slice(i0, min(i0 + _CORNER_BLOCK, dt.size))
                bud = corners[segs[sl]] * scale[sl, None, None]  # (n, S, 4)
                # Σ_j bud[n,s,j]·y[n,p,j] as a batched matrix product (several times faster
                # than the equivalent einsum)
                d = bud @ prices[sl].transpose(0, 2, 1) + h_of[sl, None, :]
                pick = np.argmin(d, axis=2)  # (n, S)
                dmin = np.take_along_axis(d, pick[:, :, None], axis=2)[:, :, 0]
                k = np.argmax(dmin, axis=1)
                rows = np.arange(k.size)
                best[sl] = n_req[sl] * dmin[rows, k]
                best_sh[sl] = shares[sl][rows, pick[rows, k]]
            duals = np.hstack([duals, best[:, None]])
            shares = np.concatenate([shares, best_sh[:, None, :]], axis=1)
        return duals, shares, n_req

    def bound(self) -> OracleBound:
        """The loose upper bound on incremental value for the run (module docstring):
        ``oracle_incremental``."""
        if self._bound is not None:
            return self._bound
        self._bound = self._total(
            [(times, caps[:, None, :], None, None, None) for times, caps in self._caps]
        )
        return self._bound

    def _total(
        self,
        series: list[
            tuple[
                FloatArray,
                FloatArray,
                FloatArray | None,
                Corners | None,
                list[tuple[float, float]] | None,
            ]
        ],
        by_rate: bool = False,
        coarse: bool = False,
    ) -> OracleBound:
        """Sum the per-stretch duals of every region (the best capacity option of each
        stretch) and add the relief term."""
        totals = np.zeros(3)
        relief_total = 0.0
        per_region = []
        for r, (times, caps, extra, corners, units) in enumerate(series):
            duals, shares, _ = self._stretch_duals(
                r, times, caps, extra, by_rate, coarse, corners, units
            )
            best = np.argmax(duals, axis=1) if duals.size else np.zeros(0, dtype=np.int64)
            rows = np.arange(duals.shape[0])
            d = duals[rows, best]
            totals += (d[:, None] * shares[rows, best]).sum(axis=0)
            relief = self.static_losses(r)
            per_region.append(float(d.sum()) + relief)
            relief_total += relief
        return OracleBound(
            total=float(sum(per_region)),
            by_lever={
                "rma": float(totals[0]),
                "sbm": float(totals[1]),
                "precompute": float(totals[2]),
            },
            per_region=tuple(per_region),
            relief=relief_total,
        )

    def feasible(self) -> OracleBound:
        """The feasible bound (``value.feasible_bound``; module docstring, *The feasible
        bound*): the same LP under the rules the engine imposes on every policy."""
        if self._feasible is None:
            self._feasible = self._total(
                [
                    (times, caps, self.rules.expired_edges(), corners, units)
                    for times, caps, corners, units in (
                        self.rules.series(r) for r in range(len(self.ctx.regions))
                    )
                ],
                by_rate=True,
                coarse=True,
            )
        return self._feasible

    def static_losses(self, r: int) -> float:
        """:meth:`_static_losses`, once per region (both bounds add it)."""
        got = self._losses.get(r)
        if got is None:
            got = self._losses[r] = self._static_losses(r)
        return got

    def _static_losses(self, r: int) -> float:
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


def _loaded_at(pool: Any, t: float, load_s: float) -> float:
    """Units of ``pool`` the strong model has loaded at ``t``: those held for the whole load
    time before it (none in the first ``load_s`` seconds), or the level itself without a load."""
    if load_s <= 0:
        return float(pool.level_at(t))
    return float(pool.min_over(t - load_s, t)) if t - load_s >= 0 else 0.0
