"""The one family of field validators: settings, configs and flags check their fields with it.

A :class:`FieldChecker` collects problems as ``path.field: what is wrong, got VALUE`` lines, so
every setting of headroom — controller settings, shedding and peer configs, worker configs,
command-line flags — reports a bad value the same way, naming the field.
:meth:`FieldChecker.raise_if_any` turns the collected lines into one
:class:`~headroom.kernel.errors.ConfigError` (exit 2 at the command line, one line per problem).
The scenario loader reads its fields with the same checker: the ``read_*`` methods take a raw
parsed value (YAML, JSON), report what is wrong with it at a full path
(``regions[1].traffic.rps: must be > 0, got -1``) and return the typed value, or ``None`` when it is
unusable. One comparison rule (:func:`bound_problem`) and one description of a bad value
(:func:`describe`) serve both kinds of check.

Numbers must be finite (``bool`` is not a number); each check adds at most one problem per field.
"""

from __future__ import annotations

import math
import re
from typing import Any

from headroom.kernel.errors import ConfigError

__all__ = [
    "NAME_PATTERN",
    "FieldChecker",
    "bound_problem",
    "describe",
    "is_finite_number",
    "one_line",
]

NAME_PATTERN = r"^[A-Za-z0-9_.-]{1,64}$"  # region, pool and segment names
_NAME_RE = re.compile(NAME_PATTERN)


def is_finite_number(x: object) -> bool:
    """An ``int`` or ``float`` (not a ``bool``) that is finite."""
    return isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x)


def bound_problem(
    x: float,
    *,
    gt: float | None = None,
    ge: float | None = None,
    lt: float | None = None,
    le: float | None = None,
) -> str | None:
    """What ``x`` breaks among the bounds given (``> gt``, ``>= ge``, ``< lt``, ``<= le``, checked
    in that order), or None."""
    if gt is not None and not x > gt:
        return f"must be > {gt:g}"
    if ge is not None and not x >= ge:
        return f"must be >= {ge:g}"
    if lt is not None and not x < lt:
        return f"must be < {lt:g}"
    if le is not None and not x <= le:
        return f"must be <= {le:g}"
    return None


def describe(value: Any) -> str:
    """A bad value in words, short enough for one problem line: ``a string ('abc')``."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return f"a bool ({str(value).lower()})"
    if isinstance(value, int):
        return f"an integer ({value})"
    if isinstance(value, float):
        return f"a number ({value:g})"
    if isinstance(value, str):
        shown = value if len(value) <= 40 else value[:37] + "..."
        return f"a string ({shown!r})"
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, list):
        return f"a list of {len(value)}"
    return f"a {type(value).__name__} ({value!s:.40})"


def one_line(text: str) -> str:
    """Escape control characters (a newline in a key or a CSV cell) so a problem stays one line."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode() for c in text)


