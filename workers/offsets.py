"""Offsets a worker may commit: the highest offset below which every message is done; and what
a client already published beyond its last commit (:func:`published_ends`).

A client publishes its ``window`` lines, waits for the broker's acknowledgement and only then
commits the end of the published prefix of each partition. A crash between the two leaves
requests published *and* uncommitted: the next owner of the partition would read, serve and count
them again. So every commit carries, in its metadata (:func:`commit_metadata`), where the events
partition of the client's window lines ended when the commit was made; the next owner reads the
window lines from there (:func:`published_ends`: the highest request offset each line covers,
``offsets``) and drops what they already cover instead of serving it again.

The lines are also the record of the value those requests delivered: each carries its value
signals (``value_signals``), which the client sends only once the lines are acknowledged. The
next owner sends the signals of the lines it finds again (:func:`published_value_signals`): the
controller counts each ``(producer, seq)`` once, so those that had gone out are dropped there and
those that had not are counted — exactly once, without a transaction.
"""

from __future__ import annotations

import bisect
import json
from collections import deque
from collections.abc import Collection, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

T = TypeVar("T")

__all__ = [
    "OffsetTracker",
    "Released",
    "commit_metadata",
    "parse_commit_metadata",
    "published_ends",
    "published_value_signals",
]


def commit_metadata(events_partition: int, events_end: int) -> str:
    """The metadata of an offset commit: the events partition the committing client writes its
    window lines to, and its end offset after the lines this commit covers were acknowledged."""
    return json.dumps({"events": [int(events_partition), int(events_end)]}, separators=(",", ":"))


def parse_commit_metadata(text: str | None) -> tuple[int, int] | None:
    """``(events partition, offset)`` from :func:`commit_metadata`; None for anything else (no
    commit yet, a commit by an older client, foreign metadata)."""
    if not text:
        return None
    try:
        mark = json.loads(text).get("events")
        partition, offset = (int(x) for x in mark)
    except (ValueError, TypeError, AttributeError):
        return None
    if partition < 0 or offset < 0:
        return None
    return partition, offset


def _client_lines(
    events: Iterable[Mapping[str, Any]], region: str, policy: str | None
) -> Iterator[tuple[Mapping[str, Any], dict[int, int]]]:
    """The client ``window`` lines of ``region`` (and ``policy``, when given), each with the
    highest request offset it covers per partition (its ``offsets``: ``{partition: [first,
    last]}``). Event dicts as in the event log (fields flat); other lines are skipped."""
    for e in events:
        if e.get("kind") != "window" or e.get("source") != "client" or e.get("region") != region:
            continue
        if policy is not None and e.get("policy", policy) != policy:
            continue
        spans = e.get("offsets")
        if not isinstance(spans, Mapping):
            continue
        lasts: dict[int, int] = {}
        for key, span in spans.items():
            try:
                lasts[int(key)] = int(span[1])
            except (ValueError, TypeError, IndexError, KeyError):
                continue
        yield e, lasts


def published_ends(
    events: Iterable[Mapping[str, Any]],
    partitions: Collection[int],
    *,
    region: str,
    policy: str | None = None,
) -> dict[int, int]:
    """Per partition of ``partitions``, the highest request offset a client ``window`` line of
    ``region`` (and ``policy``, when given) covers."""
    out: dict[int, int] = {}
    for _line, lasts in _client_lines(events, region, policy):
        for partition, last in lasts.items():
            if partition in partitions and last > out.get(partition, -1):
                out[partition] = last
    return out


def published_value_signals(
    events: Iterable[Mapping[str, Any]],
    committed: Mapping[int, int],
    *,
    region: str,
    policy: str | None = None,
) -> list[Mapping[str, Any]]:
    """The value signals carried by the client ``window`` lines that cover a request offset at
    or past ``committed`` (``{partition: committed offset}``) — the lines of a flush whose
    commit never came — in the lines' order (the signals as their lines hold them)."""
    out: list[Mapping[str, Any]] = []
    for line, lasts in _client_lines(events, region, policy):
        if not any(last >= committed[p] for p, last in lasts.items() if p in committed):
            continue
        signals = line.get("value_signals")
        if isinstance(signals, list):
            out.extend(s for s in signals if isinstance(s, Mapping))
    return out


