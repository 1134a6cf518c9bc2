"""The ranking server worker (``headroom server --region R --pool P``).

One process is one ranking replica of a region. It does the real ranking compute of the world
(:mod:`headroom.world.ranking`: retrieval over the corpus, the base or strong model's forward
pass), holds CPU and accelerator *slots* sized from its pool's capacity, runs the server-side
shedding core (:mod:`headroom.defences.shedding`) on every request and at once on a capacity drop,
answers every request with its health (overload flag, queueing delay), publishes latency sketches
per path each second to ``headroom.latency`` and decisions to ``headroom.events``.

Two kinds of replica (docs/architecture.md, *Isolation*):

* ``--pool dedicated`` — a **mixed RMA replica**. Its slots are its share of the region's
  dedicated capacity (scenario ``regions[].dedicated``) *plus* its share of the opportunistic
  levels the base model can use (CPU, and accelerators of a type in ``models.base.hardware``).
  It serves baseline requests and RMA requests (``base + extra`` candidates, base model). The
  extra candidates are optional work: the shedding core admits them against the opportunistic
  level (token buckets, value threshold), and a capacity drop cuts the extra phase of requests
  in flight (logical isolation: a reclaim removes the extra search, it is never pushed onto the
  dedicated slots).
* ``--pool opportunistic`` — a **strong-model (SBM) replica**. Its slots are its share of the
  opportunistic CPU and of the accelerators of a type in ``models.strong.hardware``; it serves
  only the strong model, after ``models.strong.load_s`` of continuous capacity (the model load).
  Everything it does is optional: a refused request comes back ``downgraded`` and the client
  re-runs it on a dedicated replica; a preemption cuts the requests in flight the same way.

Slots — the emulated hardware
-----------------------------
This machine has a couple of cores, not a fleet's cores and accelerators. A resource with ``u``
units has ``k = ceil(u)`` slots of speed ``u / k`` (so 2.5 devices are 3 slots at 0.83). A
request holds up to ``cpu_parallelism`` CPU slots for its CPU work (the threads scoring its
candidates in parallel), then one accelerator slot for its accelerator work (one batch), each
stage ``candidates × ms_per_candidate ÷ (slots × speed)`` long (docs/scenarios.md costs; the real
numpy compute of the ranking runs inside the CPU stage and counts toward its time). Waiting for
slots is the queueing delay (``queue_ms``) that CoDel watches and every response reports. The
optional part of a stage (RMA's extra candidates, or the whole strong-model request) is a separate
*phase* that can be cut at any instant: cutting it releases the slots at once. An optional phase
gets ``min(slots × speed, opportunistic level − optional units in use)`` units and lasts
accordingly (it time-shares what is left of the level), so optional work never occupies more than
the opportunistic level, even when the level is a fraction of a slot; it keeps only the slots
those units need and hands the others back when it starts.

Baseline first: the slot pools serve baseline work before optional work. A mixed request runs its
baseline part of a stage, hands those slots back, and queues its extras as a separate optional
phase at low priority (:meth:`SlotPool.acquire` ``low``: granted only while no baseline part
waits); extras still waiting when the request's optional budget (``budget_ms``) runs out are
dropped and the baseline answer goes back. Extras that could not *finish* within the budget at the
units the opportunistic level leaves them are trimmed before any work starts
(:func:`~headroom.defences.shedding.extras_within_budget`): a request never waits for work that
would be thrown away at its deadline. So a request without optional work never waits
behind optional work that has not started, and optional work never occupies more than the
opportunistic level: the baseline keeps the dedicated capacity it has under static. The
simulator models the same rule (docs/simulator.md, *Baseline first*).

Admission
---------
Optional work is held to ``level × admitted share`` *on average*, not to the whole opportunistic
level: the admitted share is :func:`headroom.defences.admission.admitted_share` of the stage the
work queues in — the admissible utilisation of an ``M/G/c`` stage for a mean-wait budget — the
same function, with the same inputs derived from the scenario, that the simulator's servers use
(:class:`ReplicaAdmission`, docs/shedding.md *Admission*). The shedding core is handed that
admitted level: its value threshold and token buckets admit optional work at that rate, so over
any stretch of time optional work keeps the level at most that busy (plus one bucket). The work it
admits runs at full speed (a phase is not stretched to the admitted level: that would hold slots
longer and queue baseline work behind them — the utilisation is a long-run mean, as in the
queueing model). Slots are sized from the whole level: the capacity is there.

Release after a reclaim
-----------------------
On a capacity message that lowers a level this replica uses, the server, in the same event-loop
turn: updates the shedding core (:meth:`ServerShedder.on_capacity`: the very next decision sees
the new level), resizes the slot pools, asks :meth:`ServerShedder.trim_inflight` which optional
phases to cut (lowest value per unit of occupied capacity first) and cuts them; then it waits
until the optional work still occupying slots fits the new level. ``release_ms`` is that time on
the server's own monotonic clock, from the moment the message was handled; ``delivery_ms`` (the
message's ``ts`` to that moment, wall clock) is reported beside it. Both go into an
``optional.released`` event. The capacity feed writes the one ``capacity.reclaimed`` event per
reclaim (every replica sees the same message).

Latency and windows
-------------------
Each request is timed once, on the path it was served on: ``base`` (no extra candidates),
``rma`` (some extra candidates ranked), ``sbm`` (served by the strong model). A downgraded or cut
strong request is not timed here: the dedicated replica that serves it times it. Every
``latency_interval_s`` one ``headroom.latency`` message per path with requests (a DDSketch of the
server-side times, the count, the current in-flight count and queueing delay). Every SLO window
(scenario time) one ``window`` event with the opportunistic unit-seconds its optional work used
(``used_unit_s``); requests, value and latency of the window are the clients' lines.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from itertools import count
from typing import Any, Literal

import numpy as np

from headroom.analysis.events import window_event
from headroom.controllers.config import ControlConfig
from headroom.controllers.levers import CostModel
from headroom.defences.admission import admitted_share
from headroom.defences.capacity import CapacityBook, CapacityLevel
from headroom.defences.replicas import optional_units
from headroom.defences.shedding import (
    Decision,
    InflightWork,
    OptionalCapacity,
    OptionalWork,
    ServerShedConfig,
    ServerShedder,
    ShedTransition,
    extras_within_budget,
)
from headroom.kernel import seeds
from headroom.kernel.checks import FieldChecker
from headroom.kernel.errors import ConfigError, HeadroomError
from headroom.kernel.scenario import Scenario
from headroom.kernel.sketch import LatencySketch
from headroom.streams import messages
from headroom.streams.consume import ConsumerLoop, LoopConfig, Received
from headroom.streams.kafka import KafkaTarget, make_consumer, make_producer, started
from headroom.workers.metrics import Metrics
from headroom.workers.service import Service
from headroom.workers.wire import Health, RankRequest, RankResponse, serve
from headroom.world.ranking import Model, RankingWorld

__all__ = [
    "RankingServer",
    "ReplicaAdmission",
    "ReplicaBook",
    "ReplicaCapacity",
    "ServerConfig",
    "SlotPool",
]

Pool = Literal["dedicated", "opportunistic"]
_EPS = 1e-9
_REQUESTS_PER_BUCKET = 2  # the shedding buckets hold at least this many requests' optional work
_MAX_RELEASE_WAIT_S = 2.0  # a release that takes longer than this is reported as this (a bug)


# ------------------------------------------------------------------------------------------------
# Configuration
# ------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ServerConfig:
    """One replica's settings; validated on construction (errors name the flag)."""

    region: str
    pool: Pool
    replica: str
    share: float = 1.0  # share of the region's pool capacity this replica holds
    host: str = "127.0.0.1"
    port: int = 0
    t0: float = 0.0  # wall-clock epoch of scenario time 0
    speed: float = 1.0  # scenario seconds per wall second
    latency_interval_s: float = 1.0  # one headroom.latency message per path this often
    # Threads that score one request's candidates in parallel on the CPU stage: a request takes
    # up to this many CPU slots at once. 4 is the simulator's model of a ranking server
    # (headroom.sim.latency.LatencyConfig.cpu_parallelism), so both engines give a request the same
    # service time. The accelerator stage takes one device per request (one batch).
    cpu_parallelism: int = 4
    # Variability of a service time: each request's emulated stage times are multiplied by one
    # log-normal factor J with mean 1 and this coefficient of variation (real forward passes and
    # feature look-ups vary). 0.25 is the simulator's model
    # (headroom.sim.latency.LatencyConfig.service_cv); the default is exact (0): with the
    # simulator's 0.25 on top of a shared 2-core host's own variance, the stack's baseline p99
    # broke its SLO in 2 of 3 runs of tests/integration/test_stack_up.py.
    service_cv: float = 0.0
    policy: str = "headroom"  # the policy name written on events
    shed: ServerShedConfig = field(default_factory=ServerShedConfig)

    def __post_init__(self) -> None:
        c = FieldChecker()
        c.require(
            self.pool in ("dedicated", "opportunistic"),
            "--pool",
            "must be dedicated or opportunistic",
            self.pool,
        )
        c.between("--share", self.share, 0.0, 1.0, lo_open=True)
        c.integer("--port", self.port, 0)
        c.at_most("--port", self.port, 65535)
        c.clock(self.t0, self.speed)
        c.nonnegative("service_cv", self.service_cv)
        c.integer("cpu_parallelism", self.cpu_parallelism, 1)
        c.positive("latency_interval_s", self.latency_interval_s)
        c.require(bool(self.replica), "--replica", "must not be empty", self.replica)
        c.raise_if_any()

    @property
    def lever(self) -> str:
        return "rma" if self.pool == "dedicated" else "sbm"


