"""The virtual-time fleet model: regions, pools, queues, and one policy driving them.

Pure: no asyncio, no Kafka, no wall clock, no global random state. Time is the scenario's
(seconds from 0); randomness comes from generators derived from one seed, with one stream per
(region, purpose) so every policy simulated on the same :class:`SimContext` sees the same
requests, the same noise and the same capacity (common random numbers). docs/simulator.md
describes the model in full; this header is the summary.

The fleet
---------
Per region: a **dedicated** pool (CPU cores, accelerator devices of one type) that serves the
baseline, and **opportunistic** pools per (resource, hardware) that may serve only optional work
(``remote`` pools only asynchronous work: never the live path, so never here).

* **RMA, mixed replicas** (logical isolation): extra candidates run on the same replicas as the
  baseline, charged to the opportunistic quota RMA holds (CPU and base-model accelerator). Work
  beyond the quota is slowed, never moved to dedicated capacity, and since the replicas have one
  request queue, queueing grows for everyone (sim/latency.py).
* **SBM, strong replicas** (physical isolation): a strong-model request runs on opportunistic
  devices of a type in ``models.strong.hardware``, usable ``load_s`` after they were assigned to
  SBM. A request routed there when no loaded replica exists fails fast and is retried on the base
  path (``failover_ms``); one downgraded by the strong server's admission control goes back at
  once (``downgrade_ms``).

Requests are population cells (sim/population.py), ``1 − holdout`` of them in the treatment arm.
A policy decides, per cell, the share that gets RMA extra candidates, the share routed to the
strong model, and what the servers admit; the engine turns that into load, queues, latency,
delivered value and value signals.

Time
----
Fixed steps of ``step_s`` (1 s) carry the arrivals. Anything that happens inside a step — a
capacity change, a target reaching clients, a strong model finishing its load, a server noticing
a reclaim — splits it: the engine advances from event to event, so a reclaim is resolved to the
millisecond. Steps with nothing going on are grouped into segments up to an SLO window long and
decided once (same plan, same server admission), stepped one second at a time for the queues.

Per SLO window and region the engine writes one ``window`` event (docs/events.md): a latency
sketch from a stratified sample of request latencies, ground-truth value, the holdout sums the
estimator sees, exposure per segment, capacity offered and used, the targets in force.

Ground truth
------------
Delivered value of a request = value × top-ad quality of the option it got (the measured curves'
mean, :mod:`headroom.world.curves`), counted only if it finished within the timeout. The baseline is
the same requests under the static configuration (no optional work: a shadow of the queues with
baseline work only, run alongside), so ``incremental = total − baseline`` is exactly 0 for the
static policy and counts the harm optional work does through queueing for any other. It splits
exactly into ``inc`` per lever and ``value_lost``: a class of requests that finished in time
credits its lever (if any) with ``π_k·(value_k − base_k)``; ``(π_k − π_s)·base_k`` over every
class (``π`` the in-time probability, ``π_s`` the shadow's) is the baseline value of requests that
timed out where the baseline's would not — lost, ≤ 0 whenever optional work slows a class down.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

from headroom.analysis.events import WindowTraffic, window_event
from headroom.controllers.levers import CostModel
from headroom.controllers.types import (
    LEVER_PRECOMPUTE,
    ArmStats,
    CapacityLevel,
    RegionObservation,
    segment_of,
    stratum_key,
)
from headroom.defences.plan import CellPlanner, PlanRule
from headroom.kernel import seeds
from headroom.kernel.scenario import Scenario
from headroom.kernel.sketch import bin_values
from headroom.kernel.traces import CapacityChange, PoolKey, ScenarioTraces
from headroom.sim.config import SimConfig
from headroom.sim.faults import fault_lines
from headroom.sim.latency import (
    RHO_FLUID_CAP,
    LatencyConfig,
    StageState,
    Strata,
    WaitParams,
    allocate_samples,
    baseline_wait_params,
    in_time_probability,
    keys_of,
    low_priority_factor,
    sample_window,
    serial_waits,
    sketch_from_mass,
    speed,
    wait_params,
    wait_params_array,
)
from headroom.sim.population import Population, arm_signal_sums
from headroom.sim.precompute_sim import PrecomputeRegion, PrecomputeWindows, precompute_region

__all__ = [
    "PATH_BASE",
    "PATH_RMA",
    "PATH_SBM",
    "SIM_EPOCH",
    "Issued",
    "Plan",
    "RegionPolicy",
    "RegionRun",
    "SimContext",
    "Targets",
    "run_policy",
]

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]

# Scenario time 0 on the event log's clock (the message examples' epoch): fixed, so a seed gives the
# same log byte for byte.
SIM_EPOCH = 1_796_000_000.0
SKETCH_ALPHA = 0.01
_KEY_SPAN = 2048  # dense latency-key histogram size: keys 0..2047 cover 1 ms .. > 10^17 ms
_EPS = 1e-9

PATH_BASE, PATH_RMA, PATH_SBM = 0, 1, 2

# The estimator's strata sums (window field ``strata``) are drawn every control interval and
# written, added up, on one window line every scenario hour and at the end: they add exactly, so
# only a log cut short loses the unwritten part; every 15 minutes took a simulated day with every
# policy from 84 to 95 MB (compressed) against a 100 MB budget.
STRATA_EVERY_S = 3600.0


# --------------------------------------------------------------------------------------------
# The shared context of one run (scenario × seed): every policy is simulated against it
# --------------------------------------------------------------------------------------------


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
    ) -> None:
        self.scenario = scenario
        self.config = cfg = config or SimConfig()
        self.seed = int(scenario.seed if seed is None else seed)
        self.curves = curves
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


# --------------------------------------------------------------------------------------------
# Targets, plans and the mix a plan implies
# --------------------------------------------------------------------------------------------


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
    base path.
    """

    levels: tuple[int, ...]
    rma: FloatArray  # (J, C)
    sbm: FloatArray  # (C,)
    down: FloatArray  # (C,)
    fail: FloatArray  # (C,)


@dataclass(frozen=True, slots=True)
class ArmParts:
    """A group of requests as (class row, cell) parts: share of all arrivals, quality."""

    weights: FloatArray
    cell: IntArray
    row: IntArray
    q: FloatArray
    sd: FloatArray
    # optional work one request of the part received (ms): the value signals' ``cost``
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
    # holdout arms and value-signal groups: parts of (class, cell) with their quality
    arm_parts: dict[str, ArmParts]


def baseline_plan(ctx: SimContext) -> Plan:
    c = ctx.pop.n_cells
    z = np.zeros(c)
    return Plan((), np.zeros((0, c)), z, z, z)


