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
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Protocol, cast

import numpy as np
import numpy.typing as npt

from headroom.analysis.events import WindowTraffic, window_event
from headroom.controllers.coverage import observed_coverage
from headroom.controllers.types import (
    SLO_QUANTILE,
    ArmStats,
    CapacityLevel,
    RegionObservation,
    segment_of,
    stratum_key,
    strong_tail_quantile,
)
from headroom.defences.plan import (
    CellPlanner,
    held_rate_meter,
    held_scale,
    held_shares,
    live_share,
)
from headroom.kernel.sketch import bin_values
from headroom.kernel.traces import CapacityChange
from headroom.sim.context import (
    _EPS,
    _KEY_SPAN,
    _R,
    PATH_BASE,
    PATH_RMA,
    PATH_SBM,
    SKETCH_ALPHA,
    STRATA_EVERY_S,
    ArmParts,
    FloatArray,
    Health,
    IntArray,
    Issued,
    Mix,
    Plan,
    Quotas,
    SimContext,
    Targets,
    baseline_plan,
    build_mix,
    extras_units,
)
from headroom.sim.fanout import EmitFor, MarkWindow, run_forked
from headroom.sim.faults import fault_lines
from headroom.sim.latency import (
    RHO_FLUID_CAP,
    StageState,
    in_time_probability,
    keys_of,
    optional_outcome,
    sample_window,
    speed,
    wait_pair,
)
from headroom.sim.population import arm_signal_sums, searchable
from headroom.sim.precompute_sim import PrecomputeRegion, precompute_region
from headroom.sim.windows import (
    MixTable,
    _add_precompute_arm,
    _add_rows,
    _add_strata,
    _estimator_strata,
    _sample_windows,
    _shadow_strata,
    _strata,
    _strata_rows,
    _window_sketches,
    mix_table,
)

__all__ = [
    "RegionPolicy",
    "RegionRun",
    "run_policy",
]


# --------------------------------------------------------------------------------------------


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

    def live_alternative(self, now: float, run: RegionRun) -> FloatArray | None: ...


# --------------------------------------------------------------------------------------------

EmitFn = Callable[[str, float, dict[str, Any]], None]

# kinds of the region's event heap (ties at one instant in this order)
_EV_CAPACITY, _EV_CONTROL, _EV_APPLY, _EV_EXPIRE, _EV_LOADED, _EV_NOTICE = range(6)

