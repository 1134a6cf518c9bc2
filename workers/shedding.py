"""Millisecond-scale local defences: server-side and client-side shedding of optional work.

Pure code: no asyncio, no Kafka, no wall clock, no global random state. Time is passed in as
``now`` (seconds, event time or virtual time), so the simulator and the ranking-server worker
drive the same objects. Every object snapshots to plain JSON-able data and restores exactly.

Vocabulary
==========
*Baseline work* is the base candidate count on the base model: a fixed promise, never touched
here. *Optional work* is what the levers add to a request: RMA extra candidates (divisible, one
candidate at a time) and SBM routing to the strong model (indivisible: the request is either
scored by the strong model or downgraded to the base model). Costs are milliseconds of work per
resource (``cpu``, ``accelerator``), e.g. ``extra × cpu_ms_per_candidate``.

Server side: :class:`ServerShedder`
===================================
One decision per request, an enum (:class:`Decision`, after Envoy's ``RequestForwardingAction``):
``ADMIT`` (all optional work as asked), ``TRIM`` (extra candidates trimmed to ``n``),
``DOWNGRADE`` (strong model → base model; extras kept, possibly trimmed), ``SHED`` (all optional
work dropped). A request without optional work is always ``ADMIT``: baseline work is never shed
for optional work.

Three mechanisms decide, in this order:

1. **Hard stops.** A resource whose free slots are exhausted (``free ≤ reserve_slots``) or whose
   opportunistic level is zero takes no optional work at all.
2. **Value threshold, lowest value per unit of compute first.** Every optional request's value
   per unit of compute, ``vpc = value / (w_cpu·cpu_ms + w_acc·accelerator_ms)``, goes into a
   decaying, cost-weighted log-histogram (:class:`DecayedLogHistogram`). The threshold θ is its
   τ-quantile: the cheapest-to-lose τ share of recent optional *work* lies below θ and is shed.
   τ = max(τ_overload, τ_budget):

   * τ_overload follows CoDel (Nichols & Jacobson, "Controlling Queue Delay", ACM Queue 2012):
     overload is declared when the queueing delay has stayed above ``target_queue_ms`` for a full
     ``interval_ms`` (defaults 5 ms and 100 ms, CoDel's published constants). While overloaded,
     τ rises by ``shed_step`` at CoDel's control law times ``interval / sqrt(count)``; once the
     delay falls below the target it decays linearly at ``recovery_per_s`` (hysteresis, so the
     threshold does not whipsaw).
   * τ_budget = max_r (1 − capacity_r / demand_r): the share of offered optional work that cannot
     fit the opportunistic level, from a time-decayed rate of offered optional cost per resource.
3. **Token bucket per resource.** The opportunistic level (units: cores or device equivalents =
   ms of work per ms) refills a bucket of depth ``level × burst_ms``. Admitted optional work spends
   it: the strong part first (all or nothing → ``DOWNGRADE``), then as many extra candidates as
   the remaining tokens pay for (``TRIM``). This is the hard guarantee that optional work stays
   within the announced capacity; the threshold in (2) makes the bucket value-aware.

A capacity drop acts at once: :meth:`ServerShedder.on_capacity` clamps the buckets to the new
depth, so the very next decision sees it, and :meth:`ServerShedder.trim_inflight` says which work
already running to cut (lowest value per unit of occupied capacity first) so the remainder fits
the new level. No timer is involved anywhere.

:meth:`ServerShedder.decide_batch` takes numpy arrays for requests that arrive in the same step
(the simulator cannot afford a Python call per request): it orders them by ``vpc`` and fills the
buckets greedily, so within a batch optional work is shed strictly lowest ``vpc`` first.

Client side: :class:`ClientShedder`
===================================
An optional-work multiplier ``m ∈ [0, 1]`` per server, from the health carried in every response
(overload flag, queueing delay). AIMD after Chiu & Jain (1989) and TCP congestion avoidance:
multiplicative decrease ``m ← m·β`` on an overloaded response (β = 0.5, TCP's halving), at most once
per ``decrease_interval_ms`` so a burst of responses from one overload episode counts once (TCP
reduces once per round trip); additive recovery ``m ← m + recovery_per_s·Δt`` while responses are
healthy, so recovery is rate-limited in time rather than in responses. The multiplier is spent
lowest value first: a request keeps its optional work only if its value rank (its CDF among recent
requests, :class:`ValueRanker`) is ≥ 1 − m. :meth:`ClientShedder.on_response` returns a
:class:`ShedTransition` when shedding starts or stops so the caller can log ``shedding.started`` /
``shedding.stopped`` with how much optional work was dropped.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass
from enum import IntEnum, StrEnum
from typing import Any, NamedTuple

import numpy as np
import numpy.typing as npt

from headroom.errors import ConfigError

__all__ = [
    "BatchVerdict",
    "ClientShedConfig",
    "ClientShedder",
    "DecayedLogHistogram",
    "Decision",
    "InflightCut",
    "InflightWork",
    "OptionalCapacity",
    "OptionalWork",
    "OverloadTransition",
    "ServerShedConfig",
    "ServerShedStats",
    "ServerShedder",
    "ShedEvent",
    "ShedTransition",
    "ValueRanker",
    "Verdict",
]

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]
CodeArray = npt.NDArray[np.int8]

_INF = math.inf


# --------------------------------------------------------------------------------------------
# Decisions and events
# --------------------------------------------------------------------------------------------


class Decision(IntEnum):
    """What happens to one request's optional work (the codes of :meth:`decide_batch`)."""

    ADMIT = 0  # all optional work as asked (or the request had none)
    TRIM = 1  # extra candidates trimmed to Verdict.extra (> 0); strong model kept if asked
    DOWNGRADE = 2  # strong model → base model; extras kept, possibly trimmed to Verdict.extra
    SHED = 3  # every piece of optional work dropped: base candidates, base model