def build_mix(ctx: SimContext, plan: Plan) -> Mix:
    pop = ctx.pop
    cfg = ctx.config
    costs = ctx.costs
    n0 = ctx.n0
    par = cfg.latency.cpu_parallelism
    cv2 = cfg.latency.service_cv**2
    sh = pop.share
    t = ctx.treat
    n_levels = len(plan.levels)
    # class shares per cell (of treatment requests), then per arriving request
    parts = [plan.rma[j] for j in range(n_levels)] + [plan.sbm, plan.down, plan.fail]
    cell_frac = np.vstack(parts) if parts else np.zeros((0, pop.n_cells))
    treat_base = np.clip(1.0 - cell_frac.sum(axis=0), 0.0, 1.0)
    base_cells = t * treat_base + ctx.holdout  # control arm: always base
    cell_frac_all = np.vstack([base_cells, t * cell_frac])  # (K, C), share of a cell's arrivals
    frac = cell_frac_all @ sh
    k = frac.size
    ncls = np.array([n0] + [n0 + e for e in plan.levels] + [n0, n0, n0], dtype=np.float64)
    cpu_work = ncls * costs.base_cpu_ms
    cpu_work[1 + n_levels] += n0 * costs.strong_cpu_ms
    acc_work = ncls * costs.base_accelerator_ms
    acc_work[1 + n_levels] = n0 * costs.strong_accelerator_ms
    service = cpu_work / par + acc_work
    # a strong request weighs its accelerator work in base-model candidates
    units = ncls / 100.0
    if costs.base_accelerator_ms > 0:
        units[1 + n_levels] = n0 * costs.strong_accelerator_ms / costs.base_accelerator_ms / 100.0
    penalty = np.zeros(k)
    penalty[2 + n_levels] = cfg.downgrade_ms
    penalty[3 + n_levels] = cfg.failover_ms
    path = np.array([PATH_BASE] + [PATH_RMA] * n_levels + [PATH_SBM, PATH_BASE, PATH_BASE])
    strong_stage = np.zeros(k, dtype=np.bool_)
    strong_stage[1 + n_levels] = True
    f_rma = frac[1 : 1 + n_levels]
    f_sbm = float(frac[1 + n_levels])
    levels = np.array(plan.levels, dtype=np.float64)
    base_cpu = n0 * costs.base_cpu_ms
    opt_cpu = float((f_rma * levels).sum()) * costs.base_cpu_ms + f_sbm * n0 * costs.strong_cpu_ms
    base_acc = (1.0 - f_sbm) * n0 * costs.base_accelerator_ms
    opt_acc = float((f_rma * levels).sum()) * costs.base_accelerator_ms
    strong_acc = f_sbm * n0 * costs.strong_accelerator_ms

    def stats(weights: FloatArray, svc: FloatArray) -> tuple[float, float]:
        tot = float(weights.sum())
        if tot <= 0:
            return 0.0, cv2
        m1 = float((weights * svc).sum()) / tot
        m2 = float((weights * svc * svc).sum()) / tot
        return m1, ((1.0 + cv2) * m2 / (m1 * m1) - 1.0) if m1 > 0 else cv2

    cpu_mean, cpu_cs2 = stats(frac, cpu_work / par)
    mixed = ~strong_stage
    acc_mean, acc_cs2 = stats(frac * mixed, acc_work)
    strong_mean, strong_cs2 = stats(frac * strong_stage, acc_work)

    # truth: quality per class and cell
    q_rows = [ctx.q_base]
    sd_rows = [ctx.sd_base]
    for e in plan.levels:
        q, sd = ctx.rma_quality(e)
        q_rows.append(q)
        sd_rows.append(sd)
    q_rows += [ctx.q_strong, ctx.q_base, ctx.q_base]
    sd_rows += [ctx.sd_strong, ctx.sd_base, ctx.sd_base]
    qk = np.vstack(q_rows)
    seg_onehot = np.zeros((pop.n_cells, pop.n_segments))
    seg_onehot[np.arange(pop.n_cells), pop.seg] = 1.0
    w = cell_frac_all * sh  # (K, C) share of all arrivals in (class, cell)
    count = w @ seg_onehot
    value = (w * pop.v_mean * qk) @ seg_onehot
    base_value = (w * pop.v_mean * ctx.q_base) @ seg_onehot
    sd_all = np.vstack(sd_rows)
    cells = np.arange(pop.n_cells)

    # optional work per request of each class: RMA's extra candidates, the strong ranking
    opt_cpu_row = np.zeros(k)
    opt_acc_row = np.zeros(k)
    opt_cpu_row[1 : 1 + n_levels] = levels * costs.base_cpu_ms
    opt_acc_row[1 : 1 + n_levels] = levels * costs.base_accelerator_ms
    opt_cpu_row[1 + n_levels] = n0 * costs.strong_cpu_ms
    opt_acc_row[1 + n_levels] = n0 * costs.strong_accelerator_ms

    def group(rows: list[int], weights: list[FloatArray]) -> ArmParts:
        if not rows:
            z = np.zeros(0)
            e = np.zeros(0, dtype=np.int64)
            return ArmParts(z, e, e, z, z, z, z)
        row = np.repeat(np.array(rows, dtype=np.int64), pop.n_cells)
        return ArmParts(
            weights=np.concatenate(weights),
            cell=np.tile(cells, len(rows)),
            row=row,
            q=np.concatenate([qk[r] for r in rows]),
            sd=np.concatenate([sd_all[r] for r in rows]),
            cpu_ms=opt_cpu_row[row],
            acc_ms=opt_acc_row[row],
        )

    srow = 1 + n_levels
    rma_rows = list(range(1, 1 + n_levels))
    arm_parts: dict[str, ArmParts] = {
        # what each request received (the log's arms: docs/events.md), plus "none": treatment
        # requests that got no optional work, so a value-aware selection of the treated cannot
        # bias the holdout estimate (docs/simulator.md §Holdout estimate)
        "rma": group(rma_rows, [t * cell_frac[j] * sh for j in range(n_levels)]),
        "sbm": group([srow], [t * plan.sbm * sh]),
        "none": group(
            [0, srow + 1, srow + 2],
            [t * treat_base * sh, t * plan.down * sh, t * plan.fail * sh],
        ),
        # intent-to-treat groups the control plane learns from (docs/simulator.md §Value
        # signals): requests not routed to the strong model (RMA's), and routed ones (SBM's)
        "itt_rma": group(
            [0, *rma_rows], [t * treat_base * sh] + [t * cell_frac[j] * sh for j in range(n_levels)]
        ),
        "itt_sbm": group(
            [srow, srow + 1, srow + 2], [t * plan.sbm * sh, t * plan.down * sh, t * plan.fail * sh]
        ),
    }
    return Mix(
        plan=plan,
        base_cpu=base_cpu,
        opt_cpu=opt_cpu,
        base_acc=base_acc,
        opt_acc=opt_acc,
        strong_acc=strong_acc,
        frac=frac,
        service_ms=service,
        penalty_ms=penalty,
        work_units=units,
        path=path,
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
        arm_parts=arm_parts,
    )


# --------------------------------------------------------------------------------------------
# What a policy is, to the engine
# --------------------------------------------------------------------------------------------


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


class RegionPolicy(Protocol):
    """The policy-specific decisions; the engine does everything else (sim/policies.py)."""

    ideal: bool  # the oracle: optional work packed perfectly, adds no queueing of its own
    direct: bool  # plans every step itself (no central targets, no control ticks)
    server_sheds: bool  # a server-side shedder decides what is admitted
    value_ranked_rma: bool  # clients spend the RMA target highest value first

    def control(self, now: float, obs: RegionObservation, run: RegionRun) -> Issued | None: ...

    def direct_plan(self, now: float, span: float, run: RegionRun) -> Plan | None: ...

    def multipliers(self, now: float) -> tuple[float, float]: ...

    def admit(
        self, now: float, span: float, rma_req: FloatArray, sbm_req: FloatArray, run: RegionRun
    ) -> tuple[FloatArray, FloatArray] | None: ...

    def on_quotas(self, now: float, quotas: Quotas, reduced: bool) -> None: ...

    def feedback(self, health: Health, run: RegionRun) -> list[tuple[str, dict[str, Any]]]: ...

    def steady(self) -> bool: ...

    def notices_reclaims(self) -> bool: ...


# --------------------------------------------------------------------------------------------
# One region under one policy
# --------------------------------------------------------------------------------------------

EmitFn = Callable[[str, float, dict[str, Any]], None]

# kinds of the region's event heap (ties at one instant in this order)
_EV_CAPACITY, _EV_CONTROL, _EV_APPLY, _EV_EXPIRE, _EV_LOADED, _EV_NOTICE = range(6)

# treatment groups of a window's holdout sums: the log's arms (what requests received, and
# "none"), and the intent-to-treat groups the control plane learns from
_ARM_GROUPS = ("rma", "sbm", "none", "itt_rma", "itt_sbm")

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


@dataclass(slots=True)
class _Pending:
    """A reclaim whose optional work has not fitted yet."""

    t: float
    pool: int
    before: float
    after: float


