"""The message contract of docs/messages.md: one frozen, validating msgspec ``Struct`` per topic.

The rules live in the types (:mod:`msgspec` checks them in C while it decodes):

* Every type is a frozen, keyword-only ``msgspec.Struct``; each field is annotated with its
  constraint (``Annotated[float, Meta(ge=0.0, le=FLOAT_MAX)]``, ``Name`` = 1–64 characters of
  ``[A-Za-z0-9_.-]``, ``Literal`` enumerations, ``Meta(max_length=100_000)`` on lists and maps).
  msgspec is strict: a ``bool`` is never a number, an integer field takes only integers (``1.0``
  is refused), an ``int`` given for a float field becomes a ``float``; ``le=FLOAT_MAX`` keeps
  infinities and NaN out, and the JSON decoder refuses ``NaN`` literals and numbers that
  overflow a double (``1e400``). Unknown fields are ignored (msgspec's default).
* Rules that a constraint cannot express are checked in ``__post_init__``, which msgspec runs on
  every decoded struct: ``rma.base <= rma.max``, a latency message carries ``samples_ms`` or a
  ``sketch`` (and the sketch's keys lie in the range of its alpha), an event's free-form fields
  are JSON values nested at most 32 deep.
* ``v`` is required on the wire and checked before anything else when a message is refused (a
  message of another version is reported as such, not as a missing field); constructors
  default it to 1.
* Built in code (``Latency(ts=..., ...)``), a message is validated too: the keyword arguments go
  through ``msgspec.convert`` (numpy scalars and arrays, tuples and read-only mappings are
  turned into plain values first when they are what stopped it), so an invalid message cannot
  exist. ``Type.from_dict(obj)`` is the same without the constructor defaults.
* Every refusal is a :class:`ValidationError` naming the field by its path (``rma.candidates``,
  ``samples_ms[3]``, ``sbm.segments.casual``, ``$``); :func:`headroom.kernel.codec.explain`
  words msgspec's errors.

``decode(kind, data)`` never raises anything but :class:`ValidationError`, whatever the bytes:
consumers dead-letter with ``str(err)`` and go on. ``encode(msg)`` writes compact JSON with
msgspec's encoder (a latency sketch's bins from their integer keys, in ascending order).
"""

from __future__ import annotations

import base64
import math
from collections.abc import Mapping
from types import MappingProxyType
from typing import (
    TYPE_CHECKING,
    Annotated,
    Any,
    ClassVar,
    Final,
    Literal,
    Self,
    TypeAlias,
    get_args,
    overload,
)

import msgspec
import numpy as np
from msgspec import Meta
from msgspec.structs import force_setattr

from headroom.kernel.codec import (
    INT64_MAX,
    MAX_LIST_ITEMS,
    MAX_MESSAGE_BYTES,
    ROOT,
    Count,
    Finite,
    Name,
    NonNegative,
    Positive,
    Share,
    ValidationError,
    explain,
    type_name,
)
from headroom.kernel.sketch import CommonSketchWire, LatencySketch, SketchWire
from headroom.streams.topics import request_key, request_shard

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
    "precompute_key",
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

_MAX_TEXT: Final = 256  # ids, replica names, reasons, event kinds
_MAX_ERROR_TEXT: Final = 64 * 1024  # a dead letter's error message
_MAX_TOPIC: Final = 249  # Kafka's own limit on topic names
_MAX_DEPTH: Final = 32  # nesting of an event's free-form fields
# A dead letter carries the original bytes in base64 (4/3 larger) and must itself fit in 1 MiB:
# 700,000 raw bytes make 933,336 characters, leaving room for the error text and the envelope.
MAX_DEADLETTER_PAYLOAD_BYTES: Final = 700_000

Text = Annotated[str, Meta(min_length=1, max_length=_MAX_TEXT)]
_Version = Literal[1]
_B64 = Annotated[
    str,
    Meta(
        pattern=r"\A(?:[A-Za-z0-9+/]{4})*(?:[A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)?\Z",
        extra={"reason": "is not valid base64"},
    ),
]
_Samples = Annotated[tuple[NonNegative, ...], Meta(max_length=MAX_LIST_ITEMS)]
_Ranking = Annotated[tuple[Count, ...], Meta(max_length=MAX_LIST_ITEMS)]
_Segments = Annotated[dict[Name, Share], Meta(max_length=MAX_LIST_ITEMS)]
_Levels = Annotated[
    dict[Name, Annotated[tuple[Count, ...], Meta(max_length=MAX_LIST_ITEMS)]],
    Meta(max_length=MAX_LIST_ITEMS),
]


