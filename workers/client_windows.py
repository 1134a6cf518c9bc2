"""A client's SLO windows: what its requests received, per arm and stratum, until a window closes.

:class:`WindowBook` folds every request's :class:`Outcome` into the open windows of its region and
closes a window into one ``window`` event line (the one builder both engines use) and the value
signals the controllers learn from.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from headroom.analysis.events import WindowTraffic, window_event
from headroom.controllers.types import stratum_key
from headroom.kernel.sketch import LatencySketch
from headroom.kernel.vocab import LEVERS, LIVE_LEVERS
from headroom.streams import messages
from headroom.workers.precompute_store import (
    STALENESS_SAMPLES,
    VisitOutcome,
    quantile_samples,
)

SKETCH_ALPHA = 0.01


@dataclass(frozen=True, slots=True)
class Outcome:
    """One finished request, as a window needs it."""

    partition: int
    offset: int
    segment: str
    end_t: float  # scenario time it ended
    latency_ms: float
    ok: bool
    timeout: bool
    control: bool
    lever: str | None  # the lever it actually received (None: none)
    sbm_served: bool
    # intent-to-treat group of a treatment request: "sbm" if it was routed to the strong model
    # (served there or not), else "rma" (it got extras or not); None for the control arm
    routed: str | None
    value_total: float
    value_baseline: float
    cost_cpu_ms: float = 0.0  # optional work's cost
    cost_accelerator_ms: float = 0.0
    # the precompute look-up: "hit", "held_out", "miss"; None when precompute is off
    precompute: str | None = None
    staleness_s: float | None = None  # a hit: age of the result served (scenario seconds)
    remaining_s: float | None = None  # a hit: its life left, expires_at - visit (scenario s)
    # value bin of the request within its segment (value_stratum); None: not known (the value
    # signals then cover the whole segment)
    stratum: int | None = None
    # the request's value signal (its value, known before ranking in either arm): the
    # estimator's regression covariate (the window line's ``strata``)
    value_signal: float = 0.0


@dataclass
class _Arm:
    n: int = 0
    value_sum: float = 0.0
    value_sq_sum: float = 0.0
    cpu_ms: float = 0.0
    accelerator_ms: float = 0.0
    # the requests' value signal x: Σx, Σx², Σx·value (the value messages' signal sums)
    signal_sum: float = 0.0
    signal_sq_sum: float = 0.0
    signal_value_sum: float = 0.0

    def add(
        self, value: float, cpu_ms: float = 0.0, accelerator_ms: float = 0.0, signal: float = 0.0
    ) -> None:
        self.n += 1
        self.value_sum += value
        self.value_sq_sum += value * value
        self.cpu_ms += cpu_ms
        self.accelerator_ms += accelerator_ms
        self.signal_sum += signal
        self.signal_sq_sum += signal * signal
        self.signal_value_sum += signal * value

    def sums(self) -> dict[str, Any]:
        return {"n": self.n, "value_sum": self.value_sum, "value_sq_sum": self.value_sq_sum}


@dataclass
class _StratumArm:
    """The estimator's sums of one (stratum, arm): value delivered and value signal."""

    n: int = 0
    value_sum: float = 0.0
    value_sq_sum: float = 0.0
    signal_sum: float = 0.0
    signal_sq_sum: float = 0.0
    signal_value_sum: float = 0.0
    failed: int = 0  # requests that failed (value 0), and their value signal's sums
    failed_signal_sum: float = 0.0
    failed_signal_sq_sum: float = 0.0

    def add(self, value: float, signal: float, failed: bool = False) -> None:
        self.n += 1
        self.value_sum += value
        self.value_sq_sum += value * value
        self.signal_sum += signal
        self.signal_sq_sum += signal * signal
        self.signal_value_sum += signal * value
        if failed:
            self.failed += 1
            self.failed_signal_sum += signal
            self.failed_signal_sq_sum += signal * signal

    def sums(self) -> dict[str, Any]:
        return {
            "n": self.n,
            "value_sum": self.value_sum,
            "value_sq_sum": self.value_sq_sum,
            "signal_sum": self.signal_sum,
            "signal_sq_sum": self.signal_sq_sum,
            "signal_value_sum": self.signal_value_sum,
            "failed": self.failed,
            "failed_signal_sum": self.failed_signal_sum,
            "failed_signal_sq_sum": self.failed_signal_sq_sum,
        }


