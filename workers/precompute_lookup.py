"""``PrecomputeCache``: a client's view of ``headroom.precompute`` for its region.

The cache consumes the compacted ``precompute`` topic from the beginning (every partition: the
topic is keyed ``region/user``, so one region's results are spread over all of them), keeps the
results of its region in a :class:`headroom.workers.precompute_store.PrecomputeStore`, and deletes a
user's result when a tombstone (null value) for ``region/user`` arrives. A result past its
``expires_at`` is never returned, whether or not its tombstone has arrived yet. Bad records go
to the dead-letter topic (:mod:`headroom.streams.consume`), and a record whose key does not match
its body (``region/user``) is one of them: compaction by that key would keep the wrong result.

How a client uses it (``workers/client.py``), per request, *before* ranking live::

    cache = PrecomputeCache(region, kafka, t0=t0, speed=speed)   # a Service: start it once
    await cache.start(); await cache.ready.wait()               # caught up with the topic
    ...
    hold_out = in_holdout(request)                     # the client's own holdout draw
    visit = cache.visit(request.user, now=wall_ts, hold_out=hold_out, segment=request.segment)
    if visit.outcome is VisitOutcome.HIT:              # serve visit.result.ranking[0]; no live
        ...                                            # ranking, only the look-up's cost
    elif visit.outcome is VisitOutcome.HELD_OUT:       # a result was there but this request
        ...                                            # is control: rank live (base), count it
    else:                                              # MISS: rank live as usual
        ...

Value signals (``headroom.value``, lever ``precompute``): a HIT request is the *treatment* arm,
a HELD_OUT request the *control* arm — both are requests for which a stored result existed, so
the difference of their means is the uplift of serving it, free of the selection of which users
get precomputed. Their ``value`` is the delivered value (request value × quality at visit time
of the ad served first: ``world.ad_quality(user, segment, [ranking[0]], t_s)`` for a hit); the
``cost`` of a hit is the look-up only. On the event log the client adds
``cache.take_window(...)`` as the ``precompute`` field of its ``window`` line (visits, hits,
used, expired unused, staleness): the worker's own window lines carry ``jobs`` and
``wasted_partial``, so the analyzer's sums count each thing once. Call :meth:`expire`
periodically (e.g. at each window) so expired-unused results are counted when they expire,
not when they are next looked up.

Times: ``now`` is wall-clock event time (the ``ts`` base of every message); staleness samples are
reported in scenario seconds (``× speed``), like every other duration of the event log.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from aiokafka.errors import KafkaConnectionError

from headroom.kernel.errors import ConfigError
from headroom.streams.consume import ConsumerLoop, LoopConfig, Received
from headroom.streams.kafka import KafkaTarget, KafkaUnavailable, make_consumer, make_producer
from headroom.streams.messages import Precompute, precompute_key
from headroom.workers.precompute_store import (
    Expired,
    PrecomputeStore,
    PutOutcome,
    Visit,
    VisitOutcome,
)
from headroom.workers.service import Service

__all__ = [
    "CacheCounts",
    "PrecomputeCache",
    "Visit",
    "VisitOutcome",
    "parse_precompute_key",
    "read_region_results",
]

_READY_POLL_S = 0.05


def parse_precompute_key(key: bytes | None) -> tuple[str, int] | None:
    """``b"us-east/918273"`` → ``("us-east", 918273)``; None when it is not such a key."""
    if key is None:
        return None
    try:
        text = key.decode("utf-8")
    except UnicodeDecodeError:
        return None
    region, sep, user = text.rpartition("/")
    if not sep or not region or not user.isdigit():
        return None
    return region, int(user)


@dataclass
class CacheCounts:
    """What the cache saw on the topic (the store counts what happened to results)."""

    records: int = 0  # records of this region applied (results and tombstones)
    tombstones: int = 0  # tombstones of this region
    foreign: int = 0  # records of other regions, skipped
    stale: int = 0  # results older than the stored one, or redeliveries
    late: int = 0  # results already expired when they arrived


class PrecomputeCache(Service):
    """The client-side look-up of precomputed results for one region (see the module doc).

    Without ``kafka`` it is a plain in-memory cache fed through :meth:`apply` (tests, the
    simulator). ``clock`` gives wall time for counting ``late`` arrivals while consuming.
    """

    name = "precompute_cache"

    def __init__(
        self,
        region: str,
        kafka: KafkaTarget | None = None,
        *,
        store: PrecomputeStore | None = None,
        max_results: int = 250_000,
        speed: float = 1.0,
        clock: Callable[[], float] = time.time,
        loop_config: LoopConfig | None = None,
    ) -> None:
        super().__init__()
        if not region:
            raise ConfigError("--region: must not be empty")
        if not speed > 0.0:
            raise ConfigError(f"--speed: must be > 0, got {speed}")
        self.region = region
        self.kafka = kafka
        self.store = store if store is not None else PrecomputeStore(max_results=max_results)
        self.speed = speed
        self.counts = CacheCounts()
        self.ready = asyncio.Event()  # set once the topic was read up to its end at start
        self._clock = clock
        self._loop_config = loop_config or LoopConfig(poll_timeout_s=0.05)
        self._consumer: Any = None
        self._producer: Any = None
        self._loop: ConsumerLoop | None = None

    # -- the pure part ---------------------------------------------------------------------------

    def apply(self, key: bytes | None, message: Precompute | None, now: float) -> bool:
        """Apply one record of the topic (``message`` None: a tombstone). Returns True when it
        concerned this region. Raises ValueError for a record whose key and body disagree."""
        if message is None:
            parsed = parse_precompute_key(key)
            if parsed is None:
                raise ValueError(f"tombstone key {key!r} is not 'region/user'")
            region, user = parsed
            if region != self.region:
                self.counts.foreign += 1
                return False
            self.counts.records += 1
            self.counts.tombstones += 1
            # the worker tombstones a result once it has expired: end expired ones as such
            # first, so a result that expired unused is counted in expired_unused, not deleted
            self.store.expire(now)
            self.store.remove(region, user)
            return True
        if key is not None and key != precompute_key(message.region, message.user):
            raise ValueError(
                f"key {key!r} does not match the result's region/user "
                f"{precompute_key(message.region, message.user)!r}"
            )
        if message.region != self.region:
            self.counts.foreign += 1
            return False
        self.counts.records += 1
        outcome = self.store.put(message, now)
        if outcome in (PutOutcome.STALE, PutOutcome.DUPLICATE):
            self.counts.stale += 1
        elif outcome is PutOutcome.LATE:
            self.counts.late += 1
        return True

    def lookup(self, user: int, now: float) -> Precompute | None:
        """The user's unexpired result, or None (a pure read: nothing counted)."""
        return self.store.lookup(self.region, user, now)

    def visit(
        self, user: int, now: float, *, hold_out: bool = False, segment: str | None = None
    ) -> Visit:
        """A request of ``user`` at wall time ``now``: counted, served or held out. Pass the
        request's ``segment``: a result ranked for the user in another segment is a miss."""
        return self.store.visit(self.region, user, now, hold_out=hold_out, segment=segment)

    def expire(self, now: float) -> Expired:
        """Drop results past their expiry; the unused ones are counted as ``expired_unused``."""
        return self.store.expire(now)

    def take_window(self) -> dict[str, Any]:
        """The ``precompute`` field of the client's ``window`` line since the last call
        (staleness in scenario seconds)."""
        fields = self.store.take_window().client_fields()
        fields["staleness_s"] = [a * self.speed for a in fields["staleness_s"]]
        return fields

    def __len__(self) -> int:
        return len(self.store)

    # -- the Kafka part --------------------------------------------------------------------------

    async def on_start(self) -> None:
        if self.kafka is None:
            self.ready.set()
            return
        bootstrap = self.kafka.bootstrap
        topic = self.kafka.topic("precompute")
        self._producer = make_producer(bootstrap)
        self._consumer = make_consumer(bootstrap, topic, group_id=None, from_beginning=True)
        try:
            await self._producer.start()
            await self._consumer.start()
        except (KafkaConnectionError, OSError) as exc:
            raise KafkaUnavailable(f"cannot reach Kafka at {bootstrap}: {exc}") from None
        self._loop = ConsumerLoop(
            self._consumer,
            self._producer,
            self._handle,
            prefix=self.kafka.prefix,
            config=self._loop_config,
            component=self.name,
            commit=False,
        )
        self.add_task(self._loop.run(), name="precompute-cache-consume")
        self.add_task(self._watch_ready(topic), name="precompute-cache-ready")

    def _handle(self, record: Received) -> None:
        message = record.message
        if message is not None and not isinstance(message, Precompute):
            raise ValueError(f"not a precompute result: {type(message).__name__}")
        self.apply(record.key, message, self._clock())

    async def _watch_ready(self, topic: str) -> None:
        """Set :attr:`ready` once every partition was read up to its end offset at start."""
        consumer = self._consumer
        while not consumer.assignment():
            if not await self.sleep(_READY_POLL_S):
                return
        partitions = sorted(consumer.assignment(), key=lambda tp: tp.partition)
        ends = await consumer.end_offsets(partitions)
        while True:
            positions = [await consumer.position(tp) for tp in partitions]
            if all(pos >= ends[tp] for pos, tp in zip(positions, partitions, strict=True)):
                break
            if not await self.sleep(_READY_POLL_S):
                return
        self.ready.set()
        self.log.info(
            "precompute_cache.topic.caught_up",
            region=self.region,
            topic=topic,
            results=len(self.store),
            records=self.counts.records,
        )

    async def on_stop(self) -> None:
        if self._loop is not None:
            self._loop.stop()
        for client in (self._consumer, self._producer):
            if client is not None:
                try:
                    await client.stop()
                except Exception as exc:  # closing is best effort; report, do not mask
                    self.log.warning("precompute_cache.client.stop_failed", error=str(exc))


async def read_region_results(
    kafka: KafkaTarget, region: str, *, timeout_s: float = 60.0
) -> PrecomputeStore:
    """Read ``headroom.precompute`` to its current end once and return the region's live
    results (what a restarted precompute worker published before)."""
    cache = PrecomputeCache(region, kafka)
    async with cache:
        await asyncio.wait_for(cache.ready.wait(), timeout_s)
    return cache.store