class ShedEvent(StrEnum):
    """Transitions worth an event-log line (docs/events.md)."""

    STARTED = "shedding.started"
    STOPPED = "shedding.stopped"
    OVERLOAD_ENTERED = "overload.entered"
    OVERLOAD_LEFT = "overload.left"


@dataclass(frozen=True, slots=True)
class ShedTransition:
    """Shedding started or stopped on one side; ``dropped`` = optional work dropped so far in the
    episode (server: requests with some optional work cut; client: requests that lost theirs)."""

    event: ShedEvent
    side: str  # "server" | "client"
    now: float
    dropped: int
    dropped_extra_candidates: int = 0
    dropped_strong: int = 0
    multiplier: float | None = None  # client side: the multiplier after the transition


@dataclass(frozen=True, slots=True)
class OverloadTransition:
    """The server entered or left its overloaded state (CoDel or exhausted slots)."""

    event: ShedEvent  # OVERLOAD_ENTERED | OVERLOAD_LEFT
    now: float
    queue_ms: float
    reason: str  # "queue_delay" | "slots_exhausted" | "recovered"


# --------------------------------------------------------------------------------------------
# Inputs and outputs
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class OptionalCapacity:
    """Opportunistic level optional work may use on this server: cores and device equivalents."""

    cpu: float
    accelerator: float

    def __post_init__(self) -> None:
        problems = [
            f"{name}: must be a finite number ≥ 0 (got {value!r})"
            for name, value in (("cpu", self.cpu), ("accelerator", self.accelerator))
            if not (math.isfinite(value) and value >= 0.0)
        ]
        if problems:
            raise ConfigError(problems)


@dataclass(frozen=True, slots=True)
class OptionalWork:
    """One request's optional work, as the server sees it on arrival.

    ``extra_*_ms`` are the total costs of all ``extra`` candidates (per-candidate cost × extra);
    ``strong_*_ms`` the *incremental* cost of the strong model over the base model (zero unless
    ``strong``). ``value`` is the request's value signal (non-negative).
    """

    value: float
    extra: int = 0
    extra_cpu_ms: float = 0.0
    extra_accelerator_ms: float = 0.0
    strong: bool = False
    strong_cpu_ms: float = 0.0
    strong_accelerator_ms: float = 0.0


class Verdict(NamedTuple):
    """A decision and what remains of the optional work: extras allowed, strong model kept."""

    decision: Decision
    extra: int
    strong: bool


class BatchVerdict(NamedTuple):
    """:meth:`ServerShedder.decide_batch` output: one entry per request."""

    codes: CodeArray  # Decision values as int8
    extra: IntArray  # extra candidates allowed
    strong: BoolArray  # strong model kept