# -- the base: construction validated by msgspec ---------------------------------------------


class _Validating(msgspec.StructMeta):
    """Validate on construction in code: ``Type(**fields)`` goes through ``msgspec.convert``.

    msgspec's decoder builds instances without calling the class, so only code pays this; the
    decoder has already checked what it builds. Positional arguments come only from ``copy`` and
    ``pickle`` (every field, in order)."""

    def __call__(cls, *args: Any, **kwargs: Any) -> Any:
        if args:
            kwargs = dict(zip(cls.__struct_fields__, args, strict=False)) | kwargs
        build: Any = getattr(cls, "_build")  # noqa: B009  (a class method of _Model)
        return build(kwargs)


class _Model(msgspec.Struct, metaclass=_Validating, frozen=True, kw_only=True, gc=False):
    """Base of every message type and nested value (no fields of its own)."""

    # Constructor defaults of fields that are required on the wire (``v``).
    _DEFAULTS: ClassVar[dict[str, Any]] = {}

    @classmethod
    def _build(cls, kwargs: dict[str, Any]) -> Any:
        for name, value in cls._DEFAULTS.items():
            kwargs.setdefault(name, value)
        unknown = kwargs.keys() - set(cls.__struct_fields__)
        if unknown:
            raise TypeError(f"{cls.__name__}() got unexpected keyword arguments: {sorted(unknown)}")
        return _convert(cls, kwargs)

    @classmethod
    def from_dict(cls, d: object) -> Self:
        """Validate the plain-dict form (what ``orjson.loads`` gives); unknown fields ignored."""
        out: Self = _convert(cls, d)
        return out

    def to_dict(self) -> dict[str, Any]:
        """The contract form as plain values (the JSON that :func:`encode` writes)."""
        out: dict[str, Any] = msgspec.to_builtins(self, enc_hook=_builtins_hook)
        return out


class _Message(_Model, frozen=True, kw_only=True):
    """A topic's message: ``v`` is required on the wire and defaults to 1 in code."""

    KIND: ClassVar[str]
    _DEFAULTS: ClassVar[dict[str, Any]] = {"v": SCHEMA_VERSION}


def _convert(cls: type[_Model], obj: Any) -> Any:
    try:
        return msgspec.convert(obj, cls, str_keys=True)
    except msgspec.ValidationError as exc:
        error: Exception = exc
    plain = _plain(obj)  # numpy values, read-only mappings: try again with plain ones
    if plain is not obj:
        try:
            return msgspec.convert(plain, cls, str_keys=True)
        except msgspec.ValidationError as exc:
            error, obj = exc, plain
    raise _explained(cls, obj, error) from None


def _explained(cls: type[_Model], raw: Any, exc: Exception) -> ValidationError:
    """The error of a message that failed: its version first, then what msgspec found."""
    if issubclass(cls, _Message):
        if not isinstance(raw, Mapping):
            return ValidationError(ROOT, f"must be a JSON object, got {type_name(raw)}")
        bad = _version_error(raw)
        if bad is not None:
            return bad
    return explain(cls, raw, exc)


def _version_error(d: Mapping[str, Any]) -> ValidationError | None:
    if "v" not in d:
        return ValidationError("v", "missing")
    v = d["v"]
    if type(v) is not int:
        return ValidationError("v", f"must be the integer {SCHEMA_VERSION}, got {type_name(v)}")
    if v != SCHEMA_VERSION:
        return ValidationError(
            "v", f"unsupported schema version {v} (this build reads version {SCHEMA_VERSION})"
        )
    return None


def _plain(value: Any) -> Any:
    """``value`` with numpy scalars and arrays and read-only mappings turned into plain Python
    values, inside lists, tuples and maps too (the same object when nothing needed it)."""
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, msgspec.Struct | LatencySketch | str | bytes):
        return value
    if isinstance(value, Mapping):
        items = {k: _plain(v) for k, v in value.items()}
        if type(value) is dict and all(items[k] is v for k, v in value.items()):
            return value
        return items
    if isinstance(value, list | tuple):
        out = [_plain(v) for v in value]
        if all(a is b for a, b in zip(out, value, strict=True)):
            return value
        return out
    return value