class RegionRun:
    """State and event loop of one region for one policy run."""

    def __init__(
        self,
        ctx: SimContext,
        r: int,
        policy: RegionPolicy,
        emit: EmitFn,
        control_interval_s: float,
        precompute: PrecomputeRegion | None = None,
    ) -> None:
        self.ctx = ctx
        self.r = r
        self.precompute = precompute  # the precompute lever (sim/precompute_sim.py), if any
        self.static = ctx.regions[r]
        self.traces = ctx.traces.regions[r]
        self.policy = policy
        self.emit = emit
        self.interval = control_interval_s
        self.cfg = ctx.config
        n_pools = len(self.static.pools)
        self.level = [0.0] * n_pools
        self.asg_rma = [0.0] * n_pools
        self.asg_sbm = [0.0] * n_pools
        self.tranches: list[list[tuple[float, float]]] = [[] for _ in range(n_pools)]
        self.targets: Targets | None = None
        self.epoch_in_force = 0
        self.heap: list[tuple[float, int, int, Any]] = []
        self._seq = 0
        for ch in self.traces.changes:
            self._push(ch.t, _EV_CAPACITY, ch)
        if not policy.direct:
            k = 1
            while k * self.interval < ctx.duration_s - _EPS:
                self._push(k * self.interval, _EV_CONTROL, None)
                k += 1
        timeout_s = ctx.timeout_ms / 1000.0
        self.cpu = StageState(max_backlog_s=timeout_s)
        self.acc = StageState(max_backlog_s=timeout_s)
        self.strong = StageState(max_backlog_s=timeout_s)
        self.shadow_cpu = StageState(max_backlog_s=timeout_s)
        self.shadow_acc = StageState(max_backlog_s=timeout_s)
        # the optional parts' own backlog on the mixed replicas (baseline first: optional work
        # beyond its quota queues behind itself, never in front of baseline work)
        self.opt_cpu = StageState(max_backlog_s=timeout_s)
        self.opt_acc = StageState(max_backlog_s=timeout_s)
        self.lat_rng = ctx.rng(r, 1)
        self.arm_rng = ctx.rng(r, 2)
        self.notice_rng = ctx.rng(r, 3)
        self.count_rng = ctx.rng(r, 4)
        self.quotas = Quotas(0.0, 0.0, 0.0, 0.0)
        self.pending: list[_Pending] = []
        self.planner = CellPlanner(
            replace(
                ctx.plan_rule,
                value_ranked_rma=bool(policy.value_ranked_rma),
                value_ranked_sbm=bool(getattr(policy, "value_ranked_sbm", False)),
            ),
            ctx.pop,
            eligible=ctx.eligible,
            cache=ctx.plan_cache,
        )
        self.base_mix = build_mix(ctx, baseline_plan(ctx))
        self.mix = self.base_mix
        self._mix_key: Any = ("base",)
        self._direct_mixes: dict[int, Mix] = {}
        self._blocks: list[tuple[Mix, FloatArray]] = []
        self.noticed_at: float | None = None  # a server has yet to react to a reclaim
        self.arrival_rate = 0.0  # rps of the current step
        self._obs_at = 0.0  # when the controllers' observation accumulators were last read
        self._lost_strong = 0.0  # in-flight strong requests lost to a reclaim, not yet counted
        self._win_reset()
        self._obs_reset()
        self._pending_windows: list[dict[str, Any]] = []
        # the estimator's strata sums since they were last written (module docstring: written
        # every STRATA_EVERY_S of scenario time and at the end; the sums add up)
        self._strata_acc: dict[str, dict[str, dict[str, Any]]] = {}
        self._strata_since = 0.0
        bind = getattr(policy, "bind", None)
        if bind is not None:
            bind(self)

    # -- heap -------------------------------------------------------------------------------

    def _push(self, t: float, kind: int, payload: Any) -> None:
        self._seq += 1
        heapq.heappush(self.heap, (t, kind, self._seq, payload))

    # -- capacity, assignment, quotas ----------------------------------------------------------

    def _loaded(self, i: int, now: float) -> float:
        ready = sum(u for u, at in self.tranches[i] if at <= now + _EPS)
        return min(ready, self.asg_sbm[i])

    def compute_quotas(self, now: float) -> Quotas:
        st = self.static
        rc = ra = sc = sa = 0.0
        for i, key in enumerate(st.pools):
            if key.remote:
                continue
            if key.resource == "cpu":
                rc += self.asg_rma[i]
                sc += self.asg_sbm[i]
            else:
                if st.base_ok[i]:
                    ra += self.asg_rma[i]
                if st.strong_ok[i]:
                    sa += self._loaded(i, now)
        return Quotas(rc, ra, sc, sa)

    def _set_assignment(self, i: int, rma: float, sbm: float, now: float) -> None:
        """Assign units of pool ``i`` within its level.

        A strong replica needs at least one whole device, so a smaller SBM share of an
        accelerator pool is raised to one device (within the level); above one, device
        equivalents may be fractional, as may RMA's and CPU quotas. When the level cannot hold
        both, they shrink together.
        """
        rma = max(rma, 0.0)
        sbm = max(sbm, 0.0)
        level = self.level[i]
        if self.static.pools[i].resource == "accelerator" and sbm > 1e-6:
            # a strong replica needs at least one whole device; above that, device equivalents
            # (docs/messages.md units) may be fractional (slices), so RMA keeps its share of the
            # rest
            sbm = min(max(1.0, sbm), level)
            rma = max(0.0, min(rma, level - sbm))
        if rma + sbm > level + _EPS:
            k = level / (rma + sbm) if rma + sbm > 0 else 0.0
            rma *= k
            sbm *= k
        self.asg_rma[i] = rma
        self.asg_sbm[i] = sbm
        if not self.static.strong_ok[i]:
            return
        # strong replicas stay resident on devices nobody else needs (a lower SBM budget for a
        # minute does not unload the model); only the level or RMA's share pushes them out
        tr = self.tranches[i]
        resident = sum(u for u, _ in tr)
        if sbm > resident + _EPS:
            ready = now + float(self.ctx.scenario.models.strong.load_s)
            tr.append((sbm - resident, ready))
            if ready > now:
                self._push(ready, _EV_LOADED, i)
            resident = sbm
        room = max(level - rma, sbm)
        drop = resident - room
        while drop > _EPS and tr:  # the newest (least loaded) units go first
            u, at = tr[-1]
            if u <= drop + _EPS:
                tr.pop()
                drop -= u
            else:
                tr[-1] = (u - drop, at)
                drop = 0.0

    def _refresh_quotas(self, now: float, reduced: bool) -> None:
        q = self.compute_quotas(now)
        if q != self.quotas:
            self.quotas = q
            self.policy.on_quotas(now, q, reduced)
            self._mix_key = None

    # -- events -------------------------------------------------------------------------------

    def _handle(self, t: float, kind: int, payload: Any) -> None:
        if kind == _EV_CAPACITY:
            self._on_capacity(t, payload)
        elif kind == _EV_CONTROL:
            self._on_control(t)
        elif kind == _EV_APPLY:
            self._on_apply(t, payload)
        elif kind == _EV_EXPIRE:
            self._on_expire(t, payload)
        elif kind == _EV_LOADED:
            self._refresh_quotas(t, False)
        elif kind == _EV_NOTICE:
            self.noticed_at = None
            self.policy.on_quotas(t, self.quotas, True)
            self._mix_key = None
            if self.policy.server_sheds:
                # from this decision on the server's token buckets hold optional work within the
                # level (ServerShedder.on_capacity: the very next decision sees it), and work
                # beyond it is cut: the release is complete now
                self._release_all(t)

    def _on_capacity(self, t: float, ch: CapacityChange) -> None:
        i = ch.pool
        key = self.static.pools[i]
        self.level[i] = ch.after
        self._mix_key = None
        # one draw per change whatever the policy, so the stream stays aligned across policies
        notice_u = float(self.notice_rng.random())
        if ch.after >= ch.before:
            # a grant: nothing moves until a policy assigns it. A policy that loads at the
            # grant starts the strong model on granted strong-capable devices now (idle until
            # assigned; an assignment to RMA unloads them), so they are ready sooner
            if (
                ch.after > ch.before
                and getattr(self.policy, "loads_at_grant", False)
                and self.static.strong_ok[i]
            ):
                tr = self.tranches[i]
                resident = sum(u for u, _ in tr)
                if ch.after > resident + _EPS:
                    ready = t + float(self.ctx.scenario.models.strong.load_s)
                    tr.append((ch.after - resident, ready))
                    self._push(ready, _EV_LOADED, i)
            return
        self.emit(
            "capacity.reclaimed",
            t,
            {
                "resource": key.resource,
                "hardware": key.hardware,
                "pool": "opportunistic",
                "units_before": ch.before,
                "units_after": ch.after,
                "t": t,
            },
        )
        if self.policy.direct:
            return  # the oracle saw it coming: its plan for the new level starts now
        # the owner takes the units back at once: assignments shrink to the new level
        before_q = self.quotas
        self._set_assignment(i, self.asg_rma[i], self.asg_sbm[i], t)
        q_new = self.compute_quotas(t)
        if q_new.sbm_acc < before_q.sbm_acc and before_q.sbm_acc > 0:
            # strong requests running on the lost devices fail and are retried on the base path
            lost = 1.0 - q_new.sbm_acc / before_q.sbm_acc
            sbm_share = float(self.mix.frac[1 + len(self.mix.plan.levels)])
            in_flight = self.arrival_rate * sbm_share * (self.mix.strong_mean / 1000.0)
            self._lost_strong += in_flight * lost
        if self._fits(self.mix, q_new):
            self._refresh_quotas(t, True)
            return
        self.pending.append(_Pending(t, i, ch.before, ch.after))
        self.quotas = q_new  # the capacity is gone now; servers learn it at their next turn
        if self.policy.notices_reclaims():
            # the traffic at the reclaim itself (``arrival_rate`` may still be a step behind)
            now_rate = float(self.traces.rate[self.ctx.traces.step_of(t)])
            rate = max(now_rate, 1e-3) * self.cfg.server_turns_per_request
            delay = -math.log(max(1.0 - notice_u, 1e-300)) / rate
            self.noticed_at = t + delay
            self._push(t + delay, _EV_NOTICE, None)

    def _fits(self, mix: Mix, q: Quotas) -> bool:
        """Optional work in force fits the quotas (offered work ≤ capacity, per resource)."""
        lam = max(self.arrival_rate, 1e-9)
        tol = 1e-6
        return (
            mix.opt_cpu * lam <= 1000.0 * (q.rma_cpu + q.sbm_cpu) * (1 + tol) + tol
            and mix.opt_acc * lam <= 1000.0 * q.rma_acc * (1 + tol) + tol
            and mix.strong_acc * lam <= 1000.0 * q.sbm_acc * (1 + tol) + tol
        )

    def _on_control(self, t: float) -> None:
        if self.traces.in_outage(t):
            return
        obs = self._observation(t)
        issued = self.policy.control(t, obs, self)
        if issued is None:
            return
        self.emit("target.issued", t, issued.fields)
        for kind, fields in issued.extra_events:
            self.emit(kind, t, fields)
        self._push(t + self.cfg.propagation_s, _EV_APPLY, issued.targets)

    def _on_apply(self, t: float, tg: Targets) -> None:
        if tg.epoch <= self.epoch_in_force or tg.issued_at + tg.ttl_s <= t:
            return
        self.targets = tg
        self.epoch_in_force = tg.epoch
        for i in range(len(self.static.pools)):
            rma, sbm = tg.assignment.get(i, (0.0, 0.0))
            self._set_assignment(i, rma, sbm, t)
        self._refresh_quotas(t, False)
        self._mix_key = None
        self.emit("target.applied", t, {"epoch": tg.epoch})
        self._push(tg.issued_at + tg.ttl_s, _EV_EXPIRE, tg.epoch)

    def _on_expire(self, t: float, epoch: int) -> None:
        if self.targets is None or self.targets.epoch != epoch:
            return
        self.targets = None
        self._mix_key = None
        self.emit("target.expired", t, {"epoch": epoch})

    # -- the plan in force ------------------------------------------------------------------

    def _current_mix(self, now: float, span: float) -> Mix:
        pol = self.policy
        if pol.direct:
            plan = pol.direct_plan(now, span, self)
            if plan is None:
                return self.base_mix
            mix = self._direct_mixes.get(id(plan))
            if mix is None or mix.plan is not plan:
                mix = build_mix(self.ctx, plan)
                self._direct_mixes[id(plan)] = mix
            return mix
        tg = self.targets
        if tg is None or self.traces.in_baseline_only(now):  # no target, or the client is down
            self._mix_key = ("base",)
            return self.base_mix
        m_rma, m_sbm = pol.multipliers(now)
        key = (tg.epoch, round(m_rma, 4), round(m_sbm, 4), self.quotas)
        sheds = pol.server_sheds
        if key == self._mix_key and not sheds:
            return self.mix
        ctx = self.ctx
        pop = ctx.pop
        # what the clients ask for: the one client plan (defences/plan.py), over the cells
        asked = self.planner.plan(tg, m_rma, m_sbm)
        rma_req, sbm_req, extra = asked.rma, asked.sbm, asked.extra
        adm = pol.admit(now, span, rma_req, sbm_req, self) if sheds else None
        if adm is None:
            rma_adm, sbm_adm = rma_req, sbm_req
            down = np.zeros(pop.n_cells)
        else:
            rma_adm, sbm_adm = adm
            down = np.clip(sbm_req - sbm_adm, 0.0, 1.0)
        fail = np.zeros(pop.n_cells)
        if self.quotas.sbm_acc <= _EPS and sbm_adm.any():
            fail, sbm_adm = sbm_adm, np.zeros(pop.n_cells)  # no replica: fail fast, retry
        self._mix_key = key
        old = self.mix.plan
        levels = (extra,) if extra > 0 else ()
        if (
            old.levels == levels
            and np.array_equal(old.sbm, sbm_adm)
            and np.array_equal(old.down, down)
            and np.array_equal(old.fail, fail)
            and (not levels or np.array_equal(old.rma[0], rma_adm))
        ):
            return self.mix
        rma = rma_adm[None, :] if levels else np.zeros((0, pop.n_cells))
        return build_mix(ctx, Plan(levels, rma, sbm_adm, down, fail))

    # -- the main loop ----------------------------------------------------------------------

    def run_window(self, w: int) -> None:
        ctx = self.ctx
        tr = ctx.traces
        t0 = w * ctx.window_s
        t1 = min(t0 + ctx.window_s, ctx.duration_s)
        t = t0
        while t < t1 - _EPS:
            while self.heap and self.heap[0][0] <= t + _EPS:
                et, kind, _, payload = heapq.heappop(self.heap)
                self._handle(max(et, t), kind, payload)
            step = tr.step_of(t)
            self.arrival_rate = float(self.traces.rate[step])
            nxt = min(self.heap[0][0] if self.heap else math.inf, t1)
            steady = self.policy.steady() and not self.pending and self._quiet()
            end = nxt if steady else min(nxt, float(tr.step_edges[step + 1]))
            if getattr(self.policy, "hot", lambda: False)():
                # a server fighting a queue decides every hot_step_s: CoDel's control law
                # acts in 100 ms intervals and is not resolved by one reading per step
                end = min(end, t + self.cfg.hot_step_s)
            end = max(end, t + _EPS)
            mix = self._current_mix(t, end - t)
            self.mix = mix
            if self.pending:
                self._resolve_pending(t, mix)
            t = self._advance(t, end, mix)
        self._close_window(t0, t1)

    def _quiet(self) -> bool:
        return (
            self.cpu.backlog_s <= 0.0
            and self.acc.backlog_s <= 0.0
            and self.strong.backlog_s <= 0.0
            and self.opt_cpu.backlog_s <= 0.0
            and self.opt_acc.backlog_s <= 0.0
            and self.noticed_at is None
        )

    def _resolve_pending(self, t: float, mix: Mix) -> None:
        if self.noticed_at is not None or not self._fits(mix, self.quotas):
            return
        self._release_all(t)

    def _release_all(self, t: float) -> None:
        for p in self.pending:
            key = self.static.pools[p.pool]
            self.emit(
                "optional.released",
                t,
                {
                    "resource": key.resource,
                    "hardware": key.hardware,
                    "t": p.t,
                    "release_ms": (t - p.t) * 1000.0,
                    "units_before": p.before,
                    "units_after": p.after,
                    "dropped": {"rma_candidates": 0, "sbm_requests": 0, "precompute_jobs": 0},
                },
            )
        self.pending.clear()

    def _advance(self, t: float, end: float, mix: Mix) -> float:
        """The fluid model from ``t`` to ``end`` under one mix, as one block of steps.

        Stops early, after the first step at which a queue starts to build, so that policies
        that react to queues see it at step resolution. Returns the time reached.
        """
        tr = self.ctx.traces
        rt = self.traces
        st = self.static
        par = self.cfg.latency.cpu_parallelism
        q = self.quotas
        ideal = self.policy.ideal
        bm = self.base_mix
        i0 = tr.step_of(t)
        i1 = tr.step_of(max(end - _EPS, t))
        idx = np.arange(i0, i1 + 1)
        starts = np.maximum(tr.step_edges[idx], t)
        ends = np.minimum(tr.step_edges[idx + 1], end)
        dt = ends - starts
        length = tr.step_len[idx]
        a = rt.arrivals[idx] * np.where(length > 0, dt / np.where(length > 0, length, 1.0), 0.0)
        # queues see the request *rate*: the Poisson noise of the counts is already in the
        # M/G/c wait; counting it again as fluid backlog would double it
        lam = rt.rate[idx]
        # baseline first: every request's baseline part queues on the dedicated capacity ahead
        # of any optional part, so its utilisation is the baseline work's alone (module doc)
        rc = _rho_arr(lam * mix.base_cpu, st.ded_cpu)
        ra = _rho_arr(lam * mix.base_acc, st.ded_acc)
        rs = _rho_arr(lam * mix.strong_acc, q.sbm_acc)
        one = np.ones_like(lam)
        if ideal:
            rs = np.minimum(rs, 1.0)
            phi_c = phi_a = phi_s = one
            roc = roa = np.zeros_like(lam)
        else:
            roc = _rho_arr(lam * mix.opt_cpu, q.rma_cpu + q.sbm_cpu)
            roa = _rho_arr(lam * mix.opt_acc, q.rma_acc)
            phi_c = np.where(roc > 1.0, 1.0 / np.maximum(roc, 1.0), 1.0)
            phi_a = np.where(roa > 1.0, 1.0 / np.maximum(roa, 1.0), 1.0)
            phi_s = np.where(rs > 1.0, 1.0 / np.maximum(rs, 1.0), 1.0)
        # the stage the optional parts queue in: its throughput is set by whichever kind of work
        # is more loaded on its own capacity (sim/latency.py)
        mc = np.maximum(rc, roc)
        ma = np.maximum(ra, roa)
        src = _rho_arr(lam * bm.base_cpu, st.ded_cpu)
        sra = _rho_arr(lam * bm.base_acc, st.ded_acc)
        # a block that is about to build a queue stops after that step (policies react to it)
        hot = (mc > 1.0) | (ma > 1.0) | (rs > 1.0)
        k = idx.size
        if idx.size > 1 and hot.any():
            k = int(np.argmax(hot)) + 1
        if self.policy.server_sheds and idx.size > 1:
            # servers' token buckets act per request: a block whose traffic rises well above
            # the rate its admission was decided for ends before that step, so the servers
            # decide again for the new rate (a surge is not admitted at the old one)
            jump = lam > lam[0] * _RATE_JUMP
            if jump.any():
                k = min(k, max(1, int(np.argmax(jump))))
        if k < idx.size:
            idx, dt, a, lam = idx[:k], dt[:k], a[:k], lam[:k]
            rc, ra, rs, src, sra = rc[:k], ra[:k], rs[:k], src[:k], sra[:k]
            phi_c, phi_a, phi_s, one, ends = phi_c[:k], phi_a[:k], phi_s[:k], one[:k], ends[:k]
            roc, roa, mc, ma = roc[:k], roa[:k], mc[:k], ma[:k]
        c0, c1 = _fluid(self.cpu, rc, dt)
        a0, a1 = _fluid(self.acc, ra, dt)
        oc0, oc1 = _fluid(self.opt_cpu, roc, dt)
        oa0, oa1 = _fluid(self.opt_acc, roa, dt)
        s0, s1 = _fluid(self.strong, rs, dt)
        sc0, sc1 = _fluid(self.shadow_cpu, src, dt)
        sa0, sa1 = _fluid(self.shadow_acc, sra, dt)
        n = idx.size
        fail = np.zeros(n)
        if self._lost_strong:
            fail[0] = self._lost_strong
            self._lost_strong = 0.0
        sp = 1.0 if ideal else speed(q.sbm_acc)
        block = np.column_stack(
            (
                a, lam, dt, rc, ra, rs, c0, c1, a0, a1, s0, s1, src, sra, sc0, sc1, sa0, sa1,
                fail, sp * one, ((st.ded_cpu + q.rma_cpu + q.sbm_cpu) / par) * one,
                (st.ded_acc + q.rma_acc) * one, (0.0 if ideal else q.sbm_acc) * one,
                mc, ma, oc0, oc1, oa0, oa1, roc, roa,
            )
        )  # fmt: skip
        self._blocks.append((mix, block))
        # capacity used by optional work (throughput, never above the quota) and offered
        win = self._win
        win[0] += float((lam * dt * phi_c).sum()) * mix.opt_cpu / 1000.0
        win[1] += float((lam * dt * (mix.opt_acc * phi_a + mix.strong_acc * phi_s)).sum()) / 1000.0
        win[2] += float((lam * dt).sum()) * mix.opt_cpu / 1000.0
        win[3] += float((lam * dt).sum()) * (mix.opt_acc + mix.strong_acc) / 1000.0
        t_end = float(ends[-1])
        self.arrival_rate = float(lam[-1])
        if getattr(self.policy, "wants_health", False):
            health = self._health(t_end, mix, block[-1])
            for kind, fields in self.policy.feedback(health, self):
                self.emit(kind, t_end, fields)
        return t_end

    def _health(self, now: float, mix: Mix, row: FloatArray) -> Health:
        """Health after the step ``row``: standing queues (what CoDel judges: the fluid backlog
        plus the median stochastic wait, :func:`_standing`) and work in flight per server
        (Little's law)."""
        c = _R
        # the mixed replicas as a whole: the stage utilisation the optional parts queue in
        wc = wait_params(row[c["mc"]], row[c["nc"]], mix.cpu_mean, mix.cpu_cs2)
        wa = wait_params(row[c["ma"]], row[c["na"]], mix.acc_mean, mix.acc_cs2)
        ws = wait_params(row[c["rs"]], row[c["ns"]], mix.strong_mean, mix.strong_cs2)
        fc = max(row[c["c1"]], row[c["oc1"]])
        fa = max(row[c["a1"]], row[c["oa1"]])
        m_q = 1000.0 * max(fc, fa) + max(_standing(wc), _standing(wa))
        s_q = 1000.0 * row[c["s1"]] + _standing(ws)
        common = self.cfg.latency.overhead_ms + 1000.0 * fc + wc.mean_ms
        mixed_wait = 1000.0 * fa + wa.mean_ms
        strong_wait = 1000.0 * row[c["s1"]] + ws.mean_ms
        lat = common + mix.service_ms + mix.penalty_ms
        lat = lat + np.where(mix.strong_stage, strong_wait, mixed_wait)
        lam = float(row[c["lam"]])
        servers = self.static.servers
        units = float((mix.frac * lat * mix.work_units).sum()) * lam / 1000.0 / servers
        base_units = float(mix.frac @ lat) * lam / 1000.0 / servers * (self.ctx.n0 / 100.0)
        return Health(now, m_q, s_q, units, min(base_units, units), float(mix.frac @ lat))

    def sample_step_latencies(self, rng: np.random.Generator, k: int) -> FloatArray:
        """``k`` response times of the newest step (peer limits' samples), capped at the timeout."""
        if not self._blocks:
            return np.zeros(0)
        mix, block = self._blocks[-1]
        strata, _ = _strata(self, block[-1:], mix)
        lat, _, _ = sample_window(strata, self.cfg.latency, self.ctx.timeout_ms, rng.random((4, k)))
        return lat

    # -- windows ------------------------------------------------------------------------------

    def _win_reset(self) -> None:
        self._win = [0.0, 0.0, 0.0, 0.0]  # used cpu, used acc, demand cpu, demand acc (unit·s)

    def _obs_reset(self) -> None:
        self.obs_keys = np.zeros((4, _KEY_SPAN))  # all, base, rma, sbm
        self.obs_requests = 0
        self.obs_seg = np.zeros(self.ctx.pop.n_segments)
        self.obs_sbm = 0.0
        self.obs_value: dict[tuple[str, str, str], ArmStats] = {}

    def _close_window(self, t0: float, t1: float) -> None:
        """Keep what the window's event needs; the events of a control interval are computed
        together (one vectorised pass) when the interval ends."""
        tg = self.targets
        q = self.quotas
        if self.precompute is not None:
            used_cpu, used_acc = self.precompute.advance(t0, t1, self)
            self._win[0] += used_cpu
            self._win[1] += used_acc
        self._pending_windows.append(
            {
                "t0": t0,
                "t1": t1,
                "blocks": self._blocks,
                "win": list(self._win),
                "targets": {
                    "rma_candidates": tg.rma_candidates if tg is not None else self.ctx.n0,
                    "sbm_coverage": tg.sbm_coverage if tg is not None else 0.0,
                },
                "capacity": self._capacity_now(),
                "quotas": {
                    "rma_cpu": q.rma_cpu,
                    "rma_accelerator": q.rma_acc,
                    "sbm_cpu": q.sbm_cpu,
                    "sbm_accelerator": q.sbm_acc,
                },
            }
        )
        self._blocks = []
        self._win_reset()
        if math.floor(t1 / self.interval + 1e-9) > math.floor(t0 / self.interval + 1e-9) or (
            t1 >= self.ctx.duration_s - _EPS
        ):
            self._flush_windows()

    def _flush_windows(self) -> None:
        """The ``window`` events of the pending windows (module docstring: ground truth, latency
        sketches, holdout sums), computed in one pass over all their steps."""
        ctx = self.ctx
        pop = ctx.pop
        cfg = self.cfg.latency
        recs = self._pending_windows
        self._pending_windows = []
        n_w = len(recs)
        n_s = pop.n_segments
        m_samples = cfg.samples_per_window
        # per window: its requests per segment and arm (integers, the same for every policy) and
        # its latency random numbers, drawn in window order from streams every policy shares
        blocks: list[tuple[Mix, FloatArray, int]] = []
        n_req = np.zeros(n_w, dtype=np.int64)
        n_seg = np.zeros((n_w, n_s), dtype=np.int64)
        n_ctl = np.zeros((n_w, n_s), dtype=np.int64)
        uniforms = np.empty((4, n_w * m_samples))
        a_win = np.zeros(n_w)
        for w, rec in enumerate(recs):
            a_sum = sum(float(b[:, _R["a"]].sum()) for _, b in rec["blocks"])
            a_win[w] = a_sum
            n_req[w] = round(a_sum)
            n_seg[w] = self.count_rng.multinomial(int(n_req[w]), pop.seg_share)
            n_ctl[w] = self.count_rng.binomial(n_seg[w], ctx.holdout)
            uniforms[:, w * m_samples : (w + 1) * m_samples] = self.lat_rng.random((4, m_samples))
            blocks.extend((mix, b, w) for mix, b in rec["blocks"])
        # group every step of the batch by the mix in force
        groups: dict[int, tuple[Mix, list[FloatArray], list[IntArray]]] = {}
        for mix, b, w in blocks:
            grp = groups.setdefault(id(mix), (mix, [], []))
            grp[1].append(b)
            grp[2].append(np.full(b.shape[0], w, dtype=np.int64))
        s_value = np.zeros((n_w, n_s))
        s_base = np.zeros((n_w, n_s))
        s_count = np.zeros(n_s)
        seg_sbm = np.zeros((n_w, n_s))
        inc_rma = np.zeros(n_w)
        inc_sbm = np.zeros(n_w)
        inc_lost = np.zeros(n_w)
        treated_rma = np.zeros(n_w)
        treated_sbm = np.zeros(n_w)
        routed = 0.0
        timeouts = np.zeros(n_w)
        base_pi_num = 0.0
        total_a = 0.0
        arm_acc: dict[str, list[tuple[ArmParts, FloatArray, float]]] = {}
        strata_parts: list[Strata] = []
        strata_win: list[IntArray] = []
        for mix, bl, wl in groups.values():
            g = np.vstack(bl)
            widx: IntArray = np.concatenate(wl)
            a = g[:, _R["a"]]
            a_sum = float(a.sum())
            strata, k = _strata(self, g, mix)
            pi = in_time_probability(strata, cfg, ctx.timeout_ms).reshape(-1, k)
            pi_s = in_time_probability(_shadow_strata(self, g), cfg, ctx.timeout_ms)
            strata_parts.append(strata)
            strata_win.append(np.repeat(widx, k))
            a_pi_rows = a[:, None] * pi  # (rows, K)
            a_pis = a * pi_s
            n_levels = len(mix.plan.levels)
            r_rma = slice(1, 1 + n_levels)
            r_sbm = slice(1 + n_levels, 4 + n_levels)
            _add_rows(s_value, widx, a_pi_rows @ mix.value)
            _add_rows(s_base, widx, np.outer(a_pis, mix.base_value.sum(axis=0)))
            s_count += a_sum * mix.count.sum(axis=0)
            _add_rows(seg_sbm, widx, np.outer(a, mix.count[1 + n_levels]))
            # value by lever and lost value (module docstring, *Ground truth*): a class's
            # requests that finished in time credit their lever with value − baseline value;
            # the baseline value of requests that missed the timeout while the shadow's made it
            # (in-time probability pi_k against pi_s) is lost. The parts add up to
            # value_total − value_baseline exactly.
            cls_value = mix.value.sum(axis=1)  # (K,)
            cls_base = mix.base_value.sum(axis=1)
            gain = a_pi_rows * (cls_value - cls_base)[None, :]
            inc_rma += np.bincount(widx, weights=gain[:, r_rma].sum(axis=1), minlength=n_w)
            inc_sbm += np.bincount(widx, weights=gain[:, r_sbm].sum(axis=1), minlength=n_w)
            inc_lost += np.bincount(
                widx, weights=(a_pi_rows - a_pis[:, None]) @ cls_base, minlength=n_w
            )
            treated_rma += np.bincount(widx, weights=a, minlength=n_w) * float(
                mix.frac[r_rma].sum()
            )
            treated_sbm += np.bincount(widx, weights=a, minlength=n_w) * float(
                mix.frac[1 + n_levels]
            )
            routed += a_sum * float(mix.frac[r_sbm].sum())
            lost = g[:, _R["fail"]] * (1.0 - pi[:, -1])
            timeouts += np.bincount(widx, weights=a * ((1.0 - pi) @ mix.frac) + lost, minlength=n_w)
            base_pi_num += float(a_pi_rows[:, 0].sum())
            total_a += a_sum
            if a_sum > 0:
                a_pi = a_pi_rows.sum(axis=0)
                for name, parts in mix.arm_parts.items():
                    if parts.weights.sum() > 0:
                        arm_acc.setdefault(name, []).append((parts, a_pi[parts.row] / a_sum, a_sum))
        # holdout sums and value signals, once per control interval (the estimate is the same
        # as with one draw per window: the sums add up); they ride on the interval's last window
        pi_ctl = base_pi_num / total_a if total_a > 0 else 1.0
        arms, value_obs, est_strata = self._arms(
            n_ctl.sum(axis=0), (n_seg - n_ctl).sum(axis=0), s_count, pi_ctl, arm_acc
        )
        pre = None
        if self.precompute is not None:
            # hits are drawn per segment only: the estimator then reads the segments' arms
            est_strata = {}
            # hits replace the live outcome of their requests (sim/precompute_sim.py)
            pre = self.precompute.flush(a_win, s_value, pi_ctl)
            s_value = s_value + pre.inc_seg
            value_obs.update(pre.value_obs)
            _add_precompute_arm(arms, pre)
        _add_strata(self._strata_acc, est_strata)
        t_last = float(recs[-1]["t1"])
        if t_last - self._strata_since >= STRATA_EVERY_S - _EPS or (
            t_last >= ctx.duration_s - _EPS
        ):
            est_strata, self._strata_acc = self._strata_acc, {}
            self._strata_since = t_last
        else:
            est_strata = {}
        # latency: a stratified sample per window, computed in one pass
        strata_all = _concat_strata(strata_parts) if strata_parts else None
        if strata_all is not None and strata_all.size:
            swin = np.concatenate(strata_win)
            lat, weights, paths, sample_win = _sample_windows(
                strata_all, swin, n_w, cfg, ctx.timeout_ms, uniforms, m_samples
            )
        else:
            lat = weights = np.zeros(0)
            paths = sample_win = np.zeros(0, dtype=np.int64)
        if getattr(self.policy, "observes", True):
            self._fold_obs(
                lat, weights, paths, int(n_req.sum()), n_seg.sum(axis=0), routed, value_obs
            )
        sketches = _window_sketches(lat, weights, paths, sample_win, n_req)
        for w, rec in enumerate(recs):
            t0, t1 = rec["t0"], rec["t1"]
            win = rec["win"]
            n_to = round(float(timeouts[w]))
            treated = {"rma": float(treated_rma[w]), "sbm": float(treated_sbm[w])}
            if pre is not None:
                treated["precompute"] = float(pre.fields[w]["hits"])
            traffic = WindowTraffic(
                requests=int(n_req[w]),
                # a request that does not finish within the timeout delivers nothing: it fails
                errors=n_to,
                timeouts=n_to,
                sketch=sketches[w][0],
                sketch_base=sketches[w][1],
                # ground truth: the conditional expectation given the window's arrivals
                # (spread over the cells by their shares), the counts the bound uses too
                value_total=float(s_value[w].sum()),
                value_baseline=float(s_base[w].sum()),
                inc={
                    "rma": float(inc_rma[w]),
                    "sbm": float(inc_sbm[w]),
                    "precompute": float(pre.inc[w]) if pre is not None else 0.0,
                },
                value_lost=float(inc_lost[w]),
                # the holdout sums and the intent-to-treat sums the control plane learned
                # from are drawn once per control interval: on its last window
                arms=arms if w == n_w - 1 else {},
                strata=est_strata if w == n_w - 1 else {},
                itt=_itt_of(value_obs) if w == n_w - 1 else {},
                eligible_treated=treated,
                segments={
                    seg: {
                        "requests": int(n_seg[w, si]),
                        "sbm": float(seg_sbm[w, si]),
                        "inc": float(s_value[w, si] - s_base[w, si]),
                    }
                    for si, seg in enumerate(ctx.segment_names)
                },
                targets=rec["targets"],
            )
            self.emit(
                "window",
                t0,
                window_event(
                    t0,
                    t1,
                    traffic,
                    offered_unit_s=ctx.traces.offered_unit_s(self.r, t0, t1),
                    used_unit_s={"cpu": win[0], "accelerator": win[1]},
                    demand_unit_s={"cpu": win[2], "accelerator": win[3]},
                    capacity=rec["capacity"],
                    quotas=rec["quotas"],
                    precompute=pre.fields[w] if pre is not None else None,
                ),
            )

    def _arms(
        self,
        n_ctl: IntArray,
        n_trt: IntArray,
        s_count: FloatArray,
        pi_ctl: float,
        arm_acc: Mapping[str, list[tuple[ArmParts, FloatArray, float]]],
    ) -> tuple[
        dict[str, dict[str, dict[str, Any]]],
        dict[tuple[str, str, str], ArmStats],
        dict[str, dict[str, dict[str, Any]]],
    ]:
        """Observed sums of the control arm and of every treatment group, per population cell
        (segment × value bin), drawn in one batch (group g, cell c → virtual group ``g·C + c``).

        The control plane gets them per (segment, value bin) stratum
        (:func:`headroom.controllers.types.stratum_key`): a client knows a request's value signal
        before ranking in either arm, so it reports its sums per value bin and the estimator
        post-stratifies on it. The window line's ``arms`` stay per segment (their sums)."""
        ctx = self.ctx
        pop = ctx.pop
        n_s = pop.n_segments
        n_c = pop.n_cells
        k_bins = pop.bins
        names = ctx.segment_names
        groups = ["control"] + [g for g in _ARM_GROUPS if arm_acc.get(g)]
        n_all = np.zeros(len(groups) * n_c, dtype=np.int64)
        # the control arm's requests fall in a segment's value bins with equal probability
        for si in range(n_s):
            if n_ctl[si] > 0:
                n_all[si * k_bins : (si + 1) * k_bins] = self.arm_rng.multinomial(
                    int(n_ctl[si]), np.full(k_bins, 1.0 / k_bins)
                )
        w_l = [pop.share]
        cell_l = [np.arange(n_c)]
        q_l = [ctx.q_base]
        sd_l = [ctx.sd_base]
        pi_l = [np.full(n_c, pi_ctl)]
        vgrp_l = [np.arange(n_c)]
        trt_fluid = s_count * ctx.treat
        # work per request of each (group, cell): the treatment sums' ``cost``
        cpu_per = np.zeros(len(groups) * n_c)
        acc_per = np.zeros(len(groups) * n_c)
        for gi, name in enumerate(groups[1:], start=1):
            got = arm_acc[name]
            w = np.concatenate([p.weights * a for p, _, a in got])
            cell = np.concatenate([p.cell for p, _, _ in got])
            fluid = np.bincount(cell, weights=w, minlength=n_c)
            with np.errstate(divide="ignore", invalid="ignore"):
                for per, attr in ((cpu_per, "cpu_ms"), (acc_per, "acc_ms")):
                    work = np.concatenate([getattr(p, attr) for p, _, _ in got])
                    tot = np.bincount(cell, weights=w * work, minlength=n_c)
                    per[gi * n_c : (gi + 1) * n_c] = np.where(fluid > 0, tot / fluid, 0.0)
            seg_fluid = trt_fluid[pop.seg]
            with np.errstate(divide="ignore", invalid="ignore"):
                n_arm = np.where(seg_fluid > 0, np.round(fluid / seg_fluid * n_trt[pop.seg]), 0)
            n_all[gi * n_c : (gi + 1) * n_c] = np.minimum(n_arm, n_trt[pop.seg]).astype(np.int64)
            w_l.append(w)
            cell_l.append(cell)
            q_l.append(np.concatenate([p.q for p, _, _ in got]))
            sd_l.append(np.concatenate([p.sd for p, _, _ in got]))
            pi_l.append(np.concatenate([pi for _, pi, _ in got]))
            vgrp_l.append(gi * n_c + cell)
        s1, s2, x1, x2, xy, n_late, x_late, x2_late = arm_signal_sums(
            self.arm_rng,
            pop,
            n_all,
            np.concatenate(w_l),
            np.concatenate(vgrp_l),
            np.concatenate(cell_l),
            np.concatenate(q_l),
            np.concatenate(sd_l),
            np.concatenate(pi_l),
        )
        arms: dict[str, dict[str, dict[str, Any]]] = {}
        value_obs: dict[tuple[str, str, str], ArmStats] = {}
        strata = _estimator_strata(
            groups, n_all, (s1, s2, x1, x2, xy, n_late, x_late, x2_late), pop, names
        )
        for gi, name in enumerate(groups):
            lo = gi * n_c
            for si, seg in enumerate(names):
                cells = range(si * k_bins, (si + 1) * k_bins)
                n = int(n_all[lo + cells.start : lo + cells.stop].sum())
                if n <= 0:
                    continue
                sums = {
                    "n": n,
                    "value_sum": float(s1[lo + cells.start : lo + cells.stop].sum()),
                    "value_sq_sum": float(s2[lo + cells.start : lo + cells.stop].sum()),
                }
                if name != "control" and not name.startswith("itt_"):
                    arms.setdefault(seg, {})[name] = sums
                    continue
                if name == "control":
                    arms.setdefault(seg, {})["control"] = sums
                for c in cells:
                    nc = int(n_all[lo + c])
                    if nc <= 0:
                        continue
                    st = ArmStats(
                        nc,
                        float(s1[lo + c]),
                        float(s2[lo + c]),
                        nc * float(cpu_per[lo + c]),
                        nc * float(acc_per[lo + c]),
                        float(x1[lo + c]),
                        float(x2[lo + c]),
                        float(xy[lo + c]),
                    )
                    key = stratum_key(seg, c - cells.start)
                    if name == "control":
                        value_obs[(key, "rma", "control")] = st
                        value_obs[(key, "sbm", "control")] = st
                    else:
                        value_obs[(key, name[4:], "treatment")] = st
        return arms, value_obs, strata

    def _capacity_now(self) -> dict[str, float]:
        out = {"cpu": 0.0, "accelerator": 0.0}
        for i, key in enumerate(self.static.pools):
            out[key.resource] += self.level[i]
        return out

    # -- observation for the control plane --------------------------------------------------

    def _fold_obs(
        self,
        lat: FloatArray,
        weights: FloatArray,
        paths: IntArray,
        n_req: int,
        n_seg: IntArray,
        sbm_routed: float,
        value: Mapping[tuple[str, str, str], ArmStats],
    ) -> None:
        if lat.size:
            keys = np.clip(keys_of(lat, SKETCH_ALPHA), 0, _KEY_SPAN - 1)
            self.obs_keys[0] += np.bincount(keys, weights=weights, minlength=_KEY_SPAN)
            for p in (PATH_BASE, PATH_RMA, PATH_SBM):
                sel = paths == p
                if sel.any():
                    self.obs_keys[1 + p] += np.bincount(
                        keys[sel], weights=weights[sel], minlength=_KEY_SPAN
                    )
        self.obs_requests += n_req
        self.obs_seg += n_seg
        # observed coverage counts what clients *routed* to the strong model: a request its
        # server downgraded was still routed, and the calibration loop must not chase shedding
        self.obs_sbm += sbm_routed
        for k, v in value.items():
            prev = self.obs_value.get(k)
            self.obs_value[k] = v if prev is None else prev + v

    def _observation(self, now: float) -> RegionObservation:
        """What the controllers know about the last interval (then the accumulators reset)."""
        ctx = self.ctx
        # the accumulators hold everything since they were last read: one interval, or more
        # after a control outage (no step read them), so rates divide by the time they cover
        span = now - self._obs_at if now - self._obs_at > _EPS else self.interval
        self._obs_at = now
        p99: dict[str, float | None] = {}
        for idx, name in enumerate(("all", "base", "rma", "sbm")):
            h = self.obs_keys[idx]
            tot = float(h.sum())
            if tot <= 0:
                p99[name] = None
                continue
            k = int(np.searchsorted(np.cumsum(h), 0.99 * tot))
            p99[name] = float(bin_values([k], SKETCH_ALPHA)[0])
        rps = self.obs_requests / span
        seg_rps = {s: float(self.obs_seg[i]) / span for i, s in enumerate(ctx.segment_names)}
        eligible = self.obs_requests * ctx.treat * ctx.eligible
        st = self.static
        capacity = [
            CapacityLevel("cpu", "any", "dedicated", st.ded_cpu, ts=now),
            CapacityLevel("accelerator", st.ded_hardware, "dedicated", st.ded_acc, ts=now),
        ]
        for i, key in enumerate(st.pools):
            capacity.append(
                CapacityLevel(
                    resource=key.resource,  # type: ignore[arg-type]  # "cpu" | "accelerator"
                    hardware=key.hardware,
                    pool="opportunistic",
                    # a capacity silence: the level known when it began (kernel/faults.py)
                    units=self.traces.level_seen(i, now, self.level[i]),
                    # the feed re-announces every level each interval with its expected lifetime
                    expires_in_s=self.traces.pools[i].expires_in_s,
                    remote=key.remote,
                    ts=now,
                )
            )
        obs = RegionObservation(
            region=st.name,
            now=now,
            window_s=span,
            p99_ms=p99,
            request_rps=rps,
            eligible_rps=rps * ctx.eligible,
            segment_rps=seg_rps,
            capacity=tuple(capacity),
            value=dict(self.obs_value),
            observed_coverage=self.obs_sbm / eligible if eligible > 0 else None,
            value_age_s=0.0 if self.obs_value else None,
        )
        self._obs_reset()
        return obs


