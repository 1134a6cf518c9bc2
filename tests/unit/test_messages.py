"""The message contract (docs/messages.md): round trips, validation that names the field, and a
decoder
that raises nothing but ValidationError whatever it is fed."""

from __future__ import annotations

import base64
import copy
import json
import math
import pickle
from typing import Any

import numpy as np
import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from headroom.kernel import codec
from headroom.streams import messages as msgmod
from headroom.streams.messages import (
    MAX_DEADLETTER_PAYLOAD_BYTES,
    MAX_LIST_ITEMS,
    MAX_MESSAGE_BYTES,
    TOPIC_KINDS,
    TYPES,
    Budget,
    Capacity,
    Cost,
    DeadLetter,
    Event,
    Latency,
    LatencySketch,
    Precompute,
    Request,
    RmaTarget,
    SbmTarget,
    Target,
    ValidationError,
    ValueSignal,
    decode,
    encode,
)

# The examples of docs/messages.md, verbatim (events and deadletter filled in with plausible
# fields).
EXAMPLES: dict[str, dict[str, Any]] = {
    "capacity": {
        "v": 1,
        "ts": 1796000000.0,
        "region": "us-east",
        "resource": "accelerator",
        "hardware": "gpu-b",
        "pool": "opportunistic",
        "units": 4.0,
        "expires_in_s": 1800.0,
        "reason": "grant",
        "id": "c-0001",
    },
    "latency": {
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
    },
    "requests": {
        "v": 1,
        "ts": 1796000001.2,
        "id": "q-000042",
        "region": "us-east",
        "segment": "casual",
        "value": 0.73,
        "eligible": True,
        "user": 918273,
    },
    "targets": {
        "v": 1,
        "ts": 1796000060.0,
        "region": "us-east",
        "epoch": 17,
        "ttl_s": 180.0,
        "rma": {"candidates": 720, "base": 500, "max": 1500},
        "sbm": {"coverage": 0.18, "segments": {"casual": 0.35, "premium": 0.05}},
        "budget": {"cpu": 12.0, "accelerator": 3.0},
        "reason": "pid",
    },
    "value": {
        "v": 1,
        "ts": 1796000010.0,
        "region": "us-east",
        "segment": "casual",
        "lever": "sbm",
        "arm": "treatment",
        "n": 240,
        "value_sum": 181.2,
        "value_sq_sum": 160.4,
        "window_s": 10.0,
        "cost": {"cpu_ms": 120.0, "accelerator_ms": 960.0},
    },
    "events": {
        "v": 1,
        "ts": 1796000020.0,
        "region": "us-east",
        "kind": "shedding.started",
        "source": "server",
        "side": "server",
        "lever": "rma",
        "dropped": {"rma_candidates": 320, "sbm_requests": 0},
        "policy": "headroom",
    },
    "deadletter": {
        "v": 1,
        "ts": 1796000030.0,
        "topic": "headroom.latency",
        "partition": 3,
        "offset": 1234,
        "error": "count: must be a non-negative integer, got -1",
        "payload_b64": base64.b64encode(b'{"v":1,"count":-1}').decode(),
    },
    "precompute": {
        "v": 1,
        "ts": 1796000100.0,
        "region": "us-east",
        "user": 918273,
        "segment": "premium",
        "model": "strong",
        "expires_at": 1796001900.0,
        "ranking": [4711, 815, 99],
        "cost": {"cpu_ms": 3.0, "accelerator_ms": 60.0},
    },
}

# Fields a producer may leave out; every other field of the examples is required.
OPTIONAL = {
    "capacity": {"expires_in_s"},
    "latency": {"samples_ms", "sketch"},  # but not both: see test_latency_needs_samples_or_sketch
    "events": {"region", "side", "lever", "dropped", "policy"},
    "deadletter": {"partition", "offset"},
}


def _example(kind: str) -> dict[str, Any]:
    return copy.deepcopy(EXAMPLES[kind])


def _set_path(d: dict[str, Any], path: str, value: Any) -> None:
    *parents, last = path.split(".")
    for p in parents:
        d = d[p]
    d[last] = value


def _leaf_paths(d: dict[str, Any], prefix: str = "") -> list[str]:
    out = []
    for k, value in d.items():
        path = f"{prefix}{k}"
        if isinstance(value, dict) and k not in ("segments", "bins", "dropped"):
            out.extend(_leaf_paths(value, path + "."))
        else:
            out.append(path)
    return out


