"""A client stopped between the acknowledgement of its window lines and its offset commit.

The exact crash the published-prefix check exists for (docs/streaming.md, *Faults*), reproduced
on the shared broker with the client core in this process: client A serves a first batch of
requests and commits it; it serves a second batch, the broker acknowledges its window lines,
and A is stopped right there — at the :attr:`RankingClient.before_commit` seam, so its commit of
the second batch never happens — without a drain (a crash: no final publish, no commit). Client
B, the same static group member, is assigned the partition at the old committed offset and
reads the second batch again. It must drop every one of those requests as a duplicate (it never
served them, its memory of ids is new) and serve the third batch fed after it started: across
both clients the window lines count every request exactly once.

The same crash before the group's very first flush commit: the client commits the partition's
end when it is assigned (before reading), so its restart resumes from there — not from the end of
the partition, which would lose what the first client had read.

The servers are not the point here: ``serve_request`` is replaced by an instant outcome.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from aiokafka import AIOKafkaProducer

from headroom.kernel.scenario_load import load_scenario
from headroom.streams import messages
from headroom.streams.kafka import KafkaTarget, admin
from headroom.workers.client import ClientConfig, Outcome, RankingClient, ServerAddress
from tests.integration.topic_reads import read_topic

pytestmark = pytest.mark.integration

SCENARIO = Path(__file__).parent / "scenarios" / "stack-short.yaml"
REGION = "it-east"
BATCHES = (5, 12, 7)


class InstantClient(RankingClient):
    """A client whose every request is served at once (no server call)."""

    async def serve_request(
        self, msg: messages.Request, partition: int, offset: int, *, late: bool = False
    ) -> Outcome:
        return Outcome(
            partition=partition, offset=offset, segment=msg.segment,
            end_t=self.scenario_time(), latency_ms=1.0, ok=True, timeout=False,
            control=False, lever=None, sbm_served=False, routed="rma",
            value_total=msg.value, value_baseline=msg.value, value_signal=msg.value,
        )  # fmt: skip


def _client(kafka: KafkaTarget, group: str, t0: float) -> InstantClient:
    config = ClientConfig(
        region=REGION,
        servers=(ServerAddress("dedicated", "127.0.0.1", 9),),  # never called
        group=group,
        name="client-crash",
        instance=f"{group}-0",  # static membership: the restart gets the partition back
        t0=t0,
        precompute=False,
        flush_s=0.3,
    )
    return InstantClient(config, load_scenario(SCENARIO), kafka)


async def _feed(producer: AIOKafkaProducer, kafka: KafkaTarget, first: int, n: int) -> None:
    for i in range(first, first + n):
        msg = messages.Request(
            ts=time.time(), id=f"r{i}", region=REGION, segment="casual", value=1.0,
            eligible=True, user=i,
        )  # fmt: skip
        await producer.send(kafka.topic("requests"), messages.encode(msg), key=msg.key())
    await producer.flush()


async def _until(what: Any, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not what():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.05)


async def _committed(kafka: KafkaTarget, group: str) -> dict[int, int]:
    async with admin(kafka.bootstrap) as client:
        got = await client.list_consumer_group_offsets(group)
    return {tp.partition: meta.offset for tp, meta in got.items() if meta.offset >= 0}


async def _client_windows(kafka: KafkaTarget) -> list[dict[str, Any]]:
    """Every client ``window`` line on the events topic."""
    lines = [
        messages.decode("events", r.value).to_dict()  # type: ignore[union-attr]
        for r in await read_topic(kafka, "events")
    ]
    return [e for e in lines if e["kind"] == "window" and e["source"] == "client"]


async def _value_signals(kafka: KafkaTarget) -> tuple[dict[tuple[str, int], Any], int]:
    """The distinct value signals on the value topic by (producer, seq), each with its copies'
    contents all equal (checked), and the number of messages."""
    records = await read_topic(kafka, "value")
    distinct: dict[tuple[str, int], Any] = {}
    for r in records:
        sig = messages.decode("value", r.value)
        assert isinstance(sig, messages.ValueSignal)
        assert sig.producer is not None
        assert sig.seq is not None
        key = (sig.producer, sig.seq)
        assert distinct.setdefault(key, sig) == sig, key  # a copy is the same signal
    return distinct, len(records)


def _requests_valued(signals: dict[tuple[str, int], Any]) -> int:
    """Requests the distinct signals account for: every request is in one arm of lever rma."""
    return sum(s.n for s in signals.values() if s.lever == "rma")


async def _crash_in_the_second_batch(
    kafka: KafkaTarget, seam: str, after_crash: Callable[[InstantClient], Awaitable[None]]
) -> tuple[InstantClient, InstantClient]:
    """Client A serves and commits the first batch, then is stopped at ``seam`` (an awaited
    hook of its flush: ``before_values`` or ``before_commit``) in the flush that published the
    second batch's lines, without a drain (a crash); ``after_crash`` checks the state it left.
    Client B, the same static member, takes over, serves the third batch and drains."""
    group = f"{seam}-{uuid.uuid4().hex[:8]}"
    t0 = time.time()
    first, second, third = BATCHES
    producer = AIOKafkaProducer(bootstrap_servers=kafka.bootstrap)
    await producer.start()
    a = _client(kafka, group, t0)
    crashed = asyncio.Event()

    async def stop_here() -> None:
        if a.stats["published"] > first:  # the second batch's lines are acknowledged
            crashed.set()
            await asyncio.Event().wait()  # goes no further: the test stops A here

    try:
        await a.start()
        await asyncio.wait_for(a.ready.wait(), 30.0)
        await _feed(producer, kafka, 0, first)
        await _until(lambda: a.stats["commits"] >= 1 and a.stats["published"] == first)
        setattr(a, seam, stop_here)
        await _feed(producer, kafka, first, second)
        await asyncio.wait_for(crashed.wait(), 30.0)
        assert a.stats["published"] == first + second
        await a.stop()  # no drain: no final flush, no commit (a crash)
        await after_crash(a)

        b = _client(kafka, group, t0)
        try:
            await b.start()
            await asyncio.wait_for(b.ready.wait(), 30.0)
            await _feed(producer, kafka, first + second, third)
            await _until(lambda: b.stats["duplicates"] + b.stats["published"] == second + third)
            await b.drain()  # publishes what is left and commits
        finally:
            await b.stop()
    finally:
        if not a.stop_requested:
            await a.stop()
        await producer.stop()
    assert b.stats["duplicates"] == second  # re-read, recognised, dropped
    assert b.stats["published"] == third
    return a, b


async def test_a_client_stopped_between_publish_and_commit_is_not_counted_twice(
    kafka_target: KafkaTarget,
) -> None:
    kafka = kafka_target
    first, second, third = BATCHES

    async def published_not_committed(a: InstantClient) -> None:
        # the window is reproduced: the second batch is published but not committed
        committed = await _committed(kafka, a.config.group)
        assert sum(committed.values()) == first, committed

    a, _b = await _crash_in_the_second_batch(kafka, "before_commit", published_not_committed)
    windows = await _client_windows(kafka)
    assert sum(e.get("requests", 0) for e in windows) == first + second + third
    assert sum(e.get("duplicates_dropped", 0) for e in windows) == second
    after = await _committed(kafka, a.config.group)
    assert sum(after.values()) == first + second + third, after
    # A's signals of the second batch went out before the stop; B sent them again from the lines
    signals, messages_on_topic = await _value_signals(kafka)
    assert _requests_valued(signals) == first + second + third
    assert messages_on_topic > len(signals)


async def test_a_client_stopped_between_its_lines_and_their_value_signals_loses_no_value(
    kafka_target: KafkaTarget,
) -> None:
    """A stopped after the broker acknowledged the second batch's window lines and before it
    sent their value signals: B drops those requests as duplicates and sends the value signals
    the lines carry, under A's producer id, so every request's value is counted once."""
    kafka = kafka_target
    first, second, third = BATCHES

    async def values_not_sent(_a: InstantClient) -> None:
        lost, _n = await _value_signals(kafka)
        assert _requests_valued(lost) == first  # the window is reproduced

    a, b = await _crash_in_the_second_batch(kafka, "before_values", values_not_sent)
    signals, _n = await _value_signals(kafka)
    assert _requests_valued(signals) == first + second + third
    assert {p for p, _seq in signals} == {a.producer_id, b.producer_id}


async def test_a_client_stopped_before_its_groups_first_commit_loses_nothing(
    kafka_target: KafkaTarget,
) -> None:
    kafka = kafka_target
    group = f"first-{uuid.uuid4().hex[:8]}"
    t0 = time.time()
    read, unread, later = 6, 4, 5
    producer = AIOKafkaProducer(bootstrap_servers=kafka.bootstrap)
    await producer.start()
    a = _client(kafka, group, t0)
    crashed = asyncio.Event()

    async def stop_before_commit() -> None:
        if a.stats["published"] > 0:  # the first flush that published anything
            crashed.set()
            await asyncio.Event().wait()  # ... never commits

    a.before_commit = stop_before_commit
    try:
        await a.start()
        await asyncio.wait_for(a.ready.wait(), 30.0)
        started = await _committed(kafka, group)  # the start commit, before any request
        assert started, "no commit at assignment"
        await _feed(producer, kafka, 0, read)
        await asyncio.wait_for(crashed.wait(), 30.0)
        await a.stop()  # a crash: no drain, no commit
        published = a.stats["published"]
        assert 0 < published <= read
        assert await _committed(kafka, group) == started
        await _feed(producer, kafka, read, unread)  # fed while no client runs

        b = _client(kafka, group, t0)
        try:
            await b.start()
            await asyncio.wait_for(b.ready.wait(), 30.0)
            await _feed(producer, kafka, read + unread, later)
            total = read + unread + later
            await _until(lambda: b.stats["duplicates"] + b.stats["published"] == total)
            await b.drain()
        finally:
            await b.stop()
    finally:
        if not a.stop_requested:
            await a.stop()
        await producer.stop()

    assert b.stats["duplicates"] == published  # published by A, recognised from the start mark
    # nothing lost: what A read and did not publish, what was fed while no client ran, and later
    assert b.stats["published"] == read - published + unread + later
    windows = await _client_windows(kafka)
    assert sum(e.get("requests", 0) for e in windows) == read + unread + later