@dataclass
class _Window:
    index: int
    requests: int = 0
    errors: int = 0
    timeouts: int = 0
    sketch: LatencySketch = field(default_factory=lambda: LatencySketch(SKETCH_ALPHA))
    sketch_base: LatencySketch = field(default_factory=lambda: LatencySketch(SKETCH_ALPHA))
    value_total: float = 0.0
    value_baseline: float = 0.0
    inc: dict[str, float] = field(default_factory=lambda: dict.fromkeys(LEVERS, 0.0))
    value_lost: float = 0.0
    arms: dict[str, dict[str, _Arm]] = field(default_factory=dict)
    # the estimator's sums per stratum key (segment#bin) and arm, failed requests counted with
    # the value 0 they delivered (as the simulator counts a timed-out request)
    strata: dict[str, dict[str, _StratumArm]] = field(default_factory=dict)
    itt: dict[str, dict[str, _Arm]] = field(default_factory=dict)  # segment -> lever -> sums
    # the value signals' sums, per (segment, stratum): the intent-to-treat groups (lever ->
    # sums), and the holdout split: "live" (found no stored result: the control of rma and sbm)
    # | "precompute" (found one: the control of precompute)
    strata_itt: dict[tuple[str, int | None], dict[str, _Arm]] = field(default_factory=dict)
    controls: dict[tuple[str, int | None], dict[str, _Arm]] = field(default_factory=dict)
    treated: dict[str, int] = field(default_factory=lambda: dict.fromkeys(LIVE_LEVERS, 0))
    segments: dict[str, dict[str, Any]] = field(default_factory=dict)
    offsets: dict[int, list[int]] = field(default_factory=dict)
    # precompute look-ups of the requests of this window (None: precompute off)
    pre: dict[str, int] | None = None
    staleness: list[float] = field(default_factory=list)
    remaining_min: float | None = None

    def add(self, o: Outcome) -> None:
        self.requests += 1
        span = self.offsets.get(o.partition)
        if span is None:
            self.offsets[o.partition] = [o.offset, o.offset]
        else:
            span[0] = min(span[0], o.offset)
            span[1] = max(span[1], o.offset)
        self.sketch.add(o.latency_ms)
        if o.lever is None:
            self.sketch_base.add(o.latency_ms)
        if not o.ok:
            self.errors += 1
        if o.timeout:
            self.timeouts += 1
        self.value_total += o.value_total
        self.value_baseline += o.value_baseline
        seg = self.segments.setdefault(o.segment, {"requests": 0, "sbm": 0, "inc": 0.0})
        seg["requests"] += 1
        seg["sbm"] += int(o.sbm_served)
        if o.precompute is not None:
            self._add_lookup(o)
        inc = o.value_total - o.value_baseline
        seg["inc"] += inc
        arm_name = "control" if o.control else (o.lever if o.ok and o.lever else "none")
        by_arm = self.strata.setdefault(stratum_key(o.segment, o.stratum), {})
        by_arm.setdefault(arm_name, _StratumArm()).add(
            o.value_total if o.ok else 0.0, o.value_signal, failed=not o.ok
        )
        if not o.ok:
            # failed: it delivered nothing where the baseline would have delivered
            # value_baseline (docs/events.md ``value_lost``)
            self.value_lost += inc
            return
        if o.control or o.lever is None:
            # no optional work: value − baseline value is 0 unless its answer differed from
            # the baseline's; kept in value_lost so the levers and value_lost add up exactly
            self.value_lost += inc
        arms = self.arms.setdefault(o.segment, {})
        if o.control:
            arms.setdefault("control", _Arm()).add(o.value_total)
            split = "precompute" if o.precompute == VisitOutcome.HELD_OUT.value else "live"
            key = (o.segment, o.stratum)
            self.controls.setdefault(key, {}).setdefault(split, _Arm()).add(
                o.value_total, signal=o.value_signal
            )
            return
        # the log's arms: what the request received; "none" for a treatment request that got
        # no optional work, so that a value-aware choice of the treated requests cannot bias
        # the holdout estimate (the treatment arms together stay a random sample)
        arms.setdefault(o.lever or "none", _Arm()).add(
            o.value_total, o.cost_cpu_ms, o.cost_accelerator_ms
        )
        if o.lever is not None:
            self.inc[o.lever] += inc
            self.treated[o.lever] = self.treated.get(o.lever, 0) + 1
        if o.routed is not None:
            self.itt.setdefault(o.segment, {}).setdefault(o.routed, _Arm()).add(
                o.value_total, o.cost_cpu_ms, o.cost_accelerator_ms
            )
            by_lever = self.strata_itt.setdefault((o.segment, o.stratum), {})
            by_lever.setdefault(o.routed, _Arm()).add(
                o.value_total, o.cost_cpu_ms, o.cost_accelerator_ms, o.value_signal
            )

    def _add_lookup(self, o: Outcome) -> None:
        pre = self.pre
        if pre is None:
            pre = self.pre = {"visits": 0, "hits": 0, "held_out": 0}
        pre["visits"] += 1
        if o.precompute == VisitOutcome.HIT.value:
            pre["hits"] += 1
            if o.staleness_s is not None:
                self.staleness.append(o.staleness_s)
            if o.remaining_s is not None:
                low = self.remaining_min
                self.remaining_min = o.remaining_s if low is None else min(low, o.remaining_s)
        elif o.precompute == VisitOutcome.HELD_OUT.value:
            pre["held_out"] += 1


