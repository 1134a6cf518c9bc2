"""The shared consumer loop on a real broker: round trip, dead-letter path, commits, shutdown."""

from __future__ import annotations

import asyncio
import base64
import json
import uuid
from collections.abc import Callable
from typing import Any

import orjson
import pytest

from headroom.streams import messages
from headroom.streams.consume import (
    ConsumerLoop,
    HandlerErrors,
    LoopConfig,
    LoopStats,
    Received,
    consume,
)
from headroom.streams.kafka import KafkaTarget, admin, make_consumer, make_producer, started

pytestmark = pytest.mark.integration

REGION = "us-east"


def capacity(i: int, region: str = REGION) -> messages.Capacity:
    return messages.Capacity(
        ts=1_796_000_000.0 + i,
        region=region,
        resource="cpu",
        hardware="any",
        pool="opportunistic",
        units=float(i),
        expires_in_s=None,
        reason="update",
        id=f"c-{i:04d}",
    )


async def produce(
    target: KafkaTarget, kind: str, items: list[tuple[bytes | None, bytes | None]]
) -> None:
    producer = make_producer(target.bootstrap)
    async with started(producer, target.bootstrap):
        for key, value in items:
            await producer.send(target.topic(kind), value, key=key)
        await producer.flush()


async def read_all(
    target: KafkaTarget, kind: str, expect: int, timeout_s: float = 20.0
) -> list[Any]:
    consumer = make_consumer(target.bootstrap, target.topic(kind), from_beginning=True)
    out: list[Any] = []
    async with started(consumer, target.bootstrap):
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while len(out) < expect and loop.time() < deadline:
            batch = await consumer.getmany(timeout_ms=200)
            for records in batch.values():
                out.extend(records)
    return out


async def run_until(
    target: KafkaTarget,
    kinds: list[str],
    handler: Callable[[Received], Any],
    done: Callable[[LoopStats], bool],
    *,
    group_id: str | None = None,
    config: LoopConfig | None = None,
    timeout_s: float = 30.0,
) -> LoopStats:
    """Run the loop until ``done(stats)`` holds, then stop it gracefully."""
    loops: list[ConsumerLoop] = []

    async def watch() -> None:
        while not loops or not done(loops[0].stats):  # noqa: ASYNC110 - polls stats, not an event
            await asyncio.sleep(0.05)
        loops[0].stop()

    watcher = asyncio.create_task(watch())
    try:
        return await asyncio.wait_for(
            consume(
                target.bootstrap,
                [target.topic(k) for k in kinds],
                handler,
                prefix=target.prefix,
                group_id=group_id,
                from_beginning=True,
                config=config,
                on_loop=loops.append,
            ),
            timeout_s,
        )
    finally:
        watcher.cancel()


async def test_produced_messages_reach_the_handler_equal_and_in_key_order(
    kafka_target: KafkaTarget,
) -> None:
    sent = [capacity(i, region=("us-east" if i % 2 else "eu-west")) for i in range(20)]
    await produce(kafka_target, "capacity", [(m.region.encode(), messages.encode(m)) for m in sent])
    got: list[Received] = []
    stats = await run_until(kafka_target, ["capacity"], got.append, lambda s: s.processed >= 20)
    assert stats.processed == 20
    assert stats.invalid == 0
    assert sorted((r.message for r in got), key=lambda m: m.id) == sent  # type: ignore[union-attr]
    for region in ("us-east", "eu-west"):
        mine = [r.message.id for r in got if r.key == region.encode()]  # type: ignore[union-attr]
        assert mine == [m.id for m in sent if m.region == region]
    assert {r.kind for r in got} == {"capacity"}


