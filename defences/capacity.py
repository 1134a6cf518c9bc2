"""The capacity-level book: the newest announced level of each pool of one region, and when an
opportunistic level lapses. Pure: no clock, no I/O; the caller passes ``now``.

Every component that reads ``headroom.capacity`` keeps one :class:`CapacityBook` per region it
serves — a ranking server and a precompute worker one, the controller's aggregator one per region
— and the allocator folds the levels it is handed through one too, so "which level is in force"
and "has it lapsed" have one answer everywhere. The simulator builds :class:`CapacityLevel` values
from its traces for the controllers.

The rules
---------
* **Key.** A level belongs to ``(resource, hardware, pool, remote)`` of its region: a remote pool
  and a local one of the same hardware are different pools (only asynchronous work may use a
  remote one).
* **Newest wins.** Levels, not deltas (docs/messages.md): the level with the larger ``ts`` wins.
  An older level never replaces a newer one, and the same level applied twice changes nothing.
* **Ties.** Two levels of one key with the same ``ts``: the *lower* ``units`` wins, then the
  shorter lifetime (no ``expires_in_s`` counts as the longest). A grant stamped at the same instant
  as a reclaim cannot hide it, and the book does not depend on the order messages arrived in: it
  is a function of the *set* of levels applied (any permutation gives the same book).
* **Lapse.** An *opportunistic* level announced with ``expires_in_s`` lapses once
  ``now − ts ≥ expires_in_s``, i.e. at ``ts + expires_in_s``, and from then on counts as 0 units
  until a newer level arrives. The origin is the announcement's ``ts``, not the time the message
  arrived: a consumer that reads the compacted topic again after a restart, or a controller that
  restores its table, must not give a level a second lifetime. A level stamped ahead of the
  caller's clock (clock skew) is not credited with more than its announced lifetime: its
  remaining lifetime is ``min(expires_in_s, ts + expires_in_s − now)``. Dedicated levels report
  their remaining lifetime but never lapse (the baseline's capacity is not withdrawn by silence).
  ``expires_in_s`` of ``None`` (or not a finite number) means unknown: the level never lapses.
* **Clock.** ``ts``, ``expires_in_s`` and ``now`` are on one clock, whichever the caller uses:
  the wire's wall seconds in the streaming workers and the controller app, virtual seconds in the
  simulator.
* **Bad numbers** never raise: units that are not a finite number ≥ 0 count as 0, a ``ts`` that is
  not a number is older than every real one.

Queries: :meth:`CapacityBook.levels` (every level as of ``now``, with its remaining lifetime),
:meth:`CapacityBook.units` (one key), :meth:`CapacityBook.totals` (per resource, filtered by pool,
remoteness and hardware), :meth:`CapacityBook.next_lapse` (when to look again).
"""

from __future__ import annotations

import math
from collections.abc import Container, Iterable
from dataclasses import dataclass, replace
from typing import Literal, Protocol, cast

__all__ = [
    "CapacityBook",
    "CapacityLevel",
    "LevelKey",
    "Pool",
    "Resource",
]

Resource = Literal["cpu", "accelerator"]
Pool = Literal["dedicated", "opportunistic"]
LevelKey = tuple[str, str, str, bool]  # (resource, hardware, pool, remote)


class _Announced(Protocol):
    """What a capacity announcement carries (``headroom.streams.messages.Capacity`` has it)."""

    @property
    def resource(self) -> str: ...
    @property
    def hardware(self) -> str: ...
    @property
    def pool(self) -> str: ...
    @property
    def units(self) -> float: ...
    @property
    def expires_in_s(self) -> float | None: ...
    @property
    def remote(self) -> bool: ...
    @property
    def ts(self) -> float: ...