def _builtins_hook(obj: Any) -> Any:
    if isinstance(obj, LatencySketch):
        return obj.to_dict()
    if isinstance(obj, MappingProxyType):
        return dict(obj)
    raise NotImplementedError(f"cannot encode {type(obj).__name__}")


def _encode_hook(obj: Any) -> Any:
    if type(obj) is LatencySketch or isinstance(obj, LatencySketch):
        return obj._wire_dict()  # integer keys, ascending: msgspec writes them as "372"
    if isinstance(obj, MappingProxyType):
        return dict(obj)
    raise NotImplementedError(f"cannot encode {type(obj).__name__}")


# -- nested value types ----------------------------------------------------------------------


class RmaTarget(_Model, frozen=True, kw_only=True, omit_defaults=True):
    """``targets.rma``: candidates to rank now, the baseline count, and the upper bound.

    Only ``base <= max`` is checked here; clamping ``candidates`` into ``[base, max]`` is the
    controller's job (docs/messages.md: "controllers clamp every output").

    ``levels`` (optional, written only when set; a read-only mapping): per segment, the extra
    candidates a request of each value bin gets, lowest bin first — how the plan spends
    ``candidates − base`` per treatment request over the strata. Absent: one block of
    ``max − base`` extras to the highest values (readers that do not know it do that).
    """

    candidates: Count
    base: Count
    max: Count
    if TYPE_CHECKING:
        levels: Mapping[str, tuple[int, ...]] | None = None
    else:
        levels: _Levels | None = None

    def __post_init__(self) -> None:
        if self.base > self.max:
            raise ValidationError("base", f"must be <= max ({self.max}), got {self.base}")
        if self.levels is not None:
            force_setattr(self, "levels", MappingProxyType(self.levels))


class SbmTarget(_Model, frozen=True, kw_only=True, omit_defaults=True):
    """``targets.sbm``: the intended overall share routed to the strong model, and the routing
    probability per segment for eligible requests (a read-only mapping).

    ``explore`` (optional, written only when set): the router's exploration floor. A segment
    whose probability is at most it is only being explored: the plan routes that share of every
    value bin at random instead of the segment's highest values. Absent: every segment's share
    goes to its highest values (readers that do not know it do that)."""

    _DEFAULTS: ClassVar[dict[str, Any]] = {"segments": {}}

    coverage: Share
    if TYPE_CHECKING:
        segments: Mapping[str, float] = {}
        explore: float | None = None
    else:
        segments: _Segments
        explore: Share | None = None

    def __post_init__(self) -> None:
        force_setattr(self, "segments", MappingProxyType(self.segments))


class Budget(_Model, frozen=True, kw_only=True):
    """``targets.budget``: opportunistic units granted to optional work (cores, devices)."""

    cpu: NonNegative
    accelerator: NonNegative


class Cost(_Model, frozen=True, kw_only=True):
    """Compute spent, in milliseconds of CPU and of accelerator time."""

    cpu_ms: NonNegative
    accelerator_ms: NonNegative


class _PrecomputeRate(_Model, frozen=True, kw_only=True):
    """``targets.precompute`` (extension): the precompute workers' job rate."""

    jobs_per_s: NonNegative


# -- topic messages --------------------------------------------------------------------------


class Capacity(_Message, frozen=True, kw_only=True):
    """``headroom.capacity``: the absolute level of one (region, resource, hardware, pool) now.

    A level, not a delta: a lost or repeated message cannot corrupt state; the newest ``ts``
    wins. ``expires_in_s`` is the expected lifetime (``None``: unknown, written as ``null``).
    ``remote`` (extension, written only when true) marks capacity that only asynchronous work
    (precompute) may use.
    """

    KIND: ClassVar[str] = "capacity"

    if TYPE_CHECKING:
        v: int = SCHEMA_VERSION
    else:
        v: _Version
    ts: NonNegative
    region: Name
    resource: Resource
    hardware: Name
    pool: Pool
    units: NonNegative
    expires_in_s: Positive | None = None
    reason: CapacityReason
    id: Text
    remote: bool = False

    def key(self) -> bytes:
        return self.region.encode()

    def to_dict(self) -> dict[str, Any]:
        d = super().to_dict()  # expires_in_s: null when unknown; remote only when true
        if not self.remote:
            del d["remote"]
        return d


