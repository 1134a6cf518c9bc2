"""RMA PID: the sustainable candidate count of one region, from its tail latency.

The algorithm
-------------
One loop per region, stepped once per control interval with the time it is given.

* Measurement ``y`` = p99 of the ranking path over the window (``obs.p99_ms["all"]``, from merged
  sketches — never averaged percentiles). Setpoint ``r`` = SLO × margin.
* Normalised error ``e = 1 - y/r``, clipped to ``[1 - max_overload_ratio, 1]``: positive means
  latency room, so candidates may grow. Normalising makes the gains dimensionless, so the same
  defaults serve a 50 ms and a 500 ms SLO.
* Output ``u`` in [0, 1] is the share of the span: ``candidates = base + u·(max - base)``.
* ``u_raw = P + I + D`` with ``P = kp·e``, ``I += ki·e·dt`` (``dt`` in control intervals), and
  ``D = -kd·d_f``, the derivative *of the measurement* (no kick when the setpoint moves), low-pass
  filtered: ``d_f <- α·d_f + (1-α)·(y_n - y_n,prev)/dt`` with ``y_n = y/r``.
* Limits, in order: the per-step rate limit (``u_prev - max_step_down ≤ u ≤ u_prev +
  max_step_up``); the latency guard (while ``y > r`` the output never rises, whatever the
  derivative says); the hard range [0, 1]; and the RMA budget cap, applied last and at once
  because capacity that vanished must be given back now, not a rate-limited step at a time::

      (target - base) × request_rps × cost_per_candidate ≤ budget      for CPU and accelerator

  so ``u ≤ min_k budget_k / (rps · cost_k) / span``; a zero budget on either resource means base.
* Anti-windup by back-calculation: whenever a limit changed the output, the integral is reset
  to ``I = u - P - D``, so the integral never holds more than the output it produced. After any
  length of saturation the loop leaves the limit on the first step the error changes sign.
* Bumpless hand-over: :meth:`PidController.track` sets the output (and the integral behind it)
  to the value actually in force — after a restart from a snapshot, after clients fell back to
  the baseline during a control outage, or when an operator forces a value — so the next step
  moves from there by at most one rate-limit step.

Monotonicity: ``P``, the integral update and ``D`` are each non-increasing in ``y``, and every
limit is monotone, so from the same state a higher p99 never yields a higher target (a property
test pins this down).

Why not simple-pid (installed)? Its shape is the model here (time passed in, output limits
that stop windup, ``set_auto_mode(last_output=…)``, ``components``), but it has no derivative
filter and no output rate limit, clamps its integral only to the output limits (so a rate limit
or a budget cap applied outside it would wind the integral up), keeps its state in private
attributes (no exact snapshot/restore), and calls ``time.monotonic`` in ``reset()`` unless a
clock is injected. The unit tests check that, with the filter off and no limit binding, this
controller's output equals simple-pid's step for step.

Constants: defaults in :class:`headroom.controllers.config.PidSettings`, tuned on
:class:`headroom.controllers.testing.LatencyPlant` (docs/controllers.md gives the step response).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Any

from headroom.controllers.config import PidSettings
from headroom.controllers.levers import CostModel
from headroom.kernel.jsonstate import Snapshotting

__all__ = ["PidController", "PidState", "RmaController", "RmaLimit", "RmaResult"]


@dataclass(slots=True)
class PidState:
    """Everything the controller remembers between steps (exactly what a snapshot holds)."""

    integral: float = 0.0
    output: float = 0.0
    last_measurement: float | None = None  # normalised, for the derivative
    derivative: float = 0.0  # filtered derivative of the normalised measurement
    last_time: float | None = None
    p: float = 0.0  # the last step's terms, for debugging (simple-pid's ``components``)
    d: float = 0.0


class PidController:
    """A positional PID on a normalised error with filtered derivative-on-measurement,
    per-step rate limits and back-calculation anti-windup. Pure: time is passed in."""

    __slots__ = ("settings", "state")

    def __init__(self, settings: PidSettings, output: float = 0.0) -> None:
        self.settings = settings
        self.state = PidState(integral=output, output=output)

    @property
    def components(self) -> tuple[float, float, float]:
        """(P, I, D) of the last step."""
        return self.state.p, self.state.integral, self.state.d

    def track(self, output: float) -> None:
        """Bumpless hand-over: continue from ``output`` as if the loop had produced it."""
        st = self.state
        st.output = output
        st.integral = output
        st.last_measurement = None
        st.derivative = 0.0
        st.p = st.d = 0.0

    def update(
        self,
        error: float,
        measurement: float,
        now: float,
        dt: float,
        *,
        lo: float = 0.0,
        hi: float = 1.0,
        cap: float = math.inf,
    ) -> float:
        """One step. ``error`` and ``measurement`` are normalised (see module docstring),
        ``dt`` is in control intervals (> 0). ``[lo, hi]`` is the hard range and ``cap`` an
        upper bound applied after the rate limit (a budget that may fall at once)."""
        s = self.settings
        st = self.state
        d_raw = 0.0 if st.last_measurement is None else (measurement - st.last_measurement) / dt
        deriv = s.derivative_filter * st.derivative + (1.0 - s.derivative_filter) * d_raw
        p = s.kp * error
        integral = st.integral + s.ki * error * dt
        d = -s.kd * deriv
        u = p + integral + d
        prev = st.output
        # rate limit around the output in force
        u = min(max(u, prev - s.max_step_down), prev + s.max_step_up)
        # latency guard: never add work while over the setpoint
        if error < 0.0 and u > prev:
            u = prev
        u = min(max(u, lo), hi)
        u = max(min(u, cap), lo)
        if u != p + integral + d:
            integral = u - p - d  # back-calculation: the integral holds only what was used
        st.integral = integral
        st.output = u
        st.last_measurement = measurement
        st.derivative = deriv
        st.last_time = now
        st.p = p
        st.d = d
        return u

    def snapshot(self) -> dict[str, Any]:
        st = self.state
        return {
            "integral": st.integral,
            "output": st.output,
            "last_measurement": st.last_measurement,
            "derivative": st.derivative,
            "last_time": st.last_time,
            "p": st.p,
            "d": st.d,
        }

    def restore(self, state: Mapping[str, Any]) -> None:
        """Continue from ``state`` (a :meth:`snapshot`); the settings stay this controller's."""
        lm = state.get("last_measurement")
        lt = state.get("last_time")
        self.state = PidState(
            integral=float(state["integral"]),
            output=float(state["output"]),
            last_measurement=None if lm is None else float(lm),
            derivative=float(state.get("derivative", 0.0)),
            last_time=None if lt is None else float(lt),
            p=float(state.get("p", 0.0)),
            d=float(state.get("d", 0.0)),
        )


