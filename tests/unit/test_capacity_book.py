"""The capacity-level book (defences/capacity.py): newest wins, ties to the lower level, lapse at
``ts + expires_in_s``, and the same answers whatever order the messages arrived in."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from headroom.defences.capacity import CapacityBook, CapacityLevel
from headroom.streams import messages

KEYS = [
    ("cpu", "any", "opportunistic", False),
    ("cpu", "any", "opportunistic", True),
    ("accelerator", "gpu-b", "opportunistic", False),
    ("accelerator", "gpu-b", "opportunistic", True),
    ("accelerator", "gpu-a", "dedicated", False),
]


def level(
    key: tuple[str, str, str, bool], units: float, ts: float, life: float | None = None
) -> CapacityLevel:
    resource, hardware, pool, remote = key
    return CapacityLevel(resource, hardware, pool, units, life, remote, ts)  # type: ignore[arg-type]


# integers as floats: ts + expires_in_s is exact, so the boundary is exactly representable
_ts = st.integers(0, 10_000).map(float)
_life = st.one_of(st.none(), st.integers(1, 5_000).map(float))
levels = st.builds(
    level,
    key=st.sampled_from(KEYS),
    units=st.sampled_from([0.0, 0.5, 1.0, 2.0, 3.5, 8.0]),
    ts=_ts,
    life=_life,
)


def state(book: CapacityBook, now: float) -> tuple[CapacityLevel, ...]:
    return book.levels(now)


def held(book: CapacityBook) -> dict[tuple[str, str, str, bool], CapacityLevel | None]:
    return {k: book.get(k) for k in KEYS}


@given(st.lists(levels, max_size=25), st.randoms(use_true_random=False), _ts)
def test_any_order_of_the_same_messages_gives_the_same_book(
    msgs: list[CapacityLevel], rnd: object, now: float
) -> None:
    # ties (equal ts) included: the tie rule makes the book a function of the set of levels
    shuffled = list(msgs)
    rnd.shuffle(shuffled)  # type: ignore[attr-defined]
    a, b = CapacityBook(msgs), CapacityBook(shuffled)
    assert held(a) == held(b)
    assert state(a, now) == state(b, now)


@given(st.lists(levels, max_size=25), _ts)
def test_with_distinct_timestamps_the_newest_level_of_each_key_is_in_force(
    msgs: list[CapacityLevel], now: float
) -> None:
    seen: set[tuple[tuple[str, str, str, bool], float]] = set()
    distinct = []
    for m in msgs:
        if (m.key, m.ts) not in seen:
            seen.add((m.key, m.ts))
            distinct.append(m)
    book = CapacityBook(distinct)
    for key in KEYS:
        mine = [m for m in distinct if m.key == key]
        expect = max(mine, key=lambda m: m.ts) if mine else None
        assert book.get(key) == expect


@given(st.lists(levels, min_size=1, max_size=25), _ts)
def test_applying_a_message_again_changes_nothing(msgs: list[CapacityLevel], now: float) -> None:
    book = CapacityBook(msgs)
    before = (held(book), state(book, now))
    for m in msgs:
        book.apply(m)
    assert (held(book), state(book, now)) == before
    # and the level in force, applied again, reports that nothing changed
    for key in KEYS:
        current = book.get(key)
        if current is not None:
            assert not book.apply(current)


@given(levels, levels)
def test_an_older_message_never_replaces_a_newer_one(a: CapacityLevel, b: CapacityLevel) -> None:
    newer, older = (a, b) if a.ts > b.ts else (b, a)
    older = CapacityLevel(
        newer.resource, newer.hardware, newer.pool, older.units, older.expires_in_s,
        newer.remote, older.ts,
    )  # fmt: skip
    if older.ts == newer.ts:
        return
    book = CapacityBook([newer])
    assert not book.apply(older)
    assert book.get(newer.key) == newer


@given(
    key=st.sampled_from([k for k in KEYS if k[2] == "opportunistic"]),
    units=st.floats(0.5, 64.0),
    ts=_ts,
    life=st.integers(1, 5_000).map(float),
)
def test_an_opportunistic_level_lapses_exactly_at_ts_plus_its_lifetime(
    key: tuple[str, str, str, bool], units: float, ts: float, life: float
) -> None:
    book = CapacityBook([level(key, units, ts, life)])
    boundary = ts + life
    before = math.nextafter(boundary, -math.inf)
    assert book.units(key, before) == units
    assert book.units(key, boundary) == 0.0
    assert book.units(key, boundary + 1.0) == 0.0
    (seen,) = book.levels(before)
    assert seen.units == units
    assert seen.expires_in_s is not None
    assert seen.expires_in_s > 0.0
    (seen,) = book.levels(boundary)
    assert (seen.units, seen.expires_in_s) == (0.0, 0.0)
    assert book.next_lapse(before) == boundary
    assert book.next_lapse(boundary) is None
    # a newer announcement revives the pool
    book.apply(level(key, units, boundary, life))
    assert book.units(key, boundary) == units


@given(levels, _ts)
def test_a_level_read_from_a_book_lapses_when_the_original_does(
    lvl: CapacityLevel, now: float
) -> None:
    """``levels(now)`` is re-based to ``now``: put into another book it gives the same units at
    every later time (the allocator re-books what the observation carries)."""
    book = CapacityBook([lvl])
    (as_of,) = book.levels(now)
    if lvl.ts > now:  # a level stamped ahead of the reader's clock keeps its lifetime
        return
    again = CapacityBook([as_of])
    for dt in (0.0, 0.5, 1.0, 10.0, 100.0, 1000.0, 6000.0):
        assert again.units(lvl.key, now + dt) == book.units(lvl.key, now + dt)


def test_equal_timestamps_go_to_the_lower_level_then_the_shorter_life() -> None:
    key = KEYS[2]
    grant, reclaim = level(key, 4.0, 10.0), level(key, 1.0, 10.0)
    for order in ([grant, reclaim], [reclaim, grant]):
        assert CapacityBook(order).units(key, 10.0) == 1.0
    short, unknown = level(key, 2.0, 10.0, 30.0), level(key, 2.0, 10.0, None)
    for order in ([short, unknown], [unknown, short]):
        assert CapacityBook(order).get(key) == short


def test_dedicated_levels_report_their_lifetime_but_never_lapse() -> None:
    key = KEYS[4]
    book = CapacityBook([level(key, 1.0, 0.0, 10.0)])
    assert book.units(key, 100.0) == 1.0
    (seen,) = book.levels(5.0)
    assert seen.expires_in_s == 5.0
    assert book.next_lapse(0.0) is None


def test_a_level_stamped_ahead_of_the_clock_gets_no_more_than_its_lifetime() -> None:
    key = KEYS[0]
    book = CapacityBook([level(key, 2.0, 100.0, 30.0)])
    (seen,) = book.levels(90.0)  # the reader's clock is 10 s behind the announcer's
    assert seen.expires_in_s == 30.0
    assert book.units(key, 129.0) == 2.0
    assert book.units(key, 130.0) == 0.0


def test_totals_per_resource_filter_pool_remoteness_and_hardware() -> None:
    book = CapacityBook(
        [
            level(KEYS[0], 3.0, 0.0),
            level(KEYS[1], 5.0, 0.0),  # remote CPU
            level(KEYS[2], 2.0, 0.0, 10.0),
            level(("accelerator", "gpu-a", "opportunistic", False), 4.0, 0.0),
            level(KEYS[4], 1.0, 0.0),  # dedicated
        ]
    )
    assert book.totals(5.0) == {"cpu": 3.0, "accelerator": 6.0}
    assert book.totals(5.0, hardware={"gpu-b"}) == {"cpu": 3.0, "accelerator": 2.0}
    assert book.totals(5.0, remote=None) == {"cpu": 8.0, "accelerator": 6.0}
    assert book.totals(5.0, remote=True) == {"cpu": 5.0}
    assert book.totals(5.0, pool="dedicated") == {"accelerator": 1.0}
    # a lapsed pool still names its resource, at 0
    assert book.totals(10.0, hardware={"gpu-b"}) == {"cpu": 3.0, "accelerator": 0.0}
    assert CapacityBook().totals(0.0) == {}


def test_bad_numbers_never_raise_and_count_as_nothing() -> None:
    key = KEYS[0]
    book = CapacityBook()
    assert book.apply(level(key, math.nan, math.nan, math.nan))
    assert book.units(key, 0.0) == 0.0
    assert book.apply(level(key, 2.0, 0.0, math.inf))  # any real ts is newer than NaN
    assert book.units(key, 1e12) == 2.0  # an infinite lifetime never lapses
    assert book.apply(level(key, math.inf, 0.0))  # inf units count as 0: at one ts, the lower
    assert book.units(key, 1.0) == 0.0
    for now in (math.nan, math.inf, -math.inf):
        book.levels(now)
        book.totals(now)
        book.next_lapse(now)


def test_a_capacity_message_becomes_its_level() -> None:
    msg = messages.Capacity(
        ts=100.0, region="r", resource="accelerator", hardware="gpu-b", pool="opportunistic",
        units=2.0, reason="grant", id="c-1", expires_in_s=30.0, remote=True,
    )  # fmt: skip
    lvl = CapacityLevel.of(msg)
    assert lvl == CapacityLevel("accelerator", "gpu-b", "opportunistic", 2.0, 30.0, True, 100.0)
    assert lvl.key == ("accelerator", "gpu-b", "opportunistic", True)


@pytest.mark.parametrize("now", [0.0, 50.0])
def test_levels_are_ordered_by_key(now: float) -> None:
    book = CapacityBook([level(k, 1.0, 0.0) for k in reversed(KEYS)])
    assert [x.key for x in book.levels(now)] == sorted(KEYS)
    assert all(x.ts == now for x in book.levels(now))
