"""The controller's read mark per value partition (headroom.controllers.read_marks): every offset
below it was processed, whatever order the offsets came in."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from headroom.controllers.read_marks import ReadMarks, covers, mark_key, merge_seqs, take_seq


def test_the_mark_waits_for_the_oldest_offset_not_processed() -> None:
    marks = ReadMarks()
    marks.start(1, 243)
    # after a rebalance: records buffered before it (300-302) come before the read again
    for offset in (300, 301, 302):
        assert marks.processed(1, offset) is False
    assert marks.low(1) == 243  # Faust's commit could already say 303
    for offset in range(243, 300):
        marks.processed(1, offset)
    assert marks.low(1) == 303
    assert marks.processed(1, 250) is False  # read again: below the mark, nothing changes
    assert marks.low(1) == 303
    marks.forget({1})
    assert not marks.known(1)
    assert marks.low(1) is None


def test_mark_keys_are_never_producer_ids() -> None:
    assert mark_key(3) == "@read-mark/3"
    assert "." not in mark_key(12)  # producer ids are <name>.<pid>.<hex>


@given(st.permutations(list(range(40))), st.integers(0, 39))
def test_the_mark_is_the_lowest_offset_not_processed(order: list[int], cut: int) -> None:
    marks = ReadMarks()
    marks.start(0, 0)
    done: set[int] = set()
    for offset in order[:cut]:
        marks.processed(0, offset)
        done.add(offset)
        low = marks.low(0)
        assert low is not None
        assert all(o in done for o in range(low))  # everything below it was processed
        assert low not in done  # and it is the first that was not


def test_what_was_processed_the_lag_and_a_mark_raised_past_what_is_gone() -> None:
    marks = ReadMarks()
    assert not marks.has(0, 3)
    assert marks.lag(0) == 0
    marks.start(0, 10)
    for offset in (14, 15, 20):
        marks.processed(0, offset)
    assert marks.has(0, 9)  # below the mark
    assert marks.has(0, 15)
    assert not marks.has(0, 12)
    assert marks.lag(0) == 3
    marks.raise_to(0, 14)  # 10-13 are gone from the topic: the mark moves past 14 and 15
    assert marks.low(0) == 16
    assert marks.lag(0) == 1
    marks.raise_to(0, 5)  # never back
    assert marks.low(0) == 16


@given(st.sets(st.integers(0, 60)), st.sets(st.integers(0, 60)))
def test_merged_seq_sets_cover_what_either_covered(a: set[int], b: set[int]) -> None:
    def seen(seqs: set[int]) -> tuple[int, list[int]]:
        newest, gaps = -1, []
        for s in sorted(seqs, reverse=True):  # out of order: the gaps are filled later
            got = take_seq(newest, gaps, s)
            assert got is not None
            newest = got
        return newest, gaps

    sa, sb = seen(a), seen(b)
    assert all(covers(*sa, s) == (s in a) for s in range(62))
    merged = merge_seqs(sa, sb)
    assert all(covers(*merged, s) == (s in a or s in b) for s in range(62))