@dataclass(frozen=True, slots=True)
class InflightWork:
    """Optional work already running on the server.

    ``cpu`` / ``accelerator`` are the opportunistic units its optional part occupies right now
    (e.g. 1 core while its extra candidates are scored on one worker thread; the simulator's
    fluid model uses cost rate). ``extra`` / ``strong`` say what the optional part is.
    """

    id: Hashable
    value: float
    cpu: float
    accelerator: float
    extra: int = 0
    strong: bool = False


@dataclass(frozen=True, slots=True)
class InflightCut:
    """Cut one in-flight request's optional part: ``SHED`` (stop scoring its extra candidates,
    and drop the strong model if it had it) or ``DOWNGRADE`` (strong-only: re-run on base)."""

    id: Hashable
    decision: Decision
    value: float


@dataclass(frozen=True, slots=True)
class ServerShedStats:
    """Counters since construction (they survive snapshot/restore)."""

    decisions: int
    admitted: int
    trimmed: int
    downgraded: int
    shed: int
    dropped_extra_candidates: int
    dropped_strong: int
    inflight_cut: int


# --------------------------------------------------------------------------------------------
# A decaying log-histogram: running quantiles and ranks in O(1) per sample
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class HistogramConfig:
    """Log-spaced bins over ``[10**log10_min, 10**log10_max]``; values outside are clamped into the
    end bins. ``half_life`` is in samples (or in weight units when weighted): older samples count
    half as much after that many more have arrived."""

    log10_min: float = -6.0
    log10_max: float = 6.0
    bins: int = 240  # 0.05 decade per bin: ≈12% resolution before in-bin interpolation
    half_life: float = 2000.0

    def validate(self, prefix: str) -> list[str]:
        problems = []
        if not (math.isfinite(self.log10_min) and math.isfinite(self.log10_max)):
            problems.append(f"{prefix}.log10_min/log10_max: must be finite")
        elif self.log10_max <= self.log10_min:
            problems.append(f"{prefix}.log10_max: must be > log10_min")
        if self.bins < 2:
            problems.append(f"{prefix}.bins: must be ≥ 2 (got {self.bins})")
        if not (math.isfinite(self.half_life) and self.half_life > 0):
            problems.append(f"{prefix}.half_life: must be > 0 (got {self.half_life})")
        return problems