_RATE_JUMP = 1.05  # traffic this much above a block's first step re-decides admission


def _rho(offered_ms_per_s: float, units: float) -> float:
    """Utilisation of ``units`` (cores or devices) offered ``offered_ms_per_s`` of work."""
    if offered_ms_per_s <= 0.0:
        return 0.0
    if units <= 0.0:
        return RHO_FLUID_CAP
    return offered_ms_per_s / (1000.0 * units)


def _itt_of(value_obs: Mapping[tuple[str, str, str], ArmStats]) -> dict[str, Any]:
    """``{SEG: {LEVER: {n, value_sum, value_sq_sum}}}`` of the treatment groups."""
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for (key, lever, arm), st in value_obs.items():
        if arm == "treatment":
            sums = out.setdefault(segment_of(key), {}).setdefault(
                lever, {"n": 0, "value_sum": 0.0, "value_sq_sum": 0.0}
            )
            sums["n"] += st.n
            sums["value_sum"] += st.value_sum
            sums["value_sq_sum"] += st.value_sq_sum
    return out


def _rho_arr(offered_ms_per_s: FloatArray, units: float) -> FloatArray:
    """:func:`_rho` over an array of offered work."""
    if units <= 0.0:
        return np.where(offered_ms_per_s > 0.0, RHO_FLUID_CAP, 0.0)
    return np.maximum(offered_ms_per_s, 0.0) / (1000.0 * units)


