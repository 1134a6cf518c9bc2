"""The fast paths of the latency codec (headroom.kernel.sketch, headroom.streams.messages) against
the checked paths they shortcut: for any input, the same message or the same error, and the same
bytes out.

``LatencySketch.from_dict`` validates a plain ``dict`` in bulk and falls back to the
field-by-field path at the first oddity; a mapping that is not a ``dict`` (``MappingProxyType``)
always takes the field-by-field path, which makes it the reference here.

``decode("latency", data)`` lets msgspec decode the bytes straight into the message, its sketch
as a ``CommonSketchWire`` (no empty bins, keys in the range of the default alpha); anything that
does not fit is decoded again as plain JSON and goes through ``Latency.from_dict`` (a
``SketchWire``: every sketch the contract allows), which also words the error. The two routes must
agree, and with ``LatencySketch.from_dict`` on the sketch.
``encode`` writes a latency message's sketch from integer bin keys in ascending order; the
reference is the JSON of ``msg.to_dict()``.
"""

from __future__ import annotations

import copy
import json
import math
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

import msgspec
import numpy as np
import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from headroom.kernel import codec, sketch
from headroom.kernel.sketch import MAX_BINS, LatencySketch
from headroom.streams import messages
from headroom.streams.messages import Latency, ValidationError, decode, encode

ALPHAS = (0.01, 0.02, 0.5)


def _outcome(fn: Any, *args: Any) -> tuple[str, Any]:
    """("ok", result) or ("error", (field, reason)); any other exception fails the test."""
    try:
        return "ok", fn(*args)
    except ValidationError as exc:
        return "error", (exc.field, exc.reason)


def _frozen(value: Any) -> Any:
    """The same JSON value with every object a read-only mapping (the checked path's input)."""
    if isinstance(value, dict):
        return MappingProxyType({k: _frozen(v) for k, v in value.items()})
    if isinstance(value, list):
        return [_frozen(v) for v in value]
    return value


def _sketch_state(s: LatencySketch) -> tuple[float, dict[int, int], int, int]:
    return s.alpha, dict(s.bins), s.zeros, s.count


class StrKey(str):
    """A str subclass: not a JSON string, refused as a bin key by the checked path."""


# -- sketches ------------------------------------------------------------------------------------

_keys = st.one_of(
    st.integers(-40, 900).map(str),  # the usual keys of latencies (memoised after the first use)
    st.integers(-(10**9), 10**9).map(str),  # out of range for coarse alphas
    st.sampled_from(["-0", "05", "+5", " 5", "3.0", "", "x", "1" * 20, "36000", "-38000"]),
    st.integers(0, 50).map(lambda i: StrKey(str(i))),
)
_counts = st.one_of(
    st.integers(0, 500),
    st.sampled_from([0, -1, 2**63 - 1, 2**63, 2**64, True, False, 1.0, math.nan, None, "3", [1]]),
)
_raw_sketches = st.fixed_dictionaries(
    {
        "alpha": st.one_of(
            st.sampled_from(ALPHAS),
            st.sampled_from([0, 1, 1.0, 1e-7, math.nan, -0.01, True, "0.01", None]),
        ),
        "bins": st.one_of(
            st.dictionaries(_keys, _counts, max_size=12),
            st.dictionaries(st.integers(0, 30).map(str), st.integers(0, 9), max_size=30),
            st.sampled_from([None, [], "x", 3]),
        ),
    },
    optional={
        "zeros": st.one_of(st.integers(0, 10), st.sampled_from([-1, 2**63, True, 1.5])),
        "min": st.floats(),
    },
)