class DecayedLogHistogram:
    """Exponentially decaying histogram of positive values on log-spaced bins.

    Decay is applied lazily by growing the weight of new samples by ``g = 2**(1/half_life)`` per
    unit of weight instead of shrinking every bin (the "forward decay" trick of Cormode et al.,
    ICDE 2009); bins are rescaled when the running weight grows too large, so an update is O(1).
    Quantile and CDF queries interpolate linearly in log space inside a bin.
    """

    _RESCALE_AT = 1e150

    def __init__(self, config: HistogramConfig | None = None) -> None:
        self.config = config or HistogramConfig()
        problems = self.config.validate("histogram")
        if problems:
            raise ConfigError(problems)
        c = self.config
        self._lo = c.log10_min
        self._span = c.log10_max - c.log10_min
        self._scale = c.bins / self._span
        self._ln_g = math.log(2.0) / c.half_life
        self.counts: FloatArray = np.zeros(c.bins, dtype=np.float64)
        self._w = 1.0  # weight of a unit sample added now (grows instead of decaying the past)
        self.total = 0.0

    def _bin(self, value: float) -> int:
        if value <= 0.0:
            return 0
        b = int((math.log10(value) - self._lo) * self._scale)
        if b < 0:
            return 0
        last = self.config.bins - 1
        return last if b > last else b

    def add(self, value: float, weight: float = 1.0) -> None:
        """Fold one value in, counting ``weight`` (e.g. its cost) toward quantiles."""
        if weight <= 0.0 or not math.isfinite(value):
            return
        w = self._w * weight
        self.counts[self._bin(value)] += w
        self.total += w
        self._w *= math.exp(self._ln_g * weight)
        if self._w > self._RESCALE_AT:
            self._rescale()

    def add_many(self, values: FloatArray, weights: FloatArray | None = None) -> None:
        """Fold many values in at once (all counted as of now)."""
        if values.size == 0:
            return
        ok = np.isfinite(values)
        if weights is None:
            weights = np.ones_like(values)
        ok &= weights > 0.0
        if not ok.all():
            values, weights = values[ok], weights[ok]
            if values.size == 0:
                return
        with np.errstate(divide="ignore"):
            logs = np.log10(np.maximum(values, 1e-300))
        bins = ((logs - self._lo) * self._scale).astype(np.int64)
        np.clip(bins, 0, self.config.bins - 1, out=bins)
        np.add.at(self.counts, bins, weights * self._w)
        added = float(weights.sum())
        self.total += added * self._w
        self._w *= math.exp(self._ln_g * added)
        if self._w > self._RESCALE_AT:
            self._rescale()

    def _rescale(self) -> None:
        self.counts /= self._w
        self.total /= self._w
        self._w = 1.0

    def quantile(self, q: float) -> float:
        """The value below which a share ``q`` of the (decayed) weight lies; 0.0 when empty."""
        if self.total <= 0.0:
            return 0.0
        if q <= 0.0:
            return 0.0
        if q >= 1.0:
            return _INF
        cum = np.cumsum(self.counts)
        goal = q * cum[-1]
        b = int(np.searchsorted(cum, goal, side="left"))
        b = min(b, self.config.bins - 1)
        before = float(cum[b - 1]) if b > 0 else 0.0
        inside = float(self.counts[b])
        frac = (goal - before) / inside if inside > 0 else 0.0
        return float(10.0 ** (self._lo + (b + frac) / self._scale))

    def cdf(self, value: float) -> float:
        """Share of the (decayed) weight below ``value``; 0.5 when empty (no information)."""
        if self.total <= 0.0:
            return 0.5
        if value <= 0.0:
            return 0.0
        pos = (math.log10(value) - self._lo) * self._scale
        b = int(pos)
        if b < 0:
            return 0.0
        if b >= self.config.bins:
            return 1.0
        below = float(self.counts[:b].sum()) + float(self.counts[b]) * (pos - b)
        return min(1.0, max(0.0, below / float(self.counts.sum())))

    def snapshot(self) -> dict[str, Any]:
        scale = self._w
        return {"counts": (self.counts / scale).tolist(), "total": self.total / scale}

    def restore(self, state: Mapping[str, Any]) -> None:
        counts = np.asarray(state["counts"], dtype=np.float64)
        if counts.shape != self.counts.shape:
            raise ValueError(
                f"histogram snapshot has {counts.size} bins, config says {self.counts.size}"
            )
        self.counts = counts.copy()
        self.total = float(state["total"])
        self._w = 1.0


class ValueRanker:
    """Rank of a request's value among recent requests (a CDF estimate in [0, 1]).

    Clients use it to spend their optional-work multiplier lowest value first.
    """

    def __init__(self, config: HistogramConfig | None = None) -> None:
        self._hist = DecayedLogHistogram(config)

    def observe(self, value: float) -> None:
        self._hist.add(value)

    def observe_many(self, values: FloatArray) -> None:
        self._hist.add_many(np.asarray(values, dtype=np.float64))

    def rank(self, value: float) -> float:
        return self._hist.cdf(value)

    def snapshot(self) -> dict[str, Any]:
        return self._hist.snapshot()

    def restore(self, state: Mapping[str, Any]) -> None:
        self._hist.restore(state)


# --------------------------------------------------------------------------------------------
# Server side
# --------------------------------------------------------------------------------------------


def _finite_nonneg(name: str, value: float) -> list[str]:
    if not (math.isfinite(value) and value >= 0.0):
        return [f"{name}: must be a finite number ≥ 0 (got {value!r})"]
    return []


def _positive(name: str, value: float) -> list[str]:
    if not (math.isfinite(value) and value > 0.0):
        return [f"{name}: must be a finite number > 0 (got {value!r})"]
    return []


def _unit(name: str, value: float) -> list[str]:
    if not (math.isfinite(value) and 0.0 <= value <= 1.0):
        return [f"{name}: must lie in [0, 1] (got {value!r})"]
    return []


