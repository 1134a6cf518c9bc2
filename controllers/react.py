"""When a capacity change warrants a control step between the regular ticks (both engines).

The control plane steps every region at ``t0 + k × interval_s``. A capacity *reclaim* needs no
central step to be safe (servers and clients shed within milliseconds), but a *grant* — or a
rise, or a pool that appears — stays unused until a step assigns it. :func:`reacts` is the one
rule both engines ask on every capacity level they record: a step now, out of the clock, when

* the change is **material**: for some opportunistic pool the region's levers may use (local
  pools; remote ones only when the precompute lever is on), the level moved by at least
  ``min_change_share`` of the region's opportunistic units of that resource (before or after the
  change, whichever is larger), or the pool appeared (0 → more) or disappeared (→ 0); and
* it is **not too soon**: at least ``min_gap_share × interval_s`` after the region's previous
  step (regular or extra), and at least as long before the next regular tick (which will see the
  change anyway).

Pure: no clock (the caller passes ``now``, the previous step's time and the phase of its
clock), no I/O. Thresholds: :class:`ReactSettings` (``control.react`` of
:class:`headroom.controllers.config.ControlConfig`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

from headroom.controllers.types import CapacityLevel
from headroom.kernel.checks import FieldChecker

__all__ = ["ReactSettings", "material_change", "reacts", "spaced"]

_EPS = 1e-9


@dataclass(frozen=True, slots=True)
class ReactSettings:
    """Out-of-tick steps on a capacity change (module docstring). ``enabled`` False: regular
    ticks only."""

    enabled: bool = True
    # a pool's level moving by this share of the region's opportunistic units of its resource
    # is material (a tenth: below it, what the allocator would move is within the noise of one
    # interval's value estimate, and it waits for the tick)
    min_change_share: float = 0.10
    # no two steps closer than this share of the interval (at most three extra steps an
    # interval, and each sees at least a quarter interval since the previous step), nor an
    # extra step this close before a regular tick
    min_gap_share: float = 0.25

    def validate(self, c: FieldChecker) -> None:
        if not isinstance(self.enabled, bool):
            c.fail("enabled", "must be true or false", self.enabled)
        c.between("min_change_share", self.min_change_share, 0.0, 1.0, lo_open=True)
        c.between("min_gap_share", self.min_gap_share, 0.0, 1.0, lo_open=True)


def _usable(level: CapacityLevel, remote_ok: bool) -> bool:
    return level.pool == "opportunistic" and (remote_ok or not level.remote)


def _units(x: float) -> float:
    return x if math.isfinite(x) and x > 0.0 else 0.0


def material_change(
    before: Iterable[CapacityLevel],
    after: Iterable[CapacityLevel],
    min_change_share: float,
    remote_ok: bool = False,
) -> bool:
    """Whether the region's opportunistic levels moved materially from ``before`` to ``after``
    (module docstring). Levels are matched by (resource, hardware, remote); a pool missing from
    one side counts as zero units there. Dedicated levels are ignored."""
    b: dict[tuple[str, str, bool], float] = {}
    a: dict[tuple[str, str, bool], float] = {}
    for side, levels in ((b, before), (a, after)):
        for lv in levels:
            if _usable(lv, remote_ok):
                key = (lv.resource, lv.hardware, lv.remote)
                side[key] = side.get(key, 0.0) + _units(lv.units)
    totals: dict[str, float] = {}
    for side in (b, a):
        per: dict[str, float] = {}
        for (resource, _, _), u in side.items():
            per[resource] = per.get(resource, 0.0) + u
        for resource, u in per.items():
            totals[resource] = max(totals.get(resource, 0.0), u)
    for pool in set(a) | set(b):
        x, y = b.get(pool, 0.0), a.get(pool, 0.0)
        if (x > _EPS) != (y > _EPS):
            return True  # a pool appeared or disappeared
        if abs(y - x) > _EPS and abs(y - x) >= min_change_share * totals.get(pool[0], 0.0) - _EPS:
            return True
    return False


def spaced(
    now: float, last_step: float | None, interval_s: float, min_gap_share: float, t0: float = 0.0
) -> bool:
    """An extra step at ``now`` keeps ``min_gap_share × interval_s`` from the previous step
    (``last_step``; None: none yet) and from the next regular tick at ``t0 + k × interval_s``
    (a tick at ``now`` itself is the regular step)."""
    if not (math.isfinite(now) and interval_s > 0.0 and math.isfinite(interval_s)):
        return False
    gap = min_gap_share * interval_s
    if last_step is not None and now - last_step < gap - _EPS:
        return False
    phase = (now - t0) / interval_s
    k_next = math.floor(phase + _EPS) + 1  # the first tick strictly after now (up to rounding)
    if abs(phase - round(phase)) * interval_s <= _EPS:
        return False  # now is a tick
    return k_next * interval_s + t0 - now >= gap - _EPS


def reacts(
    settings: ReactSettings,
    interval_s: float,
    now: float,
    last_step: float | None,
    before: Iterable[CapacityLevel],
    after: Iterable[CapacityLevel],
    *,
    remote_ok: bool = False,
    t0: float = 0.0,
) -> bool:
    """The rule (module docstring): an extra control step for the region at ``now``."""
    if not settings.enabled:
        return False
    if not spaced(now, last_step, interval_s, settings.min_gap_share, t0):
        return False
    return material_change(before, after, settings.min_change_share, remote_ok)