class FieldChecker:
    """Collects ``path.name: problem, got value`` lines (module docstring)."""

    def __init__(self, path: str = "") -> None:
        self.path = path
        self.problems: list[str] = []

    def field(self, name: str) -> str:
        """The full path of field ``name``."""
        return f"{self.path}.{name}" if self.path else name

    def fail(self, name: str, text: str, value: object) -> None:
        """Record that field ``name`` (holding ``value``) breaks ``text``."""
        self.problems.append(f"{self.field(name)}: {text}, got {value!r}")

    def between(
        self,
        name: str,
        value: float,
        lo: float,
        hi: float,
        *,
        lo_open: bool = False,
        hi_open: bool = False,
    ) -> None:
        """``lo <= value <= hi`` (``<`` at an open end)."""
        if not is_finite_number(value):
            self.fail(name, "must be a finite number", value)
            return
        lo_ok = value > lo if lo_open else value >= lo
        hi_ok = value < hi if hi_open else value <= hi
        if not (lo_ok and hi_ok):
            left = "(" if lo_open else "["
            right = ")" if hi_open else "]"
            self.fail(name, f"must be in {left}{lo:g}, {hi:g}{right}", value)

    def at_least(self, name: str, value: float, lo: float, *, strict: bool = False) -> None:
        """``value >= lo`` (``>`` when ``strict``)."""
        if not is_finite_number(value):
            self.fail(name, "must be a finite number", value)
        elif problem := bound_problem(value, **({"gt": lo} if strict else {"ge": lo})):
            self.fail(name, problem, value)

    def at_most(self, name: str, value: float, hi: float, *, strict: bool = False) -> None:
        """``value <= hi`` (``<`` when ``strict``)."""
        if not is_finite_number(value):
            self.fail(name, "must be a finite number", value)
        elif problem := bound_problem(value, **({"lt": hi} if strict else {"le": hi})):
            self.fail(name, problem, value)

    def positive(self, name: str, value: float) -> None:
        """``value > 0``."""
        self.at_least(name, value, 0.0, strict=True)

    def nonnegative(self, name: str, value: float) -> None:
        """``value >= 0``."""
        self.at_least(name, value, 0.0)

    def share(self, name: str, value: float) -> None:
        """``0 <= value <= 1``."""
        self.between(name, value, 0.0, 1.0)

    def integer(self, name: str, value: object, lo: int | None = None) -> None:
        """An ``int`` (not a ``bool``), at least ``lo`` when given."""
        if not isinstance(value, int) or isinstance(value, bool):
            self.fail(name, "must be an integer", value)
        elif lo is not None and value < lo:
            self.fail(name, f"must be >= {lo}", value)  # an integer bound, shown as given

    def clock(self, t0: float, speed: float) -> None:
        """A worker's clock flags: ``--t0`` (the wall-clock epoch of scenario time 0) ``>= 0`` and
        ``--speed`` (scenario seconds per wall second) ``> 0``."""
        self.nonnegative("--t0", t0)
        self.positive("--speed", speed)

    def require(self, ok: bool, name: str, text: str, value: object) -> None:
        """A rule no other method expresses: record ``text`` unless ``ok``."""
        if not ok:
            self.fail(name, text, value)

    # -- readers of raw values at a full path (the scenario loader's fields) -----------------

    def add(self, path: str, reason: str) -> None:
        """Record ``path: reason`` as one line (``reason`` alone at the top level)."""
        self.problems.append(one_line(f"{path}: {reason}" if path else reason))

    def read_number(
        self,
        path: str,
        value: Any,
        *,
        gt: float | None = None,
        ge: float | None = None,
        lt: float | None = None,
        le: float | None = None,
    ) -> float | None:
        """A finite number inside the bounds given, as a float."""
        if isinstance(value, bool) or not isinstance(value, int | float):
            self.add(path, f"must be a number, got {describe(value)}")
            return None
        x = float(value)
        if not math.isfinite(x):
            self.add(path, f"must be a finite number, got {value}")
            return None
        problem = bound_problem(x, gt=gt, ge=ge, lt=lt, le=le)
        if problem is not None:
            self.add(path, f"{problem}, got {x:g}")
            return None
        return x

    def read_integer(
        self,
        path: str,
        value: Any,
        *,
        ge: int | None = None,
        le: int | None = None,
        lt: int | None = None,
    ) -> int | None:
        """An ``int`` (not a ``bool``) inside the bounds given."""
        if isinstance(value, bool) or not isinstance(value, int):
            self.add(path, f"must be an integer, got {describe(value)}")
            return None
        problem = bound_problem(value, ge=ge, le=le, lt=lt)
        if problem is not None:
            self.add(path, f"{problem}, got {value}")
            return None
        return value

    def read_string(self, path: str, value: Any, *, pattern: bool = False) -> str | None:
        """A non-blank string; with ``pattern``, a name of 1-64 characters of [A-Za-z0-9_.-]."""
        if not isinstance(value, str):
            self.add(path, f"must be a string, got {describe(value)}")
            return None
        if pattern and not _NAME_RE.match(value):
            self.add(path, f"must be 1-64 characters of [A-Za-z0-9_.-], got {value!r}")
            return None
        if not pattern and not value.strip():
            self.add(path, "must not be empty")
            return None
        return value

    def read_enum(self, path: str, value: Any, allowed: tuple[str, ...]) -> str | None:
        """One of ``allowed``."""
        if not isinstance(value, str) or value not in allowed:
            shown = repr(value) if isinstance(value, str) else describe(value)
            self.add(path, f"unknown value {shown}; must be one of {', '.join(allowed)}")
            return None
        return value

    def read_bool(self, path: str, value: Any) -> bool | None:
        """``true`` or ``false``."""
        if not isinstance(value, bool):
            self.add(path, f"must be true or false, got {describe(value)}")
            return None
        return value

    def read_list(self, path: str, value: Any, *, nonempty: bool) -> list[Any] | None:
        """A list (with at least one item when ``nonempty``)."""
        if not isinstance(value, list):
            self.add(path, f"must be a list, got {describe(value)}")
            return None
        if nonempty and not value:
            self.add(path, "must not be empty")
            return None
        return value

    def raise_if_any(self) -> None:
        """One :class:`ConfigError` with every problem, if there is any."""
        if self.problems:
            raise ConfigError(self.problems)
