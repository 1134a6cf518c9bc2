"""The one JSON codec of headroom: orjson and msgspec, with the size limit of docs/messages.md.

Every message value on every topic is one JSON object, UTF-8. Typed messages are decoded and
validated in one pass by msgspec (:mod:`headroom.streams.messages`); free-form JSON (event logs,
recordings) goes through :func:`dumps`/:func:`loads` here (orjson). Either way the size limit and
the error type are the same everywhere:

* :func:`dumps` — ``obj -> bytes``; raises :class:`ValidationError` (field ``$``) when the object
  cannot be encoded (a type JSON does not have, an integer beyond 64 bits) or when the encoded
  bytes exceed the limit.
* :func:`loads` — ``bytes -> object``; raises :class:`ValidationError` (field ``$``) for bytes
  over the limit (checked *before* parsing, so a hostile 1 GiB value costs nothing), invalid
  UTF-8, invalid JSON, ``NaN``/``Infinity`` literals and numbers that overflow a double.
* :func:`explain` — turns a ``msgspec.ValidationError``/``DecodeError`` raised while decoding
  into a type into our :class:`ValidationError`, naming the field by its path and saying what is
  wrong with the value found there (below).

Constants and where they come from:

* ``MAX_MESSAGE_BYTES = 1 MiB`` — docs/messages.md ("a message over 1 MiB ... is rejected"); it is
  also Kafka's default ``max.message.bytes`` (1,048,588), so a message we accept can be produced.
* ``MAX_LIST_ITEMS = 100,000`` — docs/messages.md ("a list over 100,000 items is rejected").

:class:`ValidationError` is defined here (the codec raises it, and :mod:`headroom.streams.messages`
and :mod:`headroom.kernel.sketch` build on the codec); its public home is
:mod:`headroom.streams.messages`, which re-exports it. ``field`` is a path into the message
(``rma.candidates``, ``samples_ms[3]``, ``sketch.bins.372``); ``$`` names the message as a whole.

Explaining msgspec's errors: msgspec says *where* (``Expected `int` >= 0 - at `$.rma.candidates```)
but not *what* it found. :func:`explain` follows that path through the input (the object given
to ``msgspec.convert``, or the bytes decoded once more without a type, which only a failing
message pays) and through the type's annotations, and words the reason from the constraint and the
value (``rma.candidates: must be a non-negative integer, got -1``). A map value or key at fault
(msgspec reports ``$.segments[...]``) is found by checking the entries one by one, so the path
names the key (``sbm.segments.premium``). An error raised by a ``__post_init__`` (a cross-field
rule) is our own :class:`ValidationError`, re-rooted at the path. A type may word its own errors
with a ``__explain__(raw, field)`` class method (the latency sketch does). Whatever goes wrong
while explaining, the result is still a :class:`ValidationError` with msgspec's own words.
"""

from __future__ import annotations

import math
import re
import types
import typing
from collections.abc import Mapping
from typing import Annotated, Any, Final

import msgspec
import msgspec.inspect as mi
import orjson

__all__ = [
    "MAX_LIST_ITEMS",
    "MAX_MESSAGE_BYTES",
    "ROOT",
    "ValidationError",
    "dumps",
    "explain",
    "loads",
    "type_name",
]

MAX_MESSAGE_BYTES: Final = 1 << 20  # 1 MiB, docs/messages.md
MAX_LIST_ITEMS: Final = 100_000  # docs/messages.md
ROOT: Final = "$"  # the field path of the message as a whole (JSONPath's root)
FLOAT_MAX: Final = 1.7976931348623157e308  # sys.float_info.max: x <= it is False for inf, NaN
INT64_MAX: Final = (1 << 63) - 1  # integers travel as signed 64-bit words
_INT_KEYS: Final = orjson.OPT_NON_STR_KEYS


class ValidationError(ValueError):
    """A message (or part of one) breaks the contract.

    ``field`` is the path of the offending field (``rma.candidates``, ``samples_ms[3]``, or ``$``
    for the message as a whole) and ``reason`` says what is wrong with it;
    ``str(err) == f"{field}: {reason}"``. Consumers dead-letter the message with this text.
    """

    field: str
    reason: str

    def __init__(self, field: str, reason: str) -> None:
        super().__init__(f"{field}: {reason}")
        self.field = field
        self.reason = reason

    def __reduce__(self) -> tuple[type[ValidationError], tuple[str, str]]:
        # Picklable with both attributes (multiprocessing, hypothesis' example database).
        return (type(self), (self.field, self.reason))

    def prefixed(self, prefix: str) -> ValidationError:
        """The same error seen from an enclosing object: ``candidates`` → ``rma.candidates``."""
        if not prefix:
            return self
        if self.field == ROOT:
            return ValidationError(prefix, self.reason)
        sep = "" if self.field.startswith("[") else "."
        return ValidationError(f"{prefix}{sep}{self.field}", self.reason)