# ------------------------------------------------------------------------------------------------
# Capacity: levels in, this replica's slots and optional capacity out (pure)
# ------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ReplicaCapacity:
    """What one replica may use now: slot units per resource and the opportunistic part.

    ``slots_*`` size the slot pools (dedicated + opportunistic for a mixed RMA replica; the
    opportunistic level alone for a strong-model replica); ``level`` is this replica's share of the
    opportunistic levels its lever may use; ``optional`` is the most optional work may occupy —
    ``level`` × the admitted share of its stage (:class:`ReplicaAdmission`), the shedding core's
    level."""

    slots_cpu: float
    slots_accelerator: float
    level: OptionalCapacity
    optional: OptionalCapacity


@dataclass(frozen=True, slots=True)
class ReplicaAdmission:
    """The inputs of the admission rule (:func:`headroom.defences.admission.admitted_share`) for
    this replica's two stages, derived from the scenario as the simulator derives them
    (``headroom.sim.policies.HeadroomRegion``; docs/shedding.md, *Admission*).

    A stage is the replica's slots of one resource: ``slots / cpu_parallelism`` servers on the
    CPU (a request takes that many threads), ``slots`` on the accelerator. Mixed (RMA) replicas:
    a baseline request's service time and a mean-wait budget of ``pid.wait_budget_share`` × the
    setpoint, never above ``1 − allocator.safety_margin``. Strong-model replicas: a strong
    request's service time and ``coverage.wait_budget_share`` × the setpoint (the rule the
    coverage controller sizes coverage by)."""

    pool: Pool
    cpu_parallelism: int
    cpu_service_ms: float  # one request's CPU work, all threads together
    accelerator_service_ms: float
    wait_budget_ms: float
    ceiling: float
    # the most optional work one request asks of one resource: a strong request's, or the
    # extra candidates up to world.max_candidates (the buckets hold at least two of it)
    request_ms: float

    @classmethod
    def from_scenario(
        cls, scenario: Scenario, pool: Pool, cpu_parallelism: int
    ) -> ReplicaAdmission:
        cfg = ControlConfig.from_scenario(scenario)
        costs = cfg.costs
        n0 = scenario.world.base_candidates
        if pool == "dedicated":
            extra = max(scenario.world.max_candidates - n0, 0)
            return cls(
                pool,
                cpu_parallelism,
                n0 * costs.base_cpu_ms,
                n0 * costs.base_accelerator_ms,
                cfg.pid.wait_budget_share * cfg.setpoint_ms,
                1.0 - cfg.allocator.safety_margin,
                extra * max(costs.base_cpu_ms, costs.base_accelerator_ms),
            )
        cpu_ms = costs.request(n0, "strong").cpu_s * 1000.0
        acc_ms = costs.sbm_per_request.accelerator_s * 1000.0
        return cls(
            pool,
            cpu_parallelism,
            cpu_ms,
            acc_ms,
            cfg.coverage.wait_budget_share * cfg.setpoint_ms,
            1.0,
            max(cpu_ms, acc_ms),
        )

    def shares(self, slots_cpu: float, slots_accelerator: float) -> tuple[float, float]:
        """The admitted share of the CPU and of the accelerator stage of these slots."""
        par = self.cpu_parallelism
        k_cpu = admitted_share(
            slots_cpu / par, self.cpu_service_ms / par, self.wait_budget_ms, ceiling=self.ceiling
        )
        k_acc = admitted_share(
            slots_accelerator,
            self.accelerator_service_ms,
            self.wait_budget_ms,
            ceiling=self.ceiling,
        )
        return k_cpu, k_acc


