"""Event log → the metrics document of docs/analysis.md, in one streaming pass.

Pure: an iterable of event dicts in (``compute_metrics``, or :class:`MetricsAccumulator` fed one
event at a time), a JSON-ready ``dict`` out. No files, no clock, no randomness; the same events
give the same document, whichever engine (simulator or Kafka workers) wrote them.

The algorithm, per policy (every line carries ``policy``; a ``null`` policy on ``run.started`` or
``oracle.bound`` applies to every policy):

* **SLO windows.** ``window`` lines are grouped by (policy, region, ``t_start``). Counts and sums
  are added as each line arrives (they add exactly, in any order). Latency is judged per window on
  the *merged* sketch of every source of that window (``LatencySketch.merge``; percentiles are
  never averaged): ``p99 = merged.quantile(0.99)``. A window is judged once no line for it can
  still arrive — when a line of the same (policy, region) starts ``lateness`` seconds of event time
  after the window ended (``max(60 s, 6 windows)``: Kafka delivery and client flush delays are
  seconds, not minutes), or at the end of the log. A window whose merged sketch is empty does not
  count. Memory: the open windows, three floats per judged window (start, end, p99) and one
  per precompute staleness sample; never the lines themselves.

  ``violation_fraction = #{judged windows with p99 > slo.p99_ms} / #{judged windows}``, pooled over
  regions; ``worst_window_p99_ms = max p99``.

* **Value.** ``incremental = Σ_windows (value_total − value_baseline)``; ``incremental_<lever> =
  Σ inc[lever]``. ``oracle_incremental`` from ``oracle.bound``; ``capture_ratio = incremental /
  oracle_incremental``, null where the bound is too small to divide by (:func:`capture_ratio`:
  ``bound ≤ max(1e-6 · |baseline|, 1e-9)``) or the policy is incomplete. ``feasible_bound``
  from the same lines (the bound under the engine's own rules; null where no line carries it)
  and ``capture_feasible = incremental / feasible_bound`` by the same rule.

* **Holdout estimate**: the one estimator of :mod:`headroom.kernel.estimate` (post-stratified,
  regression-adjusted; docs/analysis.md), on the window lines' ``strata`` sums (segment × value
  bin, with the value signal's sums) where the policy's lines carry them, else on the
  per-segment ``arms`` (segments as strata, no regression term). ``estimated_by_lever`` is the
  same estimator over the arms that received each lever. A segment with treated requests but
  fewer than 2 control requests is left out and counted in ``estimate_unusable_segments``.
  ``incremental_lost = Σ value_lost``: the levers and it add up to ``incremental``.

* **Release times.** ``release_ms`` of ``optional.released`` events; p50 and p99 by the
  nearest-rank rule (the smallest observed value with at least q of the observations at or below
  it: a tail figure that was actually observed, never interpolated below one), and the max.

* **Completeness.** A policy is ``complete`` when a ``run.finished`` line applies to it, its
  window lines cover ``[0, duration_s]`` in every region of the run (the union of their spans,
  kept as merged intervals: :class:`Coverage`), and no corrupt line names it
  (``LogStats.corrupt_by_policy``, given to :meth:`MetricsAccumulator.result`). Otherwise
  ``complete`` is false, ``completeness`` says why and ``duration_s`` is the span covered in every
  region.

* **Run-wide latency.** ``latency.all_p99_ms`` / ``baseline_only_p99_ms``: p99 of the merge
  (:class:`SketchSum`) of every window's ``sketch`` / ``sketch_base``.

Where the window lines carry ``precompute`` sums, the policy gets a ``precompute`` section:
``hit_rate = Σ hits / Σ visits`` and ``staleness_s_p50`` the nearest-rank median of every
staleness sample the windows carry (each window ships at most 32, docs/events.md).
"""

from __future__ import annotations

import bisect
import math
from array import array
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from headroom.analysis.events import KNOWN_KINDS as _KNOWN
from headroom.analysis.events import EventLog, LogStats, base_sketch, unpack_sketch
from headroom.analysis.faults import FAULT_KINDS, FaultBook
from headroom.controllers.types import segment_of
from headroom.kernel.errors import ConfigError, HeadroomError
from headroom.kernel.estimate import Z_95, Moments, estimate
from headroom.kernel.vocab import LEVERS, RESOURCES

CONTROL_ARM = "control"
# A window is judged once event time has moved this far past its end (see module docstring).
MIN_LATENESS_S = 60.0
LATENESS_WINDOWS = 6


class AnalysisError(ConfigError):
    """The event log cannot be analysed (bad input: exit 2), e.g. it has no ``run.started``."""


# ---------------------------------------------------------------------------------------------
# Small pure helpers (also used by the report)
# ---------------------------------------------------------------------------------------------


def nearest_rank(sorted_values: Sequence[float], q: float) -> float:
    """The nearest-rank q-quantile of already sorted values (0.0 for none)."""
    n = len(sorted_values)
    if n == 0:
        return 0.0
    rank = max(1, math.ceil(q * n - 1e-9))
    return float(sorted_values[min(rank, n) - 1])


@dataclass(slots=True)
class ArmSums:
    """Sums of one (segment, arm): they add exactly across windows and sources."""

    n: int = 0
    value_sum: float = 0.0
    value_sq_sum: float = 0.0

    def add(self, d: Mapping[str, Any]) -> None:
        self.n += _count(d.get("n"))
        self.value_sum += _num(d.get("value_sum"))
        self.value_sq_sum += _num(d.get("value_sq_sum"))

    @property
    def mean(self) -> float:
        return self.value_sum / self.n if self.n else 0.0

    @property
    def variance(self) -> float:
        """Unbiased sample variance (0 for fewer than 2 observations)."""
        if self.n < 2:
            return 0.0
        return max(0.0, (self.value_sq_sum - self.value_sum**2 / self.n) / (self.n - 1))


@dataclass(frozen=True, slots=True)
class HoldoutEstimate:
    value: float
    variance: float
    unusable_segments: tuple[str, ...]

    @property
    def se(self) -> float:
        return math.sqrt(self.variance)

    @property
    def ci95(self) -> tuple[float, float]:
        half = Z_95 * self.se
        return (self.value - half, self.value + half)


