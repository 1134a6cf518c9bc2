"""Kafka benchmarks: loopback produce and consume rates, broker cold and warm start times.

* ``kafka_produce_msgs_per_s`` — latency messages (a 100-bin sketch and 3 samples, ~1 kB)
  sent with the project's producer settings (``headroom.streams.kafka.make_producer``: acks=all,
  idempotent, linger 5 ms) to a 4-partition topic, until the broker acknowledged all of them.
* ``consume_validated_msgs_per_s`` — the same messages read back through the shared consumer
  loop (``headroom.streams.consume``: decode and validate every message, dead-letter the bad
  ones, hand the good ones on, commit per batch once every dead letter is acknowledged); goal
  ≥ 100,000 msg/s. Baseline: raw aiokafka ``getmany`` of the same records in the same run, so
  the ratio is the share of raw consumption speed the loop keeps. The messages are all valid,
  so no dead letter is sent; the loop still pays for the check on every one. Best of three
  rounds each (one with ``--quick``), raw and loop interleaved, each loop round a new consumer
  group reading the topic from its start.
* ``broker_cold_start_s`` — ``headroom.streams.broker.start`` from nothing: Maven resolves the
broker's
  jars into an empty libs folder (into an empty temporary local repository, i.e. a real first
  download from Maven Central, unless ``--quick``, which resolves from ``~/.m2``), storage is
  formatted, the JVM starts and answers a metadata request.
* ``broker_warm_start_s`` — the same with the jars already there (what the test fixture pays
  on a fresh state directory); ``restart_s`` in the result is a restart on existing storage.

The first two need a reachable broker (``--bootstrap``, ``$KAFKA_BOOTSTRAP_SERVERS`` or the
local one) and report ``skipped`` otherwise; the start benchmarks need java and mvn.
"""

from __future__ import annotations

import asyncio
import shutil
import tempfile
import time
import uuid
from pathlib import Path

from headroom.bench.runner import BenchContext, BenchResult
from headroom.kernel.errors import HeadroomError
from headroom.kernel.sketch import LatencySketch
from headroom.streams import broker, messages
from headroom.streams.consume import ConsumerLoop, LoopConfig, consume
from headroom.streams.kafka import (
    create_topics,
    delete_topics,
    make_consumer,
    make_producer,
    started,
    wait_for_topics,
)
from headroom.streams.topics import topics

PARTITIONS = 4


def _message(i: int) -> bytes:
    sketch = LatencySketch(alpha=0.01)
    for k in range(100):
        sketch.add(20.0 * 1.02**k)  # 100 distinct bins, like a busy replica's window
    msg = messages.Latency(
        ts=1_796_000_000.0 + i,
        region=f"region-{i % 8}",
        replica="rank-3",
        pool="opportunistic",
        path="rma",
        window_s=1.0,
        count=812,
        samples_ms=(41.2, 38.0, 97.5),
        sketch=sketch,
        inflight=12,
        queue_ms=3.1,
    )
    return messages.encode(msg)


def _reachable(ctx: BenchContext) -> str | None:
    if ctx.bootstrap is None:
        return None
    return ctx.bootstrap if broker.probe(ctx.bootstrap, timeout_s=3.0) else None


_SKIP_NO_BROKER = (
    "no reachable Kafka broker (pass --bootstrap, set KAFKA_BOOTSTRAP_SERVERS, or run "
    "`headroom kafka start`)"
)


class _Topic:
    """A fresh bench topic set: created on entry, deleted on exit."""

    def __init__(self, bootstrap: str) -> None:
        self.bootstrap = bootstrap
        self.prefix = f"bench-{uuid.uuid4().hex[:8]}."
        self.all = topics(self.prefix, partitions=PARTITIONS)
        self.latency = f"{self.prefix}latency"

    async def __aenter__(self) -> _Topic:
        await create_topics(self.bootstrap, self.all)
        await wait_for_topics(self.bootstrap, [t.name for t in self.all])
        return self

    async def __aexit__(self, *exc: object) -> None:
        await delete_topics(self.bootstrap, [t.name for t in self.all])


async def _produce(bootstrap: str, topic: str, payloads: list[bytes]) -> float:
    producer = make_producer(bootstrap)
    async with started(producer, bootstrap):
        # Warm-up: connections, metadata, producer id.
        await producer.send_and_wait(topic, payloads[0], key=b"warm-up")
        began = time.perf_counter()
        futures = []
        for i, payload in enumerate(payloads):
            futures.append(await producer.send(topic, payload, key=f"region-{i % 8}".encode()))
        await asyncio.gather(*futures)
        return time.perf_counter() - began


async def _raw_consume(bootstrap: str, topic: str, n: int) -> float:
    consumer = make_consumer(bootstrap, topic, from_beginning=True)
    async with started(consumer, bootstrap):
        got = 0
        began: float | None = None
        while got < n:
            batch = await consumer.getmany(timeout_ms=1000, max_records=2000)
            if began is None and batch:
                began = time.perf_counter()
            got += sum(len(records) for records in batch.values())
        return time.perf_counter() - (began or time.perf_counter())


