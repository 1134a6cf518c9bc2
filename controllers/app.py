"""The Faust controller app: hosts the pure control cores on Kafka (``headroom controller``).

The one module that imports faust for control. Built by :func:`create_app` from
:class:`ControllerSettings` — never at module level — so tests and several deployments can run
side by side with their own app ids and topic prefixes.

Data flow (topics of docs/messages.md, names with the configured prefix):

* ``latency`` agent — validates each message, folds its sketch into the region's window
  (:class:`headroom.controllers.observe.RegionAggregator`); bad bytes go to the dead-letter topic.
* ``capacity`` agent — newest level per (region, resource, hardware, pool), also kept in the
  ``capacity`` table so a restarted worker knows the levels before the next announcement. A
  level that changes the region's capacity materially between ticks (``ControlPlane.reacts``,
  controllers/react.py) steps the region at once, as a tick would, under the lock the clock
  holds while it steps (``Controller.step_lock``).
* ``value`` agent — value-signal sums per (region, segment, lever, arm) for the window. A signal
  that carries its ``producer`` and ``seq`` is counted once: the newest ``seq`` of each producer
  (a client's process start) is kept in the ``value_seen`` table (changelogged, so it survives a
  restart), and a signal at or below it — a re-delivery after a restart — is dropped and counted
  as a duplicate. Every second the counts go out as a ``value.counted`` event. A worker that
  loses a partition, even for a moment in a rebalance, sets its producers' books aside and
  resumes from the newer of that book and the table's record (``Controller.resume_book``). A
  read mark per value partition in the same table (every offset below it processed:
  :mod:`headroom.controllers.read_marks`) is where a worker that takes the partition reads
  again from, since Faust's commit can run past signals not processed yet.
* liveness (:mod:`headroom.controllers.liveness`) — a control step counts as live when the
  consumer delivered a latency or capacity message since the previous one; with no live step
  within 3 intervals (and 30 s) while the broker answers, the app logs
  ``controller.liveness.failed`` and exits with status 3, so a supervisor restarts it (a broker
  that does not answer is waited for).
* stall seam — SIGUSR1 pauses the fetching of every partition the app's consumer holds (what a
  consumer that stopped fetching after a rebalance does: the process runs, the broker answers,
  input keeps arriving and is not read), SIGUSR2 resumes it; ``controller.stall.injected`` /
  ``controller.stall.resumed`` log lines. ``headroom up`` sends them for a scenario's ``stall``
  fault (docs/scenarios.md); nothing else does. The liveness check is tested through it.
* a clock at ``t0 + k × interval_s`` (k = 1, 2, …: the instants the simulator steps at, scenario
  time ``k × interval_s``; :func:`next_step`; a step that fell due while the process was paused
  runs as soon as it resumes) — for each region heard of: observation →
  ``ControlPlane.step``
  (allocator → RMA PID → SBM coverage → router) → one ``targets`` message keyed by region, one
  ``target.issued`` event (``events`` topic and the structured log) with its inputs and reasons;
  then the plane's snapshot goes to the ``state`` table.

Restart: tables are changelogged to Kafka; on the first tick after a (re)start the plane is
restored from the ``state`` table, so epochs keep increasing and the PID resumes from its last
output (bumpless: the first new target is within one rate-limit step of the last one). The
snapshot also holds which value signals its books hold (their seqs and the read mark when the
window was taken, ``value_folded``): the successor reads the value partition again from that
mark and folds, once, what its predecessor folded after the snapshot
(``Controller.fold_decision``).

Several controllers (scaling out, docs/streaming.md): processes with the same app id form one
consumer group; Kafka's group assignment (Faust's co-partitioning assignor) gives each the same
partition numbers of every region-keyed topic and of the tables' changelogs. A worker acts only on
the regions whose partition (:func:`headroom.streams.topics.region_partition`) it holds
(:func:`owned_regions`): the agents see only those partitions' messages, every table record of a
region is written to the region's partition (the ``state`` table is keyed by region, the
``capacity`` and ``value_seen`` records are written from the region's stream), and the clock
steps only the regions it owns. A region a worker gains is adopted from the tables at its next
step (plane state, capacity levels, value books); a region it loses is dropped at once. Epochs
never go back across a hand-over: the new owner continues from the epoch in the region's
changelogged state (``previous + 1``), and an epoch is at least ``floor(now)`` of the step that
issued it, so even a step whose snapshot was lost outranks every earlier one (same clock).
The group settings (:func:`group_timeouts`) make a dead worker's regions move within
about ``session timeout + a second`` and be stepped at the next control step after that.

Processing guarantee: at-least-once (Faust commits after the agent processed a message). Latency
and value windows are sums, so a re-delivered message after a crash can count twice in one window;
the controllers treat one window's noise as they treat any noise (rate limits, filtered
derivative), which is why at-least-once is enough here — exactly-once would cost a transaction per
commit for no control benefit (and has open faust issues, see docs/kafka.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import signal
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import faust
from faust.exceptions import PartitionsMismatch

from headroom.controllers.config import ControlConfig
from headroom.controllers.levers import RmaCurve
from headroom.controllers.liveness import Liveness
from headroom.controllers.observe import RegionAggregator
from headroom.controllers.plane import ControlPlane
from headroom.controllers.read_marks import ReadMarks, covers, mark_key, merge_seqs, take_seq
from headroom.controllers.types import CapacityLevel, RegionTargets
from headroom.kernel import seeds
from headroom.kernel.codec import ValidationError, dumps, loads
from headroom.kernel.logs import get_logger
from headroom.kernel.scenario import Scenario
from headroom.streams import messages
from headroom.streams.broker import probe_async
from headroom.streams.kafka import make_consumer, started
from headroom.streams.security import PLAINTEXT, ClientSecurity
from headroom.streams.topics import region_partition, spec_for, topic_name
from headroom.world.curves import curves_for

log = get_logger("controller")

# The group's timeouts (seconds, see group_timeouts): the broker evicts a member it has not heard
# from within the session timeout, which Kafka bounds below by group.min.session.timeout.ms (6 s
# by default)
MIN_SESSION_TIMEOUT_S = 6.0
MAX_SESSION_TIMEOUT_S = 10.0
LIVENESS_EXIT = 3  # the exit status of a controller that found itself stalled
LIVENESS_PROBE_S = 3.0  # before a liveness exit: does the broker answer a metadata request?
# seqs below a producer's newest not seen yet, kept per producer (the oldest go first)
# a value partition is read again when this many offsets above its read mark were processed
# while the mark waited (and again each time as many more were), and for at most this long
REREAD_LAG = 200
REREAD_TIMEOUT_S = 30.0
VALUE_COUNTS_EVERY_S = 1.0  # how often the value signals' counts are published (when changed)


@dataclass(frozen=True)
class ControllerSettings:
    bootstrap: str
    prefix: str
    scenario: Scenario
    # control interval and target lifetime, wall seconds; None: the scenario's ``control``
    # section (ttl: the file's, else 3 intervals)
    interval_s: float | None = None
    ttl_s: float | None = None
    # wall-clock time of scenario time 0: the control steps fall at t0 + k × interval_s
    t0: float = 0.0
    app_id: str | None = None  # default: "<prefix>controller"
    data_dir: Path = Path(".headroom/controller")
    seed: int = 0
    partitions: int = (
        4  # must match the region-keyed topics (headroom.streams.topics.DEFAULT_PARTITIONS)
    )
    # share of requests eligible for the strong model; None: the scenario's ``eligible_share``
    # (1.0 when it gives none), as the simulator reads it
    eligible_share: float | None = None
    # the cluster's credentials (``--kafka-config``) and the replication of the app's own
    # changelog topics (the cluster's topics' replication factor)
    security: ClientSecurity = PLAINTEXT
    replication_factor: int = 1

    @property
    def id(self) -> str:
        return self.app_id or f"{self.prefix}controller"


class Controller:
    """The state the agents share: the aggregator, the plane, and the publishing helpers."""

    def __init__(self, settings: ControllerSettings, config: ControlConfig) -> None:
        self.settings = settings
        self.config = config
        scenario = settings.scenario
        eligible = settings.eligible_share
        if eligible is None:
            eligible = 1.0 if scenario.eligible_share is None else scenario.eligible_share
        self.aggregator = RegionAggregator(
            eligible_share=eligible, treat_share=1.0 - scenario.world.holdout
        )
        self.rng = seeds.process_rng(settings.seed)
        self.plane = ControlPlane(config, self.rng, rma_curve=rma_curve(settings.scenario))
        self.restored = False
        self.deadlettered = 0  # messages this worker sent to the dead-letter topic
        self.liveness = Liveness(config.interval_s)
        # value signals per producer: [newest seq, counted, duplicates dropped, value counted,
        # gaps] (count_value)
        self.value_seen: dict[str, list[Any]] = {}
        self.value_unattributed = 0  # signals without a producer id: counted, never de-duplicated
        self.value_changed = False
        self.value_partition: dict[str, int] = {}  # producer -> partition its signals came on
        # the books of producers whose partition was released: (partition, book), until the
        # producer's next signal or the partition's return (resume_book); one per client process
        self.value_released: dict[str, tuple[int, list[Any]]] = {}
        self.read_marks = ReadMarks()  # per value partition: every offset below was processed
        # the value signals folded into the books (fold_decision): per producer its seqs
        # (newest, gaps) and region; per value partition the offset below which the snapshot
        # adopted holds every signal, and the partitions to read again from there
        self.folded: dict[str, tuple[int, list[int]]] = {}
        self.folded_region: dict[str, str] = {}
        self.fold_from: dict[int, int] = {}
        self.fold_reread: dict[int, int] = {}
        self.fold_capture: dict[str, dict[str, Any]] = {}  # region -> its next snapshot's part
        self.reread_lag: dict[int, int] = {}  # per partition: the lag that reads it again
        self.owned: set[str] = set()  # the regions this worker steps (adopted from the tables)
        # held while a region is stepped (the clock's ticks, the capacity agent's extra steps)
        self.step_lock = asyncio.Lock()

    def reacts(self, region: str, before: tuple[CapacityLevel, ...], now: float, t0: float) -> bool:
        """A step of ``region`` now, between ticks, for the change of its capacity levels from
        ``before`` to the aggregator's (:meth:`ControlPlane.reacts`): only for a region this
        worker owns, after its tables were adopted, with latency heard since its last step."""
        if not self.restored or region not in self.owned:
            return False
        if not self.aggregator.heard(region):
            return False
        after = self.aggregator.capacity(region, now)
        return self.plane.reacts(region, now, before, after, t0=t0)

    def count_value(self, msg: messages.ValueSignal, stored: bytes | None) -> bool:
        """Count one value signal; False for a duplicate (its producer's ``seq`` already seen).
        ``stored``: the ``value_seen`` table's record for the producer (after a restart).

        The record is ``[newest seq, counted, duplicates dropped, value counted, gaps]``:
        ``gaps`` are the seqs below the newest not seen yet. A signal may be processed after a
        later one of its producer (after a rebalance the app goes on with records it had
        buffered while the partition is read again from the committed offset), so a seq below
        the newest is a duplicate only if it is not a gap."""
        self.value_changed = True
        if msg.producer is None or msg.seq is None:
            self.value_unattributed += 1
            return True
        book = self.value_seen.get(msg.producer)
        if book is None:
            book = self.resume_book(msg.producer, stored)
        newest = take_seq(int(book[0]), book[4], msg.seq)
        if newest is None:
            book[2] += 1
            return False
        book[0] = newest
        book[1] += 1
        book[3] += msg.value_sum
        return True

    def resume_book(self, producer: str, stored: bytes | None) -> list[Any]:
        """The value book of ``producer`` once more in :attr:`value_seen`: the newer of the one
        this worker held when it released the producer's partition and the table's ``stored``
        record. The table's record can trail what this worker counted: after a rebalance that
        gave the partition straight back, the table is recovered from its changelog while the
        agent goes on with buffered records, so the newest writes are overwritten by older ones
        (a signal whose offset is committed would be neither counted nor re-delivered). Another
        worker that held the partition meanwhile counted on from the table, so its record is
        the newer then. A producer's count only grows, so the larger count is the newer book."""
        held = self.value_released.pop(producer, None)
        table = _value_book(stored)
        book = table if held is None or _book_order(table) >= _book_order(held[1]) else held[1]
        if held is not None:
            log.info(
                "controller.value.resumed",
                producer=producer,
                source="table" if book is table else "held",
                counted=int(book[1]),
                table_counted=int(table[1]),
            )
        self.value_seen[producer] = book
        return book

    def regain_values(self, partitions: set[int], table: Any) -> None:
        """Take back the released value books whose partitions this worker holds again
        (:meth:`resume_book` against the ``value_seen`` table)."""
        for producer, (part, _book) in list(self.value_released.items()):
            if part in partitions and producer not in self.value_seen:
                self.resume_book(producer, table.get(producer))
                self.value_partition[producer] = part

    def fold_decision(
        self, msg: messages.ValueSignal, fresh: bool, partition: int | None, offset: int | None
    ) -> bool:
        """Whether to fold ``msg`` into the books: once per (producer, seq), like the count, but
        kept apart from it. The books are the plane's snapshot plus what was folded since, so a
        worker that adopted a snapshot folds a signal its predecessor counted after that
        snapshot (its fold died with it) and nothing below the snapshot's mark
        (``fold_from``). Without an adopted snapshot for the partition: a signal is folded when
        it is counted (``fresh``). A signal without a producer id: when counted."""
        producer, seq = msg.producer, msg.seq
        if producer is None or seq is None:
            return fresh
        newest, gaps = self.folded.get(producer, (-1, []))
        start = self.fold_from.get(partition) if partition is not None else None
        if start is None:
            fold = fresh
        elif offset is not None and offset < start:
            fold = False
        else:
            fold = not covers(newest, gaps, seq)
        if fold:
            taken = take_seq(newest, gaps, seq)
            if taken is not None:
                self.folded[producer] = (taken, gaps)
                self.folded_region[producer] = msg.region
        return fold

    def capture_folds(self, region: str) -> None:
        """At the moment ``region``'s window is taken into the plane: what the next snapshot
        holds of the value signals (every one folded so far, and every offset below the read
        mark of the region's value partition)."""
        part = region_partition(region, self.settings.partitions)
        self.fold_capture[region] = {
            "books": {
                p: [b[0], list(b[1])]
                for p, b in sorted(self.folded.items())
                if self.folded_region.get(p) == region
            },
            "mark": [part, self.read_marks.low(part)],
        }

    def adopt_folds(self, region: str, fold: Mapping[str, Any]) -> None:
        """The value signals the adopted snapshot of ``region`` holds (:meth:`capture_folds`):
        the books' seqs join those folded here, and the partition is read again from the
        snapshot's mark, so what its predecessor folded after the snapshot is folded again."""
        for producer, (newest, gaps) in dict(fold.get("books", {})).items():
            got = (int(newest), [int(g) for g in gaps])
            cur = self.folded.get(producer)
            self.folded[producer] = got if cur is None else merge_seqs(cur, got)
            self.folded_region[producer] = region
        part, mark = fold.get("mark", [None, None])
        if part is not None and mark is not None:
            self.fold_from[int(part)] = int(mark)
            self.fold_reread[int(part)] = int(mark)
        self.fold_capture[region] = dict(fold)

    def read_mark(self, partition: int, offset: int, table: Any) -> int | None:
        """Before the first signal of ``partition`` this worker processes since it got the
        partition: its mark from the ``value_seen`` table (:mod:`headroom.controllers.read_marks`);
        the offset to read again from when the mark is below ``offset`` (signals below it that
        no book has: counted when read again), else None."""
        if self.read_marks.known(partition):
            return None
        raw = table.get(mark_key(partition))
        low = int(loads(raw)) if raw else None
        if low is None:  # nothing processed here before (or by a version without marks)
            self.read_marks.start(partition, offset)
            return None
        self.read_marks.start(partition, low)
        return low if low < offset else None

    def value_counts(self) -> dict[str, Any]:
        """The ``value.counted`` event's fields."""
        return {
            "counted": int(sum(b[1] for b in self.value_seen.values())) + self.value_unattributed,
            "duplicates_dropped": int(sum(b[2] for b in self.value_seen.values())),
            "unattributed": self.value_unattributed,
            "producers": {
                p: {
                    "seq": int(b[0]),
                    "counted": int(b[1]),
                    "duplicates_dropped": int(b[2]),
                    "value_sum": b[3],
                    "missing": len(b[4]),
                }
                for p, b in sorted(self.value_seen.items())
            },
        }

    def adopt(self, region: str, state: dict[str, Any] | None) -> None:
        """Take ``region`` over: its plane state from the ``state`` table's record (a plane
        snapshot holding that region; None: start afresh), the other regions untouched."""
        snap = self.plane.snapshot()
        regions = dict(snap["regions"])
        got = None if not state else dict(state.get("regions", {})).get(region)
        if got is not None:
            regions[region] = got
        else:
            regions.pop(region, None)
        self.plane.restore({**snap, "regions": regions})
        self.owned.add(region)
        fold = state.get("value_folded") if state else None
        if isinstance(fold, Mapping):
            self.adopt_folds(region, fold)
        epoch = None if got is None else got.get("epoch")
        log.info("controller.region.adopted", region=region, restored=got is not None, epoch=epoch)

    def release(self, regions: set[str], partitions: set[int]) -> None:
        """Drop ``regions`` (their partitions moved to another worker) and set aside the value
        books of the producers whose signals came on ``partitions``: the new owner continues
        from the tables; were they regained later, they are adopted from the tables again (the
        value books from the newer of the table and the book set aside: :meth:`resume_book`)."""
        if regions:
            snap = self.plane.snapshot()
            kept = {r: st for r, st in snap["regions"].items() if r not in regions}
            self.plane.restore({**snap, "regions": kept})
            self.owned.difference_update(regions)
            log.info("controller.region.released", regions=sorted(regions))
        self.read_marks.forget(partitions)
        for p in partitions:
            self.reread_lag.pop(p, None)
            self.fold_from.pop(p, None)
            self.fold_reread.pop(p, None)
        for region in regions:
            self.fold_capture.pop(region, None)
        for producer, part in list(self.value_partition.items()):
            if part in partitions:
                del self.value_partition[producer]
                book = self.value_seen.pop(producer, None)
                if book is not None:
                    self.value_released[producer] = (part, book)


def capacity_level(msg: messages.Capacity) -> CapacityLevel:
    return CapacityLevel(
        resource=msg.resource,
        hardware=msg.hardware,
        pool=msg.pool,
        units=msg.units,
        expires_in_s=msg.expires_in_s,
        remote=msg.remote,
        ts=msg.ts,
    )


def rma_curve(scenario: Scenario) -> RmaCurve:
    """RMA's value curve for the control plane's per-stratum levels: the scenario world's
    curves (measured once and cached, :func:`headroom.world.curves.curves_for`), as the
    simulator's headroom policy builds it."""
    w = scenario.world
    names = [s.name for s in scenario.segments]
    return RmaCurve.from_curves(curves_for(scenario), names, w.base_candidates, w.max_candidates)


def targets_message(t: RegionTargets) -> messages.Target:
    return messages.Target(
        ts=t.ts,
        region=t.region,
        epoch=t.epoch,
        ttl_s=t.ttl_s,
        rma=messages.RmaTarget(
            candidates=t.rma_candidates,
            base=t.rma_base,
            max=t.rma_max,
            levels={s: tuple(v) for s, v in t.rma_levels.items()} or None,
        ),
        sbm=messages.SbmTarget(
            coverage=t.sbm_coverage,
            segments=dict(t.sbm_segments),
            explore=t.sbm_explore or None,
        ),
        budget=messages.Budget(cpu=t.budget_cpu, accelerator=t.budget_accelerator),
        reason=t.reason,
        precompute_jobs_per_s=t.precompute_jobs_per_s if t.precompute_jobs_per_s > 0 else None,
    )


def region_event(ts: float, region: str, kind: str, fields: dict[str, Any]) -> messages.Event:
    """One controller event for ``headroom.events`` (docs/events.md), policy ``headroom``."""
    return messages.Event(
        ts=ts, kind=kind, source="controller", region=region, extra={"policy": "headroom", **fields}
    )


def group_timeouts(interval_s: float) -> tuple[float, float, float]:
    """``(session timeout, heartbeat interval, rebalance timeout)`` in seconds of the
    controllers' consumer group for a control interval: the session timeout is half an interval
    within [:data:`MIN_SESSION_TIMEOUT_S`, :data:`MAX_SESSION_TIMEOUT_S`] (a killed worker is
    evicted after it, and its regions are stepped by their new owner at the next control step:
    within two intervals when the interval is at least the session timeout plus a few seconds
    of rebalance and recovery), heartbeats six times a session, and a rebalance may take a
    session (the survivors rejoin at their next heartbeat)."""
    session = min(MAX_SESSION_TIMEOUT_S, max(MIN_SESSION_TIMEOUT_S, interval_s / 2.0))
    return session, session / 6.0, session


def _value_book(stored: bytes | None) -> list[Any]:
    """A ``value_seen`` record as a book ``[newest seq, counted, duplicates dropped, value
    counted, gaps]`` (records written before value sums and gaps were kept have 3 fields)."""
    book = list(loads(stored)) if stored else [-1, 0, 0, 0.0, []]
    return book + ([0.0, []][len(book) - 3 :] if len(book) < 5 else [])


def _book_order(book: list[Any]) -> tuple[int, int]:
    """Which of two books of one producer is the newer: the one that counted more."""
    return int(book[1]), int(book[0])


def owned_regions(regions: set[str], partitions: set[int], count: int) -> set[str]:
    """The regions among ``regions`` whose partition (of ``count``) is in ``partitions``."""
    return {r for r in regions if region_partition(r, count) in partitions}


def next_step(now: float, t0: float, interval_s: float, last: int = 0) -> int:
    """The next control step after ``now``: the smallest ``k >= 1``, ``k > last``, with
    ``t0 + k × interval_s > now``. Steps missed while the process was paused (a control outage)
    are skipped, not made up, as in the simulator."""
    k = math.floor((now - t0) / interval_s) + 1 if math.isfinite(now - t0) else 1
    return max(1, last + 1, k)


def create_app(settings: ControllerSettings) -> tuple[faust.App, Controller]:
    """Build the Faust app and its shared state from settings."""
    config = _control_config(settings)
    ctl = Controller(settings, config)
    app = _faust_app(settings)
    _ignore_stall_signals()

    def topic(kind: str) -> Any:
        return app.topic(
            topic_name(kind, settings.prefix),
            key_type=bytes,
            value_type=bytes,
            key_serializer="raw",
            value_serializer="raw",
            partitions=spec_for(kind).partitions or settings.partitions,
        )

    latency_topic = topic("latency")
    capacity_topic = topic("capacity")
    value_topic = topic("value")
    targets_topic = topic("targets")
    events_topic = topic("events")
    deadletter_topic = topic("deadletter")

    capacity_table = app.Table(
        "capacity",
        default=None,
        partitions=settings.partitions,
        key_type=str,
        value_type=bytes,
    )
    state_table = app.Table(
        "state",
        default=None,
        partitions=settings.partitions,
        key_type=str,
        value_type=bytes,
        # keyed by region, written from the timer, outside any stream: the default partitioner
        # puts a region's record on the region's partition (same key bytes, same count)
        use_partitioner=True,
    )
    # keyed by producer, written from the value stream: a record goes to the partition of the
    # region whose signal it counts, so it moves with the region (a producer is one client
    # process, serving one region)
    value_seen_table = app.Table(
        "value_seen",
        default=None,
        partitions=settings.partitions,
        key_type=str,
        value_type=bytes,
    )

    async def deadletter(event: Any, error: ValidationError | str) -> None:
        await _deadletter(ctl, deadletter_topic, event, error)

    consumed = ctl.liveness.consumed

    @app.agent(latency_topic)
    async def latency_agent(stream: Any) -> None:
        async for _event, msg in _decoded(stream, "latency", deadletter, consumed):
            ctl.aggregator.add_latency(
                msg.region, msg.ts, msg.path, msg.count, msg.sketch, msg.samples_ms, msg.window_s
            )

    @app.agent(capacity_topic)
    async def capacity_agent(stream: Any) -> None:
        async for event, msg in _decoded(stream, "capacity", deadletter, consumed):
            level = capacity_level(msg)
            before = ctl.aggregator.capacity(msg.region, time.time())
            if ctl.aggregator.add_capacity(msg.region, level):
                key = f"{msg.region}|{msg.resource}|{msg.hardware}|{msg.pool}|{int(msg.remote)}"
                await _changelog_known(app, capacity_table, event.message.topic)
                capacity_table[key] = event.value
                await _react_step(
                    app, ctl, msg.region, before, (targets_topic, events_topic), state_table
                )

    @app.agent(value_topic)
    async def value_agent(stream: Any) -> None:
        # not counted for liveness: value signals come in bursts, one per client flush, and this
        # agent (a table write per signal) can lag its buffered records by minutes, which would
        # keep a stalled fetcher looking live (docs/streaming.md, *Faults*)
        async for event, msg in _decoded(stream, "value", deadletter):
            await _value_step(app, ctl, value_seen_table, event, msg)

    source_topics = {latency_topic.get_topic_name(), capacity_topic.get_topic_name()}
    tables = (state_table, capacity_table, value_seen_table)
    _log_assignments(app, source_topics)

    async def prepare() -> bool:
        # before the first step, once the tables are recovered: adopt the regions held and
        # write their snapshots back (the producer then knows the state table's changelog
        # before the first step has sent anything else)
        ctl.restored = True
        _take_ownership(app, ctl, source_topics, tables)
        return await _save_snapshot(app, ctl, state_table)

    async def run_tick(now: float) -> None:
        async with ctl.step_lock:
            mine = _take_ownership(app, ctl, source_topics, tables)
            for region in sorted(mine.intersection(ctl.aggregator.regions)):
                await _publish_region(ctl, region, now, targets_topic, events_topic)
            await _save_snapshot(app, ctl, state_table)
            _liveness_step(ctl, mine, now)

    @app.task  # type: ignore[untyped-decorator]
    async def control_clock() -> None:
        await _control_clock(app, settings.t0, config.interval_s, prepare, run_tick)

    @app.task  # type: ignore[untyped-decorator]
    async def watch() -> None:  # the value signals' counts and the liveness check
        await asyncio.gather(_value_counts_loop(app, ctl, events_topic), _watchdog(app, ctl))

    return app, ctl


async def _react_step(
    app: faust.App,
    ctl: Controller,
    region: str,
    before: tuple[CapacityLevel, ...],
    topics: tuple[Any, Any],
    state_table: Any,
) -> None:
    """A capacity level recorded between ticks: when the change is material and spaced
    (:meth:`Controller.reacts`, controllers/react.py), the region's step now, the same as a
    tick's, under the lock the clock holds while it steps (one step of a region at a time, and
    no snapshot of a half-stepped plane). An error is logged, never raised."""
    try:
        async with ctl.step_lock:
            now = time.time()
            if not ctl.reacts(region, before, now, t0=ctl.settings.t0):
                return
            await _publish_region(ctl, region, now, topics[0], topics[1])
            await _save_snapshot(app, ctl, state_table)
    except Exception:  # never stop the capacity agent
        log.exception("controller.react.failed", region=region)


def _log_assignments(app: faust.App, source_topics: set[str]) -> None:
    """Log every assignment of the group (``controller.partitions.assigned``: the partitions of
    the region-keyed topics this worker holds now), the moment a rebalance ends."""

    def assigned(_sender: Any, *args: Any, signal: Any = None, **kwargs: Any) -> None:
        tps = args[0] if args else kwargs.get("assigned", ())
        parts = sorted({tp.partition for tp in tps if tp.topic in source_topics})
        log.info("controller.partitions.assigned", partitions=parts)

    app.on_partitions_assigned.connect(cast(Any, assigned))  # mode types the handler narrowly


def _liveness_step(ctl: Controller, mine: set[str], now: float) -> None:
    """Tell the liveness check of a step. A worker that steps no region (more workers than
    regions, or none assigned yet) has nothing to consume, which is no stall: the check is
    disarmed until its first live step."""
    if mine:
        ctl.liveness.step(now)
    else:
        ctl.liveness.last_live = None


def _take_ownership(
    app: faust.App,
    ctl: Controller,
    source_topics: set[str],
    tables: tuple[Any, Any, Any],
) -> set[str]:
    """Release the regions whose partitions moved away, adopt those that came (module
    docstring) and take back the value books of partitions held again; the regions this worker
    steps now. ``tables``: the ``state``, ``capacity`` and ``value_seen`` tables."""
    state_table, capacity_table, value_seen_table = tables
    count = ctl.settings.partitions
    assigned = app.assignor.assigned_actives()
    partitions = {tp.partition for tp in assigned if tp.topic in source_topics}
    known = {r.name for r in ctl.settings.scenario.regions}
    regions = known | set(ctl.aggregator.regions) | ctl.owned
    mine = owned_regions(regions, partitions, count)
    lost = ctl.owned - mine
    if lost or ctl.value_partition:
        ctl.release(lost, set(range(count)) - partitions)
    for region in sorted(mine - ctl.owned):
        _adopt(ctl, region, state_table, capacity_table)
    if ctl.value_released:
        ctl.regain_values(partitions, value_seen_table)
    return mine


async def _value_step(
    app: faust.App, ctl: Controller, table: Any, event: Any, msg: messages.ValueSignal
) -> None:
    """One value signal of the value agent (:func:`_take_value`). An error is logged, never
    raised: a crashed agent is restarted by Faust, but in a diagnostic run each crash cost a
    signal that was then neither counted nor re-delivered (its offset committed)."""
    try:
        await _changelog_known(app, table, event.message.topic)
        partition, offset = int(event.message.partition), int(event.message.offset)
        marks = ctl.read_marks
        resume = ctl.read_mark(partition, offset, table)
        if resume is None and marks.lag(partition) >= ctl.reread_lag.get(partition, REREAD_LAG):
            resume = marks.low(partition)
        fold_low = ctl.fold_reread.pop(partition, None)  # an adopted snapshot's mark
        if fold_low is not None:
            resume = fold_low if resume is None else min(resume, fold_low)
        moved = False
        if resume is not None and resume < offset:
            await _read_again(ctl, table, event.message.tp, resume, offset)
            ctl.reread_lag[partition] = marks.lag(partition) + REREAD_LAG
            moved = True
        _take_value(ctl, msg, table, partition, offset)  # one read again is a duplicate there
        moved = marks.processed(partition, offset) or moved
        if moved:
            table[mark_key(partition)] = dumps(marks.low(partition))
    except Exception:
        log.exception("controller.value.failed", producer=msg.producer, seq=msg.seq)


async def _read_again(ctl: Controller, table: Any, tp: Any, low: int, until: int) -> None:
    """Process the value signals of ``tp`` from ``low`` to ``until`` (excluded) again, read
    with a consumer of its own: Faust drops what it reads again below the newest offset it
    delivered, so its own seek cannot do this. Each is counted and folded only if it was not
    yet (:meth:`Controller.count_value`, :meth:`Controller.fold_decision`). Runs inside the
    value agent's step of a record of ``tp``, so the table writes go to the partition's
    changelog."""
    partition = int(tp.partition)
    marks = ctl.read_marks
    consumer = make_consumer(ctl.settings.bootstrap)
    done = 0
    async with started(consumer, ctl.settings.bootstrap):
        consumer.assign([tp])
        earliest = int((await consumer.beginning_offsets([tp]))[tp])
        if earliest > low:  # gone from the topic (retention): nothing to read there
            marks.raise_to(partition, earliest)
        consumer.seek(tp, max(low, earliest))
        deadline = time.monotonic() + REREAD_TIMEOUT_S
        while await consumer.position(tp) < until:
            if time.monotonic() > deadline:
                log.warning("controller.value.reread_timeout", partition=partition, low=low)
                break
            for record in (await consumer.getmany(tp, timeout_ms=500)).get(tp, []):
                if record.offset >= until:
                    continue
                try:
                    msg = messages.decode("value", record.value)
                except ValidationError:  # dead-lettered when it was first read
                    msg = None
                # one without a producer id cannot be told from its first reading: skipped
                if isinstance(msg, messages.ValueSignal) and msg.producer and msg.seq is not None:
                    done += _take_value(ctl, msg, table, partition, record.offset, quiet=True)
                marks.processed(partition, record.offset)
    log.warning(
        "controller.value.reread", partition=partition, offset=low, until=until, counted=done
    )


def _take_value(
    ctl: Controller,
    msg: messages.ValueSignal,
    table: Any,
    partition: int | None = None,
    offset: int | None = None,
    *,
    quiet: bool = False,
) -> bool:
    """Count a value signal once (:meth:`Controller.count_value`, its producer's record in the
    ``value_seen`` table) and fold it into the books once (:meth:`Controller.fold_decision`,
    keyed by (segment, value bin) where it has one); True when it was counted. ``partition``,
    ``offset``: where the signal came from; ``quiet``: no log line for a duplicate."""
    producer = msg.producer
    fresh = ctl.count_value(msg, table.get(producer) if producer else None)
    if ctl.fold_decision(msg, fresh, partition, offset):
        ctl.aggregator.add_value_signal(msg)
    if not fresh and not quiet:
        log.info("controller.value.duplicate", producer=producer, seq=msg.seq)
    if producer is not None:
        if partition is not None:
            ctl.value_partition[producer] = partition
        # last: should the write fail, the signal is in the books and the producer's next
        # write carries its count
        table[producer] = dumps(ctl.value_seen[producer])
    return fresh


async def _value_counts_loop(app: faust.App, ctl: Controller, events_topic: Any) -> None:
    """Every :data:`VALUE_COUNTS_EVERY_S`, when they changed: the ``value.counted`` event."""
    while not app.should_stop:
        await app.sleep(VALUE_COUNTS_EVERY_S)
        if not ctl.value_changed:
            continue
        ctl.value_changed = False
        ev = messages.Event(
            ts=time.time(),
            kind="value.counted",
            source="controller",
            region=None,
            extra={"policy": "headroom", **ctl.value_counts()},
        )
        try:
            await events_topic.send(key=b"", value=messages.encode(ev))
        except Exception as exc:  # the next change sends them again
            ctl.value_changed = True
            log.warning("controller.value_counts.failed", error=f"{type(exc).__name__}: {exc}")


STALL_SIGNAL = signal.SIGUSR1  # the stall seam: pause fetching every assigned partition
RESUME_SIGNAL = signal.SIGUSR2  # ... and resume it


def _ignore_stall_signals() -> None:
    """Until the seam is installed (the app running), a stall signal does nothing (its default
    would end the process)."""
    for sig in (STALL_SIGNAL, RESUME_SIGNAL):
        with contextlib.suppress(ValueError, OSError):  # not the main thread
            signal.signal(sig, signal.SIG_IGN)


def _install_stall_seam(app: faust.App) -> None:
    """The stall seam (module docstring): SIGUSR1 pauses the consumer's partitions, SIGUSR2
    resumes them. Where signals cannot be handled (not the main thread), there is none."""
    loop = asyncio.get_running_loop()

    def fetching(paused: bool) -> None:
        tps = set(app.consumer.assignment())
        if paused:
            app.consumer.pause_partitions(tps)
        else:
            app.consumer.resume_partitions(tps)
        event = "controller.stall.injected" if paused else "controller.stall.resumed"
        log.warning(event, partitions=len(tps))

    try:
        loop.add_signal_handler(STALL_SIGNAL, fetching, True)
        loop.add_signal_handler(RESUME_SIGNAL, fetching, False)
    except (NotImplementedError, RuntimeError, ValueError):
        log.debug("controller.stall.no_seam")


async def _watchdog(app: faust.App, ctl: Controller) -> None:
    """The liveness check (:mod:`headroom.controllers.liveness`), several times an interval."""
    _install_stall_seam(app)
    period = min(1.0, ctl.config.interval_s / 4.0)
    ctl.liveness.frozen_gap_s = max(2.0, 5.0 * period)
    while not app.should_stop:
        await app.sleep(period)
        reason = ctl.liveness.check(time.time())
        if reason is None:
            continue
        if not await probe_async(ctl.settings.bootstrap, timeout_s=LIVENESS_PROBE_S):
            # the broker is away (a restart, a partition): not this consumer's stall, and a
            # restarted controller could do no better; judge again once it answers
            log.warning("controller.liveness.broker_unreachable", reason=reason)
            ctl.liveness.last_live = time.time()
            continue
        _liveness_exit(reason)


def _liveness_exit(reason: str) -> None:
    """Log why and end the process at once with :data:`LIVENESS_EXIT` (a stalled worker cannot
    be trusted to shut down cleanly; its offsets and tables are committed as it went)."""
    log.error("controller.liveness.failed", reason=reason, exit_status=LIVENESS_EXIT)
    print(f"controller.liveness.failed: {reason}", file=sys.stderr, flush=True)
    sys.stdout.flush()
    os._exit(LIVENESS_EXIT)


def _control_config(settings: ControllerSettings) -> ControlConfig:
    """The scenario's control settings, with the interval and the target lifetime of
    ``settings`` where given."""
    overrides: dict[str, Any] = {}
    if settings.interval_s is not None:
        overrides["interval_s"] = settings.interval_s
    if settings.ttl_s is not None:
        overrides["ttl_s"] = settings.ttl_s
    return ControlConfig.from_scenario(settings.scenario, **overrides)


def _recovered(app: faust.App) -> bool:
    """The app's tables are recovered (a restarted worker must resume from its snapshot)."""
    return not app.in_recovery and bool(app.tables.recovery.completed.is_set())  # type: ignore[attr-defined]


async def _control_clock(
    app: faust.App,
    t0: float,
    interval_s: float,
    prepare: Callable[[], Awaitable[bool]],
    run_tick: Callable[[float], Awaitable[None]],
) -> None:
    """One step at every ``t0 + k × interval_s`` (scenario time ``k × interval_s``, as in the
    simulator), not every interval from whenever this process started; ``prepare`` once the
    tables are recovered, before the first step. A step before recovery is skipped (bumpless
    restart); a failed step is logged and never stops the control plane."""
    k = 0
    prepared = False
    while not app.should_stop:
        k = next_step(time.time(), t0, interval_s, k)
        at = t0 + k * interval_s
        while not app.should_stop and time.time() < at:
            if not prepared and _recovered(app):
                prepared = await prepare()
            await app.sleep(min(1.0, max(0.0, at - time.time())))
        if app.should_stop:
            break
        if not _recovered(app):
            log.info("controller.tick.skipped", reason="table recovery in progress")
            continue
        try:
            await run_tick(time.time())
        except Exception:  # one failed step must not stop the control plane
            log.exception("controller.tick.failed", step=k)


async def _changelog_known(app: faust.App, table: Any, source_topic: str | None = None) -> None:
    """Wait until the app's producer knows ``table``'s changelog topic, before a table write.

    Faust sends a table's changelog record without waiting for the producer to know the
    changelog topic (``send_soon`` partitions it at once: an unknown topic has "0 partitions" and
    the write raises ``PartitionsMismatch``, which crashes the agent), and aiokafka's producer
    forgets the topics it has not sent to at every metadata refresh.
    ``AIOKafkaProducer.partitions_for`` waits for them (at once when they are known).

    ``source_topic``: the stream the write comes from (a table keyed by its event's partition).
    Faust checks once per source topic that it has as many partitions as the changelog, from the
    consumer's metadata snapshot; a snapshot taken before the app created the changelog topic
    says 0 partitions until the next rebalance, and every write until then raises
    ``PartitionsMismatch`` and crashes the agent, losing the signal it was counting (seen on a
    fresh prefix: five value signals lost at start-up). So the check is made here, from the
    producer's fresh metadata, and recorded as Faust records its own."""
    producer = getattr(app.producer, "_producer", None)
    if producer is None:
        return
    changelog = await producer.partitions_for(table.changelog_topic.get_topic_name())
    verified = getattr(table, "_verified_source_topics_for_partitions", None)
    if source_topic is None or verified is None or source_topic in verified:
        return
    source = await producer.partitions_for(source_topic)
    if len(source) != len(changelog):
        raise PartitionsMismatch(
            f"the source topic {source_topic!r} of table {table.name!r} has {len(source)} "
            f"partitions, its changelog {len(changelog)}"
        )
    verified.add(source_topic)


async def _save_snapshot(app: faust.App, ctl: Controller, state_table: Any) -> bool:
    """Write the plane's snapshot to the state table, one record per region this worker owns
    (keyed by region: the record lives on the region's partition); False (logged) when it could
    not be (:func:`_changelog_known` first)."""
    try:
        await _changelog_known(app, state_table)
        snap = ctl.plane.snapshot()
        for region, st in snap["regions"].items():
            if region in ctl.owned:
                record = {**snap, "regions": {region: st}}
                if region in ctl.fold_capture:
                    record["value_folded"] = ctl.fold_capture[region]
                state_table[region] = dumps(record)
    except Exception as exc:  # the next step writes it again
        log.warning("controller.snapshot.failed", error=f"{type(exc).__name__}: {exc}")
        return False
    return True


def _faust_app(settings: ControllerSettings) -> faust.App:
    """The Faust app of these settings: in-memory tables changelogged to Kafka, no web server,
    at-least-once processing, new consumers from the latest offsets, the group's timeouts of
    :func:`group_timeouts`."""
    session, heartbeat, rebalance = group_timeouts(_control_config(settings).interval_s)
    return faust.App(
        settings.id,
        broker=[f"kafka://{b.strip()}" for b in settings.bootstrap.split(",") if b.strip()],
        value_serializer="raw",
        key_serializer="raw",
        store="memory://",
        datadir=str(settings.data_dir),
        topic_partitions=settings.partitions,
        topic_replication_factor=settings.replication_factor,
        table_standby_replicas=0,
        broker_credentials=_credentials(settings.security),
        web_enabled=False,
        worker_redirect_stdouts=False,
        stream_wait_empty=False,
        broker_session_timeout=session,
        broker_heartbeat_interval=heartbeat,
        broker_rebalance_timeout=rebalance,
        broker_commit_interval=0.5,
        consumer_auto_offset_reset="latest",
        processing_guarantee="at_least_once",
    )


def _credentials(security: ClientSecurity) -> Any:
    """Faust's broker credentials of the ``--kafka-config`` settings (None: PLAINTEXT)."""
    if security.uses_sasl:
        assert security.password is not None
        return faust.SASLCredentials(
            username=security.username,
            password=security.password.reveal(),
            mechanism=security.mechanism,
            ssl_context=security.ssl_context() if security.uses_ssl else None,
        )
    if security.uses_ssl:
        return faust.SSLCredentials(security.ssl_context())
    return None


async def _deadletter(
    ctl: Controller, deadletter_topic: Any, event: Any, error: ValidationError | str
) -> None:
    """Send a message that does not validate to the dead-letter topic, and count and log it."""
    msg = event.message
    dl = messages.DeadLetter.for_payload(
        ts=time.time(),
        topic=msg.topic,
        partition=msg.partition,
        offset=msg.offset,
        error=str(error),
        payload=msg.value,
        key=msg.key,
    )
    await deadletter_topic.send(key=msg.key, value=messages.encode(dl))
    ctl.deadlettered += 1
    log.warning(
        "controller.message.deadlettered",
        total=ctl.deadlettered,
        topic=msg.topic,
        partition=msg.partition,
        offset=msg.offset,
        error=str(error),
    )


async def _decoded(
    stream: Any,
    kind: str,
    deadletter: Callable[[Any, ValidationError | str], Awaitable[None]],
    consumed: Callable[[], None] | None = None,
) -> AsyncIterator[tuple[Any, Any]]:
    """The stream's events with their decoded messages; what does not decode is dead-lettered.
    ``consumed`` is told of every message (the liveness check)."""
    async for event in stream.events():
        if consumed is not None:
            consumed()
        try:
            msg = messages.decode(kind, event.value)
        except ValidationError as exc:
            await deadletter(event, exc)
            continue
        if msg is None:  # a tombstone where none is expected
            await deadletter(event, "value: null (tombstone) is not a valid message here")
            continue
        yield event, msg


def _adopt(ctl: Controller, region: str, state_table: Any, capacity_table: Any) -> None:
    """Take ``region`` over from the tables (recovered from their changelogs): its plane state
    from the ``state`` table (the record keyed by region; a record ``plane`` of the single-key
    layout is read when the region has none), its capacity levels from the ``capacity`` table."""
    raw = state_table.get(region)
    state = loads(raw) if raw else None
    if state is None:
        legacy = state_table.get("plane")
        state = loads(legacy) if legacy else None
    ctl.adopt(region, state)
    prefix = f"{region}|"
    for key in list(capacity_table.keys()):
        if not str(key).startswith(prefix):
            continue
        raw_cap = capacity_table.get(key)
        if raw_cap is None:
            continue
        try:
            msg = messages.decode("capacity", raw_cap)
        except ValidationError:
            continue
        ctl.aggregator.add_capacity(msg.region, capacity_level(msg))


async def _publish_region(
    ctl: Controller, region: str, now: float, targets_topic: Any, events_topic: Any
) -> None:
    """One control step of a region: its targets message, its events and the log line."""
    obs = ctl.aggregator.observe(region, now)
    ctl.capture_folds(region)  # what the plane's books hold from now on
    t = ctl.plane.step(obs)
    decision = ctl.plane.decision(region)
    assert decision is not None  # step() just made it
    fields = decision.event_fields()
    fields["inputs"] = {
        **fields.get("inputs", {}),
        "p99_ms": dict(obs.p99_ms),
        "request_rps": obs.request_rps,
        "window_s": obs.window_s,
        "observed_coverage": obs.observed_coverage,
    }
    key = region.encode()
    await targets_topic.send(key=key, value=messages.encode(targets_message(t)))
    events = [("target.issued", fields), *decision.allocator_events()]
    for kind, extra in events:
        try:
            ev = region_event(t.ts, region, kind, extra)
        except ValidationError as exc:  # e.g. an infinite input: log it, never stop
            log.warning("controller.event.invalid", kind=kind, error=str(exc))
            continue
        await events_topic.send(key=key, value=messages.encode(ev))
    log.info(
        "controller.target.issued",
        region=region,
        epoch=t.epoch,
        rma_candidates=t.rma_candidates,
        sbm_coverage=t.sbm_coverage,
        reason=t.reason,
        fallback=t.fallback,
        p99_ms=obs.p99_ms.get("all"),
    )
