"""The snapshot convention of every stateful core, and JSON-safe seeded generators.

The convention (:class:`Snapshotting`)
--------------------------------------
A restarted controller or worker resumes from a snapshot without a jump. Every object that keeps
state across steps does it the same way:

* it is **constructed from its configuration** — never from a snapshot — so the settings in force
  are always the running process's own, not whatever an older process stored;
* ``snapshot() -> dict[str, Any]`` returns its state as plain JSON: a dict with ``str`` keys and
  only dicts, lists, strings, finite floats, ints, bools and None inside (infinities and NaN as
  the strings ``"inf"``, ``"-inf"``, ``"nan"``; integers beyond 64 bits, such as a generator's
  state, through :func:`encode_big_ints`), so ``orjson`` or ``json`` stores it unchanged;
* ``restore(state: Mapping[str, Any]) -> None`` replaces its state in place with the state of the
  object that took ``state``; the next outputs are then exactly those that object would have
  given. Configuration stays the object's own. A snapshot it cannot read (an unknown version, a
  missing field) raises; after that the object's state is undefined (rebuild it from its
  configuration), except for the control plane, which checks every region before it changes any.

A restore may also read the forms that earlier versions of the code stored (each class says which
in its docstring), so a running system keeps its state across an upgrade.

Seeded generators
-----------------
numpy generator states hold 128-bit integers, which JSON codecs (orjson) refuse; these helpers
write every integer as the string ``"int:<digits>"`` and read it back, so a snapshot stays plain
JSON and a restored generator continues the exact same stream.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, Protocol, runtime_checkable

__all__ = ["Snapshotting", "decode_big_ints", "encode_big_ints", "json_float", "unjson_float"]


@runtime_checkable
class Snapshotting(Protocol):
    """A stateful object that snapshots to plain JSON and restores in place (module docstring).

    ``isinstance(x, Snapshotting)`` checks only that both methods exist; mypy checks their
    signatures wherever a class is used as one.
    """

    def snapshot(self) -> dict[str, Any]:
        """The object's state as plain JSON (str keys)."""
        ...

    def restore(self, state: Mapping[str, Any], /) -> None:
        """Replace the object's state in place with the one ``state`` holds."""
        ...


def json_float(x: Any) -> Any:
    """``x`` as plain JSON: a non-finite float as the string ``float()`` reads back (``"inf"``,
    ``"-inf"``, ``"nan"``); anything else as it is."""
    if isinstance(x, float) and not math.isfinite(x):
        return "nan" if math.isnan(x) else ("inf" if x > 0 else "-inf")
    return x


def unjson_float(x: Any) -> Any:
    """The inverse of :func:`json_float`: a string back to its float, anything else as it is."""
    return float(x) if isinstance(x, str) else x


def encode_big_ints(obj: Any) -> Any:
    if isinstance(obj, bool):
        return obj
    if isinstance(obj, int):
        return f"int:{obj}"
    if isinstance(obj, Mapping):
        return {k: encode_big_ints(v) for k, v in obj.items()}
    return obj


def decode_big_ints(obj: Any) -> Any:
    if isinstance(obj, str) and obj.startswith("int:"):
        return int(obj[4:])
    if isinstance(obj, Mapping):
        return {k: decode_big_ints(v) for k, v in obj.items()}
    return obj