class ReplicaBook:
    """The region's capacity levels (:class:`headroom.defences.capacity.CapacityBook`: newest
    ``ts`` wins, ties to the lower level, an opportunistic level lapses ``expires_in_s`` after its
    ``ts``), and what a replica of a given pool and share may use from them. Pure: time is passed
    in (the wire's wall clock). ``remote`` pools are never used (only asynchronous work may run
    there).
    """

    def __init__(
        self,
        scenario: Scenario,
        region: str,
        pool: Pool,
        share: float,
        cpu_parallelism: int = 4,
    ) -> None:
        try:
            r = scenario.region(region)
        except KeyError:
            raise ConfigError(
                f"--region: {region!r} is not a region of scenario {scenario.name!r} "
                f"({', '.join(x.name for x in scenario.regions)})"
            ) from None
        self.region = region
        self.pool = pool
        self.share = share
        self._dedicated = (r.dedicated.cpu, r.dedicated.accelerator)
        models = scenario.models
        self._hardware = frozenset(
            models.base.hardware if pool == "dedicated" else models.strong.hardware
        )
        self.admission = ReplicaAdmission.from_scenario(scenario, pool, cpu_parallelism)
        self.book = CapacityBook()

    def update(self, msg: messages.Capacity) -> bool:
        """Record a level; False when it is not for this region, lost to the level in force or
        is that very level."""
        if msg.region != self.region:
            return False
        return self.book.apply(CapacityLevel.of(msg))

    def level(self, resource: str, now: float) -> float:
        """Opportunistic units of ``resource`` this replica's lever may use (local pools of the
        hardware types it supports), before the share."""
        return self.book.totals(now, hardware=self._hardware).get(resource, 0.0)

    def dedicated(self, now: float) -> tuple[float, float]:
        """Dedicated CPU and accelerator units of the region: announced dedicated levels (if a
        feed publishes them) win over the scenario's."""
        cpu, acc = self._dedicated
        announced = self.book.totals(now, pool="dedicated", remote=None)
        return announced.get("cpu", cpu), announced.get("accelerator", acc)

    def capacity(self, now: float) -> ReplicaCapacity:
        level = OptionalCapacity(
            self.level("cpu", now) * self.share, self.level("accelerator", now) * self.share
        )
        if self.pool == "opportunistic":
            slots_cpu, slots_acc = level.cpu, level.accelerator
        else:
            ded_cpu, ded_acc = self.dedicated(now)
            slots_cpu = ded_cpu * self.share + level.cpu
            slots_acc = ded_acc * self.share + level.accelerator
        k_cpu, k_acc = self.admission.shares(slots_cpu, slots_acc)
        optional = OptionalCapacity(level.cpu * k_cpu, level.accelerator * k_acc)
        return ReplicaCapacity(slots_cpu, slots_acc, level, optional)

    def next_expiry(self, now: float) -> float | None:
        """The earliest wall time after ``now`` at which an opportunistic level lapses."""
        return self.book.next_lapse(now)


# ------------------------------------------------------------------------------------------------
# Slots
# ------------------------------------------------------------------------------------------------


class SlotPool:
    """``ceil(units)`` slots of speed ``units / ceil(units)``, handed out first come, first served
    within two priorities: baseline work first.

    A request may take several slots at once (:meth:`acquire` ``n``: the threads that score its
    candidates in parallel); the head of a queue is served first, so a wide request is never
    starved by narrow ones behind it. A ``low`` (optional-work) waiter is granted slots only
    while no baseline waiter is queued: baseline work never waits behind optional work that has
    not started yet. :meth:`resize` takes effect at once for new grants; slots held beyond a
    smaller size stay held until released (the caller cuts the work that must go). Zero units:
    no slot at all, and waiters wait until capacity returns (callers bound the wait).
    """

    def __init__(self, name: str, units: float) -> None:
        self.name = name
        self.units = 0.0
        self.slots = 0
        self.speed = 1.0
        self.busy = 0
        self._waiters: list[tuple[asyncio.Future[int], int]] = []
        self._low: list[tuple[asyncio.Future[int], int]] = []
        self.resize(units)

    def resize(self, units: float) -> None:
        units = max(0.0, float(units))
        self.units = units
        self.slots = math.ceil(units - _EPS) if units > _EPS else 0
        self.speed = units / self.slots if self.slots else 1.0
        self._wake()

    @property
    def free(self) -> int:
        return max(0, self.slots - self.busy)

    @property
    def waiting(self) -> int:
        return sum(1 for w, _n in self._waiters + self._low if not w.done())

    async def acquire(self, n: int = 1, *, low: bool = False) -> int:
        """Wait for ``n`` slots (fewer when the pool has fewer); returns how many were granted.
        ``low``: optional work, served only while no baseline waiter is queued."""
        n = max(1, n)
        if not self._waiters and not (low and self._low) and self.slots > 0:
            granted = min(n, self.slots)
            if self.busy + granted <= self.slots:
                self.busy += granted
                return granted
        future: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        entry = (future, n)
        queue = self._low if low else self._waiters
        queue.append(entry)
        try:
            return await future
        except BaseException:
            if future.done() and not future.cancelled():
                self.release(future.result())  # granted just as we were cancelled: hand on
            else:
                future.cancel()
            raise
        finally:
            with contextlib.suppress(ValueError):
                queue.remove(entry)

    def release(self, n: int = 1) -> None:
        self.busy -= n
        self._wake()

    def _wake(self) -> None:
        for queue in (self._waiters, self._low):
            while queue and self.slots > 0:
                future, n = queue[0]
                if future.done():
                    queue.pop(0)
                    continue
                granted = min(n, self.slots)
                if self.busy + granted > self.slots:
                    return  # the head waits; nobody behind it (nor any low waiter) passes
                queue.pop(0)
                self.busy += granted
                future.set_result(granted)


# ------------------------------------------------------------------------------------------------
# The server
# ------------------------------------------------------------------------------------------------


@dataclass(eq=False)
class _Optional:
    """One optional phase in flight: what it occupies and how to cut it."""

    id: int
    value: float
    cpu: float
    accelerator: float
    extra: int
    strong: bool
    cut: asyncio.Event = field(default_factory=asyncio.Event)


@dataclass(eq=False)
class _Grant:
    """Slots one request holds on a pool; :meth:`keep` hands part back early, :meth:`release`
    the rest (once)."""

    pool: SlotPool
    n: int

    def keep(self, k: int) -> None:
        k = max(0, k)
        if k < self.n:
            self.pool.release(self.n - k)
            self.n = k

    def release(self) -> None:
        if self.n > 0:
            self.pool.release(self.n)
            self.n = 0


