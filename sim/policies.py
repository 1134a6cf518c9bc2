"""The policies compared side by side (README.md, *Commands* names), as the engine drives them.

Pure: no clock, no global random state (the control plane's router and the peer limits get
generators derived from the run's seed).

A policy is the set of decisions the engine leaves open (sim/engine.py): what central targets
are issued at each control interval, what clients multiply their optional work by, what servers
admit, and how fast a server notices a reclaim. Everything else — load, queues, latency, value —
is the engine's and identical for all.

=============== ============================================= ================ ==============
policy          central targets (every interval, lag)         client side      server side
=============== ============================================= ================ ==============
``static``      none: base candidates, base model             —                —
``greedy``      all announced spare: SBM to full coverage      —                —
                on strong-capable devices, RMA to what the
                rest pays for; no margin, no latency feedback
``central-only``:class:`headroom.controllers.plane.ControlPlane`         —                —
                (allocator, RMA PID, SBM coverage, router)
``aimd``        greedy's targets                              Netflix AIMD      —
                                                              limit → budget
``gradient``    greedy's targets                              Netflix Gradient2 —
                                                              limit → budget
``envoy``       greedy's targets                              Envoy gradient   —
                                                              controller limit
                                                              → budget
``sre-throttle``greedy's targets                              Google SRE       —
                                                              adaptive
                                                              throttling of
                                                              optional work
``headroom``    :class:`headroom.controllers.plane.ControlPlane`         AIMD multiplier
ServerShedder:
                                                              (ClientShedder)   token buckets,
                                                                                value order,
                                                                                in-flight trim
``oracle``      perfect foresight, every step, no lag:        —                the admission
                the feasible LP plan (sim/oracle.py) on the                    rule, in its
                quotas it assigns itself                                       plan
=============== ============================================= ================ ==============

**Peer policies, adapted.** Netflix's AIMD and Gradient2 limits know nothing about capacity
ownership, value or levers: they compute one concurrency limit from response times and drops.
Here they run on greedy's targets (they need *some* plan of optional work to govern; greedy's is
the one that asks for everything the announced capacity pays for), and
:class:`headroom.defences.peers.OptionalBudget` turns the limit into an optional-work multiplier:
the baseline keeps what it has in flight, optional work gets ``limit − baseline_inflight`` request
equivalents, spent on the highest-value requests first (the same rule as the client shedder).
A region is modelled as ``dedicated cores / cores_per_server`` identical servers, each with the
same limit; the limit is fed ``peer_samples_per_step`` sampled responses per step (RTT, dropped =
timed out) with the per-server in-flight count from Little's law.

**Envoy and SRE throttling.** ``envoy`` is :class:`PeerRegion` with Envoy's adaptive
concurrency gradient controller (:class:`headroom.defences.peers.EnvoyGradientLimit`).
``sre-throttle`` (:class:`SreRegion`) runs greedy's targets under Google SRE client-side
adaptive throttling (:class:`headroom.defences.peers.SreThrottle`, ``K = 2``, a two-minute
window): every treatment request's optional part is an attempt, accepted when the response
made the timeout, and the optional-work multiplier is ``1 − p`` (spent highest value first).

**Time-outs and outages.** Every central policy (greedy, peers, central-only, headroom) is
silenced by a ``control_outage``: no targets are issued, and clients fall back to the baseline
when the ones they hold expire (``ttl_s``, 3 intervals).

**Between ticks.** The control plane's policies (central-only, headroom) also step on a material
capacity change between ticks and as soon as an outage ends (:meth:`PlaneRegion.react`, the
plane's rule of controllers/react.py); the others keep the clock.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

from headroom.controllers.allocator import RmaCurve, held_units
from headroom.controllers.config import ControlConfig
from headroom.controllers.plane import ControlPlane
from headroom.controllers.precompute import live_alternative
from headroom.controllers.types import (
    LEVER_RMA,
    LEVER_SBM,
    CapacityLevel,
    RegionObservation,
    RegionTargets,
)
from headroom.defences.admission import admitted_share
from headroom.defences.client_shedding import ClientShedder
from headroom.defences.peers import OptionalBudget, SreThrottle, make_limit
from headroom.defences.shedding import OptionalCapacity, ServerShedder, ShedTransition
from headroom.kernel.errors import ConfigError
from headroom.sim.context import Health, Issued, Plan, Quotas, SimContext, Targets
from headroom.sim.engine import RegionPolicy, RegionRun
from headroom.sim.oracle import oracle_for

__all__ = ["POLICIES", "PolicyFactory", "make_policy", "parse_policies"]

POLICIES: tuple[str, ...] = (
    "static",
    "greedy",
    "central-only",
    "aimd",
    "gradient",
    "envoy",
    "sre-throttle",
    "headroom",
    "oracle",
)

# The strong model's admission splits each cell's strong requests into this many batches
# (a strong request is all or nothing; 8 resolves admission to 1/8 of a cell).
SBM_CHUNKS = 8


def parse_policies(items: list[str] | None) -> list[str]:
    """``--policy`` values (repeatable, comma-separated) → ordered, de-duplicated names."""
    if not items:
        return list(POLICIES)
    names: list[str] = []
    problems = []
    for item in items:
        for name in (x.strip() for x in item.split(",")):
            if not name:
                continue
            if name not in POLICIES:
                problems.append(f"--policy: unknown policy {name!r} (known: {', '.join(POLICIES)})")
            elif name not in names:
                names.append(name)
    if problems:
        raise ConfigError(problems)
    if not names:
        raise ConfigError("--policy: no policy named")
    return names


# --------------------------------------------------------------------------------------------
# Shared pieces
# --------------------------------------------------------------------------------------------


class StaticRegion:
    """Baseline only: the defaults every other policy overrides."""

    ideal = False
    direct = False
    server_sheds = False
    value_ranked_rma = False
    observes = False  # builds observations for a central controller

    def control(self, now: float, obs: RegionObservation, run: RegionRun) -> Issued | None:
        return None

    def direct_plan(self, now: float, span: float, run: RegionRun) -> Plan | None:
        return None

    def multipliers(self, now: float) -> tuple[float, float]:
        return 1.0, 1.0

    def admit(
        self, now: float, span: float, rma_req: Any, sbm_req: Any, run: RegionRun
    ) -> tuple[Any, Any] | None:
        return None

    def on_quotas(self, now: float, quotas: Quotas, reduced: bool) -> None:
        return None

    def feedback(self, health: Health, run: RegionRun) -> list[tuple[str, dict[str, Any]]]:
        return []

    def steady(self) -> bool:
        return True

    def notices_reclaims(self) -> bool:
        return False

    def live_alternative(self, now: float, run: RegionRun) -> Any:
        """Per segment, the value per treatment visit the policy's live levers would add over the
        base ranking, which a precompute hit gives up (sim/precompute_sim.py); None: not known
        (the precompute planner then compares a stored result with the base ranking)."""
        return None


def greedy_targets(run: RegionRun, obs: RegionObservation, epoch: int, ttl_s: float) -> Issued:
    """All announced spare, no margin, no feedback (module docstring)."""
    ctx = run.ctx
    st = run.static
    costs = ctx.costs
    n0 = ctx.n0
    rps = obs.request_rps
    treated = rps * ctx.treat
    eligible = treated * ctx.eligible
    level = list(run.level)
    # SBM first, to full coverage, on the strong-capable devices
    strong_units = sum(level[i] for i in range(len(level)) if st.strong_ok[i])
    sbm_need = eligible * n0 * costs.strong_accelerator_ms / 1000.0
    coverage = min(1.0, strong_units / sbm_need) if sbm_need > 0 else 0.0
    if strong_units <= 0:
        coverage = 0.0
    assignment: dict[int, list[float]] = {i: [0.0, 0.0] for i in range(len(level))}
    sbm_units = coverage * sbm_need
    for i in range(len(level)):
        if st.strong_ok[i] and strong_units > 0:
            assignment[i][1] = level[i] * sbm_units / strong_units
    sbm_cpu = eligible * coverage * n0 * costs.strong_cpu_ms / 1000.0
    cpu_pools = [i for i, k in enumerate(st.pools) if k.resource == "cpu" and not k.remote]
    cpu_total = sum(level[i] for i in cpu_pools)
    for i in cpu_pools:
        share = level[i] / cpu_total if cpu_total > 0 else 0.0
        assignment[i][1] = sbm_cpu * share
        assignment[i][0] = max(0.0, level[i] - sbm_cpu * share)
    acc_left = 0.0
    for i in range(len(level)):
        if st.base_ok[i]:
            free = max(0.0, level[i] - assignment[i][1])
            assignment[i][0] = free
            acc_left += free
    cpu_left = max(0.0, cpu_total - sbm_cpu)
    rma_rps = treated * (1.0 - ctx.eligible * coverage)
    extra = float(ctx.nmax - n0)
    if rma_rps > 0:
        if costs.base_cpu_ms > 0:
            extra = min(extra, cpu_left * 1000.0 / (rma_rps * costs.base_cpu_ms))
        if costs.base_accelerator_ms > 0:
            extra = min(extra, acc_left * 1000.0 / (rma_rps * costs.base_accelerator_ms))
    candidates = n0 + max(0, math.floor(extra))
    seg_probs = {s: coverage for s in ctx.segment_names}
    tg = Targets(
        epoch=epoch,
        issued_at=obs.now,
        ttl_s=ttl_s,
        rma_candidates=int(candidates),
        sbm_segments=seg_probs,
        assignment={i: (a[0], a[1]) for i, a in assignment.items()},
        sbm_coverage=coverage,
    )
    fields = {
        "epoch": epoch,
        "rma_candidates": tg.rma_candidates,
        "sbm_coverage": coverage,
        "segments": seg_probs,
        "budget": {
            "cpu": sum(a[0] + a[1] for i, a in assignment.items() if st.pools[i].resource == "cpu"),
            "accelerator": sum(
                a[0] + a[1] for i, a in assignment.items() if st.pools[i].resource != "cpu"
            ),
        },
        "reason": "greedy",
        "allocation": [],
        "fallback": None,
        "inputs": {"request_rps": rps, "p99_ms": dict(obs.p99_ms)},
    }
    return Issued(tg, fields)


class GreedyRegion(StaticRegion):
    observes = True

    def __init__(self, ttl_s: float) -> None:
        self.ttl_s = ttl_s
        self.epoch = 0

    def control(self, now: float, obs: RegionObservation, run: RegionRun) -> Issued | None:
        self.epoch = max(self.epoch + 1, math.floor(now))
        return greedy_targets(run, obs, self.epoch, self.ttl_s)


def _assignment_from(
    rt: RegionTargets, run: RegionRun, margin: float
) -> dict[int, tuple[float, float]]:
    """Per-pool units per lever from the allocator's shares (CPU spread over CPU pools by level).

    The allocator budgets ``(1 − safety_margin)`` of each announced pool; the replicas hold the
    lever's whole share of the pool (``held_units``), so the margin is slack *inside* each
    lever's quota (the plan runs its quota at most ``1 − margin`` busy) rather than capacity
    nobody holds. What no lever's share covers (a lever's demand is capped: RMA one rate-limit
    step above the candidates in force) is slack too, for the levers already on the pool: idle
    opportunistic units serve nothing, while on a lever's replicas they keep its queues short.
    """
    scale = held_units(1.0, margin)
    st = run.static
    out: dict[int, list[float]] = {i: [0.0, 0.0] for i in range(len(st.pools))}
    cpu_pools = [i for i, k in enumerate(st.pools) if k.resource == "cpu" and not k.remote]
    cpu_total = sum(run.level[i] for i in cpu_pools)
    for share in rt.allocation:
        col = 0 if share.lever == LEVER_RMA else 1 if share.lever == LEVER_SBM else -1
        if col < 0:
            continue
        for i in cpu_pools:
            w = run.level[i] / cpu_total if cpu_total > 0 else 1.0 / len(cpu_pools)
            out[i][col] += share.cpu * w * scale
        if share.accelerator > 0 and share.hardware is not None:
            for i, k in enumerate(st.pools):
                if k.resource == "accelerator" and not k.remote and k.hardware == share.hardware:
                    out[i][col] += share.accelerator * scale
                    break
    # the rest of each live pool is slack for the levers already on it (in proportion to their
    # shares; RMA's mixed replicas when neither is), so optional work runs its quota less busy
    for i, k in enumerate(st.pools):
        if k.remote:
            continue
        a = out[i]
        left = run.level[i] - a[0] - a[1]
        if left <= 1e-9:
            continue
        held = a[0] + a[1]
        if held > 1e-9:
            a[0] += left * a[0] / held
            a[1] += left * a[1] / held
        elif k.resource == "cpu" or st.base_ok[i]:
            a[0] += left
    return {i: (a[0], a[1]) for i, a in out.items()}


class PlaneRegion(StaticRegion):
    """The control plane's targets (central-only, and the central half of headroom).

    Clients spend the RMA target's extra candidates as a budget, highest value first: the top
    ``(target − base) / (max − base)`` share of requests by value rank gets the maximum, the
    rest the base count — the same mean work the PID and the allocator budgeted, put where the
    value is (the client shedder's value-rank rule, applied to spending as well as shedding).
    """

    value_ranked_rma = True
    value_ranked_sbm = True
    observes = True

    def __init__(self, plane: ControlPlane) -> None:
        self.plane = plane
        self.margin = float(plane.config.allocator.safety_margin)
        self._region_name: str | None = None

    def bind(self, run: RegionRun) -> None:
        self._region_name = run.static.name

    def react(self, now: float, before: list[CapacityLevel], after: list[CapacityLevel]) -> bool:
        """A step between ticks for this capacity change (the plane's rule,
        controllers/react.py): the engine then steps at once, as the streaming controller's
        capacity agent does."""
        region = self._region_name
        return region is not None and self.plane.reacts(region, now, before, after)

    def control(self, now: float, obs: RegionObservation, run: RegionRun) -> Issued | None:
        rt = self.plane.step(obs)
        decision = self.plane.decision(obs.region)
        fields = decision.event_fields() if decision is not None else {}
        extra = tuple(decision.allocator_events()) if decision is not None else ()
        tg = Targets(
            epoch=rt.epoch,
            issued_at=now,
            ttl_s=rt.ttl_s,
            rma_candidates=rt.rma_candidates,
            sbm_segments=dict(rt.sbm_segments),
            assignment=_assignment_from(rt, run, self.margin),
            sbm_coverage=rt.sbm_coverage,
            precompute_jobs_per_s=rt.precompute_jobs_per_s,
            rma_levels=dict(rt.rma_levels),
            sbm_explore=rt.sbm_explore,
        )
        return Issued(tg, fields, extra)


def _transition_event(t: ShedTransition, lever: str) -> tuple[str, dict[str, Any]]:
    return (
        t.event.value,
        {
            "side": t.side,
            "lever": lever,
            "dropped": t.dropped,
            "dropped_extra_candidates": t.dropped_extra_candidates,
            "dropped_strong": t.dropped_strong,
            "multiplier": t.multiplier,
        },
    )


class HeadroomRegion(PlaneRegion):
    """Control plane + server-side shedding (token buckets, value order, in-flight trimming) +
    client-side AIMD multipliers from the health of every response."""

    server_sheds = True
    wants_health = True
    # a capacity grant starts the strong model loading at once, before the next control step
    # assigns the devices
    loads_at_grant = True

    def __init__(self, plane: ControlPlane, ctx: SimContext) -> None:
        super().__init__(plane)
        self.ctx = ctx
        self.rma_server = ServerShedder()
        self.sbm_server = ServerShedder()
        self.rma_client = ClientShedder()
        self.sbm_client = ClientShedder()
        self._called = False
        self._admitting = (False, False)
        self.rma_busy = 1.0 - self.margin
        self._run: RegionRun | None = None
        # the admission shares of the quotas last asked about (the quotas change at capacity
        # events, the servers decide every step), and the batches' constant arrays per size
        self._admission_for: tuple[Quotas, RegionRun | None, float, tuple[float, ...]] | None = None
        self._batch_consts: dict[int, tuple[Any, Any, Any]] = {}
        self._chunked: tuple[Any, Any] | None = None

    def notices_reclaims(self) -> bool:
        return True

    def live_alternative(self, now: float, run: RegionRun) -> Any:
        """What live RMA adds to a visit of each segment under the targets in force
        (:func:`headroom.controllers.precompute.live_alternative`: the targets' per-bin levels,
        the plane's measured mean value per bin, the RMA curve; the streaming precompute worker
        asks the same function); None without targets, curve or value signals yet."""
        tg = run.targets
        curve = self.plane.rma_curve
        if tg is None or curve is None:
            return None
        means = self.plane.signal_means(run.static.name)
        extras = float(tg.rma_candidates - self.ctx.n0)
        return live_alternative(curve, self.ctx.segment_names, tg.rma_levels, means, extras)

    def multipliers(self, now: float) -> tuple[float, float]:
        return self.rma_client.multiplier_at(now), self.sbm_client.multiplier_at(now)

    def on_quotas(self, now: float, quotas: Quotas, reduced: bool) -> None:
        k_c, k_a, k_s = self._admission(quotas)
        self.rma_server.on_capacity(
            OptionalCapacity(quotas.rma_cpu * k_c, quotas.rma_acc * k_a), now
        )
        self.sbm_server.on_capacity(
            OptionalCapacity(quotas.sbm_cpu * k_c, quotas.sbm_acc * k_s), now
        )

    def bind(self, run: RegionRun) -> None:
        super().bind(run)
        self._run = run

    def _admission_of(self, q: Quotas) -> tuple[float, ...]:
        """:meth:`_admission` of ``q``, kept while the quotas, the bound run and the RMA ceiling
        stay the same (it is a pure function of those and the plane's config)."""
        got = self._admission_for
        if got is not None and got[0] is q and got[1] is self._run and got[2] == self.rma_busy:
            return got[3]
        shares = self._admission(q)
        self._admission_for = (q, self._run, self.rma_busy, shares)
        return shares

    def _chunk_values(self, v_mean: Any) -> Any:
        """Each cell's mean value repeated for its ``SBM_CHUNKS`` chunks (built once)."""
        got = self._chunked
        if got is None or got[0] is not v_mean:
            got = self._chunked = (v_mean, np.repeat(v_mean, SBM_CHUNKS))
        return got[1]

    def _consts(self, m: int) -> tuple[Any, Any, Any]:
        """A batch of ``m`` requests' constant inputs: no strong part, zero costs (int and
        float); read-only, shared by every batch of that size."""
        got = self._batch_consts.get(m)
        if got is None:
            got = (np.zeros(m, dtype=bool), np.zeros(m), np.zeros(m, dtype=np.int64))
            for a in got:
                a.setflags(write=False)
            self._batch_consts[m] = got
        return got

    def _admission(self, q: Quotas) -> tuple[float, float, float]:
        """The share of each quota the servers admit optional work up to — the admission rule
        of both engines (:func:`headroom.defences.admission.admitted_share`; the streaming
        servers derive the same inputs, ``headroom.workers.server.ReplicaAdmission``): on the
        mixed replicas' CPU and accelerator stages the admissible utilisation of the whole
        stage (dedicated + quotas) for a baseline request's service time and RMA's wait budget,
        never above ``1 − margin`` (a surge beyond it is shed, not queued in front of baseline
        work); on the strong replicas that of their devices for a strong request's accelerator
        time and the coverage controller's wait budget (the utilisation it sized coverage for:
        few devices queue long)."""
        cfg = self.plane.config
        k_s = admitted_share(
            q.sbm_acc,
            cfg.costs.sbm_per_request.accelerator_s * 1000.0,
            cfg.coverage.wait_budget_share * cfg.setpoint_ms,
        )
        run = self._run
        if run is None:
            return self.rma_busy, self.rma_busy, k_s
        budget = cfg.pid.wait_budget_share * cfg.setpoint_ms
        st = run.static
        bm = run.base_mix
        par = run.cfg.latency.cpu_parallelism
        k_c = admitted_share(
            (st.ded_cpu + q.rma_cpu + q.sbm_cpu) / par, bm.cpu_mean, budget, ceiling=self.rma_busy
        )
        k_a = admitted_share(st.ded_acc + q.rma_acc, bm.acc_mean, budget, ceiling=self.rma_busy)
        return k_c, k_a, k_s

    def admit(
        self, now: float, span: float, rma_req: Any, sbm_req: Any, run: RegionRun
    ) -> tuple[Any, Any] | None:
        """What the servers admit of the requested optional work over ``span`` seconds.

        While every server has tokens for all of it (offered work within its level over the
        span) and neither is overloaded or shedding, the core would admit everything: the
        engine skips the call (the decision is the same; only the core's running estimates
        miss that stretch). Otherwise each server decides with :meth:`ServerShedder.decide_batch`,
        one batch entry per cell (SBM: ``SBM_CHUNKS`` per cell, a strong request being all or
        nothing), lowest value per unit of compute shed first.
        """
        ctx = self.ctx
        pop = ctx.pop
        costs = ctx.costs
        tg = run.targets
        assert tg is not None
        extra: Any = (
            ctx.nmax - ctx.n0
            if self.value_ranked_rma
            else max(0, min(tg.rma_candidates, ctx.nmax) - ctx.n0)
        )
        levels = run.planner.cell_levels(tg)
        if levels is not None:  # per stratum: each cell's level (the plan rule's)
            extra = levels
        count = max(run.arrival_rate, 0.0) * span * ctx.treat * pop.share
        n_rma = count * rma_req
        n_sbm = count * sbm_req
        q = run.quotas
        cand = float((n_rma * extra).sum())
        sbm_total = float(n_sbm.sum())
        need = (
            cand * costs.base_cpu_ms,
            cand * costs.base_accelerator_ms,
            sbm_total * ctx.n0 * costs.strong_cpu_ms,
            sbm_total * ctx.n0 * costs.strong_accelerator_ms,
        )
        # what the servers' buckets hold: the quotas scaled as in :meth:`on_quotas`
        k_c, k_a, k_s = self._admission_of(q)
        have = tuple(
            1000.0 * span * u * k
            for u, k in zip(
                (q.rma_cpu, q.rma_acc, q.sbm_cpu, q.sbm_acc), (k_c, k_a, k_c, k_s), strict=True
            )
        )
        end = now + span
        self._called = False

        def calm(server: ServerShedder, i: int) -> bool:
            return (
                not (server.overloaded or server.shedding)
                and need[i] <= have[i] * (1 + 1e-9)
                and need[i + 1] <= have[i + 1] * (1 + 1e-9)
            )

        rma_adm = rma_req
        any_extra = bool((extra > 0).any()) if isinstance(extra, np.ndarray) else extra > 0
        if any_extra and n_rma.sum() > 0 and not calm(self.rma_server, 0):
            if q.rma_cpu <= 0.0 or q.rma_acc <= 0.0:
                rma_adm = np.zeros(pop.n_cells)  # hard stop: no level, no optional work
            else:
                ex = np.round(n_rma * extra).astype(np.int64)
                no_strong, zero, _ = self._consts(pop.n_cells)
                verdict = self.rma_server.decide_batch(
                    end,
                    pop.v_mean * n_rma,
                    ex,
                    ex * costs.base_cpu_ms,
                    ex * costs.base_accelerator_ms,
                    no_strong,
                    zero,
                    zero,
                    span_s=span,
                )
                rma_adm = rma_req * np.where(ex > 0, verdict.extra / np.maximum(ex, 1), 0.0)
                self._called = True
        sbm_adm = sbm_req
        if sbm_total > 0 and not calm(self.sbm_server, 2):
            if q.sbm_acc <= 0.0 or (costs.strong_cpu_ms > 0 and q.sbm_cpu <= 0.0):
                sbm_adm = np.zeros(pop.n_cells)  # hard stop: nothing loaded, all downgraded
            else:
                per = np.repeat(n_sbm / SBM_CHUNKS, SBM_CHUNKS)
                _, zero, no_extra = self._consts(per.size)
                verdict = self.sbm_server.decide_batch(
                    end,
                    self._chunk_values(pop.v_mean) * per,
                    no_extra,
                    zero,
                    zero,
                    per > 0,
                    per * ctx.n0 * costs.strong_cpu_ms,
                    per * ctx.n0 * costs.strong_accelerator_ms,
                    span_s=span,
                )
                sbm_adm = sbm_req * verdict.strong.reshape(pop.n_cells, SBM_CHUNKS).mean(axis=1)
                self._called = True
        self._admitting = (bool(rma_adm.any()), bool(sbm_adm.any()))
        return rma_adm, sbm_adm

    def feedback(self, health: Health, run: RegionRun) -> list[tuple[str, dict[str, Any]]]:
        now = health.now
        out: list[tuple[str, dict[str, Any]]] = []
        for server, q_ms in (
            (self.rma_server, health.mixed_queue_ms),
            (self.sbm_server, health.strong_queue_ms),
        ):
            tr = server.observe(now, q_ms)
            if tr is not None:
                out.append((tr.event.value, {"queue_ms": tr.queue_ms, "reason": tr.reason}))
        for server, lever in ((self.rma_server, LEVER_RMA), (self.sbm_server, LEVER_SBM)):
            t = server.poll(now)
            if t is not None:
                out.append(_transition_event(t, lever))
        for client, server, q_ms, lever in (
            (self.rma_client, self.rma_server, health.mixed_queue_ms, LEVER_RMA),
            (self.sbm_client, self.sbm_server, health.strong_queue_ms, LEVER_SBM),
        ):
            t = client.on_response(now, server.overloaded, q_ms)
            if t is not None:
                out.append(_transition_event(t, lever))
        return out

    def hot(self) -> bool:
        """A server is overloaded (CoDel) while it still admits some optional work: decide at
        ``hot_step_s`` resolution (once everything is shed there is nothing to resolve)."""
        return any(
            active and s.overloaded
            for s, active in (
                (self.rma_server, self._admitting[0]),
                (self.sbm_server, self._admitting[1]),
            )
        )

    def steady(self) -> bool:
        return (
            not self._called
            and not self.rma_server.shedding
            and not self.sbm_server.shedding
            and not self.rma_server.overloaded
            and not self.sbm_server.overloaded
            and self.rma_client.multiplier >= 1.0
            and self.sbm_client.multiplier >= 1.0
        )


class PeerRegion(GreedyRegion):
    """Greedy's targets governed by a peer concurrency limit (module docstring)."""

    wants_health = True

    def __init__(self, ttl_s: float, name: str, ctx: SimContext, r: int) -> None:
        super().__init__(ttl_s)
        self.budget = OptionalBudget(make_limit(name, ctx.rng(r, 10)))
        self.ctx = ctx
        self.samples = ctx.config.peer_samples_per_step
        self.rng = ctx.rng(r, 11)
        self.m = 1.0

    def multipliers(self, now: float) -> tuple[float, float]:
        return self.m, self.m

    def feedback(self, health: Health, run: RegionRun) -> list[tuple[str, dict[str, Any]]]:
        ctx = self.ctx
        tg = run.targets
        rtts = run.sample_step_latencies(self.rng, self.samples)
        inflight = max(0, round(health.inflight_units))
        for rtt in rtts.tolist():
            self.budget.on_sample(health.now, rtt, inflight, rtt >= ctx.timeout_ms)
        # optional work in flight at full targets, in work units beyond the baseline, per server
        demand = 0.0
        if tg is not None:
            extra = max(0, tg.rma_candidates - ctx.n0) / 100.0
            cov = ctx.eligible * tg.sbm_coverage
            strong_w = ctx.costs.strong_accelerator_ms / max(ctx.costs.base_accelerator_ms, 1e-12)
            per_req = ctx.treat * (
                (1 - cov) * extra + cov * max(strong_w - 1.0, 0.0) * ctx.n0 / 100
            )
            servers = run.static.servers
            demand = run.arrival_rate * health.latency_ms / 1000.0 / servers * per_req
        b = self.budget.budget(health.baseline_units, demand)
        m = round(b.multiplier, 2)
        out: list[tuple[str, dict[str, Any]]] = []
        fields = {"side": "client", "lever": "all", "dropped": 0, "multiplier": m,
                  "limit": self.budget.limit}  # fmt: skip
        out += shedding_transition(self.m, m, fields)
        self.m = m
        return out

    def steady(self) -> bool:
        return False


def shedding_transition(
    before: float, after: float, fields: dict[str, Any]
) -> list[tuple[str, dict[str, Any]]]:
    """The client-shedding line a multiplier change from ``before`` to ``after`` writes:
    ``shedding.started`` when it drops below 1, ``shedding.stopped`` when it is back at 1."""
    if after < 1.0 <= before:
        return [("shedding.started", fields)]
    if after >= 1.0 > before:
        return [("shedding.stopped", fields)]
    return []


class OracleRegion(StaticRegion):
    """Perfect foresight, no lag: the feasible LP plan of sim/oracle.py every step, on the
    quotas it assigns itself, through the engine's real queues (:meth:`Oracle.plan`)."""

    ideal = False
    direct = True

    def __init__(self, ctx: SimContext, r: int) -> None:
        self.oracle = oracle_for(ctx)
        self.r = r

    def direct_plan(self, now: float, span: float, run: RegionRun) -> Plan | None:
        return self.oracle.plan(self.r, now, span, run)

    def live_alternative(self, now: float, run: RegionRun) -> Any:
        return self.oracle.live_alternative(self.r, now)

    def steady(self) -> bool:
        return False  # re-plan every step: each step's arrivals get their own optimum


class SreRegion(GreedyRegion):
    """Greedy's targets under Google SRE client-side adaptive throttling of optional work
    (module docstring)."""

    wants_health = True

    def __init__(self, ttl_s: float, ctx: SimContext, r: int) -> None:
        super().__init__(ttl_s)
        self.throttle = SreThrottle(k=2.0, window_s=120.0)
        self.ctx = ctx
        self.samples = ctx.config.peer_samples_per_step
        self.rng = ctx.rng(r, 12)
        self.m = 1.0
        self._t = 0.0

    def multipliers(self, now: float) -> tuple[float, float]:
        return self.m, self.m

    def feedback(self, health: Health, run: RegionRun) -> list[tuple[str, dict[str, Any]]]:
        ctx = self.ctx
        dt = max(health.now - self._t, 0.0)
        self._t = health.now
        out: list[tuple[str, dict[str, Any]]] = []
        if run.targets is None:
            return out
        # attempts: the treatment requests of the step (each would carry optional work); the
        # ones sent on (share m) are accepted unless they missed the timeout
        attempts = run.arrival_rate * dt * ctx.treat
        rtts = run.sample_step_latencies(self.rng, self.samples)
        ok = float((rtts < ctx.timeout_ms).mean()) if rtts.size else 1.0
        self.throttle.record(health.now, attempts, attempts * self.m * ok)
        m = round(1.0 - self.throttle.reject_probability(health.now), 2)
        fields = {"side": "client", "lever": "all", "dropped": 0, "multiplier": m}
        out += shedding_transition(self.m, m, fields)
        self.m = m
        return out

    def steady(self) -> bool:
        return False


# --------------------------------------------------------------------------------------------
# Factories
# --------------------------------------------------------------------------------------------


class PolicyFactory:
    """Builds one policy's per-region parts for one run (one ControlPlane for all regions)."""

    def __init__(self, name: str, ctx: SimContext, control: ControlConfig | None = None) -> None:
        if name not in POLICIES:
            raise ConfigError(f"policy: unknown policy {name!r} (known: {', '.join(POLICIES)})")
        self.name = name
        self.ctx = ctx
        self.control = control or ControlConfig.from_scenario(ctx.scenario)
        self.plane: ControlPlane | None = None
        if name in ("central-only", "headroom"):
            curve = RmaCurve.from_curves(ctx.control_curves, ctx.segment_names, ctx.n0, ctx.nmax)
            self.plane = ControlPlane(self.control, ctx.rng(0, 20), rma_curve=curve)

    @property
    def interval_s(self) -> float:
        return float(self.control.interval_s)

    def region(self, ctx: SimContext, r: int) -> RegionPolicy:
        ttl = float(self.control.ttl_s)
        if self.name == "static":
            return StaticRegion()
        if self.name == "greedy":
            return GreedyRegion(ttl)
        if self.name in ("aimd", "gradient"):
            return PeerRegion(ttl, self.name, ctx, r)
        if self.name == "envoy":
            return PeerRegion(ttl, "envoy-gradient", ctx, r)
        if self.name == "sre-throttle":
            return SreRegion(ttl, ctx, r)
        if self.name == "central-only":
            assert self.plane is not None
            return PlaneRegion(self.plane)
        if self.name == "headroom":
            assert self.plane is not None
            return HeadroomRegion(self.plane, ctx)
        return OracleRegion(ctx, r)


def make_policy(name: str, ctx: SimContext) -> PolicyFactory:
    return PolicyFactory(name, ctx)


_: Callable[..., Any] = make_policy
