"""The consumer loop's bookkeeping against scripted doubles (no broker): what is handed on, what
is dead-lettered, and that a commit comes only after every dead letter was acknowledged."""

from __future__ import annotations

import asyncio
import base64
from collections.abc import Callable
from typing import Any

import orjson
import pytest
from aiokafka import ConsumerRecord, TopicPartition

from headroom.streams import messages
from headroom.streams.consume import ConsumerLoop, HandlerErrors, LoopConfig, Received

PREFIX = "u."
TOPIC = f"{PREFIX}capacity"
TP = TopicPartition(TOPIC, 0)


def good(i: int) -> bytes:
    return messages.encode(
        messages.Capacity(
            ts=1.0 + i,
            region="us-east",
            resource="cpu",
            hardware="any",
            pool="opportunistic",
            units=1.0,
            expires_in_s=None,
            reason="update",
            id=f"c-{i}",
        )
    )


def record(offset: int, value: bytes | None, topic: str = TOPIC) -> ConsumerRecord[Any, Any]:
    return ConsumerRecord(
        topic=topic,
        partition=0,
        offset=offset,
        timestamp=1000 + offset,
        timestamp_type=0,
        key=b"us-east",
        value=value,
        checksum=None,
        serialized_key_size=7,
        serialized_value_size=len(value or b""),
        headers=(),
    )


class ScriptedConsumer:
    """Hands out the scripted batches, then empty polls; records commits."""

    def __init__(
        self, batches: list[list[ConsumerRecord[Any, Any]]], on_commit: Callable[[], None]
    ) -> None:
        self._batches = list(batches)
        self._group_id = "g"
        self.commits: list[dict[TopicPartition, int]] = []
        self._on_commit = on_commit

    async def getmany(
        self, timeout_ms: int = 0, max_records: int | None = None
    ) -> dict[TopicPartition, list[ConsumerRecord[Any, Any]]]:
        await asyncio.sleep(0)
        if self._batches:
            return {TP: self._batches.pop(0)}
        return {}

    def assignment(self) -> set[TopicPartition]:
        return {TP}

    async def commit(self, offsets: dict[TopicPartition, int]) -> None:
        self._on_commit()
        self.commits.append(dict(offsets))


