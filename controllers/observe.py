"""What the controller has heard about each region, folded into one :class:`RegionObservation`.

The streaming controller (``controllers/app.py``) feeds every validated message into a
:class:`RegionAggregator`; at each control tick it calls :meth:`RegionAggregator.observe` for a
region, which returns the observation for the window since the previous tick and starts a new
window. Pure: no clock, no Kafka; the caller passes ``now`` (the newest event time seen, or the
wall clock in the app).

Rules:

* **Latency**: sketches of one window are *merged* per path ("base", "rma", "sbm") and over all
  paths ("all"); p99 comes from the merged sketch, never from averaged percentiles. A message
  that carries raw ``samples_ms`` but no sketch is folded into the sketch sample by sample.
* **Request rate**: the requests of the window — the servers' (the sum of latency ``count``)
  plus the precompute hits, which call no server (the ``n`` of the value signals of lever
  ``precompute``, arm ``treatment``) — ÷ the *event-time* span the latency messages cover
  (newest ``ts`` − oldest ``ts`` + one message window), not the wall-clock time between ticks:
  after a restart the backlog of a whole outage arrives in one tick, and dividing it by the tick
  length would inflate the rate (and shrink the RMA budget cap) for no reason. Every request,
  as the simulator counts them: the precompute lever's demand is a share of the visits, and a
  rate without the hits would shrink it as the hits grow.
* **Coverage observed**: :func:`headroom.controllers.coverage.observed_coverage` — requests on
  the ``sbm`` path ÷ the eligible treatment requests (requests × the eligible share × ``1 −
  holdout``), the rule the simulator's observation uses.
* **Capacity**: one :class:`headroom.defences.capacity.CapacityBook` per region (its rules: the
  newest ``ts`` per (resource, hardware, pool, remote) wins, a tie goes to the lower level, an
  opportunistic level lapses ``expires_in_s`` after its ``ts`` and then counts as zero). The
  observation carries the book's levels as of ``now``: ``expires_in_s`` is the lifetime left.
* **Value**: sums per (segment, lever, arm) since the previous tick; they add exactly. A value
  signal that names a ``stratum`` (a value bin of its segment) is kept under
  ``stratum_key(segment, stratum)`` (``"casual#3"``), so the value book post-stratifies on it
  (:meth:`RegionAggregator.add_value_signal`); one without is kept under its segment.
  Segment request rates come from the value signals' counts (their *shares*, scaled to the
  latency-derived total rate, so the way clients split arms cannot skew the rate), strata
  folded into their segment.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from headroom.controllers.coverage import observed_coverage
from headroom.controllers.types import (
    LEVER_PRECOMPUTE,
    SLO_QUANTILE,
    ArmStats,
    CapacityLevel,
    RegionObservation,
    ValueKey,
    segment_of,
    stratum_key,
    strong_tail_quantile,
)
from headroom.defences.capacity import CapacityBook
from headroom.kernel.sketch import LatencySketch
from headroom.streams.messages import ValueSignal

PATHS = ("base", "rma", "sbm")


@dataclass
class _Window:
    sketches: dict[str, LatencySketch] = field(default_factory=dict)
    requests: int = 0
    sbm_requests: int = 0
    first_ts: float | None = None
    last_ts: float | None = None
    msg_window_s: float = 0.0  # the shortest message window seen
    value: dict[ValueKey, ArmStats] = field(default_factory=dict)


def value_key(msg: ValueSignal) -> ValueKey:
    """The value-book key of one ``headroom.value`` message: its stratum where it names one
    (else its segment), its lever and its arm."""
    return (stratum_key(msg.segment, msg.stratum), msg.lever, msg.arm)


def arm_stats(msg: ValueSignal) -> ArmStats:
    """The sums of one ``headroom.value`` message, as the value books add them."""
    return ArmStats(
        n=msg.n,
        value_sum=msg.value_sum,
        value_sq_sum=msg.value_sq_sum,
        cpu_ms=msg.cost.cpu_ms,
        accelerator_ms=msg.cost.accelerator_ms,
        signal_sum=msg.signal_sum or 0.0,
        signal_sq_sum=msg.signal_sq_sum or 0.0,
        signal_value_sum=msg.signal_value_sum or 0.0,
    )


class RegionAggregator:
    """Per-region state between control ticks. One instance serves every region."""

    def __init__(
        self, *, alpha: float = 0.01, eligible_share: float = 1.0, treat_share: float = 1.0
    ) -> None:
        if not 0.0 <= eligible_share <= 1.0:
            raise ValueError(f"eligible_share: must be in [0, 1], got {eligible_share!r}")
        if not 0.0 <= treat_share <= 1.0:
            raise ValueError(f"treat_share: must be in [0, 1], got {treat_share!r}")
        self.alpha = alpha
        self.eligible_share = eligible_share
        self.treat_share = treat_share  # 1 − the holdout: the requests the router may route
        self._windows: dict[str, _Window] = {}
        self._window_start: dict[str, float] = {}
        self._capacity: dict[str, CapacityBook] = {}
        self._last_value_ts: dict[str, float] = {}

    # --- ingest ---------------------------------------------------------------------------
    @property
    def regions(self) -> list[str]:
        seen = set(self._windows) | set(self._capacity)
        return sorted(seen)

    def _window(self, region: str, ts: float) -> _Window:
        # the first latency or value message starts the region's first window, even when a
        # capacity level (whose ts may be old: a level read back at start-up) made the window
        self._window_start.setdefault(region, ts)
        return self._windows.setdefault(region, _Window())

    def add_latency(
        self,
        region: str,
        ts: float,
        path: str,
        count: int,
        sketch: LatencySketch | None,
        samples_ms: tuple[float, ...] | None,
        window_s: float = 1.0,
    ) -> None:
        w = self._window(region, ts)
        w.first_ts = ts if w.first_ts is None else min(w.first_ts, ts)
        w.last_ts = ts if w.last_ts is None else max(w.last_ts, ts)
        w.msg_window_s = window_s if w.msg_window_s <= 0 else min(w.msg_window_s, window_s)
        if sketch is None:
            sketch = LatencySketch(self.alpha)
            for x in samples_ms or ():
                sketch.add(x)
        for key in (path, "all"):
            current = w.sketches.get(key)
            if current is None:
                w.sketches[key] = sketch.copy()
            else:
                current.merge(sketch)
        w.requests += count
        if path == "sbm":
            w.sbm_requests += count

    def add_capacity(self, region: str, level: CapacityLevel) -> bool:
        """Record a level; False when it lost to the level in force (or is that very level)."""
        self._windows.setdefault(region, _Window())
        return self._capacity.setdefault(region, CapacityBook()).apply(level)

    def add_value(self, region: str, ts: float, key: ValueKey, stats: ArmStats) -> None:
        w = self._window(region, ts)
        w.value[key] = w.value.get(key, ArmStats()) + stats
        self._last_value_ts[region] = max(ts, self._last_value_ts.get(region, ts))

    def add_value_signal(self, msg: ValueSignal) -> None:
        """Fold one ``headroom.value`` message in, keyed by its stratum where it names one."""
        self.add_value(msg.region, msg.ts, value_key(msg), arm_stats(msg))

    # --- observe ----------------------------------------------------------------------------
    def heard(self, region: str) -> bool:
        """Whether latency of ``region`` arrived since its window began (its last observation)."""
        w = self._windows.get(region)
        return w is not None and w.first_ts is not None

    def capacity(self, region: str, now: float) -> tuple[CapacityLevel, ...]:
        """The region's levels as of ``now`` (:meth:`CapacityBook.levels`)."""
        book = self._capacity.get(region)
        return () if book is None else book.levels(now)

    def observe(self, region: str, now: float, min_window_s: float = 1e-3) -> RegionObservation:
        """The observation for the window ending at ``now``; starts the next window."""
        w = self._windows.pop(region, _Window())
        start = self._window_start.get(region, now)
        window_s = max(min_window_s, now - start)
        self._window_start[region] = now
        p99: dict[str, float | None] = {}
        for key in ("all", *PATHS):
            sk = w.sketches.get(key)
            p99[key] = sk.quantile(SLO_QUANTILE) if sk is not None and sk.count > 0 else None
        every, strong = w.sketches.get("all"), w.sketches.get("sbm")
        sbm_tail = None
        if every is not None and strong is not None and strong.count > 0:
            sbm_tail = strong.quantile(strong_tail_quantile(every.count, strong.count))
        span = window_s
        if w.first_ts is not None and w.last_ts is not None:
            span = max(min_window_s, w.last_ts - w.first_ts + w.msg_window_s)
        # a precompute hit calls no server: its request is counted from its value signal
        hits = sum(
            stats.n
            for (_key, lever, arm), stats in w.value.items()
            if lever == LEVER_PRECOMPUTE and arm == "treatment"
        )
        requests = w.requests + hits
        request_rps = requests / span
        seg_counts: dict[str, int] = {}
        for (key, _lever, _arm), stats in w.value.items():
            segment = segment_of(key)  # a stratum's requests count for its segment
            seg_counts[segment] = seg_counts.get(segment, 0) + stats.n
        total = sum(seg_counts.values())
        segment_rps = {s: request_rps * n / total for s, n in seg_counts.items()} if total else {}
        eligible_rps = request_rps * self.eligible_share
        coverage = observed_coverage(
            requests, w.sbm_requests, self.eligible_share, self.treat_share
        )
        last_value = self._last_value_ts.get(region)
        return RegionObservation(
            region=region,
            now=now,
            window_s=window_s,
            p99_ms=p99,
            request_rps=request_rps,
            eligible_rps=eligible_rps,
            segment_rps=segment_rps,
            capacity=self.capacity(region, now),
            value=dict(w.value),
            observed_coverage=coverage,
            value_age_s=None if last_value is None else max(0.0, now - last_value),
            sbm_tail_ms=sbm_tail,
        )