def dumps(obj: Any, *, max_bytes: int | None = MAX_MESSAGE_BYTES, int_keys: bool = False) -> bytes:
    """Encode ``obj`` as compact UTF-8 JSON.

    ``max_bytes=None`` lifts the size limit (event logs on disk, recordings): only message values
    bound for Kafka are held to the contract's 1 MiB. ``int_keys=True`` also accepts ``int``
    keys in objects and writes them as decimal strings (``{372: 10}`` → ``{"372":10}``), which
    spares the encoder of a latency sketch a string per bin; the caller guarantees that no
    object holds both ``372`` and ``"372"`` (JSON would get the key twice).
    """
    try:
        data = orjson.dumps(obj, option=_INT_KEYS) if int_keys else orjson.dumps(obj)
    except TypeError as exc:  # orjson.JSONEncodeError is a TypeError
        raise ValidationError(ROOT, f"cannot be encoded as JSON: {exc}") from None
    if max_bytes is not None and len(data) > max_bytes:
        raise ValidationError(
            ROOT, f"encoded message is {len(data):,} bytes, over the limit of {max_bytes:,}"
        )
    return data


def loads(
    data: bytes | bytearray | memoryview | str, *, max_bytes: int | None = MAX_MESSAGE_BYTES
) -> Any:
    """Decode JSON bytes; every failure is a :class:`ValidationError` naming ``$``."""
    if type(data) is bytes:  # the common case, first
        size = len(data)
    elif not isinstance(data, bytes | bytearray | memoryview | str):
        raise ValidationError(ROOT, f"must be bytes, got {type(data).__name__}")
    elif isinstance(data, str):
        size = len(data.encode("utf-8", "surrogatepass"))
    else:
        size = memoryview(data).nbytes
    if max_bytes is not None and size > max_bytes:
        raise ValidationError(ROOT, f"message is {size:,} bytes, over the limit of {max_bytes:,}")
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        raise ValidationError(ROOT, f"not valid UTF-8 JSON: {exc}") from None
    except (TypeError, ValueError, RecursionError) as exc:  # defensive: orjson documents none
        raise ValidationError(ROOT, f"not valid UTF-8 JSON: {exc}") from None


# -- explaining msgspec's errors ------------------------------------------------------------------

_GENERIC: Final = msgspec.json.Decoder()  # bytes -> plain JSON values, for explanations only
_AT: Final = " - at `"
_KEY_AT: Final = "key` in `"
_TOKEN = re.compile(r"\.([^.\[]+)|\[(\d+)\]|\[\.\.\.\]")
_MAP_VALUE: Final = "[...]"  # msgspec's name for "some value of this map"
_INT_TEXT = re.compile(r"-?(?:0|[1-9][0-9]{0,18})\Z")  # how JSON writes an integer map key


