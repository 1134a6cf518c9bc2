"""The precompute worker (``headroom precompute --region R``): rank returning users ahead of time.

One process per region. It is the I/O shell around the pure core
(:mod:`headroom.controllers.precompute`) and the store (:mod:`headroom.workers.precompute_store`):

* **reads** ``capacity`` (compacted, from the beginning: the region's opportunistic levels,
  ``remote`` pools included) and ``targets`` (the newest epoch of the region; a precompute budget
  in the optional ``precompute.jobs_per_s`` field, else ``default_jobs_per_s``; an *expired*
  target stops new jobs, as it stops every other optional work), ``requests`` as a consumer
  of its own group ``<prefix>precompute.<region>`` (at-least-once,
  :mod:`headroom.streams.consume`): the users and segments it may precompute for, and ``value`` in
  the group ``<prefix>precompute-value.<region>``: the region's value signals of lever
  ``precompute`` (treatment = hits, control = held-out visits that found a result), and of every
  lever for the mean value signal per stratum (a value book, as the control plane keeps);
* **calibrates** the planner's uplift model once per SLO window from those measured values
  (:mod:`headroom.controllers.precompute_value`): a segment whose measured uplift per served visit
  is precise enough is rescaled to it, or switched off when it is at or below zero; the staleness of
  the measured visits is read off the requests that find a live result in the worker's own store;
  and counts it against the live alternative of the targets in force
  (:func:`headroom.controllers.precompute.live_alternative`: the targets' per-bin RMA levels, the
  mean value signal per bin, the RMA curve; the simulator's headroom policy asks the same
  function), so a segment whose stored result does not beat what live RMA gives its visits is not
  precomputed; with no target in force (or an expired one) the visits run the baseline and the
  uplift is the calibrated one;
* **decides** each round (every ``tick_s``, or sooner when a job ends): jobs allowed by the token
  bucket and by what fits on the usable pools, users picked by expected gain
  (:class:`headroom.controllers.precompute.PrecomputePlanner`);
* **runs** the real strong-model ranking of the ranking world for them (batched per segment, in
  a worker thread so a reclaim is handled while numpy runs), and publishes each finished job's
  result to ``precompute`` (compacted, key ``region/user``, docs/messages.md) once the job's batch
  time on its pools has passed;
* **tombstones** results when they expire (a null value for the key), and stops jobs at once when
  a capacity level drops below what they draw (``wasted_partial``: a half-done job delivers
  nothing) — also when a level lapses, ``expires_in_s`` after its ``ts`` without a newer
  announcement (:mod:`headroom.defences.capacity`; noticed at the next round);
* **reports** on ``events`` and the structured log, per SLO window (scenario time):
  ``precompute.job.completed`` (jobs by segment, wasted, rate in force), ``precompute.result.
  expired`` (results tombstoned), ``window`` lines whose ``precompute`` field carries ``jobs`` and
  ``wasted_partial`` and whose ``used_unit_s`` carries the resources its jobs used (clients'
  window lines carry visits, hits, used and expired-unused results: see
  :mod:`headroom.workers.precompute_lookup`), ``optional.released`` when a reclaim stopped jobs
  (with ``release_ms`` from the capacity message's ``ts`` to the stop), and
  ``precompute.uplift.rescaled`` when a segment's measured scale changes.

Time: messages carry wall-clock ``ts``; the core runs on *scenario time* ``t = (wall − t0) ×
speed`` (the world's drift clock and the scenario's rates and lifetimes), so a run fed faster
than real time (``headroom feed --speed X``) keeps its meaning. A result ranked at scenario time
``t`` carries ``ts = t0 + t / speed`` and ``expires_at = t0 + (t + L_s) / speed``.

On start it reads its region's results back from the compacted topic, so results published before
a restart are still tombstoned when they expire. The measured values are not restored: a new or
restarted worker joins ``value`` at the end (or its group's committed offset) and plans with the
curves until enough new signals have arrived.
"""

from __future__ import annotations

import asyncio
import math
import re
import time
from collections import Counter, deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
from aiokafka.errors import KafkaConnectionError
from prometheus_client import CollectorRegistry, Gauge
from prometheus_client import Counter as PromCounter

from headroom.analysis.events import window_event
from headroom.controllers.config import ValueSettings
from headroom.controllers.levers import CapacityUse, RmaCurve, ValueBook
from headroom.controllers.observe import arm_stats, value_key
from headroom.controllers.precompute import (
    PrecomputeConfig,
    PrecomputePlanner,
    UpliftModel,
    live_alternative,
    own_rate,
)
from headroom.controllers.precompute_jobs import Job, JobBook, TokenBucket, usable_pools
from headroom.controllers.precompute_value import (
    CalibrationSettings,
    SegmentCalibration,
    UpliftCalibrator,
)
from headroom.controllers.types import CapacityLevel
from headroom.defences.capacity import CapacityBook
from headroom.kernel import seeds
from headroom.kernel.checks import FieldChecker
from headroom.kernel.codec import ValidationError, loads
from headroom.kernel.errors import ConfigError
from headroom.kernel.scenario import Scenario
from headroom.streams import messages
from headroom.streams.consume import ConsumerLoop, LoopConfig, Received
from headroom.streams.kafka import KafkaTarget, KafkaUnavailable, make_consumer, make_producer
from headroom.workers.precompute_lookup import read_region_results
from headroom.workers.precompute_store import PrecomputeStore
from headroom.workers.service import Service
from headroom.world.curves import ValueCurves
from headroom.world.ranking import Model, RankingWorld