class WindowBook:
    """Per-window aggregation of finished requests, and the lines a window publishes.

    Windows are SLO windows of scenario time (``window_s``), indexed ``floor(t / window_s)`` by
    the time a request *ended*. :meth:`due` lists windows that ended before ``now``; :meth:`take`
    removes one (or every open one, for a partial flush) and returns its window event and value
    signals.
    """

    def __init__(self, region: str, window_s: float, segments: Sequence[str]) -> None:
        self.region = region
        self.window_s = window_s
        self.segments = tuple(segments)
        self._open: dict[int, _Window] = {}

    def index(self, t: float) -> int:
        return math.floor(t / self.window_s)

    def add(self, outcome: Outcome) -> None:
        k = self.index(outcome.end_t)
        window = self._open.get(k)
        if window is None:
            window = self._open[k] = _Window(k)
        window.add(outcome)

    @property
    def open_windows(self) -> list[int]:
        return sorted(self._open)

    def due(self, now_t: float) -> list[int]:
        current = self.index(now_t)
        return [k for k in sorted(self._open) if k < current]

    def take(self, k: int) -> _Window | None:
        return self._open.pop(k, None)

    def event_fields(
        self, w: _Window, *, targets: Mapping[str, Any], source: str
    ) -> dict[str, Any]:
        """The ``window`` line of docs/events.md (without the common fields), built by
        :func:`headroom.analysis.events.window_event` as the simulator's are."""
        traffic = WindowTraffic(
            requests=w.requests,
            errors=w.errors,
            timeouts=w.timeouts,
            sketch=w.sketch.to_dict(),
            sketch_base=w.sketch_base.to_dict(),
            value_total=w.value_total,
            value_baseline=w.value_baseline,
            inc=w.inc,
            value_lost=w.value_lost,
            arms={seg: {a: arm.sums() for a, arm in by.items()} for seg, by in w.arms.items()},
            strata={k: {a: arm.sums() for a, arm in by.items()} for k, by in w.strata.items()},
            # the intent-to-treat sums behind the value signals (headroom.value), per segment
            itt={seg: {lv: arm.sums() for lv, arm in by.items()} for seg, by in w.itt.items()},
            eligible_treated=w.treated,
            segments=w.segments,
            targets=targets,
        )
        return window_event(
            w.index * self.window_s,
            (w.index + 1) * self.window_s,
            traffic,
            precompute=None if w.pre is None else self.precompute_fields(w),
            offsets=w.offsets,
            client=source,
        )

    @staticmethod
    def precompute_fields(w: _Window) -> dict[str, Any]:
        """The look-ups of the window's requests (docs/events.md ``precompute``): ``visits``,
        ``hits``, ``held_out``, ``staleness_s`` (≤ 32 samples at evenly spaced quantiles) and
        ``remaining_s_min`` (the least life a served result had left; never negative)."""
        pre = dict(w.pre or {"visits": 0, "hits": 0, "held_out": 0})
        out: dict[str, Any] = {
            **pre,
            "staleness_s": list(quantile_samples(sorted(w.staleness), STALENESS_SAMPLES)),
        }
        if w.remaining_min is not None:
            out["remaining_s_min"] = w.remaining_min
        return out

    def value_signals(self, w: _Window, ts: float) -> list[messages.ValueSignal]:
        """Sums per (segment, stratum, lever, arm) for the control plane: a lever's treatment
        arm is its intent-to-treat group (requests routed to SBM; the others not held out, for
        RMA; hits, for precompute), so the value-ranked choice of who gets extras cannot bias
        it. Control: for ``rma`` and ``sbm`` the holdout requests that found no stored result,
        for ``precompute`` those that found one (module docstring: like with like). ``stratum``
        is the requests' value bin within their segment (None for requests without one); the
        strata of a segment add up to its sums.
        """
        out = []
        keys = set(w.controls) | set(w.strata_itt)
        for key in sorted(keys, key=lambda k: (k[0], -1 if k[1] is None else k[1])):
            seg, stratum = key
            controls = w.controls.get(key, {})
            for lever in LEVERS:
                control = controls.get("precompute" if lever == "precompute" else "live")
                treated = w.strata_itt.get(key, {}).get(lever)
                for arm_name, arm in (("treatment", treated), ("control", control)):
                    if arm is None or arm.n == 0:
                        continue
                    out.append(
                        messages.ValueSignal(
                            ts=ts,
                            region=self.region,
                            segment=seg,
                            lever=lever,  # type: ignore[arg-type]
                            arm=arm_name,  # type: ignore[arg-type]
                            n=arm.n,
                            value_sum=arm.value_sum,
                            value_sq_sum=arm.value_sq_sum,
                            window_s=self.window_s,
                            cost=messages.Cost(
                                cpu_ms=arm.cpu_ms, accelerator_ms=arm.accelerator_ms
                            ),
                            stratum=stratum,
                            signal_sum=arm.signal_sum,
                            signal_sq_sum=arm.signal_sq_sum,
                            signal_value_sum=arm.signal_value_sum,
                        )
                    )
        return out
