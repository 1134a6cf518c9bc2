"""SBM coverage: the share of eligible requests a region sends to the stronger model.

The algorithm
-------------
One loop per region, stepped once per control interval after the allocator has set SBM's budget.

1. **Budget.** What the budget pays for::

       c_budget = min( u* · accelerator_budget / (eligible_rps · accelerator_s per strong request),
                       cpu_budget               / (eligible_rps · cpu_s per strong request) )

   where ``u*`` = :func:`headroom.defences.admission.admissible_utilization` of the budget's
   devices for the strong request's accelerator time and a mean-wait budget of
   ``wait_budget_share`` × the setpoint: the share of the devices the strong replicas can keep busy
   without their queue eating the latency budget (about half of one device, two thirds of two),
   never above the controller's ``ceiling`` (``1 − allocator.safety_margin`` from the control
   plane: the margin is taken here, once — the budget arrives in the devices the strong replicas
   hold, not in the allocator's units after the margin);

   clamped to [0, max_coverage]; per-request costs come from
   :class:`headroom.controllers.levers.CostModel` (``sbm_per_request``). No eligible traffic or no
   budget means 0.
2. **Latency correction.** The strong path's tail: its latency at the quantile its share of the
   requests allows (``obs.sbm_tail_ms``, :func:`headroom.controllers.types.strong_tail_quantile`:
   its requests over the target stay within half the 1 % of all requests the SLO lets over it;
   its p99 where the observation does not carry the tail). A PI term on the normalised error
   ``e = 1 - tail / target`` (clipped like the RMA loop; ``target``
   = ``strong_p99_margin`` × the SLO when the plane passes the SLO, else the setpoint) gives a
   scale ``s = clamp(1 + kp·e + I, 0, 1)`` with ``I += ki·e·dt`` and back-calculation
   (``I = s - 1 - kp·e`` whenever the clamp acts). It can only *reduce* the budget's coverage —
   a fast strong pool does not make the budget any larger. ``intended = s · c_budget``.
3. **Calibration.** Clients apply per-segment probabilities chosen for this window's traffic mix;
   the next window's mix differs, and shedding downgrades some requests, so the observed share
   drifts from the intended one. An integrator closes that gap::

       cal <- cal + calibration_ki · (intended_prev - observed)    (−c_max ≤ cal ≤ c_max − intended)
       command = clamp(intended + cal, 0, c_max)

   ``c_max`` is ``max_coverage``, or less: the coverage the strong servers admit on the budget's
   devices (their admission rule at the whole admissible utilisation, without the ceiling),
   never below ``c_budget``. A command above it would only buy downgrades, and a
   calibration that chased the client-side shedding those downgrades trigger (the clients'
   multiplier routes fewer requests, the observed share falls) would wind the command up
   further still: a cycle of overload and shedding that keeps the strong queue at its limit.

   The router turns ``command`` into segment probabilities. The integrator is frozen while the
   command sits at a limit in the direction of the gap (conditional integration, so it cannot
   wind up against a router that has nothing more to give). The coverage *reported* in the
   target is what the router achieved minus the calibration offset, never above ``intended``:
   the budget bounds what the lever is expected to consume, and the calibration only makes the
   consumption meet it.

Constants: :class:`headroom.controllers.config.CoverageSettings`; docs/controllers.md explains them.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Any

from headroom.controllers.config import CoverageSettings
from headroom.controllers.levers import CostModel
from headroom.defences.admission import admissible_utilization
from headroom.kernel.jsonstate import Snapshotting

__all__ = [
    "CoverageController",
    "CoverageLimit",
    "CoverageResult",
    "observed_coverage",
    "strong_admissible",
]


def observed_coverage(
    requests: float, strong_requests: float, eligible_share: float, treat_share: float
) -> float | None:
    """The coverage a window shows, in the units of the command the router turns into
    probabilities: the strong model's requests over the window's eligible *treatment* requests
    (``requests`` × ``eligible_share`` × ``treat_share``, ``treat_share`` = 1 − holdout: the
    holdout's requests are never routed, so counting them would read every coverage
    ``treat_share`` times too low and the calibration would wind the command up to make up a
    gap that is not there). At most 1; None without eligible treatment requests. Both engines'
    observations use it."""
    eligible = float(requests) * float(eligible_share) * float(treat_share)
    if not eligible > 0.0:
        return None
    return min(1.0, max(0.0, float(strong_requests)) / eligible)


class CoverageLimit(Enum):
    """What decided the intended coverage this step."""

    BUDGET = "budget"  # the accelerator (or CPU) budget
    LATENCY = "latency"  # the strong replicas' p99 scaled it down
    MAX = "max"  # the configured ceiling
    NO_BUDGET = "no_budget"
    NO_TRAFFIC = "no_traffic"


@dataclass(frozen=True, slots=True)
class CoverageResult:
    intended: float  # budget × latency scale, in [0, max_coverage]: what the lever may consume
    command: float  # what the router should aim at: intended + calibration, clamped
    budget_coverage: float
    latency_scale: float
    calibration: float
    limit: CoverageLimit


def strong_admissible(
    settings: CoverageSettings, setpoint_ms: float, costs: CostModel, units: float
) -> float:
    """How busy ``units`` strong devices may run: the admissible utilisation for one strong
    request's accelerator time and a mean wait of ``wait_budget_share`` × the setpoint. The
    coverage controller sizes coverage by it and the strong servers admit by it."""
    return admissible_utilization(
        units,
        costs.sbm_per_request.accelerator_s * 1000.0,
        settings.wait_budget_share * setpoint_ms,
    )


class CoverageController:
    __slots__ = (
        "calibration",
        "ceiling",
        "costs",
        "integral",
        "last_command",
        "last_reported",
        "scale",
        "setpoint_ms",
        "settings",
        "target_ms",
    )

    def __init__(
        self,
        settings: CoverageSettings,
        setpoint_ms: float,
        costs: CostModel,
        slo_ms: float | None = None,
        ceiling: float = 1.0,
    ) -> None:
        self.settings = settings
        # the most of its devices' time the strong replicas may be planned busy, whatever the
        # queue tolerates: ``1 − allocator.safety_margin`` (the margin taken once, here)
        self.ceiling = min(max(ceiling, 0.0), 1.0)
        self.setpoint_ms = setpoint_ms
        # the strong path's tail target (module docstring, step 2)
        self.target_ms = settings.strong_p99_margin * slo_ms if slo_ms is not None else setpoint_ms
        self.costs = costs
        self.integral = 0.0
        self.scale = 1.0
        self.calibration = 0.0
        self.last_reported: float | None = None
        self.last_command: float | None = None

    def budget_coverage(
        self, eligible_rps: float, budget_cpu: float, budget_accelerator: float
    ) -> float:
        """The coverage the budget pays for (module docstring, step 1)."""
        return self._coverage_at(eligible_rps, budget_cpu, budget_accelerator, self.ceiling)

    def admitted_coverage(
        self, eligible_rps: float, budget_cpu: float, budget_accelerator: float
    ) -> float:
        """The most coverage the strong servers admit on the budget's devices: their admission
        rule has no :attr:`ceiling` (module docstring, step 3: the command never routes more,
        whatever the calibration asks; the excess would only be downgraded)."""
        return self._coverage_at(eligible_rps, budget_cpu, budget_accelerator, 1.0)

    def _coverage_at(
        self, eligible_rps: float, budget_cpu: float, budget_accelerator: float, ceiling: float
    ) -> float:
        if eligible_rps <= 0.0:
            return 0.0
        unit = self.costs.sbm_per_request
        c = self.settings.max_coverage
        # divide in this order so a vanishing rate overflows to inf instead of dividing by 0
        if unit.accelerator_s > 0.0:
            units = max(budget_accelerator, 0.0)
            busy = self.admissible(units, ceiling)
            c = min(c, units * busy / unit.accelerator_s / eligible_rps)
        if unit.cpu_s > 0.0:
            c = min(c, max(budget_cpu, 0.0) / unit.cpu_s / eligible_rps)
        return max(c, 0.0)

    def admissible(self, units: float, ceiling: float | None = None) -> float:
        """How busy ``units`` strong devices may run (module docstring, step 1), never above
        ``ceiling`` (default :attr:`ceiling`)."""
        top = self.ceiling if ceiling is None else ceiling
        return min(strong_admissible(self.settings, self.setpoint_ms, self.costs, units), top)

    def track(self, coverage: float) -> None:
        """Bumpless hand-over: the coverage in force is ``coverage`` (e.g. 0 after clients fell
        back); calibration restarts from what is observed next."""
        self.last_reported = None
        self.last_command = min(max(coverage, 0.0), self.settings.max_coverage)

    def step(
        self,
        p99_sbm_ms: float | None,
        observed_coverage: float | None,
        eligible_rps: float,
        budget_cpu: float,
        budget_accelerator: float,
        dt_intervals: float,
    ) -> CoverageResult:
        s = self.settings
        dt = min(max(dt_intervals, 1e-6), 10.0)
        c_budget = self.budget_coverage(eligible_rps, budget_cpu, budget_accelerator)
        # the command's ceiling: what the strong servers admit (routing more buys downgrades)
        cmax = min(
            s.max_coverage,
            max(self.admitted_coverage(eligible_rps, budget_cpu, budget_accelerator), c_budget),
        )

        # 2. latency PI on the strong replicas
        if p99_sbm_ms is not None and math.isfinite(p99_sbm_ms) and p99_sbm_ms >= 0.0:
            ratio = min(p99_sbm_ms / self.target_ms, 5.0)
            e = 1.0 - ratio
            integral = self.integral + s.ki * e * dt
            raw = 1.0 + s.kp * e + integral
            scale = min(max(raw, 0.0), 1.0)
            if scale != raw:
                integral = scale - 1.0 - s.kp * e
            self.integral = integral
            self.scale = scale
        intended = c_budget * self.scale

        # 3. calibration on last step's intended vs what was observed
        if (
            observed_coverage is not None
            and math.isfinite(observed_coverage)
            and self.last_reported is not None
            and intended > 0.0
        ):
            observed = min(max(observed_coverage, 0.0), 1.0)
            gap = self.last_reported - observed
            last_cmd = self.last_command if self.last_command is not None else 0.0
            frozen = (gap > 0.0 and last_cmd >= cmax) or (gap < 0.0 and last_cmd <= 0.0)
            if not frozen:
                # never more than the command can use (anti-windup: an offset beyond ``c_max``
                # would only delay the way back once the gap closes)
                self.calibration = min(
                    max(self.calibration + s.calibration_ki * gap, -cmax), cmax - intended
                )
        command = min(max(intended + self.calibration, 0.0), cmax) if intended > 0.0 else 0.0

        if eligible_rps <= 0.0:
            limit = CoverageLimit.NO_TRAFFIC
        elif c_budget <= 0.0:
            limit = CoverageLimit.NO_BUDGET
        elif self.scale < 1.0:
            limit = CoverageLimit.LATENCY
        elif c_budget >= s.max_coverage:
            limit = CoverageLimit.MAX
        else:
            limit = CoverageLimit.BUDGET
        return CoverageResult(intended, command, c_budget, self.scale, self.calibration, limit)

    def settle(self, command: float, achieved: float, intended: float) -> float:
        """Record what the router did with ``command``; returns the coverage to report
        (``achieved - calibration``, within [0, intended])."""
        reported = min(max(achieved - self.calibration, 0.0), intended)
        if achieved <= 0.0:
            reported = 0.0
        self.last_reported = reported
        self.last_command = command if achieved >= command - 1e-9 else self.settings.max_coverage
        return reported

    def snapshot(self) -> dict[str, Any]:
        return {
            "integral": self.integral,
            "scale": self.scale,
            "calibration": self.calibration,
            "last_reported": self.last_reported,
            "last_command": self.last_command,
        }

    def restore(self, state: Mapping[str, Any]) -> None:
        self.integral = float(state["integral"])
        self.scale = float(state["scale"])
        self.calibration = float(state["calibration"])
        lr = state.get("last_reported")
        lc = state.get("last_command")
        self.last_reported = None if lr is None else float(lr)
        self.last_command = None if lc is None else float(lc)


_SNAPSHOTTING: tuple[type[Snapshotting], ...] = (CoverageController,)  # checked by mypy
