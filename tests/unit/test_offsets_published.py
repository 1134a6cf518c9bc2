"""What a client published beyond its last commit: the commit metadata and the window lines'
coverage (headroom.workers.offsets), and the spans a release hands out."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from headroom.workers.client import _uncovered
from headroom.workers.offsets import (
    OffsetTracker,
    commit_metadata,
    parse_commit_metadata,
    published_ends,
    published_value_signals,
)


@given(st.integers(0, 1000), st.integers(0, 2**62))
def test_commit_metadata_round_trips(partition: int, offset: int) -> None:
    assert parse_commit_metadata(commit_metadata(partition, offset)) == (partition, offset)


def test_foreign_or_missing_metadata_is_no_mark() -> None:
    for text in (None, "", "x", "{}", '{"events": 3}', '{"events": [1]}', '{"events": [-1, 2]}',
                 '[1, 2]', '{"events": ["a", 2]}'):  # fmt: skip
        assert parse_commit_metadata(text) is None, text


def _line(offsets: dict[str, list[int]], **kw: Any) -> dict[str, Any]:
    line = {"kind": "window", "source": "client", "region": "r1", "policy": "headroom"}
    line.update(kw)
    line["offsets"] = offsets
    return line


def test_published_ends_take_the_highest_offset_covered_per_assigned_partition() -> None:
    lines = [
        _line({"0": [10, 14], "1": [3, 3]}),
        _line({"0": [15, 19]}),
        _line({"0": [5, 30]}, region="r2"),  # another region
        _line({"0": [5, 40]}, policy="static"),  # another policy's stack
        _line({"0": [5, 50]}, source="server"),
        {"kind": "target.applied", "source": "client", "region": "r1", "offsets": {"0": [0, 99]}},
        _line({"2": [0, 7]}),  # not assigned
        _line({"0": "bad"}),
    ]
    assert published_ends(lines, {0, 1}, region="r1", policy="headroom") == {0: 19, 1: 3}
    assert published_ends(lines, {0, 1}, region="r1") == {0: 40, 1: 3}
    assert published_ends([], {0}, region="r1") == {}


def test_the_value_signals_to_send_again_are_those_of_the_lines_past_the_commit() -> None:
    def signals(*seqs: int) -> list[dict[str, Any]]:
        return [{"producer": "c.1.a", "seq": s} for s in seqs]

    lines = [
        _line({"0": [10, 14]}, value_signals=signals(0, 1)),  # committed (commit at 15)
        _line({"0": [15, 19], "1": [3, 3]}, value_signals=signals(2)),  # past the commit
        _line({"1": [4, 6]}, value_signals=signals(3, 4)),  # partition 1: past its commit
        _line({"0": [20, 21]}),  # no value (a line of duplicates only)
        _line({"0": [22, 23]}, value_signals="bad"),
        _line({"2": [0, 9]}, value_signals=signals(5)),  # a partition not held
        _line({"0": [30, 31]}, value_signals=signals(6), region="r2"),
    ]
    got = published_value_signals(lines, {0: 15, 1: 3}, region="r1", policy="headroom")
    assert [s["seq"] for s in got] == [2, 3, 4]
    assert published_value_signals(lines, {0: 40, 1: 40}, region="r1") == []


def test_a_release_reports_the_span_of_offsets_it_hands_out() -> None:
    t: OffsetTracker[str | None] = OffsetTracker()
    for o in (4, 5, 6, 7):
        t.received(0, o)
    t.received(1, 9)
    t.completed(0, 4, "a")
    t.completed(0, 5, None)  # a dropped duplicate is released too
    t.completed(0, 7, "d")  # behind 6, still in flight
    t.completed(1, 9, None)
    r = t.release_spans()
    assert r.items == ["a", None, None]
    assert r.spans == {0: (4, 5), 1: (9, 9)}
    assert t.committable() == {0: 6, 1: 10}
    t.completed(0, 6, "c")
    assert t.release_spans().spans == {0: (6, 7)}


def test_offsets_released_past_every_line_are_reported_uncovered() -> None:
    lines = [{"offsets": {"0": [4, 4]}}, {"requests": 0}]
    # partition 0: 5 was a dropped duplicate; partition 1 only duplicates
    assert _uncovered({0: (4, 5), 1: (9, 9)}, lines) == {0: (4, 5), 1: (9, 9)}
    assert _uncovered({0: (3, 4)}, lines) == {}


def test_a_partition_read_again_after_a_rebalance_is_never_stuck_or_doubled() -> None:
    """Records fetched before a rebalance (12, 13) are handled after it, then the consumer reads
    again from the commit (10): held offsets are refused, the order is kept, all is released."""
    t: OffsetTracker[int | None] = OffsetTracker()
    for o in (10, 11):
        assert t.received(0, o)
    t.completed(0, 11, 11)  # 10 still in flight
    for o in (12, 13):  # the rest of the old batch
        assert t.received(0, o)
        t.completed(0, o, o)
    # read again from 10: all held (in flight or waiting for 10)
    assert [t.received(0, o) for o in (10, 11, 12, 13)] == [False] * 4
    assert t.holds(0, 10)
    assert t.release() == []
    t.completed(0, 10, 10)
    assert t.release() == [10, 11, 12, 13]
    assert t.committable() == {0: 14}
    assert not t.holds(0, 12)
    # an earlier offset read again later (a commit that failed) keeps the order
    assert t.received(0, 15)
    assert t.received(0, 14)
    t.completed(0, 15, 15)
    assert t.release() == []
    t.completed(0, 14, None)
    assert t.release() == [None, 15]
    # a completion for an offset not held (a partition forgotten meanwhile) is ignored
    t.completed(0, 99, 99)
    assert t.release() == []