def type_name(value: object) -> str:
    """The JSON-ish name of a value's type for error messages (``null``, ``bool``, ``str``)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, list | tuple):
        return "list"
    if isinstance(value, Mapping):
        return "dict"
    return type(value).__name__


def _clip(value: object, n: int = 40) -> object:
    if isinstance(value, str) and len(value) > n:
        return value[:n] + "…"
    return value


def explain(
    tp: Any,
    raw: Any,
    exc: Exception,
    *,
    data: bytes | bytearray | memoryview | str | None = None,
) -> ValidationError:
    """Our :class:`ValidationError` for ``exc``, a msgspec error raised while decoding ``raw``
    (or ``data``, bytes whose plain decoding is then ``raw``: pass ``raw=None`` with them) into
    ``tp``. Never raises anything else."""
    if data is not None:
        try:
            raw = _GENERIC.decode(data)
        except (msgspec.DecodeError, msgspec.ValidationError, RecursionError) as bad:
            return ValidationError(ROOT, f"not valid UTF-8 JSON: {bad}")
    try:
        return _explain(tp, raw, exc)
    except Exception:  # a safety net: explaining must never be what breaks a consumer
        return _plain_error(exc)


def _plain_error(exc: Exception) -> ValidationError:
    text = str(exc)
    message, sep, where = text.partition(_AT)
    if not sep:
        return ValidationError(ROOT, message or type(exc).__name__)
    where = where.removesuffix("`").removeprefix(_KEY_AT)
    return ValidationError(_join(_tokens(where)) or ROOT, message)


def _tokens(where: str) -> list[str | int]:
    """``$.a.b[3][...]`` -> ``["a", "b", 3, "[...]"]``."""
    out: list[str | int] = []
    for m in _TOKEN.finditer(where, 1 if where.startswith(ROOT) else 0):
        name, index = m.group(1), m.group(2)
        out.append(name if name is not None else int(index) if index is not None else _MAP_VALUE)
    return out


def _join(parts: list[str | int], name: str | None = None) -> str:
    out = ""
    for p in [*parts, *([] if name is None else [name])]:
        if isinstance(p, int):
            out += f"[{p}]"
        else:
            out += f".{p}" if out else p
    return out


def _explain(tp: Any, raw: Any, exc: Exception) -> ValidationError:
    text = str(exc)
    message, sep, where = text.partition(_AT)
    key_error = False
    if sep:
        where = where.removesuffix("`")
        if where.startswith(_KEY_AT):
            key_error, where = True, where[len(_KEY_AT) :]
    else:
        where = ROOT
    tokens = _tokens(where)
    cause = exc.__cause__
    if isinstance(cause, ValidationError):  # a cross-field rule of a __post_init__
        return cause.prefixed(_join(tokens))
    node, t = raw, tp
    parts: list[str | int] = []
    for tok in tokens:
        t = _strip(t, node)
        hook = _hook(t, node, parts)
        if hook is not None:
            return hook
        if isinstance(tok, str) and tok != _MAP_VALUE:
            t = _field_type(t, tok)
            node = node[tok] if isinstance(node, Mapping) else getattr(node, tok)
        elif isinstance(tok, int):
            t = _item_type(t)
            node = node[tok]
        else:
            key_t, value_t = _map_types(t)
            for k, v in node.items():
                if not _fits(v, value_t):
                    parts.append(str(k))
                    node, t = v, value_t
                    break
            else:
                return _plain_error(exc)
            continue
        parts.append(tok)
    t = _strip(t, node)
    hook = _hook(t, node, parts)
    if hook is not None:
        return hook
    if message.startswith("Object missing required field `"):
        return ValidationError(_join(parts, message.split("`")[1]), "missing")
    if key_error:
        key_t, _ = _map_types(t)
        for k in node:
            if not _key_fits(k, key_t):
                return ValidationError(_join(parts, str(k)), _reason(key_t, k, "key"))
        return _plain_error(exc)
    return ValidationError(_join(parts) or ROOT, _reason(t, node, message, root=not parts))


def _hook(t: Any, node: Any, parts: list[str | int]) -> ValidationError | None:
    explain_raw = getattr(t, "__explain__", None) if isinstance(t, type) else None
    if explain_raw is None:
        return None
    result: ValidationError | None = explain_raw(node, _join(parts) or ROOT)
    return result


def _unannotated(t: Any) -> Any:
    while typing.get_origin(t) is Annotated:
        t = typing.get_args(t)[0]
    return t


def _strip(t: Any, node: Any) -> Any:
    """``X | None`` -> ``X`` (the value is not null, or it would not be at fault)."""
    base = _unannotated(t)
    if typing.get_origin(base) in (typing.Union, types.UnionType):
        options = [a for a in typing.get_args(base) if a is not type(None)]
        if len(options) == 1:
            return options[0]
    return t


def _field_type(t: Any, name: str) -> Any:
    t = _unannotated(t)
    for f in msgspec.structs.fields(t):
        if f.encode_name == name:
            return f.type
    raise LookupError(name)


def _item_type(t: Any) -> Any:
    args = typing.get_args(_unannotated(t))
    return args[0]


def _map_types(t: Any) -> tuple[Any, Any]:
    key_t, value_t = typing.get_args(_unannotated(t))
    return key_t, value_t


def _fits(value: Any, t: Any) -> bool:
    try:
        msgspec.convert(value, t, str_keys=True)
    except msgspec.ValidationError:
        return False
    return True


def _key_fits(key: Any, t: Any) -> bool:
    if _unannotated(t) is int:  # JSON writes integer keys as text
        return isinstance(key, str) and _INT_TEXT.match(key) is not None
    return _fits(key, t)


def _reason(t: Any, value: Any, message: str, *, root: bool = False) -> str:
    info = mi.type_info(t)
    extra: dict[str, Any] = {}
    if isinstance(info, mi.Metadata):
        extra = dict(info.extra or {})
        info = info.type
    if isinstance(info, mi.UnionType):
        options = [o for o in info.types if not isinstance(o, mi.NoneType)]
        if len(options) == 1:
            info = options[0]
    got = type_name(value)
    if isinstance(info, mi.FloatType):
        return _float_reason(info, value, got)
    if isinstance(info, mi.IntType):
        return _int_reason(info, value, got)
    if isinstance(info, mi.StrType):
        return _str_reason(info, extra, value, got)
    if isinstance(info, mi.LiteralType):
        shown = repr(_clip(value)) if isinstance(value, str) else got
        allowed = typing.get_args(_unannotated(_strip(t, value)))  # in the order written
        return f"must be one of {', '.join(map(str, allowed))}; got {shown}"
    if isinstance(info, mi.BoolType):
        return f"must be true or false, got {got}"
    if isinstance(info, mi.ListType | mi.VarTupleType | mi.TupleType):
        if not isinstance(value, list | tuple):
            return f"must be a list, got {got}"
        return _size_reason(len(value), message)
    if isinstance(info, mi.DictType | mi.StructType):
        if not isinstance(value, Mapping):
            return f"must be {'a JSON' if root else 'an'} object, got {got}"
        return _size_reason(len(value), message)
    return message


def _int_reason(info: mi.IntType, value: Any, got: str) -> str:
    if type(value) is not int:
        return f"must be an integer, got {got}"
    if info.ge == 0 and value < 0:
        return f"must be a non-negative integer, got {value}"
    return f"must lie between {info.ge} and {info.le}, got {value}"


def _str_reason(info: mi.StrType, extra: Mapping[str, Any], value: Any, got: str) -> str:
    if type(value) is not str:
        return f"must be a string, got {got}"
    if "reason" in extra:
        return f"{extra['reason']}, got {_clip(value)!r}"
    return f"must be {info.min_length}-{info.max_length} characters long, got {len(value)}"


def _float_reason(info: mi.FloatType, value: Any, got: str) -> str:
    if type(value) is bool or not isinstance(value, int | float):
        return f"must be a number, got {got}"
    try:
        f = float(value)
    except OverflowError:
        return "must be a finite number, got a huge integer"
    if not math.isfinite(f):
        return f"must be a finite number, got {f}"
    if info.ge == 0 and info.le == 1:
        return f"must lie in [0, 1], got {f}"
    if info.gt is not None:
        return f"must be > {info.gt:g}, got {f}"
    if info.ge is not None and info.ge > -FLOAT_MAX:
        if info.lt is not None:
            return f"must lie in [{info.ge:g}, {info.lt:g}), got {f}"
        return f"must be >= {info.ge:g}, got {f}"
    return f"must be a finite number, got {f}"


def _size_reason(n: int, message: str) -> str:
    if n > MAX_LIST_ITEMS:
        return f"has {n:,} items, over the limit of {MAX_LIST_ITEMS:,}"
    return message


# Constrained scalar types shared by the message types (docs/messages.md, "Rules every field
# follows"). ``le=FLOAT_MAX`` keeps infinities and NaN out (msgspec compares, and every comparison
# with NaN is false); the JSON decoder itself refuses NaN literals and numbers that overflow.
Finite = Annotated[float, msgspec.Meta(ge=-FLOAT_MAX, le=FLOAT_MAX)]
NonNegative = Annotated[float, msgspec.Meta(ge=0.0, le=FLOAT_MAX)]
Positive = Annotated[float, msgspec.Meta(gt=0.0, le=FLOAT_MAX)]
Share = Annotated[float, msgspec.Meta(ge=0.0, le=1.0)]
Count = Annotated[int, msgspec.Meta(ge=0, le=INT64_MAX)]
NAME_PATTERN: Final = r"\A[A-Za-z0-9_.-]{1,64}\Z"
Name = Annotated[
    str,
    msgspec.Meta(
        pattern=NAME_PATTERN, extra={"reason": "must be 1-64 characters of [A-Za-z0-9_.-]"}
    ),
]