def _error_of(fn: Any, *args: Any) -> ValidationError | None:
    """Call ``fn``; return the ValidationError it raised, or None. Any other exception escapes
    and fails the test."""
    try:
        fn(*args)
    except ValidationError as exc:
        return exc
    return None


# -- round trips -------------------------------------------------------------------------------


def test_registry_covers_every_topic_of_the_contract() -> None:
    assert set(TOPIC_KINDS) == set(TYPES) == set(EXAMPLES)
    for kind, cls in TYPES.items():
        assert kind == cls.KIND


@pytest.mark.parametrize("kind", TOPIC_KINDS)
def test_contract_example_decodes_and_round_trips_to_the_same_json(kind: str) -> None:
    data = orjson.dumps(EXAMPLES[kind])
    msg = decode(kind, data)
    assert isinstance(msg, TYPES[kind])
    again = decode(kind, encode(msg))
    assert again == msg
    assert orjson.loads(encode(msg)) == EXAMPLES[kind]
    assert msg.to_dict() == EXAMPLES[kind]
    assert type(msg).from_dict(msg.to_dict()) == msg


def test_decoded_fields_have_the_documented_types() -> None:
    lat = decode("latency", orjson.dumps(EXAMPLES["latency"]))
    assert isinstance(lat, Latency)
    assert lat.samples_ms == (41.2, 38.0, 97.5)
    assert isinstance(lat.sketch, LatencySketch)
    assert lat.sketch.count == 17
    target = decode("targets", orjson.dumps(EXAMPLES["targets"]))
    assert isinstance(target, Target)
    assert target.rma == RmaTarget(candidates=720, base=500, max=1500)
    assert target.sbm.segments["casual"] == 0.35
    with pytest.raises(TypeError):
        target.sbm.segments["casual"] = 1.0  # type: ignore[index]
    event = decode("events", orjson.dumps(EXAMPLES["events"]))
    assert isinstance(event, Event)
    assert event["dropped"] == {"rma_candidates": 320, "sbm_requests": 0}
    assert event.extra["policy"] == "headroom"


def test_messages_are_frozen() -> None:
    msg = decode("requests", orjson.dumps(EXAMPLES["requests"]))
    with pytest.raises(AttributeError):
        msg.ts = 0.0  # type: ignore[misc]


def test_integer_given_for_a_float_field_is_normalised_and_round_trips() -> None:
    d = _example("capacity") | {"ts": 1796000000, "units": 4}
    msg = Capacity.from_dict(d)
    assert type(msg.ts) is float
    assert type(msg.units) is float
    assert decode("capacity", encode(msg)) == msg


_names = st.from_regex(r"[A-Za-z0-9_.-]{1,64}", fullmatch=True)
_texts = st.text(min_size=1, max_size=40)
_ts = st.floats(min_value=0.0, max_value=4e9, allow_nan=False)
_nonneg = st.floats(min_value=0.0, max_value=1e12, allow_nan=False)
_positive = st.floats(min_value=1e-6, max_value=1e9, allow_nan=False)
_shares = st.floats(min_value=0.0, max_value=1.0, allow_nan=False)
_counts = st.integers(min_value=0, max_value=(1 << 63) - 1)
_costs = st.builds(Cost, cpu_ms=_nonneg, accelerator_ms=_nonneg)
_sketches = st.builds(
    LatencySketch.from_values,
    st.lists(st.floats(min_value=0.0, max_value=1e6, allow_nan=False), max_size=50),
    st.sampled_from([0.01, 0.02, 0.05]),
)
_json_leaf = st.none() | st.booleans() | st.integers(-(2**63), 2**63 - 1) | _nonneg | _texts