__all__ = [
    "PrecomputeMetrics",
    "PrecomputeWorker",
    "WorkerSettings",
    "WorkerStats",
    "rank_batch",
    "target_budget",
]

_REGION = re.compile(r"[A-Za-z0-9_.-]{1,64}\Z")
_RANK_CHUNK = 64  # users per numpy batch: amortises the corpus scan (bench_precompute)
_READY_POLL_S = 0.05


@dataclass(frozen=True)
class WorkerSettings:
    """Process settings (the policy's are
    :class:`headroom.controllers.precompute.PrecomputeConfig`)."""

    region: str
    t0: float = 0.0  # wall-clock epoch of scenario time 0 (--t0)
    speed: float = 1.0  # scenario seconds per wall second (--speed)
    tick_s: float = 0.25  # wall seconds between scheduling rounds (sooner when a job ends)
    policy: str = "headroom"  # policy name written on events
    seed: int = 0  # the planner's generator (tie-breaking, exploration)
    group_id: str | None = None  # requests consumer group; default <prefix>precompute.<region>
    value_group_id: str | None = None  # value group; default <prefix>precompute-value.<region>
    restore_results: bool = True  # read the region's results back from the topic on start

    def __post_init__(self) -> None:
        c = FieldChecker()
        c.require(
            isinstance(self.region, str) and _REGION.match(self.region) is not None,
            "--region",
            "must be 1-64 characters of [A-Za-z0-9_.-]",
            self.region,
        )
        c.clock(self.t0, self.speed)
        c.positive("tick_s", self.tick_s)
        c.raise_if_any()


@dataclass
class WorkerStats:
    """Counters of one worker run (tests and the final log line read them)."""

    requests: int = 0  # requests of this region seen
    unknown_segment: int = 0  # requests whose segment the scenario does not know (ignored)
    jobs_started: int = 0
    jobs_completed: int = 0
    wasted_partial: int = 0  # jobs stopped by a reclaim before they finished
    published: int = 0  # results written to the precompute topic
    tombstoned: int = 0  # expired results deleted from the topic
    deadlettered: int = 0  # bad capacity / targets / requests / value records
    value_signals: int = 0  # value signals of this region's precompute lever folded in
    value_ignored: int = 0  # value signals of other regions, levers or unknown segments
    rescaled: int = 0  # precompute.uplift.rescaled events written
    targets: int = 0  # targets of this region applied
    releases_ms: list[float] = field(default_factory=list)  # reclaim → jobs stopped


@dataclass(frozen=True)
class PrecomputeMetrics:
    """Prometheus metrics of the precompute worker (one registry per process)."""

    jobs: PromCounter
    results: PromCounter
    rate: Gauge
    inflight: Gauge
    users: Gauge

    @classmethod
    def make(cls, registry: CollectorRegistry | None = None) -> PrecomputeMetrics:
        reg = registry or CollectorRegistry()
        return cls(
            jobs=PromCounter(
                "headroom_precompute_jobs",
                "Precompute jobs by outcome (completed, stopped = wasted_partial)",
                ["region", "outcome"],
                registry=reg,
            ),
            results=PromCounter(
                "headroom_precompute_results",
                "Precomputed results published and tombstoned",
                ["region", "event"],
                registry=reg,
            ),
            rate=Gauge(
                "headroom_precompute_rate_jobs_per_second",
                "Job rate in force (budget)",
                ["region"],
                registry=reg,
            ),
            inflight=Gauge(
                "headroom_precompute_inflight_jobs", "Jobs running now", ["region"], registry=reg
            ),
            users=Gauge(
                "headroom_precompute_users", "Users the worker knows", ["region"], registry=reg
            ),
        )


def target_budget(raw: object) -> float | None:
    """The optional ``precompute`` field of a targets message: ``{"jobs_per_s": X}``, jobs of
    the lever's size (:class:`headroom.controllers.levers.PrecomputeLever`) per second. None if
    absent;
    :class:`ValidationError` if malformed."""
    if not isinstance(raw, Mapping):
        return None
    field_ = raw.get("precompute")
    if field_ is None:
        return None
    if not isinstance(field_, Mapping):
        raise ValidationError("precompute", 'must be an object like {"jobs_per_s": 12.5}')
    value = field_.get("jobs_per_s")
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValidationError("precompute.jobs_per_s", f"must be a number, got {value!r}")
    if not (math.isfinite(value) and value >= 0.0):
        raise ValidationError("precompute.jobs_per_s", f"must be a finite number >= 0, got {value}")
    return float(value)


