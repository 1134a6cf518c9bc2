"""Recordings: JSON lines in the envelope ``kcat -C -J`` writes, and the pure logic of replay.

No I/O beyond reading and writing lines: :mod:`headroom.commands.record` connects these pieces to
Kafka. Everything here is unit-tested without a broker.

**The format** (one record a line, exactly kcat's fields and order)::

    {"topic":"headroom.capacity","partition":0,"offset":41,"tstype":"create",
     "ts":1796000000123,"broker":1,"headers":["h","v"],"key":"us-east","payload":"{...}"}

``ts`` is milliseconds since the epoch; ``key`` and ``payload`` are the record's bytes as a JSON
string, or ``null`` (no key; a tombstone); ``headers`` (a flat ``[name, value, …]`` list) is
present only when the record has headers. Bytes that are not UTF-8 are written raw inside the
string, as kcat does, and read back losslessly (the decoder falls back to ``surrogateescape``),
so a recording made by either tool replays with the other. ``broker`` is the leader's id where
kcat knows it; ``headroom record`` writes -1 (kcat's own "unknown").

**Order and timing on replay.** Records are sent in an order that keeps each source
(topic, partition) — hence each key — in recorded order; replaying through a producer that
partitions by key keeps per-key order in the target. A kcat recording of a backlog holds long
runs of one partition, then the next, so file order alone would squash the relative timing
across partitions: :func:`merge_by_time` therefore merges the partitions' runs by timestamp
through a bounded window (default 10,000 records), always emitting a queue's head, never
reordering within a queue. :class:`Pacer` turns timestamps into send times: record *i* is
due ``(ts_i − ts_0) / 1000 / speed`` seconds after the start; ``speed = 0`` means as fast as
possible; a record whose time has passed goes at once (it is never reordered to catch up).
"""

from __future__ import annotations

import heapq
import json
from collections import deque
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, BinaryIO

import orjson

from headroom.kernel.errors import ConfigError
from headroom.streams.topics import trailing_kind

ENVELOPE_FIELDS = (
    "topic",
    "partition",
    "offset",
    "tstype",
    "ts",
    "broker",
    "headers",
    "key",
    "payload",
)
REQUIRED_FIELDS = ("topic", "partition", "offset", "payload")
DEFAULT_MERGE_WINDOW = 10_000
MAX_LINE_BYTES = 64 * 1024 * 1024  # a line over this is reported corrupt, never loaded whole


class CorruptLine(Exception):
    """A line of a recording that cannot be replayed: which line, and why."""

    def __init__(self, lineno: int, reason: str) -> None:
        self.lineno = lineno
        self.reason = reason
        super().__init__(f"line {lineno}: {reason}")