def holdout_estimate(
    arms: Mapping[str, Mapping[str, ArmSums]], levers: Sequence[str] | None = None
) -> HoldoutEstimate:
    """The holdout estimate from per-segment arms (no value bins, no signal sums): the one
    estimator (:func:`headroom.kernel.estimate.estimate`) with segments as strata and no
    regression term; ``levers`` restricts it to the arms that received one of them."""
    strata = {
        seg: {
            name: Moments(float(a.n), a.value_sum, a.value_sq_sum)
            for name, a in by_arm.items()
            if name == CONTROL_ARM or levers is None or _arm_has(name, levers)
        }
        for seg, by_arm in arms.items()
    }
    est = estimate(strata)
    return HoldoutEstimate(est.value, est.variance, est.unusable)


def _arm_has(arm: str, levers: Sequence[str]) -> bool:
    """An arm named by the levers it received (``rma``, ``rma+sbm``) got one of ``levers``."""
    return any(part in levers for part in arm.split("+"))


def stratified_estimate(
    strata: Mapping[str, Mapping[str, Moments]], levers: Sequence[str] | None = None
) -> HoldoutEstimate:
    """The holdout estimate from the window lines' ``strata`` (segment × value bin, with the
    value signal's sums): post-stratified and regression-adjusted, one slope per segment."""
    chosen = None
    if levers is not None:
        names = {n for by in strata.values() for n in by if n != CONTROL_ARM}
        chosen = [n for n in names if _arm_has(n, levers)]
    est = estimate(strata, arms=chosen, group_of=segment_of)
    return HoldoutEstimate(est.value, est.variance, est.unusable)


# ---------------------------------------------------------------------------------------------
# Window judging
# ---------------------------------------------------------------------------------------------


def _validated(d: Any) -> Any:
    """The sketch as a ``LatencySketch``, validated (raises ``ValidationError`` naming the part)."""
    from headroom.kernel.sketch import LatencySketch

    return LatencySketch.from_dict(unpack_sketch(d))


_BIN_VALUES: dict[tuple[float, int], float] = {}  # a pure cache of constants, bounded below


def _bin_value(key: int, alpha: float) -> float:
    """``headroom.kernel.sketch.bin_values`` of one key (the same float), memoised: numpy per scalar
    costs more than the rest of a window's judging."""
    value = _BIN_VALUES.get((alpha, key))
    if value is None:
        from headroom.kernel.sketch import bin_values

        value = float(bin_values([key], alpha)[0])
        if len(_BIN_VALUES) < 100_000:
            _BIN_VALUES[(alpha, key)] = value
    return value


def sketch_quantile(d: Mapping[str, Any], q: float) -> float | None:
    """``LatencySketch.from_dict(d).quantile(q)`` without building the sketch — the same number.

    The hot path of the analyzer: a 24 h, 3-region, 7-policy log has ~180k windows of one source
    each. Walks the bins, or a packed sketch's counts (docs/events.md), from the top (for a tail
    quantile only the top few bins are visited) and converts only the keys; anything malformed
    falls back to the validating path, which raises ``ValidationError`` naming the field at
    fault. ``None`` for an empty sketch.
    """
    try:
        alpha = d["alpha"]
        zeros = d.get("zeros", 0)
        if type(zeros) is not int or zeros < 0 or not 0.0 < alpha < 1.0:
            raise ValueError
        top_down: Iterator[tuple[int, Any]]
        if "counts" in d:
            offset, counts = d["offset"], d["counts"]
            if not _packed_shape_ok(offset, counts) or (counts and min(counts) < 0):
                raise ValueError
            positive = sum(counts)
            top_down = ((offset + i, counts[i]) for i in range(len(counts) - 1, -1, -1))
        else:
            bins = d["bins"]
            positive = sum(bins.values())
            if type(positive) is not int or (bins and min(bins.values()) < 0):
                raise ValueError
            # a non-canonical key such as "0372" gives no count: the validating path says so
            top_down = ((key, bins.get(str(key))) for key in sorted(map(int, bins), reverse=True))
        return _walk_down(top_down, positive, zeros, float(alpha), q)
    except (AttributeError, LookupError, TypeError, ValueError):
        # raises with the reason, or accepts an unusual but valid form
        return _validated(d).quantile(q)  # type: ignore[no-any-return]


def _walk_down(
    top_down: Iterator[tuple[int, Any]], positive: int, zeros: int, alpha: float, q: float
) -> float | None:
    """The q-quantile of a sketch of ``positive`` samples in bins and ``zeros`` at 0, walking
    its ``(key, count)`` pairs from the top key down (for a tail quantile only the top few are
    visited). Raises ``LookupError`` at a count that is None."""
    n = positive + zeros
    if n == 0:
        return None
    rank = math.floor(q * (n - 1)) - zeros
    if rank < 0:
        return 0.0
    above = positive - 1 - rank  # positive samples above the wanted one
    seen = 0
    for key, c in top_down:
        if c is None:
            raise LookupError(key)
        seen += c
        if seen > above:
            return _bin_value(key, alpha)
    raise AssertionError("unreachable: counts and rank disagree")  # pragma: no cover


_JUST_INT = {int}


def _packed_shape_ok(offset: Any, counts: Any) -> bool:
    """Whether a packed sketch (docs/events.md) has an integer ``offset`` and a list of integer
    ``counts`` (their signs are the caller's rule)."""
    return (
        type(offset) is int
        and type(counts) is list
        and (not counts or set(map(type, counts)) == _JUST_INT)
    )


def _counts_ok(d: dict[Any, Any], packed: bool) -> bool:
    """Whether a sketch's counts are integers (a keyed sketch's ``bins``, or a packed one with an
    integer ``offset`` and a list of ``counts``). A negative count passes: it is dropped at the
    end with the bins it cancels."""
    if packed:
        return _packed_shape_ok(d.get("offset"), d.get("counts"))
    try:
        return type(sum(d.values())) is int
    except TypeError:
        return False