@dataclass
class _PathWindow:
    sketch: LatencySketch = field(default_factory=lambda: LatencySketch(0.01))
    count: int = 0


class RankingServer(Service):
    """One ranking replica (see the module docstring)."""

    name = "server"

    def __init__(
        self,
        config: ServerConfig,
        scenario: Scenario,
        kafka: KafkaTarget | None,
        *,
        metrics: Metrics | None = None,
        clock: Callable[[], float] = time.time,
        world: RankingWorld | None = None,
    ) -> None:
        super().__init__()
        self.config = config
        self.scenario = scenario
        self.kafka = kafka
        self.metrics = metrics
        if metrics is not None:
            metrics.slo.labels(config.region).set(scenario.slo.p99_ms / 1000.0)
        self._wall = clock
        self.log = self.log.bind(region=config.region, pool=config.pool, replica=config.replica)
        self.book = ReplicaBook(
            scenario, config.region, config.pool, config.share, config.cpu_parallelism
        )
        self.costs = CostModel.from_models(scenario.models, scenario.world.base_candidates)
        self.world = world
        now = self._wall()
        cap = self.book.capacity(now)
        self.cpu = SlotPool("cpu", cap.slots_cpu)
        self.accelerator = SlotPool("accelerator", cap.slots_accelerator)
        # The buckets refill at the admitted level, which may be a fraction of a core or device:
        # level × burst_ms of work is then less than one request asks (a strong request is all
        # or nothing; RMA extras are trimmed to what is left), and the buckets, not the level,
        # would bound what is admitted. So they hold at least two requests' optional work (one
        # admitted while the one before it runs), and a strong replica one request more than
        # it has devices (:meth:`_bucket_depth`): ServerShedConfig.min_depth_ms. Over a stretch
        # of time optional work stays within level × admitted share plus one bucket.
        shed = replace(config.shed, min_depth_ms=self._bucket_depth(cap.slots_accelerator))
        self.shedder = ServerShedder(shed, cap.optional, now)
        # the physical level optional work may occupy at any instant (the shedder's buckets
        # hold its rate to the admitted level, cap.optional)
        self.level = cap.level
        self._optional: dict[int, _Optional] = {}
        self._occ_cpu = 0.0  # units occupied by optional phases now
        self._occ_acc = 0.0
        self._fit_waiters: list[asyncio.Future[None]] = []
        self._ids = count()
        self._threads = config.cpu_parallelism
        # one draw per request from a stream of this replica's own (sim/latency.py's J)
        self._jitter_rng = seeds.replica_rng(scenario.seed, config.replica)
        self._jitter_sigma = math.sqrt(math.log1p(config.service_cv**2))
        self._inflight = 0
        self._idle = asyncio.Event()
        self._queue_ms = 0.0  # the newest queueing delay (a slot wait), for health and latency
        self._paths: dict[str, _PathWindow] = {}
        self._used: dict[int, list[float]] = {}  # window index -> [cpu, acc] unit-seconds
        self._occ_since = time.monotonic()
        self._loaded_at: float | None = None  # strong model: wall time it is (or will be) loaded
        self._update_model_load(now)
        self._server: asyncio.Server | None = None
        self._producer: Any = None
        self._loops: list[ConsumerLoop] = []
        self.port: int | None = None
        self.releases: list[float] = []  # release_ms of every reclaim, for tests and benchmarks
        # (release_ms, optional phases cut, optional units occupied when the reclaim was seen)
        self.release_log: list[tuple[float, int, float]] = []
        self.served = 0
        self.ready = asyncio.Event()  # set once the capacity topic has been read to its end

    def _bucket_depth(self, devices: float) -> float:
        """The least depth (ms of work) of the shedding buckets with ``devices`` accelerator
        slots: two requests' optional work, on a strong replica one request more than its
        devices, and never below ``ServerShedConfig.min_depth_ms``. Strong requests arrive at
        random (the admission rule's queueing model takes them as Poisson at the admitted
        rate): a bucket shallower than the devices downgrades a burst that would each have
        found a device free (two requests deep: 95 of ~3,400 strong requests on ``agree-live``,
        three devices at utilisation ~0.43)."""
        n = float(_REQUESTS_PER_BUCKET)
        if self.config.pool == "opportunistic":
            n = max(n, math.ceil(max(devices, 0.0) - 1e-9) + 1.0)
        return max(n * self.book.admission.request_ms, self.config.shed.min_depth_ms)

    # -- time ---------------------------------------------------------------------------------

    def scenario_time(self, wall: float | None = None) -> float:
        wall = self._wall() if wall is None else wall
        return (wall - self.config.t0) * self.config.speed

    # -- lifecycle ------------------------------------------------------------------------------

    async def on_start(self) -> None:
        if self.world is None:
            self.world = RankingWorld.from_scenario(self.scenario)
        try:
            self._server = await serve(
                self.handle, self.config.host, self.config.port, on_protocol_error=self._bad_frame
            )
        except OSError as exc:
            raise HeadroomError(
                f"--port {self.config.port}: cannot listen on "
                f"{self.config.host}:{self.config.port}: {exc.strerror or exc}"
            ) from exc
        self.port = int(self._server.sockets[0].getsockname()[1])
        if self.kafka is not None:
            self._producer = make_producer(self.kafka.bootstrap, linger_ms=2)
            await self._producer.start()
            self.add_task(self._consume_capacity(), name="capacity")
            self.add_task(self._publish_latency(), name="latency")
            self.add_task(self._publish_windows(), name="windows")
        else:
            self.ready.set()
        self.add_task(self._poll_shedding(), name="shedding")
        self.add_task(self._watch_expiry(), name="expiry")
        self.log.info(
            "server.started",
            port=self.port,
            slots_cpu=self.cpu.units,
            slots_accelerator=self.accelerator.units,
        )

    async def on_drain(self) -> None:
        if self._server is not None:
            self._server.close()
        if self._inflight > 0:
            self._idle.clear()
            await self._idle.wait()

    async def on_stop(self) -> None:
        for loop in self._loops:
            loop.stop()
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 2.0)
        if self._producer is not None:
            with contextlib.suppress(Exception):
                await self._flush_latency()
                await self._flush_windows(final=True)
                await asyncio.wait_for(self._producer.flush(), 5.0)
            await self._producer.stop()
        self.log.info("server.stopped", served=self.served)

    def _bad_frame(self, peer: str, exc: Exception) -> None:
        self.log.warning("server.frame.rejected", peer=peer, error=str(exc))

    # -- capacity ---------------------------------------------------------------------------------

    async def _consume_capacity(self) -> None:
        assert self.kafka is not None
        consumer = make_consumer(
            self.kafka.bootstrap, self.kafka.topic("capacity"), from_beginning=True
        )
        producer = self._producer
        started_at = self._wall()

        async def handle(rec: Received) -> None:
            msg = rec.message
            assert isinstance(msg, messages.Capacity)
            # Levels announced before this replica started are state to catch up with, not
            # reclaims it saw happen: no release is measured for them.
            self.on_capacity(msg, live=msg.ts >= started_at - 1.0)

        async with started(consumer, self.kafka.bootstrap):
            loop = ConsumerLoop(
                consumer,
                producer,
                handle,
                prefix=self.kafka.prefix,
                config=LoopConfig(poll_timeout_s=0.05),
                component="server",
                commit=False,
            )
            self._loops.append(loop)
            if self.metrics is not None:
                self.metrics.watch(loop, consumer)
            self.add_task(self._mark_ready(consumer), name="ready")
            await loop.run()

    async def _mark_ready(self, consumer: Any) -> None:
        """Ready once the capacity topic was read up to its end as of start-up."""
        ends: dict[Any, int] | None = None
        for _poll in count():
            parts = list(consumer.assignment())
            if parts and ends is None:
                ends = await consumer.end_offsets(parts)
            if ends is not None:
                positions = [await self._position(consumer, tp) for tp in parts]
                if all(pos >= ends[tp] for pos, tp in zip(positions, parts, strict=True)):
                    break
            await asyncio.sleep(0.05)
        self.ready.set()
        self.log.info(
            "server.capacity.loaded", cpu=self.cpu.units, accelerator=self.accelerator.units
        )

    @staticmethod
    async def _position(consumer: Any, tp: Any) -> int:
        return int(await consumer.position(tp))

    def on_capacity(self, msg: messages.Capacity, *, live: bool = True) -> None:
        """Apply a capacity level at once (see the module docstring, "Release after a reclaim")."""
        now = self._wall()
        if not self.book.update(msg):
            return
        if self.metrics is not None:
            self.metrics.capacity.labels(msg.region, msg.resource, msg.hardware, msg.pool).set(
                msg.units
            )
        self._apply_capacity(
            now,
            live=live,
            reason=msg.reason,
            message_ts=msg.ts,
            where=(msg.resource, msg.hardware, msg.pool),
        )

    def _apply_capacity(
        self,
        now: float,
        *,
        live: bool,
        reason: str,
        message_ts: float | None,
        where: tuple[str, str, str] | None = None,
    ) -> None:
        seen = time.monotonic()
        before = self.level
        cap = self.book.capacity(now)
        self.shedder.set_min_depth(self._bucket_depth(cap.slots_accelerator))
        reduced = self.shedder.on_capacity(cap.optional, now)
        reduced |= cap.level.cpu < before.cpu or cap.level.accelerator < before.accelerator
        self._account_occupancy()
        self.level = cap.level
        self.cpu.resize(cap.slots_cpu)
        self.accelerator.resize(cap.slots_accelerator)
        self._update_model_load(now)
        if not reduced:
            return
        cuts = self.shedder.trim_inflight(
            now,
            [
                InflightWork(o.id, o.value, o.cpu, o.accelerator, o.extra, o.strong)
                for o in self._optional.values()
            ],
            cap.level,
        )
        for cut in cuts:
            work = self._optional.get(int(cut.id))  # type: ignore[call-overload]
            if work is not None:
                work.cut.set()
        if live:
            occupied = self._occ_cpu + self._occ_acc
            self.add_task(
                self._measure_release(
                    seen, now, before, cap.level, len(cuts), reason, message_ts, where, occupied
                ),
                name="release",
            )

    async def _measure_release(
        self,
        seen: float,
        now: float,
        before: OptionalCapacity,
        after: OptionalCapacity,
        cut: int,
        reason: str,
        message_ts: float | None,
        where: tuple[str, str, str] | None,
        occupied: float,
    ) -> None:
        dropped_extra = 0
        dropped_strong = 0
        for work in self._optional.values():
            if work.cut.is_set():
                dropped_extra += work.extra
                dropped_strong += int(work.strong)
        if not self._fits():
            future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self._fit_waiters.append(future)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(future, _MAX_RELEASE_WAIT_S)
        release_ms = (time.monotonic() - seen) * 1000.0
        self.releases.append(release_ms)
        self.release_log.append((release_ms, cut, occupied))
        resource, hardware, pool = where or (
            _reduced_resource(before, after),
            "any",
            "opportunistic",
        )
        fields = {
            "resource": resource,
            "hardware": hardware,
            "pool": pool,
            "t": self.scenario_time(now),
            "release_ms": release_ms,
            "delivery_ms": None if message_ts is None else max(0.0, (now - message_ts) * 1000.0),
            "reason": reason,
            "units_before": {"cpu": before.cpu, "accelerator": before.accelerator},
            "units_after": {"cpu": after.cpu, "accelerator": after.accelerator},
            "inflight_cut": cut,
            "dropped": {
                "rma_candidates": dropped_extra,
                "sbm_requests": dropped_strong,
                "precompute_jobs": 0,
            },
        }
        if self.metrics is not None:
            self.metrics.release_latency.labels(self.config.region, pool).observe(release_ms / 1e3)
            self.metrics.released.labels(self.config.region, "rma").inc(dropped_extra)
            self.metrics.released.labels(self.config.region, "sbm").inc(dropped_strong)
        self.log.info("server.optional.released", **fields)
        await self._emit("optional.released", fields)

    def _fits(self) -> bool:
        cap = self.level
        return self._occ_cpu <= cap.cpu + _EPS and self._occ_acc <= cap.accelerator + _EPS

    async def _watch_expiry(self) -> None:
        """Opportunistic levels lapse at their announced expiry without a message: re-apply."""
        while not self.stop_requested:
            now = self._wall()
            nxt = self.book.next_expiry(now)
            wait = 1.0 if nxt is None else min(1.0, max(0.0, nxt - now) + 0.001)
            if not await self.sleep(wait):
                return
            if nxt is not None and self._wall() >= nxt:
                self._apply_capacity(self._wall(), live=True, reason="expired", message_ts=nxt)

    def _update_model_load(self, now: float) -> None:
        """The strong model needs ``load_s`` (scenario seconds) of capacity before serving."""
        if self.config.pool != "opportunistic":
            return
        if self.level.accelerator <= _EPS:
            self._loaded_at = None
        elif self._loaded_at is None:
            self._loaded_at = now + self.scenario.models.strong.load_s / self.config.speed

    def model_loaded(self, now: float | None = None) -> bool:
        if self.config.pool == "dedicated":
            return True
        now = self._wall() if now is None else now
        return self._loaded_at is not None and now >= self._loaded_at

    # -- occupancy ------------------------------------------------------------------------------

    def _account_occupancy(self) -> None:
        """Integrate optional occupancy (units × scenario seconds) into the current window."""
        mono = time.monotonic()
        dt = (mono - self._occ_since) * self.config.speed
        self._occ_since = mono
        if dt <= 0.0 or (self._occ_cpu <= 0.0 and self._occ_acc <= 0.0):
            return
        k = self._window_index()
        used = self._used.setdefault(k, [0.0, 0.0])
        used[0] += self._occ_cpu * dt
        used[1] += self._occ_acc * dt

    def _window_index(self, wall: float | None = None) -> int:
        return math.floor(self.scenario_time(wall) / self.scenario.slo.window_s)

    def _occupy(self, work: _Optional) -> None:
        self._account_occupancy()
        self._optional[work.id] = work
        self._occ_cpu += work.cpu
        self._occ_acc += work.accelerator

    def _vacate(self, work: _Optional) -> None:
        self._account_occupancy()
        if self._optional.pop(work.id, None) is not None:
            self._occ_cpu = max(0.0, self._occ_cpu - work.cpu)
            self._occ_acc = max(0.0, self._occ_acc - work.accelerator)
        if self._fit_waiters and self._fits():
            waiters, self._fit_waiters = self._fit_waiters, []
            for future in waiters:
                if not future.done():
                    future.set_result(None)

    async def _optional_phase(
        self,
        work_id: int,
        value: float,
        work_ms: float,
        resource: str,
        extra: int,
        strong: bool,
        grant: _Grant,
        done_ms: float = 0.0,
    ) -> bool:
        """Run ``work_ms`` of optional work (at unit speed) on the slots of ``grant``; False when
        it was cut, or could not start because no opportunistic capacity is left.

        The phase gets ``u = min(slots × slot speed, level − optional units in use)`` units, and
        lasts ``work_ms / u`` (less ``done_ms`` already spent on it): optional work time-shares
        what is left of the opportunistic level, so it never occupies more than the level. (How
        much of it is admitted — on average the admitted share of the level — is the shedder's
        buckets' business.) It keeps only the slots ``u`` needs and hands the others back at
        once: a phase on a fraction of a core must not hold other slots idle.
        """
        pool = grant.pool
        cap = self.level
        if resource == "cpu":
            units = optional_units(grant.n * pool.speed, cap.cpu, self._occ_cpu)
            work = _Optional(work_id, value, units, 0.0, extra, strong)
        else:
            units = optional_units(grant.n * pool.speed, cap.accelerator, self._occ_acc)
            work = _Optional(work_id, value, 0.0, units, extra, strong)
        if units <= _EPS:
            return False
        grant.keep(math.ceil(units / pool.speed - _EPS))
        self._occupy(work)
        try:
            duration_s = max(0.0, work_ms / units - done_ms) / 1000.0
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(work.cut.wait(), duration_s)
            return not work.cut.is_set()
        finally:
            self._vacate(work)

    def _optional_cpu_units(self, threads: int) -> float:
        """The CPU units an optional phase of ``threads`` threads may run on: what they give,
        but no more than is left of the opportunistic level."""
        return optional_units(threads * self.cpu.speed, self.level.cpu, self._occ_cpu)

    def _optional_cpu_slots(self) -> int:
        """CPU slots an optional phase waits for: its request's threads, but no more than the
        units left of the opportunistic level need (the phase would hand the others back at
        once, and waiting for all of them together can outlast its budget on a busy pool)."""
        units = self._optional_cpu_units(self._threads)
        return max(1, min(self._threads, math.ceil(units / self.cpu.speed - _EPS)))

    def _extras_that_fit(self, n: int, j: float, base: int, budget_ms: float) -> int:
        """How many of ``n`` extras can finish within the request's optional budget
        (:func:`~headroom.defences.shedding.extras_within_budget`): after the baseline parts,
        each extra's CPU work on the units the opportunistic level leaves it (at most the
        request's threads), then its accelerator work. Waits are not foreseen: an optional phase
        that cannot start before the deadline is still dropped there."""
        costs = self.costs
        threads = max(1, min(self._threads, self.cpu.slots))
        base_ms = (
            j
            * base
            * (
                costs.base_cpu_ms / (threads * self.cpu.speed)
                + costs.base_accelerator_ms / self.accelerator.speed
            )
        )
        phases = (
            (j * costs.base_cpu_ms, self._optional_cpu_units(threads)),
            (
                j * costs.base_accelerator_ms,
                optional_units(self.accelerator.speed, self.level.accelerator, self._occ_acc),
            ),
        )
        return extras_within_budget(n, budget_ms - base_ms, phases)

    async def _optional_slots(
        self, pool: SlotPool, deadline: float, n: int
    ) -> tuple[float, int] | None:
        """Slots for an optional phase of a mixed request, at optional work's priority, or None
        when the request's optional budget (``deadline``, monotonic) runs out first."""
        if time.monotonic() >= deadline:
            return None
        return await self._acquire(pool, deadline, n, low=True)

    # -- requests -------------------------------------------------------------------------------

    def _jitter(self) -> float:
        """One request's service-time factor: log-normal, mean 1, ``service_cv``."""
        sigma = self._jitter_sigma
        if sigma <= 0.0:
            return 1.0
        return float(self._jitter_rng.lognormal(-0.5 * sigma * sigma, sigma))

    def _health(self) -> Health:
        return Health(overloaded=self.shedder.overloaded, queue_ms=self._queue_ms)

    async def _acquire(
        self, pool: SlotPool, deadline: float | None, n: int = 1, *, low: bool = False
    ) -> tuple[float, int] | None:
        """Wait for ``n`` slots (``low``: at optional work's priority): (the wait in ms, slots
        granted), or None when ``deadline`` (monotonic) passed first."""
        start = time.monotonic()
        if deadline is None:
            granted = await pool.acquire(n, low=low)
        else:
            try:
                granted = await asyncio.wait_for(
                    pool.acquire(n, low=low), max(0.0, deadline - start)
                )
            except TimeoutError:
                return None
        waited = (time.monotonic() - start) * 1000.0
        self._queue_ms = waited
        # CoDel's input is the sojourn time of the request just dequeued. Free slots are not
        # passed: a fully busy pool with nobody waiting is utilisation, not overload.
        transition = self.shedder.observe(self._wall(), waited)
        if transition is not None:
            fields = {"queue_ms": transition.queue_ms, "reason": transition.reason}
            self.log.info(f"server.{transition.event.value}", **fields)
            self.add_task(self._emit(transition.event.value, fields), name="overload")
        return waited, granted

    async def handle(self, req: RankRequest) -> RankResponse:
        """Serve one request (the wire protocol's handler)."""
        self._inflight += 1
        start = time.monotonic()
        try:
            if self.config.pool == "opportunistic":
                response = await self._strong(req, start)
            else:
                response = await self._mixed(req, start)
        except Exception as exc:  # a bug must not take the connection down: report it
            self.log.exception("server.request.failed", id=req.id)
            response = RankResponse(
                id=req.id, ok=False, health=self._health(), error=f"{type(exc).__name__}: {exc}"
            )
        finally:
            self._inflight -= 1
            if self._inflight == 0:
                self._idle.set()
        return response

    def _rank(
        self, req: RankRequest, n: int, model: Model
    ) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
        """The real compute: retrieve ``n`` candidates and score them with ``model``."""
        assert self.world is not None
        users = self.world.users([req.user], req.segment)
        cands = self.world.retrieve_batch(users, n, req.t_s)
        scores = self.world.score_batch(users, req.segment, cands, model, req.t_s)
        return cands[0], scores[0]

    def _base_top(self, req: RankRequest, cands: np.ndarray[Any, Any]) -> int:
        """The baseline's pick among the same candidates (the counterfactual for ground truth)."""
        assert self.world is not None
        users = self.world.users([req.user], req.segment)
        scores = self.world.score_batch(users, req.segment, cands[None, :], Model.BASE, req.t_s)
        return int(cands[int(np.argmax(scores[0]))])

    async def _mixed(self, req: RankRequest, start: float) -> RankResponse:
        """Baseline or RMA request on a mixed replica."""
        costs = self.costs
        base = req.base
        j = self._jitter()  # this request's service-time factor, every stage
        n = 0
        decision = Decision.ADMIT
        if req.extra > 0:
            verdict = self.shedder.decide(
                self._wall(),
                OptionalWork(
                    value=req.value,
                    extra=req.extra,
                    extra_cpu_ms=req.extra * costs.base_cpu_ms,
                    extra_accelerator_ms=req.extra * costs.base_accelerator_ms,
                ),
            )
            n = verdict.extra
            decision = verdict.decision
            if n > 0:
                fit = self._extras_that_fit(n, j, base, req.budget_ms)
                if fit < n:
                    n = fit
                    decision = Decision.TRIM if fit > 0 else Decision.SHED
            self._count_shed(req.extra - n, False)
        optional_deadline = start + req.budget_ms / 1000.0
        work_id = next(self._ids)
        queue_ms = 0.0
        # Baseline first (module docstring): each stage runs the request's baseline part at
        # baseline priority, hands its slots back, and queues the extras as optional work (low
        # priority: granted only while no baseline part waits), dropped when the request's
        # optional budget runs out first.
        # CPU stage: retrieval and features (real compute inside the slot), then the extras.
        got = await self._acquire(self.cpu, None, self._threads)
        assert got is not None
        queue_ms += got[0]
        grant = _Grant(self.cpu, got[1])
        try:
            t = time.monotonic()
            cands, scores = self._rank(req, base + n, Model.BASE)
            real_ms = (time.monotonic() - t) * 1000.0
            base_ms = j * base * costs.base_cpu_ms / (grant.n * self.cpu.speed)
            if base_ms > real_ms:
                await asyncio.sleep((base_ms - real_ms) / 1000.0)
        finally:
            grant.release()
        if n > 0:
            got_opt = await self._optional_slots(
                self.cpu, optional_deadline, self._optional_cpu_slots()
            )
            ok = got_opt is not None
            if got_opt is not None:
                queue_ms += got_opt[0]
                grant = _Grant(self.cpu, got_opt[1])
                ran = time.monotonic()
                try:
                    ok = await self._optional_phase(
                        work_id, req.value, j * n * costs.base_cpu_ms, "cpu", n, False, grant
                    )
                finally:
                    grant.release()
                # the budget bounds the extras' waits, not their work (the simulator's rule):
                # the accelerator phase of extras whose CPU work is done is not dropped for the
                # time that work took
                optional_deadline += time.monotonic() - ran
            if not ok:
                self._count_shed(n, False)
                n, decision = 0, Decision.SHED
        # Accelerator stage: the model's inference, base candidates then extras.
        got = await self._acquire(self.accelerator, None)
        assert got is not None
        queue_ms += got[0]
        grant = _Grant(self.accelerator, got[1])
        try:
            await asyncio.sleep(
                j * base * costs.base_accelerator_ms / self.accelerator.speed / 1000.0
            )
        finally:
            grant.release()
        if n > 0:
            got_opt = await self._optional_slots(self.accelerator, optional_deadline, 1)
            ok = got_opt is not None
            if got_opt is not None:
                queue_ms += got_opt[0]
                grant = _Grant(self.accelerator, got_opt[1])
                try:
                    ok = await self._optional_phase(
                        work_id,
                        req.value,
                        j * n * costs.base_accelerator_ms,
                        "accelerator",
                        n,
                        False,
                        grant,
                    )
                finally:
                    grant.release()
            if not ok:
                self._count_shed(n, False)
                n, decision = 0, Decision.SHED
        ranked = base + n
        best = int(np.argmax(scores[:ranked]))
        base_best = int(np.argmax(scores[:base]))
        path = "rma" if n > 0 else "base"
        return self._done(req, start, path, int(cands[best]), float(scores[best]),
                          int(cands[base_best]), ranked, "base", decision, queue_ms)  # fmt: skip

    async def _strong(self, req: RankRequest, start: float) -> RankResponse:
        """A strong-model request on an SBM replica; everything here is optional."""
        costs = self.costs
        n = req.base
        now = self._wall()
        if not self.model_loaded(now):
            return self._downgraded(req, start, "strong model not loaded")
        # What SBM pays on its optional pools: the strong model's own work only
        # (CostModel.sbm_per_request, the allocator's and the simulator's rule). The request's
        # retrieval and features (the rest of CostModel.request) stay on the dedicated path:
        # they take their time (at the request's parallelism, as in the simulator's CPU stage)
        # but none of this replica's opportunistic capacity.
        cost = costs.sbm_per_request * (n / max(costs.base_candidates, 1))
        retrieval_ms = costs.request(n, "strong").cpu_s * 1000.0 - cost.cpu_s * 1000.0
        verdict = self.shedder.decide(
            now,
            OptionalWork(
                value=req.value,
                strong=True,
                strong_cpu_ms=cost.cpu_s * 1000.0,
                strong_accelerator_ms=cost.accelerator_s * 1000.0,
            ),
        )
        if not verdict.strong:
            self._count_shed(0, True)
            return self._downgraded(req, start, "shed")
        deadline = start + req.budget_ms / 1000.0
        work_id = next(self._ids)
        queue_ms = 0.0
        t = time.monotonic()
        cands, scores = self._rank(req, n, Model.STRONG)  # the real compute, retrieval included
        real_ms = (time.monotonic() - t) * 1000.0
        j = self._jitter()
        base_ms = j * retrieval_ms / max(self._threads, 1)
        if base_ms > real_ms:
            await asyncio.sleep((base_ms - real_ms) / 1000.0)
        got = await self._acquire(self.cpu, deadline, self._threads)
        if got is None:
            self._count_shed(0, True)
            return self._downgraded(req, start, "no slot within budget")
        queue_ms += got[0]
        grant = _Grant(self.cpu, got[1])
        try:
            ok = await self._optional_phase(
                work_id, req.value, j * cost.cpu_s * 1000.0, "cpu", 0, True, grant,
                max(0.0, real_ms - base_ms),
            )  # fmt: skip
        finally:
            grant.release()
        if not ok:
            self._count_shed(0, True)
            return self._downgraded(req, start, "preempted")
        got = await self._acquire(self.accelerator, deadline)
        if got is None:
            self._count_shed(0, True)
            return self._downgraded(req, start, "no slot within budget")
        queue_ms += got[0]
        grant = _Grant(self.accelerator, got[1])
        try:
            ok = await self._optional_phase(
                work_id, req.value, j * cost.accelerator_s * 1000.0, "accelerator", 0, True, grant
            )
        finally:
            grant.release()
        if not ok:
            self._count_shed(0, True)
            return self._downgraded(req, start, "preempted")
        best = int(np.argmax(scores))
        return self._done(req, start, "sbm", int(cands[best]), float(scores[best]),
                          self._base_top(req, cands), n, "strong", verdict.decision,
                          queue_ms)  # fmt: skip

    def _done(
        self,
        req: RankRequest,
        start: float,
        path: str,
        top_ad: int,
        score: float,
        base_top_ad: int,
        candidates: int,
        model: Literal["base", "strong"],
        decision: Decision,
        queue_ms: float,
    ) -> RankResponse:
        server_ms = (time.monotonic() - start) * 1000.0
        window = self._paths.setdefault(path, _PathWindow())
        window.sketch.add(server_ms)
        window.count += 1
        self.served += 1
        if self.metrics is not None:
            self.metrics.requests.labels(self.config.region, path, "ok").inc()
            self.metrics.latency.labels(self.config.region, path).observe(server_ms / 1000.0)
        return RankResponse(
            id=req.id,
            ok=True,
            health=self._health(),
            top_ad=top_ad,
            score=score,
            base_top_ad=base_top_ad,
            candidates=candidates,
            model=model,
            decision=decision.name,
            server_ms=server_ms,
            queue_ms=queue_ms,
        )

    def _downgraded(self, req: RankRequest, start: float, why: str) -> RankResponse:
        return RankResponse(
            id=req.id,
            ok=False,
            health=self._health(),
            model="strong",
            decision=Decision.DOWNGRADE.name,
            downgraded=True,
            server_ms=(time.monotonic() - start) * 1000.0,
            error=why,
        )

    def _count_shed(self, extra: int, strong: bool) -> None:
        if self.metrics is None:
            return
        if extra > 0:
            self.metrics.shed.labels(self.config.region, "server", "rma").inc(extra)
        if strong:
            self.metrics.shed.labels(self.config.region, "server", "sbm").inc()

    # -- periodic publishing ----------------------------------------------------------------------

    async def _poll_shedding(self) -> None:
        while await self.sleep(0.1):
            transition = self.shedder.poll(self._wall())
            if transition is not None:
                await self._shedding_event(transition)

    async def _shedding_event(self, t: ShedTransition) -> None:
        fields = {
            "side": "server",
            "lever": self.config.lever,
            "dropped": t.dropped,
            "dropped_extra_candidates": t.dropped_extra_candidates,
            "dropped_strong": t.dropped_strong,
        }
        self.log.info(f"server.{t.event.value}", **fields)
        await self._emit(t.event.value, fields)

    async def _publish_latency(self) -> None:
        while await self.sleep(self.config.latency_interval_s):
            await self._flush_latency()

    async def _flush_latency(self) -> None:
        if self._producer is None or self.kafka is None:
            return
        paths, self._paths = self._paths, {}
        now = self._wall()
        topic = self.kafka.topic("latency")
        for path, window in paths.items():
            if window.count == 0:
                continue
            msg = messages.Latency(
                ts=now,
                region=self.config.region,
                replica=self.config.replica,
                pool=self.config.pool,
                path=path,  # type: ignore[arg-type]
                window_s=self.config.latency_interval_s,
                count=window.count,
                sketch=window.sketch,
                inflight=self._inflight,
                queue_ms=self._queue_ms,
            )
            await self._producer.send(topic, messages.encode(msg), key=msg.key())

    async def _publish_windows(self) -> None:
        window_s = self.scenario.slo.window_s
        while not self.stop_requested:
            t = self.scenario_time()
            end = (math.floor(t / window_s) + 1) * window_s
            if not await self.sleep((end - t) / self.config.speed + 0.01):
                return
            await self._flush_windows(final=False)

    async def _flush_windows(self, *, final: bool) -> None:
        """One ``window`` line per ended SLO window with the optional work's unit-seconds."""
        self._account_occupancy()
        current = self._window_index()
        window_s = self.scenario.slo.window_s
        for k in sorted(self._used):
            if k >= current and not final:
                continue
            cpu, acc = self._used.pop(k)
            await self._emit(
                "window",
                window_event(
                    k * window_s,
                    (k + 1) * window_s,
                    used_unit_s={"cpu": cpu, "accelerator": acc},
                    replica=self.config.replica,
                ),
                ts=self.config.t0 + (k + 1) * window_s / self.config.speed,
            )

    async def _emit(self, kind: str, fields: dict[str, Any], ts: float | None = None) -> None:
        if self._producer is None or self.kafka is None:
            return
        extra = {
            "policy": self.config.policy,
            "replica": self.config.replica,
            "pool": self.config.pool,
        }
        extra.update(fields)
        event = messages.Event(
            ts=self._wall() if ts is None else ts,
            kind=kind,
            source="server",
            region=self.config.region,
            extra=extra,
        )
        await self._producer.send(
            self.kafka.topic("events"), messages.encode(event), key=event.key()
        )


def _reduced_resource(before: OptionalCapacity, after: OptionalCapacity) -> str:
    if after.accelerator < before.accelerator - _EPS:
        return "accelerator"
    return "cpu"
