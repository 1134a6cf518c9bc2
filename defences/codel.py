"""CoDel's drop times in closed form.

Under sustained overload CoDel (Nichols & Jacobson, "Controlling Queue Delay", ACM Queue 2012)
drops at ``t_c = t_1 + interval·(H(c) − 1)`` with ``H(c) = Σ_{k≤c} k^(−1/2)``.
:func:`codel_catch_up` finds the next drop after ``now`` from the Euler–Maclaurin expansion of
``H`` instead of stepping through every drop in between, so the server shedder's ``observe`` costs
O(1) however long an overload lasts; :func:`codel_catch_up_stepping` is the step-by-step reference
it is tested against.
"""

from __future__ import annotations

import math
from typing import NamedTuple

__all__ = ["CODEL_STEPS", "CodelCatchUp", "codel_catch_up", "codel_catch_up_stepping"]


CODEL_STEPS = 4  # drop times stepped one by one per observe() before the closed form takes over
_ZETA_HALF = -1.4603545088095868  # ζ(1/2), the constant of the Euler–Maclaurin expansion of H
_H_TABLE_SIZE = 64  # H(c) tabulated below this; the expansion is exact to float precision above


def _h_table(size: int) -> list[float]:
    table = [0.0]
    for k in range(1, size):
        table.append(table[-1] + 1.0 / math.sqrt(k))
    return table


_H_TABLE = _h_table(_H_TABLE_SIZE)


def _h(c: int) -> float:
    """``H(c) = Σ_{k=1..c} k^(−1/2)``: a table for small ``c``, else the Euler–Maclaurin expansion
    ``ζ(1/2) + 2√c + 1/(2√c) − 1/(24 c^{3/2}) + 1/(384 c^{7/2}) − 1/(1024 c^{11/2})`` (Bernoulli
    terms B₂, B₄, B₆; the next term is below 10⁻¹⁸ at c = 64)."""
    if c < _H_TABLE_SIZE:
        return _H_TABLE[c]
    r = math.sqrt(c)
    inv = 1.0 / c
    return (
        _ZETA_HALF + 2.0 * r + 0.5 / r
        - inv / (24.0 * r) + inv**3 / (384.0 * r) - inv**5 / (1024.0 * r)
    )  # fmt: skip


class CodelCatchUp(NamedTuple):
    """Where the CoDel control law stands after passing every drop time ``≤ now``."""

    drops: int  # drops so far in this dropping episode (the shedder's CoDel count)
    drop_next: float  # the next drop time, > now
    steps: int  # loop iterations this took (a cost counter; bounded by a small constant)


def codel_catch_up(count: int, drop_next: float, now: float, interval_s: float) -> CodelCatchUp:
    """Pass every CoDel drop time ``≤ now`` in O(1), from state ``(count, drop_next)``.

    CoDel's control law schedules drop ``c + 1`` at ``interval / √(c + 1)`` after drop ``c``, so
    ``drop_next`` after ``c′`` drops is ``drop_next + interval·(H(c′) − H(count))``. The answer is
    the smallest ``c′ > count`` that puts it after ``now`` (or ``count`` itself when
    ``now < drop_next``). Inverting ``H(c) ≈ ζ(1/2) + 2u + 1/(2u)``, ``u = √c``, gives ``c′`` to
    within one; a few exact comparisons settle it. Equal to :func:`codel_catch_up_stepping` up to
    floating-point rounding (the stepping loop accumulates one rounding error per drop time).
    """
    if not now >= drop_next:
        return CodelCatchUp(count, drop_next, 0)
    h0 = _h(count)
    y = h0 + (now - drop_next) / interval_s  # find the smallest c′ > count with H(c′) > y
    a = y - _ZETA_HALF
    u = (a + math.sqrt(max(a * a - 4.0, 0.0))) / 4.0  # 2u + 1/(2u) = a
    guess = int(u * u) if u * u < 9.0e18 else 9 * 10**18
    c = max(count + 1, guess)
    steps = 1
    while _h(c) <= y:
        c += 1
        steps += 1
    while c - 1 > count and _h(c - 1) > y:
        c -= 1
        steps += 1
    return CodelCatchUp(c, drop_next + interval_s * (_h(c) - h0), steps)


def codel_catch_up_stepping(
    count: int, drop_next: float, now: float, interval_s: float
) -> CodelCatchUp:
    """The textbook loop :func:`codel_catch_up` replaces: one iteration per drop time (its cost
    grows with the square of the time spent dropping). Kept as the reference for tests."""
    steps = 0
    while now >= drop_next:
        count += 1
        drop_next += interval_s / math.sqrt(count)
        steps += 1
    return CodelCatchUp(count, drop_next, steps)
