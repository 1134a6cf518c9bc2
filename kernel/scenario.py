"""The scenario model (docs/scenarios.md): typed, frozen, validated once.

Field names mirror the YAML exactly, so ``scenario.regions[0].traffic.rps`` is
``regions[0].traffic.rps`` in the file and in every error message. Loading and validation live
in :mod:`headroom.kernel.scenario_load` (``load_scenario``); this module only declares the shapes,
so every component (controller, workers, simulator) can import it without pulling in YAML.

Traces are resolved at load time: a ``csv:`` trace becomes the same tuple of ``(t_s, value)``
points as an inline ``trace:``, so nothing downstream reads files.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

Resource = Literal["cpu", "accelerator"]
EventKind = Literal[
    "preempt",
    "grant",
    "surge",
    "control_outage",
    "kill",
    "pause",
    "stall",
    "broker_restart",
    "capacity_silence",
]
# The fault kinds among the event kinds (docs/scenarios.md, *Fault events*), and the processes a
# kill or pause acts on (a stall: the controller's consumer only).
FAULT_KINDS = ("kill", "pause", "stall", "broker_restart", "capacity_silence")
FaultProcess = Literal["controller", "server", "client", "precompute", "feed"]
FAULT_PROCESSES = ("controller", "server", "client", "precompute", "feed")
# a surge on the streaming stack may multiply a region's traffic at most this much
MAX_SURGE_FACTOR = 10.0

# The largest seed a scenario may give, in its file or as ``--seed`` (the loader, the schema and
# the command line's flag check share it): numpy's seed sequences take any non-negative integer,
# but the event log encodes the seed as a signed 64-bit integer.
MAX_SEED = 2**63 - 1
Point = tuple[float, float]


@dataclass(frozen=True, slots=True)
class Slo:
    p99_ms: float
    window_s: float


@dataclass(frozen=True, slots=True)
class World:
    ads: int
    dim: int
    base_candidates: int
    max_candidates: int
    holdout: float
    # Optional precompute fields (docs/scenarios.md): None = no precompute possible.
    drift_per_h: float | None = None
    users: int | None = None


@dataclass(frozen=True, slots=True)
class ModelSpec:
    cpu_ms_per_candidate: float
    accelerator_ms_per_candidate: float
    hardware: tuple[str, ...]
    load_s: float = 0.0


@dataclass(frozen=True, slots=True)
class Models:
    base: ModelSpec
    strong: ModelSpec


@dataclass(frozen=True, slots=True)
class ValueDist:
    """Log-normal request value: value = exp(N(ln(mean) - sigma²/2, sigma)) so E[value] = mean.

    With an optional recorded histogram (``csv: FILE``, columns ``value,requests``; what
    ``scenario from-recording`` writes) the values are drawn from it instead: a row stands for
    ``requests`` requests valued in the grid bin that holds ``value`` — bin 0 is
    ``[0, VALUE_GRID_MIN)`` (uniform inside), bin ``k ≥ 1`` is
    ``[VALUE_GRID_MIN·r^(k−1), VALUE_GRID_MIN·r^k)`` with ``r`` = :data:`VALUE_BIN_RATIO`
    (log-uniform inside); ``mean`` and ``sigma`` are then its log-normal summary.
    """

    mean: float
    sigma: float
    csv: str | None = None
    histogram: tuple[Point, ...] | None = None  # (value, requests), increasing values


# The grid of recorded value histograms: a 0.5 % log grid, bin ratio (1 + α)/(1 − α), α = 0.005,
# above VALUE_GRID_MIN (values below it share bin 0 with the zeros).
VALUE_GRID_ALPHA = 0.005
VALUE_BIN_RATIO = (1.0 + VALUE_GRID_ALPHA) / (1.0 - VALUE_GRID_ALPHA)
VALUE_GRID_MIN = 1e-9


@dataclass(frozen=True, slots=True)
class Segment:
    name: str
    share: float
    value: ValueDist
    base_error: float
    strong_error: float
    return_rate_per_h: float | None = None


@dataclass(frozen=True, slots=True)
class Dedicated:
    cpu: float
    accelerator: float
    hardware: str


@dataclass(frozen=True, slots=True)
class Traffic:
    """Either synthetic (rps, daily_amplitude, …) or a trace (``csv``, resolved into ``trace``)."""

    rps: float | None = None
    daily_amplitude: float = 0.0
    peak_s: float = 0.0
    period_s: float = 86400.0
    noise: float = 0.0
    csv: str | None = None
    trace: tuple[Point, ...] | None = None  # (t_s, rps), linear between rows
    # optional recorded arrivals (``arrivals: FILE``, columns t_s,requests): the requests arriving
    # in each second [t_s, t_s + 1); seconds without a row have none. When given, the arrivals are
    # these counts (scaled by noise and surges) instead of Poisson draws around the rate.
    arrivals_csv: str | None = None
    arrivals: tuple[Point, ...] | None = None


@dataclass(frozen=True, slots=True)
class Opportunistic:
    resource: Resource
    hardware: str
    trace: tuple[Point, ...]  # (t_s, units), piecewise constant
    expires_in_s: float | None = None
    remote: bool = False
    csv: str | None = None


@dataclass(frozen=True, slots=True)
class Region:
    name: str
    dedicated: Dedicated
    traffic: Traffic
    opportunistic: tuple[Opportunistic, ...] = ()


@dataclass(frozen=True, slots=True)
class ScenarioEvent:
    at_s: float
    kind: EventKind
    region: str | None = None  # None for control_outage = every region
    resource: Resource | None = None
    hardware: str | None = None
    units: float | None = None
    factor: float | None = None
    duration_s: float | None = None
    remote: bool = False  # preempt/grant: the event applies to the region's remote pool
    # fault events (docs/scenarios.md, *Fault events*)
    process: FaultProcess | None = None  # kill, pause, stall: which process
    pool: str | None = None  # kill, pause of a server: "dedicated" or "opportunistic"
    restart_after_s: float | None = None  # kill: restarted this long after
    down_s: float | None = None  # broker_restart: the broker is down this long
    broker: int | None = None  # broker_restart: which broker of a local cluster (0-based)
    # kill, pause: which of several processes of the kind (up --controllers N,
    # --clients-per-region M, a server pool's replicas), 0-based; None: the first
    index: int | None = None

    @property
    def is_fault(self) -> bool:
        return self.kind in FAULT_KINDS

    @property
    def fault_span_s(self) -> float:
        """How long the fault lasts (scenario seconds): the kill until the restart, the pause,
        the stall, the broker's down time, the silence; 0 for events that are not faults."""
        if self.kind == "kill":
            return self.restart_after_s or 0.0
        if self.kind == "broker_restart":
            return self.down_s or 0.0
        if self.kind in ("pause", "stall", "capacity_silence"):
            return self.duration_s or 0.0
        return 0.0


