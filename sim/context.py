"""What every region run of the simulator works with.

The shared context of one run (scenario × seed), against which every policy is simulated; the
targets and plans a policy issues; and the request mix a plan gives (which share of each segment
and value bin takes which path, with its service times).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, cast

import numpy as np
import numpy.typing as npt

from headroom.controllers.levers import CostModel
from headroom.defences.plan import PlanRule
from headroom.defences.replicas import MixedReplicas
from headroom.defences.shedding import optional_budget_ms
from headroom.kernel import seeds
from headroom.kernel.scenario import Scenario
from headroom.kernel.traces import PoolKey, ScenarioTraces
from headroom.sim.config import SimConfig
from headroom.sim.population import Population

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]
# Scenario time 0 on the event log's clock (the message examples' epoch): fixed, so a seed gives the
# same log byte for byte.
SIM_EPOCH = 1_796_000_000.0
SKETCH_ALPHA = 0.01
_KEY_SPAN = 2048  # dense latency-key histogram size: keys 0..2047 cover 1 ms .. > 10^17 ms
_EPS = 1e-9
PATH_BASE = 0
PATH_RMA = 1
PATH_SBM = 2
# The estimator's strata sums (window field ``strata``) are drawn every control interval and
# written, added up, on one window line every scenario hour and at the end: they add exactly, so
# only a log cut short loses the unwritten part; every 15 minutes took a simulated day with every
# policy from 84 to 95 MB (compressed) against a 100 MB budget.
STRATA_EVERY_S = 3600.0


@dataclass(frozen=True, slots=True)
class RegionStatic:
    name: str
    ded_cpu: float
    ded_acc: float
    ded_hardware: str
    pools: tuple[PoolKey, ...]
    base_ok: tuple[bool, ...]  # accelerator pool may run the base model (RMA)
    strong_ok: tuple[bool, ...]  # accelerator pool may run the strong model (SBM)
    servers: float  # peer policies: servers of cores_per_server dedicated cores


class Curves(Protocol):
    """What the engine needs from :class:`headroom.world.curves.ValueCurves`."""

    def mean_quality(self, segment_idx: Any, model: Any, n: Any) -> FloatArray: ...

    def std_quality(self, segment_idx: Any, model: Any, n: Any) -> FloatArray: ...


class SimContext:
    """Everything every policy of a run shares: scenario, traces, population, value curves."""

    def __init__(
        self,
        scenario: Scenario,
        curves: Curves,
        *,
        seed: int | None = None,
        config: SimConfig | None = None,
        control_curves: Curves | None = None,
    ) -> None:
        self.scenario = scenario
        self.config = cfg = config or SimConfig()
        self.seed = int(scenario.seed if seed is None else seed)
        self.curves = curves
        # the curves the control plane plans RMA's levels with (its RmaCurve): the ground
        # truth's by default; a run that measures its ground truth on more users than the
        # streaming controller reads (headroom.controllers.app.rma_curve) passes the
        # controller's here, so both engines' controllers plan with one curve
        self.control_curves = curves if control_curves is None else control_curves
        self.traces = ScenarioTraces(scenario, seeds.traces_rng(self.seed), cfg.step_s)
        self.pop = Population.from_scenario(scenario, cfg.value_bins)
        w = scenario.world
        self.n0 = int(w.base_candidates)
        self.nmax = int(w.max_candidates)
        # the client plan (defences/plan.py): its rule, the clients' flags set per policy
        self.plan_rule = PlanRule(
            holdout=float(w.holdout), base=self.n0, max=self.nmax, bins=self.pop.bins
        )
        self.plan_cache: dict[Any, FloatArray] = {}  # value-ranked RMA's thresholds
        self.holdout = self.plan_rule.holdout
        self.treat = self.plan_rule.treat
        self.eligible = float(cfg.eligible_share)
        self.costs = CostModel.from_models(scenario.models, self.n0)
        self.window_s = float(scenario.slo.window_s)
        self.duration_s = float(scenario.duration_s)
        self.n_windows = max(1, math.ceil(self.duration_s / self.window_s - 1e-9))
        self.timeout_ms = cfg.timeout_factor * float(scenario.slo.p99_ms)
        # how long a request's extras may wait for capacity before they are dropped (the rule
        # of both engines, headroom.defences.shedding.optional_budget_ms)
        self.optional_budget_ms = optional_budget_ms(float(scenario.slo.p99_ms))
        # a region's mixed replicas (the rule `headroom up` starts them by): what one request's
        # extras run on
        self.replicas = MixedReplicas(cfg.mixed_replicas)
        self.segment_names = tuple(s.name for s in scenario.segments)
        seg = self.pop.seg
        self.q_base = np.asarray(curves.mean_quality(seg, 0, self.n0), dtype=np.float64)
        self.sd_base = np.asarray(curves.std_quality(seg, 0, self.n0), dtype=np.float64)
        self.q_strong = np.asarray(curves.mean_quality(seg, 1, self.n0), dtype=np.float64)
        self.sd_strong = np.asarray(curves.std_quality(seg, 1, self.n0), dtype=np.float64)
        self._rma_q: dict[int, tuple[FloatArray, FloatArray]] = {}
        base_hw = set(scenario.models.base.hardware)
        strong_hw = set(scenario.models.strong.hardware)
        regions = []
        for r, rt in zip(scenario.regions, self.traces.regions, strict=True):
            keys = tuple(p.key for p in rt.pools)
            regions.append(
                RegionStatic(
                    name=r.name,
                    ded_cpu=float(r.dedicated.cpu),
                    ded_acc=float(r.dedicated.accelerator),
                    ded_hardware=r.dedicated.hardware,
                    pools=keys,
                    base_ok=tuple(
                        k.resource == "accelerator" and not k.remote and k.hardware in base_hw
                        for k in keys
                    ),
                    strong_ok=tuple(
                        k.resource == "accelerator" and not k.remote and k.hardware in strong_hw
                        for k in keys
                    ),
                    servers=max(1.0, float(r.dedicated.cpu) / cfg.cores_per_server),
                )
            )
        self.regions: tuple[RegionStatic, ...] = tuple(regions)
        self.oracle_cache: dict[str, Any] = {}
        # what a request mix takes from its levels alone, per (levels, extras' units)
        self.mix_shapes: dict[tuple[tuple[int, ...], tuple[float, float] | None], _MixShape] = {}
        self.seg_onehot = np.zeros((self.pop.n_cells, self.pop.n_segments))
        self.seg_onehot[np.arange(self.pop.n_cells), seg] = 1.0
        # scenario time 0 on the event log's clock (a replayed run uses its recording's)
        self.t0 = SIM_EPOCH

    def rma_quality(self, extra: int) -> tuple[FloatArray, FloatArray]:
        """Per cell, mean and spread of the quality with ``extra`` extra candidates (base model)."""
        got = self._rma_q.get(extra)
        if got is None:
            seg = self.pop.seg
            n = self.n0 + extra
            got = (
                np.asarray(self.curves.mean_quality(seg, 0, n), dtype=np.float64),
                np.asarray(self.curves.std_quality(seg, 0, n), dtype=np.float64),
            )
            self._rma_q[extra] = got
        return got

    def rng(self, region: int, purpose: int) -> np.random.Generator:
        """A fresh generator for (region, purpose): the same numbers for every policy."""
        return seeds.stream_rng(self.seed, 1000 + region, purpose)


@dataclass(frozen=True, slots=True)
class Targets:
    """What clients and servers of a region apply (the body of a ``headroom.targets`` message
    plus the capacity assignment behind it)."""

    epoch: int
    issued_at: float
    ttl_s: float
    rma_candidates: int
    sbm_segments: Mapping[str, float]
    # pool index -> (units assigned to RMA, units assigned to SBM)
    assignment: Mapping[int, tuple[float, float]] = field(default_factory=dict)
    sbm_coverage: float = 0.0
    # precompute jobs per second (of PrecomputeLever's size) the control plane grants
    precompute_jobs_per_s: float = 0.0
    # per segment, extra candidates per value bin (``targets.rma.levels``; empty: one block)
    rma_levels: Mapping[str, tuple[int, ...]] = field(default_factory=dict)
    # the router's exploration floor (``targets.sbm.explore``; 0: every share value-ranked)
    sbm_explore: float = 0.0


@dataclass(frozen=True, slots=True)
class Issued:
    """A central decision: targets plus the events that record it."""

    targets: Targets
    fields: dict[str, Any]  # the target.issued event's fields
    extra_events: tuple[tuple[str, dict[str, Any]], ...] = ()


@dataclass(frozen=True, slots=True)
class Plan:
    """Per cell, the share of *treatment* requests served each way.

    ``rma[j, c]`` with ``levels[j]`` extra candidates; ``sbm`` on the strong model; ``down``
    routed to the strong model and downgraded by its server; ``fail`` routed to strong replicas
    that were not there. The rest of the treatment arm, and the whole control arm, take the
    base path. ``hit`` (None: no precompute hit) is the share of the treatment requests served
    from the precompute store, left out of every lever's share already
    (:meth:`headroom.defences.plan.CellPlan.live`): they make no server call, so they load no
    stage (:func:`build_mix`), but they stay base-path requests of the window's latency sample;
    they count in no live group and their value is the precompute lever's
    (sim/precompute_sim.py).
    """

    levels: tuple[int, ...]
    rma: FloatArray  # (J, C)
    sbm: FloatArray  # (C,)
    down: FloatArray  # (C,)
    fail: FloatArray  # (C,)
    hit: FloatArray | None = None  # (C,)


@dataclass(frozen=True, slots=True)
class ArmParts:
    """A value-signal group's requests over a batch of steps, as (mix, class, cell) parts: each
    part's requests (its share of all arrivals times its mix's arrivals), cell, the quality they
    received (mean and spread), their share in time and the optional work one of them received
    (ms): the value signals' ``cost``."""

    weights: FloatArray
    cell: IntArray
    q: FloatArray
    sd: FloatArray
    pi: FloatArray
    cpu_ms: FloatArray
    acc_ms: FloatArray