# treatment groups of a window's holdout sums: the log's arms (what requests received, and
# "none"), and the intent-to-treat groups the control plane learns from
_ARM_GROUPS = ("rma", "sbm", "none", "itt_rma", "itt_sbm")


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
        # the region's request rate as its client measures it, and when it applied the target
        # in force (a held target keeps the strong model's absolute rate: defences/plan.py)
        self.rates = held_rate_meter(float(ctx.scenario.slo.window_s), 0.0)
        self._rate_at_apply = 0.0
        self._held: tuple[Targets, float, Targets] | None = None
        n_pools = len(self.static.pools)
        self.level = [0.0] * n_pools
        self.asg_rma = [0.0] * n_pools
        self.asg_sbm = [0.0] * n_pools
        self.tranches: list[list[tuple[float, float]]] = [[] for _ in range(n_pools)]
        # the CPU and accelerator units one RMA request's extras run on at the levels in force
        # (sim/context.py ``extras_units``); kept with the levels
        self.extras_units = extras_units(ctx, r, self.level)
        self.targets: Targets | None = None
        self.epoch_in_force = 0
        self.heap: list[tuple[float, int, int, Any]] = []
        self._seq = 0
        for ch in self.traces.changes:
            self._push(ch.t, _EV_CAPACITY, ch)
        # a policy whose plane steps between ticks (``react``: controllers/react.py) also
        # steps at once when a control outage ends, instead of at the next tick
        self._react = None if policy.direct else getattr(policy, "react", None)
        if not policy.direct:
            k = 1
            while k * self.interval < ctx.duration_s - _EPS:
                self._push(k * self.interval, _EV_CONTROL, False)
                k += 1
        if self._react is not None:
            for _, end in self.traces.outages:
                phase = end / self.interval
                if end < ctx.duration_s - _EPS and abs(phase - round(phase)) * self.interval > _EPS:
                    self._push(end, _EV_CONTROL, True)
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
        self._no_cells = np.zeros(ctx.pop.n_cells)  # shared by plans: never written to
        self._stages_for: _Stages | None = None
        self._steps_positive = bool((ctx.traces.step_len > 0).all())
        self.mix = self.base_mix
        self._mix_key: Any = ("base",)
        # the last per-stratum levels and their split into classes (levels, the levels in use,
        # the (class, cell) of every cell, which levels are above 0)
        self._level_split: tuple[Any, Any, Any, Any] | None = None
        # the client plan last computed: (target, m_rma, m_sbm) and its shares (a pure function
        # of those; a server deciding every block asks for the same plan again and again)
        self._plan_for: tuple[Any, float, float, Any] | None = None
        self._plan_asked: Any = None
        self._direct_mixes: dict[int, tuple[Plan, Any, Mix]] = {}
        # per cell, the share of the window's treatment requests served from the precompute
        # store (None: no hit); taken out of the live plan (defences/plan.py, step 5)
        self._hit: FloatArray | None = None
        self._blocks: list[tuple[Mix, FloatArray]] = []
        self.noticed_at: float | None = None  # a server has yet to react to a reclaim
        self.arrival_rate = 0.0  # rps of the current step
        # the span of scenario time the controllers' observation accumulators cover: from when
        # they were last read to the end of the newest SLO window folded into them
        self._obs_at = 0.0
        self._obs_to = 0.0
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
            self._on_control(t, payload)
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
        self._capacity_change(t, ch)
        react = self._react
        if react is None or self.traces.in_outage(t):
            return
        # the levels as the controller hears them (a capacity silence hides the change)
        after = self._levels_seen(t)
        before = list(after)
        i = ch.pool
        before[i] = replace(after[i], units=self.traces.level_seen(i, t, ch.before))
        if react(t, before, after):
            self._on_control(t, True)

    def _capacity_change(self, t: float, ch: CapacityChange) -> None:
        i = ch.pool
        key = self.static.pools[i]
        self.level[i] = ch.after
        self.extras_units = extras_units(self.ctx, self.r, self.level)
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

    def _on_control(self, t: float, extra: bool = False) -> None:
        """A control step at ``t``: a regular tick, or (``extra``) one between ticks — on a
        material capacity change, or when a control outage ends. A step between ticks first
        closes the SLO windows complete since the last flush, so its observation covers them
        (:meth:`_observation`), and is skipped when there is none: it has no new measurement."""
        if self.traces.in_outage(t):
            return
        if extra:
            if self._pending_windows:
                self._flush_windows()
            if self._obs_to - self._obs_at <= _EPS:
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
        self._rate_at_apply = self.rates.rate(t)
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

    def _fixed_mix(self, plan: Plan | None) -> Mix:
        """The mix of a plan that is not the client plan's (a direct policy's; None: the
        baseline), with the window's precompute hits taken out of it (:func:`_live_plan`)."""
        hit = self._hit
        if plan is None:
            if hit is None:
                return self.base_mix
            plan = self.base_mix.plan
        units = self.extras_units
        got = self._direct_mixes.get(id(plan))
        if got is not None and got[0] is plan and got[1] is hit and got[2].extras_units == units:
            return got[2]
        mix = build_mix(self.ctx, _live_plan(plan, hit), units)
        self._direct_mixes[id(plan)] = (plan, hit, mix)
        return mix

    def _held_target(self, tg: Targets, scale: float) -> Targets:
        """``tg`` held at ``scale`` (defences/plan.py, *A held target*), built once per pair."""
        got = self._held
        if got is not None and got[0] is tg and got[1] == scale:
            return got[2]
        segments, coverage = held_shares(tg.sbm_segments, tg.sbm_coverage, scale)
        held = replace(tg, sbm_segments=segments, sbm_coverage=coverage)
        self._held = (tg, scale, held)
        return held

    def _current_mix(self, now: float, span: float) -> Mix:
        pol = self.policy
        if pol.direct:
            return self._fixed_mix(pol.direct_plan(now, span, self))
        tg = self.targets
        hit = self._hit
        if tg is None or self.traces.in_baseline_only(now):  # no target, or the client is down
            self._mix_key = ("base",)
            return self._fixed_mix(None)
        scale = held_scale(
            now - tg.issued_at, self.interval, self._rate_at_apply, self.rates.rate(now)
        )
        if scale != 1.0:
            tg = self._held_target(tg, scale)
        m_rma, m_sbm = pol.multipliers(now)
        key = (
            tg.epoch,
            scale,
            round(m_rma, 4),
            round(m_sbm, 4),
            self.quotas,
            id(hit),
            self.extras_units,
        )
        sheds = pol.server_sheds
        if key == self._mix_key and not sheds:
            return self.mix
        ctx = self.ctx
        pop = ctx.pop
        # what the clients ask for: the one client plan (defences/plan.py), over the cells
        # a precompute hit runs nothing of its plan live (the same rule, step 5)
        pf = self._plan_for
        if pf is not None and pf[0] is tg and pf[1] == m_rma and pf[2] == m_sbm and pf[3] is hit:
            asked = self._plan_asked
        else:
            asked = self.planner.plan(tg, m_rma, m_sbm)
            if hit is not None:
                asked = asked.live(hit)
            self._plan_for, self._plan_asked = (tg, m_rma, m_sbm, hit), asked
        rma_req, sbm_req, extra = asked.rma, asked.sbm, asked.extra
        adm = pol.admit(now, span, rma_req, sbm_req, self) if sheds else None
        # ``none``: one zero array shared by every plan of the run (plans are never written to)
        none = self._no_cells
        if adm is None:
            rma_adm, sbm_adm = rma_req, sbm_req
            down = none
        else:
            rma_adm, sbm_adm = adm
            # nothing downgraded when the server kept the request as asked (x − x = 0)
            down = none if sbm_adm is sbm_req else np.clip(sbm_req - sbm_adm, 0.0, 1.0)
        fail = none
        if self.quotas.sbm_acc <= _EPS and sbm_adm.any():
            fail, sbm_adm = sbm_adm, none  # no replica: fail fast, retry
        self._mix_key = key
        old = self.mix.plan
        by_cell = asked.levels
        if by_cell is not None:  # per-stratum levels: one class per level in use
            split = self._level_split
            if split is None or split[0] is not by_cell:
                got, inv = np.unique(by_cell, return_inverse=True)
                split = self._level_split = (by_cell, got, (inv, np.arange(pop.n_cells)), got > 0)
            rma = np.zeros((split[1].size, pop.n_cells))
            rma[split[2]] = rma_adm
            used = split[3] & rma.any(axis=1)
            levels = tuple(int(e) for e in split[1][used])
            rma = rma[used]
        else:
            levels = (extra,) if extra > 0 else ()
            rma = rma_adm[None, :] if levels else np.zeros((0, pop.n_cells))
        if (
            old.levels == levels
            and _same(old.sbm, sbm_adm)
            and _same(old.down, down)
            and _same(old.fail, fail)
            and (not levels or _same(old.rma, rma))
            and old.hit is hit
            and self.mix.extras_units == self.extras_units
        ):
            return self.mix
        if not levels:
            rma = np.zeros((0, pop.n_cells))
        return build_mix(ctx, Plan(levels, rma, sbm_adm, down, fail, hit), self.extras_units)

    # -- the main loop ----------------------------------------------------------------------

    def _handle_due(self, t: float) -> None:
        """Handle the events due at ``t`` (or before), in the heap's order."""
        while self.heap and self.heap[0][0] <= t + _EPS:
            et, kind, _, payload = heapq.heappop(self.heap)
            self._handle(max(et, t), kind, payload)

    def run_window(self, w: int) -> None:
        ctx = self.ctx
        tr = ctx.traces
        t0 = w * ctx.window_s
        t1 = min(t0 + ctx.window_s, ctx.duration_s)
        if self.precompute is not None:
            # the window's jobs are planned with what its opening brings (a capacity change, a
            # control step), and its visits are known when it opens: the hits' share leaves the
            # live plan
            self._handle_due(t0)
            h = self.precompute.visit(t0, t1, self)
            self._hit = h[ctx.pop.seg] if bool((h > 0.0).any()) else None
            self._mix_key = None
        t = t0
        while t < t1 - _EPS:
            self._handle_due(t)
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
        q = self.quotas
        ideal = self.policy.ideal
        i0 = tr.step_of(t)
        i1 = tr.step_of(max(end - _EPS, t))
        sl = slice(i0, i1 + 1)
        starts = np.maximum(tr.step_edges[sl], t)
        ends = np.minimum(tr.step_edges[i0 + 1 : i1 + 2], end)
        dt = ends - starts
        if self._steps_positive:
            share = dt / tr.step_len[sl]  # of each step's arrivals inside the block
        else:
            length = tr.step_len[sl]
            share = np.where(length > 0, dt / np.where(length > 0, length, 1.0), 0.0)
        a = rt.arrivals[sl] * share
        # queues see the request *rate*: the Poisson noise of the counts is already in the
        # M/G/c wait; counting it again as fluid backlog would double it
        lam = rt.rate[sl]
        # utilisation of every stage at once, columns as _RHO_COLS: baseline first — every
        # request's baseline part queues on the dedicated capacity ahead of any optional part,
        # so its utilisation is the baseline work's alone (module doc); the strong replicas;
        # the static shadow; the optional work on its quota
        rho = self._stages(mix, q).rho(lam)
        if ideal:
            rho[:, 2] = np.minimum(rho[:, 2], 1.0)
            rho[:, 5:] = 0.0
        over = rho > 1.0
        over_any = cast("list[bool]", over.any(axis=0).tolist())
        # a block that is about to build a queue stops after that step (policies react to it);
        # the stage the optional parts queue in is as loaded as the more loaded of baseline
        # and optional work (sim/latency.py), so it is over 1 when either is
        k = n = rho.shape[0]
        if n > 1:
            if any(over_any[j] for j in _HOT_STAGES):
                hot = over[:, _HOT_STAGES].any(axis=1)
                k = int(np.argmax(hot)) + 1
            if self.policy.server_sheds:
                # servers' token buckets act per request: a block whose traffic rises well
                # above the rate its admission was decided for ends before that step, so the
                # servers decide again for the new rate (a surge is not admitted at the old one)
                rates = cast("list[float]", lam.tolist())
                top = rates[0] * _RATE_JUMP
                for j, x in enumerate(rates):
                    if x > top:
                        k = min(k, max(1, j))
                        break
            if k < n:
                dt, a, lam, ends, rho = dt[:k], a[:k], lam[:k], ends[:k], rho[:k]
                over = over[:k]
                over_any = cast("list[bool]", over.any(axis=0).tolist())
                n = k
        self.rates.add_spread(ends, a)
        block = np.zeros((n, len(_R)))
        block[:, _C_A] = a
        block[:, _C_LAM] = lam
        block[:, _C_DT] = dt
        block[:, _RHO_COLS] = rho
        block[:, _MCMA_COLS] = np.maximum(rho[:, 0:2], rho[:, 5:7])
        # fluid backlogs, per stage (the stages in rho's column order); a stage with no backlog
        # that no step overloads keeps zeros
        for j, (stage, c0, c1) in enumerate(
            (
                (self.cpu, _C_C0, _C_C1),
                (self.acc, _C_A0, _C_A1),
                (self.strong, _C_S0, _C_S1),
                (self.shadow_cpu, _C_SC0, _C_SC1),
                (self.shadow_acc, _C_SA0, _C_SA1),
                (self.opt_cpu, _C_OC0, _C_OC1),
                (self.opt_acc, _C_OA0, _C_OA1),
            )
        ):
            if stage.backlog_s > 0.0 or over_any[j]:
                _fluid_into(stage, rho[:, j], dt, block, c0, c1)
        if self._lost_strong:
            block[0, _C_FAIL] = self._lost_strong
            self._lost_strong = 0.0
        block[:, _C_SPEED : _C_NS + 1] = (
            1.0 if ideal else speed(q.sbm_acc),
            (st.ded_cpu + q.rma_cpu + q.sbm_cpu) / self.cfg.latency.cpu_parallelism,
            st.ded_acc + q.rma_acc,
            0.0 if ideal else q.sbm_acc,
        )
        self._blocks.append((mix, block))
        # capacity used by optional work (throughput, never above the quota) and offered
        win = self._win
        ldt = lam * dt
        offered = float(ldt.sum())
        opt_acc = mix.opt_acc + mix.strong_acc
        if any(over_any[j] for j in _PHI_COLS):  # (never for the ideal packing)
            # the throughput share of the optional work (cpu, acc) and of the strong replicas
            over_q = rho[:, _PHI_COLS]
            phi = np.where(over_q > 1.0, 1.0 / np.maximum(over_q, 1.0), 1.0)
            win[0] += float((ldt * phi[:, 0]).sum()) * mix.opt_cpu / 1000.0
            win[1] += (
                float((ldt * (mix.opt_acc * phi[:, 1] + mix.strong_acc * phi[:, 2])).sum()) / 1000.0
            )
        else:  # every throughput share is 1
            win[0] += offered * mix.opt_cpu / 1000.0
            win[1] += float((ldt * opt_acc).sum()) / 1000.0
        win[2] += offered * mix.opt_cpu / 1000.0
        win[3] += offered * opt_acc / 1000.0
        t_end = float(ends[-1])
        self.arrival_rate = float(lam[-1])
        if getattr(self.policy, "wants_health", False):
            health = self._health(t_end, mix, block[-1])
            for kind, fields in self.policy.feedback(health, self):
                self.emit(kind, t_end, fields)
        return t_end

    def _stages(self, mix: Mix, q: Quotas) -> _Stages:
        """The stages' loads and capacities under ``mix`` and ``q`` (kept while both hold)."""
        got = self._stages_for
        if got is not None and got.mix is mix and got.quotas is q:
            return got
        st = self.static
        bm = self.base_mix
        got = _Stages(
            mix,
            q,
            (
                mix.base_cpu, mix.base_acc, mix.strong_acc, bm.base_cpu, bm.base_acc,
                mix.opt_cpu, mix.opt_acc,
            ),
            (
                st.ded_cpu, st.ded_acc, q.sbm_acc, st.ded_cpu, st.ded_acc,
                q.rma_cpu + q.sbm_cpu, q.rma_acc,
            ),
        )  # fmt: skip
        self._stages_for = got
        return got

    def _health(self, now: float, mix: Mix, row: FloatArray) -> Health:
        """Health after the step ``row``: standing queues (what CoDel judges: the fluid backlog
        plus the median stochastic wait, :func:`_standing`) and work in flight per server
        (Little's law)."""
        c = _R
        v = row.tolist()  # plain floats: the scalar arithmetic below is the same, faster
        # the mixed replicas as a whole: the stage utilisation the optional parts queue in
        # (p, rate) pairs: the WaitParams of wait_params, without building one per reading
        wc = wait_pair(v[c["mc"]], v[c["nc"]], mix.cpu_mean, mix.cpu_cs2)
        wa = wait_pair(v[c["ma"]], v[c["na"]], mix.acc_mean, mix.acc_cs2)
        ws = wait_pair(v[c["rs"]], v[c["ns"]], mix.strong_mean, mix.strong_cs2)
        fc = max(v[c["c1"]], v[c["oc1"]])
        fa = max(v[c["a1"]], v[c["oa1"]])
        s1 = v[c["s1"]]
        m_q = 1000.0 * max(fc, fa) + max(_standing(*wc), _standing(*wa))
        s_q = 1000.0 * s1 + _standing(*ws)
        common = self.cfg.latency.overhead_ms + 1000.0 * fc + _mean_ms(*wc)
        mixed_wait = 1000.0 * fa + _mean_ms(*wa)
        strong_wait = 1000.0 * s1 + _mean_ms(*ws)
        lat = common + mix.service_ms + mix.penalty_ms
        lat = lat + np.where(mix.strong_stage, strong_wait, mixed_wait)
        lam = v[c["lam"]]
        servers = self.static.servers
        units = float((mix.frac * lat * mix.work_units).sum()) * lam / 1000.0 / servers
        mean_lat = float(mix.frac @ lat)
        base_units = mean_lat * lam / 1000.0 / servers * (self.ctx.n0 / 100.0)
        return Health(now, m_q, s_q, units, min(base_units, units), mean_lat)

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
        together (one vectorised pass) when the interval ends, or at a step between ticks
        (:meth:`_on_control`)."""
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
        # every step of the batch, grouped by the mix in force (mixes in the order they first
        # ran, each one's steps in time order), computed in one pass (sim/windows.MixTable)
        if not blocks:  # (no step ran: nothing but the windows' draws)
            blocks.append((self.base_mix, np.zeros((0, len(_R))), 0))
        index: dict[int, int] = {}
        mixes: list[Mix] = []
        rows: list[FloatArray] = []
        row_mix: list[int] = []
        row_win: list[int] = []
        for mix, b, w in blocks:
            m = index.get(id(mix))
            if m is None:
                m = index[id(mix)] = len(mixes)
                mixes.append(mix)
            rows.append(b)
            row_mix.append(m)
            row_win.append(w)
        sizes = np.array([b.shape[0] for b in rows], dtype=np.int64)
        mi_all = np.repeat(np.array(row_mix, dtype=np.int64), sizes)
        order = np.argsort(mi_all, kind="stable")
        g = np.vstack(rows)[order]
        widx: IntArray = np.repeat(np.array(row_win, dtype=np.int64), sizes)[order]
        mi: IntArray = mi_all[order]
        table = mix_table(mixes)
        k = table.k
        jmax = table.jmax
        r_rma = slice(1, 1 + jmax)
        r_sbm = slice(1 + jmax, 4 + jmax)
        a = g[:, _R["a"]]
        strata, real = _strata_rows(self, g, table, mi)
        pi_flat, keep_flat = optional_outcome(strata, cfg, ctx.timeout_ms)
        if strata.size == real.size:
            pi = pi_flat.reshape(-1, k)
            # of the requests in time, the share whose extras started within the optional
            # budget (the rest dropped them and delivered the baseline value)
            keep = keep_flat.reshape(-1, k)
        else:  # the layout's padding: no requests
            pi = np.zeros(real.shape)
            keep = np.ones(real.shape)
            pi[real] = pi_flat
            keep[real] = keep_flat
        pi_s = in_time_probability(_shadow_strata(self, g), cfg, ctx.timeout_ms)
        swin = np.repeat(widx, k)
        if strata.size != real.size:
            swin = swin[real.ravel()]
        a_pi_rows = a[:, None] * pi  # (rows, K)
        a_pis = a * pi_s
        a_kept = a_pi_rows * keep
        value = table.value[mi]  # (rows, K, S)
        base_value = table.base_value[mi]
        s_rows = (a_kept[:, :, None] * value).sum(axis=1) + (
            (a_pi_rows - a_kept)[:, :, None] * base_value
        ).sum(axis=1)
        s_value = np.zeros((n_w, n_s))
        _add_rows(s_value, widx, s_rows)
        s_base = np.zeros((n_w, n_s))
        _add_rows(s_base, widx, a_pis[:, None] * table.base_value.sum(axis=1)[mi])
        seg_sbm = np.zeros((n_w, n_s))
        _add_rows(seg_sbm, widx, a[:, None] * table.count[:, 1 + jmax][mi])
        # value by lever and lost value (module docstring, *Ground truth*): a class's requests
        # that finished in time credit their lever with value − baseline value; the baseline
        # value of requests that missed the timeout while the shadow's made it (in-time
        # probability pi_k against pi_s) is lost. The parts add up to value_total −
        # value_baseline exactly.
        cls_value = table.value.sum(axis=2)  # (M, K)
        cls_base = table.base_value.sum(axis=2)
        gain = a_kept * (cls_value - cls_base)[mi]
        inc_rma = np.bincount(widx, weights=gain[:, r_rma].sum(axis=1), minlength=n_w)
        inc_sbm = np.bincount(widx, weights=gain[:, r_sbm].sum(axis=1), minlength=n_w)
        inc_lost = np.bincount(
            widx, weights=((a_pi_rows - a_pis[:, None]) * cls_base[mi]).sum(axis=1), minlength=n_w
        )
        frac = table.frac
        treated_rma = np.bincount(widx, weights=a * frac[:, r_rma].sum(axis=1)[mi], minlength=n_w)
        treated_sbm = np.bincount(widx, weights=a * frac[:, 1 + jmax][mi], minlength=n_w)
        lost = g[:, _R["fail"]] * (1.0 - pi[:, -1])
        timeouts = np.bincount(
            widx, weights=a * ((1.0 - pi) * frac[mi]).sum(axis=1) + lost, minlength=n_w
        )
        # what the control plane learns from (the value signals, the holdout's in-time share,
        # the requests routed to the strong model, the precompute hits' live value), summed mix
        # by mix in the order the mixes first ran, each over its steps in time order
        per = _per_mix(table, mi, widx, a, a_pi_rows, a_kept, n_w, ctx.q_base, ctx.sd_base)
        arm_acc, s_count, s_hit, routed, base_pi_num, total_a = per
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
            pre = self.precompute.flush(a_win, s_hit, pi_ctl)
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
        if strata.size:
            lat, weights, paths, sample_win = _sample_windows(
                strata, swin, n_w, cfg, ctx.timeout_ms, uniforms, m_samples
            )
        else:
            lat = weights = np.zeros(0)
            paths = sample_win = np.zeros(0, dtype=np.int64)
        # the samples' sketch keys, once for the controllers' histograms and the window lines
        keys = np.clip(keys_of(lat, SKETCH_ALPHA), 0, _KEY_SPAN - 1)
        if getattr(self.policy, "observes", True):
            self._fold_obs(
                keys, weights, paths, int(n_req.sum()), n_seg.sum(axis=0), routed, value_obs
            )
            self._obs_to = t_last
        sketches = _window_sketches(keys, weights, paths, sample_win, n_req)
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
        arm_acc: Mapping[str, ArmParts],
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
        groups = ["control"] + [g for g in _ARM_GROUPS if g in arm_acc]
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
            w = got.weights
            cell = got.cell
            fluid = np.bincount(cell, weights=w, minlength=n_c)
            with np.errstate(divide="ignore", invalid="ignore"):
                for per, work in ((cpu_per, got.cpu_ms), (acc_per, got.acc_ms)):
                    tot = np.bincount(cell, weights=w * work, minlength=n_c)
                    per[gi * n_c : (gi + 1) * n_c] = np.where(fluid > 0, tot / fluid, 0.0)
            seg_fluid = trt_fluid[pop.seg]
            with np.errstate(divide="ignore", invalid="ignore"):
                n_arm = np.where(seg_fluid > 0, np.round(fluid / seg_fluid * n_trt[pop.seg]), 0)
            n_all[gi * n_c : (gi + 1) * n_c] = np.minimum(n_arm, n_trt[pop.seg]).astype(np.int64)
            w_l.append(w)
            cell_l.append(cell)
            q_l.append(got.q)
            sd_l.append(got.sd)
            pi_l.append(got.pi)
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
        # per cell, plain numbers once (the values ``float(a[i])``/``int(a[i])`` give)
        n_l, s1_l, s2_l, cpu_l, acc_l, x1_l, x2_l, xy_l = (
            a.tolist() for a in (n_all, s1, s2, cpu_per, acc_per, x1, x2, xy)
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
                    nc = int(n_l[lo + c])
                    if nc <= 0:
                        continue
                    st = ArmStats(
                        nc,
                        float(s1_l[lo + c]),
                        float(s2_l[lo + c]),
                        nc * float(cpu_l[lo + c]),
                        nc * float(acc_l[lo + c]),
                        float(x1_l[lo + c]),
                        float(x2_l[lo + c]),
                        float(xy_l[lo + c]),
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

    def _levels_seen(self, now: float) -> list[CapacityLevel]:
        """The opportunistic levels as the controllers know them at ``now``, one per pool."""
        return [
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
            for i, key in enumerate(self.static.pools)
        ]

    def _fold_obs(
        self,
        keys: IntArray,
        weights: FloatArray,
        paths: IntArray,
        n_req: int,
        n_seg: IntArray,
        sbm_routed: float,
        value: Mapping[tuple[str, str, str], ArmStats],
    ) -> None:
        """Fold one batch of windows into the controllers' accumulators: the samples' sketch
        keys (clipped to ``_KEY_SPAN``) with their weights and paths, and the counts."""
        if keys.size:
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

    @staticmethod
    def _obs_quantile(hist: npt.NDArray[np.float64], rank: float) -> float:
        """The latency of the bin where ``hist``'s cumulative weight reaches ``rank``."""
        k = int(np.searchsorted(np.cumsum(hist), rank))
        return float(bin_values([k], SKETCH_ALPHA)[0])

    def _observation(self, now: float) -> RegionObservation:
        """What the controllers know about the last interval (then the accumulators reset)."""
        ctx = self.ctx
        # the accumulators hold the SLO windows folded since they were last read: one interval,
        # more after a control outage (no step read them), less at a step between ticks (the
        # windows complete by then), so rates divide by the time they cover
        span = self._obs_to - self._obs_at if self._obs_to - self._obs_at > _EPS else self.interval
        self._obs_at = self._obs_to
        p99: dict[str, float | None] = {}
        totals = self.obs_keys.sum(axis=1)  # all, base, rma, sbm
        for idx, name in enumerate(("all", "base", "rma", "sbm")):
            tot = float(totals[idx])
            p99[name] = (
                self._obs_quantile(self.obs_keys[idx], SLO_QUANTILE * tot) if tot > 0 else None
            )
        sbm_tail = None
        if p99["sbm"] is not None:
            q = strong_tail_quantile(float(totals[0]), float(totals[3]))
            sbm_tail = self._obs_quantile(self.obs_keys[3], q * float(totals[3]))
        rps = self.obs_requests / span
        seg_rps = {s: float(self.obs_seg[i]) / span for i, s in enumerate(ctx.segment_names)}
        st = self.static
        capacity = [
            CapacityLevel("cpu", "any", "dedicated", st.ded_cpu, ts=now),
            CapacityLevel("accelerator", st.ded_hardware, "dedicated", st.ded_acc, ts=now),
            *self._levels_seen(now),
        ]
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
            observed_coverage=observed_coverage(
                self.obs_requests, self.obs_sbm, ctx.eligible, ctx.treat
            ),
            value_age_s=0.0 if self.obs_value else None,
            sbm_tail_ms=sbm_tail,
        )
        self._obs_reset()
        return obs