class Latency(_Message, frozen=True, kw_only=True, omit_defaults=True):
    """``headroom.latency``: one replica's latency over one window, as raw samples, a sketch or
    both (at least one). ``count`` is the number of requests in the window (samples may be a
    subset). Treat ``sketch`` as read-only: the message does not copy it.

    From bytes, the sketch is decoded as a :class:`CommonSketchWire` (typed bins, checked by
    msgspec) and turned into a :class:`LatencySketch` by ``__post_init__``; a message that does
    not fit it is decoded again from the plain dict (:meth:`from_dict`, whose sketch is a
    :class:`SketchWire`: every sketch the contract allows), which also words the error."""

    KIND: ClassVar[str] = "latency"

    if TYPE_CHECKING:
        v: int = SCHEMA_VERSION
    else:
        v: _Version
    ts: NonNegative
    region: Name
    replica: Text
    pool: Pool
    path: Path
    window_s: Positive
    count: Count
    samples_ms: _Samples | None = None
    if TYPE_CHECKING:
        sketch: LatencySketch | None = None
    else:
        sketch: CommonSketchWire | None = None
    inflight: Count
    queue_ms: NonNegative

    def key(self) -> bytes:
        return self.region.encode()

    def __post_init__(self) -> None:
        sketch: object = self.sketch
        if type(sketch) is CommonSketchWire:
            force_setattr(self, "sketch", LatencySketch.from_wire(sketch))
        elif sketch is None:
            if self.samples_ms is None:
                raise ValidationError(
                    "samples_ms", "missing: a latency message needs samples_ms or sketch"
                )
        elif not isinstance(sketch, LatencySketch):
            raise ValidationError("sketch", f"must be a LatencySketch, got {type_name(sketch)}")

    def to_dict(self) -> dict[str, Any]:
        d = super().to_dict()
        if self.samples_ms is not None:
            d["samples_ms"] = list(self.samples_ms)
        return d

    @classmethod
    def _build(cls, kwargs: dict[str, Any]) -> Any:
        # msgspec converts the other fields; the sketch is an object already built (and
        # validated by its own methods): only its type is checked, and it is not copied.
        sketch = kwargs.get("sketch")
        if sketch is None:
            return super()._build(kwargs)
        if not isinstance(sketch, LatencySketch):
            raise ValidationError("sketch", f"must be a LatencySketch, got {type_name(sketch)}")
        return _with_sketch(super()._build(kwargs | {"sketch": _NO_BINS}), sketch)

    @classmethod
    def from_dict(cls, d: object) -> Self:
        raw = d.get("sketch") if isinstance(d, Mapping) else None
        if raw is None:
            return super().from_dict(d)
        assert isinstance(d, Mapping)
        bad = _version_error(d)
        if bad is not None:
            raise bad
        try:
            wire = msgspec.convert(raw, SketchWire, str_keys=True)
        except msgspec.ValidationError as exc:
            raise (SketchWire.__explain__(raw, "sketch") or explain(SketchWire, raw, exc)) from None
        sketch = LatencySketch.from_wire(wire)
        out: Self = _with_sketch(super().from_dict({**d, "sketch": _NO_BINS}), sketch)
        return out


_NO_BINS: Final = CommonSketchWire(alpha=0.01, bins={})  # stands in for a sketch built apart


def _with_sketch(msg: Any, sketch: LatencySketch) -> Any:
    force_setattr(msg, "sketch", sketch)
    return msg


class Request(_Message, frozen=True, kw_only=True):
    """``headroom.requests``: one request. ``value`` is its value signal (non-negative),
    ``eligible`` whether it may go to the strong model, ``user`` the user's integer seed."""

    KIND: ClassVar[str] = "requests"

    if TYPE_CHECKING:
        v: int = SCHEMA_VERSION
    else:
        v: _Version
    ts: NonNegative
    id: Text
    region: Name
    segment: Name
    value: NonNegative
    eligible: bool
    user: Count

    def key(self) -> bytes:
        """The region (the key of a topic with one partition per region's traffic)."""
        return self.region.encode()

    def shard(self, partitions: int) -> int:
        """The request's shard on a ``requests`` topic of ``partitions`` partitions."""
        return request_shard(self.user, partitions)

    def shard_key(self, partitions: int) -> bytes:
        """The ``requests`` key, ``region/shard`` (docs/messages.md): the feed writes the
        request to partition :meth:`shard`."""
        return request_key(self.region, self.shard(partitions))


