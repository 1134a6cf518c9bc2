"""JSON-safe snapshots of seeded generators (shared by the cores that snapshot one).

numpy generator states hold 128-bit integers, which JSON codecs (orjson) refuse; these helpers
write every integer as the string ``"int:<digits>"`` and read it back, so a snapshot stays plain
JSON and a restored generator continues the exact same stream.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


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