_RATE_JUMP = 1.05  # traffic this much above a block's first step re-decides admission
# columns of a block row (sim/context.py ``_ROW``) written by :meth:`RegionRun._advance`
_C_A, _C_LAM, _C_DT, _C_FAIL = _R["a"], _R["lam"], _R["dt"], _R["fail"]
_C_C0, _C_C1, _C_A0, _C_A1, _C_S0, _C_S1 = (_R[x] for x in ("c0", "c1", "a0", "a1", "s0", "s1"))
_C_SC0, _C_SC1, _C_SA0, _C_SA1 = (_R[x] for x in ("sc0", "sc1", "sa0", "sa1"))
_C_OC0, _C_OC1, _C_OA0, _C_OA1 = (_R[x] for x in ("oc0", "oc1", "oa0", "oa1"))
_C_SPEED, _C_NS = _R["speed"], _R["ns"]
# the stages' utilisations as _advance computes them, in its column order
_RHO_COLS = [_R[x] for x in ("rc", "ra", "rs", "src", "sra", "roc", "roa")]
_PHI_COLS = [5, 6, 2]  # of those: the optional CPU, optional accelerator and strong stages
_HOT_STAGES = [0, 1, 2, 5, 6]  # and the stages whose queue stops a block (mixed and strong)
_MCMA_COLS = [_R["mc"], _R["ma"]]


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