class Target(_Message, frozen=True, kw_only=True, omit_defaults=True):
    """``headroom.targets``: what a region's clients and servers should do until ``ts + ttl_s``.

    Clients apply the highest ``epoch`` of their region; a target older than ``ttl_s`` is
    expired and the client falls back to the baseline (:meth:`expired`). Extension (written only
    when set): the precompute workers' job rate, ``precompute_jobs_per_s``, as
    ``"precompute": {"jobs_per_s": X}`` on the wire.
    """

    KIND: ClassVar[str] = "targets"

    if TYPE_CHECKING:
        v: int = SCHEMA_VERSION
    else:
        v: _Version
    ts: NonNegative
    region: Name
    epoch: Count
    ttl_s: Positive
    rma: RmaTarget
    sbm: SbmTarget
    budget: Budget
    reason: Text
    if TYPE_CHECKING:
        precompute_jobs_per_s: float | None = None
    else:
        precompute: _PrecomputeRate | None = None

        @property
        def precompute_jobs_per_s(self) -> float | None:
            return None if self.precompute is None else self.precompute.jobs_per_s

    @classmethod
    def _build(cls, kwargs: dict[str, Any]) -> Any:
        rate = kwargs.pop("precompute_jobs_per_s", None)
        if rate is not None:
            kwargs["precompute"] = {"jobs_per_s": rate}
        return super()._build(kwargs)

    def key(self) -> bytes:
        return self.region.encode()

    def expired(self, now: float) -> bool:
        """True once ``now`` (event time, seconds) is past ``ts + ttl_s``."""
        return now > self.ts + self.ttl_s


class ValueSignal(_Message, frozen=True, kw_only=True, omit_defaults=True):
    """``headroom.value``: sums of observed request value for one (region, segment, lever, arm)
    over a window; sums, not means, so windows and workers add up exactly.

    Extensions (written only when set): ``producer`` and ``seq``, the publishing process and the
    message's number within it (exactly-once counting); ``stratum``, an integer in
    ``[0, MAX_STRATUM]`` naming the
    value bin of the segment the sums cover (a request's value rank within its segment, in
    equal-probability bins), so the estimator can post-stratify on the value signal. Absent:
    the sums cover the whole segment, as docs/messages.md defines them. ``signal_sum``,
    ``signal_sq_sum``, ``signal_value_sum``: the sums of the requests' value signal.
    """

    KIND: ClassVar[str] = "value"

    if TYPE_CHECKING:
        v: int = SCHEMA_VERSION
    else:
        v: _Version
    ts: NonNegative
    region: Name
    segment: Name
    lever: Lever
    arm: Arm
    n: Count
    value_sum: Finite
    value_sq_sum: NonNegative
    window_s: Positive
    cost: Cost
    stratum: Annotated[int, Meta(ge=0, le=MAX_STRATUM)] | None = None
    # Extension (written only when set): the publishing process (one id per process start) and
    # the message's sequence number within it, counting from 0; the controller counts each
    # (producer, seq) once, whatever is re-delivered (docs/streaming.md, *Faults*).
    producer: Name | None = None
    seq: Count | None = None
    # Extension (written only when set): the sums of the requests' value signal x (their value
    # before ranking, known in either arm): Σx, Σx², Σx·value — the value book's per-stratum
    # signal means (RMA levels) and the estimator's regression term, as the simulator has them.
    signal_sum: Finite | None = None
    signal_sq_sum: NonNegative | None = None
    signal_value_sum: Finite | None = None

    def key(self) -> bytes:
        return self.region.encode()


_EVENT_COMMON: Final = frozenset({"v", "ts", "region", "kind", "source"})


