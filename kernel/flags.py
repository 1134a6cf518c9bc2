"""The command line's numeric flags, checked like a scenario's fields.

Every numeric flag of every command (``--seed``, ``--interval``, ``--speed``, ``--port``,
``--timeout``, …) is declared through :func:`number` with one of the rules below. A rule is the
flag's argparse ``type=``: it parses the text and checks the value with
:class:`~headroom.kernel.checks.FieldChecker`, the one family of field validators, under the flag's
name. A bad value is a :class:`~headroom.kernel.errors.ConfigError`, which argparse lets through
(it only catches its own errors): the command exits 2 with one line naming the flag and the
problem, e.g. ``headroom: --seed: must be >= 0, got -5``, and no traceback — before any work
starts.

Where a flag stands in for a scenario field the limits are the scenario's own (``--seed`` takes
exactly the seeds a scenario file may give, :data:`~headroom.kernel.scenario.MAX_SEED`), so a value
valid in one place is valid in the other. Rules that depend on the scenario (``--interval`` against
the SLO window, ``--ttl`` against the interval) are checked once the scenario is loaded
(:func:`headroom.kernel.scenario_load.control_with_flags`), in the same form.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from headroom.kernel.checks import FieldChecker
from headroom.kernel.errors import ConfigError
from headroom.kernel.scenario import MAX_SEED

__all__ = [
    "DURATION",
    "EPOCH",
    "FAST_SPEED",
    "FIXED_PORT",
    "PORT",
    "SEED",
    "SHARE",
    "SPEED",
    "Rule",
    "number",
]

MAX_PORT = 65535


@dataclass(frozen=True)
class Rule:
    """How a numeric flag's text becomes a value: ``integer`` or float, then ``check`` (a
    :class:`FieldChecker` rule, given the checker, the flag's name and the value)."""

    integer: bool
    check: Callable[[FieldChecker, str, Any], None]
    describe: str  # the accepted values, for the tests and the docs

    def parse(self, flag: str, text: str) -> int | float:
        """The value of ``flag`` given as ``text``; :class:`ConfigError` (one line) if bad."""
        checker = FieldChecker()
        value: int | float
        try:
            value = int(text) if self.integer else float(text)
        except ValueError:
            checker.fail(flag, "must be an integer" if self.integer else "must be a number", text)
            raise ConfigError(checker.problems) from None
        self.check(checker, flag, value)
        checker.raise_if_any()
        return value


def _seed(c: FieldChecker, flag: str, v: int) -> None:
    c.integer(flag, v, lo=0)
    if not c.problems:
        c.require(v <= MAX_SEED, flag, f"must be <= {MAX_SEED} (2**63 - 1)", v)


def _port(lo: int) -> Callable[[FieldChecker, str, int], None]:
    def check(c: FieldChecker, flag: str, v: int) -> None:
        c.integer(flag, v, lo=lo)
        if not c.problems:
            c.require(v <= MAX_PORT, flag, f"must be <= {MAX_PORT}", v)

    return check


def _positive(c: FieldChecker, flag: str, v: float) -> None:
    c.positive(flag, v)


def _nonnegative(c: FieldChecker, flag: str, v: float) -> None:
    c.nonnegative(flag, v)


def _count(c: FieldChecker, flag: str, v: int) -> None:
    c.integer(flag, v, lo=1)


def _share(c: FieldChecker, flag: str, v: float) -> None:
    c.between(flag, v, 0.0, 1.0, lo_open=True)


# a run's seed: the scenario's own limits (a non-negative integer up to MAX_SEED)
SEED = Rule(True, _seed, f"an integer in [0, {MAX_SEED}]")
# a port to listen on, 0 = a free one chosen by the system
PORT = Rule(True, _port(0), f"an integer in [0, {MAX_PORT}] (0 = a free port)")
# a port that must be named (a broker's client port)
FIXED_PORT = Rule(True, _port(1), f"an integer in [1, {MAX_PORT}]")
# a length of time, seconds: control interval, target lifetime, duration, timeout
DURATION = Rule(False, _positive, "a finite number > 0")
# a wall-clock time, seconds since the Unix epoch
EPOCH = Rule(False, _nonnegative, "a finite number >= 0")
# a speed-up over real time
SPEED = Rule(False, _positive, "a finite number > 0")
# a replay speed-up, where 0 means as fast as possible
FAST_SPEED = Rule(False, _nonnegative, "a finite number >= 0 (0 = as fast as possible)")
# a count of things: brokers, replicas
COUNT = Rule(True, _count, "an integer >= 1")
# a share of something, (0, 1]
SHARE = Rule(False, _share, "a number in (0, 1]")


def number(p: argparse.ArgumentParser, flag: str, rule: Rule, **kwargs: Any) -> argparse.Action:
    """``p.add_argument(flag, type=…, **kwargs)`` with ``rule`` checking the value under the flag's
    name (module docstring). The rule is kept on the action (``action.rule``) for the tests."""

    def parse(text: str) -> int | float:
        return rule.parse(flag, text)

    parse.__name__ = rule.describe  # what argparse names the type in its own messages
    action = p.add_argument(flag, type=parse, **kwargs)
    action.rule = rule  # type: ignore[attr-defined]
    return action