def _live_plan(plan: Plan, hit: FloatArray | None) -> Plan:
    """``plan`` as it runs live when the share ``hit`` of each cell's treatment requests is served
    from the precompute store: every class's share times :func:`live_share` (the client plan's
    rule for a stored result, defences/plan.py step 5), the hits kept in ``Plan.hit``."""
    if hit is None:
        return plan
    keep = live_share(hit)
    return Plan(
        plan.levels, plan.rma * keep[None, :], plan.sbm * keep, plan.down * keep,
        plan.fail * keep, hit,
    )  # fmt: skip


def _same(a: FloatArray, b: FloatArray) -> bool:
    """``np.array_equal``, at once when both are the same array (plans hold finite shares)."""
    return a is b or np.array_equal(a, b)


class _Stages:
    """The seven stages :meth:`RegionRun._advance` tracks (columns as ``_RHO_COLS``) under one
    mix and one set of quotas: work offered per request (ms) and units serving it."""

    __slots__ = ("den", "live", "loads", "mix", "quotas", "units")

    def __init__(
        self, mix: Mix, quotas: Quotas, loads: tuple[float, ...], units: tuple[float, ...]
    ) -> None:
        self.mix = mix
        self.quotas = quotas
        self.loads = np.asarray(loads, dtype=np.float64)
        self.units = u = np.asarray(units, dtype=np.float64)
        self.live = u > 0.0
        self.den = 1000.0 * u if bool(self.live.all()) else None

    def rho(self, lam: FloatArray) -> FloatArray:
        """:func:`_rho` of every step and stage: step ``i`` offers ``lam[i] × loads[j]`` ms/s
        of work to stage ``j``'s units (rows: steps, columns: stages; a fresh array)."""
        off = lam[:, None] * self.loads
        if self.den is not None:
            return np.maximum(off, 0.0) / self.den
        live = self.live
        den = np.where(live, 1000.0 * self.units, 1.0)
        return np.where(live, np.maximum(off, 0.0) / den, np.where(off > 0.0, RHO_FLUID_CAP, 0.0))