class Event(_Message, frozen=True, kw_only=True):
    """``headroom.events`` (and one line of the event log, docs/events.md).

    Common fields plus ``kind`` and ``source``; every other field lives in ``extra`` (a
    read-only mapping of JSON values, checked like the rest: finite numbers, bounded sizes) and
    is written back at the top level, so a round trip keeps it. ``region`` is ``None`` for
    run-wide lines (written as ``null``).
    """

    KIND: ClassVar[str] = "events"

    if TYPE_CHECKING:
        v: int = SCHEMA_VERSION
    else:
        v: _Version
    ts: NonNegative
    kind: Text
    source: Source
    region: Name | None = None
    extra: Mapping[str, Any] = {}

    def __post_init__(self) -> None:
        extra = self.extra
        if len(extra) > MAX_LIST_ITEMS:
            raise ValidationError(
                ROOT, f"has {len(extra):,} fields, over the limit of {MAX_LIST_ITEMS:,}"
            )
        clean: dict[str, Any] = {}
        for k, value in extra.items():
            if k in _EVENT_COMMON:
                raise ValidationError(k, "is a common field; set it directly, not in extra")
            clean[k] = _json_value(value, k)
        force_setattr(self, "extra", MappingProxyType(clean))

    @classmethod
    def from_dict(cls, d: object) -> Event:
        if isinstance(d, Mapping):
            d = {k: v for k, v in d.items() if k in _EVENT_COMMON} | {
                "extra": {k: v for k, v in d.items() if k not in _EVENT_COMMON}
            }
        event: Event = _convert(cls, d)
        return event

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


def _json_value(value: object, name: str, depth: int = 0) -> Any:
    """Check a free-form value (an event's extra fields): JSON types only, finite numbers,
    integers within 64 bits, bounded sizes and depth. Returns the value with tuples turned into
    lists."""
    t = type(value)
    if value is None or t is str or t is bool:
        return value
    if t is int:
        if not -INT64_MAX - 1 <= value <= INT64_MAX:  # type: ignore[operator]
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
                raise ValidationError(name, f"object keys must be strings, got {type_name(k)}")
            out[k] = _json_value(v, f"{name}.{k}", depth + 1)
        return out
    if isinstance(value, list | tuple):
        _check_len(len(value), name)
        return [_json_value(v, f"{name}[{i}]", depth + 1) for i, v in enumerate(value)]
    if isinstance(value, np.floating):
        return _json_value(float(value), name, depth)
    if isinstance(value, np.integer):
        return _json_value(int(value), name, depth)
    raise ValidationError(name, f"must be a JSON value, got {type_name(value)}")


def _check_len(size: int, name: str) -> None:
    if size > MAX_LIST_ITEMS:
        raise ValidationError(name, f"has {size:,} items, over the limit of {MAX_LIST_ITEMS:,}")


class Precompute(_Message, frozen=True, kw_only=True):
    """``headroom.precompute``: a user's ranking computed ahead of a visit, keyed ``region/user``.

    ``ranking`` holds ad ids, best first; a result past ``expires_at`` is never served
    (:meth:`expired`). A tombstone (null value) deletes a stored result: ``decode`` returns
    ``None`` for it.
    """

    KIND: ClassVar[str] = "precompute"

    if TYPE_CHECKING:
        v: int = SCHEMA_VERSION
    else:
        v: _Version
    ts: NonNegative
    region: Name
    user: Count
    segment: Name
    model: Name
    expires_at: NonNegative
    ranking: _Ranking
    cost: Cost

    def expired(self, now: float) -> bool:
        """True once ``now`` (event time, seconds) is past ``expires_at``: never serve it."""
        return now > self.expires_at

    def key(self) -> bytes:
        return precompute_key(self.region, self.user)

    def to_dict(self) -> dict[str, Any]:
        d = super().to_dict()
        d["ranking"] = list(self.ranking)
        return d


def precompute_key(region: str, user: int) -> bytes:
    """The record key of ``headroom.precompute``: ``region/user`` (docs/messages.md)."""
    return f"{region}/{user}".encode()