class SketchSum:
    """Adds many contract sketches (one alpha), exactly like ``LatencySketch.merge``, a window
    line's packed ones too (docs/events.md): bin counts are added under their keys as the log
    spells them (a packed sketch's as integers; integers only at the end), the cheapest
    merge in Python. Used for the run-wide latency of a policy here and for the report's CDFs.
    A sketch of another alpha, or with a count or ``zeros`` that is not an integer, is left out
    (counted in ``mismatched`` / ``malformed``)."""

    def __init__(self) -> None:
        self.alpha: float | None = None
        self.zeros = 0
        self.mismatched = 0  # sketches of another alpha (left out)
        self.malformed = 0  # sketches with a bad count or zeros (left out)
        self._bins: dict[Any, int] = {}

    def add(self, d: Any) -> None:
        if not isinstance(d, dict):
            return
        alpha = d.get("alpha")
        packed = "counts" in d  # a window line's packed form (docs/events.md)
        holder: Any = d if packed else d.get("bins")  # the mapping that holds the counts
        if not isinstance(alpha, float | int) or not isinstance(holder, dict):
            return
        if self.alpha is None:
            self.alpha = float(alpha)
        elif alpha != self.alpha:
            self.mismatched += 1
            return
        zeros = d.get("zeros", 0)
        if type(zeros) is not int or zeros < 0 or not _counts_ok(holder, packed):
            self.malformed += 1
            return
        self.zeros += zeros
        acc = self._bins
        get = acc.get
        if packed:  # under their integer keys
            for key, c in enumerate(d["counts"], d["offset"]):
                if c:
                    acc[key] = get(key, 0) + c
            return
        for k, c in holder.items():
            acc[k] = get(k, 0) + c

    @property
    def bins(self) -> dict[int, int]:
        """The merged bins by integer key (keys that are not integers are left out)."""
        out: dict[int, int] = {}
        for k, c in self._bins.items():
            try:
                key = int(k)
            except (TypeError, ValueError):
                continue
            if c > 0:
                out[key] = out.get(key, 0) + c
        return out

    def as_dict(self) -> dict[str, Any] | None:
        """The merged sketch in the contract's form (None when nothing was added)."""
        if self.alpha is None:
            return None
        return {
            "alpha": self.alpha,
            "bins": {str(k): c for k, c in sorted(self.bins.items())},
            "zeros": self.zeros,
        }

    @property
    def count(self) -> int:
        """Samples in the merged sketch."""
        return sum(self.bins.values()) + self.zeros

    def quantile(self, q: float) -> float | None:
        """The merged sketch's q-quantile, as a window's p99 is taken (None: empty or invalid)."""
        from headroom.kernel.codec import ValidationError

        d = self.as_dict()
        if d is None:
            return None
        try:
            return sketch_quantile(d, q)
        except (ValidationError, ValueError):
            return None

    def sketch(self) -> Any:
        """The merged ``LatencySketch`` (None when nothing was added)."""
        from headroom.kernel.sketch import LatencySketch

        d = self.as_dict()
        return None if d is None else LatencySketch.from_dict(d)


@dataclass(slots=True)
class _OpenWindow:
    t_start: float
    t_end: float
    # The sketch dicts of the lines seen so far (usually one: merged only when judged).
    sketches: list[Mapping[str, Any]]


@dataclass(slots=True)
class WindowSeries:
    """Judged windows of one (policy, region), in judging order: start, end and p99 (ms)."""

    t_start: array[float] = field(default_factory=lambda: array("d"))
    t_end: array[float] = field(default_factory=lambda: array("d"))
    p99_ms: array[float] = field(default_factory=lambda: array("d"))


@dataclass(slots=True)
class _RegionWindows:
    lateness_s: float | None
    open: dict[float, _OpenWindow] = field(default_factory=dict)
    judged: WindowSeries = field(default_factory=WindowSeries)
    judged_upto: float = -math.inf  # end of the newest judged window
    next_flush_at: float = math.inf  # event time at which the oldest open window can be judged
    late_lines: int = 0
    bad_sketches: int = (
        0  # sketches that break docs/messages.md (their window is judged without them)
    )
    problems: list[str] = field(default_factory=list)

    def add(self, t_start: float, t_end: float, sketch: Any, default_lateness: float) -> None:
        lateness = self.lateness_s if self.lateness_s is not None else default_lateness
        if t_start >= self.next_flush_at:
            self._flush(t_start, lateness)
        key = round(t_start, 6)
        window = self.open.get(key)
        if window is None:
            if t_start < self.judged_upto:  # its neighbours were judged already: too late
                self.late_lines += 1
                return
            window = _OpenWindow(t_start, t_end, [])
            self.open[key] = window
            self.next_flush_at = min(self.next_flush_at, t_end + lateness)
        if sketch is not None:
            window.sketches.append(sketch)

    def _flush(self, now: float, lateness: float) -> None:
        due = [k for k, w in self.open.items() if w.t_end + lateness <= now]
        due.sort(key=lambda k: self.open[k].t_start)
        for key in due:
            self._judge(self.open.pop(key))
        self.next_flush_at = min((w.t_end + lateness for w in self.open.values()), default=math.inf)

    def finish(self) -> None:
        self._flush(math.inf, 0.0)

    def _judge(self, window: _OpenWindow) -> None:
        from headroom.kernel.codec import ValidationError

        self.judged_upto = max(self.judged_upto, window.t_end)
        p99: float | None = None
        try:
            if len(window.sketches) == 1:
                p99 = sketch_quantile(window.sketches[0], 0.99)
            elif window.sketches:
                merged = None
                for d in window.sketches:
                    try:
                        sk = _validated(d)
                        if merged is None:
                            merged = sk
                        else:
                            merged.merge(sk)
                    except (ValidationError, ValueError) as exc:
                        self._bad(window, str(exc))
                p99 = merged.quantile(0.99) if merged is not None else None
        except (ValidationError, ValueError) as exc:
            self._bad(window, str(exc))
        if p99 is None:  # no requests with a latency: the window does not count
            return
        self.judged.t_start.append(window.t_start)
        self.judged.t_end.append(window.t_end)
        self.judged.p99_ms.append(float(p99))

    def _bad(self, window: _OpenWindow, reason: str) -> None:
        self.bad_sketches += 1
        if len(self.problems) < 5:
            self.problems.append(f"window t_start={window.t_start:g}: {reason}")