class SlowAckProducer:
    """Dead letters are acknowledged a little later, like a real broker."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, bytes, bytes | None]] = []
        self.futures: list[asyncio.Future[None]] = []

    async def send(
        self, topic: str, value: bytes, key: bytes | None = None
    ) -> asyncio.Future[None]:
        self.sent.append((topic, value, key))
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        asyncio.get_running_loop().call_later(0.01, future.set_result, None)
        self.futures.append(future)
        return future


def make_loop(
    batches: list[list[ConsumerRecord[Any, Any]]],
    handler: Callable[[Received], Any],
    config: LoopConfig | None = None,
) -> tuple[ConsumerLoop, ScriptedConsumer, SlowAckProducer, list[bool]]:
    producer = SlowAckProducer()
    acked_at_commit: list[bool] = []
    consumer = ScriptedConsumer(
        batches, lambda: acked_at_commit.append(all(f.done() for f in producer.futures))
    )
    loop = ConsumerLoop(
        consumer,  # type: ignore[arg-type]
        producer,  # type: ignore[arg-type]
        handler,
        prefix=PREFIX,
        config=config or LoopConfig(idle_timeout_s=0.0),
        clock=lambda: 42.0,
    )
    return loop, consumer, producer, acked_at_commit


async def test_bad_records_are_deadlettered_and_the_commit_waits_for_their_acks() -> None:
    got: list[Received] = []
    loop, consumer, producer, acked_at_commit = make_loop(
        [[record(0, good(0)), record(1, b"nope"), record(2, good(2))]], got.append
    )
    stats = await loop.run()
    assert [r.offset for r in got] == [0, 2]
    assert (stats.processed, stats.deadlettered, stats.commits) == (2, 1, 1)
    assert consumer.commits == [{TP: 3}]
    assert acked_at_commit == [True]  # at-least-once: no commit past an unacknowledged letter
    [(topic, value, key)] = producer.sent
    assert topic == f"{PREFIX}deadletter"
    assert key == b"us-east"
    letter = messages.decode("deadletter", value)
    assert isinstance(letter, messages.DeadLetter)
    assert (letter.ts, letter.topic, letter.partition, letter.offset) == (42.0, TOPIC, 0, 1)
    assert base64.b64decode(letter.payload_b64) == b"nope"


async def test_a_raising_handler_in_raise_mode_stops_the_loop_without_committing() -> None:
    def handler(r: Received) -> None:
        raise RuntimeError("bug")

    loop, consumer, _, _ = make_loop(
        [[record(0, good(0))]],
        handler,
        LoopConfig(idle_timeout_s=0.0, handler_errors=HandlerErrors.RAISE),
    )
    with pytest.raises(RuntimeError, match="bug"):
        await loop.run()
    assert consumer.commits == []  # the record will be delivered again


async def test_stop_finishes_and_commits_the_current_batch() -> None:
    seen: list[int] = []
    holder: list[ConsumerLoop] = []

    def handler(r: Received) -> None:
        seen.append(r.offset)
        holder[0].stop()

    loop, consumer, _, _ = make_loop(
        [[record(0, good(0)), record(1, good(1))], [record(2, good(2))]],
        handler,
        LoopConfig(idle_timeout_s=None),
    )
    holder.append(loop)
    await asyncio.wait_for(loop.run(), 5.0)
    assert seen == [0, 1]  # the batch in hand was finished, the next one not started
    assert consumer.commits == [{TP: 2}]


async def test_records_of_foreign_topics_are_deadlettered_not_dropped() -> None:
    loop, _, producer, _ = make_loop([[record(0, good(0), topic="other.capacity")]], lambda r: None)
    stats = await loop.run()
    assert stats.deadlettered == 1
    letter = messages.decode("deadletter", producer.sent[0][1])
    assert isinstance(letter, messages.DeadLetter)
    assert "not a headroom topic" in letter.error


def test_loop_config_problems_name_the_field() -> None:
    from headroom.kernel.errors import ConfigError

    with pytest.raises(ConfigError) as caught:
        LoopConfig(batch_max=0, poll_timeout_s=0, idle_timeout_s=-1)
    assert [p.split(":")[0] for p in caught.value.problems] == [
        "batch_max",
        "poll_timeout_s",
        "idle_timeout_s",
    ]


def latency(i: int, **changes: Any) -> bytes:
    d = {
        "v": 1,
        "ts": 1.0 + i,
        "region": "us-east",
        "replica": "rank-3",
        "pool": "opportunistic",
        "path": "rma",
        "window_s": 1.0,
        "count": 17,
        "sketch": {"alpha": 0.01, "bins": {"372": 10, "373": 7}, "zeros": 0},
        "inflight": 12,
        "queue_ms": 3.1,
    }
    d.update(changes)
    return orjson.dumps(d)


async def test_mixed_batches_are_counted_per_topic_and_every_bad_record_is_named() -> None:
    lat = f"{PREFIX}latency"
    bad_bins = {"alpha": 0.01, "bins": {"372": 10, "12x": 7}, "zeros": 0}
    batch = [
        record(0, good(0)),
        record(1, latency(1), topic=lat),
        record(2, latency(2, sketch=bad_bins), topic=lat),
        record(3, latency(3, queue_ms=-1.0), topic=lat),
        record(4, latency(4).replace(b'"window_s":1.0', b'"window_s":1e400'), topic=lat),
        record(5, good(5)),
        record(6, latency(6, v=2), topic=lat),
        record(7, None),
    ]
    got: list[Received] = []
    loop, consumer, producer, _ = make_loop([batch], got.append)
    stats = await loop.run()
    assert [(r.offset, r.kind) for r in got] == [(0, "capacity"), (1, "latency"), (5, "capacity")]
    assert (stats.processed, stats.deadlettered, stats.rejected) == (3, 5, 0)
    assert stats.by_topic == {
        TOPIC: {"processed": 2, "deadlettered": 1, "rejected": 0},
        lat: {"processed": 1, "deadlettered": 4, "rejected": 0},
    }
    errors = {}
    for _, value, _ in producer.sent:
        letter = messages.decode("deadletter", value)
        assert isinstance(letter, messages.DeadLetter)
        errors[letter.offset] = letter.error
    assert errors[2].startswith("sketch.bins.12x: ")
    assert errors[3].startswith("queue_ms: must be >= 0")
    assert errors[4].startswith("window_s: must be a finite number")
    assert errors[6].startswith("v: unsupported schema version 2")
    assert errors[7].startswith("$: a tombstone")
    assert consumer.commits == [{TP: 8}]


async def test_an_async_handler_is_awaited_before_the_commit() -> None:
    done: list[int] = []

    async def handler(r: Received) -> None:
        await asyncio.sleep(0.001)
        done.append(r.offset)

    loop, consumer, _, _ = make_loop([[record(0, good(0)), record(1, good(1))]], handler)
    stats = await loop.run()
    assert done == [0, 1]
    assert stats.processed == 2
    assert consumer.commits == [{TP: 2}]


async def test_a_commit_overlaps_the_next_batch_and_commits_stay_in_order() -> None:
    events: list[str] = []
    loop, consumer, _, _ = make_loop(
        [[record(0, good(0))], [record(1, good(1))], [record(2, good(2))]],
        lambda r: events.append(f"handled {r.offset}"),
        LoopConfig(idle_timeout_s=0.2),
    )
    plain_commit = consumer.commit

    async def slow_commit(offsets: dict[TopicPartition, int]) -> None:
        events.append(f"commit {offsets[TP]} sent")
        await asyncio.sleep(0.05)  # the coordinator's round trip
        await plain_commit(offsets)
        events.append(f"commit {offsets[TP]} done")

    consumer.commit = slow_commit  # type: ignore[method-assign]
    stats = await loop.run()
    assert stats.commits == 3
    assert consumer.commits == [{TP: 1}, {TP: 2}, {TP: 3}]
    # The second batch is handled while the first commit is under way; a commit is sent only
    # after the one before it is done, and the last is done before run returns.
    assert events.index("handled 1") < events.index("commit 1 done")
    assert events.index("commit 1 done") < events.index("commit 2 sent")
    assert events.index("commit 2 done") < events.index("commit 3 sent")
    assert events[-1] == "commit 3 done"