@dataclass(slots=True)
class Mix:
    """A plan's consequences per arriving request: loads, classes, value (see module doc)."""

    plan: Plan
    # per-arrival loads, ms of work
    base_cpu: float
    opt_cpu: float
    base_acc: float
    opt_acc: float
    strong_acc: float
    # classes: base, rma_0..rma_{J-1}, sbm, down, fail
    frac: FloatArray  # (K,) share of all arrivals
    service_ms: FloatArray  # (K,)
    penalty_ms: FloatArray  # (K,)
    work_units: FloatArray  # (K,) work of one request, in 100s of base-model candidates
    path: IntArray  # (K,)
    strong_stage: npt.NDArray[np.bool_]  # (K,) accelerator stage is the strong replicas
    # stage service statistics
    cpu_mean: float
    cpu_cs2: float
    acc_mean: float
    acc_cs2: float
    strong_mean: float
    strong_cs2: float
    # truth per class and segment, per arriving request: (K, S)
    count: FloatArray
    value: FloatArray
    base_value: FloatArray
    # (S,) per arriving request, the base-path value of the precompute hits (in the base class;
    # the precompute lever replaces it, sim/precompute_sim.py)
    hit_value: FloatArray
    # holdout arms and value-signal groups (sim/windows.py ``ARM_CLASSES``): per class and
    # cell, the treatment requests' share of all arrivals (K, C), the quality they receive
    # (mean and spread, (K, C)) and the optional work one of them receives (ms, (K,))
    arm_weights: FloatArray
    quality: FloatArray
    quality_sd: FloatArray
    opt_cpu_ms: FloatArray
    opt_acc_ms: FloatArray
    # the CPU and accelerator units an RMA request's extras ran on (None: its threads and a
    # whole device, untrimmed) and the extras each RMA class ran after trimming
    extras_units: tuple[float, float] | None = None
    run_levels: tuple[int, ...] = ()


