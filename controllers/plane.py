"""The control plane facade: one call per region per control interval, for both engines.

The simulator and the Faust controller app build a
:class:`~headroom.controllers.types.RegionObservation` per region per interval and call
:meth:`ControlPlane.step`, which runs, in order:

1. **value book** — discount the region's holdout sums by ``0.5 ** (window_s / half_life_s)`` and
   add the window's new sums (controllers/levers.py);
2. **allocator** — split the opportunistic pools between the registered levers by
   lower-confidence value per resource unit, with caps, a safety margin and a fallback
   (controllers/allocator.py);
3. **RMA PID** — the candidate target from the ranking path's p99, capped by RMA's budget
   (controllers/pid.py);
4. **SBM coverage** — the strong model's share from SBM's budget, the strong replicas' p99 and the
   calibration loop (controllers/coverage.py);
5. **router** — per-segment routing probabilities by Thompson sampling (controllers/router.py);

and returns the region's :class:`~headroom.controllers.types.RegionTargets`: every field clamped to
its bounds whatever the inputs were (zero rates, a p99 of 10⁹ ms, no capacity, NaN), an epoch that
only increases, and ``ttl_s``. :meth:`ControlPlane.decision` keeps the last step's inputs and
intermediate results for the ``target.issued`` event (:meth:`Decision.event_fields`).

Epochs: ``max(previous + 1, floor(now))`` — consecutive within a run, and a controller that
restarts *without* its snapshot still outranks every epoch it issued before (intervals are
≥ 1 s), so clients never ignore it.

Bumpless hand-over: :meth:`ControlPlane.snapshot` / :meth:`ControlPlane.restore` (the
convention of :class:`headroom.kernel.jsonstate.Snapshotting`) carry every controller's state
exactly (the next output after a restore equals the next output without one, given the same
generator state). If a region went unstepped for longer than ``ttl_s`` (a
control outage), its clients have fallen back to the baseline; the loops resume from the values
they last issued, cut at once by the budget caps to what the capacity now allows, so optional
work is back one step after the outage instead of ramping up from the baseline by the rate
limit (the fail-safe is the clients': expired targets mean baseline, whatever the plane holds).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from headroom.controllers.allocator import (
    Allocation,
    Allocator,
    PoolUse,
    RmaCurve,
    fill_levels,
    held_units,
)
from headroom.controllers.config import ControlConfig
from headroom.controllers.coverage import CoverageController, CoverageResult
from headroom.controllers.levers import LeverContext, LeverRegistry, ValueBook, bin_means
from headroom.controllers.pid import RmaController, RmaResult
from headroom.controllers.react import reacts
from headroom.controllers.router import RouteResult, SbmRouter
from headroom.controllers.types import (
    LEVER_PRECOMPUTE,
    LEVER_RMA,
    LEVER_SBM,
    STRATUM_SEP,
    ArmStats,
    CapacityLevel,
    RegionObservation,
    RegionTargets,
    ValueKey,
    segment_of,
)
from headroom.defences.plan import VALUE_BINS, PlanRule
from headroom.kernel.errors import HeadroomError
from headroom.kernel.jsonstate import Snapshotting, decode_big_ints, encode_big_ints
from headroom.kernel.seeds import named_rng

__all__ = ["ControlConfig", "ControlPlane", "Decision", "SnapshotError", "strong_replica_units"]

# 2: a region's value book is ``{"rows": [...]}``; 1 (still read): the bare list of rows
SNAPSHOT_VERSION = 2
READABLE_VERSIONS = (1, 2)


class SnapshotError(HeadroomError):
    """A snapshot that cannot be restored (wrong version or shape)."""


def _finite_nonneg(x: float | None) -> float:
    if x is None or not isinstance(x, int | float) or not math.isfinite(x) or x < 0.0:
        return 0.0
    return float(x)


def _per_segment(
    rates: Iterable[tuple[str, str | None, float]],
) -> dict[tuple[str, str | None], float]:
    """Tranche rates summed per (lever, segment): a stratum's (``casual#7``) go to its segment;
    RMA's bands and whole-lever tranches stay as they are. Rates that are not positive and
    finite are left out."""
    out: dict[tuple[str, str | None], float] = {}
    for lever, seg, rate in rates:
        if not (rate > 0.0 and math.isfinite(rate)):
            continue
        key = (lever, segment_of(seg) if seg is not None else None)
        out[key] = out.get(key, 0.0) + rate
    return out


def strong_replica_units(
    sbm_accelerator: float, capacity: Iterable[CapacityLevel], strong_hardware: Iterable[str]
) -> float:
    """The devices SBM's strong replicas hold for an accelerator share: a share below one device
    still gets a whole device of the largest live strong-capable pool (a replica needs one,
    in both engines and in a fleet), so coverage is sized to what that device serves."""
    if not 0.0 < sbm_accelerator < 1.0:
        return sbm_accelerator
    hardware = set(strong_hardware)
    whole = max(
        (
            c.units
            for c in capacity
            if c.pool == "opportunistic"
            and c.resource == "accelerator"
            and not c.remote
            and c.hardware in hardware
            and math.isfinite(c.units)
        ),
        default=0.0,
    )
    return max(sbm_accelerator, min(1.0, max(whole, 0.0)))


def _live_rates(
    request_rps: float,
    segment_rps: Mapping[str, float],
    value: Mapping[ValueKey, ArmStats],
    window_s: float,
) -> tuple[float, dict[str, float]]:
    """The request rates that run their plan live: every request but the window's precompute
    hits (the ``precompute`` lever's treatment sums, by segment), as ``(total, per segment)``.
    Without hits, the rates as given."""
    hits: dict[str, float] = {}
    if window_s > 0.0:
        for (key, lever, arm), a in value.items():
            if lever == LEVER_PRECOMPUTE and arm == "treatment" and a.n > 0:
                seg = segment_of(key)
                hits[seg] = hits.get(seg, 0.0) + a.n / window_s
    live = {k: _finite_nonneg(v) for k, v in segment_rps.items()}
    if not hits:
        return request_rps, live
    for seg, h in hits.items():
        if seg in live:
            live[seg] = max(live[seg] - h, 0.0)
    return max(request_rps - sum(hits.values()), 0.0), live


def _finite_or_none(x: float | None) -> float | None:
    """Event fields must be finite numbers (docs/messages.md): anything else is logged as null."""
    if x is None or not isinstance(x, int | float) or not math.isfinite(x):
        return None
    return float(x)


@dataclass(frozen=True, slots=True)
class Decision:
    """One step's inputs and intermediate results, for the event log and for debugging."""

    targets: RegionTargets
    allocation: Allocation
    rma: RmaResult
    coverage: CoverageResult
    route: RouteResult
    inputs: Mapping[str, Any]

    def event_fields(self) -> dict[str, Any]:
        """The fields of a ``target.issued`` event (docs/events.md)."""
        t = self.targets
        return {
            "epoch": t.epoch,
            "rma_candidates": t.rma_candidates,
            "sbm_coverage": t.sbm_coverage,
            "segments": dict(t.sbm_segments),
            "budget": {"cpu": t.budget_cpu, "accelerator": t.budget_accelerator},
            "reason": t.reason,
            "allocation": [
                {
                    "lever": s.lever,
                    "cpu": s.cpu,
                    "accelerator": s.accelerator,
                    "hardware": s.hardware,
                    "value_per_unit_lcb": s.value_per_unit_lcb,
                }
                for s in t.allocation
            ],
            "fallback": t.fallback,
            "precompute_jobs_per_s": t.precompute_jobs_per_s,
            "rma_levels": {seg: list(v) for seg, v in t.rma_levels.items()},
            "sbm_explore": t.sbm_explore,
            "inputs": dict(self.inputs),
            "sbm_reason": self.coverage.limit.value,
            "cap_bound": list(self.allocation.cap_bound),
            "explored": list(self.allocation.explored),
            # which segments each lever serves, in units of work per second (its tranches; a
            # lever's per-stratum tranches summed per segment), to a thousandth of a unit
            "tranches": [
                {"lever": lever, "segment": seg, "rate": round(rate, 3)}
                for (lever, seg), rate in _per_segment(self.allocation.tranche_rates).items()
            ],
        }

    def allocator_events(self) -> list[tuple[str, dict[str, Any]]]:
        """``allocator.fallback`` / ``allocator.cap_bound`` events this step warrants."""
        out: list[tuple[str, dict[str, Any]]] = []
        if self.allocation.fallback is not None:
            out.append(("allocator.fallback", {"reason": self.allocation.fallback.value}))
        return out + [
            ("allocator.cap_bound", {"lever": name, "cap": cap})
            for name, cap in self.inputs.get("caps", {}).items()
            if name in self.allocation.cap_bound
        ]


class _Region:
    __slots__ = ("book", "coverage", "epoch", "held", "last_now", "precompute_rate", "rma", "rng")

    def __init__(self, plane: ControlPlane, name: str, rng_root: int | None = None) -> None:
        cfg = plane.config
        self.rma = RmaController(
            cfg.pid, cfg.setpoint_ms, cfg.base_candidates, cfg.max_candidates, cfg.costs
        )
        self.coverage = CoverageController(
            cfg.coverage,
            cfg.setpoint_ms,
            cfg.costs,
            slo_ms=cfg.slo_p99_ms,
            ceiling=1.0 - cfg.allocator.safety_margin,
        )
        self.book = ValueBook()
        # the region's own stream (the router's draws): what one region draws does not depend
        # on the other regions or on the order the regions step in (``rng_root``: the plane's)
        self.rng = named_rng(plane.rng_root if rng_root is None else rng_root, name)
        self.epoch = 0
        self.last_now: float | None = None
        self.precompute_rate = 0.0
        # what the last split gave each lever, per kind of pool (the allocator's ``held``)
        self.held: dict[PoolUse, float] | None = None

    def snapshot(self) -> dict[str, Any]:
        return {
            "epoch": self.epoch,
            "last_now": self.last_now,
            "precompute_rate": self.precompute_rate,
            "held": None
            if self.held is None
            else [[*key, units] for key, units in sorted(self.held.items())],
            "rma": self.rma.snapshot(),
            "coverage": self.coverage.snapshot(),
            "book": self.book.snapshot(),
            "rng": encode_big_ints(self.rng.bit_generator.state),
        }

    def restore(self, state: Mapping[str, Any]) -> None:
        self.epoch = int(state["epoch"])
        ln = state.get("last_now")
        self.last_now = None if ln is None else float(ln)
        self.precompute_rate = float(state.get("precompute_rate", 0.0))
        held = state.get("held")  # None in older snapshots: every unit priced as loaded
        self.held = (
            None
            if held is None
            else {(str(lv), str(r), str(h), bool(rm)): float(u) for lv, r, h, rm, u in held}
        )
        self.rma.restore(state["rma"])
        self.coverage.restore(state["coverage"])
        self.book.restore(state.get("book", []))
        rng = state.get("rng")
        if rng is not None:  # an older snapshot without it: the region's stream starts afresh
            self.rng.bit_generator.state = decode_big_ints(rng)


class ControlPlane:
    """Runs allocator → RMA PID → SBM coverage → router for one region per :meth:`step`.

    Pure: no clock (``obs.now`` is the time), no I/O; randomness only from ``rng`` (the
    router's Thompson draws), one stream per region derived from it, so a region's targets do
    not depend on which other regions step or in what order. ``levers`` defaults to RMA and
    SBM, plus precompute when the scenario enables it, with RMA's demand limited to one
    rate-limit step above the extra candidates in force (so capacity the latency loop cannot
    use this interval goes to other levers); pass a :class:`LeverRegistry` to add or replace levers.
    """

    def __init__(
        self,
        config: ControlConfig,
        rng: np.random.Generator,
        levers: LeverRegistry | None = None,
        rma_curve: RmaCurve | None = None,
    ) -> None:
        self.config = config
        # one draw, so every region's stream derives from the generator given, whatever order
        # the regions come in (:func:`headroom.kernel.seeds.named_rng`)
        self.rng_root = int(rng.integers(0, 2**63))
        # RMA's value curve per segment (the ranking world's): with it, the targets carry the
        # level of every value bin (``rma_levels``); without it, the plan's one block
        self.rma_curve = rma_curve
        self._rule = PlanRule(0.0, config.base_candidates, config.max_candidates)
        self.levers = (
            levers
            if levers is not None
            else LeverRegistry.standard(
                config.costs,
                config.base_candidates,
                config.max_candidates,
                max_coverage=config.coverage.max_coverage,
                precompute=config.precompute_enabled,
                rma_step_headroom=math.ceil(
                    config.pid.max_step_up * (config.max_candidates - config.base_candidates)
                ),
                strong_wait_budget_ms=config.coverage.wait_budget_share * config.setpoint_ms,
                rma_curve=rma_curve,
            )
        )
        self.allocator = Allocator(config.allocator, config.value, self.levers)
        self.router = SbmRouter(config.router)
        self._regions: dict[str, _Region] = {}
        self._decisions: dict[str, Decision] = {}

    @property
    def regions(self) -> tuple[str, ...]:
        return tuple(self._regions)

    def decision(self, region: str) -> Decision | None:
        """The last step's full decision for ``region`` (None before its first step)."""
        return self._decisions.get(region)

    def handover(self, region: str, rma_candidates: int, sbm_coverage: float = 0.0) -> None:
        """Bumpless hand-over to values in force that the plane did not issue (an operator
        override, or a baseline that clients fell back to): the next step moves from them."""
        st = self._region(region)
        st.rma.track(float(rma_candidates))
        st.coverage.track(sbm_coverage)

    def reacts(
        self,
        region: str,
        now: float,
        before: Iterable[CapacityLevel],
        after: Iterable[CapacityLevel],
        t0: float = 0.0,
    ) -> bool:
        """Whether a change of the region's capacity levels from ``before`` to ``after`` at
        ``now`` warrants a step now, between the regular ticks at ``t0 + k × interval_s``
        (:func:`headroom.controllers.react.reacts`: a material change, spaced from the region's
        previous step and from the next tick). False for a region never stepped: its first
        regular step comes first."""
        st = self._regions.get(region)
        if st is None or st.last_now is None:
            return False
        cfg = self.config
        return reacts(
            cfg.react,
            cfg.interval_s,
            now,
            st.last_now,
            before,
            after,
            remote_ok=cfg.precompute_enabled,
            t0=t0,
        )

    def signal_means(self, region: str) -> dict[str, float]:
        """The region's mean value signal per value-book key (segment or stratum):
        :meth:`headroom.controllers.levers.ValueBook.signal_means` of its book (empty for a
        region never stepped)."""
        st = self._regions.get(region)
        return {} if st is None else st.book.signal_means()

    def _region(self, name: str) -> _Region:
        st = self._regions.get(name)
        if st is None:
            st = self._regions[name] = _Region(self, name)
        return st

    def step(self, obs: RegionObservation) -> RegionTargets:
        cfg = self.config
        st = self._region(obs.region)
        now = float(obs.now) if math.isfinite(obs.now) else (st.last_now or 0.0)
        window_s = _finite_nonneg(obs.window_s) or cfg.interval_s
        if st.last_now is not None and now > st.last_now:
            # after a gap longer than ttl_s (an outage) the clients run the baseline, but the
            # loops resume from what they last issued: the budget caps below cut it at once to
            # what the capacity now allows, and the latency measured under the baseline cannot
            # call for less, so optional work is back within one step instead of a ramp from
            # the baseline by the rate limit (dt of one interval: no catch-up of the ramp)
            gap = now - st.last_now
            dt = (gap if gap <= cfg.ttl_s else cfg.interval_s) / cfg.interval_s
        else:
            dt = window_s / cfg.interval_s

        request_rps = _finite_nonneg(obs.request_rps)
        eligible_rps = min(_finite_nonneg(obs.eligible_rps), request_rps)

        # 1. value book (the window's sums came from the targets in force: this context's)
        ctx = LeverContext(
            request_rps=request_rps,
            eligible_rps=eligible_rps,
            rma_extra_candidates=float(st.rma.candidates - cfg.base_candidates),
            precompute_jobs_per_s=st.precompute_rate,
            segment_rps={k: _finite_nonneg(v) for k, v in obs.segment_rps.items()},
        )
        st.book.decay(0.5 ** (window_s / cfg.value.half_life_s))
        st.book.add(obs.value)
        for lever in self.levers:
            treated = st.book.treated(obs.value, lever.name)
            if treated > 0.0:
                work = lever.work_in_window(ctx, window_s, treated)
                st.book.add_units(lever.name, treated, work / treated)

        # 2. allocator
        value_age = obs.value_age_s
        if value_age is not None and not math.isfinite(value_age):
            value_age = math.inf
        alloc = self.allocator.allocate(obs.capacity, now, ctx, st.book, value_age, st.held)
        st.held = alloc.held()

        # 3. RMA PID, sized by the requests that run live: a precompute hit runs nothing of its
        # plan (defences/plan.py, step 5), so its share of the budget would sit idle
        live_rps, live_segments = _live_rates(request_rps, obs.segment_rps, obs.value, window_s)
        rma_cpu, rma_acc = alloc.budget(LEVER_RMA)
        rma = st.rma.step(obs.p99_ms.get("all"), now, dt, live_rps, rma_cpu, rma_acc)

        # 4. SBM coverage, 5. router
        # the budget counts devices after the safety margin; the strong replicas hold the
        # announced devices behind it (in both engines the margin is slack inside a quota):
        # coverage is sized at the devices they hold, the margin being the coverage
        # controller's ceiling on how busy they are planned (taken once, not twice)
        sbm_cpu, sbm_acc = alloc.budget(LEVER_SBM)
        sbm_acc = strong_replica_units(
            held_units(sbm_acc, cfg.allocator.safety_margin),
            obs.capacity,
            cfg.costs.strong_hardware,
        )
        # the strong path's tail at the quantile its share of the requests allows (types.py,
        # strong_tail_quantile); its p99 where the observation does not carry it
        tail = obs.sbm_tail_ms if obs.sbm_tail_ms is not None else obs.p99_ms.get("sbm")
        cov = st.coverage.step(tail, obs.observed_coverage, eligible_rps, sbm_cpu, sbm_acc, dt)
        weights = self._segment_weights(obs.segment_rps)
        sbm = self.levers.get(LEVER_SBM)
        cost = sbm.unit_cost().accelerator_s if sbm is not None else 1.0
        route = self.router.route(
            cov.command,
            weights,
            st.book,
            st.rng,
            cost,
            self._sbm_segments(alloc),
            self._sbm_shares(alloc, weights, eligible_rps),
        )
        coverage = st.coverage.settle(cov.command, route.achieved, cov.intended)

        precompute = alloc.rates.get(LEVER_PRECOMPUTE, 0.0)
        st.precompute_rate = precompute
        st.epoch = max(st.epoch + 1, math.floor(now) if now < 9e15 else st.epoch + 1)
        st.last_now = now

        cmax = cfg.coverage.max_coverage
        candidates = min(max(rma.candidates, cfg.base_candidates), cfg.max_candidates)
        explore = min(max(route.floor, 0.0), 1.0) if coverage > 0.0 else 0.0
        levels = self._rma_levels(
            st.book,
            candidates - cfg.base_candidates,
            self._segment_weights(live_segments),
            route.probabilities if coverage > 0.0 else {},
            eligible_rps / request_rps if request_rps > 0.0 else 0.0,
            explore,
        )
        targets = RegionTargets(
            region=obs.region,
            ts=now,
            epoch=st.epoch,
            ttl_s=cfg.ttl_s,
            rma_candidates=candidates,
            rma_base=cfg.base_candidates,
            rma_max=cfg.max_candidates,
            sbm_coverage=min(max(coverage, 0.0), cmax),
            sbm_segments={
                s: (min(max(p, 0.0), 1.0) if coverage > 0.0 else 0.0)
                for s, p in route.probabilities.items()
            },
            budget_cpu=_finite_nonneg(alloc.total_cpu),
            budget_accelerator=_finite_nonneg(alloc.total_accelerator),
            reason=rma.limit.value,
            allocation=alloc.shares,
            precompute_jobs_per_s=_finite_nonneg(precompute),
            fallback=alloc.fallback.value if alloc.fallback is not None else None,
            rma_levels=levels,
            sbm_explore=explore,
        )
        inputs = {
            "p99_ms": {k: _finite_or_none(v) for k, v in obs.p99_ms.items()},
            "sbm_tail_ms": _finite_or_none(obs.sbm_tail_ms),
            "request_rps": request_rps,
            "eligible_rps": eligible_rps,
            "observed_coverage": _finite_or_none(obs.observed_coverage),
            "value_age_s": _finite_or_none(obs.value_age_s),
            "window_s": window_s,
            "safe_cpu": alloc.safe_cpu,
            "safe_accelerator": alloc.safe_accelerator,
            "caps": {name: cfg.allocator.cap(name) for name in self.levers.names},
        }
        self._decisions[obs.region] = Decision(targets, alloc, rma, cov, route, inputs)
        return targets

    def _rma_levels(
        self,
        book: ValueBook,
        budget: float,
        weights: Mapping[str, float],
        probabilities: Mapping[str, float],
        eligible: float,
        explore: float = 0.0,
    ) -> dict[str, tuple[int, ...]]:
        """Per segment, the extra candidates of each value bin that spend ``budget`` extras per
        treatment request best (:func:`headroom.controllers.allocator.stratum_levels`): a
        stratum is worth its mean value signal (the value book) times the curve's quality gain,
        and RMA serves the part of it the strong model is not routed (the plan's routing rule
        at the target's probabilities). Empty — the plan's one block — without a curve, without
        a budget, or while a segment with traffic has no stratum with a value signal yet; a
        stratum without one of its own (too few requests so far) is valued at its nearest bins'
        (:func:`headroom.controllers.levers.bin_means`), so one sparse bin does not send the
        whole budget to the top requests in one block."""
        curve = self.rma_curve
        if curve is None or not budget > 0.0:
            return {}
        total = sum(w for s, w in weights.items() if s in curve.gains and w > 0.0)
        segs = [s for s, w in weights.items() if s in curve.gains and w > 0.0]
        if not segs or not total > 0.0:
            return {}
        means = book.signal_means()
        k_bins = VALUE_BINS
        value = np.empty((len(segs), k_bins))
        for i, seg in enumerate(segs):
            row = bin_means(means, seg)
            if row is None:
                return {}
            value[i] = row
        share = np.repeat([weights[s] / total / k_bins for s in segs], k_bins)
        p = np.array([probabilities.get(s, 0.0) for s in segs], dtype=np.float64)
        free = 1.0 - min(max(eligible, 0.0), 1.0) * self._rule.sbm_shares(p, explore).ravel()
        hulls = [
            [(a, b, v * rise) for a, b, rise in curve.hull(seg)] if v > 0.0 else []
            for i, seg in enumerate(segs)
            for v in value[i].tolist()
        ]
        lv = fill_levels(budget, share, free, hulls)
        if lv is None:
            return {}
        top = self._rule.span
        return {
            seg: tuple(
                min(max(math.floor(x + 0.5), 0), top) for x in lv[i * k_bins : (i + 1) * k_bins]
            )
            for i, seg in enumerate(segs)
        }

    @staticmethod
    def _sbm_segments(alloc: Allocation) -> set[str] | None:
        """The segments the strong model may serve: those the allocator's SBM tranches went to,
        and those whose SBM tranche had no estimate of its own yet (still being measured).
        None (every segment) when SBM was not optimised by segment (exploration, fallback)."""
        rates = [(seg, r) for lever, seg, r in alloc.tranche_rates if lever == LEVER_SBM]
        if not rates or any(seg is None for seg, _ in rates):
            return None
        got = {segment_of(str(seg)) for seg, r in rates if r > 0.0}
        return got | {segment_of(s) for s in alloc.unmeasured.get(LEVER_SBM, ())}

    @staticmethod
    def _sbm_shares(
        alloc: Allocation, weights: Mapping[str, float], eligible_rps: float
    ) -> dict[str, float] | None:
        """The share of each segment's eligible requests the allocator's SBM tranches went to
        (their request rate over the segment's eligible rate: ``weights`` × ``eligible_rps``),
        for the router's first pass. None when SBM was not optimised by stratum."""
        rates = [(seg, r) for lever, seg, r in alloc.tranche_rates if lever == LEVER_SBM]
        if not rates or any(seg is None or STRATUM_SEP not in str(seg) for seg, _ in rates):
            return None
        total = sum(w for w in weights.values() if w > 0.0)
        if not (total > 0.0 and eligible_rps > 0.0):
            return None
        return {
            str(s): min(r / (eligible_rps * weights[str(s)] / total), 1.0)
            for (lever, s), r in _per_segment(alloc.tranche_rates).items()
            if lever == LEVER_SBM and weights.get(str(s), 0.0) > 0.0
        }

    def _segment_weights(self, segment_rps: Mapping[str, float]) -> dict[str, float]:
        weights = {s.name: 0.0 for s in self.config.segments}
        for name, rps in segment_rps.items():
            weights[name] = _finite_nonneg(rps)
        if sum(weights.values()) <= 0.0:
            for s in self.config.segments:
                weights[s.name] = s.share
        return weights

    # -- snapshot / restore -------------------------------------------------------------------

    def snapshot(self) -> dict[str, Any]:
        """Every region's controller state as plain JSON, each region's random stream with it,
        and the root the streams of regions not seen yet derive from (so a region that first
        steps after a restore draws what it would have drawn without one)."""
        return {
            "version": SNAPSHOT_VERSION,
            "levers": list(self.levers.names),
            "rng_root": str(self.rng_root),
            "regions": {name: st.snapshot() for name, st in self._regions.items()},
        }

    def restore(self, state: Mapping[str, Any]) -> None:
        """Continue exactly where the plane that took ``state`` stopped: every region's loops,
        epoch and value book are replaced (regions not in ``state`` start afresh). Reads
        snapshots of version 2 and of version 1 (the value book as a bare list of rows); any
        other version, or a malformed region, raises :class:`SnapshotError` before anything
        changes."""
        version = state.get("version") if isinstance(state, Mapping) else None
        if type(version) is not int or version not in READABLE_VERSIONS:
            raise SnapshotError(
                f"control-plane snapshot: version {version!r} is not one of {READABLE_VERSIONS}"
            )
        regions: dict[str, _Region] = {}
        try:
            # older snapshots have no root: new regions keep deriving from this plane's
            root = self.rng_root if state.get("rng_root") is None else int(state["rng_root"])
            for name, data in dict(state.get("regions", {})).items():
                region = regions[str(name)] = _Region(self, str(name), root)
                region.restore(data)
        except (AttributeError, KeyError, TypeError, ValueError) as exc:
            raise SnapshotError(f"control-plane snapshot: malformed region state ({exc})") from exc
        self.rng_root = root
        self._regions = regions
        self._decisions = {}


_SNAPSHOTTING: tuple[type[Snapshotting], ...] = (_Region, ControlPlane)  # checked by mypy
