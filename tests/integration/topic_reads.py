"""Reading a test's topic back to the end: the one helper the stack tests share.

:func:`read_topic` consumes a topic of the test's prefix from the beginning until ``idle_polls``
polls of 300 ms in a row bring nothing (the producers have stopped by then), and returns the
records in time order. :func:`decode_topic` decodes them with the contract's decoder.
"""

from __future__ import annotations

from typing import Any

from headroom.streams import messages
from headroom.streams.kafka import KafkaTarget, make_consumer, started

POLL_MS = 300


async def read_topic(kafka: KafkaTarget, name: str, *, idle_polls: int = 10) -> list[Any]:
    """Every record of topic ``name`` (the prefixed one), sorted by (timestamp, partition,
    offset)."""
    consumer = make_consumer(kafka.bootstrap, kafka.topic(name), from_beginning=True)
    out: list[Any] = []
    async with started(consumer, kafka.bootstrap):
        idle = 0
        while idle < idle_polls:
            batch = await consumer.getmany(timeout_ms=POLL_MS)
            if not batch:
                idle += 1
                continue
            idle = 0
            for records in batch.values():
                out.extend(records)
    out.sort(key=lambda r: (r.timestamp, r.partition, r.offset))
    return out


async def decode_topic(kafka: KafkaTarget, name: str) -> list[Any]:
    """The messages of topic ``name``, decoded (a record that does not decode fails the test)."""
    return [messages.decode(name, r.value) for r in await read_topic(kafka, name)]
