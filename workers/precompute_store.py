"""A store of precomputed rankings keyed by (region, user), with expiry and honest accounting.

Pure: no clock (``now`` is passed in: event time), no I/O, no randomness. The precompute worker
keeps one to know what it published; :class:`headroom.workers.precompute_lookup.PrecomputeCache`
keeps one per client for the look-ups before live ranking. The simulator can use the same object.

The rules
---------

* **Never serve a stale result.** :meth:`PrecomputeStore.lookup` and :meth:`~PrecomputeStore.visit`
  return a result only while ``now <= expires_at`` (docs/messages.md: "a result past ``expires_at``
  is never served"), whether or not :meth:`~PrecomputeStore.expire` has run since.
* **Newest wins, idempotently.** A result replaces the stored one of its user only if it was
  ranked later (``ts``); the same result delivered twice (at-least-once consumption) is a no-op;
  an older one is ignored; one already past its expiry is not stored (``late``, not a job).
* **Every result ends exactly once, and is counted by how it ended** — expired, superseded by a
  newer result, evicted for room, or deleted (a tombstone) — each split by whether it was ever
  served. So ``jobs = live + Σ ended`` always holds, and every result that expired unused is in
  ``expired_unused`` (the waste docs/analysis.md reports).
* **Bounded.** At ``max_results`` a new result evicts the one closest to its expiry (the least
  remaining life), counted in ``evicted_*``.

Accounting per visit: ``visits`` (every look-up on behalf of a request), ``hits`` (served from a
stored result), ``held_out`` (a result was there but the request is in the holdout arm, so it
was not served), the result's age at each hit (staleness) and ``used`` (results served at least
once, counted at their first hit). :meth:`PrecomputeStore.take_window` returns the increments
since the last call, with at most 32 staleness samples (docs/events.md), chosen at evenly spaced
quantiles of the window's hits so their median is the window's median.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Iterator, Mapping
from dataclasses import asdict, dataclass, field, fields
from enum import Enum
from typing import Any

from headroom.kernel.jsonstate import Snapshotting
from headroom.streams.messages import Precompute

__all__ = [
    "EndReason",
    "Expired",
    "PrecomputeStore",
    "PrecomputeWindow",
    "PutOutcome",
    "StoreCounts",
    "Visit",
    "VisitOutcome",
]

Key = tuple[str, int]  # (region, user)

STALENESS_SAMPLES = 32  # per window line (docs/events.md: "staleness_s: [..≤32 samples]")
_STALENESS_BUFFER = 4096  # hit ages kept per window before decimation (every other one dropped)


class PutOutcome(Enum):
    STORED = "stored"  # a new user
    REPLACED = "replaced"  # a newer result replaced the user's previous one (superseded)
    DUPLICATE = "duplicate"  # the very same result again (a redelivery): nothing changes
    STALE = "stale"  # older than the stored one: ignored
    LATE = "late"  # already past its expiry on arrival: never stored


class VisitOutcome(Enum):
    HIT = "hit"  # served from a stored result
    MISS = "miss"  # no unexpired result for this user
    HELD_OUT = "held_out"  # a result was there, but the request is in the holdout arm


class EndReason(Enum):
    EXPIRED = "expired"
    SUPERSEDED = "superseded"
    EVICTED = "evicted"
    DELETED = "deleted"


@dataclass(frozen=True, slots=True)
class Visit:
    outcome: VisitOutcome
    result: Precompute | None  # the result served (HIT) or held back (HELD_OUT)
    staleness_s: float | None = None  # age of the result at this visit


@dataclass(frozen=True, slots=True)
class Expired:
    """Results :meth:`PrecomputeStore.expire` removed: the unused ones are the waste."""

    unused: tuple[Precompute, ...]
    used: tuple[Precompute, ...]

    @property
    def all(self) -> tuple[Precompute, ...]:
        return self.unused + self.used


@dataclass
class StoreCounts:
    """Cumulative counters (see the module docstring). Invariant, checked by the tests:
    ``jobs == live + expired_* + superseded_* + evicted_* + deleted_*``."""

    jobs: int = 0  # results stored
    used: int = 0  # results served at least once
    late: int = 0  # arrived already expired (not stored, not a job here)
    visits: int = 0
    hits: int = 0
    held_out: int = 0
    segment_mismatch: int = 0  # visits whose user had a result ranked for another segment
    expired_unused: int = 0
    expired_used: int = 0
    superseded_unused: int = 0
    superseded_used: int = 0
    evicted_unused: int = 0
    evicted_used: int = 0
    deleted_unused: int = 0
    deleted_used: int = 0

    def ended(self) -> int:
        return (
            self.expired_unused
            + self.expired_used
            + self.superseded_unused
            + self.superseded_used
            + self.evicted_unused
            + self.evicted_used
            + self.deleted_unused
            + self.deleted_used
        )

    def copy(self) -> StoreCounts:
        return StoreCounts(**asdict(self))

    def minus(self, other: StoreCounts) -> StoreCounts:
        diff = {f.name: getattr(self, f.name) - getattr(other, f.name) for f in fields(self)}
        return StoreCounts(**diff)


@dataclass(frozen=True, slots=True)
class PrecomputeWindow:
    """What happened to stored results over one window (increments, not totals)."""

    counts: StoreCounts
    staleness_s: tuple[float, ...]  # at most STALENESS_SAMPLES, at evenly spaced quantiles

    def client_fields(self) -> dict[str, Any]:
        """The ``precompute`` field of a client's ``window`` line (docs/events.md): what only the
        serving side can know — visits, hits, results used and results that expired unused."""
        c = self.counts
        return {
            "used": c.used,
            "expired_unused": c.expired_unused,
            "visits": c.visits,
            "hits": c.hits,
            "staleness_s": list(self.staleness_s),
        }


@dataclass(slots=True)
class _Entry:
    result: Precompute
    seq: int
    served: int = 0


@dataclass
class PrecomputeStore:
    """Results keyed by (region, user); see the module docstring for the rules."""

    max_results: int = 250_000
    counts: StoreCounts = field(default_factory=StoreCounts)
    _entries: dict[Key, _Entry] = field(default_factory=dict, repr=False)
    _heap: list[tuple[float, int, str, int]] = field(default_factory=list, repr=False)
    _seq: int = 0
    _window_base: StoreCounts = field(default_factory=StoreCounts, repr=False)
    _staleness: list[float] = field(default_factory=list, repr=False)

    def __post_init__(self) -> None:
        if isinstance(self.max_results, bool) or not isinstance(self.max_results, int):
            raise ValueError(f"max_results: must be an integer, got {self.max_results!r}")
        if self.max_results < 1:
            raise ValueError(f"max_results: must be >= 1, got {self.max_results}")

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: object) -> bool:
        return key in self._entries

    def __iter__(self) -> Iterator[Precompute]:
        return (e.result for e in self._entries.values())

    # -- writing ---------------------------------------------------------------------------------

    def put(self, result: Precompute, now: float) -> PutOutcome:
        """Store ``result`` (see the module docstring for which result wins)."""
        key = (result.region, result.user)
        current = self._entries.get(key)
        if current is not None:
            old = current.result
            if old == result:
                return PutOutcome.DUPLICATE
            if result.ts < old.ts or (result.ts == old.ts and result.expires_at <= old.expires_at):
                return PutOutcome.STALE
        if result.expired(now):
            self.counts.late += 1
            return PutOutcome.LATE
        outcome = PutOutcome.STORED
        if current is not None:
            self._end(key, EndReason.SUPERSEDED)
            outcome = PutOutcome.REPLACED
        elif len(self._entries) >= self.max_results:
            self._evict_one()
        if len(self._heap) > 4 * len(self._entries) + 64:
            self._compact_heap()  # drop the stale items of replaced and deleted results
        self._seq += 1
        self._entries[key] = _Entry(result, self._seq)
        heapq.heappush(self._heap, (result.expires_at, self._seq, result.region, result.user))
        self.counts.jobs += 1
        return outcome

    def remove(self, region: str, user: int) -> bool:
        """Delete a user's result (a tombstone on the topic); False if there was none."""
        key = (region, user)
        if key not in self._entries:
            return False
        self._end(key, EndReason.DELETED)
        return True

    def expire(self, now: float) -> Expired:
        """Remove every result past its expiry at ``now``; returns them, unused ones apart."""
        unused: list[Precompute] = []
        used: list[Precompute] = []
        heap = self._heap
        while heap and heap[0][0] < now:
            _, seq, region, user = heapq.heappop(heap)
            entry = self._entries.get((region, user))
            if entry is None or entry.seq != seq:
                continue  # superseded, deleted or evicted since: a stale heap item
            (used if entry.served else unused).append(entry.result)
            self._end((region, user), EndReason.EXPIRED)
        return Expired(tuple(unused), tuple(used))

    def _evict_one(self) -> None:
        heap = self._heap
        while heap:
            _, seq, region, user = heapq.heappop(heap)
            entry = self._entries.get((region, user))
            if entry is not None and entry.seq == seq:
                self._end((region, user), EndReason.EVICTED)
                return

    def _end(self, key: Key, reason: EndReason) -> None:
        """Count how a result ended. Its heap item stays and is skipped later (seq check)."""
        entry = self._entries.pop(key)
        name = f"{reason.value}_{'used' if entry.served else 'unused'}"
        setattr(self.counts, name, getattr(self.counts, name) + 1)

    def _compact_heap(self) -> None:
        self._heap = [
            (e.result.expires_at, e.seq, e.result.region, e.result.user)
            for e in self._entries.values()
        ]
        heapq.heapify(self._heap)

    # -- reading ---------------------------------------------------------------------------------

    def lookup(self, region: str, user: int, now: float) -> Precompute | None:
        """The user's result if it is still valid at ``now`` (never one past ``expires_at``).
        A pure read: nothing is counted."""
        entry = self._entries.get((region, user))
        if entry is None or entry.result.expires_at < now:
            return None
        return entry.result

    def visit(
        self,
        region: str,
        user: int,
        now: float,
        *,
        hold_out: bool = False,
        segment: str | None = None,
    ) -> Visit:
        """A request of ``user`` at ``now``: serve its stored result if valid (counted as a hit,
        with its staleness), or, for a holdout request, report it without serving it. With
        ``segment``, a result ranked for another segment is not this request's (a miss: the
        ranking world's users are (segment, id) pairs)."""
        self.counts.visits += 1
        key = (region, user)
        entry = self._entries.get(key)
        if entry is None:
            return Visit(VisitOutcome.MISS, None)
        result = entry.result
        if result.expires_at < now:
            self._end(key, EndReason.EXPIRED)
            return Visit(VisitOutcome.MISS, None)
        if segment is not None and result.segment != segment:
            self.counts.segment_mismatch += 1
            return Visit(VisitOutcome.MISS, None)
        age = max(now - result.ts, 0.0)
        if hold_out:
            self.counts.held_out += 1
            return Visit(VisitOutcome.HELD_OUT, result, age)
        self.counts.hits += 1
        if entry.served == 0:
            self.counts.used += 1
        entry.served += 1
        self._note_staleness(age)
        return Visit(VisitOutcome.HIT, result, age)

    def served(self, region: str, user: int) -> int:
        """How many visits the user's current result has served (0 if none stored)."""
        entry = self._entries.get((region, user))
        return 0 if entry is None else entry.served

    def next_expiry(self) -> float | None:
        """The earliest ``expires_at`` among stored results (None if empty)."""
        while self._heap:
            exp, seq, region, user = self._heap[0]
            entry = self._entries.get((region, user))
            if entry is not None and entry.seq == seq:
                return exp
            heapq.heappop(self._heap)
        return None

    # -- windows ---------------------------------------------------------------------------------

    def _note_staleness(self, age: float) -> None:
        buf = self._staleness
        buf.append(age)
        if len(buf) >= _STALENESS_BUFFER:
            del buf[::2]  # keep every other one: still evenly spread over the window

    def take_window(self) -> PrecomputeWindow:
        """Counter increments since the previous call, and staleness samples of the hits."""
        now_counts = self.counts.copy()
        delta = now_counts.minus(self._window_base)
        self._window_base = now_counts
        ages = sorted(self._staleness)
        self._staleness = []
        return PrecomputeWindow(delta, quantile_samples(ages, STALENESS_SAMPLES))

    # -- snapshot --------------------------------------------------------------------------------

    def snapshot(self) -> dict[str, Any]:
        return {
            "max_results": self.max_results,
            "counts": asdict(self.counts),
            "window_base": asdict(self._window_base),
            "staleness": list(self._staleness),
            "entries": [
                [e.result.to_dict(), e.served]
                for e in sorted(self._entries.values(), key=lambda e: e.seq)
            ],
        }

    def restore(self, state: Mapping[str, Any]) -> None:
        """Replace results and counters with those of a :meth:`snapshot`. ``max_results`` stays
        this store's own: if the snapshot holds more results, those closest to their expiry are
        evicted (and counted) until the bound holds."""
        counts = StoreCounts(**state["counts"])
        window_base = StoreCounts(**state["window_base"])
        staleness = [float(x) for x in state["staleness"]]
        entries: dict[Key, _Entry] = {}
        seq = 0
        for raw, served in state["entries"]:
            result = Precompute.from_dict(raw)
            seq += 1
            entries[(result.region, result.user)] = _Entry(result, seq, int(served))
        self._entries = entries
        self._seq = seq
        self._compact_heap()
        self.counts = counts
        self._window_base = window_base
        self._staleness = staleness
        while len(self._entries) > self.max_results:
            self._evict_one()


_SNAPSHOTTING: tuple[type[Snapshotting], ...] = (PrecomputeStore,)  # checked by mypy


def quantile_samples(sorted_values: list[float], k: int) -> tuple[float, ...]:
    """At most ``k`` values at the evenly spaced quantiles ``(i + 0.5) / k`` of a sorted list
    (all of them when there are no more than ``k``)."""
    m = len(sorted_values)
    if m <= k:
        return tuple(sorted_values)
    return tuple(sorted_values[min(m - 1, math.floor((i + 0.5) * m / k))] for i in range(k))
