"""The recording format and the pure replay logic, without a broker.

The sample lines are verbatim output of ``kcat -C -J`` (kcat 1.7.1, Debian bookworm) against the
project's broker: a JSON object per record, headers only when present, raw bytes for payloads
that are not UTF-8.
"""

from __future__ import annotations

import io
from collections import defaultdict

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from headroom.kernel.errors import ConfigError
from headroom.streams import recording
from headroom.streams.recording import (
    CorruptLine,
    Envelope,
    Pacer,
    TopicRouter,
    encode_envelope,
    merge_by_time,
    parse_line,
    parse_topic_map,
    read_recording,
)

KCAT_LINES = [
    b'{"topic":"x.events","partition":0,"offset":0,"tstype":"create","ts":1796228411738,'
    b'"broker":1,"key":"tomb","payload":null}',
    b'{"topic":"x.events","partition":0,"offset":1,"tstype":"create","ts":1796228411740,'
    b'"broker":1,"key":null,"payload":"v"}',
    b'{"topic":"x.events","partition":0,"offset":2,"tstype":"create","ts":1796228411743,'
    b'"broker":1,"key":"","payload":""}',
    b'{"topic":"x.events","partition":0,"offset":3,"tstype":"create","ts":1796228411745,'
    b'"broker":1,"headers":["h","x"],"key":"k","payload":"{\\"q\\":\\"\xc3\xa9\\\\n\\"}"}',
    # kcat writes bytes that are not UTF-8 raw inside the JSON string.
    b'{"topic":"x.capacity","partition":0,"offset":4,"tstype":"create","ts":1796228401002,'
    b'"broker":1,"key":"us-east","payload":"\xff\xfe bin"}',
]


def test_kcat_lines_parse_to_the_records_kcat_saw() -> None:
    envs = [parse_line(line, i + 1) for i, line in enumerate(KCAT_LINES)]
    assert envs[0].key == b"tomb"
    assert envs[0].payload is None  # a tombstone
    assert envs[1].key is None
    assert envs[1].payload == b"v"
    assert envs[2].key == b""
    assert envs[2].payload == b""
    assert envs[3].headers == (("h", b"x"),)
    assert envs[3].payload == '{"q":"é\\n"}'.encode()
    assert envs[4].payload == b"\xff\xfe bin"
    assert (envs[4].topic, envs[4].partition, envs[4].offset) == ("x.capacity", 0, 4)
    assert envs[4].ts == 1796228401002
    assert envs[4].tstype == "create"
    assert envs[4].broker == 1


@pytest.mark.parametrize("line", KCAT_LINES)
def test_encoding_a_parsed_kcat_line_gives_back_kcats_exact_bytes(line: bytes) -> None:
    assert encode_envelope(parse_line(line, 1)) == line


def test_encoded_fields_are_kcats_fields_in_kcats_order() -> None:
    env = Envelope("t", 1, 2, b"k", b"p", ts=5, headers=(("a", b"b"),))
    import json

    keys = list(json.loads(encode_envelope(env)).keys())
    assert keys == list(recording.ENVELOPE_FIELDS)
    no_headers = list(json.loads(encode_envelope(Envelope("t", 1, 2, b"k", b"p"))).keys())
    assert no_headers == [f for f in recording.ENVELOPE_FIELDS if f != "headers"]


_bytes_or_none = st.none() | st.binary(max_size=64)
_envelopes = st.builds(
    Envelope,
    topic=st.text(
        alphabet=st.characters(min_codepoint=33, max_codepoint=0x2FFF), min_size=1, max_size=20
    ),
    partition=st.integers(0, 1000),
    offset=st.integers(0, 2**62),
    key=_bytes_or_none,
    payload=_bytes_or_none,
    ts=st.none() | st.integers(0, 2**50),
    tstype=st.sampled_from(["create", "logappend"]),
    broker=st.integers(-1, 10),
    headers=st.lists(st.tuples(st.text(max_size=8), _bytes_or_none), max_size=3).map(tuple),
)


@settings(max_examples=300, deadline=None)
@given(_envelopes)
def test_any_record_round_trips_through_a_line_losslessly(env: Envelope) -> None:
    line = encode_envelope(env)
    assert b"\n" not in line  # one record, one line
    assert parse_line(line, 1) == env


@pytest.mark.parametrize(
    ("line", "reason"),
    [
        (b"not json", "not valid JSON"),
        (b"[1, 2]", "must be a JSON object"),
        (b'{"topic":"t","partition":0,"offset":1}', "missing field(s): payload"),
        (b'{"topic":"","partition":0,"offset":1,"payload":"x"}', "topic: must be a non-empty"),
        (b'{"topic":"t","partition":-1,"offset":1,"payload":"x"}', "partition: must be >= 0"),
        (b'{"topic":"t","partition":true,"offset":1,"payload":"x"}', "partition: must be an int"),
        (b'{"topic":"t","partition":0,"offset":1.5,"payload":"x"}', "offset: must be an integer"),
        (b'{"topic":"t","partition":0,"offset":1,"payload":7}', "payload: must be a string"),
        (b'{"topic":"t","partition":0,"offset":1,"ts":"x","payload":"x"}', "ts: must be an int"),
        (
            b'{"topic":"t","partition":0,"offset":1,"headers":["a"],"payload":"x"}',
            "headers: must be a flat",
        ),
    ],
)
def test_a_corrupt_line_names_its_number_and_reason(line: bytes, reason: str) -> None:
    with pytest.raises(CorruptLine) as caught:
        parse_line(line, 17)
    assert caught.value.lineno == 17
    assert reason in caught.value.reason
    assert str(caught.value).startswith("line 17: ")


