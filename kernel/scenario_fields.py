"""The scenario loader's field walk: the fields each section knows, and short names over the one
family of field checks (:class:`headroom.kernel.checks.FieldChecker`) for the values in them.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from headroom.kernel.checks import FieldChecker, describe

# Every key each section accepts: (required, optional). The schema (headroom.kernel.scenario_schema)
# declares the same names; tests/unit/test_scenario_load.py checks that the two agree.
KEYS: dict[str, tuple[frozenset[str], frozenset[str]]] = {
    "scenario": (
        frozenset({"name", "seed", "duration_s", "slo", "world", "models", "segments", "regions"}),
        frozenset({"events", "control", "eligible_share"}),
    ),
    "control": (frozenset(), frozenset({"interval_s", "ttl_s"})),
    "slo": (frozenset({"p99_ms", "window_s"}), frozenset()),
    "world": (
        frozenset({"ads", "dim", "base_candidates", "max_candidates", "holdout"}),
        frozenset({"drift_per_h", "users"}),
    ),
    "models": (frozenset({"base", "strong"}), frozenset()),
    "model": (
        frozenset({"cpu_ms_per_candidate", "accelerator_ms_per_candidate", "hardware"}),
        frozenset({"load_s"}),
    ),
    "segment": (
        frozenset({"name", "share", "value", "base_error", "strong_error"}),
        frozenset({"return_rate_per_h"}),
    ),
    "value": (frozenset({"mean", "sigma"}), frozenset({"csv"})),
    "region": (frozenset({"name", "dedicated", "traffic"}), frozenset({"opportunistic"})),
    "dedicated": (frozenset({"cpu", "accelerator", "hardware"}), frozenset()),
    "traffic": (
        frozenset(),
        frozenset(
            {"rps", "daily_amplitude", "peak_s", "period_s", "noise", "csv", "trace", "arrivals"}
        ),
    ),
    "opportunistic": (
        frozenset({"resource", "hardware"}),
        frozenset({"trace", "csv", "expires_in_s", "remote"}),
    ),
    "event": (
        frozenset({"at_s", "kind"}),
        frozenset(
            {
                "region",
                "resource",
                "hardware",
                "units",
                "factor",
                "duration_s",
                "remote",
                "process",
                "pool",
                "restart_after_s",
                "down_s",
                "broker",
                "index",
            }
        ),
    ),
}


class _Ctx(FieldChecker):
    """The walk's problems (one family of field checks) and the folder CSV paths are relative to."""

    def __init__(self, base_dir: Path) -> None:
        super().__init__()
        self.base_dir = base_dir


def _mapping(ctx: _Ctx, path: str, value: Any, section: str) -> dict[str, Any] | None:
    """Check a mapping's keys against KEYS[section]: unknown keys and missing required ones."""
    if not isinstance(value, dict):
        ctx.add(path or "(top level)", f"must be a mapping, got {describe(value)}")
        return None
    required, optional = KEYS[section]
    known = required | optional
    for key in value:
        if not isinstance(key, str):
            ctx.add(path or "(top level)", f"field names must be strings, got {describe(key)}")
        elif key not in known:
            hint = difflib.get_close_matches(key, sorted(known), n=1)
            ctx.add(
                _join(path, key),
                "unknown field" + (f" (did you mean {hint[0]!r}?)" if hint else ""),
            )
    for key in sorted(required - set(value)):
        ctx.add(_join(path, key), "required field is missing")
    # The known fields that are present are still validated after a problem here, so one run
    # reports every problem; unknown keys are simply not read.
    return {k: v for k, v in value.items() if isinstance(k, str) and k in known}


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def _list(ctx: _Ctx, path: str, value: Any, *, nonempty: bool) -> list[Any] | None:
    return ctx.read_list(path, value, nonempty=nonempty)


def _number(ctx: _Ctx, path: str, value: Any, **bounds: float | None) -> float | None:
    return ctx.read_number(path, value, **bounds)


def _integer(ctx: _Ctx, path: str, value: Any, **bounds: int | None) -> int | None:
    return ctx.read_integer(path, value, **bounds)


def _string(ctx: _Ctx, path: str, value: Any, *, pattern: bool = False) -> str | None:
    return ctx.read_string(path, value, pattern=pattern)


def _enum(ctx: _Ctx, path: str, value: Any, allowed: tuple[str, ...]) -> str | None:
    return ctx.read_enum(path, value, allowed)


def _req_number(
    ctx: _Ctx, path: str, m: Mapping[str, Any], key: str, **bounds: Any
) -> float | None:
    if key not in m:
        return None  # already reported as missing
    return _number(ctx, f"{path}.{key}", m[key], **bounds)


def _opt_number(
    ctx: _Ctx, path: str, m: Mapping[str, Any], key: str, *, nullable: bool = True, **bounds: Any
) -> float | None:
    if key not in m or (nullable and m[key] is None):
        return None
    return _number(ctx, f"{path}.{key}", m[key], **bounds)


def _req_int(ctx: _Ctx, path: str, m: Mapping[str, Any], key: str, **bounds: Any) -> int | None:
    if key not in m:
        return None
    return _integer(ctx, f"{path}.{key}", m[key], **bounds)


def _opt_int(ctx: _Ctx, path: str, m: Mapping[str, Any], key: str, **bounds: Any) -> int | None:
    if key not in m or m[key] is None:
        return None
    return _integer(ctx, f"{path}.{key}", m[key], **bounds)


def _opt_bool(ctx: _Ctx, path: str, m: Mapping[str, Any], key: str) -> bool | None:
    if key not in m:
        return None
    return ctx.read_bool(f"{path}.{key}", m[key])
