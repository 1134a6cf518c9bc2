"""A controller whose group's commit ran past value signals no book has reads them again.

The state a controller killed at the wrong moment leaves (docs/streaming.md, *Faults*): after a
rebalance that gave it its partition straight back, its agent acknowledged records it had
buffered ahead of the read again, Faust committed past signals it had not processed, and the
kill came before the read again reached them. Here that state is written directly on the real
broker: the value topic holds signals 0..N-1 of one producer, the ``value_seen`` changelog holds
that producer's book after signals 0..K-1 and the partition's read mark K, and the group's commit
on the value partition is N. The controller (`headroom controller`, a real process) is started on
it and one more signal is sent (another every ``RESEND_S`` until all are counted: the first the
agent processes is what starts the read again): it must read the partition again from its mark
and count every signal once — all N + m sent, none missing. Without the mark it counted K + m.
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from headroom.controllers.read_marks import mark_key
from headroom.kernel.codec import dumps
from headroom.streams import messages
from headroom.streams.topics import region_partition
from tests.integration.test_controller_app import REGION, ControllerProcess

pytestmark = pytest.mark.integration

PRODUCER = "client-it-east.4242.abcdef"
PROCESSED, COMMITTED = 5, 12  # K signals in the book and below the mark; the commit at N
RESEND_S = 15.0  # how long one signal may go uncounted before another is sent


def _signal(seq: int) -> bytes:
    return messages.encode(
        messages.ValueSignal(
            ts=time.time(),
            region=REGION,
            segment="casual",
            lever="rma",
            arm="treatment",
            n=2,
            value_sum=2.0,
            value_sq_sum=2.0,
            window_s=1.0,
            cost=messages.Cost(cpu_ms=1.0, accelerator_ms=0.0),
            producer=PRODUCER,
            seq=seq,
        )
    )


def _table_key(key: str) -> bytes:
    """A ``value_seen`` changelog key as Faust writes it (a JSON string)."""
    return json.dumps(key).encode()


def _events_of(path: Path, event: str) -> list[dict[str, Any]]:
    lines = [json.loads(x) for x in path.read_text().splitlines() if x.startswith("{")]
    return [x for x in lines if x.get("event") == event]


async def _counted(bootstrap: str, prefix: str, want: int, timeout_s: float) -> dict[str, Any]:
    """The controller's newest ``value.counted`` entry for the producer, once it counted
    ``want`` (or the newest at the timeout)."""
    consumer = AIOKafkaConsumer(
        f"{prefix}events", bootstrap_servers=bootstrap, auto_offset_reset="earliest"
    )
    await consumer.start()
    newest: dict[str, Any] = {}
    try:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for records in (await consumer.getmany(timeout_ms=500)).values():
                for r in records:
                    event = messages.decode("events", r.value)
                    if isinstance(event, messages.Event) and event.kind == "value.counted":
                        got = event.to_dict().get("producers", {}).get(PRODUCER)
                        if got:
                            newest = got
            if newest.get("counted") == want:
                break
    finally:
        await consumer.stop()
    return newest


async def test_a_commit_past_unprocessed_signals_is_read_again_from_the_mark(
    kafka_bootstrap: str, topic_prefix: str, tmp_path: Path
) -> None:
    controller = ControllerProcess(kafka_bootstrap, topic_prefix, tmp_path)
    app_id = f"{topic_prefix}controller"
    controller.start()  # creates the topics and the tables' changelogs
    try:
        deadline = time.monotonic() + 60.0
        while not _events_of(controller.log, "controller.partitions.assigned"):
            assert time.monotonic() < deadline, "the controller never got its partitions"
            await asyncio.sleep(0.5)
    finally:
        controller.stop()

    producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap)
    await producer.start()
    try:
        value_topic = f"{topic_prefix}value"
        partitions = await producer.partitions_for(value_topic)
        part = region_partition(REGION, len(partitions))
        offsets = []
        for seq in range(COMMITTED):
            rec = await producer.send_and_wait(
                value_topic, _signal(seq), key=REGION.encode(), partition=part
            )
            offsets.append(rec.offset)
        changelog = f"{app_id}-value_seen-changelog"
        book = [PROCESSED - 1, PROCESSED, 0, 2.0 * PROCESSED, []]
        await producer.send_and_wait(
            changelog, dumps(book), key=_table_key(PRODUCER), partition=part
        )
        await producer.send_and_wait(
            changelog, dumps(offsets[PROCESSED]), key=_table_key(mark_key(part)), partition=part
        )
        # the group's commit past the signals no book has
        committer = AIOKafkaConsumer(
            bootstrap_servers=kafka_bootstrap, group_id=app_id, enable_auto_commit=False
        )
        await committer.start()
        try:
            tp = TopicPartition(value_topic, part)
            committer.assign([tp])
            await committer.commit({tp: offsets[-1] + 1})
        finally:
            await committer.stop()

        controller.start()
        try:
            deadline = time.monotonic() + 60.0
            while len(_events_of(controller.log, "controller.partitions.assigned")) < 2:
                assert time.monotonic() < deadline, "the restarted controller got no partitions"
                await asyncio.sleep(0.5)
            # one more signal, and another every RESEND_S until the controller has counted
            # every one sent: its value agent starts at the group's commit — or, should its
            # consumer start from the end (the reset is `latest`), at a later signal; either
            # way the first it processes reads the partition again from the mark
            sent = COMMITTED
            got: dict[str, Any] = {}
            deadline = time.monotonic() + 60.0
            while time.monotonic() < deadline and got.get("counted") != sent:
                await producer.send_and_wait(
                    value_topic, _signal(sent), key=REGION.encode(), partition=part
                )
                sent += 1
                wait_s = min(RESEND_S, max(deadline - time.monotonic(), 0.0))
                got = await _counted(kafka_bootstrap, topic_prefix, sent, wait_s)
        finally:
            controller.stop()
    finally:
        await producer.stop()

    assert got.get("counted") == sent, (sent, got)  # every signal once
    assert got.get("missing") == 0, got
    assert got.get("seq") == sent - 1, got
    reread = _events_of(controller.log, "controller.value.reread")
    assert [x["offset"] for x in reread] == [offsets[PROCESSED]], reread