def test_reading_streams_records_and_reports_corrupt_lines_in_place() -> None:
    body = b"\n".join([KCAT_LINES[1], b"garbage", b"", KCAT_LINES[2], b"{}", KCAT_LINES[4]])
    items = list(read_recording(io.BytesIO(body)))  # the last line has no newline
    kinds = [type(i).__name__ for i in items]
    assert kinds == ["Envelope", "CorruptLine", "Envelope", "CorruptLine", "Envelope"]
    corrupt = [i for i in items if isinstance(i, CorruptLine)]
    assert [c.lineno for c in corrupt] == [2, 5]  # blank line 3 still counts as a line


def test_an_overlong_line_is_reported_and_the_next_line_still_read(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(recording, "MAX_LINE_BYTES", 200)
    body = b'{"x":"' + b"a" * 500 + b'"}\n' + KCAT_LINES[1] + b"\n"
    items = list(read_recording(io.BytesIO(body)))
    assert isinstance(items[0], CorruptLine)
    assert items[0].lineno == 1
    assert "longer than" in items[0].reason
    assert isinstance(items[1], Envelope)
    assert items[1].payload == b"v"
    assert len(items) == 2


# ---- merge by time ---------------------------------------------------------------------------

_runs = st.lists(
    st.tuples(st.integers(0, 3), st.integers(0, 10_000)), min_size=0, max_size=120
)  # (partition, ts) in file order


def _envs(pairs: list[tuple[int, int]]) -> list[Envelope]:
    offsets: dict[int, int] = defaultdict(int)
    out = []
    for partition, ts in pairs:
        out.append(Envelope("t", partition, offsets[partition], b"k", b"v", ts=ts))
        offsets[partition] += 1
    return out


def _by_partition(envs: list[Envelope]) -> dict[int, list[int]]:
    seen: dict[int, list[int]] = defaultdict(list)
    for e in envs:
        seen[e.partition].append(e.offset)
    return dict(seen)


@settings(max_examples=300, deadline=None)
@given(_runs, st.integers(1, 50))
def test_merging_never_reorders_a_partition_and_loses_nothing(
    pairs: list[tuple[int, int]], window: int
) -> None:
    envs = _envs(pairs)
    merged = [e for e in merge_by_time(envs, window=window) if isinstance(e, Envelope)]
    assert sorted(merged, key=lambda e: (e.partition, e.offset)) == sorted(
        envs, key=lambda e: (e.partition, e.offset)
    )
    assert _by_partition(merged) == _by_partition(envs)


def test_merging_interleaves_partition_runs_by_time() -> None:
    # kcat reading a backlog: all of partition 0, then all of partition 1.
    envs = _envs([(0, 0), (0, 20), (0, 40), (1, 10), (1, 30), (1, 50)])
    merged = [e for e in merge_by_time(envs) if isinstance(e, Envelope)]
    assert [e.ts for e in merged] == [0, 10, 20, 30, 40, 50]


def test_corrupt_lines_pass_through_the_merge_at_once() -> None:
    bad = CorruptLine(2, "x")
    out = list(merge_by_time([*_envs([(0, 5)]), bad], window=10))
    assert out[0] is bad


# ---- pacing, topic routing -------------------------------------------------------------------


def test_pacer_scales_time_by_speed_relative_to_the_first_record() -> None:
    pacer = Pacer(speed=2.0)
    assert pacer.due_s(10_000) == 0.0
    assert pacer.due_s(12_000) == pytest.approx(1.0)
    assert pacer.due_s(9_000) == 0.0  # earlier than the first: due at once, never negative
    assert pacer.due_s(None) == 0.0


def test_speed_zero_sends_everything_at_once() -> None:
    pacer = Pacer(speed=0)
    assert pacer.due_s(0) == 0.0
    assert pacer.due_s(10**9) == 0.0


@pytest.mark.parametrize("speed", [-1.0, float("inf"), float("nan")])
def test_a_bad_speed_is_a_config_error_naming_the_flag(speed: float) -> None:
    with pytest.raises(ConfigError, match="--speed"):
        Pacer(speed=speed)


def test_topic_map_parses_and_rejects_malformed_entries() -> None:
    assert parse_topic_map(["a=b", " c = d "]) == {"a": "b", "c": "d"}
    with pytest.raises(ConfigError) as caught:
        parse_topic_map(["nope", "=x", "a=b", "a=c"])
    assert len(caught.value.problems) == 3
    assert all(p.startswith("--topic-map: ") for p in caught.value.problems)


def test_router_applies_the_map_then_the_prefix_and_leaves_foreign_topics() -> None:
    router = TopicRouter({"prod.capacity": "special"}, prefix="test.")
    assert router.route("prod.capacity") == "special"
    assert router.route("prod.targets") == "test.targets"
    assert router.route("headroom.deadletter") == "test.deadletter"
    assert router.route("something-else") == "something-else"
    assert TopicRouter({}).route("prod.targets") == "prod.targets"


def test_the_progress_bar_draws_only_on_a_terminal() -> None:
    from headroom.commands.record import Progress

    quiet = io.StringIO()
    Progress("replay x", total=100, stream=quiet, enabled=False).update(50, 5, force=True)
    assert quiet.getvalue() == ""
    shown = io.StringIO()
    bar = Progress("replay x", total=2_000_000, stream=shown, enabled=True)
    bar.update(1_000_000, 10, force=True)
    bar.close(2_000_000, 20)
    text = shown.getvalue()
    assert " 50% |" in text
    assert "100% |" in text
    assert "1.0/2.0 MB" in text
    assert text.endswith("\n")
