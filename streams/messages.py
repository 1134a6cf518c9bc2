"""The message contract of docs/messages.md: one frozen, self-validating type per topic.

Rules (h11's events are the model: a message validates itself when built, so an invalid one
cannot exist in memory):

* Every type is a frozen, slotted, keyword-only dataclass; ``__post_init__`` checks every field
  and normalises it (an ``int`` given for a float field becomes a ``float``, a list becomes a
  tuple, a mapping becomes a read-only ``MappingProxyType``), raising :class:`ValidationError`
  whose ``field`` is the path of the offending field (``rma.candidates``, ``samples_ms[3]``).
* Types: a ``bool`` is never a number; integer fields take only integers (``1.0`` is refused);
  numbers are finite; integers fit in a signed 64-bit word (what orjson writes).
* Ranges: ``v == 1`` (another version is refused, so an old consumer never misreads a newer
  producer); ``ts >= 0``; counts are non-negative integers; durations (``ttl_s``, ``window_s``,
  ``expires_in_s``, ``duration_s``) are positive; shares and probabilities lie in [0, 1]; names
  (``region``, segments, hardware, models) are 1–64 characters of ``[A-Za-z0-9_.-]``; other
  strings (ids, replicas, reasons) 1–256 characters; lists and maps hold at most 100,000 items;
  an encoded message is at most 1 MiB (:mod:`headroom.kernel.codec`).
* Enumerated fields take exactly the contract's values (the ``*_VALUES`` tuples below).
* ``from_dict`` ignores unknown fields (docs/messages.md: producers may extend messages), except
  :class:`Event`, which keeps every non-common field in ``extra`` so nothing is lost on a
  round trip. ``to_dict`` writes the contract form; ``decode``/``encode`` add the codec.

``decode(kind, data)`` never raises anything but :class:`ValidationError`, whatever the bytes:
consumers dead-letter with ``str(err)`` and go on.

Latency messages, the bulk of the traffic, decode through a fast path (:func:`_latency_fast`,
and the sketch's own in :mod:`headroom.kernel.sketch`): the same rules checked inline on plain
types, giving up at the first oddity so the checked path above names the fault. ``encode`` writes
their sketch bins from integer keys. See docs/messages.md, "Decoding fast".
"""

from __future__ import annotations

import base64
import binascii
import math
import numbers
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, ClassVar, Final, Literal, TypeAlias, get_args, overload

import numpy as np

from headroom.kernel.codec import (
    MAX_LIST_ITEMS,
    MAX_MESSAGE_BYTES,
    ROOT,
    ValidationError,
    dumps,
    loads,
)
from headroom.kernel.sketch import LatencySketch

__all__ = [
    "ARM_VALUES",
    "CAPACITY_REASON_VALUES",
    "LEVER_VALUES",
    "MAX_DEADLETTER_PAYLOAD_BYTES",
    "MAX_LIST_ITEMS",
    "MAX_MESSAGE_BYTES",
    "MAX_STRATUM",
    "PATH_VALUES",
    "POOL_VALUES",
    "RESOURCE_VALUES",
    "SCHEMA_VERSION",
    "SOURCE_VALUES",
    "TOPIC_KINDS",
    "TYPES",
    "Arm",
    "Budget",
    "Capacity",
    "CapacityReason",
    "Cost",
    "DeadLetter",
    "Event",
    "Latency",
    "LatencySketch",
    "Lever",
    "Message",
    "Path",
    "Pool",
    "Precompute",
    "Request",
    "Resource",
    "RmaTarget",
    "SbmTarget",
    "Source",
    "Target",
    "ValidationError",
    "ValueSignal",
    "decode",
    "encode",
]

SCHEMA_VERSION: Final = 1
MAX_STRATUM: Final = 63  # ValueSignal.stratum lies in [0, MAX_STRATUM] (value bins of a segment)

Resource: TypeAlias = Literal["cpu", "accelerator"]
Pool: TypeAlias = Literal["opportunistic", "dedicated"]
CapacityReason: TypeAlias = Literal["grant", "reclaim", "preempt", "update"]
Path: TypeAlias = Literal["base", "rma", "sbm"]
Lever: TypeAlias = Literal["rma", "sbm", "precompute"]
Arm: TypeAlias = Literal["treatment", "control"]
# docs/messages.md names server, client, controller, feed; docs/events.md adds sim and precompute.
Source: TypeAlias = Literal["sim", "server", "client", "controller", "feed", "precompute"]

RESOURCE_VALUES: Final[tuple[str, ...]] = get_args(Resource)
POOL_VALUES: Final[tuple[str, ...]] = get_args(Pool)
CAPACITY_REASON_VALUES: Final[tuple[str, ...]] = get_args(CapacityReason)
PATH_VALUES: Final[tuple[str, ...]] = get_args(Path)
LEVER_VALUES: Final[tuple[str, ...]] = get_args(Lever)
ARM_VALUES: Final[tuple[str, ...]] = get_args(Arm)
SOURCE_VALUES: Final[tuple[str, ...]] = get_args(Source)

_INT64_MAX: Final = (1 << 63) - 1
_NAME = re.compile(r"[A-Za-z0-9_.-]{1,64}\Z")
_MAX_TEXT: Final = 256  # ids, replica names, reasons, event kinds
_MAX_ERROR_TEXT: Final = 64 * 1024  # a dead letter's error message
_MAX_TOPIC: Final = 249  # Kafka's own limit on topic names
_MAX_DEPTH: Final = 32  # nesting of an event's free-form fields
# A dead letter carries the original bytes in base64 (4/3 larger) and must itself fit in 1 MiB:
# 700,000 raw bytes make 933,336 characters, leaving room for the error text and the envelope.
MAX_DEADLETTER_PAYLOAD_BYTES: Final = 700_000

