"""Plain data that crosses the boundary of the pure control cores.

The simulator and the Faust app both build a :class:`RegionObservation` per region per control
interval and hand it to :class:`headroom.controllers.plane.ControlPlane`, which returns
:class:`RegionTargets` (the body of one ``headroom.targets`` message). Nothing here does I/O or
reads a clock: ``now`` is always given (the record's event time where there is one).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

# One type for a capacity level everywhere (the book that decides which level is in force lives
# beside it, in headroom.defences.capacity); re-exported here for the control cores' callers.
from headroom.defences.capacity import CapacityLevel as CapacityLevel
from headroom.defences.capacity import Pool as Pool
from headroom.defences.capacity import Resource as Resource

Path = Literal["base", "rma", "sbm"]
Arm = Literal["treatment", "control"]

LEVER_RMA = "rma"
LEVER_SBM = "sbm"
LEVER_PRECOMPUTE = "precompute"


@dataclass(frozen=True, slots=True)
class ArmStats:
    """Sums of one (segment, lever, arm) over some windows: they add exactly (docs/messages.md)."""

    n: int = 0
    value_sum: float = 0.0
    value_sq_sum: float = 0.0
    cpu_ms: float = 0.0
    accelerator_ms: float = 0.0
    # the value signal's sums (Σx, Σx², Σxy; x = the request's value before ranking) where the
    # writer has them (the simulator): the estimator's regression term (kernel/estimate.py)
    signal_sum: float = 0.0
    signal_sq_sum: float = 0.0
    signal_value_sum: float = 0.0

    def __add__(self, other: ArmStats) -> ArmStats:
        return ArmStats(
            self.n + other.n,
            self.value_sum + other.value_sum,
            self.value_sq_sum + other.value_sq_sum,
            self.cpu_ms + other.cpu_ms,
            self.accelerator_ms + other.accelerator_ms,
            self.signal_sum + other.signal_sum,
            self.signal_sq_sum + other.signal_sq_sum,
            self.signal_value_sum + other.signal_value_sum,
        )


# (segment, lever, arm) -> sums received since the previous control step. The segment part may
# name a *stratum* of a segment, ``"premium#3"`` (:func:`stratum_key`): value signals reported
# per (segment, value bin) let the holdout estimator post-stratify on the request's value
# signal, which is known before ranking in both arms (docs/controllers.md, "Value book").
ValueKey = tuple[str, str, str]

STRATUM_SEP = "#"


def stratum_key(segment: str, stratum: int | None) -> str:
    """The value-book segment key of ``segment``'s stratum (the segment itself if None)."""
    return segment if stratum is None else f"{segment}{STRATUM_SEP}{int(stratum)}"


def segment_of(key: str) -> str:
    """The segment a value-book key belongs to (inverse of :func:`stratum_key`)."""
    return key.split(STRATUM_SEP, 1)[0]


# The SLO lets 1 % of a window's requests run over it; the strong model's path may take this
# share of that tail, the rest is left to the other paths (RMA's loop holds the whole path's p99
# at its setpoint below the SLO).
STRONG_TAIL_SHARE = 0.5
SLO_QUANTILE = 0.99
STRONG_TAIL_FLOOR = 0.9  # never deeper into the strong path's own tail than its p90


def strong_tail_quantile(requests: float, strong_requests: float) -> float:
    """The quantile of the strong path's latency the SBM coverage loop holds at its target.

    Requests the strong path serves over the target are a share ``strong_requests / requests``
    of all requests times their own share over it; holding its ``q``-quantile at the target
    keeps them at ``STRONG_TAIL_SHARE`` of the 1 % the SLO allows when
    ``q = 1 − STRONG_TAIL_SHARE × (1 − SLO_QUANTILE) × requests / strong_requests``. So the
    fewer requests the strong path serves, the deeper into its own tail the target may sit
    (a strong path serving 14 % of the requests: its p96), never below its p90; its p99 when it
    serves nothing (no counts to weigh)."""
    if not (strong_requests > 0.0 and requests >= strong_requests):
        return SLO_QUANTILE
    q = 1.0 - STRONG_TAIL_SHARE * (1.0 - SLO_QUANTILE) * requests / strong_requests
    return max(q, STRONG_TAIL_FLOOR)


@dataclass(frozen=True, slots=True)
class RegionObservation:
    """What the controllers know about one region at one control step."""

    region: str
    now: float
    window_s: float  # length of the control window these measurements cover
    # p99 of the ranking path over the window, from merged sketches; None = no samples.
    # Keys: "all" (every request), "base", "rma", "sbm".
    p99_ms: Mapping[str, float | None]
    request_rps: float
    eligible_rps: float
    segment_rps: Mapping[str, float]  # request rate per segment (eligible or not)
    capacity: tuple[CapacityLevel, ...]
    value: Mapping[ValueKey, ArmStats] = field(default_factory=dict)  # new sums this window
    observed_coverage: float | None = None  # share of eligible requests served by the strong model
    # seconds since the newest value signal arrived (None = never): stale signals trigger fallback
    value_age_s: float | None = None
    # the strong path's latency at :func:`strong_tail_quantile` of the window's counts (the SBM
    # coverage loop's measurement); None: not measured (the loop reads ``p99_ms["sbm"]``)
    sbm_tail_ms: float | None = None


@dataclass(frozen=True, slots=True)
class LeverShare:
    """One lever's slice of a region's opportunistic capacity, as the allocator decided it."""

    lever: str
    cpu: float  # cores
    accelerator: float  # device equivalents
    hardware: str | None = None  # accelerator type this slice runs on
    value_per_unit_lcb: float = 0.0  # the lower-confidence marginal value that justified it


@dataclass(frozen=True, slots=True)
class RegionTargets:
    """One ``headroom.targets`` message body (docs/messages.md), every field already clamped."""

    region: str
    ts: float
    epoch: int
    ttl_s: float
    rma_candidates: int
    rma_base: int
    rma_max: int
    sbm_coverage: float
    sbm_segments: Mapping[str, float]
    budget_cpu: float
    budget_accelerator: float
    reason: str
    allocation: tuple[LeverShare, ...] = ()
    # precompute: jobs per second the precompute workers may run (0 when the lever is off)
    precompute_jobs_per_s: float = 0.0
    fallback: str | None = None  # why the allocator fell back, if it did
    # per segment, extra candidates per value bin, lowest first (``targets.rma.levels``; empty:
    # the plan's one block of ``max − base`` extras to the highest values)
    rma_levels: Mapping[str, tuple[int, ...]] = field(default_factory=dict)
    # the router's exploration floor (``targets.sbm.explore``; 0: every share value-ranked)
    sbm_explore: float = 0.0