async def _loop_consume(
    bootstrap: str, prefix: str, topic: str, n: int, group: str = "bench"
) -> float:
    marks: dict[str, float] = {}
    loops: list[ConsumerLoop] = []

    def handle(_record: object) -> None:
        if "first" not in marks:
            marks["first"] = time.perf_counter()
        marks["count"] = marks.get("count", 0) + 1
        if marks["count"] >= n:
            marks["last"] = time.perf_counter()
            loops[0].stop()

    await consume(
        bootstrap,
        [topic],
        handle,
        prefix=prefix,
        group_id=f"{prefix}{group}",
        from_beginning=True,
        config=LoopConfig(batch_max=2000),
        on_loop=loops.append,
        component="bench",
    )
    return marks["last"] - marks["first"]


def produce_rate(ctx: BenchContext) -> BenchResult:
    bootstrap = _reachable(ctx)
    if bootstrap is None:
        return BenchResult(value=None, unit="msg/s", skipped=_SKIP_NO_BROKER)
    n = 2_000 if ctx.quick else 20_000
    payloads = [_message(i) for i in range(n)]

    async def run() -> float:
        async with _Topic(bootstrap) as t:
            return await _produce(bootstrap, t.latency, payloads)

    seconds = asyncio.run(run())
    return BenchResult(
        value=round(n / seconds),
        unit="msg/s",
        extra={"messages": n, "bytes_per_message": len(payloads[0]), "partitions": PARTITIONS},
    )


def consume_rate(ctx: BenchContext) -> BenchResult:
    bootstrap = _reachable(ctx)
    if bootstrap is None:
        return BenchResult(value=None, unit="msg/s", skipped=_SKIP_NO_BROKER)
    n = 2_000 if ctx.quick else 20_000
    rounds = 1 if ctx.quick else 3
    payloads = [_message(i) for i in range(n)]

    async def run() -> tuple[float, float]:
        async with _Topic(bootstrap) as t:
            await _produce(bootstrap, t.latency, payloads)
            raw, loop = [], []
            for r in range(rounds):  # interleaved: each ratio compares rounds of the same load
                raw.append(await _raw_consume(bootstrap, t.latency, n + 1))  # + the warm-up
                # A new consumer group each round: every round reads the topic from the start.
                loop.append(await _loop_consume(bootstrap, t.prefix, t.latency, n + 1, f"b{r}"))
            return min(raw), min(loop)

    raw_s, loop_s = asyncio.run(run())
    value = (n + 1) / loop_s
    baseline = (n + 1) / raw_s
    return BenchResult(
        value=round(value),
        unit="msg/s",
        goal=100_000,
        baseline=round(baseline),
        ratio=round(value / baseline, 3),
        extra={"messages": n + 1, "bytes_per_message": len(payloads[0]), "rounds": rounds},
    )


def _tools_missing() -> str | None:
    for tool in ("java", "mvn"):
        if shutil.which(tool) is None:
            return f"{tool} not found (the broker benchmarks need a JDK 17+ and Maven)"
    return None


def cold_start(ctx: BenchContext) -> BenchResult:
    missing = _tools_missing()
    if missing:
        return BenchResult(value=None, unit="s", skipped=missing)
    with tempfile.TemporaryDirectory(prefix="headroom-bench-kafka-") as tmp:
        root = Path(tmp)
        repo = None if ctx.quick else root / "m2"
        cfg = broker.BrokerConfig(
            state_dir=root / "state",
            port=broker.free_port(),
            libs_dir=root / "libs",
            maven_repo=repo,
            start_timeout_s=600.0,
        )
        try:
            result = broker.start(cfg)
        except HeadroomError as exc:
            return BenchResult(value=None, unit="s", skipped=f"failed: {exc}".splitlines()[0])
        finally:
            broker.stop(cfg.state_dir)
        return BenchResult(
            value=round(result.elapsed_s, 2),
            unit="s",
            extra={
                "maven_resolve_s": round(result.resolve_s, 2),
                "maven_repo": "empty temporary repository" if repo else "~/.m2 (--quick)",
                "kafka_version": broker.kafka_version(),
            },
        )


def warm_start(ctx: BenchContext) -> BenchResult:
    missing = _tools_missing()
    if missing:
        return BenchResult(value=None, unit="s", skipped=missing)
    # Make sure the shared jars exist first, so this measures a warm start only.
    broker.ensure_libs(broker.default_libs_dir())
    with tempfile.TemporaryDirectory(prefix="headroom-bench-kafka-") as tmp:
        cfg = broker.BrokerConfig(state_dir=Path(tmp) / "state", port=broker.free_port())
        try:
            first = broker.start(cfg)
            broker.stop(cfg.state_dir)
            restart = broker.start(cfg)
        except HeadroomError as exc:
            return BenchResult(value=None, unit="s", skipped=f"failed: {exc}".splitlines()[0])
        finally:
            broker.stop(cfg.state_dir)
        return BenchResult(
            value=round(first.elapsed_s, 2),
            unit="s",
            extra={"restart_s": round(restart.elapsed_s, 2), "formatted": first.formatted},
        )


BENCHMARKS = {
    "kafka_produce_msgs_per_s": produce_rate,
    "consume_validated_msgs_per_s": consume_rate,
    "broker_cold_start_s": cold_start,
    "broker_warm_start_s": warm_start,
}