def rank_batch(
    world: RankingWorld,
    users: Sequence[int],
    segment: int,
    candidates: int,
    t_s: float,
    keep: int,
) -> list[tuple[int, ...]]:
    """The strong model's ranking of ``candidates`` retrieved ads for each user (one segment),
    at scenario time ``t_s``: the first ``keep`` ad ids, best first. The real computation:
    corpus scan, top-N, the strong model's forward pass (:mod:`headroom.world.ranking`)."""
    out: list[tuple[int, ...]] = []
    for start in range(0, len(users), _RANK_CHUNK):
        ids = list(users[start : start + _RANK_CHUNK])
        batch = world.users(ids, segment)
        cands = world.retrieve_batch(batch, candidates, t_s)
        scores = world.score_batch(batch, segment, cands, Model.STRONG, t_s)
        order = np.argsort(-scores, axis=1, kind="stable")[:, :keep]
        top = np.take_along_axis(cands, order, axis=1)
        out.extend(tuple(row) for row in top.tolist())
    return out


@dataclass
class _Target:
    epoch: int
    ts: float
    ttl_s: float
    budget: float | None
    levels: Mapping[str, Sequence[int]] = field(default_factory=dict)  # rma.levels (per bin)
    extras: float = 0.0  # rma.candidates − rma.base: the mean extras of a segment without levels


@dataclass
class _Window:
    jobs: int = 0
    explored: int = 0
    wasted_partial: int = 0
    expired: int = 0
    cpu_unit_s: float = 0.0
    accelerator_unit_s: float = 0.0
    by_segment: Counter[str] = field(default_factory=Counter)

    def empty(self) -> bool:
        return not (
            self.jobs
            or self.wasted_partial
            or self.expired
            or self.cpu_unit_s > 0.0
            or self.accelerator_unit_s > 0.0
        )