class DeadLetter(_Message, frozen=True, kw_only=True):
    """``headroom.deadletter``: a message that failed validation, with where it came from and
    the original bytes in base64 so nothing is lost.

    ``partition``/``offset`` are ``None`` when the bad message did not come from Kafka (a
    replayed file; written as ``null``). Extensions, written only when set: ``key_b64`` (the
    original record key) and ``truncated`` (the payload was cut to
    ``MAX_DEADLETTER_PAYLOAD_BYTES`` so the dead letter itself fits in 1 MiB). Build one with
    :meth:`for_payload`.
    """

    KIND: ClassVar[str] = "deadletter"

    if TYPE_CHECKING:
        v: int = SCHEMA_VERSION
    else:
        v: _Version
    ts: NonNegative
    topic: Annotated[str, Meta(min_length=1, max_length=_MAX_TOPIC)]
    partition: Count | None = None
    offset: Count | None = None
    error: Annotated[str, Meta(min_length=1, max_length=_MAX_ERROR_TEXT)]
    payload_b64: _B64
    key_b64: _B64 | None = None
    truncated: bool = False

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
# Types whose wire form is their struct as it is (every optional field written only when set):
# msgspec encodes them directly. The others go through to_dict (null fields written, or an
# event's extra fields at the top level).
_AS_STRUCT: Final = frozenset({Latency, Request, Target, ValueSignal, Precompute})
_ENCODER: Final = msgspec.json.Encoder(enc_hook=_encode_hook)
_DECODERS: Final[dict[str, tuple[type[Message], msgspec.json.Decoder[Any]]]] = {
    kind: (cls, msgspec.json.Decoder(dict[str, Any] if cls is Event else cls))
    for kind, cls in TYPES.items()
}


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
    The size is checked before a byte is parsed.
    """
    entry = _DECODERS.get(kind) if type(kind) is str else None
    if entry is None:
        raise ValidationError(
            "kind", f"unknown topic kind {kind!r:.60} (known: {', '.join(TOPIC_KINDS)})"
        )
    if data is None:
        if kind in _TOMBSTONE_KINDS:
            return None
        raise ValidationError(ROOT, f"a tombstone (null value) is not allowed on {kind}")
    if type(data) is bytes:
        size = len(data)
    elif isinstance(data, bytearray | memoryview):
        size = memoryview(data).nbytes
    else:
        raise ValidationError(ROOT, f"must be bytes, got {type(data).__name__}")
    if size > MAX_MESSAGE_BYTES:
        raise ValidationError(
            ROOT, f"message is {size:,} bytes, over the limit of {MAX_MESSAGE_BYTES:,}"
        )
    cls, decoder = entry
    try:
        msg = decoder.decode(data)
    except (msgspec.ValidationError, msgspec.DecodeError) as exc:
        # Decode it again as plain JSON and validate that: the same rules, the error worded
        # from the value at fault (and a latency sketch that the common form does not fit, an
        # empty bin or a key of a fine alpha, accepted).
        try:
            raw = _GENERIC.decode(data)
        except (msgspec.DecodeError, msgspec.ValidationError, RecursionError) as bad:
            raise _not_json(exc, bad) from None
        return _checked(cls, raw)
    except Exception as exc:  # a safety net for consumers (RecursionError on deep nesting, ...)
        raise ValidationError(ROOT, f"could not be decoded: {type(exc).__name__}: {exc}") from None
    if cls is Event:
        return _checked(cls, msg)
    return msg  # type: ignore[no-any-return]


def _checked(cls: type[Message], raw: Any) -> Message:
    try:
        return cls.from_dict(raw)
    except ValidationError:
        raise
    except Exception as exc:  # the safety net again: from_dict raises nothing else in tests
        raise ValidationError(ROOT, f"could not be decoded: {type(exc).__name__}: {exc}") from None


_GENERIC: Final = msgspec.json.Decoder()
_OVERFLOW: Final = "Number out of range"
_BEYOND: Final = "a number beyond a double's range"


def _not_json(exc: Exception, bad: Exception) -> ValidationError:
    """Bytes that are not JSON at all, or hold a number beyond the range of a double (``1e400``;
    msgspec says where, from the typed decoding)."""
    text = str(exc)
    if isinstance(exc, msgspec.ValidationError) and text.startswith(_OVERFLOW):
        where = text.partition(" - at `$")[2].removesuffix("`").lstrip(".")
        if where and "[..." not in where:
            return ValidationError(where, f"must be a finite number, got {_BEYOND}")
    if isinstance(bad, msgspec.ValidationError):
        return ValidationError(ROOT, f"holds a number beyond a double's range ({bad})")
    return ValidationError(ROOT, f"not valid UTF-8 JSON: {bad}")


def encode(msg: Message) -> bytes:
    """The message value bytes (compact JSON); :class:`ValidationError` if over 1 MiB."""
    data = _ENCODER.encode(msg if type(msg) in _AS_STRUCT else msg.to_dict())
    if len(data) > MAX_MESSAGE_BYTES:
        raise ValidationError(
            ROOT, f"encoded message is {len(data):,} bytes, over the limit of {MAX_MESSAGE_BYTES:,}"
        )
    return data
