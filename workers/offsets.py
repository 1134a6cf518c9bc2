"""Offsets a worker may commit: the highest offset below which every message is done."""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Mapping
from typing import Generic, TypeVar

T = TypeVar("T")


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
    """

    def __init__(self) -> None:
        self._pending: dict[int, deque[int]] = {}  # received, not released, in offset order
        self._done: dict[int, dict[int, T]] = {}  # finished, not released
        self._next: dict[int, int] = {}
        self._committed: dict[int, int] = {}

    def received(self, partition: int, offset: int) -> None:
        self._pending.setdefault(partition, deque()).append(offset)
        self._done.setdefault(partition, {})
        self._next[partition] = max(self._next.get(partition, 0), offset + 1)

    def completed(self, partition: int, offset: int, item: T) -> None:
        self._done.setdefault(partition, {})[offset] = item

    def release(self) -> list[T]:
        """The finished requests whose partition has nothing older in flight, oldest first."""
        out: list[T] = []
        for partition, pending in self._pending.items():
            done = self._done[partition]
            while pending and pending[0] in done:
                out.append(done.pop(pending.popleft()))
        return out

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
            self._done.pop(p, None)
            self._next.pop(p, None)
            self._committed.pop(p, None)