def _fluid(stage: StageState, rho: FloatArray, dt: FloatArray) -> tuple[FloatArray, FloatArray]:
    """Advance a stage's fluid backlog over consecutive steps; backlog at each step's start/end."""
    n = rho.size
    if stage.backlog_s <= 0.0 and not (rho > 1.0).any():
        z = np.zeros(n)
        return z, z
    b0 = np.empty(n)
    b1 = np.empty(n)
    for j in range(n):
        b0[j], b1[j] = stage.advance(float(rho[j]), float(dt[j]))
    return b0, b1


def _standing(w: WaitParams) -> float:
    """Median of a stage's stochastic wait (ms): non-zero once most requests queue.

    CoDel judges the *minimum* sojourn over an interval, i.e. a queue that does not drain; with
    one reading per step, the median wait is the step-level stand-in: 0 while fewer than half the
    requests wait at all, the typical wait once a queue persists."""
    if w.p <= 0.5 or w.rate <= 0:
        return 0.0
    return math.log(2.0 * w.p) / w.rate


# --------------------------------------------------------------------------------------------
# A window's strata
# --------------------------------------------------------------------------------------------


def _strata(run: RegionRun, g: FloatArray, mix: Mix) -> tuple[Strata, int]:
    """Strata of (step, class) for steps ``g`` (rows) under one mix, step-major."""
    k = mix.frac.size
    n = g.shape[0]
    col = _R
    a = g[:, col["a"]]
    count = np.outer(a, mix.frac)
    fail = g[:, col["fail"]]
    count[:, -1] += fail
    strong = mix.strong_stage[None, :]
    stretch = mix.strong_mean * (1.0 / g[:, col["speed"]] - 1.0)
    service = mix.service_ms[None, :] + np.where(strong, stretch[:, None], 0.0)
    penalty = np.broadcast_to(mix.penalty_ms, (n, k)).copy()
    with np.errstate(divide="ignore", invalid="ignore"):
        extra_pen = np.where(count[:, -1] > 0, fail * 0.5 * mix.strong_mean / count[:, -1], 0.0)
    penalty[:, -1] += extra_pen
    # baseline first (module doc of sim/latency.py): every request's baseline part waits in the
    # baseline queue — the baseline work alone, ahead of every optional part, on the dedicated
    # capacity plus the quota's units optional work leaves idle (never fewer than static has)
    bm = run.base_mix
    st_ = run.static
    ded_c = st_.ded_cpu / run.cfg.latency.cpu_parallelism
    bc_p, bc_r = baseline_wait_params(
        g[:, col["rc"]], ded_c, g[:, col["nc"]], g[:, col["roc"]], bm.cpu_mean, bm.cpu_cs2
    )
    ba_p, ba_r = baseline_wait_params(
        g[:, col["ra"]], st_.ded_acc, g[:, col["na"]], g[:, col["roa"]], bm.acc_mean, bm.acc_cs2
    )
    # ... and its optional part (RMA's extra candidates, the strong model's CPU work) waits at
    # low priority in the whole stage: its wait stretches by 1 / (1 − ρ_H), ρ_H the share of
    # the stage the baseline keeps busy (non-preemptive priority, Cobham's formula)
    oc_p, oc_r = wait_params_array(g[:, col["mc"]], g[:, col["nc"]], mix.cpu_mean, mix.cpu_cs2)
    oa_p, oa_r = wait_params_array(g[:, col["ma"]], g[:, col["na"]], mix.acc_mean, mix.acc_cs2)
    oc_r = oc_r * low_priority_factor(g[:, col["rc"]], ded_c, g[:, col["nc"]])
    oa_r = oa_r * low_priority_factor(g[:, col["ra"]], st_.ded_acc, g[:, col["na"]])
    ws_p, ws_r = wait_params_array(
        g[:, col["rs"]], g[:, col["ns"]], mix.strong_mean, mix.strong_cs2
    )
    # a request with optional work waits for both of its parts, one after the other (the ideal
    # packing of the oracle adds no queueing of its own: its optional parts never wait)
    if run.policy.ideal:
        tc_p, tc_r, ta_p, ta_r = bc_p, bc_r, ba_p, ba_r
    else:
        tc_p, tc_r = serial_waits(bc_p, bc_r, oc_p, oc_r)
        ta_p, ta_r = serial_waits(ba_p, ba_r, oa_p, oa_r)

    # RMA's extra candidates queue at low priority on both mixed stages; the strong model's own
    # CPU work (SBM) is charged to the optional CPU quota, so it is slowed with the optional
    # backlog, but it runs beside the strong replica's devices, not in the mixed replicas' queue
    opt_cpu = np.tile(mix.path != PATH_BASE, n)  # RMA and SBM: optional CPU work
    opt_acc = np.tile(mix.path == PATH_RMA, n)  # RMA: optional base-model accelerator work
    sel = np.tile(mix.strong_stage, n)  # step-major flattening: class varies fastest

    def either(mask: npt.NDArray[np.bool_], yes: FloatArray, no: FloatArray) -> FloatArray:
        return np.where(mask, np.repeat(yes, k), np.repeat(no, k))

    def acc(strong_x: FloatArray, opt_x: FloatArray, base_x: FloatArray) -> FloatArray:
        return np.where(sel, np.repeat(strong_x, k), either(opt_acc, opt_x, base_x))

    c0, c1, a0, a1 = (g[:, col[x]] for x in ("c0", "c1", "a0", "a1"))
    st = Strata(
        count=count.ravel(),
        service_ms=service.ravel(),
        penalty_ms=penalty.ravel(),
        fc0=either(opt_cpu, c0 + g[:, col["oc0"]], c0),
        fc1=either(opt_cpu, c1 + g[:, col["oc1"]], c1),
        fa0=acc(g[:, col["s0"]], a0 + g[:, col["oa0"]], a0),
        fa1=acc(g[:, col["s1"]], a1 + g[:, col["oa1"]], a1),
        p1=either(opt_acc, tc_p, bc_p),
        r1=either(opt_acc, tc_r, bc_r),
        p2=acc(ws_p, ta_p, ba_p),
        r2=acc(ws_r, ta_r, ba_r),
        path=np.tile(mix.path, n).astype(np.int64),
    )
    return st, k