class PrecomputeWorker(Service):
    """One region's precompute worker (see the module docstring)."""

    name = "precompute"

    def __init__(
        self,
        settings: WorkerSettings,
        scenario: Scenario,
        kafka: KafkaTarget | None,
        *,
        config: PrecomputeConfig | None = None,
        world: RankingWorld | None = None,
        curves: ValueCurves | None = None,
        metrics: PrecomputeMetrics | None = None,
        calibration: CalibrationSettings | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        super().__init__()
        if not scenario.precompute_enabled:
            raise ConfigError(
                f"--scenario: {scenario.name!r} has no precompute fields "
                "(world.drift_per_h, world.users and segments[].return_rate_per_h)"
            )
        self.settings = settings
        self.scenario = scenario
        self.kafka = kafka
        self.region = settings.region
        self.config = config or PrecomputeConfig.from_scenario(scenario)
        self.world = world
        self._curves = curves
        self.metrics = metrics or PrecomputeMetrics.make()
        # (consumer loop, consumer) -> None: exports their dead letters and lag (workers/metrics.py)
        self.watch_loop: Callable[[Any, Any], None] | None = None
        self._wall = clock
        cfg = self.config
        self.planner: PrecomputePlanner | None = None  # built in on_start (needs the curves)
        self.jobs = JobBook(cfg.job_cost, cfg.job_duration_s)
        self.bucket = TokenBucket(cfg.default_jobs_per_s, cfg.burst_s)
        self.store = PrecomputeStore(max_results=cfg.max_users)
        self.stats = WorkerStats()
        self.ready = asyncio.Event()  # capacity and targets read to their end, requests joined
        self._lever_job = cfg.costs.precompute_per_job
        self.capacity = CapacityBook()  # the region's levels, on the wire's wall clock
        self._target: _Target | None = None
        self._rate_reason = ""
        self._payloads: dict[int, tuple[tuple[int, ...], float]] = {}  # job id → ranking, as-of
        self._window_s = scenario.slo.window_s
        self._windows: dict[int, _Window] = {}
        self._last_job_stats = (0.0, 0.0)
        self._draining = False
        self._producer: Any = None
        self._control: Any = None
        self._requests: Any = None
        self._request_loop: ConsumerLoop | None = None
        self._pending: list[asyncio.Future[Any]] = []
        self._outbox: deque[messages.Event] = deque()
        self.events: deque[messages.Event] = deque(maxlen=10_000)  # the latest events emitted
        self._seg_names = cfg.segment_names
        self.calibrator = UpliftCalibrator(
            self.region, cfg.segment_names, self._window_s, cfg.max_ttl_s, calibration
        )
        self._curves_uplift: UpliftModel | None = None  # the curves' model (k_s = 1): the base
        self._calibrated_window: int | None = None
        self.calibration: dict[int, SegmentCalibration] = {}  # in force, by segment index
        self._reported: dict[int, SegmentCalibration] = {}  # as last reported in an event
        self._values: Any = None
        self._value_loop: ConsumerLoop | None = None
        # every lever's value signals of the region: the mean value signal per stratum that
        # prices the live alternative (decayed per SLO window at the control plane's half-life)
        self.value_book = ValueBook()
        self._value_decay = 0.5 ** (self._window_s / ValueSettings().half_life_s)
        self._rma_curve: RmaCurve | None = None  # built with the planner (needs the curves)
        self.live: np.ndarray[Any, np.dtype[np.float64]] | None = None  # in force, per segment

    # -- time -------------------------------------------------------------------------------------

    def scenario_time(self, wall: float | None = None) -> float:
        wall = self._wall() if wall is None else wall
        return (wall - self.settings.t0) * self.settings.speed

    def wall_time(self, t: float) -> float:
        return self.settings.t0 + t / self.settings.speed

    # -- lifecycle ------------------------------------------------------------------------------

    def prepare(self) -> None:
        """Build the world, the curves and the planner (blocking: seconds the first time, while
        the curves are measured). ``on_start`` runs it in a thread; tests call it directly."""
        if self.world is None:
            self.world = RankingWorld.from_scenario(self.scenario)
        if self._curves is None:
            from headroom.world.curves import curves_for

            self._curves = curves_for(self.scenario)
        uplift = UpliftModel.from_curves(self._curves, self.config)
        self._curves_uplift = uplift
        w = self.scenario.world
        self._rma_curve = RmaCurve.from_curves(
            self._curves, self._seg_names, w.base_candidates, w.max_candidates
        )
        rng = seeds.process_rng(self.settings.seed)
        self.planner = PrecomputePlanner(self.config, uplift, rng)
        lifetimes = {name: round(uplift.lifetime(i), 1) for i, name in enumerate(self._seg_names)}
        self.log.info("precompute.policy.built", region=self.region, lifetimes_s=lifetimes)

    async def on_start(self) -> None:
        if self.planner is None:
            await asyncio.to_thread(self.prepare)
        if self.kafka is None:
            self.ready.set()
            self.add_task(self._schedule_loop(), name="precompute-schedule")
            return
        k = self.kafka
        if self.settings.restore_results:
            restored = await read_region_results(k, self.region)
            now = self._wall()
            for result in restored:
                self.store.put(result, now)
            self.log.info("precompute.results.restored", region=self.region, results=len(restored))
        self._producer = make_producer(k.bootstrap)
        self._control = make_consumer(
            k.bootstrap, k.topic("capacity"), k.topic("targets"), group_id=None, from_beginning=True
        )
        group = self.settings.group_id or f"{k.prefix}precompute.{self.region}"
        self._requests = make_consumer(k.bootstrap, k.topic("requests"), group_id=group)
        value_group = self.settings.value_group_id or f"{k.prefix}precompute-value.{self.region}"
        self._values = make_consumer(k.bootstrap, k.topic("value"), group_id=value_group)
        try:
            for client in (self._producer, self._control, self._requests, self._values):
                await client.start()
        except (KafkaConnectionError, OSError) as exc:
            raise KafkaUnavailable(f"cannot reach Kafka at {k.bootstrap}: {exc}") from None
        self._request_loop = ConsumerLoop(
            self._requests,
            self._producer,
            self._on_request_record,
            prefix=k.prefix,
            config=LoopConfig(poll_timeout_s=0.05),
            component=self.name,
            on_deadletter=lambda _letter: self._count_deadletter(k.topic("requests")),
        )
        self.add_task(self._request_loop.run(), name="precompute-requests")
        self._value_loop = ConsumerLoop(
            self._values,
            self._producer,
            self._on_value_record,
            prefix=k.prefix,
            config=LoopConfig(poll_timeout_s=0.05),
            component=self.name,
            on_deadletter=lambda _letter: self._count_deadletter(k.topic("value")),
        )
        self.add_task(self._value_loop.run(), name="precompute-value")
        if self.watch_loop is not None:
            self.watch_loop(self._request_loop, self._requests)
            self.watch_loop(self._value_loop, self._values)
        self.add_task(self._control_loop(), name="precompute-control")
        self.add_task(self._watch_ready(), name="precompute-ready")
        self.add_task(self._schedule_loop(), name="precompute-schedule")

    async def on_drain(self) -> None:
        """Start no new job; let the running ones finish (one batch time at most) and publish
        their results; flush the last windows."""
        self._draining = True
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.config.job_duration_s / self.settings.speed + 1.0
        while self.jobs.jobs and loop.time() < deadline:
            await self.step()
            await asyncio.sleep(min(self.settings.tick_s, 0.02))
        await self.step()
        await self._flush_windows(final=True)

    async def on_stop(self) -> None:
        for loop in (self._request_loop, self._value_loop):
            if loop is not None:
                loop.stop()
        if self._producer is not None:
            try:
                await self._send_outbox()
            except Exception as exc:  # the broker is gone: say what was lost
                self.log.warning("precompute.events.unsent", error=str(exc))
        for client in (self._requests, self._values, self._control, self._producer):
            if client is not None:
                try:
                    await client.stop()
                except Exception as exc:  # best effort on the way out; say so
                    self.log.warning("precompute.client.stop_failed", error=str(exc))
        s = self.stats
        self.log.info(
            "precompute.worker.stopped",
            region=self.region,
            jobs_completed=s.jobs_completed,
            wasted_partial=s.wasted_partial,
            published=s.published,
            tombstoned=s.tombstoned,
            requests=s.requests,
            value_signals=s.value_signals,
            scales={
                self._seg_names[i]: round(c.scale, 4) for i, c in sorted(self.calibration.items())
            },
        )

    async def _watch_ready(self) -> None:
        consumer = self._control
        while not consumer.assignment():
            if not await self.sleep(_READY_POLL_S):
                return
        partitions = sorted(consumer.assignment(), key=lambda tp: (tp.topic, tp.partition))
        ends = await consumer.end_offsets(partitions)
        while True:
            positions = [await consumer.position(tp) for tp in partitions]
            caught_up = all(p >= ends[tp] for p, tp in zip(positions, partitions, strict=True))
            if caught_up and self._requests.assignment() and self._values.assignment():
                break
            if not await self.sleep(_READY_POLL_S):
                return
        # fix the group consumers' start offsets (a new group starts at the end): whatever is
        # published once the worker says it is ready is read
        for group_consumer in (self._requests, self._values):
            for tp in group_consumer.assignment():
                await group_consumer.position(tp)
        self.ready.set()
        self.log.info(
            "precompute.worker.ready",
            region=self.region,
            pools=len(self.jobs.pools),
            rate_jobs_per_s=self.bucket.rate,
        )

    # -- inputs ---------------------------------------------------------------------------------

    async def _control_loop(self) -> None:
        """Capacity and targets: decoded and checked here (the targets' optional precompute field
        is read from the raw record), bad records dead-lettered."""
        assert self.kafka is not None
        kinds = {self.kafka.topic("capacity"): "capacity", self.kafka.topic("targets"): "targets"}
        while not self.stop_requested:
            batch = await self._control.getmany(timeout_ms=50, max_records=500)
            for records in batch.values():
                for record in records:
                    await self._control_record(kinds[record.topic], record)

    async def _control_record(self, kind: str, record: Any) -> None:
        try:
            msg = messages.decode(kind, record.value)
            budget = target_budget(loads(record.value)) if kind == "targets" else None
        except ValidationError as exc:
            await self._deadletter(record, str(exc))
            return
        if isinstance(msg, messages.Capacity):
            self.on_capacity(msg)
        elif isinstance(msg, messages.Target):
            self.on_target(msg, budget)

    async def _deadletter(self, record: Any, error: str) -> None:
        assert self.kafka is not None
        letter = messages.DeadLetter.for_payload(
            ts=self._wall(),
            topic=record.topic,
            partition=record.partition,
            offset=record.offset,
            error=error,
            payload=record.value,
            key=record.key,
        )
        await self._producer.send(
            self.kafka.topic("deadletter"), messages.encode(letter), key=record.key
        )
        self._count_deadletter(record.topic)
        self.log.warning(
            "precompute.message.deadlettered",
            topic=record.topic,
            partition=record.partition,
            offset=record.offset,
            error=error,
        )

    def _count_deadletter(self, topic: str) -> None:
        self.stats.deadlettered += 1

    def _on_request_record(self, record: Received) -> None:
        msg = record.message
        if isinstance(msg, messages.Request):
            self.on_request(msg)

    def on_request(self, msg: messages.Request) -> None:
        """A request of the region: remember its user (and what the store already holds)."""
        if msg.region != self.region or self.planner is None:
            return
        self.stats.requests += 1
        try:
            seg = self.config.segment_index(msg.segment)
        except KeyError:
            self.stats.unknown_segment += 1
            if self.stats.unknown_segment == 1:
                self.log.warning(
                    "precompute.segment.unknown", region=self.region, segment=msg.segment
                )
            return
        book = self.planner.users
        known = msg.user in book
        t_visit = self.scenario_time(msg.ts)
        book.observe(msg.user, seg, t_visit)
        if not known:
            stored = self.store.lookup(self.region, msg.user, self._wall())
            if stored is not None:
                as_of = self.scenario_time(stored.ts)
                book.set_stored(msg.user, as_of, self.scenario_time(stored.expires_at))
        # the staleness of the visits the value signals measure: a live result of the visit's
        # segment at the visit's time (served, or held out: the holdout draw ignores its age)
        found = self.store.lookup(self.region, msg.user, msg.ts)
        if found is not None and found.segment == msg.segment and msg.ts >= found.ts:
            self.calibrator.observe_staleness(seg, t_visit - self.scenario_time(found.ts), t_visit)
        self.metrics.users.labels(self.region).set(len(book))

    def _on_value_record(self, record: Received) -> None:
        msg = record.message
        if isinstance(msg, messages.ValueSignal):
            self.on_value(msg)

    def on_value(self, msg: messages.ValueSignal) -> None:
        """A value signal: kept when it is of this region and lever ``precompute`` (others are
        counted and ignored); the model is rebuilt from it at the next window. Every signal of
        the region also goes into the value book whose mean value signal per stratum prices the
        live alternative."""
        if msg.region == self.region:
            self.value_book.add({value_key(msg): arm_stats(msg)})
        if self.calibrator.add_signal(msg, self.scenario_time(msg.ts)):
            self.stats.value_signals += 1
        else:
            self.stats.value_ignored += 1

    def recalibrate(self, t: float) -> list[SegmentCalibration]:
        """Rebuild the planner's uplift model from the curves and the measured values, and
        report every segment whose scale or status changed (``precompute.uplift.rescaled``).
        Returns the segments reported."""
        if self.planner is None or self._curves_uplift is None:
            return []
        self.calibrator.advance(t)
        model, cals = self.calibrator.calibrate(self._curves_uplift)
        self.value_book.decay(self._value_decay)
        live = self.live_alternative(self._wall())
        self.planner.uplift = model if live is None else model.against_live(live)
        self._log_live(live, self.live, model)
        self.live = live
        self.calibration = {c.index: c for c in cals}
        threshold = self.calibrator.settings.report_change
        changed = []
        for c in cals:
            previous = self._reported.get(c.index)
            if c.changed_from(previous, threshold):
                changed.append(c)
                self._reported[c.index] = c
                self.stats.rescaled += 1
                self._event(
                    "precompute.uplift.rescaled",
                    {
                        **c.event_fields(),
                        "previous_scale": 1.0 if previous is None else round(previous.scale, 6),
                        "lifetime_s": round(model.lifetime(c.index), 1),
                        "t": t,
                    },
                )
        return changed

    def on_capacity(self, msg: messages.Capacity) -> None:
        """A capacity level of the region (:class:`headroom.defences.capacity.CapacityBook`:
        newest ``ts`` wins per (resource, hardware, pool, remote)); jobs drawing more than a pool
        now has stop at once."""
        if msg.region != self.region or not self.capacity.apply(CapacityLevel.of(msg)):
            return
        stopped = self._refresh_pools(self.scenario_time())
        if stopped:
            release_ms = max(self._wall() - msg.ts, 0.0) * 1000.0
            self.stats.releases_ms.append(release_ms)
            self._event(
                "optional.released",
                {
                    "resource": msg.resource,
                    "hardware": msg.hardware,
                    "pool": msg.pool,
                    "remote": msg.remote,
                    "t": self.scenario_time(),
                    "release_ms": release_ms,
                    "dropped": {"rma_candidates": 0, "sbm_requests": 0, "precompute_jobs": stopped},
                },
            )

    def on_target(self, msg: messages.Target, budget: float | None) -> None:
        """The newest epoch of the region's targets (and its optional precompute budget)."""
        if msg.region != self.region:
            return
        if self._target is not None and msg.epoch < self._target.epoch:
            return
        levels = dict(msg.rma.levels) if msg.rma.levels is not None else {}
        extras = float(max(min(msg.rma.candidates, msg.rma.max) - msg.rma.base, 0))
        self._target = _Target(msg.epoch, msg.ts, msg.ttl_s, budget, levels, extras)
        self.stats.targets += 1

    def _log_live(
        self,
        live: np.ndarray[Any, np.dtype[np.float64]] | None,
        before: np.ndarray[Any, np.dtype[np.float64]] | None,
        model: UpliftModel,
    ) -> None:
        """Log the live alternative when it appears, lapses or moves by the calibrator's
        ``report_change`` share in a segment, with the lifetimes it leaves."""
        if live is None and before is None:
            return
        if live is not None and before is not None:
            tol = self.calibrator.settings.report_change
            if np.all(np.abs(live - before) <= tol * np.maximum(np.abs(before), 1e-12)):
                return
        assert self.planner is not None
        uplift = self.planner.uplift
        self.log.info(
            "precompute.live.priced",
            region=self.region,
            live=None
            if live is None
            else {s: round(float(v), 6) for s, v in zip(self._seg_names, live, strict=True)},
            lifetimes_s={s: round(uplift.lifetime(i), 1) for i, s in enumerate(self._seg_names)},
            lifetimes_base_s={
                s: round(model.lifetime(i), 1) for i, s in enumerate(self._seg_names)
            },
        )

    def live_alternative(self, wall: float) -> np.ndarray[Any, np.dtype[np.float64]] | None:
        """What live RMA adds to a visit of each segment under the target in force at ``wall``
        (:func:`headroom.controllers.precompute.live_alternative`); None without a live target
        (none yet, or expired: the clients run the baseline), a curve or value signals yet."""
        tg = self._target
        curve = self._rma_curve
        if tg is None or curve is None or wall > tg.ts + tg.ttl_s:
            return None
        means = self.value_book.signal_means()
        return live_alternative(curve, self._seg_names, tg.levels, means, tg.extras)

    def levels(self, t: float) -> list[CapacityLevel]:
        """The region's levels at scenario time ``t``, lifetimes in scenario seconds. The book
        keeps the wire's wall clock (a level lapses ``expires_in_s`` wall seconds after its
        ``ts``, as in the servers and the controller); the core plans in scenario time."""
        speed = self.settings.speed
        return [
            replace(
                level,
                ts=t,
                expires_in_s=None if level.expires_in_s is None else level.expires_in_s * speed,
            )
            for level in self.capacity.levels(self.wall_time(t))
        ]

    def _refresh_pools(self, t: float) -> int:
        cfg = self.config
        pools = usable_pools(
            self.levels(t),
            t,
            use=CapacityUse.ASYNC,
            hardware=cfg.costs.strong_hardware,
            min_lifetime_s=0.0,  # running jobs keep a pool until it lapses (then it is 0)
            safety_margin=cfg.safety_margin,
        )
        stopped = self.jobs.set_pools(pools, t)
        for job in stopped:
            self._payloads.pop(job.id, None)
            if self.planner is not None:
                self.planner.users.set_inflight(job.user, False)
        if stopped:
            self.stats.wasted_partial += len(stopped)
            self._window(t).wasted_partial += len(stopped)
            self.metrics.jobs.labels(self.region, "stopped").inc(len(stopped))
            self._account_usage(t)
            self.log.info(
                "precompute.jobs.stopped", region=self.region, jobs=len(stopped), t=round(t, 3)
            )
        self.metrics.inflight.labels(self.region).set(len(self.jobs.jobs))
        return len(stopped)

    # -- the schedule -----------------------------------------------------------------------------

    def current_rate(self, wall: float) -> tuple[float, str]:
        """Jobs per scenario second allowed now, and why."""
        cfg = self.config
        tgt = self._target
        if tgt is None:
            return cfg.default_jobs_per_s, "default"
        if wall > tgt.ts + tgt.ttl_s:
            return 0.0, "target_expired"
        if tgt.budget is None:
            return cfg.default_jobs_per_s, "default"
        return own_rate(tgt.budget, self._lever_job, cfg.job_cost), "target"

    async def _schedule_loop(self) -> None:
        """Rounds every ``tick_s``, or as soon as the next job ends; ends on a stop request
        (the drain then runs the last rounds itself)."""
        while not self.stop_requested:
            await self.step()
            delay = self.settings.tick_s
            nxt = self.jobs.next_end()
            if nxt is not None:
                delay = min(delay, max(self.wall_time(nxt) - self._wall(), 0.0) + 1e-3)
            if not await self.sleep(delay):
                return

    async def step(self) -> None:
        """One scheduling round at the current time."""
        if self.planner is None or self.world is None:
            return
        wall = self._wall()
        t = self.scenario_time(wall)
        rate, reason = self.current_rate(wall)
        if reason != self._rate_reason:
            self._rate_reason = reason
            self.log.info(
                "precompute.rate.changed", region=self.region, jobs_per_s=rate, reason=reason
            )
        self.bucket.set_rate(rate, t)
        self.metrics.rate.labels(self.region).set(rate)
        window = math.floor(t / self._window_s)
        if window != self._calibrated_window:  # once per SLO window of scenario time
            self._calibrated_window = window
            self.recalibrate(t)
        self._refresh_pools(t)
        await self._complete(t)
        await self._expire(wall, t)
        if not self._draining and not self.stop_requested:
            await self._start_jobs(t)
        await self._flush_windows(final=False)
        await self._send_outbox()

    async def _start_jobs(self, t: float) -> None:
        assert self.planner is not None
        assert self.world is not None
        k = min(self.bucket.available(t), self.jobs.capacity())
        if k <= 0:
            return
        picks = self.planner.select(t, k)
        if not picks:
            return
        started = self.jobs.start(t, [(p.user, p.segment) for p in picks])
        if not started:
            return
        self.bucket.take(len(started))
        self.stats.jobs_started += len(started)
        book = self.planner.users
        explored = {p.user for p in picks if p.explored}
        for job in started:
            book.set_inflight(job.user, True)
        self._window(t).explored += sum(1 for j in started if j.user in explored)
        self.metrics.inflight.labels(self.region).set(len(self.jobs.jobs))
        by_segment: dict[int, list[Job]] = {}
        for job in started:
            by_segment.setdefault(job.segment, []).append(job)
        cfg = self.config
        world = self.world
        for segment, jobs in by_segment.items():
            users = [j.user for j in jobs]
            rankings = await asyncio.to_thread(
                rank_batch, world, users, segment, cfg.candidates, t, cfg.keep
            )
            for job, ranking in zip(jobs, rankings, strict=True):
                if job.id in self.jobs.jobs:  # not stopped by a reclaim meanwhile
                    self._payloads[job.id] = (ranking, t)

    async def _complete(self, t: float) -> None:
        done = self.jobs.due(t)
        if not done:
            return
        assert self.planner is not None
        cfg = self.config
        cost = messages.Cost(
            cpu_ms=cfg.job_cost.cpu_s * 1000.0, accelerator_ms=cfg.job_cost.accelerator_s * 1000.0
        )
        book = self.planner.users
        wall = self._wall()
        win = self._window(t)
        for job in done:
            book.set_inflight(job.user, False)
            payload = self._payloads.pop(job.id, None)
            if payload is None:
                continue  # its ranking never finished (cannot happen unless the thread failed)
            ranking, as_of = payload
            life = self.planner.uplift.lifetime(job.segment)
            result = messages.Precompute(
                ts=self.wall_time(as_of),
                region=self.region,
                user=job.user,
                segment=self._seg_names[job.segment],
                model="strong",
                expires_at=self.wall_time(as_of + life),
                ranking=ranking,
                cost=cost,
            )
            self.store.put(result, wall)
            book.set_stored(job.user, as_of, as_of + life)
            await self._send("precompute", messages.encode(result), result.key())
            self.stats.published += 1
            win.jobs += 1
            win.by_segment[result.segment] += 1
        self.stats.jobs_completed += len(done)
        self.metrics.jobs.labels(self.region, "completed").inc(len(done))
        self.metrics.results.labels(self.region, "published").inc(len(done))
        self.metrics.inflight.labels(self.region).set(len(self.jobs.jobs))
        self._account_usage(t)

    async def _expire(self, wall: float, t: float) -> None:
        expired = self.store.expire(wall)
        results = expired.all
        if not results:
            return
        book = self.planner.users if self.planner is not None else None
        for result in results:
            await self._send("precompute", None, result.key())
            if book is not None:
                book.clear_stored(result.user)
        self.stats.tombstoned += len(results)
        self._window(t).expired += len(results)
        self.metrics.results.labels(self.region, "tombstoned").inc(len(results))

    def _account_usage(self, t: float) -> None:
        st = self.jobs.stats
        cpu0, acc0 = self._last_job_stats
        win = self._window(t)
        win.cpu_unit_s += st.cpu_unit_s - cpu0
        win.accelerator_unit_s += st.accelerator_unit_s - acc0
        self._last_job_stats = (st.cpu_unit_s, st.accelerator_unit_s)

    # -- output ---------------------------------------------------------------------------------

    async def _send(self, kind: str, value: bytes | None, key: bytes | None) -> None:
        if self._producer is None or self.kafka is None:
            return
        future = await self._producer.send(self.kafka.topic(kind), value, key=key)
        self._pending.append(future)
        if len(self._pending) >= 256:
            await self._settle()

    async def _settle(self) -> None:
        """Wait for the broker's acknowledgement of everything sent; a failed write stops the
        worker (a lost result or tombstone would break the topic's promise)."""
        pending, self._pending = self._pending, []
        for result in await asyncio.gather(*pending, return_exceptions=True):
            if isinstance(result, BaseException):
                raise KafkaUnavailable(f"could not write to Kafka: {result}") from result

    async def _send_outbox(self) -> None:
        # an event leaves the outbox once the producer holds it: a round cancelled by the stop
        # in the middle of a send leaves the rest to the stop's own send (on_stop)
        while self._outbox:
            event = self._outbox[0]
            await self._send("events", messages.encode(event), event.key())
            self._outbox.popleft()
        if self._pending:
            await self._settle()

    def _window(self, t: float) -> _Window:
        k = math.floor(t / self._window_s)
        win = self._windows.get(k)
        if win is None:
            win = self._windows[k] = _Window()
        return win

    async def _flush_windows(self, *, final: bool) -> None:
        current = math.floor(self.scenario_time() / self._window_s)
        for k in sorted(self._windows):
            if k >= current and not final:
                continue
            win = self._windows.pop(k)
            if win.empty():
                continue
            bounds = {"t_start": k * self._window_s, "t_end": (k + 1) * self._window_s}
            ts = self.wall_time((k + 1) * self._window_s)
            self._event(
                "precompute.job.completed",
                {
                    **bounds,
                    "jobs": win.jobs,
                    "by_segment": dict(sorted(win.by_segment.items())),
                    "explored": win.explored,
                    "wasted_partial": win.wasted_partial,
                    "jobs_per_s": self.bucket.rate,
                    "rate_reason": self._rate_reason,
                    "users": len(self.planner.users) if self.planner is not None else 0,
                },
                ts=ts,
            )
            if win.expired:
                self._event("precompute.result.expired", {**bounds, "expired": win.expired}, ts=ts)
            self._event(
                "window",
                window_event(
                    bounds["t_start"],
                    bounds["t_end"],
                    used_unit_s={"cpu": win.cpu_unit_s, "accelerator": win.accelerator_unit_s},
                    precompute={"jobs": win.jobs, "wasted_partial": win.wasted_partial},
                ),
                ts=ts,
            )

    def _event(self, kind: str, fields: dict[str, Any], ts: float | None = None) -> None:
        """Log an event and queue it for the events topic (sent at the end of the round)."""
        extra = {"policy": self.settings.policy, **fields}
        self.log.info(kind, region=self.region, **extra)
        event = messages.Event(
            ts=self._wall() if ts is None else ts,
            kind=kind,
            source="precompute",
            region=self.region,
            extra=extra,
        )
        self.events.append(event)
        if self._producer is not None:
            self._outbox.append(event)