@dataclass(frozen=True, slots=True)
class Released(Generic[T]):
    """What one :meth:`OffsetTracker.release_spans` handed out: the items, oldest first per
    partition, and per partition the span ``(first, last)`` of their offsets."""

    items: list[T]
    spans: dict[int, tuple[int, int]]


class OffsetTracker(Generic[T]):
    """Which finished requests may be published, and which offsets may then be committed.

    Offsets of one partition arrive in increasing order (:meth:`received`); requests finish in
    any order (:meth:`completed`). :meth:`release` hands out the finished requests that form, in
    each partition, an unbroken run from the oldest received one — never a request while an older
    one of its partition is still in flight. So what is published is always a *prefix* of every
    partition, and :meth:`committable` (the first offset not yet released) commits exactly what was
    published: after a crash the next owner re-reads only what was never published. (Committing
    the lowest unpublished offset while later ones are already published would count those twice
    after a restart.)

    After a rebalance that hands a partition back to the same consumer (a static member that
    rejoins after a pause longer than its session), the consumer reads again from the committed
    offset, possibly while records it fetched before are still being handled: :meth:`received`
    refuses an offset it already holds (False: the caller drops the record, the one it holds
    stands) and keeps the offsets of a partition sorted whatever order they come in, so a partition
    never waits for an offset that was released already.
    """

    def __init__(self) -> None:
        self._pending: dict[int, deque[int]] = {}  # received, not released, in offset order
        self._held: dict[int, set[int]] = {}  # the same offsets, as a set
        self._done: dict[int, dict[int, T]] = {}  # finished, not released
        self._next: dict[int, int] = {}
        self._committed: dict[int, int] = {}

    def received(self, partition: int, offset: int) -> bool:
        """Hold ``offset`` until it is released; False if it is held already (a re-delivery of a
        record still in flight or waiting for an older one: nothing changes)."""
        held = self._held.setdefault(partition, set())
        if offset in held:
            return False
        held.add(offset)
        pending = self._pending.setdefault(partition, deque())
        if not pending or offset > pending[-1]:
            pending.append(offset)
        else:  # read again from an earlier position (a rebalance): keep the order
            pending.insert(bisect.bisect_left(pending, offset), offset)
        self._done.setdefault(partition, {})
        self._next[partition] = max(self._next.get(partition, 0), offset + 1)
        return True

    def holds(self, partition: int, offset: int) -> bool:
        return offset in self._held.get(partition, ())

    def completed(self, partition: int, offset: int, item: T) -> None:
        """``offset`` finished; ignored unless it is held (a partition forgotten meanwhile)."""
        if offset in self._held.get(partition, ()):
            self._done[partition][offset] = item

    def release(self) -> list[T]:
        """The finished requests whose partition has nothing older in flight, oldest first."""
        return self.release_spans().items

    def release_spans(self) -> Released[T]:
        """:meth:`release`, with the span of offsets released per partition."""
        out: list[T] = []
        spans: dict[int, tuple[int, int]] = {}
        for partition, pending in self._pending.items():
            done = self._done[partition]
            first = last = None
            held = self._held[partition]
            while pending and pending[0] in done:
                last = pending.popleft()
                held.discard(last)
                if first is None:
                    first = last
                out.append(done.pop(last))
            if first is not None and last is not None:
                spans[partition] = (first, last)
        return Released(out, spans)

    def committable(self) -> dict[int, int]:
        """Per partition whose point moved, the offset to commit: the first one not released."""
        out = {}
        for partition, pending in self._pending.items():
            point = pending[0] if pending else self._next[partition]
            if self._committed.get(partition) != point:
                out[partition] = point
        return out

    def committed(self, offsets: Mapping[int, int]) -> None:
        self._committed.update(offsets)

    def pending(self, partition: int) -> int:
        """Requests received and not yet released (in flight, or finished behind one that is)."""
        return len(self._pending.get(partition, ()))

    def forget(self, partitions: Iterable[int]) -> None:
        """Partitions taken away (after their final commit): drop their state."""
        for p in partitions:
            self._pending.pop(p, None)
            self._held.pop(p, None)
            self._done.pop(p, None)
            self._next.pop(p, None)
            self._committed.pop(p, None)