def _fluid_into(
    stage: StageState, rho: FloatArray, dt: FloatArray, block: FloatArray, c0: int, c1: int
) -> None:
    """Advance a stage's fluid backlog over consecutive steps, writing its backlog at each
    step's start and end into columns ``c0`` and ``c1`` of ``block``."""
    for j, (r, d) in enumerate(zip(rho.tolist(), dt.tolist(), strict=True)):
        block[j, c0], block[j, c1] = stage.advance(r, d)


def _standing(p: float, rate: float) -> float:
    """Median of a stage's stochastic wait (ms; ``p``, ``rate`` as in :class:`WaitParams`):
    non-zero once most requests queue.

    CoDel judges the *minimum* sojourn over an interval, i.e. a queue that does not drain; with
    one reading per step, the median wait is the step-level stand-in: 0 while fewer than half the
    requests wait at all, the typical wait once a queue persists."""
    if p <= 0.5 or rate <= 0:
        return 0.0
    return math.log(2.0 * p) / rate


def _mean_ms(p: float, rate: float) -> float:
    """:attr:`WaitParams.mean_ms` of a ``(p, rate)`` pair."""
    return p / rate if rate > 0 else 0.0


# --------------------------------------------------------------------------------------------


def run_policy(
    ctx: SimContext,
    policy_name: str,
    make_region_policy: Callable[[SimContext, int], RegionPolicy],
    write: Callable[[dict[str, Any]], None],
    *,
    control_interval_s: float,
    progress: Callable[[int, int], None] | None = None,
    jobs: int = 1,
    meanwhile: Callable[[], None] | None = None,
) -> None:
    """Simulate every region of ``ctx`` under one policy, writing events through ``write``.

    Regions advance window by window in scenario order, so the log is ordered by time.
    ``jobs`` > 1: the regions run in that many forked processes (:mod:`headroom.sim.fanout`),
    the log the same line for line. ``meanwhile``: other work, done before the first region
    event is written — in one process before the regions run, with ``jobs`` > 1 while the
    processes simulate them (what it writes comes first either way).
    """

    def emitter(region: str, sink: Callable[[dict[str, Any]], None]) -> EmitFn:
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
            sink(ev)

        return emit

    def simulate(regions: Sequence[int], emit_for: EmitFor, mark: MarkWindow) -> None:
        runs = [
            RegionRun(
                ctx,
                r,
                make_region_policy(ctx, r),
                emitter(ctx.regions[r].name, emit_for(r)),
                control_interval_s,
                precompute_region(ctx, r, policy_name),
            )
            for r in regions
        ]
        for w in range(ctx.n_windows):
            mark(w)
            for run in runs:
                run.run_window(w)

    faults = fault_lines(ctx.scenario, control_interval_s, ctx.t0, policy_name)

    def after_window(w: int) -> None:  # the scenario's faults, in time among the windows
        while faults and (w >= ctx.n_windows or faults[0][0] < (w + 1) * ctx.window_s):
            write(faults.pop(0)[1])

    n = len(ctx.regions)
    if jobs > 1 and n > 1:
        run_forked(n, ctx.n_windows, jobs, simulate, write, after_window, progress, meanwhile)
        return
    if meanwhile is not None:
        meanwhile()

    def mark(w: int) -> None:
        if w > 0:
            after_window(w - 1)
            if progress is not None:
                progress(w, ctx.n_windows)

    simulate(range(n), lambda _r: write, mark)
    if ctx.n_windows > 0:
        after_window(ctx.n_windows - 1)
        if progress is not None:
            progress(ctx.n_windows, ctx.n_windows)
    after_window(ctx.n_windows)  # at the very end of the run