_set = object.__setattr__  # normalising fields of frozen dataclasses in __post_init__
_new = object.__new__  # building a message whose fields a fast path has checked
_FLOAT_MAX: Final = 1.7976931348623157e308  # sys.float_info.max: x <= it is False for inf, NaN


# -- field checks: each returns the normalised value or raises ValidationError(field, reason) ---


def _type_name(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "bool"
    return type(value).__name__


def _float(value: object, name: str) -> float:
    t = type(value)
    if t is float:
        f: float = value  # type: ignore[assignment]
    elif t is int:
        try:
            f = float(value)  # type: ignore[arg-type]
        except OverflowError:
            raise ValidationError(name, "must be a finite number, got a huge integer") from None
    elif isinstance(value, numbers.Real) and not isinstance(value, bool | np.bool_):
        f = float(value)
    else:
        raise ValidationError(name, f"must be a number, got {_type_name(value)}")
    if not math.isfinite(f):
        raise ValidationError(name, f"must be a finite number, got {f}")
    return f


def _opt_float(value: object, name: str) -> float | None:
    return None if value is None else _float(value, name)


def _int(value: object, name: str, lo: int = 0, hi: int = _INT64_MAX) -> int:
    if type(value) is int:
        i: int = value
    elif isinstance(value, numbers.Integral) and not isinstance(value, bool | np.bool_):
        i = int(value)
    else:
        raise ValidationError(name, f"must be an integer, got {_type_name(value)}")
    if not lo <= i <= hi:
        if lo == 0 and i < 0:
            raise ValidationError(name, f"must be a non-negative integer, got {i}")
        raise ValidationError(name, f"must lie between {lo} and {hi}, got {i}")
    return i


def _opt_int(value: object, name: str) -> int | None:
    return None if value is None else _int(value, name)


def _ts(value: object, name: str = "ts") -> float:
    f = _float(value, name)
    if f < 0.0:
        raise ValidationError(name, f"must be >= 0 (seconds since the Unix epoch), got {f}")
    return f


def _nonneg(value: object, name: str) -> float:
    f = _float(value, name)
    if f < 0.0:
        raise ValidationError(name, f"must be >= 0, got {f}")
    return f


def _positive(value: object, name: str) -> float:
    f = _float(value, name)
    if f <= 0.0:
        raise ValidationError(name, f"must be > 0, got {f}")
    return f


def _share(value: object, name: str) -> float:
    f = _float(value, name)
    if not 0.0 <= f <= 1.0:
        raise ValidationError(name, f"must lie in [0, 1], got {f}")
    return f


def _bool(value: object, name: str) -> bool:
    if type(value) is bool:
        return value
    if isinstance(value, np.bool_):
        return bool(value)
    raise ValidationError(name, f"must be true or false, got {_type_name(value)}")


def _name(value: object, name: str) -> str:
    if type(value) is not str:
        raise ValidationError(name, f"must be a string, got {_type_name(value)}")
    if _NAME.match(value) is None:
        raise ValidationError(
            name, f"must be 1-64 characters of [A-Za-z0-9_.-], got {_clip(value)!r}"
        )
    return value


def _text(value: object, name: str, limit: int = _MAX_TEXT) -> str:
    if type(value) is not str:
        raise ValidationError(name, f"must be a string, got {_type_name(value)}")
    n = len(value)
    if not 1 <= n <= limit:
        raise ValidationError(name, f"must be 1-{limit} characters long, got {n}")
    return value


def _enum(value: object, name: str, allowed: tuple[str, ...]) -> Any:
    if type(value) is str and value in allowed:
        return value
    got = repr(_clip(value)) if isinstance(value, str) else _type_name(value)
    raise ValidationError(name, f"must be one of {', '.join(allowed)}; got {got}")


def _version(value: object) -> int:
    if type(value) is not int or isinstance(value, bool):
        raise ValidationError("v", f"must be the integer {SCHEMA_VERSION}, got {_type_name(value)}")
    if value != SCHEMA_VERSION:
        raise ValidationError(
            "v", f"unsupported schema version {value} (this build reads version {SCHEMA_VERSION})"
        )
    return SCHEMA_VERSION


def _clip(value: object, n: int = 40) -> object:
    if isinstance(value, str) and len(value) > n:
        return value[:n] + "…"
    return value


def _check_len(size: int, name: str) -> None:
    if size > MAX_LIST_ITEMS:
        raise ValidationError(name, f"has {size:,} items, over the limit of {MAX_LIST_ITEMS:,}")


def _json_value(value: object, name: str, depth: int = 0) -> Any:
    """Check a free-form value (an event's extra fields): JSON types only, finite numbers,
    bounded sizes and depth. Returns the value with tuples turned into lists."""
    t = type(value)
    if value is None or t is str or t is bool:
        return value
    if t is int:
        if not -_INT64_MAX - 1 <= value <= _INT64_MAX:  # type: ignore[operator]
            raise ValidationError(name, "integer does not fit in 64 bits")
        return value
    if t is float:
        if not math.isfinite(value):  # type: ignore[arg-type]
            raise ValidationError(name, f"must be a finite number, got {value}")
        return value
    if depth >= _MAX_DEPTH:
        raise ValidationError(name, f"nested deeper than {_MAX_DEPTH} levels")
    if isinstance(value, Mapping):
        _check_len(len(value), name)
        out: dict[str, Any] = {}
        for k, v in value.items():
            if type(k) is not str:
                raise ValidationError(name, f"object keys must be strings, got {_type_name(k)}")
            out[k] = _json_value(v, f"{name}.{k}", depth + 1)
        return out
    if isinstance(value, list | tuple):
        _check_len(len(value), name)
        return [_json_value(v, f"{name}[{i}]", depth + 1) for i, v in enumerate(value)]
    if isinstance(value, np.floating):
        return _json_value(float(value), name, depth)
    if isinstance(value, np.integer):
        return _json_value(int(value), name, depth)
    raise ValidationError(name, f"must be a JSON value, got {_type_name(value)}")


def _object(data: object, name: str = ROOT) -> Mapping[str, Any]:
    if not isinstance(data, Mapping):
        raise ValidationError(name, f"must be a JSON object, got {_type_name(data)}")
    return data


def _envelope(data: object) -> Mapping[str, Any]:
    """A top-level message: an object whose schema version is checked first, so a message of
    another version is reported as such rather than as a missing field."""
    d = _object(data)
    _version(_req(d, "v"))
    return d


def _req(d: Mapping[str, Any], key: str) -> Any:
    try:
        return d[key]
    except KeyError:
        raise ValidationError(key, "missing") from None


def _nested(cls: Any, d: Mapping[str, Any], key: str) -> Any:
    """``cls.from_dict(d[key])`` with errors reported under ``key``."""
    value = _req(d, key)
    try:
        return cls.from_dict(value)
    except ValidationError as exc:
        raise exc.prefixed(key) from None


def _mapping_of_shares(value: object, name: str) -> Mapping[str, float]:
    if not isinstance(value, Mapping):
        raise ValidationError(name, f"must be an object, got {_type_name(value)}")
    _check_len(len(value), name)
    out = {}
    for k, v in value.items():
        out[_name(k, f"{name}.{k}")] = _share(v, f"{name}.{k}")
    return MappingProxyType(out)


def _ints(value: object, name: str) -> tuple[int, ...]:
    if isinstance(value, np.ndarray):
        if value.dtype.kind not in "iu":
            raise ValidationError(name, f"must be a list of integers, got dtype {value.dtype}")
        value = value.tolist()
    if not isinstance(value, list | tuple):
        raise ValidationError(name, f"must be a list, got {_type_name(value)}")
    _check_len(len(value), name)
    for i, x in enumerate(value):
        if type(x) is not int or not 0 <= x <= _INT64_MAX:
            _int(x, f"{name}[{i}]")  # raises with the precise reason, or accepts numpy ints
    return tuple(int(x) for x in value)


def _samples(value: object, name: str) -> tuple[float, ...]:
    if isinstance(value, np.ndarray):
        _check_len(value.size, name)
        if value.dtype.kind not in "iuf":
            raise ValidationError(name, f"must be a list of numbers, got dtype {value.dtype}")
        arr = value.astype(np.float64).ravel()
        bad = np.flatnonzero(~(np.isfinite(arr) & (arr >= 0.0)))
        if bad.size:
            i = int(bad[0])
            raise ValidationError(f"{name}[{i}]", f"must be a finite number >= 0, got {arr[i]}")
        return tuple(arr.tolist())
    if not isinstance(value, list | tuple):
        raise ValidationError(name, f"must be a list, got {_type_name(value)}")
    _check_len(len(value), name)
    for x in value:  # fast path: plain finite non-negative floats
        if type(x) is not float or not 0.0 <= x <= 1.7976931348623157e308:
            break
    else:
        return tuple(value)
    return tuple(_nonneg(x, f"{name}[{i}]") for i, x in enumerate(value))


# -- nested value types --------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class RmaTarget:
    """``targets.rma``: candidates to rank now, the baseline count, and the upper bound.

    Only ``base <= max`` is checked here; clamping ``candidates`` into ``[base, max]`` is the
    controller's job (docs/messages.md: "controllers clamp every output").
    """

    candidates: int
    base: int
    max: int

    def __post_init__(self) -> None:
        _set(self, "candidates", _int(self.candidates, "candidates"))
        _set(self, "base", _int(self.base, "base"))
        _set(self, "max", _int(self.max, "max"))
        if self.base > self.max:
            raise ValidationError("base", f"must be <= max ({self.max}), got {self.base}")

    def to_dict(self) -> dict[str, Any]:
        return {"candidates": self.candidates, "base": self.base, "max": self.max}

    @classmethod
    def from_dict(cls, d: object) -> RmaTarget:
        d = _object(d)
        return cls(candidates=_req(d, "candidates"), base=_req(d, "base"), max=_req(d, "max"))


@dataclass(frozen=True, slots=True, kw_only=True)
class SbmTarget:
    """``targets.sbm``: the intended overall share routed to the strong model, and the routing
    probability per segment for eligible requests."""

    coverage: float
    segments: Mapping[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        _set(self, "coverage", _share(self.coverage, "coverage"))
        _set(self, "segments", _mapping_of_shares(self.segments, "segments"))

    def to_dict(self) -> dict[str, Any]:
        return {"coverage": self.coverage, "segments": dict(self.segments)}

    @classmethod
    def from_dict(cls, d: object) -> SbmTarget:
        d = _object(d)
        return cls(coverage=_req(d, "coverage"), segments=_req(d, "segments"))


@dataclass(frozen=True, slots=True, kw_only=True)
class Budget:
    """``targets.budget``: opportunistic units granted to optional work (cores, devices)."""

    cpu: float
    accelerator: float

    def __post_init__(self) -> None:
        _set(self, "cpu", _nonneg(self.cpu, "cpu"))
        _set(self, "accelerator", _nonneg(self.accelerator, "accelerator"))

    def to_dict(self) -> dict[str, Any]:
        return {"cpu": self.cpu, "accelerator": self.accelerator}

    @classmethod
    def from_dict(cls, d: object) -> Budget:
        d = _object(d)
        return cls(cpu=_req(d, "cpu"), accelerator=_req(d, "accelerator"))


@dataclass(frozen=True, slots=True, kw_only=True)
class Cost:
    """Compute spent, in milliseconds of CPU and of accelerator time."""

    cpu_ms: float
    accelerator_ms: float

    def __post_init__(self) -> None:
        _set(self, "cpu_ms", _nonneg(self.cpu_ms, "cpu_ms"))
        _set(self, "accelerator_ms", _nonneg(self.accelerator_ms, "accelerator_ms"))

    def to_dict(self) -> dict[str, Any]:
        return {"cpu_ms": self.cpu_ms, "accelerator_ms": self.accelerator_ms}

    @classmethod
    def from_dict(cls, d: object) -> Cost:
        d = _object(d)
        return cls(cpu_ms=_req(d, "cpu_ms"), accelerator_ms=_req(d, "accelerator_ms"))


# -- topic messages ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class Capacity:
    """``headroom.capacity``: the absolute level of one (region, resource, hardware, pool) now.

    A level, not a delta: a lost or repeated message cannot corrupt state; the newest ``ts``
    wins. ``expires_in_s`` is the expected lifetime (``None``: unknown). ``remote`` (extension,
    written only when true) marks capacity that only asynchronous work (precompute) may use.
    """

    KIND: ClassVar[str] = "capacity"

    ts: float
    region: str
    resource: Resource
    hardware: str
    pool: Pool
    units: float
    reason: CapacityReason
    id: str
    expires_in_s: float | None = None
    remote: bool = False
    v: int = SCHEMA_VERSION

    def __post_init__(self) -> None:
        _set(self, "v", _version(self.v))
        _set(self, "ts", _ts(self.ts))
        _name(self.region, "region")
        _set(self, "resource", _enum(self.resource, "resource", RESOURCE_VALUES))
        _name(self.hardware, "hardware")
        _set(self, "pool", _enum(self.pool, "pool", POOL_VALUES))
        _set(self, "units", _nonneg(self.units, "units"))
        if self.expires_in_s is not None:
            _set(self, "expires_in_s", _positive(self.expires_in_s, "expires_in_s"))
        _set(self, "reason", _enum(self.reason, "reason", CAPACITY_REASON_VALUES))
        _text(self.id, "id")
        _set(self, "remote", _bool(self.remote, "remote"))

    def key(self) -> bytes:
        return self.region.encode()

    def to_dict(self) -> dict[str, Any]:
        d = {
            "v": self.v,
            "ts": self.ts,
            "region": self.region,
            "resource": self.resource,
            "hardware": self.hardware,
            "pool": self.pool,
            "units": self.units,
            "expires_in_s": self.expires_in_s,
            "reason": self.reason,
            "id": self.id,
        }
        if self.remote:
            d["remote"] = True
        return d

    @classmethod
    def from_dict(cls, d: object) -> Capacity:
        d = _envelope(d)
        return cls(
            v=_req(d, "v"),
            ts=_req(d, "ts"),
            region=_req(d, "region"),
            resource=_req(d, "resource"),
            hardware=_req(d, "hardware"),
            pool=_req(d, "pool"),
            units=_req(d, "units"),
            expires_in_s=d.get("expires_in_s"),
            reason=_req(d, "reason"),
            id=_req(d, "id"),
            remote=d.get("remote", False),
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class Latency:
    """``headroom.latency``: one replica's latency over one window, as raw samples, a sketch or
    both (at least one). ``count`` is the number of requests in the window (samples may be a
    subset). Treat ``sketch`` as read-only: the message does not copy it."""

    KIND: ClassVar[str] = "latency"

    ts: float
    region: str
    replica: str
    pool: Pool
    path: Path
    window_s: float
    count: int
    inflight: int
    queue_ms: float
    samples_ms: tuple[float, ...] | None = None
    sketch: LatencySketch | None = None
    v: int = SCHEMA_VERSION

    def __post_init__(self) -> None:
        _set(self, "v", _version(self.v))
        _set(self, "ts", _ts(self.ts))
        _name(self.region, "region")
        _text(self.replica, "replica")
        _set(self, "pool", _enum(self.pool, "pool", POOL_VALUES))
        _set(self, "path", _enum(self.path, "path", PATH_VALUES))
        _set(self, "window_s", _positive(self.window_s, "window_s"))
        _set(self, "count", _int(self.count, "count"))
        if self.samples_ms is not None:
            _set(self, "samples_ms", _samples(self.samples_ms, "samples_ms"))
        if self.sketch is not None and not isinstance(self.sketch, LatencySketch):
            raise ValidationError(
                "sketch", f"must be a LatencySketch, got {_type_name(self.sketch)}"
            )
        if self.samples_ms is None and self.sketch is None:
            raise ValidationError(
                "samples_ms", "missing: a latency message needs samples_ms or sketch"
            )
        _set(self, "inflight", _int(self.inflight, "inflight"))
        _set(self, "queue_ms", _nonneg(self.queue_ms, "queue_ms"))

    def key(self) -> bytes:
        return self.region.encode()

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {
            "v": self.v,
            "ts": self.ts,
            "region": self.region,
            "replica": self.replica,
            "pool": self.pool,
            "path": self.path,
            "window_s": self.window_s,
            "count": self.count,
        }
        if self.samples_ms is not None:
            d["samples_ms"] = list(self.samples_ms)
        if self.sketch is not None:
            d["sketch"] = self.sketch.to_dict()
        d["inflight"] = self.inflight
        d["queue_ms"] = self.queue_ms
        return d

    def _wire_dict(self) -> dict[str, Any]:
        """:meth:`to_dict` for :func:`encode`: the same, except that the sketch's bins keep
        their integer keys (``dumps(..., int_keys=True)`` writes the same bytes)."""
        d: dict[str, Any] = {
            "v": self.v,
            "ts": self.ts,
            "region": self.region,
            "replica": self.replica,
            "pool": self.pool,
            "path": self.path,
            "window_s": self.window_s,
            "count": self.count,
        }
        if self.samples_ms is not None:
            d["samples_ms"] = self.samples_ms  # a tuple: orjson writes it as a list
        if self.sketch is not None:
            d["sketch"] = self.sketch._wire_dict()
        d["inflight"] = self.inflight
        d["queue_ms"] = self.queue_ms
        return d

    @classmethod
    def from_dict(cls, d: object) -> Latency:
        if type(d) is dict and type(d.get("v")) is int and d["v"] == SCHEMA_VERSION:
            raw_sketch = d.get("sketch")
            sketch = None if raw_sketch is None else LatencySketch.from_dict(raw_sketch, "sketch")
            fast = _latency_fast(cls, d, sketch)
            if fast is not None:
                return fast
        else:
            d = _envelope(d)
            raw_sketch = d.get("sketch")
            sketch = None if raw_sketch is None else LatencySketch.from_dict(raw_sketch, "sketch")
        return cls(
            v=_req(d, "v"),
            ts=_req(d, "ts"),
            region=_req(d, "region"),
            replica=_req(d, "replica"),
            pool=_req(d, "pool"),
            path=_req(d, "path"),
            window_s=_req(d, "window_s"),
            count=_req(d, "count"),
            samples_ms=d.get("samples_ms"),
            sketch=sketch,
            inflight=_req(d, "inflight"),
            queue_ms=_req(d, "queue_ms"),
        )


def _latency_fast(
    cls: type[Latency], d: dict[str, Any], sketch: LatencySketch | None
) -> Latency | None:
    """:meth:`Latency.from_dict` for the common case (version and sketch already checked):
    every field of its plain type and in range, checked inline rather than through a helper
    per field. Returns ``None`` as soon as anything is unusual (a missing field, an integer for
    a float, a bad value), and the caller takes the field-by-field path that names the fault.
    It accepts only what ``__post_init__`` accepts, with the same values, and builds the
    message without running it again (tests/unit/test_messages.py compares the two paths)."""
    ts = d.get("ts")
    region = d.get("region")
    replica = d.get("replica")
    pool = d.get("pool")
    path = d.get("path")
    window_s = d.get("window_s")
    count = d.get("count")
    inflight = d.get("inflight")
    queue_ms = d.get("queue_ms")
    samples = d.get("samples_ms")
    if not (
        type(ts) is float
        and 0.0 <= ts <= _FLOAT_MAX
        and type(region) is str
        and _NAME.match(region) is not None
        and type(replica) is str
        and 1 <= len(replica) <= _MAX_TEXT
        and type(pool) is str
        and pool in POOL_VALUES
        and type(path) is str
        and path in PATH_VALUES
        and type(window_s) is float
        and 0.0 < window_s <= _FLOAT_MAX
        and type(count) is int
        and 0 <= count <= _INT64_MAX
        and type(inflight) is int
        and 0 <= inflight <= _INT64_MAX
        and type(queue_ms) is float
        and 0.0 <= queue_ms <= _FLOAT_MAX
    ):
        return None
    if samples is not None:
        if type(samples) is not list or len(samples) > MAX_LIST_ITEMS:
            return None
        for x in samples:
            if type(x) is not float or not 0.0 <= x <= _FLOAT_MAX:
                return None
        samples = tuple(samples)
    elif sketch is None:
        return None
    msg = _new(cls)
    _set(msg, "ts", ts)
    _set(msg, "region", region)
    _set(msg, "replica", replica)
    _set(msg, "pool", pool)
    _set(msg, "path", path)
    _set(msg, "window_s", window_s)
    _set(msg, "count", count)
    _set(msg, "inflight", inflight)
    _set(msg, "queue_ms", queue_ms)
    _set(msg, "samples_ms", samples)
    _set(msg, "sketch", sketch)
    _set(msg, "v", SCHEMA_VERSION)
    return msg


@dataclass(frozen=True, slots=True, kw_only=True)
class Request:
    """``headroom.requests``: one request. ``value`` is its value signal (non-negative),
    ``eligible`` whether it may go to the strong model, ``user`` the user's integer seed."""

    KIND: ClassVar[str] = "requests"

    ts: float
    id: str
    region: str
    segment: str
    value: float
    eligible: bool
    user: int
    v: int = SCHEMA_VERSION

    def __post_init__(self) -> None:
        _set(self, "v", _version(self.v))
        _set(self, "ts", _ts(self.ts))
        _text(self.id, "id")
        _name(self.region, "region")
        _name(self.segment, "segment")
        _set(self, "value", _nonneg(self.value, "value"))
        _set(self, "eligible", _bool(self.eligible, "eligible"))
        _set(self, "user", _int(self.user, "user"))

    def key(self) -> bytes:
        return self.region.encode()

    def to_dict(self) -> dict[str, Any]:
        return {
            "v": self.v,
            "ts": self.ts,
            "id": self.id,
            "region": self.region,
            "segment": self.segment,
            "value": self.value,
            "eligible": self.eligible,
            "user": self.user,
        }

    @classmethod
    def from_dict(cls, d: object) -> Request:
        d = _envelope(d)
        return cls(
            v=_req(d, "v"),
            ts=_req(d, "ts"),
            id=_req(d, "id"),
            region=_req(d, "region"),
            segment=_req(d, "segment"),
            value=_req(d, "value"),
            eligible=_req(d, "eligible"),
            user=_req(d, "user"),
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class Target:
    """``headroom.targets``: what a region's clients and servers should do until ``ts + ttl_s``.

    Clients apply the highest ``epoch`` of their region; a target older than ``ttl_s`` is
    expired and the client falls back to the baseline (:meth:`expired`).
    """

    KIND: ClassVar[str] = "targets"

    ts: float
    region: str
    epoch: int
    ttl_s: float
    rma: RmaTarget
    sbm: SbmTarget
    budget: Budget
    reason: str
    # Extension (written only when set): the precompute workers' job rate, as
    # ``"precompute": {"jobs_per_s": X}`` on the wire.
    precompute_jobs_per_s: float | None = None
    v: int = SCHEMA_VERSION

    def __post_init__(self) -> None:
        _set(self, "v", _version(self.v))
        _set(self, "ts", _ts(self.ts))
        _name(self.region, "region")
        _set(self, "epoch", _int(self.epoch, "epoch"))
        if self.precompute_jobs_per_s is not None:
            rate = _nonneg(self.precompute_jobs_per_s, "precompute.jobs_per_s")
            _set(self, "precompute_jobs_per_s", rate)
        _set(self, "ttl_s", _positive(self.ttl_s, "ttl_s"))
        for key, cls in (("rma", RmaTarget), ("sbm", SbmTarget), ("budget", Budget)):
            value = getattr(self, key)
            if not isinstance(value, cls):
                raise ValidationError(key, f"must be a {cls.__name__}, got {_type_name(value)}")
        _text(self.reason, "reason")

    def expired(self, now: float) -> bool:
        """True once ``now`` (event time, seconds) is past ``ts + ttl_s``."""
        return now > self.ts + self.ttl_s

    def key(self) -> bytes:
        return self.region.encode()

    def to_dict(self) -> dict[str, Any]:
        return {
            "v": self.v,
            "ts": self.ts,
            "region": self.region,
            "epoch": self.epoch,
            "ttl_s": self.ttl_s,
            "rma": self.rma.to_dict(),
            "sbm": self.sbm.to_dict(),
            "budget": self.budget.to_dict(),
            "reason": self.reason,
            **(
                {}
                if self.precompute_jobs_per_s is None
                else {"precompute": {"jobs_per_s": self.precompute_jobs_per_s}}
            ),
        }

    @classmethod
    def from_dict(cls, d: object) -> Target:
        d = _envelope(d)
        pre = d.get("precompute")
        rate = None
        if pre is not None:
            rate = _req(_object(pre, "precompute"), "jobs_per_s")
        return cls(
            precompute_jobs_per_s=rate,
            v=_req(d, "v"),
            ts=_req(d, "ts"),
            region=_req(d, "region"),
            epoch=_req(d, "epoch"),
            ttl_s=_req(d, "ttl_s"),
            rma=_nested(RmaTarget, d, "rma"),
            sbm=_nested(SbmTarget, d, "sbm"),
            budget=_nested(Budget, d, "budget"),
            reason=_req(d, "reason"),
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class ValueSignal:
    """``headroom.value``: sums of observed request value for one (region, segment, lever, arm)
    over a window; sums, not means, so windows and workers add up exactly.

    Extension (written only when set): ``stratum``, an integer in ``[0, MAX_STRATUM]`` naming the
    value bin of the segment the sums cover (a request's value rank within its segment, in
    equal-probability bins), so the estimator can post-stratify on the value signal. Absent:
    the sums cover the whole segment, as docs/messages.md defines them.
    """

    KIND: ClassVar[str] = "value"

    ts: float
    region: str
    segment: str
    lever: Lever
    arm: Arm
    n: int
    value_sum: float
    value_sq_sum: float
    window_s: float
    cost: Cost
    stratum: int | None = None
    v: int = SCHEMA_VERSION

    def __post_init__(self) -> None:
        _set(self, "v", _version(self.v))
        _set(self, "ts", _ts(self.ts))
        _name(self.region, "region")
        _name(self.segment, "segment")
        if self.stratum is not None:
            _set(self, "stratum", _int(self.stratum, "stratum", 0, MAX_STRATUM))
        _set(self, "lever", _enum(self.lever, "lever", LEVER_VALUES))
        _set(self, "arm", _enum(self.arm, "arm", ARM_VALUES))
        _set(self, "n", _int(self.n, "n"))
        _set(self, "value_sum", _float(self.value_sum, "value_sum"))
        _set(self, "value_sq_sum", _nonneg(self.value_sq_sum, "value_sq_sum"))
        _set(self, "window_s", _positive(self.window_s, "window_s"))
        if not isinstance(self.cost, Cost):
            raise ValidationError("cost", f"must be a Cost, got {_type_name(self.cost)}")

    def key(self) -> bytes:
        return self.region.encode()

    def to_dict(self) -> dict[str, Any]:
        return {
            "v": self.v,
            "ts": self.ts,
            "region": self.region,
            "segment": self.segment,
            "lever": self.lever,
            "arm": self.arm,
            "n": self.n,
            "value_sum": self.value_sum,
            "value_sq_sum": self.value_sq_sum,
            "window_s": self.window_s,
            "cost": self.cost.to_dict(),
            **({} if self.stratum is None else {"stratum": self.stratum}),
        }

    @classmethod
    def from_dict(cls, d: object) -> ValueSignal:
        d = _envelope(d)
        return cls(
            stratum=d.get("stratum"),
            v=_req(d, "v"),
            ts=_req(d, "ts"),
            region=_req(d, "region"),
            segment=_req(d, "segment"),
            lever=_req(d, "lever"),
            arm=_req(d, "arm"),
            n=_req(d, "n"),
            value_sum=_req(d, "value_sum"),
            value_sq_sum=_req(d, "value_sq_sum"),
            window_s=_req(d, "window_s"),
            cost=_nested(Cost, d, "cost"),
        )


_EVENT_COMMON: Final = frozenset({"v", "ts", "region", "kind", "source"})


@dataclass(frozen=True, slots=True, kw_only=True)
class Event:
    """``headroom.events`` (and one line of the event log, docs/events.md).

    Common fields plus ``kind`` and ``source``; every other field lives in ``extra`` (a
    read-only mapping of JSON values, checked like the rest: finite numbers, bounded sizes) and
    is written back at the top level, so a round trip keeps it. ``region`` is ``None`` for
    run-wide lines.
    """

    KIND: ClassVar[str] = "events"

    ts: float
    kind: str
    source: Source
    region: str | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)
    v: int = SCHEMA_VERSION

    def __post_init__(self) -> None:
        _set(self, "v", _version(self.v))
        _set(self, "ts", _ts(self.ts))
        if self.region is not None:
            _name(self.region, "region")
        _text(self.kind, "kind")
        _set(self, "source", _enum(self.source, "source", SOURCE_VALUES))
        if not isinstance(self.extra, Mapping):
            raise ValidationError("extra", f"must be a mapping, got {_type_name(self.extra)}")
        _check_len(len(self.extra), ROOT)
        clean: dict[str, Any] = {}
        for k, value in self.extra.items():
            if type(k) is not str:
                raise ValidationError("extra", f"keys must be strings, got {_type_name(k)}")
            if k in _EVENT_COMMON:
                raise ValidationError(k, "is a common field; set it directly, not in extra")
            clean[k] = _json_value(value, k)
        _set(self, "extra", MappingProxyType(clean))

    def __getitem__(self, key: str) -> Any:
        """``event["dropped"]`` reads an extra field."""
        return self.extra[key]

    def key(self) -> bytes | None:
        return None if self.region is None else self.region.encode()

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {
            "v": self.v,
            "ts": self.ts,
            "region": self.region,
            "kind": self.kind,
            "source": self.source,
        }
        d.update(self.extra)
        return d

    @classmethod
    def from_dict(cls, d: object) -> Event:
        d = _envelope(d)
        return cls(
            v=_req(d, "v"),
            ts=_req(d, "ts"),
            region=d.get("region"),
            kind=_req(d, "kind"),
            source=_req(d, "source"),
            extra={k: value for k, value in d.items() if k not in _EVENT_COMMON},
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class Precompute:
    """``headroom.precompute``: a user's ranking computed ahead of a visit, keyed ``region/user``.

    ``ranking`` holds ad ids, best first; a result past ``expires_at`` is never served
    (:meth:`expired`). A tombstone (null value) deletes a stored result: ``decode`` returns
    ``None`` for it.
    """

    KIND: ClassVar[str] = "precompute"

    ts: float
    region: str
    user: int
    segment: str
    model: str
    expires_at: float
    ranking: tuple[int, ...]
    cost: Cost
    v: int = SCHEMA_VERSION

    def __post_init__(self) -> None:
        _set(self, "v", _version(self.v))
        _set(self, "ts", _ts(self.ts))
        _name(self.region, "region")
        _set(self, "user", _int(self.user, "user"))
        _name(self.segment, "segment")
        _name(self.model, "model")
        _set(self, "expires_at", _ts(self.expires_at, "expires_at"))
        _set(self, "ranking", _ints(self.ranking, "ranking"))
        if not isinstance(self.cost, Cost):
            raise ValidationError("cost", f"must be a Cost, got {_type_name(self.cost)}")

    def expired(self, now: float) -> bool:
        """True once ``now`` (event time, seconds) is past ``expires_at``: never serve it."""
        return now > self.expires_at

    def key(self) -> bytes:
        return precompute_key(self.region, self.user)

    def to_dict(self) -> dict[str, Any]:
        return {
            "v": self.v,
            "ts": self.ts,
            "region": self.region,
            "user": self.user,
            "segment": self.segment,
            "model": self.model,
            "expires_at": self.expires_at,
            "ranking": list(self.ranking),
            "cost": self.cost.to_dict(),
        }

    @classmethod
    def from_dict(cls, d: object) -> Precompute:
        d = _envelope(d)
        return cls(
            v=_req(d, "v"),
            ts=_req(d, "ts"),
            region=_req(d, "region"),
            user=_req(d, "user"),
            segment=_req(d, "segment"),
            model=_req(d, "model"),
            expires_at=_req(d, "expires_at"),
            ranking=_req(d, "ranking"),
            cost=_nested(Cost, d, "cost"),
        )


def precompute_key(region: str, user: int) -> bytes:
    """The record key of ``headroom.precompute``: ``region/user`` (docs/messages.md)."""
    return f"{region}/{user}".encode()


@dataclass(frozen=True, slots=True, kw_only=True)
class DeadLetter:
    """``headroom.deadletter``: a message that failed validation, with where it came from and
    the original bytes in base64 so nothing is lost.

    ``partition``/``offset`` are ``None`` when the bad message did not come from Kafka (a
    replayed file). Extensions, written only when set: ``key_b64`` (the original record key)
    and ``truncated`` (the payload was cut to ``MAX_DEADLETTER_PAYLOAD_BYTES`` so the dead
    letter itself fits in 1 MiB). Build one with :meth:`for_payload`.
    """

    KIND: ClassVar[str] = "deadletter"

    ts: float
    topic: str
    partition: int | None
    offset: int | None
    error: str
    payload_b64: str
    key_b64: str | None = None
    truncated: bool = False
    v: int = SCHEMA_VERSION

    def __post_init__(self) -> None:
        _set(self, "v", _version(self.v))
        _set(self, "ts", _ts(self.ts))
        _text(self.topic, "topic", _MAX_TOPIC)
        _set(self, "partition", _opt_int(self.partition, "partition"))
        _set(self, "offset", _opt_int(self.offset, "offset"))
        _text(self.error, "error", _MAX_ERROR_TEXT)
        _b64(self.payload_b64, "payload_b64")
        if self.key_b64 is not None:
            _b64(self.key_b64, "key_b64")
        _set(self, "truncated", _bool(self.truncated, "truncated"))

    @classmethod
    def for_payload(
        cls,
        *,
        ts: float,
        topic: str,
        partition: int | None,
        offset: int | None,
        error: str,
        payload: bytes | None,
        key: bytes | None = None,
    ) -> DeadLetter:
        """Wrap original bytes (``None``: a tombstone) and clip the error and the payload so
        the dead letter always fits in a message."""
        raw = payload or b""
        truncated = len(raw) > MAX_DEADLETTER_PAYLOAD_BYTES
        raw = raw[:MAX_DEADLETTER_PAYLOAD_BYTES]
        error = error[:_MAX_ERROR_TEXT] or "invalid message"
        kb = None if key is None else base64.b64encode(key[:4096]).decode("ascii")
        return cls(
            ts=ts,
            topic=topic,
            partition=partition,
            offset=offset,
            error=error,
            payload_b64=base64.b64encode(raw).decode("ascii"),
            key_b64=kb,
            truncated=truncated,
        )

    def payload(self) -> bytes:
        """The original message bytes (possibly truncated: see ``truncated``)."""
        return base64.b64decode(self.payload_b64)

    def key(self) -> bytes | None:
        """The original record key, when known: the dead letter keeps its source's ordering."""
        return None if self.key_b64 is None else base64.b64decode(self.key_b64)

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {
            "v": self.v,
            "ts": self.ts,
            "topic": self.topic,
            "partition": self.partition,
            "offset": self.offset,
            "error": self.error,
            "payload_b64": self.payload_b64,
        }
        if self.key_b64 is not None:
            d["key_b64"] = self.key_b64
        if self.truncated:
            d["truncated"] = True
        return d

    @classmethod
    def from_dict(cls, d: object) -> DeadLetter:
        d = _envelope(d)
        return cls(
            v=_req(d, "v"),
            ts=_req(d, "ts"),
            topic=_req(d, "topic"),
            partition=d.get("partition"),
            offset=d.get("offset"),
            error=_req(d, "error"),
            payload_b64=_req(d, "payload_b64"),
            key_b64=d.get("key_b64"),
            truncated=d.get("truncated", False),
        )


def _b64(value: object, name: str) -> None:
    if type(value) is not str:
        raise ValidationError(name, f"must be a base64 string, got {_type_name(value)}")
    try:
        base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        raise ValidationError(name, "is not valid base64") from None


# -- the registry and the codec entry points ---------------------------------------------------

Message: TypeAlias = (
    Capacity | Latency | Request | Target | ValueSignal | Event | Precompute | DeadLetter
)

# Topic kinds: the topic name without the prefix (docs/messages.md's table order).
TOPIC_KINDS: Final[tuple[str, ...]] = (
    "capacity",
    "latency",
    "requests",
    "targets",
    "value",
    "events",
    "deadletter",
    "precompute",
)
TYPES: Final[dict[str, type[Message]]] = {
    "capacity": Capacity,
    "latency": Latency,
    "requests": Request,
    "targets": Target,
    "value": ValueSignal,
    "events": Event,
    "deadletter": DeadLetter,
    "precompute": Precompute,
}
_TOMBSTONE_KINDS: Final = frozenset({"precompute"})


@overload
def decode(kind: str, data: bytes | bytearray | memoryview) -> Message: ...
@overload
def decode(kind: str, data: None) -> None: ...
@overload
def decode(kind: str, data: bytes | bytearray | memoryview | None) -> Message | None: ...
def decode(kind: str, data: bytes | bytearray | memoryview | None) -> Message | None:
    """Decode and validate one message value of topic ``kind`` (a member of ``TOPIC_KINDS``).

    Returns ``None`` for a tombstone (``data is None``) on ``precompute``, the one topic where
    a null value means "delete". Raises only :class:`ValidationError`, whatever ``data`` holds.
    """
    cls = TYPES.get(kind) if type(kind) is str else None
    if cls is None:
        raise ValidationError(
            "kind", f"unknown topic kind {_clip(kind)!r} (known: {', '.join(TOPIC_KINDS)})"
        )
    if data is None:
        if kind in _TOMBSTONE_KINDS:
            return None
        raise ValidationError(ROOT, f"a tombstone (null value) is not allowed on {kind}")
    obj = loads(data)
    try:
        return cls.from_dict(obj)
    except ValidationError:
        raise
    except Exception as exc:  # a safety net for consumers; the tests hold from_dict to the rule
        raise ValidationError(ROOT, f"could not be decoded: {type(exc).__name__}: {exc}") from None


def encode(msg: Message) -> bytes:
    """The message value bytes (orjson); :class:`ValidationError` if over 1 MiB."""
    if type(msg) is Latency:  # bytes of to_dict(), without a string per sketch bin
        return dumps(msg._wire_dict(), int_keys=True)
    return dumps(msg.to_dict())
