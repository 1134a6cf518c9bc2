"""A region's mixed (RMA) replicas: how many, what each may use, and how fast a request's extras
run on one of them.

Pure: no clock, no I/O. The rule of both engines (docs/streaming.md, *The same scenario in both
engines*):

* ``headroom up`` starts :attr:`MixedReplicas.count` mixed replicas per region
  (:data:`DEDICATED_REPLICAS` unless told otherwise), each holding :attr:`MixedReplicas.share` of
  the region's dedicated capacity and of the opportunistic levels its lever may use (the
  ``--share`` of ``headroom server``);
* an optional phase on a replica (RMA's extra candidates) runs on :func:`optional_units`: what
  the request's threads give, but no more than the replica's quota of the opportunistic level
  leaves — a quota enforced at every instant, as a CPU quota is;
* extras that could not finish within the request's optional budget at those units are trimmed
  before any work starts (:func:`headroom.defences.shedding.extras_within_budget`).

The streaming server applies the last two per request, with the optional work already running on
its replica; the simulator, which pools a region's replicas into one queue and meters the level
as a mean, runs an RMA request's extras at :meth:`MixedReplicas.extras_units` (the replica's
quota to itself) and trims them by :meth:`MixedReplicas.extras_that_fit`.
"""

from __future__ import annotations

from dataclasses import dataclass

from headroom.defences.shedding import extras_within_budget
from headroom.kernel.errors import ConfigError

__all__ = ["DEDICATED_REPLICAS", "MixedReplicas", "optional_units"]

# mixed RMA replicas per region (the default of ``headroom up``'s
# ``StackConfig.dedicated_replicas`` and of the simulator's ``SimConfig.mixed_replicas``)
DEDICATED_REPLICAS = 2

# one request's accelerator work is one batch on one device (its optional phase runs on at most
# one device, or on the slice of one the quota leaves)
REQUEST_DEVICES = 1.0


def optional_units(request_units: float, quota: float, in_use: float = 0.0) -> float:
    """The units one optional phase runs on: what the request's threads (or its device) give,
    ``request_units``, but no more than the replica's ``quota`` of the opportunistic level leaves
    beside the optional work ``in_use`` (never below 0)."""
    return max(0.0, min(float(request_units), float(quota) - float(in_use)))


@dataclass(frozen=True, slots=True)
class MixedReplicas:
    """``count`` mixed replicas of one region, sharing its capacity evenly."""

    count: int = DEDICATED_REPLICAS

    def __post_init__(self) -> None:
        if isinstance(self.count, bool) or not isinstance(self.count, int) or self.count < 1:
            raise ConfigError(f"mixed replicas: must be an integer ≥ 1, got {self.count!r}")

    @property
    def share(self) -> float:
        """Each replica's share of the region's dedicated capacity and opportunistic levels."""
        return 1.0 / self.count

    def quota(self, level: float) -> float:
        """One replica's quota of an opportunistic level (units)."""
        return max(0.0, float(level)) * self.share

    def extras_units(
        self, cpu_level: float, acc_level: float, threads: float
    ) -> tuple[float, float]:
        """The CPU and accelerator units one request's extras run on when the optional work of
        its replica is its own: its ``threads`` (cores), or one device, within the replica's
        quota of the region's local CPU level ``cpu_level`` and accelerator level ``acc_level``
        (of the types the base model runs on)."""
        return (
            optional_units(threads, self.quota(cpu_level)),
            optional_units(REQUEST_DEVICES, self.quota(acc_level)),
        )

    def extras_that_fit(
        self,
        extra: int,
        left_ms: float,
        cpu_ms: float,
        acc_ms: float,
        units: tuple[float, float],
    ) -> int:
        """The most of ``extra`` candidates (``cpu_ms`` and ``acc_ms`` of work each, at unit
        speed) whose optional phases finish on ``units`` (:meth:`extras_units`) within
        ``left_ms``, what the request's optional budget leaves after its baseline parts."""
        return extras_within_budget(extra, left_ms, ((cpu_ms, units[0]), (acc_ms, units[1])))