async def test_a_malformed_message_from_kcat_is_deadlettered_and_the_loop_goes_on(
    kafka_target: KafkaTarget,
) -> None:
    topic = kafka_target.topic("latency")
    good = messages.Latency(
        ts=1_796_000_001.0,
        region=REGION,
        replica="rank-3",
        pool="opportunistic",
        path="rma",
        window_s=1.0,
        count=3,
        samples_ms=(41.2, 38.0, 97.5),
        sketch=None,
        inflight=12,
        queue_ms=3.1,
    )
    bad = orjson.dumps({**good.to_dict(), "ts": "soon"})  # complete, but ts is not a number
    # kcat with the Java clients' murmur2 partitioner (its default, consistent_random, would
    # put the same key in another partition than aiokafka does).
    kcat = await asyncio.create_subprocess_exec(
        "kcat",
        "-P",
        "-b",
        kafka_target.bootstrap,
        "-t",
        topic,
        "-k",
        REGION,
        "-X",
        "topic.partitioner=murmur2_random",
        stdin=asyncio.subprocess.PIPE,
    )
    await asyncio.wait_for(kcat.communicate(bad), 30)
    assert kcat.returncode == 0
    await produce(kafka_target, "latency", [(REGION.encode(), messages.encode(good))])

    got: list[Received] = []
    stats = await run_until(
        kafka_target,
        ["latency"],
        got.append,
        lambda s: s.processed >= 1 and s.deadlettered >= 1,
    )
    assert stats.deadlettered == 1
    assert stats.processed == 1
    assert [r.message for r in got] == [good]  # the good message after the bad one got through

    records = await read_all(kafka_target, "deadletter", expect=1)
    assert len(records) == 1
    letter = messages.decode("deadletter", records[0].value)
    assert isinstance(letter, messages.DeadLetter)
    assert letter.topic == topic
    assert letter.partition == got[0].partition  # same key, same partition
    assert letter.offset == got[0].offset - 1  # it came right before the good one
    assert letter.error.startswith("ts: ")  # the reason names the field
    assert base64.b64decode(letter.payload_b64) == bad  # the original bytes, nothing lost
    assert records[0].key == REGION.encode()


async def test_a_failing_handler_deadletters_the_message_unless_told_to_raise(
    kafka_target: KafkaTarget,
) -> None:
    sent = [capacity(i) for i in range(3)]
    await produce(kafka_target, "capacity", [(REGION.encode(), messages.encode(m)) for m in sent])

    def handler(record: Received) -> None:
        assert isinstance(record.message, messages.Capacity)
        if record.message.id == "c-0001":
            raise RuntimeError("downstream refused")

    stats = await run_until(
        kafka_target, ["capacity"], handler, lambda s: s.processed >= 2 and s.invalid >= 1
    )
    assert (stats.processed, stats.deadlettered, stats.handler_errors) == (2, 1, 1)
    [record] = await read_all(kafka_target, "deadletter", expect=1)
    letter = messages.decode("deadletter", record.value)
    assert isinstance(letter, messages.DeadLetter)
    assert letter.error == "handler: RuntimeError: downstream refused"

    with pytest.raises(RuntimeError, match="downstream refused"):
        await run_until(
            kafka_target,
            ["capacity"],
            handler,
            lambda s: False,
            config=LoopConfig(handler_errors=HandlerErrors.RAISE),
        )


async def test_a_group_resumes_after_its_last_commit_without_loss_or_replay(
    kafka_target: KafkaTarget,
) -> None:
    group = f"g-{uuid.uuid4().hex[:8]}"
    first = [capacity(i) for i in range(5)]
    await produce(kafka_target, "capacity", [(REGION.encode(), messages.encode(m)) for m in first])
    seen: list[str] = []

    def handle(r: Received) -> None:
        seen.append(r.message.id)  # type: ignore[union-attr]

    stats = await run_until(
        kafka_target, ["capacity"], handle, lambda s: s.processed >= 5, group_id=group
    )
    assert stats.commits >= 1

    second = [capacity(i) for i in range(5, 8)]
    await produce(kafka_target, "capacity", [(REGION.encode(), messages.encode(m)) for m in second])
    await run_until(kafka_target, ["capacity"], handle, lambda s: s.processed >= 3, group_id=group)
    assert seen == [m.id for m in first + second]  # each exactly once, in order

    # The committed offsets are what a restarted member resumes from: all 8 records.
    async with admin(kafka_target.bootstrap) as client:
        committed = await client.list_consumer_group_offsets(group)
    assert sum(meta.offset for meta in committed.values()) == 8