@dataclass(frozen=True)
class Envelope:
    """One recorded Kafka record."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    payload: bytes | None
    ts: int | None = None  # ms since the epoch; None when the record has no timestamp
    tstype: str = "create"
    broker: int = -1
    headers: tuple[tuple[str, bytes | None], ...] = ()


# ---------------------------------------------------------------------------------------------
# Writing
# ---------------------------------------------------------------------------------------------


def _text(data: bytes | None) -> tuple[str | None, bool]:
    """Bytes as a JSON string value, and whether they were valid UTF-8."""
    if data is None:
        return None, True
    try:
        return data.decode("utf-8"), True
    except UnicodeDecodeError:
        return data.decode("utf-8", "surrogateescape"), False


def encode_envelope(env: Envelope) -> bytes:
    """One line (without the newline) in kcat's ``-J`` envelope, kcat's field order."""
    key, key_ok = _text(env.key)
    payload, payload_ok = _text(env.payload)
    obj: dict[str, Any] = {
        "topic": env.topic,
        "partition": env.partition,
        "offset": env.offset,
        "tstype": env.tstype,
        "ts": env.ts if env.ts is not None else -1,
        "broker": env.broker,
    }
    raw_headers = [_text(v) for _, v in env.headers]
    if env.headers:
        flat: list[str | None] = []
        for (name, _), (value, _ok) in zip(env.headers, raw_headers, strict=True):
            flat += [name, value]
        obj["headers"] = flat
    obj["key"] = key
    obj["payload"] = payload
    if key_ok and payload_ok and all(ok for _, ok in raw_headers):
        return orjson.dumps(obj)
    # Raw bytes inside the JSON string, exactly as kcat writes them (not valid UTF-8 JSON, but
    # lossless; parse_line reads it back).
    text = json.dumps(obj, ensure_ascii=False, separators=(",", ":"))
    return text.encode("utf-8", "surrogateescape")


# ---------------------------------------------------------------------------------------------
# Reading
# ---------------------------------------------------------------------------------------------


def _loads(line: bytes) -> Any:
    try:
        return orjson.loads(line)
    except orjson.JSONDecodeError as first:
        # kcat writes non-UTF-8 key/payload bytes raw; read them back through surrogateescape.
        try:
            return json.loads(line.decode("utf-8", "surrogateescape"))
        except ValueError:
            raise ValueError(f"not valid JSON: {first}") from None


def _bytes(value: Any, name: str) -> bytes | None:
    if value is None:
        return None
    if type(value) is not str:
        raise ValueError(f"{name}: must be a string or null, got {type(value).__name__}")
    try:
        return value.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:
        raise ValueError(f"{name}: holds an unpaired surrogate escape") from None


def _int(obj: Mapping[str, Any], name: str, lo: int) -> int:
    value = obj[name]
    if type(value) is not int:
        raise ValueError(f"{name}: must be an integer, got {type(value).__name__}")
    if value < lo:
        raise ValueError(f"{name}: must be >= {lo}, got {value}")
    return value


def _headers(value: Any) -> tuple[tuple[str, bytes | None], ...]:
    if value is None:
        return ()
    if type(value) is not list or len(value) % 2:
        raise ValueError("headers: must be a flat [name, value, ...] list")
    out = []
    for i in range(0, len(value), 2):
        name = value[i]
        if type(name) is not str:
            raise ValueError(f"headers[{i}]: a header name must be a string")
        out.append((name, _bytes(value[i + 1], f"headers[{i + 1}]")))
    return tuple(out)


def parse_line(line: bytes, lineno: int) -> Envelope:
    """Parse one line; :class:`CorruptLine` (with ``lineno`` and the reason) if it is not one."""
    try:
        obj = _loads(line)
        if type(obj) is not dict:
            raise ValueError(f"must be a JSON object, got {type(obj).__name__}")
        missing = [f for f in REQUIRED_FIELDS if f not in obj]
        if missing:
            raise ValueError(f"missing field(s): {', '.join(missing)}")
        topic = obj["topic"]
        if type(topic) is not str or not topic:
            raise ValueError("topic: must be a non-empty string")
        ts_value = obj.get("ts")
        if ts_value is not None and type(ts_value) is not int:
            raise ValueError(f"ts: must be an integer (ms), got {type(ts_value).__name__}")
        tstype = obj.get("tstype", "create")
        broker = obj.get("broker", -1)
        return Envelope(
            topic=topic,
            partition=_int(obj, "partition", 0),
            offset=_int(obj, "offset", 0),
            key=_bytes(obj.get("key"), "key"),
            payload=_bytes(obj["payload"], "payload"),
            ts=ts_value if ts_value is not None and ts_value >= 0 else None,
            tstype=tstype if type(tstype) is str else "create",
            broker=broker if type(broker) is int else -1,
            headers=_headers(obj.get("headers")),
        )
    except (ValueError, RecursionError) as exc:
        raise CorruptLine(lineno, str(exc)) from None


def read_recording(stream: BinaryIO) -> Iterator[Envelope | CorruptLine]:
    """Stream a recording: an :class:`Envelope` per good line, a :class:`CorruptLine` per bad
    one (the caller reports it and goes on). Blank lines are skipped. One line in memory at a
    time; a line longer than ``MAX_LINE_BYTES`` is reported corrupt and skipped unread."""
    lineno = 0
    while True:
        line = stream.readline(MAX_LINE_BYTES + 1)
        if not line:
            return
        lineno += 1
        if len(line) > MAX_LINE_BYTES and not line.endswith(b"\n"):
            while line and not line.endswith(b"\n"):  # skip the rest of the monster line
                line = stream.readline(MAX_LINE_BYTES)
            yield CorruptLine(lineno, f"longer than {MAX_LINE_BYTES:,} bytes")
            continue
        line = line.strip()
        if not line:
            continue
        try:
            yield parse_line(line, lineno)
        except CorruptLine as bad:
            yield bad


# ---------------------------------------------------------------------------------------------
# Replay logic
# ---------------------------------------------------------------------------------------------


def merge_by_time(
    items: Iterable[Envelope | CorruptLine], window: int = DEFAULT_MERGE_WINDOW
) -> Iterator[Envelope | CorruptLine]:
    """Interleave the (topic, partition) runs of a recording by timestamp, keeping each run's
    order; at most ``window`` records are held back. Corrupt lines pass through at once."""
    if window < 1:
        raise ValueError("window must be >= 1")
    queues: dict[tuple[str, int], deque[Envelope]] = {}
    last_ts: dict[tuple[str, int], int] = {}
    heap: list[tuple[int, int, tuple[str, int]]] = []
    held = 0
    seq = 0

    def sort_key(q: tuple[str, int], env: Envelope) -> int:
        if env.ts is not None:
            last_ts[q] = env.ts
            return env.ts
        return last_ts.get(q, -1)

    def pop() -> Envelope:
        nonlocal held, seq
        _, _, q = heapq.heappop(heap)
        env = queues[q].popleft()
        held -= 1
        if queues[q]:
            seq += 1
            heapq.heappush(heap, (sort_key(q, queues[q][0]), seq, q))
        return env

    for item in items:
        if isinstance(item, CorruptLine):
            yield item
            continue
        q = (item.topic, item.partition)
        queue = queues.setdefault(q, deque())
        queue.append(item)
        held += 1
        if len(queue) == 1:
            seq += 1
            heapq.heappush(heap, (sort_key(q, item), seq, q))
        while held > window:
            yield pop()
    while heap:
        yield pop()


@dataclass
class Pacer:
    """When each record is due, in seconds after the replay started (pure: no clock inside)."""

    speed: float
    first_ts: int | None = None

    def __post_init__(self) -> None:
        if not (self.speed >= 0 and self.speed != float("inf")):
            raise ConfigError(f"--speed: {self.speed} must be a finite number >= 0")

    def due_s(self, ts: int | None) -> float:
        """Seconds after the start at which a record stamped ``ts`` (ms) should be sent."""
        if self.speed == 0 or ts is None:
            return 0.0
        if self.first_ts is None:
            self.first_ts = ts
        return max(0.0, (ts - self.first_ts) / 1000.0 / self.speed)


def parse_topic_map(items: Iterable[str]) -> dict[str, str]:
    """``--topic-map OLD=NEW`` values as a mapping; ConfigError naming the flag if malformed."""
    mapping: dict[str, str] = {}
    problems = []
    for item in items:
        old, sep, new = item.partition("=")
        old, new = old.strip(), new.strip()
        if not sep or not old or not new:
            problems.append(f"--topic-map: {item!r} must be OLD=NEW")
        elif old in mapping and mapping[old] != new:
            problems.append(f"--topic-map: {old!r} is mapped twice ({mapping[old]!r}, {new!r})")
        else:
            mapping[old] = new
    if problems:
        raise ConfigError(problems)
    return mapping


@dataclass(frozen=True)
class TopicRouter:
    """Where a recorded topic is replayed: ``--topic-map`` first; else, when a prefix is given,
    a topic whose name ends in a headroom kind moves to ``<prefix><kind>``; else unchanged."""

    mapping: Mapping[str, str]
    prefix: str | None = None

    def route(self, topic: str) -> str:
        mapped = self.mapping.get(topic)
        if mapped is not None:
            return mapped
        if self.prefix is not None:
            kind = trailing_kind(topic)
            if kind is not None:
                return f"{self.prefix}{kind}"
        return topic
