"""The one JSON codec of headroom: orjson, with the size limit of docs/messages.md.

Every message value on every topic is one JSON object, UTF-8, encoded with orjson. This module
is the only place that calls orjson for message bytes, so the size limit and the error type are
the same everywhere:

* :func:`dumps` — ``obj -> bytes``; raises :class:`ValidationError` (field ``$``) when the object
  cannot be encoded (a type JSON does not have, an integer beyond 64 bits) or when the encoded
  bytes exceed the limit.
* :func:`loads` — ``bytes -> object``; raises :class:`ValidationError` (field ``$``) for bytes
  over the limit (checked *before* parsing, so a hostile 1 GiB value costs nothing), invalid
  UTF-8, invalid JSON, ``NaN``/``Infinity`` literals and numbers that overflow a double.

Constants and where they come from:

* ``MAX_MESSAGE_BYTES = 1 MiB`` — docs/messages.md ("a message over 1 MiB ... is rejected"); it is
  also Kafka's default ``max.message.bytes`` (1,048,588), so a message we accept can be produced.
* ``MAX_LIST_ITEMS = 100,000`` — docs/messages.md ("a list over 100,000 items is rejected").

:class:`ValidationError` is defined here (the codec raises it, and :mod:`headroom.streams.messages`
and :mod:`headroom.kernel.sketch` build on the codec); its public home is
:mod:`headroom.streams.messages`, which re-exports it. ``field`` is a path into the message
(``rma.candidates``, ``samples_ms[3]``, ``sketch.bins.372``); ``$`` names the message as a whole.
"""

from __future__ import annotations

from typing import Any, Final

import orjson

__all__ = [
    "MAX_LIST_ITEMS",
    "MAX_MESSAGE_BYTES",
    "ROOT",
    "ValidationError",
    "dumps",
    "loads",
]

MAX_MESSAGE_BYTES: Final = 1 << 20  # 1 MiB, docs/messages.md
MAX_LIST_ITEMS: Final = 100_000  # docs/messages.md
ROOT: Final = "$"  # the field path of the message as a whole (JSONPath's root)
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