# ---------------------------------------------------------------------------------------------
# Completeness: which spans of the run the window lines cover
# ---------------------------------------------------------------------------------------------


@dataclass(slots=True)
class Coverage:
    """The union of the ``[t_start, t_end]`` spans of a region's window lines: sorted, disjoint
    intervals, merged as lines arrive (lines in time order just extend the last interval; a line
    out of order is placed by bisection). Spans closer than ``eps`` are joined."""

    eps: float = 1e-6
    starts: list[float] = field(default_factory=list)
    ends: list[float] = field(default_factory=list)

    def add(self, a: float, b: float) -> None:
        if not b > a:
            return
        starts, ends, eps = self.starts, self.ends, self.eps
        if not starts or a > ends[-1] + eps:  # after everything so far
            starts.append(a)
            ends.append(b)
            return
        if a >= starts[-1]:  # overlaps or touches the last interval (the usual case)
            ends[-1] = max(ends[-1], b)
            return
        lo = bisect.bisect_left(ends, a - eps)  # first interval ending at or after a
        hi = bisect.bisect_right(starts, b + eps)  # intervals from lo up to hi touch [a, b]
        if lo < hi:
            a = min(a, starts[lo])
            b = max(b, ends[hi - 1])
        starts[lo:hi] = [a]
        ends[lo:hi] = [b]

    def within(self, lo: float, hi: float) -> list[tuple[float, float]]:
        """The covered intervals clipped to ``[lo, hi]``."""
        out = []
        for a, b in zip(self.starts, self.ends, strict=True):
            a, b = max(a, lo), min(b, hi)
            if b > a:
                out.append((a, b))
        return out


def _intersect(
    x: Sequence[tuple[float, float]], y: Sequence[tuple[float, float]]
) -> list[tuple[float, float]]:
    """The intersection of two sorted lists of disjoint intervals."""
    out = []
    i = j = 0
    while i < len(x) and j < len(y):
        a, b = max(x[i][0], y[j][0]), min(x[i][1], y[j][1])
        if b > a:
            out.append((a, b))
        if x[i][1] < y[j][1]:
            i += 1
        else:
            j += 1
    return out


def _length(intervals: Iterable[tuple[float, float]]) -> float:
    return sum(b - a for a, b in intervals)


# ---------------------------------------------------------------------------------------------
# Per-policy accumulation
# ---------------------------------------------------------------------------------------------


def _num(value: Any) -> float:
    """A number from a log field; missing, null, non-numeric or non-finite counts as 0."""
    t = type(value)
    if t is float:
        return value if value - value == 0.0 else 0.0  # NaN and ±inf fail x - x == 0
    if t is int:
        return float(value)
    return 0.0


def _count(value: Any) -> int:
    """A count from a log field; anything but a non-negative integer counts as 0."""
    if type(value) is int and value >= 0:
        return value
    if type(value) is float and value >= 0 and value - value == 0.0:
        return int(value)
    return 0


@dataclass(slots=True)
class _SegmentSums:
    requests: int = 0
    sbm: int = 0
    inc: float = 0.0


@dataclass(slots=True)
class _PolicyState:
    name: str
    lateness_s: float | None
    run: dict[str, Any] | None = None
    regions: dict[str, _RegionWindows] = field(default_factory=dict)
    window_lines: int = 0
    requests: int = 0
    errors: int = 0
    timeouts: int = 0
    value_total: float = 0.0
    value_baseline: float = 0.0
    inc: dict[str, float] = field(default_factory=lambda: dict.fromkeys(LEVERS, 0.0))
    value_lost: float = 0.0
    arms: dict[str, dict[str, ArmSums]] = field(default_factory=dict)
    # the estimator's sums per (segment, value bin) stratum and arm (where the lines carry them,
    # the estimator's input; else the per-segment arms)
    strata: dict[str, dict[str, Moments]] = field(default_factory=dict)
    offered: dict[str, float] = field(default_factory=lambda: dict.fromkeys(RESOURCES, 0.0))
    used: dict[str, float] = field(default_factory=lambda: dict.fromkeys(RESOURCES, 0.0))
    segments: dict[str, _SegmentSums] = field(default_factory=dict)
    oracle: dict[str | None, dict[str, Any]] = field(default_factory=dict)
    reclaims: int = 0
    release_ms: array[float] = field(default_factory=lambda: array("d"))
    shedding: Counter[str] = field(default_factory=Counter)
    shedding_by_lever: Counter[str] = field(default_factory=Counter)
    targets_issued: int = 0
    targets_expired: int = 0
    targets_fallback: int = 0  # targets issued with a non-null ``fallback``
    fallbacks: Counter[str] = field(default_factory=Counter)
    cap_bounds: Counter[str] = field(default_factory=Counter)
    precompute: dict[str, float] | None = None
    staleness: array[float] = field(default_factory=lambda: array("d"))
    t_min: float = math.inf
    t_max: float = -math.inf
    # completeness and run-wide latency
    run_finished: bool = False
    coverage: dict[str, Coverage] = field(default_factory=dict)
    latency_all: SketchSum = field(default_factory=SketchSum)
    latency_base: SketchSum = field(default_factory=SketchSum)
    faults: FaultBook = field(default_factory=FaultBook)

    def region(self, name: str) -> _RegionWindows:
        r = self.regions.get(name)
        if r is None:
            r = self.regions[name] = _RegionWindows(self.lateness_s)
        return r


_PRECOMPUTE_SUMS = ("jobs", "used", "expired_unused", "visits", "hits", "wasted_partial")


