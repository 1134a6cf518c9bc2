"""``headroom record`` and ``headroom replay`` (README.md, *Commands*): topics to JSON lines and
back.

``record --topic T [--topic T2]… --out FILE [--from-beginning] [--timeout S]`` reads the
topics without a consumer group (nothing committed, no real consumer disturbed) and writes one
kcat ``-J`` envelope per record (:mod:`headroom.streams.recording`), flushed per batch, until ``S``
seconds pass with no new record, or until SIGINT/SIGTERM — either way the file is complete
and the last stdout line is ``{"out":…,"records":N}``.

``replay FILE [--speed X] [--topic-map OLD=NEW]… [--prefix P]`` streams the file (never loaded
whole) into Kafka: per-key order kept (key-partitioned producer, idempotent, records in each
source partition's order), relative timing kept at ``X`` times the recorded speed (``0``: as
fast as possible), topics renamed by ``--topic-map`` or moved to an explicit ``--prefix``. A
corrupt line is reported on stderr with its line number and reason and skipped; the rest is
replayed, and the command then exits 1 so a script notices. Last stdout line:
``{"file":…,"replayed":N,"corrupt":M}``.

Both draw a progress bar on stderr when it is a terminal.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any, BinaryIO, TextIO

import orjson
from aiokafka import AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.errors import KafkaError

from headroom.kernel.errors import ConfigError, HeadroomError
from headroom.kernel.logs import get_logger
from headroom.streams import kafka
from headroom.streams.consume import stop_on_signals
from headroom.streams.recording import (
    CorruptLine,
    Envelope,
    Pacer,
    TopicRouter,
    encode_envelope,
    merge_by_time,
    parse_topic_map,
    read_recording,
)
from headroom.streams.topics import keyed_partition, trailing_kind

EXIT_OK = 0
EXIT_CORRUPT_LINES = 1
MAX_IN_FLIGHT = 20_000  # sends awaited in chunks: bounded memory, batching intact
TSTYPES = {0: "create", 1: "logappend"}


class Progress:
    """A one-line progress bar on a terminal; silent otherwise (logs carry the summary)."""

    def __init__(
        self,
        label: str,
        total: int | None = None,
        stream: TextIO | None = None,
        enabled: bool | None = None,
    ) -> None:
        self.label = label
        self.total = total
        self.stream = stream or sys.stderr
        self.enabled = self.stream.isatty() if enabled is None else enabled
        self.began = time.monotonic()
        self._last = 0.0

    def render(self, done: int, records: int) -> str:
        rate = records / max(time.monotonic() - self.began, 1e-9)
        counts = f"{records:,} records  {rate:,.0f}/s"
        if not self.total:
            return f"{self.label}  {counts}"
        share = min(1.0, done / self.total)
        width = 28
        filled = int(share * width)
        bar = "█" * filled + " " * (width - filled)
        mb = f"{done / 1e6:,.1f}/{self.total / 1e6:,.1f} MB"
        return f"{self.label} {share:4.0%} |{bar}| {mb}  {counts}"

    def update(self, done: int, records: int, force: bool = False) -> None:
        if not self.enabled:
            return
        now = time.monotonic()
        if not force and now - self._last < 0.1:
            return
        self._last = now
        self.stream.write("\r" + self.render(done, records) + "\x1b[K")
        self.stream.flush()

    def close(self, done: int, records: int) -> None:
        if self.enabled:
            self.update(done, records, force=True)
            self.stream.write("\n")
            self.stream.flush()


# ---------------------------------------------------------------------------------------------
# record
# ---------------------------------------------------------------------------------------------


def record(args: argparse.Namespace) -> int:
    target = kafka.KafkaTarget.from_args(args)
    names = list(dict.fromkeys(target.resolve(t)[0] for t in args.topic))
    out = Path(args.out)
    if out.parent and not out.parent.exists():
        raise ConfigError(f"--out: directory {str(out.parent)!r} does not exist")
    timeout = args.timeout
    try:
        count, per_topic = asyncio.run(
            _record(target, names, out, bool(args.from_beginning), timeout)
        )
    except KafkaError as exc:
        raise HeadroomError(f"recording from {target.bootstrap} failed: {exc!r}") from None
    get_logger("record").info("record.finished", out=str(out), records=count, topics=per_topic)
    print(orjson.dumps({"out": str(out), "records": count}).decode(), flush=True)
    return EXIT_OK


async def _existing(bootstrap: str, names: list[str]) -> None:
    async with kafka.admin(bootstrap) as client:
        present = await kafka.topic_partitions(client, names)
    missing = [n for n in names if n not in present]
    if missing:
        raise ConfigError([f"--topic: {n!r} does not exist on {bootstrap}" for n in missing])


async def _record(
    target: kafka.KafkaTarget,
    names: list[str],
    out: Path,
    from_beginning: bool,
    idle_s: float | None,
) -> tuple[int, dict[str, int]]:
    await _existing(target.bootstrap, names)
    consumer = kafka.make_consumer(
        target.bootstrap, *names, group_id=None, from_beginning=from_beginning
    )
    stopping = asyncio.Event()
    per_topic: Counter[str] = Counter()
    progress = Progress(f"record {', '.join(names)}")
    loop = asyncio.get_running_loop()
    count = 0
    async with stop_on_signals(stopping.set), kafka.started(consumer, target.bootstrap):
        with open(out, "wb") as fh:  # noqa: ASYNC230 - one open; writes are per batch
            idle_since: float | None = None
            while not stopping.is_set():
                batch = await consumer.getmany(timeout_ms=200, max_records=1000)
                now = loop.time()
                if batch:
                    idle_since = now
                    for records in batch.values():
                        for rec in records:
                            fh.write(encode_envelope(_envelope(rec)) + b"\n")
                            per_topic[rec.topic] += 1
                            count += 1
                    fh.flush()
                    progress.update(0, count)
                elif not consumer.assignment():
                    idle_since = None
                elif idle_since is None:
                    idle_since = now
                if idle_s is not None and idle_since is not None and now - idle_since >= idle_s:
                    break
    progress.close(0, count)
    return count, dict(per_topic)


def _envelope(rec: Any) -> Envelope:
    return Envelope(
        topic=rec.topic,
        partition=rec.partition,
        offset=rec.offset,
        key=rec.key,
        payload=rec.value,
        ts=rec.timestamp if rec.timestamp is not None and rec.timestamp >= 0 else None,
        tstype=TSTYPES.get(rec.timestamp_type, "create"),
        broker=-1,
        headers=tuple((name, value) for name, value in (rec.headers or ())),
    )


# ---------------------------------------------------------------------------------------------
# replay
# ---------------------------------------------------------------------------------------------


def replay(args: argparse.Namespace) -> int:
    path = Path(args.file)
    if not path.is_file():
        raise ConfigError(f"FILE: {str(path)!r} is not a readable file")
    target = kafka.KafkaTarget.from_args(args)
    explicit_prefix = args.prefix is not None or "HEADROOM_TOPIC_PREFIX" in os.environ
    router = TopicRouter(
        parse_topic_map(args.topic_map or []), target.prefix if explicit_prefix else None
    )
    pacer = Pacer(float(args.speed))
    log = get_logger("replay")
    with open(path, "rb") as fh:
        try:
            result = asyncio.run(_replay(target.bootstrap, fh, path, router, pacer))
        except KafkaError as exc:
            raise HeadroomError(f"replay into {target.bootstrap} failed: {exc!r}") from None
    replayed, corrupt, per_topic = result
    log.info(
        "replay.finished", file=str(path), replayed=replayed, corrupt=corrupt, topics=per_topic
    )
    line = {"file": str(path), "replayed": replayed, "corrupt": corrupt}
    print(orjson.dumps(line).decode(), flush=True)
    if corrupt:
        print(
            f"headroom: {path}: {corrupt} corrupt line(s) skipped (see above); "
            f"the other {replayed} records were replayed",
            file=sys.stderr,
        )
        return EXIT_CORRUPT_LINES
    return EXIT_OK


class _Sender:
    """Sends envelopes with one producer, checking each target topic once."""

    def __init__(
        self, producer: AIOKafkaProducer, admin: AIOKafkaAdminClient, router: TopicRouter
    ) -> None:
        self.producer = producer
        self.admin = admin
        self.router = router
        self.partitions: dict[str, int] = {}
        self.in_flight: list[asyncio.Future[Any]] = []
        self.per_topic: Counter[str] = Counter()

    async def _partitions(self, topic: str) -> int:
        known = self.partitions.get(topic)
        if known is None:
            # The admin look-up answers at once; the producer would wait a full request
            # timeout for a topic that does not exist.
            found = (await kafka.topic_partitions(self.admin, [topic])).get(topic)
            if not found:
                raise HeadroomError(
                    f"replay: topic {topic!r} does not exist; create it (`headroom topics "
                    f"create`) or rename it with --topic-map {topic}=NEW"
                )
            known = self.partitions[topic] = found
        return known

    async def send(self, env: Envelope) -> None:
        topic = self.router.route(env.topic)
        count = await self._partitions(topic)
        # Keyed records: the producer's murmur2 partitioner, as Java clients and kcat use, so
        # one key lands in one partition in recorded order (a request keyed region/shard: its
        # shard's partition, as the feed writes it). Unkeyed: the recorded partition where it
        # exists, so their per-partition order survives too.
        partition = env.partition if env.key is None and env.partition < count else None
        if env.key is not None:
            partition = keyed_partition(trailing_kind(topic), env.key, count)
        headers = [(name, value if value is not None else b"") for name, value in env.headers]
        future = await self.producer.send(
            topic, env.payload, key=env.key, partition=partition, headers=headers or None
        )
        self.in_flight.append(future)
        self.per_topic[topic] += 1
        if len(self.in_flight) >= MAX_IN_FLIGHT:
            await self.drain()

    async def drain(self) -> None:
        if self.in_flight:
            pending, self.in_flight = self.in_flight, []
            await asyncio.gather(*pending)


async def _replay(
    bootstrap: str, fh: BinaryIO, path: Path, router: TopicRouter, pacer: Pacer
) -> tuple[int, int, dict[str, int]]:
    log = get_logger("replay")
    loop = asyncio.get_running_loop()
    producer = kafka.make_producer(bootstrap, linger_ms=10, max_request_size=2 * 1024 * 1024)
    total = os.fstat(fh.fileno()).st_size
    progress = Progress(f"replay {path.name}", total=total)
    stopping = asyncio.Event()
    replayed = corrupt = 0
    items = read_recording(fh)
    ordered = merge_by_time(items) if pacer.speed > 0 else items
    async with (
        stop_on_signals(stopping.set),
        kafka.started(producer, bootstrap),
        kafka.admin(bootstrap) as admin,
    ):
        sender = _Sender(producer, admin, router)
        start = loop.time()
        for item in ordered:
            if stopping.is_set():
                break
            if isinstance(item, CorruptLine):
                corrupt += 1
                print(
                    f"headroom: {path}:{item.lineno}: corrupt line: {item.reason}", file=sys.stderr
                )
                log.warning(
                    "replay.line.skipped", file=str(path), line=item.lineno, reason=item.reason
                )
                continue
            delay = start + pacer.due_s(item.ts) - loop.time()
            if delay > 0:
                await sender.drain()  # what is due now goes out before we sleep
                delay = start + pacer.due_s(item.ts) - loop.time()
                if delay > 0:
                    await _sleep_unless(stopping, delay)
                    if stopping.is_set():
                        break
            await sender.send(item)
            replayed += 1
            progress.update(fh.tell(), replayed)
        await sender.drain()
        await producer.flush()
    progress.close(fh.tell(), replayed)
    return replayed, corrupt, dict(sender.per_topic)


async def _sleep_unless(event: asyncio.Event, seconds: float) -> None:
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(event.wait(), timeout=seconds)
