"""What one ``headroom up`` run put on its topics, counted from the topics themselves.

Nothing lost, nothing doubled needs a count that does not come from the components under test:
``headroom up`` notes the end offsets of ``headroom.requests`` and ``headroom.value`` before the
feed starts (:func:`end_offsets`), and once every process has stopped reads both topics from
there to their end (:func:`audit_topics`):

* ``requests.fed`` — distinct request ids (a feed restarted after a kill sends some again; the
  copies are ``requests.messages − requests.fed``);
* ``value.published`` — distinct ``(producer, seq)`` pairs of the value signals (a producer retry
  can write one twice; ``value.messages`` counts every copy); signals without a producer id (an
  older client) count as ``value.unattributed``, each message once;
* ``value.producers`` — the same per producer (a client process start: several clients of a
  region, and a restarted client, each have their own): its ``region``, ``published`` (distinct
  signals), ``n`` and ``value_sum`` (sums over its distinct signals), so what several clients of
  a region published can be added up and compared with what the controllers counted;
* ``requests.regions`` — distinct request ids per region.

The result is the ``stack.audit`` event (source ``up``) that :mod:`headroom.analysis.metrics`
turns into ``requests.fed`` and ``value.signals.published``.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from typing import Any

from aiokafka import TopicPartition

from headroom.kernel.codec import ValidationError
from headroom.kernel.logs import get_logger
from headroom.streams import messages
from headroom.streams.kafka import KafkaTarget, admin, make_consumer, started, topic_partitions

__all__ = ["audit_event", "audit_topics", "end_offsets"]

log = get_logger("up")

AUDITED = ("requests", "value")
READ_TIMEOUT_S = 120.0


async def end_offsets(kafka: KafkaTarget, kinds: tuple[str, ...] = AUDITED) -> dict[str, Any]:
    """``{kind: {partition: end offset}}`` now: where this run's messages will start."""
    names = [kafka.topic(kind) for kind in kinds]
    async with admin(kafka.bootstrap) as client:
        counts = await topic_partitions(client, names)
    consumer = make_consumer(kafka.bootstrap)
    out: dict[str, dict[int, int]] = {}
    async with _assigned_consumer(consumer, kafka.bootstrap):
        for kind, topic in zip(kinds, names, strict=True):
            tps = [TopicPartition(topic, p) for p in range(counts.get(topic, 0))]
            ends = await consumer.end_offsets(tps) if tps else {}
            out[kind] = {tp.partition: int(o) for tp, o in ends.items()}
    return out


async def audit_topics(kafka: KafkaTarget, start: dict[str, Any]) -> dict[str, Any]:
    """Read every audited topic from ``start`` (:func:`end_offsets`) to its end now, and count."""
    requests: set[str] = set()
    per_region: dict[str, set[str]] = {}
    signals: set[tuple[str, int]] = set()
    producers: dict[str, dict[str, Any]] = {}
    counts = {"requests": 0, "value": 0, "unattributed": 0, "invalid": 0}
    consumer = make_consumer(kafka.bootstrap)
    async with _assigned_consumer(consumer, kafka.bootstrap):
        for kind in AUDITED:
            topic = kafka.topic(kind)
            begin = {TopicPartition(topic, p): o for p, o in start.get(kind, {}).items()}
            async for raw in _read(consumer, begin):
                counts[kind] += 1
                try:
                    msg = messages.decode(kind, raw)
                except ValidationError:
                    counts["invalid"] += 1
                    continue
                if isinstance(msg, messages.Request):
                    requests.add(msg.id)
                    per_region.setdefault(msg.region, set()).add(msg.id)
                elif isinstance(msg, messages.ValueSignal):
                    if msg.producer is None or msg.seq is None:
                        counts["unattributed"] += 1
                    elif (msg.producer, msg.seq) not in signals:
                        signals.add((msg.producer, msg.seq))
                        _add_signal(producers, msg)
    return {
        "requests": {
            "fed": len(requests),
            "messages": counts["requests"],
            "regions": {r: len(ids) for r, ids in sorted(per_region.items())},
        },
        "value": {
            "published": len(signals) + counts["unattributed"],
            "messages": counts["value"],
            "unattributed": counts["unattributed"],
            "producers": dict(sorted(producers.items())),
        },
        "invalid": counts["invalid"],
    }


def _add_signal(producers: dict[str, dict[str, Any]], msg: messages.ValueSignal) -> None:
    """Add one distinct value signal to its producer's totals."""
    assert msg.producer is not None
    book = producers.setdefault(
        msg.producer, {"region": msg.region, "published": 0, "n": 0, "value_sum": 0.0}
    )
    book["published"] += 1
    book["n"] += int(msg.n)
    book["value_sum"] += float(msg.value_sum)


@contextlib.asynccontextmanager
async def _assigned_consumer(consumer: Any, bootstrap: str) -> AsyncIterator[None]:
    """:func:`started` for a consumer with assigned partitions: aiokafka's stop of such a
    consumer without a group can end in a CancelledError of its own internal task; that one is
    not a cancellation of ours, so it is dropped (a real cancellation is passed on)."""
    try:
        async with started(consumer, bootstrap):
            yield
    except asyncio.CancelledError:
        task = asyncio.current_task()
        if task is not None and task.cancelling():
            raise


async def _read(consumer: Any, begin: dict[TopicPartition, int]) -> Any:
    """Every message value of ``begin``'s partitions from its offset to the end as of now."""
    if not begin:
        return
    consumer.assign(list(begin))
    for tp, offset in begin.items():
        consumer.seek(tp, offset)
    ends = await consumer.end_offsets(list(begin))
    left = {tp for tp in begin if ends[tp] > begin[tp]}
    deadline = time.monotonic() + READ_TIMEOUT_S
    while left and time.monotonic() < deadline:
        batch = await consumer.getmany(*left, timeout_ms=500, max_records=5000)
        for tp, records in batch.items():
            for record in records:
                if record.offset < ends[tp] and record.value is not None:
                    yield record.value
        for tp in list(left):
            if await consumer.position(tp) >= ends[tp]:
                left.discard(tp)
    if left:
        log.warning("up.audit.incomplete", partitions=sorted(str(tp) for tp in left))


def audit_event(audit: dict[str, Any]) -> dict[str, Any]:
    """The ``stack.audit`` event line of an audit."""
    return {
        "v": 1,
        "ts": time.time(),
        "kind": "stack.audit",
        "source": "up",
        "policy": "headroom",
        "region": None,
        **audit,
    }
