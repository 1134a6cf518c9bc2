"""Typed, frozen settings of the central control plane, validated once with field-named errors.

:class:`ControlConfig` is everything :class:`headroom.controllers.plane.ControlPlane` needs: the
promise it protects (SLO, base and maximum candidate counts), what optional work costs (a
:class:`headroom.controllers.levers.CostModel` built from the scenario's ``models``), the segments,
and one settings group per controller. Build it with :meth:`ControlConfig.from_scenario`; every
group can be overridden by keyword, as a dataclass or as a mapping of its fields::

    cfg = ControlConfig.from_scenario(scenario, setpoint_margin=0.8, pid={"kp": 0.4})

Validation collects every problem and raises one :class:`headroom.kernel.errors.ConfigError` whose
lines name the field path (``control.pid.kp: must be >= 0, got -1``). Unknown override keys are
rejected, never ignored.

Where the defaults come from is written beside each field; docs/controllers.md explains how to
tune them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from typing import Any

from headroom.controllers.levers import CostModel
from headroom.controllers.react import ReactSettings
from headroom.kernel.checks import FieldChecker
from headroom.kernel.checks import is_finite_number as _finite
from headroom.kernel.errors import ConfigError
from headroom.kernel.scenario import DEFAULT_INTERVAL_S, TTL_INTERVALS, Scenario

_PREFIX = "control"


@dataclass(frozen=True, slots=True)
class PidSettings:
    """RMA PID (controllers/pid.py). Gains act on *normalised* quantities so they carry over
    between scenarios: error = 1 - p99/setpoint, output = share of the span [base, max], time in
    control intervals. Defaults were tuned on :class:`headroom.controllers.testing.LatencyPlant`
    (the quickstart region): from base, within 2 % of the span of the operating point in 9 intervals
    with < 1 % overshoot of the setpoint; after a 20 % capacity drop, settled again in 1-2
    intervals with a 4 % overshoot; under 3 % p99 noise the target wanders by ~8 candidates
    (docs/controllers.md shows the trade-off against faster gains)."""

    kp: float = 0.2  # share of the span per unit of normalised error
    ki: float = 0.15  # share of the span per unit of error per interval
    kd: float = 0.03  # share of the span per unit of error change per interval
    # Low-pass filter on the derivative: d_f <- alpha*d_f + (1-alpha)*d_raw. 0.5 halves the
    # step-to-step noise of a p99 read from one window of sketches.
    derivative_filter: float = 0.5
    # Per-step rate limits, shares of the span. Up: 1/20 per interval. A faster ramp (1/8) let
    # the loop rebound into a 9 % overshoot after a capacity drop on LatencyPlant, because the
    # window right after a cut still carries the old target's latency; 1/20 holds it to 4 %
    # and still settles from base in ~9 intervals. Down: 1/4, and the budget cap cuts at once.
    max_step_up: float = 0.05
    max_step_down: float = 0.25
    # A p99 far above the setpoint says one thing: cut. Beyond this multiple the normalised
    # error is clipped, so a garbage reading (1e9 ms) cannot blow up the integral or derivative.
    max_overload_ratio: float = 5.0
    # RMA's extra work shares the mixed replicas' queues with baseline work, so their servers
    # admit it only up to the utilisation whose mean queueing wait (defences/admission.py) is
    # this share of the setpoint: a token bucket filled to 100 % of the quota would queue every
    # request of the stage behind it. 0.05, not 0.1: at diurnal-3region's peak, where the
    # baseline's own tail is near the timeout, 0.1 added 3 timeouts to static's 25,481.
    wait_budget_share: float = 0.05

    def validate(self, c: FieldChecker) -> None:
        c.between("wait_budget_share", self.wait_budget_share, 0.0, 1.0, lo_open=True)
        c.at_least("kp", self.kp, 0.0)
        c.at_least("ki", self.ki, 0.0)
        c.at_least("kd", self.kd, 0.0)
        c.between("derivative_filter", self.derivative_filter, 0.0, 1.0, hi_open=True)
        c.between("max_step_up", self.max_step_up, 0.0, 1.0, lo_open=True)
        c.between("max_step_down", self.max_step_down, 0.0, 1.0, lo_open=True)
        c.at_least("max_overload_ratio", self.max_overload_ratio, 1.0, strict=True)


@dataclass(frozen=True, slots=True)
class CoverageSettings:
    """SBM coverage controller (controllers/coverage.py)."""

    max_coverage: float = 1.0  # ceiling on the share of eligible requests sent to the strong model
    # PI on the strong path's tail (normalised like the RMA loop); it can only scale the
    # budget-derived coverage down, never above what the budget pays for.
    kp: float = 0.5
    ki: float = 0.25
    # Calibration integrator on (intended - observed) coverage, per interval. 0.5 closes half
    # of a persistent gap each interval: fast enough to follow a daily mix shift, slow enough
    # not to chase one noisy window.
    calibration_ki: float = 0.5
    # Coverage is sized to what the strong replicas can serve *in time*: the budget's devices
    # run no busier than the utilisation whose mean queueing wait is this share of the setpoint
    # (defences/admission.py). One device with 40 ms requests runs ≤ ~46 % busy at 0.2 of a
    # 170 ms setpoint; two ≤ ~67 %; sixteen ≤ ~95 %. The servers admit strong work by the same
    # rule, so what is routed beyond it is downgraded at once instead of queueing.
    wait_budget_share: float = 0.2
    # The PI above holds the strong path's tail at SLO × this: its latency at the quantile
    # whose excess is half the 1 % of *all* requests the SLO lets over it (types.py,
    # strong_tail_quantile; at coverage 0.14 its p96). Strong requests are a small share of
    # all requests, so their own p99 at the SLO held their excess at a fraction of that share
    # and starved coverage for no gain; the RMA loop's 0.85 margin would starve it further
    # (the strong path's queue is bounded by its admission, above).
    strong_p99_margin: float = 1.0

    def validate(self, c: FieldChecker) -> None:
        c.between("max_coverage", self.max_coverage, 0.0, 1.0)
        c.between("wait_budget_share", self.wait_budget_share, 0.0, 1.0, lo_open=True)
        c.between("strong_p99_margin", self.strong_p99_margin, 0.0, 1.0, lo_open=True)
        c.at_least("kp", self.kp, 0.0)
        c.at_least("ki", self.ki, 0.0)
        c.between("calibration_ki", self.calibration_ki, 0.0, 1.0)


@dataclass(frozen=True, slots=True)
class RouterSettings:
    """SBM segment router (controllers/router.py)."""

    # Every segment keeps at least this routing probability whenever SBM runs at all, so its
    # uplift estimate never goes stale (capped by the coverage itself when that is lower).
    exploration_floor: float = 0.05
    # Prior on a segment's uplift: N(0, (prior_scale * pooled value sd)^2) — weak, so a few
    # hundred samples dominate it.
    prior_scale: float = 1.0

    def validate(self, c: FieldChecker) -> None:
        c.between("exploration_floor", self.exploration_floor, 0.0, 1.0)
        c.at_least("prior_scale", self.prior_scale, 0.0, strict=True)


@dataclass(frozen=True, slots=True)
class ValueSettings:
    """How value signals are accumulated into estimates (controllers/levers.py ValueBook)."""

    # Exponential discount of past sums: weight 1/2 after this many seconds, so estimates track
    # a world that drifts by ~10 %/h (the reference scenarios' drift_per_h) within the hour.
    half_life_s: float = 1800.0
    # Lower confidence bound = mean - z * standard error; 1.645 = one-sided 95 %.
    lcb_z: float = 1.645
    # A lever with fewer (discounted) treatment or control samples has no estimate yet.
    min_samples: float = 30.0

    def validate(self, c: FieldChecker) -> None:
        c.at_least("half_life_s", self.half_life_s, 0.0, strict=True)
        c.at_least("lcb_z", self.lcb_z, 0.0)
        c.at_least("min_samples", self.min_samples, 2.0)


@dataclass(frozen=True, slots=True)
class AllocatorSettings:
    """Allocator guardrails (controllers/allocator.py)."""

    # Announced opportunistic capacity is trusted only up to (1 - safety_margin): owners announce
    # levels, not guarantees, and 10 % covers the jitter between announcement and use.
    safety_margin: float = 0.1
    # No lever takes more than this share of a pool that another lever could also use.
    max_share: float = 0.9
    # Per-lever overrides of max_share, e.g. (("sbm", 0.5),).
    lever_caps: tuple[tuple[str, float], ...] = ()
    # Value signals older than this (seconds) are stale: fall back. 3 control intervals by
    # default (set from the interval in from_scenario).
    value_stale_s: float = 180.0
    # Fallback: share of the safe capacity handed to the eligible levers in equal parts while
    # value signals are missing, stale or too uncertain — enough to measure, little to lose.
    fallback_share: float = 0.25
    # Levers whose value is not yet proven (LCB <= 0) but not proven harmful either (UCB > 0)
    # keep this share of the pools they can use, so their estimates keep arriving.
    explore_share: float = 0.05
    # Live capacity the proven levers leave idle (the LP found no proven use for it) goes to the
    # levers being measured as well, in equal parts: idle units earn nothing, every unit of work
    # they do is a sample that proves or disproves the lever sooner, and the servers' admission
    # rule still bounds how busy it runs. Off: they keep ``explore_share`` alone.
    explore_idle: bool = True
    # Pools smaller than this (cores or devices, after the margin) are not worth a target.
    min_pool_units: float = 0.01

    def cap(self, lever: str) -> float:
        for name, value in self.lever_caps:
            if name == lever:
                return value
        return self.max_share

    def validate(self, c: FieldChecker) -> None:
        c.between("safety_margin", self.safety_margin, 0.0, 1.0, hi_open=True)
        c.between("max_share", self.max_share, 0.0, 1.0, lo_open=True)
        for i, item in enumerate(self.lever_caps):
            if (
                not isinstance(item, tuple)
                or len(item) != 2
                or not isinstance(item[0], str)
                or not item[0]
            ):
                c.problems.append(f"{c.path}.lever_caps[{i}]: must be (lever name, share)")
                continue
            c.between(f"lever_caps[{i}]", item[1], 0.0, 1.0)
        c.at_least("value_stale_s", self.value_stale_s, 0.0, strict=True)
        c.between("fallback_share", self.fallback_share, 0.0, 1.0)
        c.between("explore_share", self.explore_share, 0.0, 1.0)
        c.at_least("min_pool_units", self.min_pool_units, 0.0)


@dataclass(frozen=True, slots=True)
class SegmentInfo:
    name: str
    share: float


_Group = (
    PidSettings
    | CoverageSettings
    | RouterSettings
    | ValueSettings
    | AllocatorSettings
    | ReactSettings
)
_GROUPS: dict[str, type[_Group]] = {
    "pid": PidSettings,
    "coverage": CoverageSettings,
    "router": RouterSettings,
    "value": ValueSettings,
    "allocator": AllocatorSettings,
    "react": ReactSettings,
}


@dataclass(frozen=True, slots=True)
class ControlConfig:
    """Everything the control plane needs; see the module docstring."""

    slo_p99_ms: float
    base_candidates: int
    max_candidates: int
    costs: CostModel
    segments: tuple[SegmentInfo, ...]
    precompute_enabled: bool = False
    # The RMA and SBM loops hold p99 at slo × margin: 15 % below the promise leaves room for a
    # window's noise and for the minute it takes a new target to reach every client.
    setpoint_margin: float = 0.85
    # control interval and target lifetime: the scenario's ``control`` section (defaults there:
    # a minute, and 3 intervals so one lost message never expires a target)
    interval_s: float = DEFAULT_INTERVAL_S
    ttl_s: float = TTL_INTERVALS * DEFAULT_INTERVAL_S
    pid: PidSettings = field(default_factory=PidSettings)
    coverage: CoverageSettings = field(default_factory=CoverageSettings)
    router: RouterSettings = field(default_factory=RouterSettings)
    value: ValueSettings = field(default_factory=ValueSettings)
    allocator: AllocatorSettings = field(default_factory=AllocatorSettings)
    # out-of-tick steps on a material capacity change (controllers/react.py)
    react: ReactSettings = field(default_factory=ReactSettings)

    def __post_init__(self) -> None:
        problems = self.problems()
        if problems:
            raise ConfigError(problems)

    @property
    def setpoint_ms(self) -> float:
        return self.slo_p99_ms * self.setpoint_margin

    @property
    def segment_names(self) -> tuple[str, ...]:
        return tuple(s.name for s in self.segments)

    def problems(self) -> list[str]:
        c = FieldChecker(_PREFIX)
        c.at_least("slo_p99_ms", self.slo_p99_ms, 0.0, strict=True)
        if not isinstance(self.base_candidates, int) or self.base_candidates < 1:
            c.problems.append(
                f"{_PREFIX}.base_candidates: must be an integer >= 1, got {self.base_candidates!r}"
            )
        elif not isinstance(self.max_candidates, int) or self.max_candidates < self.base_candidates:
            c.problems.append(
                f"{_PREFIX}.max_candidates: must be an integer >= base_candidates "
                f"({self.base_candidates}), got {self.max_candidates!r}"
            )
        if not isinstance(self.costs, CostModel):
            c.problems.append(f"{_PREFIX}.costs: must be a CostModel, got {self.costs!r}")
        names = [s.name for s in self.segments]
        if len(set(names)) != len(names):
            c.problems.append(f"{_PREFIX}.segments: names must be unique, got {names!r}")
        for i, s in enumerate(self.segments):
            if not isinstance(s, SegmentInfo) or not s.name:
                c.problems.append(f"{_PREFIX}.segments[{i}]: must be a named SegmentInfo")
                continue
            c.between(f"segments[{i}].share", s.share, 0.0, 1.0)
        c.between("setpoint_margin", self.setpoint_margin, 0.0, 1.0, lo_open=True)
        c.at_least("interval_s", self.interval_s, 0.0, strict=True)
        c.at_least("ttl_s", self.ttl_s, 0.0, strict=True)
        if _finite(self.ttl_s) and _finite(self.interval_s) and self.ttl_s < self.interval_s:
            c.problems.append(
                f"{_PREFIX}.ttl_s: must be >= interval_s ({self.interval_s:g}), or every target "
                f"expires before the next one, got {self.ttl_s!r}"
            )
        for name, cls in _GROUPS.items():
            group: _Group = getattr(self, name)
            if not isinstance(group, cls):
                c.problems.append(f"{_PREFIX}.{name}: must be a {cls.__name__}, got {group!r}")
                continue
            sub = FieldChecker(f"{_PREFIX}.{name}")
            group.validate(sub)
            c.problems.extend(sub.problems)
        return c.problems

    @classmethod
    def from_scenario(cls, scenario: Scenario, **overrides: Any) -> ControlConfig:
        """The control settings a scenario implies, with keyword overrides.

        ``overrides`` may name any field; a settings group (``pid``, ``coverage``, ``router``,
        ``value``, ``allocator``, ``react``) takes its dataclass or a mapping of some of its
        fields, merged over the defaults. Unknown names raise :class:`ConfigError`.
        ``interval_s`` and ``ttl_s`` default to the scenario's ``control`` section (a ttl the
        file does not give is 3 of the interval in force); the allocator's ``value_stale_s`` is
        3 intervals.
        """
        control = scenario.control
        interval = overrides.get("interval_s", control.interval_s)
        if "ttl_s" in overrides:
            ttl = overrides["ttl_s"]
        elif control.ttl_s is not None:
            ttl = control.ttl_s
        else:
            ttl = TTL_INTERVALS * interval if _finite(interval) else control.target_ttl_s
        base: dict[str, Any] = {
            "slo_p99_ms": scenario.slo.p99_ms,
            "base_candidates": scenario.world.base_candidates,
            "max_candidates": scenario.world.max_candidates,
            "costs": CostModel.from_models(scenario.models, scenario.world.base_candidates),
            "segments": tuple(SegmentInfo(s.name, s.share) for s in scenario.segments),
            "precompute_enabled": scenario.precompute_enabled,
            "interval_s": interval,
            "ttl_s": ttl,
        }
        stale = TTL_INTERVALS * (
            interval if _finite(interval) and interval > 0 else DEFAULT_INTERVAL_S
        )
        base["allocator"] = AllocatorSettings(value_stale_s=stale)
        return cls.build(base, overrides)

    @classmethod
    def build(cls, base: Mapping[str, Any], overrides: Mapping[str, Any]) -> ControlConfig:
        """``base`` fields with ``overrides`` merged in (groups merged field by field)."""
        known = {f.name for f in fields(cls)}
        problems: list[str] = []
        values = dict(base)
        for key, value in overrides.items():
            if key not in known:
                problems.append(
                    f"{_PREFIX}.{key}: unknown setting (known: {', '.join(sorted(known))})"
                )
                continue
            group_cls = _GROUPS.get(key)
            if group_cls is not None and isinstance(value, Mapping):
                group_known = {f.name for f in fields(group_cls)}
                unknown = sorted(set(value) - group_known)
                for u in unknown:
                    problems.append(
                        f"{_PREFIX}.{key}.{u}: unknown setting "
                        f"(known: {', '.join(sorted(group_known))})"
                    )
                if unknown:
                    continue
                start = values.get(key) or group_cls()
                merged = dict(value)
                if key == "allocator" and "lever_caps" in merged:
                    caps = merged["lever_caps"]
                    if isinstance(caps, Mapping):
                        merged["lever_caps"] = tuple((str(k), v) for k, v in caps.items())
                values[key] = replace(start, **merged)
            else:
                values[key] = value
        if problems:
            raise ConfigError(problems)
        return cls(**values)