class RmaLimit(Enum):
    """What decided the candidate target this step (the ``reason`` of a target)."""

    PID = "pid"  # the latency loop, unconstrained
    RATE_LIMIT = "rate_limit"  # the loop wanted to move further than one step
    LATENCY_GUARD = "latency_guard"  # over the setpoint: held, never raised
    BUDGET = "budget"  # the RMA budget capped it
    NO_BUDGET = "no_budget"  # zero CPU or accelerator budget: base
    MAX = "max"  # at the configured maximum
    BASE = "base"  # the loop itself asks for base
    HOLD = "hold"  # no latency samples this window: held where it was


@dataclass(frozen=True, slots=True)
class RmaResult:
    candidates: int
    limit: RmaLimit
    budget_cap: int  # the most candidates the budget pays for (>= base)
    output: float  # the loop's output, share of the span


class RmaController:
    """The RMA loop of one region: p99 in, candidate target out (see module docstring)."""

    __slots__ = ("base", "costs", "max", "pid", "setpoint_ms", "settings")

    def __init__(
        self,
        settings: PidSettings,
        setpoint_ms: float,
        base_candidates: int,
        max_candidates: int,
        costs: CostModel,
    ) -> None:
        self.settings = settings
        self.setpoint_ms = setpoint_ms
        self.base = base_candidates
        self.max = max_candidates
        self.costs = costs
        self.pid = PidController(settings, 0.0)

    @property
    def span(self) -> int:
        return self.max - self.base

    @property
    def candidates(self) -> int:
        return self.base + math.floor(self.pid.state.output * self.span + 1e-9)

    def budget_extra(
        self, request_rps: float, budget_cpu: float, budget_accelerator: float
    ) -> float:
        """Most extra candidates per request the RMA budget pays for (0 to span)."""
        if self.span <= 0 or budget_cpu <= 0.0 or budget_accelerator <= 0.0:
            return 0.0
        if request_rps <= 0.0:
            return float(self.span)
        unit = self.costs.rma_per_candidate
        extra = float(self.span)
        # divide in this order so a tiny rate overflows to inf instead of dividing by zero
        if unit.cpu_s > 0.0:
            extra = min(extra, budget_cpu / unit.cpu_s / request_rps)
        if unit.accelerator_s > 0.0:
            extra = min(extra, budget_accelerator / unit.accelerator_s / request_rps)
        return extra

    def track(self, candidates: float) -> None:
        """Bumpless: continue from ``candidates`` (e.g. base after clients fell back)."""
        u = 0.0 if self.span <= 0 else (candidates - self.base) / self.span
        self.pid.track(min(max(u, 0.0), 1.0))

    def step(
        self,
        p99_ms: float | None,
        now: float,
        dt_intervals: float,
        request_rps: float,
        budget_cpu: float,
        budget_accelerator: float,
    ) -> RmaResult:
        extra = self.budget_extra(request_rps, budget_cpu, budget_accelerator)
        cap = extra / self.span if self.span > 0 else 0.0
        # 1e-9 absorbs the rounding of budget/cost (49.999999999 -> 50), far below a candidate
        cap_candidates = self.base + math.floor(extra + 1e-9)
        st = self.pid.state
        prev = st.output
        if p99_ms is None or not math.isfinite(p99_ms) or p99_ms < 0.0:
            # no samples: hold, but a shrunken budget still applies at once
            u = min(prev, cap)
            if u != prev:
                self.pid.track(u)
            limit = RmaLimit.HOLD if u == prev else RmaLimit.BUDGET
            if cap <= 0.0:
                limit = RmaLimit.NO_BUDGET
            return RmaResult(self._candidates(u, cap_candidates), limit, cap_candidates, u)
        ratio = p99_ms / self.setpoint_ms
        ratio = min(ratio, self.settings.max_overload_ratio)
        error = 1.0 - ratio
        dt = min(max(dt_intervals, 1e-6), 10.0)
        raw_p = self.settings.kp * error
        raw_i = st.integral + self.settings.ki * error * dt
        u = self.pid.update(error, ratio, now, dt, lo=0.0, hi=1.0, cap=cap)
        wanted = raw_p + raw_i + self.pid.state.d
        if cap <= 0.0:
            limit = RmaLimit.NO_BUDGET
        elif u >= cap - 1e-12 and wanted > cap:
            limit = RmaLimit.MAX if cap >= 1.0 else RmaLimit.BUDGET
        elif error < 0.0 and u == prev and wanted > prev:
            limit = RmaLimit.LATENCY_GUARD
        elif abs(u - wanted) > 1e-12 and (
            math.isclose(u, prev + self.settings.max_step_up, abs_tol=1e-12)
            or math.isclose(u, prev - self.settings.max_step_down, abs_tol=1e-12)
        ):
            limit = RmaLimit.RATE_LIMIT
        elif u <= 0.0:
            limit = RmaLimit.BASE
        elif u >= 1.0:
            limit = RmaLimit.MAX
        else:
            limit = RmaLimit.PID
        return RmaResult(self._candidates(u, cap_candidates), limit, cap_candidates, u)

    def _candidates(self, u: float, cap_candidates: int) -> int:
        n = self.base + math.floor(u * self.span + 1e-9)
        return max(self.base, min(n, cap_candidates, self.max))

    def snapshot(self) -> dict[str, Any]:
        return self.pid.snapshot()

    def restore(self, state: Mapping[str, Any]) -> None:
        self.pid.restore(state)


_SNAPSHOTTING: tuple[type[Snapshotting], ...] = (PidController, RmaController)  # checked by mypy