def _json_nested(inner: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.one_of(st.lists(inner, max_size=4), st.dictionaries(_texts, inner, max_size=4))


_json = st.recursive(_json_leaf, _json_nested, max_leaves=12)


@st.composite
def _rma(draw: st.DrawFn) -> RmaTarget:
    base = draw(st.integers(0, 10_000))
    return RmaTarget(
        candidates=draw(st.integers(0, 20_000)), base=base, max=draw(st.integers(base, 20_000))
    )


@st.composite
def _latency(draw: st.DrawFn) -> Latency:
    samples = draw(st.none() | st.lists(_nonneg, max_size=30).map(tuple))
    sketch = draw(_sketches if samples is None else st.none() | _sketches)
    return Latency(
        ts=draw(_ts),
        region=draw(_names),
        replica=draw(_texts),
        pool=draw(st.sampled_from(["opportunistic", "dedicated"])),
        path=draw(st.sampled_from(["base", "rma", "sbm"])),
        window_s=draw(_positive),
        count=draw(_counts),
        samples_ms=samples,
        sketch=sketch,
        inflight=draw(st.integers(0, 10_000)),
        queue_ms=draw(_nonneg),
    )


_messages: dict[str, st.SearchStrategy[Any]] = {
    "capacity": st.builds(
        Capacity,
        ts=_ts,
        region=_names,
        resource=st.sampled_from(["cpu", "accelerator"]),
        hardware=_names,
        pool=st.sampled_from(["opportunistic", "dedicated"]),
        units=_nonneg,
        expires_in_s=st.none() | _positive,
        reason=st.sampled_from(["grant", "reclaim", "preempt", "update"]),
        id=_texts,
        remote=st.booleans(),
    ),
    "latency": _latency(),
    "requests": st.builds(
        Request,
        ts=_ts,
        id=_texts,
        region=_names,
        segment=_names,
        value=_nonneg,
        eligible=st.booleans(),
        user=_counts,
    ),
    "targets": st.builds(
        Target,
        ts=_ts,
        region=_names,
        epoch=_counts,
        ttl_s=_positive,
        rma=_rma(),
        sbm=st.builds(
            SbmTarget, coverage=_shares, segments=st.dictionaries(_names, _shares, max_size=5)
        ),
        budget=st.builds(Budget, cpu=_nonneg, accelerator=_nonneg),
        reason=_texts,
    ),
    "value": st.builds(
        ValueSignal,
        ts=_ts,
        region=_names,
        segment=_names,
        lever=st.sampled_from(["rma", "sbm", "precompute"]),
        arm=st.sampled_from(["treatment", "control"]),
        n=_counts,
        value_sum=st.floats(-1e9, 1e9, allow_nan=False),
        value_sq_sum=_nonneg,
        window_s=_positive,
        cost=_costs,
        stratum=st.none() | st.integers(0, 63),
    ),
    "events": st.builds(
        Event,
        ts=_ts,
        kind=_texts,
        source=st.sampled_from(["sim", "server", "client", "controller", "feed", "precompute"]),
        region=st.none() | _names,
        extra=st.dictionaries(
            _texts.filter(lambda k: k not in {"v", "ts", "region", "kind", "source"}),
            _json,
            max_size=5,
        ),
    ),
    "deadletter": st.builds(
        DeadLetter.for_payload,
        ts=_ts,
        topic=_texts,
        partition=st.none() | st.integers(0, 1000),
        offset=st.none() | _counts,
        error=_texts,
        payload=st.none() | st.binary(max_size=200),
        key=st.none() | st.binary(max_size=50),
    ),
    "precompute": st.builds(
        Precompute,
        ts=_ts,
        region=_names,
        user=_counts,
        segment=_names,
        model=_names,
        expires_at=_ts,
        ranking=st.lists(_counts, max_size=50).map(tuple),
        cost=_costs,
    ),
}


@pytest.mark.parametrize("kind", TOPIC_KINDS)
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_every_valid_message_round_trips_through_the_codec(kind: str, data: st.DataObject) -> None:
    msg = data.draw(_messages[kind])
    assert decode(kind, encode(msg)) == msg
    # stdlib json reads what we write: the bytes are plain JSON.
    assert type(msg).from_dict(json.loads(encode(msg))) == msg


# -- hostile input -------------------------------------------------------------------------------


@settings(max_examples=300, deadline=None)
@given(kind=st.sampled_from(TOPIC_KINDS), data=st.binary(max_size=512))
def test_garbage_bytes_raise_only_validation_error(kind: str, data: bytes) -> None:
    err = _error_of(decode, kind, data)
    if err is not None:
        assert err.field
        assert str(err) == f"{err.field}: {err.reason}"


@settings(max_examples=300, deadline=None)
@given(kind=st.sampled_from(TOPIC_KINDS), value=_json)
def test_arbitrary_json_values_raise_only_validation_error(kind: str, value: Any) -> None:
    # from_dict has no safety net (decode does): it must itself raise nothing else.
    _error_of(TYPES[kind].from_dict, value)


_hostile = st.one_of(
    st.sampled_from(
        [math.nan, math.inf, -math.inf, -1, -1.5, 2**64, -(2**64), True, False, None, "", "x" * 300]
    ),
    st.lists(st.integers(), max_size=3),
    st.dictionaries(st.text(max_size=3), st.integers(), max_size=3),
    st.floats(),
    st.integers(),
    st.text(max_size=5),
)


@settings(max_examples=400, deadline=None)
@given(kind=st.sampled_from(TOPIC_KINDS), data=st.data())
def test_hostile_value_in_any_field_is_either_valid_or_named_in_the_error(
    kind: str, data: st.DataObject
) -> None:
    d = _example(kind)
    path = data.draw(st.sampled_from(_leaf_paths(d)))
    value = data.draw(_hostile)
    _set_path(d, path, value)
    err = _error_of(TYPES[kind].from_dict, d)
    if err is not None:
        # The one cross-field rule, base <= max, is reported on base whichever side broke it.
        named = CROSS_FIELD.get(path, path)
        assert err.field in (path, named) or err.field.startswith((path + ".", path + "["))
    else:  # accepted: then it must survive the wire unchanged
        msg = TYPES[kind].from_dict(d)
        assert decode(kind, encode(msg)) == msg


CROSS_FIELD = {"rma.max": "rma.base"}


# (kind, field path, value, reason fragment): each clearly breaks a rule of docs/messages.md.
INVALID = [
    ("capacity", "units", math.nan, "finite"),
    ("capacity", "units", math.inf, "finite"),
    ("capacity", "units", -4.0, ">= 0"),
    ("capacity", "units", True, "number"),
    ("capacity", "units", "4", "number"),
    ("capacity", "ts", -1.0, ">= 0"),
    ("capacity", "ts", -math.inf, "finite"),
    ("capacity", "region", "", "1-64"),
    ("capacity", "region", "us east", "[A-Za-z0-9_.-]"),
    ("capacity", "region", "r" * 65, "1-64"),
    ("capacity", "region", 7, "string"),
    ("capacity", "resource", "gpu", "cpu, accelerator"),
    ("capacity", "pool", "spot", "opportunistic"),
    ("capacity", "reason", "steal", "grant"),
    ("capacity", "expires_in_s", 0.0, "> 0"),
    ("capacity", "expires_in_s", -5.0, "> 0"),
    ("capacity", "remote", 1, "true or false"),
    ("latency", "count", -1, "non-negative"),
    ("latency", "count", 1.0, "integer"),
    ("latency", "count", True, "integer"),
    ("latency", "count", 2**64, "between"),
    ("latency", "window_s", 0, "> 0"),
    ("latency", "path", "precompute", "base, rma, sbm"),
    ("latency", "inflight", -3, "non-negative"),
    ("latency", "samples_ms", "41.2", "list"),
    ("latency", "sketch.alpha", 1.5, "1)"),
    ("latency", "sketch.zeros", -1, "non-negative"),
    ("requests", "eligible", 1, "true or false"),
    ("requests", "value", -0.5, ">= 0"),
    ("requests", "user", "918273", "integer"),
    ("requests", "user", -1, "non-negative"),
    ("requests", "segment", "ca sual", "[A-Za-z0-9_.-]"),
    ("targets", "epoch", -1, "non-negative"),
    ("targets", "ttl_s", 0.0, "> 0"),
    ("targets", "rma.candidates", -1, "non-negative"),
    ("targets", "rma.candidates", 720.5, "integer"),
    ("targets", "rma.max", 10, "<= max"),  # base (500) > max: reported on base
    ("targets", "sbm.coverage", 1.01, "[0, 1]"),
    ("targets", "sbm.coverage", -0.01, "[0, 1]"),
    ("targets", "sbm.segments", [0.3], "object"),
    ("targets", "budget.cpu", -1.0, ">= 0"),
    ("targets", "budget", 12.0, "object"),
    ("value", "lever", "both", "rma, sbm, precompute"),
    ("value", "arm", "holdout", "treatment, control"),
    ("value", "n", -240, "non-negative"),
    ("value", "value_sq_sum", -1.0, ">= 0"),
    ("value", "cost.cpu_ms", math.nan, "finite"),
    ("events", "source", "robot", "server"),
    ("events", "kind", "", "1-256"),
    ("events", "policy", math.nan, "finite"),
    ("deadletter", "payload_b64", "not base64!", "base64"),
    ("deadletter", "partition", -1, "non-negative"),
    ("deadletter", "topic", "", "1-249"),
    ("precompute", "ranking", [1, -2], "non-negative"),
    ("precompute", "ranking", [1, 2.0], "integer"),
    ("precompute", "expires_at", math.nan, "finite"),
    ("precompute", "model", "strong model", "[A-Za-z0-9_.-]"),
]


@pytest.mark.parametrize(("kind", "path", "value", "fragment"), INVALID)
def test_invalid_field_is_rejected_with_its_path_and_reason(
    kind: str, path: str, value: Any, fragment: str
) -> None:
    d = _example(kind)
    _set_path(d, path, value)
    with pytest.raises(ValidationError) as info:
        TYPES[kind].from_dict(d)
    err = info.value
    expected = "rma.base" if path == "rma.max" else path
    assert err.field == expected or err.field.startswith(expected + "[")
    assert fragment in err.reason
    assert str(err) == f"{err.field}: {err.reason}"


def test_the_error_names_the_list_element_at_fault() -> None:
    d = _example("latency")
    d["samples_ms"] = [41.2, 38.0, -1.0]
    with pytest.raises(ValidationError) as info:
        Latency.from_dict(d)
    assert info.value.field == "samples_ms[2]"
    d = _example("latency")
    d["sketch"]["bins"]["12x"] = 3
    with pytest.raises(ValidationError) as info:
        Latency.from_dict(d)
    assert info.value.field == "sketch.bins.12x"
    d = _example("targets")
    d["sbm"]["segments"]["premium"] = 2.0
    with pytest.raises(ValidationError) as info:
        Target.from_dict(d)
    assert info.value.field == "sbm.segments.premium"


@pytest.mark.parametrize("kind", TOPIC_KINDS)
def test_every_missing_required_field_is_named(kind: str) -> None:
    for path in _leaf_paths(EXAMPLES[kind]):
        if path.split(".")[0] in OPTIONAL.get(kind, set()):
            continue
        d = _example(kind)
        *parents, last = path.split(".")
        node = d
        for p in parents:
            node = node[p]
        del node[last]
        with pytest.raises(ValidationError) as info:
            TYPES[kind].from_dict(d)
        assert (info.value.field, info.value.reason) == (path, "missing"), path


@pytest.mark.parametrize("kind", TOPIC_KINDS)
def test_optional_fields_may_be_left_out(kind: str) -> None:
    d = _example(kind)
    for name in OPTIONAL.get(kind, set()) - {"samples_ms"}:
        d.pop(name, None)
    TYPES[kind].from_dict(d)


def test_latency_needs_samples_or_sketch() -> None:
    d = _example("latency")
    del d["samples_ms"], d["sketch"]
    with pytest.raises(ValidationError) as info:
        Latency.from_dict(d)
    assert info.value.field == "samples_ms"


@pytest.mark.parametrize("kind", TOPIC_KINDS)
@pytest.mark.parametrize("version", [0, 2, 99, -1, "1", 1.0, True, None])
def test_other_schema_versions_are_refused_before_anything_else(kind: str, version: Any) -> None:
    d = {"v": version, "unrelated": 1}  # every other field missing: the version is reported
    with pytest.raises(ValidationError) as info:
        decode(kind, orjson.dumps(d))
    assert info.value.field == "v"
    if isinstance(version, int) and not isinstance(version, bool):
        assert f"unsupported schema version {version}" in info.value.reason


@pytest.mark.parametrize("kind", [k for k in TOPIC_KINDS if k != "events"])
def test_unknown_fields_are_ignored(kind: str) -> None:
    d = _example(kind) | {"added_in_v1_7": {"x": [1, 2]}, "zz": math.pi}
    assert decode(kind, orjson.dumps(d)) == decode(kind, orjson.dumps(EXAMPLES[kind]))


def test_event_keeps_every_extra_field_on_a_round_trip() -> None:
    d = _example("events") | {"nested": {"a": [1, 2.5, None, True, "s"]}}
    msg = decode("events", orjson.dumps(d))
    assert orjson.loads(encode(msg)) == d


def test_event_extra_may_not_shadow_common_fields() -> None:
    with pytest.raises(ValidationError) as info:
        Event(ts=1.0, kind="k", source="sim", extra={"ts": 2.0})
    assert info.value.field == "ts"


def test_event_extra_nested_too_deep_is_refused() -> None:
    deep: Any = 1
    for _ in range(40):
        deep = [deep]
    with pytest.raises(ValidationError) as info:
        Event(ts=1.0, kind="k", source="sim", extra={"deep": deep})
    assert info.value.field.startswith("deep")
    assert "deeper" in info.value.reason


def test_event_region_may_be_null_for_run_wide_lines() -> None:
    msg = Event(ts=0.0, kind="run.started", source="sim", extra={"seed": 7})
    assert msg.region is None
    assert msg.key() is None
    assert decode("events", encode(msg)) == msg


# -- sizes ---------------------------------------------------------------------------------------


def test_a_list_over_100000_items_is_refused_naming_the_list() -> None:
    d = _example("latency")
    d["samples_ms"] = [1.0] * (MAX_LIST_ITEMS + 1)
    with pytest.raises(ValidationError) as info:
        decode("latency", orjson.dumps(d))
    assert info.value.field == "samples_ms"
    d["samples_ms"] = [1.0] * MAX_LIST_ITEMS
    assert len(decode("latency", orjson.dumps(d)).samples_ms or ()) == MAX_LIST_ITEMS  # type: ignore[union-attr]


def test_a_message_over_1_mib_is_refused_before_parsing() -> None:
    data = b'{"v":1,' + b'"pad":"' + b"x" * MAX_MESSAGE_BYTES + b'"}'
    with pytest.raises(ValidationError) as info:
        decode("requests", data)
    assert info.value.field == "$"
    assert "over the limit" in info.value.reason


def test_encode_refuses_a_message_that_would_exceed_1_mib() -> None:
    big = Precompute(
        ts=1.0,
        region="r",
        user=1,
        segment="s",
        model="strong",
        expires_at=2.0,
        ranking=tuple(range(10**12, 10**12 + MAX_LIST_ITEMS)),  # 14 bytes an id: ~1.4 MB
        cost=Cost(cpu_ms=0.0, accelerator_ms=0.0),
    )
    with pytest.raises(ValidationError) as info:
        encode(big)
    assert info.value.field == "$"


# -- decode's edges --------------------------------------------------------------------------------


def test_precompute_tombstone_decodes_to_none() -> None:
    assert decode("precompute", None) is None


@pytest.mark.parametrize("kind", [k for k in TOPIC_KINDS if k != "precompute"])
def test_tombstones_are_refused_on_every_other_topic(kind: str) -> None:
    with pytest.raises(ValidationError) as info:
        decode(kind, None)
    assert "tombstone" in info.value.reason


@pytest.mark.parametrize(
    "data",
    [b"", b"\xff\xfe", b"null", b"[]", b"1", b'"s"', b"{", b'{"v":1,"ts":NaN}', b'{"ts":1e400}'],
)
def test_non_objects_and_bad_json_name_the_whole_message(data: bytes) -> None:
    with pytest.raises(ValidationError) as info:
        decode("capacity", data)
    assert info.value.field in ("$", "v", "ts")  # 1e400 is named where it stands


@pytest.mark.parametrize(
    ("kind", "path"),
    [
        ("capacity", "units"),
        ("capacity", "ts"),
        ("capacity", "expires_in_s"),
        ("latency", "queue_ms"),
        ("latency", "samples_ms"),
        ("requests", "value"),
        ("targets", "budget.cpu"),
        ("value", "value_sum"),
        ("precompute", "expires_at"),
    ],
)
@pytest.mark.parametrize("literal", [b"1e400", b"-1e400", b"1.8e308", b"1" + b"0" * 400 + b".0"])
def test_a_number_beyond_the_range_of_a_double_is_refused(
    kind: str, path: str, literal: bytes
) -> None:
    d = _example(kind)
    marker = 123456.789
    _set_path(d, path, [marker] if path == "samples_ms" else marker)
    data = orjson.dumps(d).replace(b"123456.789", literal)
    assert literal in data
    with pytest.raises(ValidationError) as info:
        decode(kind, data)
    err = info.value
    assert err.field in (path, f"{path}[0]", "$")
    assert "range" in err.reason or "finite" in err.reason


_json_hostile = st.one_of(
    st.sampled_from([-1, -1.5, 2**63, 2**64 - 1, True, False, None, "", "x" * 300, 0, 1e308]),
    st.lists(st.integers(-(2**63), 2**63 - 1), max_size=3),
    st.dictionaries(st.text(max_size=3), st.integers(-5, 5), max_size=3),
    st.floats(allow_nan=False, allow_infinity=False),
    st.integers(-(2**63), 2**64 - 1),
    st.text(max_size=5),
)


@settings(max_examples=400, deadline=None)
@given(kind=st.sampled_from(TOPIC_KINDS), data=st.data())
def test_decode_and_from_dict_give_the_same_message_or_the_same_error(
    kind: str, data: st.DataObject
) -> None:
    d = _example(kind)
    # Leaves of the example as it is: a hostile value may be a mapping whose keys hold dots, and
    # a leaf's parents stay mappings whatever is done to another leaf.
    leaves = _leaf_paths(d)
    for _ in range(data.draw(st.integers(1, 2))):
        path = data.draw(st.sampled_from(leaves))
        if data.draw(st.booleans()):
            _set_path(d, path, data.draw(_json_hostile))
        else:
            *parents, last = path.split(".")
            node = d
            for p in parents:
                node = node[p]
            node.pop(last, None)
    wire = json.dumps(d).encode()
    from_bytes: Any
    from_dict: Any
    try:
        from_bytes = ("ok", decode(kind, wire))
    except ValidationError as exc:
        from_bytes = ("error", exc.field, exc.reason)
    try:
        from_dict = ("ok", TYPES[kind].from_dict(json.loads(wire)))
    except ValidationError as exc:
        from_dict = ("error", exc.field, exc.reason)
    assert from_bytes == from_dict


def test_constructors_refuse_unknown_arguments_and_default_the_version() -> None:
    with pytest.raises(TypeError):
        Cost(cpu_ms=1.0, accelerator_ms=2.0, gpu_ms=3.0)  # type: ignore[call-arg]
    cost = Cost(cpu_ms=1, accelerator_ms=2)
    assert (cost.cpu_ms, type(cost.cpu_ms)) == (1.0, float)
    req = Request(ts=1.0, id="q", region="r", segment="s", value=1.0, eligible=True, user=1)
    assert req.v == 1
    assert orjson.loads(encode(req))["v"] == 1
    with pytest.raises(ValidationError) as info:
        Request(ts=1.0, id="q", region="r", segment="s", value=1.0, eligible=True, user=1, v=2)
    assert info.value.field == "v"


def test_a_message_without_its_version_is_refused_even_when_complete() -> None:
    d = _example("requests")
    del d["v"]
    with pytest.raises(ValidationError) as info:
        decode("requests", orjson.dumps(d))
    assert (info.value.field, info.value.reason) == ("v", "missing")
    d = _example("requests") | {"ts": "soon", "v": 2}  # a bad field before the version
    data = orjson.dumps({"ts": "soon", **{k: v for k, v in d.items() if k != "ts"}})
    with pytest.raises(ValidationError) as info:
        decode("requests", data)
    assert info.value.field == "v"


def test_unknown_kind_is_a_validation_error() -> None:
    with pytest.raises(ValidationError) as info:
        decode("headroom.capacity", b"{}")
    assert info.value.field == "kind"


def test_decode_accepts_bytearray_and_memoryview() -> None:
    data = orjson.dumps(EXAMPLES["requests"])
    assert decode("requests", bytearray(data)) == decode("requests", memoryview(data))


# -- construction in code ------------------------------------------------------------------------


def test_constructor_validates_like_the_decoder() -> None:
    with pytest.raises(ValidationError) as info:
        Request(ts=1.0, id="q", region="r", segment="s", value=float("nan"), eligible=True, user=1)
    assert info.value.field == "value"
    with pytest.raises(ValidationError) as info:
        RmaTarget(candidates=1, base=10, max=5)
    assert info.value.field == "base"


def test_numpy_scalars_and_arrays_are_accepted_and_normalised() -> None:
    msg = Latency(
        ts=np.float64(5.0),
        region="r",
        replica="x",
        pool="dedicated",
        path="base",
        window_s=1,
        count=np.int64(3),  # type: ignore[arg-type]
        samples_ms=np.array([1.0, 2.0, 3.0]),  # type: ignore[arg-type]
        inflight=0,
        queue_ms=0,
    )
    assert msg.samples_ms == (1.0, 2.0, 3.0)
    assert type(msg.count) is int
    assert decode("latency", encode(msg)) == msg
    with pytest.raises(ValidationError) as info:
        Latency(
            ts=1.0,
            region="r",
            replica="x",
            pool="dedicated",
            path="base",
            window_s=1.0,
            count=1,
            samples_ms=np.array([1.0, np.nan]),  # type: ignore[arg-type]
            inflight=0,
            queue_ms=0.0,
        )
    assert info.value.field == "samples_ms[1]"


def test_target_and_precompute_expiry_use_the_time_given() -> None:
    target = Target.from_dict(EXAMPLES["targets"])
    assert not target.expired(1796000060.0 + 180.0)
    assert target.expired(1796000060.0 + 180.5)
    pre = Precompute.from_dict(EXAMPLES["precompute"])
    assert not pre.expired(1796001900.0)
    assert pre.expired(1796001900.001)


def test_record_keys_follow_the_contract() -> None:
    assert Capacity.from_dict(EXAMPLES["capacity"]).key() == b"us-east"
    assert Precompute.from_dict(EXAMPLES["precompute"]).key() == b"us-east/918273"


# -- dead letters --------------------------------------------------------------------------------


def test_dead_letter_keeps_the_original_bytes_and_key() -> None:
    original = b"\x00\xffnot json at all"
    dl = DeadLetter.for_payload(
        ts=5.0,
        topic="headroom.latency",
        partition=0,
        offset=9,
        error="$: bad",
        payload=original,
        key=b"us-east",
    )
    back = decode("deadletter", encode(dl))
    assert isinstance(back, DeadLetter)
    assert back.payload() == original
    assert back.key() == b"us-east"
    assert not back.truncated


def test_dead_letter_of_an_oversized_message_is_truncated_and_still_fits() -> None:
    original = b"x" * (MAX_MESSAGE_BYTES + 10)
    dl = DeadLetter.for_payload(
        ts=5.0, topic="t", partition=None, offset=None, error="e" * 100_000, payload=original
    )
    data = encode(dl)
    assert len(data) <= MAX_MESSAGE_BYTES
    back = decode("deadletter", data)
    assert isinstance(back, DeadLetter)
    assert back.truncated
    assert back.payload() == original[:MAX_DEADLETTER_PAYLOAD_BYTES]


# -- the error type and the codec ----------------------------------------------------------------


def test_validation_error_shape() -> None:
    err = ValidationError("candidates", "must be >= 0")
    assert isinstance(err, ValueError)
    assert str(err) == "candidates: must be >= 0"
    assert err.prefixed("rma").field == "rma.candidates"
    assert ValidationError("[3]", "bad").prefixed("samples_ms").field == "samples_ms[3]"
    again = pickle.loads(pickle.dumps(err))
    assert (again.field, again.reason) == (err.field, err.reason)


def test_codec_limits_and_errors() -> None:
    assert codec.loads(codec.dumps({"a": [1, 2.5]})) == {"a": [1, 2.5]}
    with pytest.raises(ValidationError):
        codec.dumps({"a": object()})
    with pytest.raises(ValidationError):
        codec.dumps(2**70)
    with pytest.raises(ValidationError):
        codec.loads(b"[1]", max_bytes=2)
    assert codec.loads(b"[" + b"1," * 600_000 + b"1]", max_bytes=None)[-1] == 1
    with pytest.raises(ValidationError):
        codec.loads(b"[" * 5000)  # nesting beyond orjson's limit


def test_target_precompute_rate_extension_round_trips_and_is_optional() -> None:
    base = {
        "v": 1,
        "ts": 10.0,
        "region": "us-east",
        "epoch": 3,
        "ttl_s": 180.0,
        "rma": {"candidates": 500, "base": 400, "max": 1200},
        "sbm": {"coverage": 0.1, "segments": {"casual": 0.2}},
        "budget": {"cpu": 1.0, "accelerator": 0.5},
        "reason": "pid",
    }
    plain = msgmod.decode("targets", orjson.dumps(base))
    assert isinstance(plain, msgmod.Target)
    assert plain.precompute_jobs_per_s is None
    assert "precompute" not in plain.to_dict()
    extended = msgmod.decode("targets", orjson.dumps({**base, "precompute": {"jobs_per_s": 12.5}}))
    assert isinstance(extended, msgmod.Target)
    assert extended.precompute_jobs_per_s == 12.5
    assert msgmod.decode("targets", msgmod.encode(extended)) == extended
    with pytest.raises(msgmod.ValidationError) as err:
        msgmod.decode("targets", orjson.dumps({**base, "precompute": {"jobs_per_s": -1}}))
    assert "jobs_per_s" in str(err.value)