@dataclass(frozen=True, slots=True)
class CapacityLevel:
    """The level of one (resource, hardware, pool, remote) of a region, announced at ``ts``.

    ``expires_in_s`` is the lifetime announced at ``ts`` (``None``: unknown). The levels a
    :class:`CapacityBook` hands out are *as of* the ``now`` they were asked for: ``ts = now`` and
    ``expires_in_s`` the lifetime still remaining, so a level read from a book lapses at the
    same instant as the one that was put in.
    """

    resource: Resource
    hardware: str
    pool: Pool
    units: float
    expires_in_s: float | None = None  # lifetime from ts; None = unknown
    remote: bool = False  # only asynchronous work (precompute) may use it
    ts: float = 0.0

    @property
    def key(self) -> LevelKey:
        return (self.resource, self.hardware, self.pool, self.remote)

    @classmethod
    def of(cls, msg: _Announced) -> CapacityLevel:
        """The level a (validated) ``headroom.capacity`` message announces."""
        return cls(
            resource=cast(Resource, msg.resource),
            hardware=msg.hardware,
            pool=cast(Pool, msg.pool),
            units=msg.units,
            expires_in_s=msg.expires_in_s,
            remote=bool(msg.remote),
            ts=msg.ts,
        )

    def remaining_s(self, now: float) -> float | None:
        """Lifetime left at ``now`` (≥ 0; ``None`` when unknown). See the module docstring."""
        life = self.expires_in_s
        if life is None:
            return None
        elapsed = now - self.ts
        if not elapsed > 0.0:  # stamped at or after now, or not a number: all of it is left
            elapsed = 0.0
        return max(life - elapsed, 0.0)

    def lapsed(self, now: float) -> bool:
        """True once an opportunistic level's announced lifetime has run out at ``now``."""
        if self.pool != "opportunistic" or self.expires_in_s is None:
            return False
        return (now - self.ts) >= self.expires_in_s

    def units_at(self, now: float) -> float:
        """The units this level counts for at ``now``: 0 once lapsed."""
        return 0.0 if self.lapsed(now) else self.units

    def as_of(self, now: float) -> CapacityLevel:
        """This level seen at ``now``: units (0 once lapsed), the lifetime left, ``ts = now``."""
        return replace(self, units=self.units_at(now), expires_in_s=self.remaining_s(now), ts=now)


def _clean(level: CapacityLevel) -> CapacityLevel:
    """The level with its numbers made safe to order and to add (module docstring, bad numbers)."""
    units = level.units if math.isfinite(level.units) and level.units > 0.0 else 0.0
    life = level.expires_in_s
    if life is not None:
        life = life + 0.0 if math.isfinite(life) else None  # + 0.0: no -0.0 beside 0.0
    ts = level.ts + 0.0 if not math.isnan(level.ts) else -math.inf
    return replace(level, units=units, expires_in_s=life, ts=ts)


def _rank(level: CapacityLevel) -> tuple[float, float, float]:
    """Larger wins: newer ``ts``; at equal ``ts`` fewer units, then a shorter lifetime."""
    life = math.inf if level.expires_in_s is None else level.expires_in_s
    return (level.ts, -level.units, -life)


class CapacityBook:
    """The levels in force of one region (module docstring)."""

    __slots__ = ("_levels",)

    def __init__(self, levels: Iterable[CapacityLevel] = ()) -> None:
        self._levels: dict[LevelKey, CapacityLevel] = {}
        for level in levels:
            self.apply(level)

    def __len__(self) -> int:
        return len(self._levels)

    def apply(self, level: CapacityLevel) -> bool:
        """Record ``level``; True when it is now the key's level in force (it was newer, or won
        the tie), False when it lost to the level already held or is that very level."""
        level = _clean(level)
        key = level.key
        held = self._levels.get(key)
        if held is not None and _rank(level) <= _rank(held):
            return False
        self._levels[key] = level
        return True

    def get(self, key: LevelKey) -> CapacityLevel | None:
        """The level held for ``key`` as it was announced (not lapsed: see :meth:`units`)."""
        return self._levels.get(key)

    def levels(self, now: float) -> tuple[CapacityLevel, ...]:
        """Every level as of ``now`` (:meth:`CapacityLevel.as_of`), ordered by key."""
        return tuple(self._levels[k].as_of(now) for k in sorted(self._levels))

    def units(self, key: LevelKey, now: float) -> float:
        """Units of one key at ``now``: 0 when never announced or lapsed."""
        level = self._levels.get(key)
        return 0.0 if level is None else level.units_at(now)

    def totals(
        self,
        now: float,
        *,
        pool: Pool = "opportunistic",
        remote: bool | None = False,
        hardware: Container[str] | None = None,
    ) -> dict[str, float]:
        """Units per resource at ``now`` over the levels of ``pool``; ``remote`` False: local
        pools only, True: remote only, None: both; ``hardware``: accelerator types to count
        (CPU is counted whatever it is named; None: every type). A resource appears iff at least
        one matching level was announced (a lapsed one included, at 0)."""
        out: dict[str, float] = {}
        for level in self._levels.values():
            if level.pool != pool or (remote is not None and level.remote != remote):
                continue
            if hardware is not None and level.resource != "cpu" and level.hardware not in hardware:
                continue
            out[level.resource] = out.get(level.resource, 0.0) + level.units_at(now)
        return out

    def next_lapse(self, now: float) -> float | None:
        """The earliest instant after ``now`` at which a level lapses (None: none will)."""
        times = [
            level.ts + level.expires_in_s
            for level in self._levels.values()
            if level.pool == "opportunistic"
            and level.expires_in_s is not None
            and level.units > 0.0
            and not level.lapsed(now)
        ]
        return min(times) if times else None