@dataclass(frozen=True, slots=True)
class ServerShedConfig:
    """Server-side shedding settings. Defaults cite their source in the module docstring."""

    target_queue_ms: float = 5.0  # CoDel target
    interval_ms: float = 100.0  # CoDel interval
    shed_step: float = 0.1  # τ_overload raised by this at each CoDel drop time
    max_shed_quantile: float = 1.0  # τ_overload never exceeds this
    recovery_per_s: float = 0.5  # τ_overload decay once the delay is back under target
    burst_ms: float = 50.0  # token-bucket depth: level × burst_ms of work
    demand_window_ms: float = 1000.0  # time constant of the offered-demand rate estimate
    budget_aware: bool = True  # include τ_budget in the threshold
    reserve_slots: int = 0  # free slots ≤ this = exhausted (kept for baseline bursts)
    cpu_cost_weight: float = 1.0  # w_cpu in vpc = value / (w_cpu·cpu_ms + w_acc·acc_ms)
    accelerator_cost_weight: float = 1.0  # w_acc
    shed_quiet_ms: float = 1000.0  # no drop for this long ends a shedding episode
    threshold_refresh: int = 64  # recompute θ at least every this many optional requests
    histogram: HistogramConfig = HistogramConfig()

    def __post_init__(self) -> None:
        p = "shedding.server"
        problems = [
            *_finite_nonneg(f"{p}.target_queue_ms", self.target_queue_ms),
            *_positive(f"{p}.interval_ms", self.interval_ms),
            *_unit(f"{p}.shed_step", self.shed_step),
            *_unit(f"{p}.max_shed_quantile", self.max_shed_quantile),
            *_finite_nonneg(f"{p}.recovery_per_s", self.recovery_per_s),
            *_positive(f"{p}.burst_ms", self.burst_ms),
            *_positive(f"{p}.demand_window_ms", self.demand_window_ms),
            *_finite_nonneg(f"{p}.cpu_cost_weight", self.cpu_cost_weight),
            *_finite_nonneg(f"{p}.accelerator_cost_weight", self.accelerator_cost_weight),
            *_finite_nonneg(f"{p}.shed_quiet_ms", self.shed_quiet_ms),
            *self.histogram.validate(f"{p}.histogram"),
        ]
        if self.shed_step <= 0.0:
            problems.append(f"{p}.shed_step: must be > 0 (got {self.shed_step!r})")
        if self.reserve_slots < 0:
            problems.append(f"{p}.reserve_slots: must be ≥ 0 (got {self.reserve_slots!r})")
        if self.threshold_refresh < 1:
            problems.append(f"{p}.threshold_refresh: must be ≥ 1 (got {self.threshold_refresh!r})")
        if self.cpu_cost_weight + self.accelerator_cost_weight <= 0.0:
            problems.append(f"{p}.cpu_cost_weight: at least one cost weight must be > 0")
        if problems:
            raise ConfigError(problems)


class ServerShedder:
    """Server-side shedding core for one ranking server (see the module docstring).

    Call :meth:`observe` with each health reading (queueing delay, free slots),
    :meth:`on_capacity` whenever the opportunistic level changes, :meth:`decide` (or
    :meth:`decide_batch`) for each arriving request, :meth:`trim_inflight` after a capacity drop,
    and :meth:`poll` now and then for ``shedding.started`` / ``shedding.stopped`` transitions.
    """

    def __init__(
        self,
        config: ServerShedConfig | None = None,
        capacity: OptionalCapacity | None = None,
        now: float = 0.0,
    ) -> None:
        raise NotImplementedError  # filled in below the API commit

    # -- inputs ---------------------------------------------------------------------------

    def on_capacity(self, level: OptionalCapacity, now: float) -> bool:
        """Set the opportunistic level; takes effect on the very next decision.

        Buckets are clamped to the new depth at once. Returns True when the level went down on
        some resource (the caller should then call :meth:`trim_inflight`).
        """
        raise NotImplementedError

    def observe(
        self,
        now: float,
        queue_ms: float,
        free_slots: Mapping[str, float] | None = None,
    ) -> OverloadTransition | None:
        """Feed one health reading: the queueing delay (CoDel: the sojourn time of the request
        just dequeued) and, optionally, free slots per resource (``"cpu"``, ``"accelerator"``).
        Returns a transition when the overloaded state changes."""
        raise NotImplementedError

    # -- decisions ------------------------------------------------------------------------

    def decide(self, now: float, work: OptionalWork) -> Verdict:
        """Decide one request's optional work."""
        raise NotImplementedError

    def decide_batch(
        self,
        now: float,
        value: FloatArray,
        extra: IntArray,
        extra_cpu_ms: FloatArray,
        extra_accelerator_ms: FloatArray,
        strong: BoolArray,
        strong_cpu_ms: FloatArray,
        strong_accelerator_ms: FloatArray,
    ) -> BatchVerdict:
        """Decide many requests that arrive together (same ``now``), lowest vpc shed first."""
        raise NotImplementedError

    def trim_inflight(self, now: float, inflight: Sequence[InflightWork]) -> list[InflightCut]:
        """Which running optional work to cut so the rest fits the current level, lowest value
        per unit of occupied capacity first."""
        raise NotImplementedError

    def trim_inflight_batch(
        self, now: float, value: FloatArray, cpu: FloatArray, accelerator: FloatArray
    ) -> BoolArray:
        """Array form of :meth:`trim_inflight`: a mask of the in-flight items to cut."""
        raise NotImplementedError

    def poll(self, now: float) -> ShedTransition | None:
        """``shedding.started`` after the first drop of an episode, ``shedding.stopped`` once no
        optional work has been dropped for ``shed_quiet_ms``."""
        raise NotImplementedError

    # -- introspection and state ----------------------------------------------------------

    @property
    def overloaded(self) -> bool:
        raise NotImplementedError

    @property
    def threshold(self) -> float:
        """Current value-per-cost threshold θ (0 = everything passes)."""
        raise NotImplementedError

    @property
    def stats(self) -> ServerShedStats:
        raise NotImplementedError

    def snapshot(self) -> dict[str, Any]:
        raise NotImplementedError

    def restore(self, state: Mapping[str, Any]) -> None:
        raise NotImplementedError