def _per_mix(
    table: MixTable,
    mi: IntArray,
    widx: IntArray,
    a: FloatArray,
    a_pi_rows: FloatArray,
    a_kept: FloatArray,
    n_w: int,
    q_base: FloatArray,
    sd_base: FloatArray,
) -> tuple[dict[str, ArmParts], FloatArray, FloatArray, float, float, float]:
    """The sums of a batch of windows the control plane learns from, mix by mix: steps ``mi``
    (grouped by mix, in time order within each) of windows ``widx`` under the mixes of
    ``table``, their arrivals ``a`` and per class those in time and those that kept their
    extras. Returns, per value-signal group, its parts over every mix
    (:func:`_value_groups`); the arrivals per segment; per window and segment the live value
    of the precompute hits; the requests routed to the strong model; the baseline class's
    requests in time; all arrivals. Each sum adds up the mixes' own sums in the order the mixes
    first ran (the same numbers, bit for bit, as summing one mix at a time)."""
    n_m = len(table.mixes)
    bounds = cast("list[int]", np.searchsorted(mi, np.arange(n_m + 1)).tolist())
    s_count = np.zeros(table.count.shape[2])
    s_hit = np.zeros((n_w, table.hit_value.shape[1]))
    routed = base_pi_num = total_a = 0.0
    a_mix = np.zeros(n_m)
    # per mix, its requests per segment and its share routed to the strong model (sbm, down,
    # fail), all mixes at once: a sum over classes adds them one after the other, and the
    # layout's padding classes add 0 (as summing each mix's own classes)
    jmax = table.jmax
    count_of = table.count.sum(axis=1)
    routed_of = cast("list[float]", table.frac[:, 1 + jmax : 4 + jmax].sum(axis=1).tolist())
    for m, mix in enumerate(table.mixes):
        lo, hi = bounds[m], bounds[m + 1]
        if hi <= lo:
            continue
        a_sum = float(a[lo:hi].sum())
        s_count += a_sum * count_of[m]
        routed += a_sum * routed_of[m]
        base_pi_num += float(a_pi_rows[lo:hi, 0].sum())
        total_a += a_sum
        if mix.plan.hit is not None:
            _add_rows(s_hit, widx[lo:hi], np.outer(a_pi_rows[lo:hi, 0], mix.hit_value))
        a_mix[m] = a_sum
    # per mix and class, the steps' sums (in time order: a sum over rows adds them one after the
    # other, as ``bincount`` does)
    a_pi_mix = np.zeros((n_m, table.k))
    a_kept_mix = np.zeros((n_m, table.k))
    _add_rows(a_pi_mix, mi, a_pi_rows)
    _add_rows(a_kept_mix, mi, a_kept)
    arms = _value_groups(table, a_mix, a_pi_mix, a_kept_mix, q_base, sd_base)
    return arms, s_count, s_hit, routed, base_pi_num, total_a