def baseline_plan(ctx: SimContext) -> Plan:
    c = ctx.pop.n_cells
    z = np.zeros(c)
    return Plan((), np.zeros((0, c)), z, z, z)


def extras_units(ctx: SimContext, r: int, levels: Sequence[float]) -> tuple[float, float]:
    """The CPU and accelerator units one RMA request's extras run on in region ``r`` when its
    pools stand at ``levels`` (one per pool, in the region's order): its threads and one device
    within its mixed replica's quota of the local CPU level and of the local accelerator levels
    the base model may use (:meth:`headroom.defences.replicas.MixedReplicas.extras_units`, the
    rule of the streaming servers). The engine's runs and the feasible bound both call it."""
    st = ctx.regions[r]
    cpu = acc = 0.0
    for i, key in enumerate(st.pools):
        if key.remote:
            continue
        if key.resource == "cpu":
            cpu += float(levels[i])
        elif st.base_ok[i]:
            acc += float(levels[i])
    return ctx.replicas.extras_units(cpu, acc, ctx.config.latency.cpu_parallelism)


def run_levels(
    ctx: SimContext, levels: tuple[int, ...], units: tuple[float, float] | None
) -> tuple[int, ...]:
    """The extras each RMA level runs on a mixed replica whose quota leaves ``units`` (CPU,
    accelerator) to one request's extras: those that finish within the optional budget after
    the request's baseline parts, the streaming server's trimming rule
    (:meth:`headroom.defences.replicas.MixedReplicas.extras_that_fit`; None: all of them)."""
    if units is None or not levels:
        return levels
    costs = ctx.costs
    par = ctx.config.latency.cpu_parallelism
    base_ms = ctx.n0 * (costs.base_cpu_ms / par + costs.base_accelerator_ms)
    left = ctx.optional_budget_ms - base_ms
    rule = ctx.replicas
    return tuple(
        rule.extras_that_fit(e, left, costs.base_cpu_ms, costs.base_accelerator_ms, units)
        for e in levels
    )