def _shadow_strata(run: RegionRun, g: FloatArray) -> Strata:
    """The static shadow's baseline requests of steps ``g`` (one stratum per step)."""
    col = _R
    n = g.shape[0]
    bm = run.base_mix
    st = run.static
    par = run.cfg.latency.cpu_parallelism
    p1, r1 = wait_params_array(
        g[:, col["src"]], np.full(n, st.ded_cpu / par), bm.cpu_mean, bm.cpu_cs2
    )
    p2, r2 = wait_params_array(g[:, col["sra"]], np.full(n, st.ded_acc), bm.acc_mean, bm.acc_cs2)
    return Strata(
        count=np.ones(n),
        service_ms=np.full(n, float(bm.service_ms[0])),
        penalty_ms=np.zeros(n),
        fc0=g[:, col["sc0"]],
        fc1=g[:, col["sc1"]],
        fa0=g[:, col["sa0"]],
        fa1=g[:, col["sa1"]],
        p1=p1,
        r1=r1,
        p2=p2,
        r2=r2,
        path=np.zeros(n, dtype=np.int64),
    )


def _add_rows(out: FloatArray, idx: IntArray, rows: FloatArray) -> None:
    """``out[idx[i]] += rows[i]`` for every row (per-window sums of per-step rows)."""
    for col in range(out.shape[1]):
        out[:, col] += np.bincount(idx, weights=rows[:, col], minlength=out.shape[0])


