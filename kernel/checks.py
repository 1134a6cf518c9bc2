"""The one family of field validators: settings, configs and flags check their fields with it.

A :class:`FieldChecker` collects problems as ``path.field: what is wrong, got VALUE`` lines, so
every setting of headroom — controller settings, shedding and peer configs, worker configs,
command-line flags — reports a bad value the same way, naming the field.
:meth:`FieldChecker.raise_if_any` turns the collected lines into one
:class:`~headroom.kernel.errors.ConfigError` (exit 2 at the command line, one line per problem).
The scenario loader reports its own problems in the same form (``regions[1].traffic.rps: must be >
0``).

Numbers must be finite (``bool`` is not a number); each check adds at most one problem per field.
"""

from __future__ import annotations

import math

from headroom.kernel.errors import ConfigError

__all__ = ["FieldChecker", "is_finite_number"]


def is_finite_number(x: object) -> bool:
    """An ``int`` or ``float`` (not a ``bool``) that is finite."""
    return isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x)


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
        elif (value <= lo) if strict else (value < lo):
            self.fail(name, f"must be {'>' if strict else '>='} {lo:g}", value)

    def at_most(self, name: str, value: float, hi: float, *, strict: bool = False) -> None:
        """``value <= hi`` (``<`` when ``strict``)."""
        if not is_finite_number(value):
            self.fail(name, "must be a finite number", value)
        elif (value >= hi) if strict else (value > hi):
            self.fail(name, f"must be {'<' if strict else '<='} {hi:g}", value)

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
            self.fail(name, f"must be >= {lo}", value)

    def clock(self, t0: float, speed: float) -> None:
        """A worker's clock flags: ``--t0`` (the wall-clock epoch of scenario time 0) ``>= 0`` and
        ``--speed`` (scenario seconds per wall second) ``> 0``."""
        self.nonnegative("--t0", t0)
        self.positive("--speed", speed)

    def require(self, ok: bool, name: str, text: str, value: object) -> None:
        """A rule no other method expresses: record ``text`` unless ``ok``."""
        if not ok:
            self.fail(name, text, value)

    def raise_if_any(self) -> None:
        """One :class:`ConfigError` with every problem, if there is any."""
        if self.problems:
            raise ConfigError(self.problems)