@dataclass(frozen=True, slots=True)
class _MixShape:
    """What a request mix takes from its RMA levels and the units its extras run on alone, the
    same for every plan of those (kept per run context: a server admitting part of the offered
    work gives a new plan at almost every step, of a few shapes)."""

    ran: tuple[int, ...]
    levels: FloatArray  # (J,) the extras each RMA class runs
    cpu_svc: FloatArray  # (K,) CPU work of one request / parallelism
    acc_work: FloatArray  # (K,)
    service: FloatArray  # (K,)
    path: IntArray  # (K,)
    units: FloatArray  # (K,)
    penalty: FloatArray  # (K,)
    strong_stage: npt.NDArray[np.bool_]  # (K,)
    qk: FloatArray  # (K, C) mean quality per class and cell
    sd_all: FloatArray  # (K, C) its spread
    # (3, K) which classes each stage serves (CPU, the mixed replicas' accelerators, the strong
    # replicas') and one request's service time there
    stage_of: FloatArray
    stage_svc: FloatArray
    # (K,) optional work one request of the class receives (ms): RMA's extra candidates, the
    # strong ranking
    opt_cpu_row: FloatArray
    opt_acc_row: FloatArray


def _mix_shape(
    ctx: SimContext, levels: tuple[int, ...], extras: tuple[float, float] | None
) -> _MixShape:
    key = (levels, extras)
    got = ctx.mix_shapes.get(key)
    if got is not None:
        return got
    costs = ctx.costs
    n0 = ctx.n0
    par = ctx.config.latency.cpu_parallelism
    n_levels = len(levels)
    # the extras each RMA class runs (trimmed to the optional budget on its replica's quota)
    ran = run_levels(ctx, levels, extras)
    ncls = np.array([n0] + [n0 + e for e in ran] + [n0, n0, n0], dtype=np.float64)
    k = ncls.size
    cpu_work = ncls * costs.base_cpu_ms
    cpu_work[1 + n_levels] += n0 * costs.strong_cpu_ms
    acc_work = ncls * costs.base_accelerator_ms
    acc_work[1 + n_levels] = n0 * costs.strong_accelerator_ms
    service = cpu_work / par + acc_work
    path = np.array([PATH_BASE] + [PATH_RMA] * n_levels + [PATH_SBM, PATH_BASE, PATH_BASE])
    if extras is not None and n_levels:
        # an RMA request's extras run on what its replica's quota leaves them (at most its
        # threads, one device), not on its threads: a quota enforced at every instant
        n_x = np.array(ran, dtype=np.float64)
        u_c, u_a = extras
        with np.errstate(divide="ignore", invalid="ignore"):
            x_cpu = np.where(n_x > 0, n_x * costs.base_cpu_ms / u_c, 0.0)
            x_acc = np.where(n_x > 0, n_x * costs.base_accelerator_ms / u_a, 0.0)
        service[1 : 1 + n_levels] = n0 * (costs.base_cpu_ms / par + costs.base_accelerator_ms) + (
            np.nan_to_num(x_cpu) + np.nan_to_num(x_acc)
        )
        # a class whose extras were all trimmed is served the baseline (the server's rule)
        path[1 : 1 + n_levels] = np.where(n_x > 0, PATH_RMA, PATH_BASE)
    # a strong request weighs its accelerator work in base-model candidates
    units = ncls / 100.0
    if costs.base_accelerator_ms > 0:
        units[1 + n_levels] = n0 * costs.strong_accelerator_ms / costs.base_accelerator_ms / 100.0
    penalty = np.zeros(k)
    penalty[2 + n_levels] = ctx.config.downgrade_ms
    penalty[3 + n_levels] = ctx.config.failover_ms
    strong_stage = np.zeros(k, dtype=np.bool_)
    strong_stage[1 + n_levels] = True
    lv = np.array(ran, dtype=np.float64)
    # truth: quality per class and cell
    q_rows = [ctx.q_base]
    sd_rows = [ctx.sd_base]
    for e in ran:
        q, sd = ctx.rma_quality(e)
        q_rows.append(q)
        sd_rows.append(sd)
    q_rows += [ctx.q_strong, ctx.q_base, ctx.q_base]
    sd_rows += [ctx.sd_strong, ctx.sd_base, ctx.sd_base]
    qk = np.vstack(q_rows)
    sd_all = np.vstack(sd_rows)
    # optional work per request of each class: RMA's extra candidates, the strong ranking
    opt_cpu_row = np.zeros(k)
    opt_acc_row = np.zeros(k)
    opt_cpu_row[1 : 1 + n_levels] = lv * costs.base_cpu_ms
    opt_acc_row[1 : 1 + n_levels] = lv * costs.base_accelerator_ms
    opt_cpu_row[1 + n_levels] = n0 * costs.strong_cpu_ms
    opt_acc_row[1 + n_levels] = n0 * costs.strong_accelerator_ms
    got = _MixShape(
        ran=ran,
        levels=lv,
        cpu_svc=cpu_work / par,
        acc_work=acc_work,
        service=service,
        path=path,
        units=units,
        penalty=penalty,
        strong_stage=strong_stage,
        qk=qk,
        sd_all=sd_all,
        stage_of=np.vstack([np.ones(k), ~strong_stage, strong_stage]).astype(np.float64),
        stage_svc=np.vstack([cpu_work / par, acc_work, acc_work]),
        opt_cpu_row=opt_cpu_row,
        opt_acc_row=opt_acc_row,
    )
    ctx.mix_shapes[key] = got
    return got