def _value_groups(
    table: MixTable,
    a_mix: FloatArray,
    a_pi_mix: FloatArray,
    a_kept_mix: FloatArray,
    q_base: FloatArray,
    sd_base: FloatArray,
) -> dict[str, ArmParts]:
    """Per value-signal group, its (mix, class, cell) parts over the mixes of ``table`` (in
    that order, classes in the mix's order) as their requests received them: per mix its
    arrivals ``a_mix`` and per class those in time and those that kept their extras. A mix's
    part of a group is left out when it has no arrivals or the group no requests in it. Where
    some in-time requests of the group's classes dropped their extras at the optional budget
    (and got the baseline), the quality and the optional work per request are the mixtures: the
    within-part variances plus the spread of the two means."""
    out: dict[str, ArmParts] = {}
    n_c = table.arm_weights.shape[2]
    with np.errstate(divide="ignore", invalid="ignore"):
        safe = np.where(a_pi_mix > 0, a_pi_mix, 1)
        kept_share = np.where(a_pi_mix > 0, a_kept_mix / safe, 1)
    has = table.real & (table.arm_weights > 0).any(axis=2)  # (M, K) a class with requests
    live = a_mix > 0
    for name in _ARM_GROUPS:
        cls = table.real & table.arm_classes(name)[None, :]
        take = live & (has & cls).any(axis=1)
        if not take.any():
            continue
        sel = cls & take[:, None]
        mm, kk = np.nonzero(sel)
        # a mix whose requests of the group all kept their extras: its parts as they are
        short: npt.NDArray[np.bool_] = np.asarray(np.where(cls, kept_share, 1.0) < 1.0)
        drops = np.asarray(short.any(axis=1))[mm]
        kept = kept_share[mm, kk]
        q = table.quality[mm, kk]
        sd = table.quality_sd[mm, kk]
        cpu = np.repeat(table.opt_cpu_ms[mm, kk], n_c)
        acc = np.repeat(table.opt_acc_ms[mm, kk], n_c)
        if drops.any():
            d = drops
            kd = kept[d][:, None]
            qd = q[d]
            qb = q_base[None, :]
            sb = sd_base[None, :]
            var = kd * sd[d] ** 2 + (1.0 - kd) * sb**2 + kd * (1.0 - kd) * (qd - qb) ** 2
            q = q.copy()
            sd = sd.copy()
            q[d] = kd * qd + (1.0 - kd) * qb
            sd[d] = np.sqrt(var)
            dk = np.repeat(d, n_c)
            kc = np.repeat(kept, n_c)
            cpu = np.where(dk, cpu * kc, cpu)
            acc = np.where(dk, acc * kc, acc)
        weights = (table.arm_weights[mm, kk] * a_mix[mm][:, None]).ravel()
        parts = ArmParts(
            weights=weights,
            cell=np.tile(np.arange(n_c), mm.size),
            q=q.ravel(),
            sd=sd.ravel(),
            pi=np.repeat(a_pi_mix[mm, kk] / a_mix[mm], n_c),
            cpu_ms=cpu,
            acc_ms=acc,
        )
        out[name] = _without_empty(parts, n_c)
    return out


def _without_empty(parts: ArmParts, n_c: int) -> ArmParts:
    """``parts`` with only those :func:`headroom.sim.population.arm_signal_sums` can draw
    (:func:`headroom.sim.population.searchable`; most parts have weight 0: a class reaches few
    cells), its groups' first parts being the first ``n_c`` (one per cell): every sum and every
    draw is the same."""
    keep = searchable(parts.weights, slice(0, n_c))
    if bool(keep.all()):
        return parts
    return ArmParts(
        weights=parts.weights[keep],
        cell=parts.cell[keep],
        q=parts.q[keep],
        sd=parts.sd[keep],
        pi=parts.pi[keep],
        cpu_ms=parts.cpu_ms[keep],
        acc_ms=parts.acc_ms[keep],
    )