# --------------------------------------------------------------------------------------------
# Client side
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ClientShedConfig:
    """Client-side AIMD on the optional-work multiplier (sources in the module docstring)."""

    decrease_factor: float = 0.5  # β: m ← m·β on overload (TCP halving)
    decrease_interval_ms: float = 100.0  # at most one decrease per this interval
    recovery_per_s: float = 0.2  # additive recovery: 0 → 1 in 5 s of healthy responses
    overload_queue_ms: float | None = 50.0  # queue delay above this counts as overload too
    zero_below: float = 0.01  # a multiplier under this snaps to 0 (no optional work)

    def __post_init__(self) -> None:
        p = "shedding.client"
        problems = [
            *_unit(f"{p}.decrease_factor", self.decrease_factor),
            *_finite_nonneg(f"{p}.decrease_interval_ms", self.decrease_interval_ms),
            *_positive(f"{p}.recovery_per_s", self.recovery_per_s),
            *_unit(f"{p}.zero_below", self.zero_below),
        ]
        if self.decrease_factor >= 1.0:
            problems.append(f"{p}.decrease_factor: must be < 1 (got {self.decrease_factor!r})")
        if self.overload_queue_ms is not None:
            problems += _finite_nonneg(f"{p}.overload_queue_ms", self.overload_queue_ms)
        if problems:
            raise ConfigError(problems)


class ClientShedder:
    """Client-side optional-work multiplier for one server (see the module docstring)."""

    def __init__(self, config: ClientShedConfig | None = None, now: float = 0.0) -> None:
        raise NotImplementedError

    def on_response(
        self, now: float, overloaded: bool, queue_ms: float | None = None
    ) -> ShedTransition | None:
        """Fold in the health carried by one response; returns a transition when shedding
        starts (multiplier leaves 1) or stops (multiplier back at 1)."""
        raise NotImplementedError

    @property
    def multiplier(self) -> float:
        raise NotImplementedError

    def multiplier_at(self, now: float) -> float:
        """The multiplier including additive recovery up to ``now`` (does not change state)."""
        raise NotImplementedError

    def keeps(self, value_rank: float) -> bool:
        """True when a request of this value rank keeps its optional work (rank ≥ 1 − m)."""
        raise NotImplementedError

    def apply(self, now: float, value_rank: float, extra: int, strong: bool) -> tuple[int, bool]:
        """Extra candidates and strong routing a request keeps; counts what is dropped."""
        raise NotImplementedError

    def keep_mask(self, now: float, value_rank: FloatArray) -> BoolArray:
        """Array form of :meth:`apply` for the simulator: which requests keep optional work."""
        raise NotImplementedError

    def snapshot(self) -> dict[str, Any]:
        raise NotImplementedError

    def restore(self, state: Mapping[str, Any]) -> None:
        raise NotImplementedError