def build_mix(ctx: SimContext, plan: Plan, extras: tuple[float, float] | None = None) -> Mix:
    """The request mix of ``plan``. ``extras``: the CPU and accelerator units an RMA request's
    extras run on (:meth:`headroom.defences.replicas.MixedReplicas.extras_units`; they are
    trimmed to the optional budget at those units, :func:`run_levels`); None: at the request's
    threads and a whole device, untrimmed. What depends on the levels and ``extras`` alone is
    computed once per run context (:class:`_MixShape`)."""
    pop = ctx.pop
    cfg = ctx.config
    costs = ctx.costs
    n0 = ctx.n0
    cv2 = cfg.latency.service_cv**2
    sh = pop.share
    t = ctx.treat
    n_levels = len(plan.levels)
    shape = _mix_shape(ctx, plan.levels, extras)
    # class shares per cell (of treatment requests), then per arriving request
    # (rows filled in place: the stacks' values without building them class by class)
    cell_frac_all = np.empty((n_levels + 4, pop.n_cells))  # (K, C), share of a cell's arrivals
    cell_frac = cell_frac_all[1:]
    cell_frac[:n_levels] = plan.rma[:n_levels]
    cell_frac[n_levels] = plan.sbm
    cell_frac[n_levels + 1] = plan.down
    cell_frac[n_levels + 2] = plan.fail
    treat_base = np.clip(1.0 - cell_frac.sum(axis=0), 0.0, 1.0)
    base_cells = t * treat_base + ctx.holdout  # control arm: always base
    cell_frac_all[0] = base_cells
    cell_frac *= t
    frac = cell_frac_all @ sh
    strong_stage = shape.strong_stage
    f_rma = frac[1 : 1 + n_levels]
    f_sbm = float(frac[1 + n_levels])
    levels = shape.levels
    # the hits are base-class requests that run nothing of the plan live (Plan.hit) and make no
    # server call at all (the stack serves them from the store): they load no stage
    hit = np.zeros(pop.n_cells) if plan.hit is None else np.clip(plan.hit, 0.0, treat_base)
    f_hit = float((t * hit) @ sh)
    base_cpu = (1.0 - f_hit) * n0 * costs.base_cpu_ms
    opt_cpu = float((f_rma * levels).sum()) * costs.base_cpu_ms + f_sbm * n0 * costs.strong_cpu_ms
    base_acc = max(1.0 - f_sbm - f_hit, 0.0) * n0 * costs.base_accelerator_ms
    opt_acc = float((f_rma * levels).sum()) * costs.base_accelerator_ms
    strong_acc = f_sbm * n0 * costs.strong_accelerator_ms

    served = frac.copy()  # the requests the stages serve: not the hits
    served[0] = max(float(served[0]) - f_hit, 0.0)
    # the stages' service statistics (CPU; the mixed replicas' and the strong replicas'
    # accelerators): mean and squared variation over the requests each serves, in one pass
    weights = served * shape.stage_of
    ws = weights * shape.stage_svc
    tots = cast("list[float]", weights.sum(axis=1).tolist())
    m1s = cast("list[float]", ws.sum(axis=1).tolist())
    m2s = cast("list[float]", (ws * shape.stage_svc).sum(axis=1).tolist())
    stats = []
    for tot, s1, s2 in zip(tots, m1s, m2s, strict=True):
        if tot <= 0:
            stats.append((0.0, cv2))
            continue
        m1 = s1 / tot
        m2 = s2 / tot
        stats.append((m1, ((1.0 + cv2) * m2 / (m1 * m1) - 1.0) if m1 > 0 else cv2))
    (cpu_mean, cpu_cs2), (acc_mean, acc_cs2), (strong_mean, strong_cs2) = stats

    seg_onehot = ctx.seg_onehot
    w = cell_frac_all * sh  # (K, C) share of all arrivals in (class, cell)
    count = w @ seg_onehot
    value = (w * pop.v_mean * shape.qk) @ seg_onehot
    base_value = (w * pop.v_mean * ctx.q_base) @ seg_onehot
    # the hits count in no live group; their live value is the precompute lever's to replace
    hit_value = (t * hit * sh * pop.v_mean * ctx.q_base) @ seg_onehot
    live_base = treat_base - hit

    # per class and cell, the treatment requests' share of all arrivals: the holdout arms' and
    # value-signal groups' weights (the base class's: its live requests; the precompute hits
    # count in none of them)
    arm_weights = w.copy()
    arm_weights[0] = t * live_base * sh
    return Mix(
        plan=plan,
        base_cpu=base_cpu,
        opt_cpu=opt_cpu,
        base_acc=base_acc,
        opt_acc=opt_acc,
        strong_acc=strong_acc,
        frac=frac,
        service_ms=shape.service,
        penalty_ms=shape.penalty,
        work_units=shape.units,
        path=shape.path,
        strong_stage=strong_stage,
        cpu_mean=cpu_mean,
        cpu_cs2=cpu_cs2,
        acc_mean=acc_mean,
        acc_cs2=acc_cs2,
        strong_mean=strong_mean,
        strong_cs2=strong_cs2,
        count=count,
        value=value,
        base_value=base_value,
        hit_value=hit_value,
        arm_weights=arm_weights,
        quality=shape.qk,
        quality_sd=shape.sd_all,
        opt_cpu_ms=shape.opt_cpu_row,
        opt_acc_ms=shape.opt_acc_row,
        extras_units=extras,
        run_levels=shape.ran,
    )