class MetricsAccumulator:
    """Feed events one at a time with :meth:`add`; :meth:`result` gives the metrics document.

    ``lateness_s`` overrides how long a window waits for late lines before it is judged (default:
    ``max(60 s, 6 windows)``).
    """

    def __init__(self, *, lateness_s: float | None = None) -> None:
        self._lateness_s = lateness_s
        self._policies: dict[str, _PolicyState] = {}
        self._run_default: dict[str, Any] | None = None  # run.started with a null policy
        self._oracle_default: dict[str | None, dict[str, Any]] = {}
        self._finished_default = False  # run.finished with a null policy
        self._scenario: str | None = None
        self._seed: int | None = None
        self.unknown_kinds: Counter[str] = Counter()
        self.events = 0

    # -- input ----------------------------------------------------------------------------------

    def _policy(self, name: str) -> _PolicyState:
        state = self._policies.get(name)
        if state is None:
            state = self._policies[name] = _PolicyState(name, self._lateness_s)
        return state

    def add(self, event: Mapping[str, Any]) -> None:
        self.events += 1
        kind = event.get("kind")
        policy = event.get("policy")
        if kind == "window":
            if isinstance(policy, str):
                self._window(self._policy(policy), event)
            return
        if kind == "run.started":
            self._run_started(policy, event)
            return
        if kind == "oracle.bound":
            self._oracle_bound(policy, event)
            return
        if kind == "run.finished":
            self._run_finished(policy)
            return
        if isinstance(policy, str):
            self._policy_event(self._policy(policy), kind, event)
        elif kind not in _KNOWN:
            self.unknown_kinds[str(kind)] += 1

    def _run_finished(self, policy: Any) -> None:
        """A policy's run ended (a null policy: every policy's run, like ``run.started``)."""
        if isinstance(policy, str):
            self._policy(policy).run_finished = True
        else:
            self._finished_default = True

    def _oracle_bound(self, policy: Any, event: Mapping[str, Any]) -> None:
        target = self._policy(policy).oracle if isinstance(policy, str) else self._oracle_default
        region = event.get("region")
        target[region if isinstance(region, str) else None] = dict(event)

    def _policy_event(self, state: _PolicyState, kind: Any, event: Mapping[str, Any]) -> None:
        """A counted line of one policy: reclaims, releases, shedding, targets, fallbacks."""
        if kind == "capacity.reclaimed":
            state.reclaims += 1
        elif kind == "optional.released":
            release = event.get("release_ms")
            if isinstance(release, int | float) and math.isfinite(release):
                state.release_ms.append(float(release))
        elif kind == "shedding.started":
            side = event.get("side")
            state.shedding[side if side in ("server", "client") else "other"] += 1
            state.shedding_by_lever[str(event.get("lever"))] += 1
        elif kind == "target.issued":
            state.targets_issued += 1
            if event.get("fallback"):
                state.targets_fallback += 1
        elif kind == "target.expired":
            state.targets_expired += 1
        elif kind == "allocator.fallback":
            state.fallbacks[str(event.get("reason"))] += 1
        elif kind == "allocator.cap_bound":
            state.cap_bounds[str(event.get("lever"))] += 1
        elif kind in FAULT_KINDS:
            state.faults.add(kind, event)
        elif kind not in _KNOWN:
            self.unknown_kinds[str(kind)] += 1

    def _run_started(self, policy: Any, event: Mapping[str, Any]) -> None:
        if self._scenario is None and isinstance(event.get("scenario"), str):
            self._scenario = event["scenario"]
        seed = event.get("seed")
        if self._seed is None and isinstance(seed, int) and not isinstance(seed, bool):
            self._seed = seed
        if isinstance(policy, str):
            self._policy(policy).run = dict(event)
        else:
            self._run_default = dict(event)

    def _window(self, state: _PolicyState, e: Mapping[str, Any]) -> None:
        state.window_lines += 1
        t_start = _num(e.get("t_start"))
        t_end = _num(e.get("t_end"))
        state.t_min = min(state.t_min, t_start)
        state.t_max = max(state.t_max, t_end)
        region = e.get("region")
        run = state.run or self._run_default
        window_s = _num((run or {}).get("slo", {}).get("window_s")) or (t_end - t_start)
        state.region(str(region)).add(
            t_start, t_end, e.get("sketch"), max(MIN_LATENESS_S, LATENESS_WINDOWS * window_s)
        )
        self._window_coverage(state, str(region), t_start, t_end, e)
        state.requests += _count(e.get("requests"))
        state.errors += _count(e.get("errors"))
        state.timeouts += _count(e.get("timeouts"))
        state.value_total += _num(e.get("value_total"))
        state.value_baseline += _num(e.get("value_baseline"))
        inc = e.get("inc")
        if isinstance(inc, dict):
            for lever, v in inc.items():
                state.inc[lever] = state.inc.get(lever, 0.0) + _num(v)
        state.value_lost += _num(e.get("value_lost"))
        arms = e.get("arms")
        if isinstance(arms, dict):
            self._window_arms(state, arms)
        strata = e.get("strata")
        if isinstance(strata, dict) and strata:
            self._window_strata(state, strata)
        for key, target in (("offered_unit_s", state.offered), ("used_unit_s", state.used)):
            d = e.get(key)
            if isinstance(d, dict):
                for resource, v in d.items():
                    target[resource] = target.get(resource, 0.0) + _num(v)
        segments = e.get("segments")
        if isinstance(segments, dict):
            self._window_segments(state, segments)
        pre = e.get("precompute")
        if isinstance(pre, dict):
            self._window_precompute(state, pre)
        state.faults.window(e)

    @staticmethod
    def _window_coverage(
        state: _PolicyState, region: str, t_start: float, t_end: float, e: Mapping[str, Any]
    ) -> None:
        """The span a window line covers (completeness) and its sketches (run-wide latency)."""
        cov = state.coverage.get(region)
        if cov is None:
            cov = state.coverage[region] = Coverage()
        cov.add(t_start, t_end)
        sketch = e.get("sketch")
        if sketch is not None:
            state.latency_all.add(sketch)
        base = base_sketch(e)
        if base is not None:
            state.latency_base.add(base)

    @staticmethod
    def _window_arms(state: _PolicyState, arms: Mapping[str, Any]) -> None:
        """A window's holdout sums, per segment and arm."""
        for segment, by_arm in arms.items():
            if not isinstance(by_arm, dict):
                continue
            seg = state.arms.setdefault(segment, {})
            for arm, sums in by_arm.items():
                if isinstance(sums, dict):
                    a = seg.get(arm)
                    if a is None:
                        a = seg[arm] = ArmSums()
                    a.add(sums)

    @staticmethod
    def _window_strata(state: _PolicyState, strata: Mapping[str, Any]) -> None:
        """A window's estimator sums, per (segment, value bin) stratum and arm."""
        for key, by_arm in strata.items():
            if not isinstance(by_arm, dict):
                continue
            st = state.strata.setdefault(str(key), {})
            for arm, d in by_arm.items():
                if isinstance(d, dict):
                    m = st.get(arm)
                    if m is None:
                        m = st[arm] = Moments()
                    m.add(
                        Moments(
                            float(_count(d.get("n"))),
                            _num(d.get("value_sum")),
                            _num(d.get("value_sq_sum")),
                            _num(d.get("signal_sum")),
                            _num(d.get("signal_sq_sum")),
                            _num(d.get("signal_value_sum")),
                            float(_count(d.get("failed"))),
                            _num(d.get("failed_signal_sum")),
                            _num(d.get("failed_signal_sq_sum")),
                        )
                    )

    @staticmethod
    def _window_segments(state: _PolicyState, segments: Mapping[str, Any]) -> None:
        """A window's requests, strong-model requests and value gained, per segment."""
        for name, d in segments.items():
            if not isinstance(d, dict):
                continue
            s = state.segments.get(name)
            if s is None:
                s = state.segments[name] = _SegmentSums()
            s.requests += _count(d.get("requests"))
            s.sbm += _count(d.get("sbm"))
            s.inc += _num(d.get("inc"))

    @staticmethod
    def _window_precompute(state: _PolicyState, pre: Mapping[str, Any]) -> None:
        """A window's precompute sums and staleness samples."""
        if state.precompute is None:
            state.precompute = dict.fromkeys(_PRECOMPUTE_SUMS, 0.0)
        for key in _PRECOMPUTE_SUMS:
            state.precompute[key] += _num(pre.get(key))
        samples = pre.get("staleness_s")
        if isinstance(samples, list):
            state.staleness.extend(
                float(x) for x in samples if isinstance(x, int | float) and math.isfinite(x)
            )

    # -- output ---------------------------------------------------------------------------------

    def policy_names(self) -> list[str]:
        return list(self._policies)

    def window_series(self, policy: str, region: str) -> WindowSeries:
        """Judged windows so far (all of them after :meth:`result`)."""
        return self._policies[policy].regions[region].judged

    def latency_sums(self, policy: str) -> tuple[SketchSum, SketchSum]:
        """A policy's run-wide merged sketches: of all requests, of the baseline-only ones."""
        state = self._policies[policy]
        return state.latency_all, state.latency_base

    def regions(self, policy: str) -> list[str]:
        return list(self._policies[policy].regions)

    def flush(self) -> None:
        """Judge every window still open (the end of the log): the series are then complete."""
        for state in self._policies.values():
            for region in state.regions.values():
                region.finish()

    def result(self, stats: LogStats | None = None) -> dict[str, Any]:
        """The metrics document (judges every window still open: call at the end of the log).

        ``stats``: what reading the log found (:attr:`EventLog.stats`), for the corrupt lines
        per policy (a policy with corrupt lines is not complete) and their total."""
        if not self._policies:
            if self.events == 0:
                raise AnalysisError("the event log holds no events")
            raise AnalysisError("the event log names no policy (no line has a 'policy' field)")
        corrupt_by_policy = stats.corrupt_by_policy if stats is not None else Counter[str]()
        policies: dict[str, Any] = {}
        for name, state in self._policies.items():
            policies[name] = self._policy_metrics(state)
            self._run_figures(state, policies[name], corrupt_by_policy.get(name, 0))
        doc: dict[str, Any] = {"scenario": self._scenario, "seed": self._seed, "policies": policies}
        doc["log"] = {
            "corrupt_lines": stats.corrupt if stats is not None else 0,
            "corrupt_by_policy": dict(sorted(corrupt_by_policy.items())),
            "corrupt_unattributed": stats.corrupt_unattributed if stats is not None else 0,
        }
        return doc

    # -- completeness, run-wide latency, captured share, null captures ------------------------

    def _run_figures(self, state: _PolicyState, out: dict[str, Any], corrupt: int) -> None:
        """Complete the policy's entry: ``complete`` and ``completeness`` (``duration_s`` the
        covered span when incomplete), ``latency``, ``capacity.captured_share``, and the capture
        ratios by :func:`capture_ratio`'s rule (null for an incomplete policy: its bound is over
        the whole run, its value over the covered span only)."""
        run = state.run or self._run_default or {}
        completeness = self._completeness(state, run, corrupt)
        complete = not completeness["problems"]
        out["complete"] = complete
        out["completeness"] = completeness
        if not complete:
            out["duration_s"] = completeness["covered_s"]
        value = out["value"]
        baseline = _num(value.get("baseline"))
        incremental = _num(value.get("incremental"))
        for ratio, bound in (
            ("capture_ratio", "oracle_incremental"),
            ("capture_feasible", "feasible_bound"),
        ):
            if bound in value:
                b = value[bound]
                value[ratio] = (
                    capture_ratio(incremental, _num(b), baseline)
                    if complete and isinstance(b, int | float)
                    else None
                )
        out["latency"] = {
            "all_p99_ms": state.latency_all.quantile(0.99),
            "baseline_only_p99_ms": state.latency_base.quantile(0.99),
            "all_count": state.latency_all.count,
            "baseline_only_count": state.latency_base.count,
        }
        offered = out["capacity"]["offered_unit_s"]
        used = out["capacity"]["used_unit_s"]
        out["capacity"]["captured_share"] = {
            r: (_num(used.get(r)) / o if (o := _num(offered.get(r))) > 0 else None) for r in offered
        }

    def _completeness(
        self, state: _PolicyState, run: Mapping[str, Any], corrupt: int
    ) -> dict[str, Any]:
        """Whether the policy's run finished and its windows cover the run in every region."""
        planned = run.get("duration_s")
        if isinstance(planned, int | float) and not isinstance(planned, bool):
            lo, hi = 0.0, float(planned)
        elif state.coverage:  # no planned duration: only gaps within the span seen count
            lo, hi = state.t_min, state.t_max
        else:
            lo = hi = 0.0
        slo = run.get("slo")
        window_s = _num(slo.get("window_s")) if isinstance(slo, Mapping) else 0.0
        listed = [r for r in run.get("regions") or [] if isinstance(r, str)]
        regions = listed or list(state.coverage)
        span = max(0.0, hi - lo)
        tolerance = 1e-6 * max(1.0, window_s)
        covered: list[tuple[float, float]] | None = None
        missing: dict[str, int] = {}
        for region in regions:
            cov = state.coverage.get(region)
            mine = cov.within(lo, hi) if cov is not None else []
            gap = span - _length(mine)
            if gap > tolerance:
                missing[region] = math.ceil(gap / window_s - 1e-6) if window_s > 0 else 1
            covered = mine if covered is None else _intersect(covered, mine)
        covered_s = _length(covered or []) if regions else 0.0
        finished = state.run_finished or self._finished_default
        problems = []
        if not finished:
            problems.append("no run.finished line")
        if missing or not regions:
            where = ", ".join(f"{r} {n}" for r, n in missing.items())
            problems.append(
                f"windows cover {covered_s:g} of {span:g} s"
                + (f" ({sum(missing.values())} window(s) missing: {where})" if missing else "")
            )
        if corrupt:
            problems.append(f"{corrupt} corrupt line(s)")
        return {
            "run_finished": finished,
            "planned_s": span,
            "covered_s": covered_s if problems else span,
            "missing_windows": sum(missing.values()),
            "corrupt_lines": corrupt,
            "problems": problems,
        }

    def _policy_metrics(self, state: _PolicyState) -> dict[str, Any]:
        run = state.run or self._run_default
        if run is None:
            raise AnalysisError(
                f"policy {state.name!r}: the event log has no run.started line for it, so its "
                "SLO is unknown"
            )
        slo_field = run.get("slo")
        slo: Mapping[str, Any] = slo_field if isinstance(slo_field, Mapping) else {}
        p99_limit = slo.get("p99_ms")
        if not isinstance(p99_limit, int | float) or isinstance(p99_limit, bool):
            raise AnalysisError(f"run.started.slo.p99_ms: missing for policy {state.name!r}")
        window_s = slo.get("window_s")

        judged = violations = 0
        worst = 0.0
        late = bad = 0
        by_region: dict[str, Any] = {}
        for region_name, region in state.regions.items():
            region.finish()
            p99s = region.judged.p99_ms
            r_viol = sum(1 for p in p99s if p > p99_limit)
            r_worst = max(p99s, default=0.0)
            by_region[region_name] = {
                "windows": len(p99s),
                "violation_fraction": r_viol / len(p99s) if p99s else 0.0,
                "worst_window_p99_ms": r_worst,
                "late_window_lines": region.late_lines,
                "bad_sketches": region.bad_sketches,
            }
            judged += len(p99s)
            violations += r_viol
            worst = max(worst, r_worst)
            late += region.late_lines
            bad += region.bad_sketches

        incremental = state.value_total - state.value_baseline
        oracle_total, oracle_by_lever = self._oracle(state)
        feasible_total = self._feasible(state)
        estimate, by_lever = self._estimates(state)
        ci_low, ci_high = estimate.ci95

        duration = run.get("duration_s")
        if not isinstance(duration, int | float) or isinstance(duration, bool):
            duration = max(0.0, state.t_max - state.t_min) if state.window_lines else 0.0

        segment_names = [s for s in run.get("segments") or [] if isinstance(s, str)]
        for s in state.segments:
            if s not in segment_names:
                segment_names.append(s)
        segments: dict[str, Any] = {}
        for s in segment_names:
            sums = state.segments.get(s, _SegmentSums())
            segments[s] = {
                "requests": sums.requests,
                "sbm_share": sums.sbm / sums.requests if sums.requests else 0.0,
                "incremental": sums.inc,
            }

        releases = sorted(state.release_ms)
        out: dict[str, Any] = {
            "policy": state.name,
            "complete": True,  # settled by _run_figures
            "duration_s": duration,
            "slo": {
                "p99_ms": p99_limit,
                "window_s": window_s,
                "violation_fraction": violations / judged if judged else 0.0,
                "worst_window_p99_ms": worst,
                "windows": judged,
                "late_window_lines": late,
                "bad_sketches": bad,
                "by_region": by_region,
            },
            "requests": {
                "total": state.requests,
                "errors": state.errors,
                "timeouts": state.timeouts,
            },
            "value": {
                "total": state.value_total,
                "baseline": state.value_baseline,
                "incremental": incremental,
                "incremental_rma": state.inc.get("rma", 0.0),
                "incremental_sbm": state.inc.get("sbm", 0.0),
                "incremental_precompute": state.inc.get("precompute", 0.0),
                "incremental_lost": state.value_lost,
                "oracle_incremental": oracle_total,
                "oracle_by_lever": oracle_by_lever,
                "capture_ratio": capture_ratio(incremental, oracle_total, state.value_baseline),
                # null where no bound line carries it (a log written before the feasible bound)
                "feasible_bound": feasible_total,
                "estimated_incremental": estimate.value,
                "estimated_ci95": [ci_low, ci_high],
                "estimate_unusable_segments": list(estimate.unusable_segments),
                "estimated_by_lever": by_lever,
            },
            "capacity": {
                "offered_unit_s": {r: state.offered.get(r, 0.0) for r in _keys(state.offered)},
                "used_unit_s": {r: state.used.get(r, 0.0) for r in _keys(state.used)},
            },
            "reclaims": {
                "count": state.reclaims,
                "releases": len(releases),
                "release_ms_p50": nearest_rank(releases, 0.50),
                "release_ms_p99": nearest_rank(releases, 0.99),
                "release_ms_max": releases[-1] if releases else 0.0,
            },
            "shedding": {
                "server_activations": state.shedding.get("server", 0),
                "client_activations": state.shedding.get("client", 0),
                "by_lever": dict(sorted(state.shedding_by_lever.items())),
            },
            "allocator": {
                "targets_issued": state.targets_issued,
                "targets_expired": state.targets_expired,
                "targets_fallback": state.targets_fallback,
                "fallbacks": dict(sorted(state.fallbacks.items())),
                "cap_bounds": dict(sorted(state.cap_bounds.items())),
            },
            "segments": segments,
        }
        if state.precompute is not None or run.get("precompute_enabled") is True:
            pre = state.precompute or dict.fromkeys(_PRECOMPUTE_SUMS, 0.0)
            visits = pre["visits"]
            out["precompute"] = {
                "jobs": int(pre["jobs"]),
                "used": int(pre["used"]),
                "expired_unused": int(pre["expired_unused"]),
                "hit_rate": pre["hits"] / visits if visits else 0.0,
                "staleness_s_p50": nearest_rank(sorted(state.staleness), 0.5),
                "visits": int(visits),
                "hits": int(pre["hits"]),
                "wasted_partial": int(pre["wasted_partial"]),
            }
        state.faults.apply(out)
        return out

    @staticmethod
    def _estimates(state: _PolicyState) -> tuple[HoldoutEstimate, dict[str, Any]]:
        """The holdout estimate of the incremental value, and per lever that has treated
        requests (``{estimate, ci95}``), from one estimator: on the ``strata`` sums where the
        lines carry them (the simulator adds them up over several windows), else on the
        per-segment ``arms``."""
        use_strata = bool(state.strata)
        names = (
            {n for by in state.strata.values() for n in by}
            if use_strata
            else {n for by in state.arms.values() for n in by}
        )

        def one(levers: Sequence[str] | None) -> HoldoutEstimate:
            if use_strata:
                return stratified_estimate(state.strata, levers)
            return holdout_estimate(state.arms, levers)

        by_lever: dict[str, Any] = {}
        for lever in LEVERS:
            if any(_arm_has(n, [lever]) for n in names if n != CONTROL_ARM):
                est = one([lever])
                low, high = est.ci95
                by_lever[lever] = {"estimate": est.value, "ci95": [low, high]}
        return one(None), by_lever

    def _oracle(self, state: _PolicyState) -> tuple[float, dict[str, float]]:
        bounds = state.oracle or self._oracle_default
        if not bounds:
            return 0.0, dict.fromkeys(LEVERS, 0.0)
        # A run-wide line (region null) is the total; otherwise per-region lines add up.
        chosen = [bounds[None]] if None in bounds else list(bounds.values())
        total = sum(_num(b.get("oracle_incremental")) for b in chosen)
        by_lever = dict.fromkeys(LEVERS, 0.0)
        for b in chosen:
            levers = b.get("by_lever")
            if isinstance(levers, Mapping):
                for lever, v in levers.items():
                    by_lever[lever] = by_lever.get(lever, 0.0) + _num(v)
        return total, by_lever

    def _feasible(self, state: _PolicyState) -> float | None:
        """The feasible bound from the ``oracle.bound`` lines (``feasible_bound``: the same
        choice of lines as :meth:`_oracle`), None where none carries it."""
        bounds = state.oracle or self._oracle_default
        chosen = [bounds[None]] if None in bounds else list(bounds.values())
        got = [b.get("feasible_bound") for b in chosen]
        nums = [_num(v) for v in got if isinstance(v, int | float) and not isinstance(v, bool)]
        return float(sum(nums)) if nums and len(nums) == len(got) else None