def _sample_windows(
    st: Strata,
    win: IntArray,
    n_w: int,
    cfg: LatencyConfig,
    timeout_ms: float,
    uniforms: FloatArray,
    m: int,
) -> tuple[FloatArray, FloatArray, IntArray, IntArray]:
    """:func:`sample_window` for several windows at once: each window's strata get that
    window's ``m`` random numbers, allocated by count within the window."""
    order = np.argsort(win, kind="stable")
    bounds = np.searchsorted(win[order], np.arange(n_w + 1))
    take: list[IntArray] = []
    cols: list[IntArray] = []
    for w in range(n_w):
        idx = order[bounds[w] : bounds[w + 1]]
        if idx.size == 0:
            continue
        counts = st.count[idx]
        if counts.sum() <= 0:
            continue
        alloc = allocate_samples(counts, m)
        rep = np.repeat(idx, alloc)
        take.append(rep)
        cols.append(w * m + np.arange(rep.size))
    if not take:
        z = np.zeros(0)
        zi = np.zeros(0, dtype=np.int64)
        return z, z, zi, zi
    idx = np.concatenate(take)
    col = np.concatenate(cols)
    sub = st.take_index(idx)
    lat, _, paths = sample_window(sub, cfg, timeout_ms, uniforms[:, col], allocated=True)
    # each sample stands for count / (samples of its stratum in its window) requests
    n_alloc = np.bincount(idx, minlength=st.size)
    weights = st.count[idx] / n_alloc[idx]
    return lat, weights, paths, win[idx]