async def test_a_precompute_tombstone_is_handed_on_and_one_elsewhere_is_deadlettered(
    kafka_target: KafkaTarget,
) -> None:
    await produce(kafka_target, "precompute", [(b"us-east/42", None)])
    await produce(kafka_target, "latency", [(REGION.encode(), None)])
    got: list[Received] = []
    stats = await run_until(
        kafka_target,
        ["precompute", "latency"],
        got.append,
        lambda s: s.processed >= 1 and s.deadlettered >= 1,
    )
    assert [(r.kind, r.key, r.message) for r in got] == [("precompute", b"us-east/42", None)]
    assert stats.by_topic[kafka_target.topic("latency")]["deadlettered"] == 1


async def test_bad_messages_on_the_deadletter_topic_are_counted_not_sent_back(
    kafka_target: KafkaTarget,
) -> None:
    await produce(kafka_target, "deadletter", [(None, b"garbage")])
    stats = await run_until(
        kafka_target,
        ["deadletter"],
        lambda r: None,
        lambda s: s.rejected >= 1,
        config=LoopConfig(idle_timeout_s=2.0),
    )
    assert (stats.rejected, stats.deadlettered) == (1, 0)
    records = await read_all(kafka_target, "deadletter", expect=2, timeout_s=2.0)
    assert len(records) == 1  # only the garbage itself: nothing was appended


async def test_the_loop_ends_on_its_own_after_the_idle_timeout(kafka_target: KafkaTarget) -> None:
    await produce(kafka_target, "capacity", [(REGION.encode(), messages.encode(capacity(1)))])
    stats = await asyncio.wait_for(
        consume(
            kafka_target.bootstrap,
            [kafka_target.topic("capacity")],
            lambda r: None,
            prefix=kafka_target.prefix,
            from_beginning=True,
            config=LoopConfig(idle_timeout_s=1.0),
        ),
        30.0,
    )
    assert stats.processed == 1


async def test_kcat_reads_what_we_write_as_plain_json(kafka_target: KafkaTarget) -> None:
    # msgspec writes the bytes now: a third-party client (kcat) and the standard library's json
    # must read every message back as its contract form, floats to the last bit.
    sketch = messages.LatencySketch.from_values([0.0, 0.25, 41.2, 97.5, 1e6, 3.3e-7])
    sent: list[messages.Latency] = [
        messages.Latency(
            ts=1_796_000_001.5 + i,
            region=REGION,
            replica=f"rank-{i}",
            pool="dedicated",
            path="sbm",
            window_s=10.0,
            count=2**63 - 1 if i else 0,
            samples_ms=(1e300, 5e-324, 0.1, 123456789.125) if i else None,
            sketch=sketch,
            inflight=i,
            queue_ms=0.0,
        )
        for i in range(3)
    ]
    await produce(kafka_target, "latency", [(REGION.encode(), messages.encode(m)) for m in sent])
    kcat = await asyncio.create_subprocess_exec(
        "kcat",
        "-C",
        "-b",
        kafka_target.bootstrap,
        "-t",
        kafka_target.topic("latency"),
        "-o",
        "beginning",
        "-e",
        "-q",
        "-f",
        "%s\n",
        stdout=asyncio.subprocess.PIPE,
    )
    out, _ = await asyncio.wait_for(kcat.communicate(), 60)
    assert kcat.returncode == 0
    lines = [line for line in out.splitlines() if line]
    assert len(lines) == len(sent)
    by_replica = {m.replica: m for m in sent}
    for line in lines:
        plain = json.loads(line)
        msg = by_replica[plain["replica"]]
        assert plain == msg.to_dict()
        assert messages.decode("latency", line) == msg