# A bound at or below this share of the baseline value (or below the absolute floor) is too
# small to divide by: the capture ratio is then null (docs/analysis.md, ``capture_ratio``).
CAPTURE_MIN_BOUND_SHARE = 1e-6
CAPTURE_MIN_BOUND_ABS = 1e-9


def capture_ratio(incremental: float, bound: float, baseline: float) -> float | None:
    """``incremental / bound``, or None where the bound is too small to divide by: ``bound ≤
    max(1e-6 · |baseline|, 1e-9)`` (relative to the baseline value, so the rule does not depend
    on the unit of value; a bound a millionth of the value delivered anyway is nothing to capture,
    and a ratio over it is noise)."""
    if not bound > max(CAPTURE_MIN_BOUND_SHARE * abs(baseline), CAPTURE_MIN_BOUND_ABS):
        return None
    return incremental / bound


def _keys(d: Mapping[str, float]) -> list[str]:
    return list(RESOURCES) + [k for k in d if k not in RESOURCES]


def incomplete_policies(metrics: Mapping[str, Any]) -> dict[str, list[str]]:
    """The policies of a metrics document that are not complete, with what they lack (policies
    only corrupt lines name, which have no entry, are included)."""
    out: dict[str, list[str]] = {}
    policies = metrics.get("policies") or {}
    for name, m in policies.items():
        if isinstance(m, Mapping) and m.get("complete") is False:
            problems = (m.get("completeness") or {}).get("problems") or ["incomplete"]
            out[name] = [str(p) for p in problems]
    log = metrics.get("log") or {}
    for name, n in (log.get("corrupt_by_policy") or {}).items():
        if name not in policies:
            out[name] = [f"{n} corrupt line(s) and no readable line"]
    return out


def compute_metrics(events: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """The metrics document (docs/analysis.md) of an event log, in one pass."""
    acc = MetricsAccumulator()
    for event in events:
        acc.add(event)
    return acc.result(events.stats if isinstance(events, EventLog) else None)


def write_metrics(metrics: dict[str, Any], path: Path) -> Path:
    """Write a metrics document as indented JSON (the file docs/analysis.md names)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        path.write_bytes(orjson.dumps(metrics, option=orjson.OPT_INDENT_2) + b"\n")
    except OSError as exc:
        raise HeadroomError(f"cannot write {path}: {exc.strerror}") from exc
    return path