@settings(max_examples=1500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(raw=_raw_sketches)
def test_sketch_fast_path_agrees_with_the_checked_path(raw: dict[str, Any]) -> None:
    # The first call memoises the valid keys, so the second can take the fast path.
    first = _outcome(LatencySketch.from_dict, raw)
    fast = _outcome(LatencySketch.from_dict, raw)
    checked = _outcome(LatencySketch.from_dict, _frozen(raw))
    assert fast[0] == checked[0] == first[0]
    if fast[0] == "ok":
        assert _sketch_state(fast[1]) == _sketch_state(checked[1]) == _sketch_state(first[1])
        assert fast[1] == checked[1]
    else:
        assert fast[1] == checked[1] == first[1]


@pytest.mark.parametrize("alpha", ALPHAS)
def test_a_sketch_of_known_keys_takes_the_fast_path(alpha: float) -> None:
    s = LatencySketch.from_values(np.geomspace(0.5, 5000.0, 400), alpha)
    s.add(0.0, 3)
    wire = orjson.loads(orjson.dumps(s.to_dict()))
    # Decoding memoises the keys; twice, in case the memo was full and started again midway.
    LatencySketch.from_dict(wire)
    LatencySketch.from_dict(wire)
    assert sketch._from_dict_fast(wire) is not None
    assert LatencySketch.from_dict(wire) == s
    wire["bins"][next(iter(wire["bins"]))] = 0  # an empty bin: dropped, as the checked path does
    back = LatencySketch.from_dict(wire)
    assert sketch._from_dict_fast(wire) is not None
    assert len(back) == len(s) - 1
    assert back.count == s.count - s.bins[min(s.bins)]


@pytest.mark.parametrize(
    ("bins", "field"),
    [
        ({"100": 1, "101": True}, "sketch.bins.101"),
        ({"100": 1, "101": 1.0}, "sketch.bins.101"),
        ({"100": 1, "101": -1}, "sketch.bins.101"),
        ({"100": 1, "101": 2**63}, "sketch.bins.101"),
        ({"100": 1, "0101": 1}, "sketch.bins.0101"),
        ({"100": 1, StrKey("101"): 1}, "sketch.bins.101"),
        ({"100": 1, "99999": 1}, "sketch.bins.99999"),
    ],
)
def test_one_bad_bin_among_known_keys_is_named(bins: dict[Any, Any], field: str) -> None:
    LatencySketch.from_dict({"alpha": 0.01, "bins": {"100": 1, "101": 1}})  # memoise the keys
    with pytest.raises(ValidationError) as info:
        LatencySketch.from_dict({"alpha": 0.01, "bins": bins})
    assert info.value.field == field


def test_a_full_key_memo_starts_again_so_the_fleets_keys_keep_the_fast_path() -> None:
    usual = {"alpha": 0.01, "bins": {str(k): 1 for k in range(20_000, 20_100)}}
    odd = {"alpha": 1e-6, "bins": {str(k): 1 for k in range(-(10**8), -(10**8) + MAX_BINS)}}
    LatencySketch.from_dict(odd)  # fills the memo (and more) with keys nobody else uses
    LatencySketch.from_dict(usual)
    LatencySketch.from_dict(usual)
    assert sketch._from_dict_fast(usual) is not None
    assert len(sketch._KEY_MEMO) <= sketch._KEY_MEMO_MAX


def test_keys_of_a_finer_alpha_in_the_memo_are_still_range_checked() -> None:
    # 30,000 is a valid key at alpha 1e-3 but beyond the range of alpha 0.5 ([-678, 646]).
    LatencySketch.from_dict({"alpha": 1e-3, "bins": {"30000": 1}})
    LatencySketch.from_dict({"alpha": 0.5, "bins": {"5": 1}})
    with pytest.raises(ValidationError) as info:
        LatencySketch.from_dict({"alpha": 0.5, "bins": {"5": 1, "30000": 1}})
    assert info.value.field == "sketch.bins.30000"
    assert "out of the range" in info.value.reason
    assert sketch._from_dict_fast({"alpha": 0.5, "bins": {"5": 1}}) is not None


def test_counts_whose_sum_overflows_64_bits_are_accepted_one_by_one() -> None:
    big = 2**63 - 1
    s = LatencySketch.from_dict({"alpha": 0.01, "bins": {"100": big, "101": big}})
    assert s.count == 2 * big
    assert s.bins == {100: big, 101: big}


def test_minus_zero_is_read_as_key_zero_and_written_canonically() -> None:
    s = LatencySketch.from_dict({"alpha": 0.01, "bins": {"-0": 3}})
    assert s.bins == {0: 3}
    assert s.to_dict()["bins"] == {"0": 3}
    # "0" and "-0" name one bin: the last one wins on both paths, after both are checked.
    raw = {"alpha": 0.01, "bins": {"-0": 2, "0": 5}}
    assert LatencySketch.from_dict(raw).bins == {0: 5}
    assert LatencySketch.from_dict(_frozen(raw)).bins == {0: 5}
    with pytest.raises(ValidationError) as info:
        LatencySketch.from_dict({"alpha": 0.01, "bins": {"-0": "x", "0": 5}})
    assert info.value.field == "sketch.bins.-0"


# -- latency messages ----------------------------------------------------------------------------

LATENCY: dict[str, Any] = {
    "v": 1,
    "ts": 1796000001.0,
    "region": "us-east",
    "replica": "rank-3",
    "pool": "opportunistic",
    "path": "rma",
    "window_s": 1.0,
    "count": 812,
    "samples_ms": [41.2, 38.0, 97.5],
    "sketch": {"alpha": 0.01, "bins": {"372": 10, "373": 7}, "zeros": 0},
    "inflight": 12,
    "queue_ms": 3.1,
}
_FIELDS = [k for k in LATENCY if k != "v"]
_odd = st.one_of(
    st.sampled_from(
        [0, 0.0, -0.0, 1, -1, -1.5, 1.5, 2**63, 2**64, math.nan, math.inf, -math.inf, 1e308]
    ),
    st.sampled_from([True, False, None, "", "x", "us east", "r" * 65, "x" * 300, [], {}]),
    st.sampled_from(["base", "rma", "sbm", "dedicated", "opportunistic", "precompute"]),
    st.lists(st.one_of(st.floats(), st.integers(-2, 2)), max_size=4),
    st.floats(),
    st.integers(),
    _raw_sketches,
)


def _routes(d: dict[str, Any]) -> list[tuple[str, Any]]:
    """The outcome of every route for one message: the dict, the read-only mapping and, when the
    dict is JSON (finite numbers, 64-bit integers), its bytes through decode."""
    out = [_outcome(Latency.from_dict, d), _outcome(Latency.from_dict, _frozen(d))]
    try:
        data = json.dumps(d, allow_nan=False).encode()
        orjson.dumps(d)  # refuses integers beyond 64 bits, as the wire does
    except (ValueError, TypeError):
        return out
    out.append(_outcome(decode, "latency", data))
    return out


@settings(max_examples=1500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_latency_routes_agree(data: st.DataObject) -> None:
    d = copy.deepcopy(LATENCY)
    for name in data.draw(st.lists(st.sampled_from(_FIELDS), max_size=3, unique=True)):
        if data.draw(st.booleans()):
            del d[name]
        else:
            d[name] = data.draw(_odd)
    if data.draw(st.booleans()):
        d["v"] = data.draw(st.sampled_from([1, 2, 1.0, True, "1", None]))
    if data.draw(st.booleans()):
        d["extension"] = data.draw(_odd)  # unknown fields are ignored on every route
    first, *others = _routes(d)
    assert all(o == first for o in others), (first, others)


_EDGES = [
    *[0, 0.0, -0.0, 1, -1, -1.5, 1.5, 2**63 - 1, 2**63, 2**64, math.nan, math.inf, -math.inf],
    *[1e308, 5e-324, True, False, None, "", "x", "us east", "r" * 64, "r" * 65, "x" * 256],
    *["x" * 257, [], {}, (), [1.0], [1], [-1.0], [True], [math.inf], (1.0,)],
    *["base", "rma", "sbm", "dedicated", "opportunistic", "precompute", "Rma", "us-east\n"],
]


def test_every_edge_value_in_every_latency_field_gives_the_same_outcome() -> None:
    for name in _FIELDS:
        for value in _EDGES:
            d = copy.deepcopy(LATENCY)
            d[name] = value
            first, *others = _routes(d)
            assert all(o == first for o in others), (name, value, first, others)
        d = copy.deepcopy(LATENCY)
        del d[name]
        first, *others = _routes(d)
        assert all(o == first for o in others), name
        if name not in ("samples_ms", "sketch"):
            assert first == ("error", (name, "missing"))


@settings(max_examples=1000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(raw=_raw_sketches)
def test_a_sketch_inside_a_message_is_judged_like_the_sketch_alone(raw: dict[str, Any]) -> None:
    d = copy.deepcopy(LATENCY) | {"sketch": raw}
    alone = _outcome(LatencySketch.from_dict, _frozen(raw))
    for route in _routes(d):
        if alone[0] == "ok":
            assert route[0] == "ok"
            assert route[1].sketch == alone[1]
            assert route[1].sketch.count == alone[1].count
        else:
            assert route == alone


@pytest.mark.parametrize(
    "key", ["1" * 19, "9" * 19, "1" * 20, "-" + "1" * 20, "9" * 25, "-0", "05", "+5", "1e3"]
)
@pytest.mark.parametrize("count", [0, 1])
def test_long_and_odd_keys_get_the_words_of_the_sketch_alone(key: str, count: int) -> None:
    raw = {"alpha": 0.01, "bins": {"100": 1, key: count}}
    d = copy.deepcopy(LATENCY) | {"sketch": raw}
    alone = _outcome(LatencySketch.from_dict, _frozen(raw))
    for route in _routes(d):
        if alone[0] == "ok":
            assert route[0] == "ok"
            assert route[1].sketch == alone[1]
        else:
            assert route == alone


def _wire(msg: Latency) -> bytes:
    return json.dumps(msg.to_dict()).encode()  # not our encoder: plain JSON from elsewhere


def test_a_message_from_a_producer_takes_the_direct_route(monkeypatch: pytest.MonkeyPatch) -> None:
    s = LatencySketch.from_values(np.geomspace(0.5, 5000.0, 400))
    s.add(0.0, 3)
    msg = Latency(
        ts=1796000001.0,
        region="us-east",
        replica="rank-3",
        pool="opportunistic",
        path="rma",
        window_s=1.0,
        count=s.count,
        samples_ms=(41.2, 38.0),
        sketch=s,
        inflight=12,
        queue_ms=3.1,
    )

    def no_fallback(*_args: Any) -> Any:
        raise AssertionError("took the plain-JSON route")

    monkeypatch.setattr(messages, "_checked", no_fallback)
    for data in (encode(msg), _wire(msg)):
        back = decode("latency", data)
        assert back == msg
        assert isinstance(back.sketch, LatencySketch)
        assert back.sketch.count == s.count
        assert back.samples_ms == (41.2, 38.0)


@pytest.mark.parametrize(
    ("sketch_dict", "why"),
    [
        ({"alpha": 0.01, "bins": {"100": 0, "101": 4}}, "an empty bin"),
        ({"alpha": 1e-4, "bins": {"60000": 2}}, "a key only a finer alpha reaches"),
    ],
)
def test_a_sketch_the_common_form_does_not_fit_is_still_accepted(
    sketch_dict: dict[str, Any], why: str
) -> None:
    d = copy.deepcopy(LATENCY) | {"sketch": sketch_dict}
    with pytest.raises(msgspec.ValidationError):  # the direct route refuses it ...
        msgspec.json.decode(orjson.dumps(d), type=Latency)
    msg = decode("latency", orjson.dumps(d))  # ... and decode takes the plain route: accepted
    assert isinstance(msg, Latency)
    assert msg.sketch == LatencySketch.from_dict(sketch_dict), why
    assert 0 not in msg.sketch.bins.values()


def test_keys_of_a_coarse_alpha_are_range_checked_on_the_direct_route() -> None:
    # 5000 lies in the range of the default alpha (the common form lets it through) but not
    # in that of alpha 0.5 ([-678, 646]).
    d = copy.deepcopy(LATENCY) | {"sketch": {"alpha": 0.5, "bins": {"5": 1, "5000": 1}}}
    with pytest.raises(ValidationError) as info:
        decode("latency", orjson.dumps(d))
    assert info.value.field == "sketch.bins.5000"
    assert "out of the range" in info.value.reason


# -- encoding ------------------------------------------------------------------------------------


def _sketches() -> st.SearchStrategy[LatencySketch]:
    """Sketches whose bins are in ascending order or not (several batches, merges, zeros)."""
    batch = st.lists(
        st.one_of(st.just(0.0), st.floats(1e-3, 1e6, allow_nan=False)), min_size=1, max_size=40
    )

    def build(alpha: float, batches: list[list[float]]) -> LatencySketch:
        s = LatencySketch(alpha)
        for b in batches:
            s.add_many(b)
        return s

    return st.builds(build, st.sampled_from(ALPHAS), st.lists(batch, max_size=4))


@settings(max_examples=300, deadline=None)
@given(
    s=_sketches(),
    samples=st.one_of(st.none(), st.lists(st.floats(0.0, 1e4), max_size=5)),
    count=st.integers(0, 2**63 - 1),
)
def test_encoding_a_latency_message_writes_the_json_of_to_dict(
    s: LatencySketch, samples: list[float] | None, count: int
) -> None:
    msg = Latency(
        ts=1796000001.5,
        region="eu-west",
        replica="rank-9",
        pool="dedicated",
        path="sbm",
        window_s=10.0,
        count=count,
        samples_ms=samples,
        sketch=s,
        inflight=0,
        queue_ms=0.0,
    )
    data = encode(msg)
    assert data == msgspec.json.encode(msg.to_dict())  # the same bytes, field for field
    assert orjson.loads(data) == json.loads(data) == msg.to_dict()
    assert list(orjson.loads(data)["sketch"]["bins"]) == sorted(
        orjson.loads(data)["sketch"]["bins"], key=int
    )
    assert decode("latency", data) == msg
    before = dict(s.bins)
    encode(msg)
    assert dict(s.bins) == before  # encoding leaves the sketch alone


def test_dumps_writes_int_keys_as_decimal_strings_only_when_asked() -> None:
    obj: Mapping[Any, Any] = {"bins": {-5: 1, 0: 2, 372: 10}}
    assert codec.dumps(obj, int_keys=True) == b'{"bins":{"-5":1,"0":2,"372":10}}'
    with pytest.raises(ValidationError) as info:
        codec.dumps(obj)
    assert info.value.field == "$"
    with pytest.raises(ValidationError):
        codec.dumps({"x": "y" * 100}, max_bytes=50, int_keys=True)
