"""What a client's group already published beyond its last offset commit, read from Kafka.

The pure rule is :func:`headroom.workers.offsets.published_ends`; this module fetches its input:
the committed offsets of the assigned ``headroom.requests`` partitions with their metadata (where
the events partition ended at that commit, :func:`headroom.workers.offsets.commit_metadata`), and
the events written there since, up to the end the partition has now. A client calls
:func:`read_published_ends` when partitions are assigned to it, before it reads a request of them
(docs/streaming.md, *Faults*), and :func:`commit_start` first, so that a group's very first
member leaves a commit to resume from however soon it dies.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.partitioner import DefaultPartitioner

from headroom.kernel.codec import ValidationError, dumps
from headroom.streams import messages
from headroom.streams.kafka import KafkaTarget, admin, make_consumer, started
from headroom.workers.offsets import (
    commit_metadata,
    parse_commit_metadata,
    published_ends,
    published_value_signals,
)

__all__ = ["Published", "commit_start", "committed_marks", "read_published_ends"]


async def committed_marks(
    kafka: KafkaTarget, group: str, partitions: Collection[int]
) -> dict[int, tuple[int, int, int]]:
    """Per partition of ``headroom.requests`` with a commit that carries a mark: ``(committed
    offset, events partition, events offset)``."""
    topic = kafka.topic("requests")
    tps = [TopicPartition(topic, p) for p in sorted(partitions)]
    async with admin(kafka.bootstrap) as client:
        committed = await client.list_consumer_group_offsets(group, partitions=tps)
    out: dict[int, tuple[int, int, int]] = {}
    for tp, meta in committed.items():
        if meta.offset < 0:
            continue
        mark = parse_commit_metadata(meta.metadata)
        if mark is not None:
            out[tp.partition] = (int(meta.offset), mark[0], mark[1])
    return out


@dataclass(frozen=True, slots=True)
class Published:
    """What a client's group published beyond its last commit (:func:`read_published_ends`)."""

    ends: dict[int, int]
    value_signals: list[messages.ValueSignal]


async def read_published_ends(
    kafka: KafkaTarget,
    group: str,
    partitions: Collection[int],
    *,
    region: str,
    policy: str | None = None,
    timeout_s: float = 20.0,
) -> Published:
    """Per assigned partition, the highest request offset the group's window lines published
    after its last commit cover (only those at or past the committed offset: the rest were
    committed), and the value signals those lines carry (to be sent again: their flush may have
    ended before it sent them). Empty when nothing was published beyond the commits (the usual
    case). A carried signal that does not decode is skipped (it was validated when written)."""
    marks = await committed_marks(kafka, group, partitions)
    if not marks:
        return Published({}, [])
    by_events: dict[int, int] = {}  # events partition -> the lowest mark to read from
    for _committed, events_partition, events_offset in marks.values():
        by_events[events_partition] = min(events_offset, by_events.get(events_partition, 1 << 62))
    lines = await _read_events(kafka, by_events, timeout_s)
    ends = published_ends(lines, set(marks), region=region, policy=policy)
    committed = {p: mark[0] for p, mark in marks.items()}
    signals = []
    for raw in published_value_signals(lines, committed, region=region, policy=policy):
        try:
            signal = messages.decode("value", dumps(raw))
        except ValidationError:
            continue
        if isinstance(signal, messages.ValueSignal):
            signals.append(signal)
    return Published({p: end for p, end in ends.items() if end >= marks[p][0]}, signals)


async def _read_events(
    kafka: KafkaTarget, start: dict[int, int], timeout_s: float
) -> list[dict[str, Any]]:
    """The events from ``start`` (``{partition: offset}``) to each partition's end now."""
    topic = kafka.topic("events")
    consumer = make_consumer(kafka.bootstrap)
    out: list[dict[str, Any]] = []
    async with started(consumer, kafka.bootstrap):
        tps = {TopicPartition(topic, p): o for p, o in start.items()}
        consumer.assign(list(tps))
        ends = await consumer.end_offsets(list(tps))
        todo = {tp for tp in tps if ends[tp] > tps[tp]}
        for tp in todo:
            consumer.seek(tp, tps[tp])
        deadline = time.monotonic() + timeout_s
        while todo:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{topic}: not read to its end within {timeout_s:.0f} s")
            batches = await consumer.getmany(*todo, timeout_ms=200)
            for tp, records in batches.items():
                for r in records:
                    if r.offset >= ends[tp]:
                        break
                    try:
                        event = messages.decode("events", r.value)
                    except ValidationError:
                        continue
                    if isinstance(event, messages.Event) and event.kind == "window":
                        out.append(event.to_dict())
            for tp in list(todo):
                if await consumer.position(tp) >= ends[tp]:
                    todo.discard(tp)
            await asyncio.sleep(0)
    return out


async def commit_start(
    consumer: AIOKafkaConsumer,
    producer: AIOKafkaProducer,
    kafka: KafkaTarget,
    partitions: Collection[int],
    *,
    region: str,
) -> dict[int, int]:
    """Commit, for every assigned ``headroom.requests`` partition the group has never committed,
    its end offset now, with the mark of the region's events partition end (the window lines
    this client will write come after it). Called when partitions are assigned, before a request
    of them is read: a client killed before its first flush's commit is then resumed from where
    it started reading (its published lines found from the mark), instead of from the end of the
    partition, which would lose what it had read. Returns what it committed."""
    topic = kafka.topic("requests")
    tps = [TopicPartition(topic, p) for p in sorted(partitions)]
    fresh = [tp for tp in tps if await consumer.committed(tp) is None]
    if not fresh:
        return {}
    events = kafka.topic("events")
    events_partitions = sorted(await producer.partitions_for(events))
    mark = DefaultPartitioner()(region.encode(), events_partitions, events_partitions)
    events_tp = TopicPartition(events, mark)
    ends = await consumer.end_offsets([*fresh, events_tp])  # one request for both
    meta = commit_metadata(mark, int(ends[events_tp]))
    await consumer.commit({tp: (int(ends[tp]), meta) for tp in fresh})
    return {tp.partition: int(ends[tp]) for tp in fresh}