# The central controllers' defaults (docs/scenarios.md, ``control``): one step a minute, and a
# target lives three steps, so one lost or late message never makes the clients fall back.
DEFAULT_INTERVAL_S = 60.0
TTL_INTERVALS = 3.0


@dataclass(frozen=True, slots=True)
class Control:
    """The central controllers' clock (optional ``control:`` section; absent = the defaults).

    Both engines run the control plane every ``interval_s`` seconds of scenario time, and every
    target lives ``ttl_s`` (default ``TTL_INTERVALS`` × ``interval_s``) before the clients fall
    back to the baseline. ``ttl_s`` is None when the file does not give it."""

    interval_s: float = DEFAULT_INTERVAL_S
    ttl_s: float | None = None

    @property
    def target_ttl_s(self) -> float:
        """The target lifetime in force: ``ttl_s`` or ``TTL_INTERVALS`` × ``interval_s``."""
        return self.ttl_s if self.ttl_s is not None else TTL_INTERVALS * self.interval_s

    def with_overrides(
        self, interval_s: float | None = None, ttl_s: float | None = None
    ) -> Control:
        """The settings with command-line values in place of the file's (None: keep the file's).
        A new interval without a ttl keeps the file's explicit ttl, else scales the default."""
        return Control(
            interval_s=self.interval_s if interval_s is None else interval_s,
            ttl_s=self.ttl_s if ttl_s is None else ttl_s,
        )


@dataclass(frozen=True, slots=True)
class Scenario:
    name: str
    seed: int
    duration_s: float
    slo: Slo
    world: World
    models: Models
    segments: tuple[Segment, ...]
    regions: tuple[Region, ...]
    events: tuple[ScenarioEvent, ...] = ()
    control: Control = Control()
    source: str | None = field(default=None, compare=False)  # the file it came from
    # share of requests eligible for the strong model (None: not given, the engines' default 1)
    eligible_share: float | None = None

    @property
    def precompute_enabled(self) -> bool:
        """True when the optional precompute fields are present (docs/scenarios.md)."""
        return (
            self.world.drift_per_h is not None
            and self.world.users is not None
            and any(s.return_rate_per_h is not None for s in self.segments)
        )

    def segment(self, name: str) -> Segment:
        for s in self.segments:
            if s.name == name:
                return s
        raise KeyError(name)

    def region(self, name: str) -> Region:
        for r in self.regions:
            if r.name == name:
                return r
        raise KeyError(name)