def _add_strata(
    acc: dict[str, dict[str, dict[str, Any]]], new: Mapping[str, Mapping[str, Mapping[str, Any]]]
) -> None:
    """Add one interval's strata sums into ``acc`` (every field is a sum)."""
    for key, by_arm in new.items():
        to = acc.setdefault(key, {})
        for arm, sums in by_arm.items():
            got = to.get(arm)
            if got is None:
                to[arm] = dict(sums)
            else:
                for k, v in sums.items():
                    got[k] += v


def _estimator_strata(
    groups: list[str],
    n_all: IntArray,
    sums: tuple[FloatArray, ...],
    pop: Population,
    names: tuple[str, ...],
) -> dict[str, dict[str, dict[str, Any]]]:
    """The window line's ``strata``: the estimator's sums per (segment, value bin) stratum and
    arm (control and what the requests received), with the value signal's sums."""
    s1, s2, x1, x2, xy, n_late, x_late, x2_late = sums
    n_c = pop.n_cells
    strata: dict[str, dict[str, dict[str, Any]]] = {}
    for gi, name in enumerate(groups):
        if name.startswith("itt_"):
            continue
        for c in range(n_c):
            i = gi * n_c + c
            if n_all[i] <= 0:
                continue
            key = stratum_key(names[int(pop.seg[c])], c % pop.bins)
            strata.setdefault(key, {})[name] = {
                "n": int(n_all[i]),
                "value_sum": float(s1[i]),
                "value_sq_sum": float(s2[i]),
                "signal_sum": float(x1[i]),
                "signal_sq_sum": float(x2[i]),
                "signal_value_sum": float(xy[i]),
                "failed": int(n_late[i]),
                "failed_signal_sum": float(x_late[i]),
                "failed_signal_sq_sum": float(x2_late[i]),
            }
    return strata


def _add_precompute_arm(arms: dict[str, dict[str, dict[str, Any]]], pre: PrecomputeWindows) -> None:
    """Put the interval's hits in the window line's ``arms`` as their own group, ``precompute``
    (what the requests received, as the streaming client reports them), so the holdout estimate
    counts precompute: a hit's request was served from the store, not by the live path, so each
    live treatment group of the segment keeps ``1 − h_s`` of its requests (its sums scaled
    alike: the same mean and spread), ``h_s`` the interval's share of treatment visits that hit."""
    for seg, share in pre.hit_share.items():
        hits = pre.value_obs.get((seg, LEVER_PRECOMPUTE, "treatment"))
        if hits is None or hits.n <= 0:
            continue
        by = arms.setdefault(seg, {})
        for name, sums in by.items():
            if name == "control":
                continue
            n = int(sums["n"])
            kept = round(n * (1.0 - share))
            k = kept / n if n > 0 else 0.0
            sums["n"] = kept
            sums["value_sum"] = float(sums["value_sum"]) * k
            sums["value_sq_sum"] = float(sums["value_sq_sum"]) * k
        by[LEVER_PRECOMPUTE] = {
            "n": hits.n,
            "value_sum": hits.value_sum,
            "value_sq_sum": hits.value_sq_sum,
        }


def _window_sketches(
    lat: FloatArray, weights: FloatArray, paths: IntArray, win: IntArray, n_req: IntArray
) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """Per window, the sketch of every request and of the baseline-only ones (integer counts)."""
    n_w = n_req.size
    out: list[tuple[dict[str, Any], dict[str, Any]]] = []
    if lat.size == 0:
        empty: dict[str, Any] = {"alpha": SKETCH_ALPHA, "bins": {}, "zeros": 0}
        return [(dict(empty), dict(empty)) for _ in range(n_w)]
    keys = np.clip(keys_of(lat, SKETCH_ALPHA), 0, _KEY_SPAN - 1)
    combined = win * _KEY_SPAN + keys
    uniq, inv = np.unique(combined, return_inverse=True)
    mass = np.asarray(np.bincount(inv, weights=weights, minlength=uniq.size), dtype=np.float64)
    base = paths == PATH_BASE
    mass_base = np.asarray(
        np.bincount(inv[base], weights=weights[base], minlength=uniq.size), dtype=np.float64
    )
    u_win = uniq // _KEY_SPAN
    u_key = uniq % _KEY_SPAN
    bounds = np.searchsorted(u_win, np.arange(n_w + 1))
    for w in range(n_w):
        sl = slice(bounds[w], bounds[w + 1])
        k = u_key[sl]
        m_all = mass[sl]
        m_base = mass_base[sl]
        tot = float(m_all.sum())
        n_base = round(int(n_req[w]) * float(m_base.sum()) / tot) if tot > 0 else 0
        out.append(
            (
                sketch_from_mass(k, m_all, int(n_req[w]), SKETCH_ALPHA),
                sketch_from_mass(k[m_base > 0], m_base[m_base > 0], n_base, SKETCH_ALPHA),
            )
        )
    return out


def _concat_strata(parts: list[Strata]) -> Strata:
    if len(parts) == 1:
        return parts[0]
    return Strata(
        *(
            np.concatenate([getattr(p, f) for p in parts])
            for f in (
                "count", "service_ms", "penalty_ms", "fc0", "fc1", "fa0", "fa1", "p1", "r1",
                "p2", "r2", "path",
            )
        )
    )  # fmt: skip


# --------------------------------------------------------------------------------------------
# Running one policy over a whole scenario
# --------------------------------------------------------------------------------------------


def run_policy(
    ctx: SimContext,
    policy_name: str,
    make_region_policy: Callable[[SimContext, int], RegionPolicy],
    write: Callable[[dict[str, Any]], None],
    *,
    control_interval_s: float,
    progress: Callable[[int, int], None] | None = None,
) -> None:
    """Simulate every region of ``ctx`` under one policy, writing events through ``write``.

    Regions advance window by window in scenario order, so the log is ordered by time.
    """

    def emitter(region: str) -> EmitFn:
        def emit(kind: str, t: float, fields: dict[str, Any]) -> None:
            ev = {
                "v": 1,
                "ts": ctx.t0 + t,
                "kind": kind,
                "source": "sim",
                "policy": policy_name,
                "region": region,
            }
            ev.update(fields)
            write(ev)

        return emit

    runs = [
        RegionRun(
            ctx,
            r,
            make_region_policy(ctx, r),
            emitter(ctx.regions[r].name),
            control_interval_s,
            precompute_region(ctx, r, policy_name),
        )
        for r in range(len(ctx.regions))
    ]
    faults = fault_lines(ctx.scenario, control_interval_s, ctx.t0, policy_name)
    for w in range(ctx.n_windows):
        for run in runs:
            run.run_window(w)
        while faults and faults[0][0] < (w + 1) * ctx.window_s:
            write(faults.pop(0)[1])
        if progress is not None:
            progress(w + 1, ctx.n_windows)
    for _t, line in faults:  # at the very end of the run
        write(line)