@dataclass(frozen=True, slots=True)
class Quotas:
    """Opportunistic capacity each lever holds right now (cores, devices)."""

    rma_cpu: float
    rma_acc: float
    sbm_cpu: float
    sbm_acc: float  # loaded strong-model devices


@dataclass(frozen=True, slots=True)
class Health:
    """What responses tell clients, and what a server sees of itself, after one step."""

    now: float
    mixed_queue_ms: float  # standing queue of the mixed replicas (what CoDel judges)
    strong_queue_ms: float  # standing queue of the strong replicas
    # work in flight per server (Little's law), in units of 100 base-model candidates
    inflight_units: float
    baseline_units: float  # the baseline part of it (base candidates of every request)
    latency_ms: float  # mean response time of the step


# one (sub-)step of the fluid model, kept until its window closes: arrivals, the request rate,
# the step's length, utilisation and fluid backlog (start, end) of each stage, the same for the
# static shadow, in-flight strong requests lost to a reclaim, the strong replicas' speed, and
# the server counts of each stage (wait parameters are computed from these at closing)
#
# Baseline first (docs/simulator.md, *Baseline first*): on the mixed replicas ``rc``/``ra`` and
# ``c0``..``a1`` are the baseline queue's (every request's baseline part, on the dedicated
# capacity); ``mc``/``ma`` the utilisation of the whole stage the optional parts queue in at low
# priority, ``oc0``..``oa1`` the fluid backlog of the optional parts on their quota and
# ``roc``/``roa`` the optional work's utilisation of its quota.
_ROW = (
    "a", "lam", "dt", "rc", "ra", "rs", "c0", "c1", "a0", "a1", "s0", "s1",
    "src", "sra", "sc0", "sc1", "sa0", "sa1", "fail", "speed", "nc", "na", "ns",
    "mc", "ma", "oc0", "oc1", "oa0", "oa1", "roc", "roa",
)  # fmt: skip
_R = {name: i for i, name in enumerate(_ROW)}
