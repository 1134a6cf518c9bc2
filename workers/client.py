"""The client worker (``headroom client --region R``): requests in, rankings out, value measured.

A client consumes ``headroom.requests`` as a member of its region's consumer group and serves
the requests of its region (the payload's ``region``; another region's requests on the same
partitions are skipped). Requests are keyed ``region/shard`` and the shard is the partition (a
stable hash of the user id), so a region's traffic is on every partition and the group's members
(``headroom up --clients-per-region M``) split it by the partitions they are assigned; each
publishes its value signals under its own ``producer`` id (docs/streaming.md, *Scaling out*).
For each request:

1. **Target** — applies the newest unexpired target of its region (highest ``epoch``,
   :class:`TargetBook`). Past ``ts + ttl_s`` the target is expired: the client falls back to the
   baseline (base candidates, no SBM) and says so once (``target.expired``); a newer target ends the
   fallback (``target.applied``).
2. **Plan** — the one client plan of both engines (:mod:`headroom.defences.plan`,
   :class:`~headroom.defences.plan.RequestPlanner`): the ``world.holdout`` share is the control
   arm (no optional work); an eligible request goes to the strong model with its value bin's
   share of the segment's routing probability (the segment's highest values first) if the
   strong replica's client-side multiplier keeps a request of its value rank; otherwise RMA's
   budget, ``m × (candidates − base)`` extras per treatment request, ``m`` the multiplier of the
   dedicated replica it picked
   (:class:`~headroom.defences.client_shedding.ClientShedder`), goes highest value first to the
   requests the strong model did not take. The client supplies the ranks:
   the request's value rank within its segment (its value bin, :func:`value_stratum`) and among
   all requests (the multipliers' order), each from a
   :class:`~headroom.defences.histogram.ValueRanker`.
3. **Serve** — over real loopback connections (:mod:`headroom.workers.wire`). An SBM request goes
   to a strong-model replica; if that replica refuses it (``downgraded``), is unreachable, dies
   or is preempted mid-request, or does not answer within its budget, the request returns to the
   base model on a dedicated replica (the path provisioned for it). A baseline or RMA request
   goes to the dedicated replica with the fewest calls in flight; if that replica is lost
   mid-call, the request is retried once on another (the retry budget), inside the SLO.
4. **Measure** — the delivered value is the ground truth of the world: ``value × quality`` of the ad
   ranked first; the baseline's value is the same for the ad the baseline ranks first (the server
   returns it); the difference is the lever's incremental value.

Precomputed results (the precompute lever, when the scenario enables it)
-----------------------------------------------------------------------
Between the plan and the live call, the client looks the request's user up in its
:class:`headroom.workers.precompute_lookup.PrecomputeCache` (a consumer of ``headroom.precompute``,
:class:`PrecomputePath`). The holdout draw of the plan decides for precompute too:

* **HIT** — an unexpired result ranked for this user and segment exists and the request is not in
  the holdout: it is served from the result, at the cost of the look-up (no server call). Its
  delivered value is ``value × quality`` at *visit* time of the ad the stored ranking puts first
  (staleness costs value for real); its baseline value is that of the ad a live base ranking
  (base model, base candidates) would put first now, computed by the client for the ground truth
  only. It counts under lever ``precompute``, arm ``treatment``.
* **HELD_OUT** — a result exists but the request is in the holdout: it is ranked live with no
  optional work, as every holdout request, and is the ``control`` arm of lever ``precompute``.
* **MISS** — no usable result: the plan goes on as above (RMA, SBM or the holdout).

One draw for everything keeps the holdout a uniform random sample of all requests (the
analyzer's ``arms`` stay unbiased). The value signals compare like with like: ``precompute``
treatment (hits) against ``precompute`` control (held out), both requests that found a result;
``rma`` and ``sbm`` treatment (their intent-to-treat groups, requests without a result) against
the holdout requests that found none. A result past its ``expires_at`` is never served, whether
or not its tombstone has arrived.

Windows, value signals and offsets
----------------------------------
Requests are aggregated per SLO window of scenario time, by the time they *ended*
(:class:`WindowBook`). When a window has ended, and every ``flush_s`` (1 s), the client publishes
what it can: a finished request is published only once every older request of its partition is
finished too (:class:`OffsetTracker`), so what is published is a prefix of the partition. For each
window with such requests (several lines of one window add up) it publishes one
``window`` event (docs/events.md: counts, merged latency sketches, value, per-segment arms and
exposure, targets in force) and the value signals (``headroom.value``: sums per (segment, value
bin, lever, arm); the control arm's sums are published under each lever, since each lever's
estimate needs its control). The value bin (``stratum``, :data:`VALUE_BINS` equal-probability
bins of the request's value rank within its segment, known before the plan in either arm) lets
the controller post-stratify on the value signal (docs/controllers.md); the window line stays
per segment. The value signals go out once the broker has acknowledged the lines (each line
carries its own signals, ``value_signals``, so the lines are the record of what was published),
and once the broker has acknowledged the signals too, the client commits, per partition, the end
of the published prefix. So:

* a client that is killed loses only what it has not published (at most ``flush_s`` of
  requests), whose offsets are uncommitted: the member that takes the partitions over (the same
  client restarted, with static group membership ``instance``, gets them back at once) consumes
  them again: none lost. A partition the group never committed gets a first commit at its end
  when it is assigned, before a request of it is read
  (:func:`~headroom.workers.published.commit_start`), so this holds from the very first request;
* what was published is exactly a prefix of each partition and is committed right after the
  acknowledgement, so a restart re-reads nothing that was published: none counted twice. (Were
  requests published as they finish, out of order, the commit would have to stop at the oldest one
  still in flight and a restart would re-read — and count again — the newer ones already out.)
  A crash between the acknowledgement and the commit (milliseconds) leaves requests published
  but uncommitted. Every window line carries the offset ranges it covers (``offsets``:
  ``{partition: [first, last]}``, dropped duplicates included) and every commit carries, as its
  metadata, where the events partition of the window lines ended when it was made
  (:func:`~headroom.workers.offsets.commit_metadata`). When partitions are assigned, before
  reading a request of them, the client reads the window lines written since its group's last
  commit (:func:`~headroom.workers.published.read_published_ends`) and drops every request at or
  below the highest offset they cover, as a duplicate (``duplicates_dropped``): none counted
  twice. It also sends again the value signals those lines carry, under their first producer id
  and seqs: a crash between the lines and their signals lost none, and the controller drops the
  copies of those that had gone out (``(producer, seq)`` counted once): every request's value
  reaches the controller's books exactly once;
* on a rebalance (a client joins or leaves), the member losing partitions first waits for their
  requests in flight, publishes what it has (partial windows: several lines of one window add up)
  and commits, before the partitions move; a graceful stop does the same.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import secrets
import time
from collections import deque
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

import msgspec
from aiokafka import ConsumerRebalanceListener, TopicPartition

from headroom.analysis.events import window_event
from headroom.defences.catch_up import CatchUp, CatchUpConfig, catch_up_rate, peak_rps
from headroom.defences.client_shedding import ClientShedConfig, ClientShedder
from headroom.defences.histogram import ValueRanker
from headroom.defences.plan import (
    VALUE_BINS,
    PlanRule,
    RequestPlanner,
    held_rate_meter,
    held_scale,
    held_shares,
    serves_from_store,
    value_stratum,
)
from headroom.defences.shedding import OPTIONAL_BUDGET_SHARE, ShedTransition
from headroom.kernel import seeds
from headroom.kernel.checks import FieldChecker
from headroom.kernel.errors import ConfigError, HeadroomError
from headroom.kernel.scenario import Scenario
from headroom.streams import messages
from headroom.streams.consume import ConsumerLoop, LoopConfig, Received
from headroom.streams.kafka import KafkaTarget, make_consumer, make_producer, started
from headroom.workers.client_windows import (
    Outcome,
    WindowBook,
)
from headroom.workers.metrics import Metrics
from headroom.workers.offsets import OffsetTracker, commit_metadata
from headroom.workers.precompute_store import (
    Expired,
    Visit,
    VisitOutcome,
)
from headroom.workers.published import commit_start, read_published_ends
from headroom.workers.service import Service
from headroom.workers.wire import RankRequest, RankResponse, ServerUnavailable, WireClient
from headroom.world.ranking import RankingWorld

__all__ = [
    "VALUE_BINS",
    "ClientConfig",
    "OffsetTracker",
    "Outcome",
    "PrecomputeLookup",
    "PrecomputePath",
    "RankingClient",
    "RecentIds",
    "ServerAddress",
    "TargetBook",
    "TargetState",
    "WindowBook",
    "in_flight_limit",
    "value_stratum",
]

# how long an assignment waits to learn what was published beyond the last commit
PUBLISHED_CHECK_S = 30.0
# request ids remembered for de-duplication: at 300 requests/s, the last five minutes or so
SEEN_IDS = 100_000


class RecentIds:
    """The last ``capacity`` request ids seen, in arrival order: :meth:`add` is False for an id
    still remembered (a duplicate). Bounded, so a long run does not grow it."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._ids: set[str] = set()
        self._order: deque[str] = deque()

    def add(self, request_id: str) -> bool:
        if request_id in self._ids:
            return False
        self._ids.add(request_id)
        self._order.append(request_id)
        if len(self._order) > self.capacity:
            self._ids.discard(self._order.popleft())
        return True

    def __len__(self) -> int:
        return len(self._ids)


def value_producer_id(name: str) -> str:
    """One id per process start (name, pid, random): the ``producer`` of its value signals."""
    tail = f".{os.getpid()}.{secrets.token_hex(3)}"
    return name[: 64 - len(tail)] + tail


# ------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ServerAddress:
    pool: str  # "dedicated" | "opportunistic"
    host: str
    port: int

    @classmethod
    def parse(cls, text: str) -> ServerAddress:
        """``POOL=HOST:PORT`` (``--server``)."""
        pool, sep, address = text.partition("=")
        host, colon, port = address.rpartition(":")
        if not sep or not colon or pool not in ("dedicated", "opportunistic"):
            raise ConfigError(
                f"--server: {text!r} must be POOL=HOST:PORT with POOL dedicated or opportunistic"
            )
        try:
            number = int(port)
        except ValueError:
            raise ConfigError(f"--server: {text!r}: port {port!r} is not a number") from None
        if not 0 < number < 65536 or not host:
            raise ConfigError(f"--server: {text!r}: need a host and a port in 1-65535")
        return cls(pool, host, number)

    def __str__(self) -> str:
        return f"{self.pool}={self.host}:{self.port}"


@dataclass(frozen=True, slots=True)
class ClientConfig:
    """One client's settings; validated on construction (errors name the flag or field)."""

    region: str
    servers: tuple[ServerAddress, ...]
    group: str
    name: str = "client"
    t0: float = 0.0
    speed: float = 1.0
    seed: int = 0
    policy: str = "headroom"
    instance: str | None = None  # static group membership: a restart keeps the partitions
    value_ranked_rma: bool = True  # RMA extras spent highest value first (PlanRule)
    value_ranked_sbm: bool = True  # SBM routing spent on each segment's highest values (PlanRule)
    # Requests being served at once: back-pressure on the consumer (in_flight_limit sizes it
    # from the scenario's traffic). A backlog is paced by the catch-up rule instead.
    max_in_flight: int = 32
    # A request that waited longer than this in the topic (wall seconds) is late: served
    # baseline-only and paced (headroom.defences.catch_up); late requests go at most
    # catch_up_rate per wall second (None: catch_up_rate() of the scenario's region).
    catch_up_lag_s: float = 1.0
    catch_up_rate: float | None = None
    sbm_budget_share: float = 0.5  # share of the SLO an SBM attempt may take before falling back
    base_timeout_share: float = 1.0  # share of the SLO one baseline attempt may take
    timeout_share: float = 2.0  # a request slower than this × SLO counts as a timeout
    # extras that cannot start within this × SLO are dropped (the rule of both engines)
    optional_budget_share: float = OPTIONAL_BUDGET_SHARE
    publish_tick_s: float = 0.1  # how often ended windows are looked for (wall seconds)
    # Every flush_s the open windows are published as partial lines and their offsets committed:
    # a killed client re-reads at most this much (several lines of one window add up).
    flush_s: float = 1.0
    reconnect_s: float = 0.5  # wait between connection attempts to a lost server
    shed: ClientShedConfig = field(default_factory=ClientShedConfig)
    # look precomputed results up before ranking live, when the scenario enables precompute
    # (False: never, e.g. to compare a run without the lever's serving side)
    precompute: bool = True
    precompute_ready_s: float = 60.0  # how long start-up waits for the cache to catch up
    # the control interval targets are issued at (scenario seconds; None: the scenario's): a
    # target older than HELD_AFTER_INTERVALS of them is held (defences/plan.py)
    control_interval_s: float | None = None

    def __post_init__(self) -> None:
        c = FieldChecker()
        c.require(
            any(s.pool == "dedicated" for s in self.servers),
            "--server",
            "give at least one dedicated server (dedicated=HOST:PORT)",
            [str(s) for s in self.servers],
        )
        c.clock(self.t0, self.speed)
        c.integer("max_in_flight", self.max_in_flight, 1)
        c.positive("catch_up_lag_s", self.catch_up_lag_s)
        if self.catch_up_rate is not None:
            c.positive("catch_up_rate", self.catch_up_rate)
        c.positive("precompute_ready_s", self.precompute_ready_s)
        if self.control_interval_s is not None:
            c.positive("control_interval_s", self.control_interval_s)
        for name in ("sbm_budget_share", "base_timeout_share", "timeout_share"):
            c.positive(name, getattr(self, name))
        c.raise_if_any()


def in_flight_limit(scenario: Scenario, region: str) -> int:
    """Requests a client of ``region`` keeps in flight at most: twice what Little's law needs at
    the region's peak rate (:func:`~headroom.defences.catch_up.peak_rps`) with every request
    taking the whole SLO (``2 · peak_rps · SLO``), at least 8. Enough never to throttle a healthy
    region. It bounds how many requests are out, not how fast they go: a backlog (a client
    restarted, or behind) would keep all of them queued at its servers, so late requests are
    paced by the catch-up rule (:mod:`headroom.defences.catch_up`)."""
    peak = peak_rps(scenario, region)
    return max(8, math.ceil(2.0 * peak * scenario.slo.p99_ms / 1000.0))


# ------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class TargetState:
    """What the client applies now: a live target, or the baseline."""

    epoch: int | None  # None: no target ever received
    rma_candidates: int
    sbm_coverage: float
    sbm_segments: Mapping[str, float]
    expired: bool  # True: the baseline is in force because the newest target expired
    # per segment, extra candidates per value bin (``targets.rma.levels``; empty: one block)
    rma_levels: Mapping[str, Sequence[int]] = field(default_factory=dict)
    # the router's exploration floor (``targets.sbm.explore``; 0: every share value-ranked)
    sbm_explore: float = 0.0


class TargetBook:
    """The newest target of one region, and the TTL fallback (docs/messages.md, targets).

    :meth:`offer` keeps the highest epoch (an older or equal one is ignored: targets may be
    re-delivered or reordered). :meth:`state` is the target in force at ``now``, or the baseline.
    :meth:`transitions` reports, once each, that a target was applied or that it expired.
    """

    def __init__(self, region: str, base_candidates: int) -> None:
        self.region = region
        self.base = base_candidates
        self.target: messages.Target | None = None
        self._announced_epoch: int | None = None
        self._expired_epoch: int | None = None

    def offer(self, target: messages.Target) -> bool:
        if target.region != self.region:
            return False
        if self.target is not None and target.epoch <= self.target.epoch:
            return False
        self.target = target
        return True

    def state(self, now: float) -> TargetState:
        t = self.target
        if t is None:
            return TargetState(None, self.base, 0.0, {}, False)
        if t.expired(now):
            return TargetState(t.epoch, self.base, 0.0, {}, True)
        candidates = min(max(t.rma.candidates, self.base), max(t.rma.max, self.base))
        levels = t.rma.levels if t.rma.levels is not None else {}
        explore = t.sbm.explore if t.sbm.explore is not None else 0.0
        return TargetState(
            t.epoch, candidates, t.sbm.coverage, t.sbm.segments, False, levels, explore
        )

    def transitions(self, now: float) -> list[tuple[str, int]]:
        """``("target.applied", epoch)`` for a new live target, ``("target.expired", epoch)``
        when the one in force lapses; each reported once."""
        t = self.target
        out: list[tuple[str, int]] = []
        if t is None:
            return out
        if t.expired(now):
            if self._expired_epoch != t.epoch:
                self._expired_epoch = t.epoch
                out.append(("target.expired", t.epoch))
        elif self._announced_epoch != t.epoch:
            self._announced_epoch = t.epoch
            out.append(("target.applied", t.epoch))
        return out


# ------------------------------------------------------------------------------------------------


class PrecomputeLookup(Protocol):
    """What the client needs of a precompute cache: :class:`headroom.workers.precompute_lookup.
    PrecomputeCache`, or an in-memory stand-in in tests."""

    def visit(
        self, user: int, now: float, *, hold_out: bool = False, segment: str | None = None
    ) -> Visit: ...

    def expire(self, now: float) -> Expired: ...

    def take_window(self) -> dict[str, Any]: ...


class GroundTruth(Protocol):
    """The ranking world's ground truth, as the client measures a hit against it."""

    def ad_quality(self, user: int, segment: str, ads: Any, t_s: float = 0.0) -> Any: ...

    def rank(self, user: int, segment: str, n: int, model: Any, t_s: float = 0.0) -> Any: ...


class PrecomputePath:
    """The look-up before live ranking and the measurement of a hit (module docstring).

    :meth:`look` asks the cache, with the request's holdout draw: a result is never served past
    its ``expires_at`` (the store's rule) nor to a request of another segment. :meth:`hit`
    turns a HIT into the request's :class:`Outcome`: delivered value ``value × quality`` at visit
    time ``t_s`` of the stored ranking's first ad; baseline value the same for the first ad of a
    live base ranking (``base_candidates``, base model) at ``t_s``; lever ``precompute``; cost
    the look-up only. Times: ``wall`` is event time (the cache's clock), ``t_s`` scenario time;
    staleness and remaining life are reported in scenario seconds (``× speed``).
    """

    def __init__(self, cache: PrecomputeLookup, base_candidates: int, speed: float = 1.0) -> None:
        if not speed > 0.0:
            raise ConfigError(f"--speed: must be > 0, got {speed}")
        self.cache = cache
        self.base = base_candidates
        self.speed = speed

    def look(self, user: int, segment: str, wall: float, *, control: bool) -> Visit:
        return self.cache.visit(user, wall, hold_out=control, segment=segment)

    def hit(
        self,
        msg: messages.Request,
        visit: Visit,
        world: GroundTruth,
        *,
        wall: float,
        t_s: float,
        partition: int,
        offset: int,
        lookup_ms: float,
        end_t: float | None = None,
        stratum: int | None = None,
    ) -> Outcome:
        result = visit.result
        if visit.outcome is not VisitOutcome.HIT or result is None or not result.ranking:
            raise ValueError(f"not a servable hit: {visit.outcome.value}")
        if result.expires_at < wall:  # the cache's rule, re-checked where it is served
            raise ValueError(f"result of user {msg.user} expired at {result.expires_at} < {wall}")
        base_top = int(world.rank(msg.user, msg.segment, self.base, "base", t_s).top_ad)
        q = world.ad_quality(msg.user, msg.segment, [int(result.ranking[0]), base_top], t_s)
        return Outcome(
            partition=partition,
            offset=offset,
            segment=msg.segment,
            end_t=t_s if end_t is None else end_t,
            latency_ms=lookup_ms,
            ok=True,
            timeout=False,
            control=False,
            lever="precompute",
            sbm_served=False,
            routed="precompute",
            value_total=msg.value * float(q[0]),
            value_baseline=msg.value * float(q[1]),
            cost_cpu_ms=lookup_ms,
            precompute=VisitOutcome.HIT.value,
            staleness_s=(visit.staleness_s or 0.0) * self.speed,
            remaining_s=(result.expires_at - wall) * self.speed,
            stratum=stratum,
            value_signal=msg.value,
        )


# ------------------------------------------------------------------------------------------------


class _Server:
    """A connection to one server, its client-side shedder, and reconnection."""

    def __init__(self, address: ServerAddress, shed: ClientShedConfig, now: float) -> None:
        self.address = address
        self.wire = WireClient(address.host, address.port)
        self.shedder = ClientShedder(shed, now)
        self.retry_at = 0.0  # monotonic time of the next connection attempt
        self.failures = 0

    @property
    def up(self) -> bool:
        return not self.wire.closed


# ------------------------------------------------------------------------------------------------


class _Rebalance(ConsumerRebalanceListener):  # type: ignore[misc]
    def __init__(self, client: RankingClient) -> None:
        self.client = client

    async def on_partitions_revoked(self, revoked: Any) -> None:
        self.client.published_known.clear()  # until the next assignment's check is done
        await self.client.on_revoked([tp.partition for tp in revoked])

    async def on_partitions_assigned(self, assigned: Any) -> None:
        partitions = [tp.partition for tp in assigned]
        await self.client.learn_published(partitions)
        await self.client.commit_start(partitions)
        self.client.on_assigned(partitions)


class RankingClient(Service):
    """One client of a region (see the module docstring)."""

    name = "client"
    # Test seam, never set in production: awaited by :meth:`flush` after the broker acknowledged
    # the flush's lines and before the offset commit, so a test can stop a client exactly there
    # (the crash the published-prefix check covers).
    before_commit: Callable[[], Awaitable[None]] | None = None
    # Test seam, never set in production: awaited by :meth:`flush` after the broker acknowledged
    # the flush's lines and before their value signals are sent.
    before_values: Callable[[], Awaitable[None]] | None = None

    def __init__(
        self,
        config: ClientConfig,
        scenario: Scenario,
        kafka: KafkaTarget,
        *,
        metrics: Metrics | None = None,
        clock: Callable[[], float] = time.time,
        world: RankingWorld | None = None,
        cache: PrecomputeLookup | None = None,
    ) -> None:
        """``cache``: where precomputed results are looked up (default, when the scenario enables
        precompute and ``config.precompute``: a :class:`PrecomputeCache` on ``headroom.precompute``
        that this client starts and stops). A cache given here is used as it is."""
        super().__init__()
        self.config = config
        self.scenario = scenario
        self.kafka = kafka
        self.metrics = metrics
        if metrics is not None:
            metrics.slo.labels(config.region).set(scenario.slo.p99_ms / 1000.0)
            metrics.target_held.labels(config.region).set(1.0)
        self._wall = clock
        self.log = self.log.bind(region=config.region, client=config.name)
        try:
            scenario.region(config.region)
        except KeyError:
            raise ConfigError(
                f"--region: {config.region!r} is not a region of scenario {scenario.name!r}"
            ) from None
        w = scenario.world
        self.base = w.base_candidates
        self.world = world
        self.targets = TargetBook(config.region, w.base_candidates)
        self.planner = RequestPlanner(
            PlanRule(
                holdout=w.holdout,
                base=w.base_candidates,
                max=w.max_candidates,
                value_ranked_rma=config.value_ranked_rma,
                value_ranked_sbm=config.value_ranked_sbm,
                bins=VALUE_BINS,
            ),
            seeds.process_rng(config.seed),
        )
        self.windows = WindowBook(
            config.region, scenario.slo.window_s, [s.name for s in scenario.segments]
        )
        # None: a duplicate request (an id served before), dropped but committed in order
        self.offsets: OffsetTracker[Outcome | None] = OffsetTracker()
        self.seen_ids = RecentIds(SEEN_IDS)
        # per partition: the highest offset already published beyond the group's last commit
        # (read when the partition is assigned); requests up to it are dropped as duplicates
        self._published_end: dict[int, int] = {}
        self._revoked: set[int] = set()  # revoked, state kept until the next assignment
        # set once the check of the current assignment is done: requests wait for it (the
        # consumer may hand out records of new partitions before the rebalance listener ran)
        self.published_known = asyncio.Event()
        # where the events partition of this client's window lines ends after its last
        # acknowledged flush: (partition, offset), the metadata of the next commit
        self._events_mark: tuple[int, int] | None = None
        self._dup_pending = 0  # duplicates dropped, not yet on a window line
        # value signals: one producer id per process start, and their sequence numbers
        self.producer_id = value_producer_id(config.instance or config.name)
        self._value_seq = 0
        self._segments = frozenset(seg.name for seg in scenario.segments)
        self.ranker = ValueRanker()  # value rank among all requests: the strong shedder's order
        # value rank within each segment: value-ranked SBM and the value signals' strata
        self.segment_rankers = {seg: ValueRanker() for seg in sorted(self._segments)}
        now = self._wall()
        self._servers = [_Server(a, config.shed, now) for a in config.servers]
        self._ids = 0
        self._slots = asyncio.Semaphore(config.max_in_flight)
        rate = config.catch_up_rate
        if rate is None:
            rate = catch_up_rate(scenario, config.region, speed=config.speed)
        # its token bucket runs on the monotonic clock (the pacing's sleeps), lags on the wall's
        self.catch_up = CatchUp(
            CatchUpConfig(rate=rate, lag_s=config.catch_up_lag_s), time.monotonic()
        )
        self._catching_up = False  # between client.catch_up.started and .ended
        self._last_late = 0.0  # wall time the last late request was taken
        self._inflight: dict[int, int] = {}  # partition -> requests in flight
        self._inflight_zero = asyncio.Event()
        self._inflight_zero.set()
        self._finished = asyncio.Condition()  # notified whenever a request finishes
        self._publish_lock = asyncio.Lock()
        self._last_window = -(1 << 62)
        self._producer: Any = None
        self._consumer: Any = None
        self._loops: list[ConsumerLoop] = []
        self._assigned: set[int] = set()
        self.ready = asyncio.Event()  # set once partitions are assigned and positioned
        self.stats = {"requests": 0, "published": 0, "errors": 0, "commits": 0, "duplicates": 0}
        slo = scenario.slo.p99_ms
        self._sbm_budget_ms = slo * config.sbm_budget_share
        self._base_timeout_s = slo * config.base_timeout_share / 1000.0
        self._timeout_ms = slo * config.timeout_share
        self._optional_budget_ms = slo * config.optional_budget_share
        self._costs = scenario.models
        self._own_cache: Service | None = None  # a cache this client starts and stops
        self.precompute: PrecomputePath | None = None
        if cache is None and config.precompute and scenario.precompute_enabled:
            from headroom.workers.precompute_lookup import PrecomputeCache

            own = PrecomputeCache(config.region, kafka, speed=config.speed, clock=clock)
            self._own_cache = own
            cache = own
        if cache is not None:
            self.precompute = PrecomputePath(cache, w.base_candidates, config.speed)
        # used / expired_unused counted by the cache, not yet on a window line
        self._pre_pending: dict[str, int] = {"used": 0, "expired_unused": 0}
        # a held target (defences/plan.py): the request rate now and when the target in force
        # was applied, and the factor last logged
        self._interval_s = (
            config.control_interval_s
            if config.control_interval_s is not None
            else scenario.control.interval_s
        )
        self._reset_rates()
        self._held_scale = 1.0

    # -- time --------------------------------------------------------------------------------------

    def scenario_time(self, wall: float | None = None) -> float:
        wall = self._wall() if wall is None else wall
        return (wall - self.config.t0) * self.config.speed

    # -- lifecycle ---------------------------------------------------------------------------------

    async def on_start(self) -> None:
        if self.world is None:
            self.world = RankingWorld.from_scenario(self.scenario)
        if self._own_cache is not None:
            await self._start_cache(self._own_cache)
        for server in self._servers:
            await self._connect(server)
        self._producer = make_producer(self.kafka.bootstrap, linger_ms=2)
        await self._producer.start()
        self.add_task(self._consume_targets(), name="targets")
        self.add_task(self._consume_requests(), name="requests")
        self.add_task(self._tick(), name="tick")
        self.log.info(
            "client.started",
            servers=[str(s.address) for s in self._servers],
            group=self.config.group,
        )

    async def on_drain(self) -> None:
        for loop in self._loops:
            loop.stop()
        await self._inflight_zero.wait()
        await self.flush()

    async def _start_cache(self, cache: Service) -> None:
        """Start the precompute cache and wait until it has read the topic to its end, so the
        first requests already find the results stored before this client started."""
        await cache.start()
        ready: asyncio.Event = cache.ready  # type: ignore[attr-defined]
        try:
            await asyncio.wait_for(ready.wait(), self.config.precompute_ready_s)
        except TimeoutError:
            raise HeadroomError(
                f"the precompute cache did not catch up with {self.kafka.topic('precompute')} "
                f"within {self.config.precompute_ready_s:.0f} s"
            ) from None
        self.log.info("client.precompute.ready", results=len(cache))  # type: ignore[arg-type]

    async def on_stop(self) -> None:
        for loop in self._loops:
            loop.stop()
        if self._own_cache is not None:
            await self._own_cache.stop()
        for server in self._servers:
            await server.wire.close()
        if self._producer is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._producer.flush(), 5.0)
            await self._producer.stop()
        self.log.info("client.stopped", **self.stats)

    # -- targets -----------------------------------------------------------------------------------

    async def _consume_targets(self) -> None:
        consumer = make_consumer(
            self.kafka.bootstrap, self.kafka.topic("targets"), from_beginning=True
        )

        def handle(rec: Received) -> None:
            msg = rec.message
            if isinstance(msg, messages.Target) and self.targets.offer(msg):
                self.log.debug("client.target.received", epoch=msg.epoch)
                self._target_transitions()

        async with started(consumer, self.kafka.bootstrap):
            loop = ConsumerLoop(
                consumer,
                self._producer,
                handle,
                prefix=self.kafka.prefix,
                config=LoopConfig(poll_timeout_s=0.05),
                component="client",
                commit=False,
            )
            self._loops.append(loop)
            if self.metrics is not None:
                self.metrics.watch(loop, consumer)
            await loop.run()

    def _target_transitions(self) -> None:
        now = self._wall()
        for kind, epoch in self.targets.transitions(now):
            fields: dict[str, Any] = {"epoch": epoch}
            t = self.targets.target
            if kind == "target.applied" and t is not None:
                self._rate_at_apply = self.rates.rate(self.scenario_time(now))
                fields["delay_ms"] = max(0.0, (now - t.ts) * 1000.0)
                fields["rma_candidates"] = t.rma.candidates
                fields["sbm_coverage"] = t.sbm.coverage
            self.log.info(f"client.{kind}", **fields)
            self.add_task(self._emit(kind, fields), name=kind)
        if self.metrics is not None:
            state = self.targets.state(now)
            self.metrics.target_candidates.labels(self.config.region).set(state.rma_candidates)
            self.metrics.target_coverage.labels(self.config.region).set(state.sbm_coverage)
            self.metrics.target_expired.labels(self.config.region).set(int(state.expired))

    # -- requests ----------------------------------------------------------------------------------

    async def _consume_requests(self) -> None:
        consumer = make_consumer(
            self.kafka.bootstrap,
            group_id=self.config.group,
            from_beginning=False,
            group_instance_id=self.config.instance,
        )
        consumer.subscribe([self.kafka.topic("requests")], listener=_Rebalance(self))
        self._consumer = consumer
        async with started(consumer, self.kafka.bootstrap):
            loop = ConsumerLoop(
                consumer,
                self._producer,
                self._on_request,
                prefix=self.kafka.prefix,
                config=LoopConfig(poll_timeout_s=0.05, batch_max=100),
                component="client",
                commit=False,  # offsets are committed after the windows are published
            )
            self._loops.append(loop)
            if self.metrics is not None:
                self.metrics.watch(loop, consumer)
            await loop.run()
            await self._inflight_zero.wait()
            await self.flush()

    async def learn_published(self, partitions: list[int]) -> None:
        """Before the first request of newly assigned partitions: what was published beyond the
        group's last commit (a crash between a flush's acknowledgement and its commit), so those
        requests are dropped instead of served twice. A failure to read it is logged and the
        client goes on without (the old at-least-once behaviour)."""
        try:
            await self._learn_published(partitions)
        finally:
            self.published_known.set()

    async def _learn_published(self, partitions: list[int]) -> None:
        moved = self._revoked - set(partitions)
        self._revoked.clear()
        self.offsets.forget(moved)
        for p in moved | set(partitions):
            self._published_end.pop(p, None)
        if not partitions:
            return
        try:
            published = await asyncio.wait_for(
                read_published_ends(
                    self.kafka,
                    self.config.group,
                    partitions,
                    region=self.config.region,
                    policy=self.config.policy,
                ),
                PUBLISHED_CHECK_S,
            )
        except Exception as exc:
            self.log.warning(
                "client.published.unknown",
                error=f"{type(exc).__name__}: {exc}",
                partitions=partitions,
            )
            return
        ends = published.ends
        if ends:
            self.log.warning("client.published.uncommitted", ends=ends)
        self._published_end.update(ends)
        if published.value_signals:
            # the value of those requests, as their lines carry it: the controller drops the
            # signals that had gone out (same producer and seq) and counts the others
            try:
                await self._send_value_signals(published.value_signals, resent=True)
            except Exception as exc:
                self.log.warning("client.value.resend_failed", error=f"{type(exc).__name__}: {exc}")
            else:
                self.log.info("client.value.resent", signals=len(published.value_signals))

    async def commit_start(self, partitions: list[int]) -> None:
        """A first commit for the partitions the group never committed (:func:`commit_start`);
        a failure is logged (``client.commit.failed``) and a kill before the first flush's
        commit then loses what was read, as a new group starting at the end does."""
        if self._consumer is None:
            return
        try:
            started = await commit_start(
                self._consumer, self._producer, self.kafka, partitions, region=self.config.region
            )
        except Exception as exc:
            self.log.warning("client.commit.failed", error=f"{type(exc).__name__}: {exc}")
            return
        if started:
            self.offsets.committed(started)
            self.log.info("client.commit.start", offsets=started)

    def on_assigned(self, partitions: list[int]) -> None:
        self._assigned.update(partitions)
        # the client's request rate is its partitions' share of the region's: a new share is a
        # new basis, so no target is held (defences/plan.py) until the next one is applied
        self._reset_rates()
        self.log.info("client.partitions.assigned", partitions=sorted(partitions))
        self.add_task(self._mark_ready(partitions), name="ready")

    async def _mark_ready(self, partitions: list[int]) -> None:
        consumer = self._consumer
        topic = self.kafka.topic("requests")
        for p in partitions:
            with contextlib.suppress(Exception):
                await consumer.position(TopicPartition(topic, p))
        self.ready.set()

    async def on_revoked(self, partitions: list[int]) -> None:
        """Before partitions move: finish their requests, publish, commit (module docstring)."""
        if not partitions:
            return
        self.log.info("client.partitions.revoked", partitions=sorted(partitions))
        wait_s = 2.0 * self._timeout_ms / 1000.0 + 1.0
        async with self._finished:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(
                    self._finished.wait_for(
                        lambda: not any(self._inflight.get(p, 0) for p in partitions)
                    ),
                    wait_s,
                )
        await self.flush()
        self._assigned.difference_update(partitions)
        # their state is dropped once the new assignment is known, and only if they moved: a
        # partition handed back (a static member that rejoins) keeps its requests in flight
        self._revoked.update(partitions)

    async def _on_request(self, rec: Received) -> None:
        msg = rec.message
        if not isinstance(msg, messages.Request):
            return
        if msg.region != self.config.region:
            # another region's request (every region's shards share the partitions): not ours
            return
        if msg.segment not in self._segments:
            # valid by the contract, but not rankable here: the loop dead-letters it with this
            raise ValueError(
                f"segment: {msg.segment!r} is not a segment of scenario {self.scenario.name!r} "
                f"({', '.join(sorted(self._segments))})"
            )
        await self.published_known.wait()
        if self.offsets.holds(rec.partition, rec.offset):
            # read again after a rebalance that handed the partition back, while the first read
            # is still in flight or unpublished: that one stands
            self.stats["duplicates"] += 1
            self._dup_pending += 1
            return
        new_id = self.seen_ids.add(msg.id)
        if not new_id or rec.offset <= self._published_end.get(rec.partition, -1):
            # re-delivered (a feed that published it again, a producer retry, a rebalance), or
            # published already by a client that crashed before its commit: served once
            self.offsets.received(rec.partition, rec.offset)
            self.offsets.completed(rec.partition, rec.offset, None)
            self.stats["duplicates"] += 1
            self._dup_pending += 1
            return
        late = self._late(msg)
        if late:
            # a backlog goes at the catch-up rate, not as fast as it is read
            delay = self.catch_up.wait(time.monotonic())
            if delay > 0.0:
                await asyncio.sleep(delay)
        await self._slots.acquire()
        self.offsets.received(rec.partition, rec.offset)
        self._inflight[rec.partition] = self._inflight.get(rec.partition, 0) + 1
        self._inflight_zero.clear()
        self.add_task(self._serve(msg, rec.partition, rec.offset, late), name="request")

    def _late(self, msg: messages.Request) -> bool:
        """Whether the request waited too long in the topic (the catch-up rule). Logged: the
        first late request (``client.catch_up.started``), and the first request on time once
        none was late for ``catch_up_lag_s`` (``client.catch_up.ended``; a backlog spread over
        several partitions comes back out of time order, late and on time in turn)."""
        now = self._wall()
        late = self.catch_up.late(msg.ts, now)
        lag = round(now - msg.ts, 3)
        if late:
            self._last_late = now
            if not self._catching_up:
                self._catching_up = True
                rate = round(self.catch_up.config.rate, 1)
                self.log.info("client.catch_up.started", lag_s=lag, rate=rate)
        elif self._catching_up and now - self._last_late > self.config.catch_up_lag_s:
            self._catching_up = False
            late_requests = self.catch_up.late_requests
            self.log.info("client.catch_up.ended", lag_s=lag, late_requests=late_requests)
        return late

    async def _serve(
        self, msg: messages.Request, partition: int, offset: int, late: bool = False
    ) -> None:
        try:
            try:
                outcome = await self.serve_request(msg, partition, offset, late=late)
            except Exception:  # a bug must not stall the partition's commits: count it
                self.log.exception("client.request.failed", id=msg.id)
                outcome = Outcome(
                    partition=partition, offset=offset, segment=msg.segment,
                    end_t=self.scenario_time(), latency_ms=0.0, ok=False, timeout=False,
                    control=False, lever=None, sbm_served=False, routed=None,
                    value_total=0.0, value_baseline=0.0,
                )  # fmt: skip
                self.stats["errors"] += 1
            self.offsets.completed(partition, offset, outcome)
            self.stats["requests"] += 1
        finally:
            self._slots.release()
            self._inflight[partition] -= 1
            if not any(self._inflight.values()):
                self._inflight_zero.set()
            async with self._finished:
                self._finished.notify_all()

    def _dedicated(self, exclude: Iterable[_Server] = ()) -> _Server | None:
        skip = set(map(id, exclude))
        candidates = [
            s for s in self._servers if s.address.pool == "dedicated" and s.up and id(s) not in skip
        ]
        if not candidates:
            return None
        return min(candidates, key=lambda s: s.wire.in_flight)

    def _strong(self) -> _Server | None:
        candidates = [s for s in self._servers if s.address.pool == "opportunistic" and s.up]
        if not candidates:
            return None
        return min(candidates, key=lambda s: s.wire.in_flight)

    def _reset_rates(self) -> None:
        """A new rate basis: the meter starts now, and no rate is known for the target in force
        (nothing is held until the next target is applied)."""
        self.rates = held_rate_meter(float(self.scenario.slo.window_s), self.scenario_time())
        self._rate_at_apply = 0.0

    def held_target(self, state: TargetState, now_t: float) -> TargetState:
        """The target in force, its strong-model shares held at the rate they were planned for
        once it is older than the control plane's interval allows (defences/plan.py, *A held
        target*); logs ``client.target.held`` when the factor changes."""
        t = self.targets.target
        scale = 1.0
        if t is not None and not state.expired and state.sbm_coverage > 0.0:
            scale = held_scale(
                now_t - self.scenario_time(t.ts),
                self._interval_s,
                self._rate_at_apply,
                self.rates.rate(now_t),
            )
        if scale != self._held_scale:
            self._held_scale = scale
            self.log.info("client.target.held", epoch=state.epoch, scale=scale)
            if self.metrics is not None:
                self.metrics.target_held.labels(self.config.region).set(scale)
        if scale == 1.0:
            return state
        segments, coverage = held_shares(state.sbm_segments, state.sbm_coverage, scale)
        return replace(state, sbm_segments=segments, sbm_coverage=coverage)

    async def serve_request(
        self, msg: messages.Request, partition: int, offset: int, *, late: bool = False
    ) -> Outcome:
        """Plan, serve (with fallbacks), measure one request. ``late`` (the catch-up rule): no
        optional work, as under an expired target; the holdout draw is made as ever."""
        wall = self._wall()
        now_t = self.scenario_time(wall)
        self.rates.add(now_t)
        target = self.held_target(self.targets.state(wall), now_t)
        if late:
            target = TargetState(target.epoch, self.base, 0.0, {}, target.expired)
        self.ranker.observe(msg.value)
        rank = self.ranker.rank(msg.value)
        seg_ranker = self.segment_rankers.get(msg.segment)
        if seg_ranker is None:
            seg_ranker = self.segment_rankers[msg.segment] = ValueRanker()
        seg_ranker.observe(msg.value)
        seg_rank = seg_ranker.rank(msg.value)
        stratum = value_stratum(seg_rank)
        dedicated = self._dedicated()
        strong = self._strong()
        m = dedicated.shedder.multiplier_at(wall) if dedicated is not None else 0.0
        keeps = strong is not None and strong.shedder.keeps(rank, wall)
        plan = self.planner.plan(
            segment=msg.segment,
            eligible=msg.eligible,
            target=target,
            rma_multiplier=m,
            sbm_keeps=keeps,
            sbm_available=strong is not None,
            rma_keeps=dedicated is not None and dedicated.shedder.keeps(rank, wall),
            value=msg.value,
            segment_rank=seg_rank,
        )
        looked: str | None = None
        if self.precompute is not None:
            t_look = time.perf_counter()
            visit = self.precompute.look(msg.user, msg.segment, wall, control=plan.control)
            lookup_ms = (time.perf_counter() - t_look) * 1000.0
            looked = visit.outcome.value
            # the plan's rule for a stored result (defences/plan.py, step 5): a hit runs nothing
            # of its plan live
            if serves_from_store(control=plan.control, found=visit.outcome is VisitOutcome.HIT):
                return self._serve_hit(
                    msg, visit, wall, now_t, partition, offset, lookup_ms, stratum
                )
        start = time.monotonic()
        response: RankResponse | None = None
        sbm_served = False
        if plan.strong and strong is not None:
            response = await self._call_strong(strong, msg, now_t)
            sbm_served = response is not None
        if response is None:
            extra = 0 if plan.strong else plan.extra
            response = await self._call_base(msg, now_t, extra, dedicated)
        latency_ms = (time.monotonic() - start) * 1000.0
        end_t = self.scenario_time()
        ok = response is not None and response.ok
        timeout = latency_ms > self._timeout_ms
        lever: str | None = None
        value_total = value_baseline = 0.0
        cost_cpu = cost_acc = 0.0
        models = self._costs
        if response is not None and response.ok:
            assert self.world is not None
            q_top, q_base = self.world.ad_quality(
                msg.user, msg.segment, [response.top_ad, response.base_top_ad], now_t
            )
            value_total = msg.value * float(q_top)
            value_baseline = msg.value * float(q_base)
            if sbm_served:
                lever = "sbm"
                n = response.candidates
                cost_cpu = n * models.strong.cpu_ms_per_candidate
                cost_acc = n * models.strong.accelerator_ms_per_candidate
            elif response.candidates > self.base:
                lever = "rma"
                extra = response.candidates - self.base
                cost_cpu = extra * models.base.cpu_ms_per_candidate
                cost_acc = extra * models.base.accelerator_ms_per_candidate
        elif self.world is not None:
            # a failed request delivers nothing; what the baseline would have delivered for it
            # (the base model's first ad) is its lost value (docs/events.md ``value_lost``)
            base = self.world.rank(msg.user, msg.segment, self.base, "base", now_t)
            value_baseline = msg.value * float(base.quality)
        path = lever or "base"
        if self.metrics is not None:
            outcome_label = "timeout" if timeout else ("ok" if ok else "error")
            self.metrics.requests.labels(self.config.region, path, outcome_label).inc()
            self.metrics.latency.labels(self.config.region, path).observe(latency_ms / 1000.0)
        if not ok:
            self.stats["errors"] += 1
        return Outcome(
            partition=partition,
            offset=offset,
            segment=msg.segment,
            end_t=end_t,
            latency_ms=latency_ms,
            ok=ok,
            timeout=timeout,
            control=plan.control,
            lever=lever,
            sbm_served=sbm_served,
            routed=None if plan.control else ("sbm" if plan.strong else "rma"),
            value_total=value_total,
            value_baseline=value_baseline,
            cost_cpu_ms=cost_cpu,
            cost_accelerator_ms=cost_acc,
            precompute=looked,
            stratum=stratum,
            value_signal=msg.value,
        )

    def _serve_hit(
        self,
        msg: messages.Request,
        visit: Visit,
        wall: float,
        now_t: float,
        partition: int,
        offset: int,
        lookup_ms: float,
        stratum: int | None = None,
    ) -> Outcome:
        """A request served from its stored result: no server call (:class:`PrecomputePath`)."""
        assert self.precompute is not None
        assert self.world is not None
        outcome = self.precompute.hit(
            msg, visit, self.world, wall=wall, t_s=now_t, partition=partition, offset=offset,
            lookup_ms=lookup_ms, end_t=self.scenario_time(), stratum=stratum,
        )  # fmt: skip
        if self.metrics is not None:
            self.metrics.requests.labels(self.config.region, "precompute", "ok").inc()
            self.metrics.latency.labels(self.config.region, "precompute").observe(
                lookup_ms / 1000.0
            )
        return outcome

    def _request(self, msg: messages.Request, t_s: float, extra: int, model: str) -> RankRequest:
        self._ids += 1
        return RankRequest(
            id=self._ids,
            user=msg.user,
            segment=msg.segment,
            t_s=t_s,
            base=self.base,
            extra=extra,
            model=model,  # type: ignore[arg-type]
            value=msg.value,
            budget_ms=self._sbm_budget_ms if model == "strong" else self._optional_budget_ms,
        )

    async def _call_strong(
        self, server: _Server, msg: messages.Request, t_s: float
    ) -> RankResponse | None:
        """An SBM attempt; None means: serve it on the base model instead."""
        request = self._request(msg, t_s, 0, "strong")
        try:
            response = await server.wire.call(request, self._sbm_budget_ms / 1000.0 * 2.0)
        except ServerUnavailable as exc:
            self._lost(server, str(exc))
            return None
        except TimeoutError:
            return None
        self._health(server, response, "sbm")
        if response.ok:
            return response
        if self.metrics is not None:
            self.metrics.shed.labels(self.config.region, "server", "sbm").inc()
        return None

    async def _call_base(
        self, msg: messages.Request, t_s: float, extra: int, first: _Server | None
    ) -> RankResponse | None:
        """Baseline (or RMA) on a dedicated replica, retried once on another if one is lost."""
        tried: list[_Server] = []
        server = first if first is not None and first.up else self._dedicated()
        for _attempt in range(2):
            if server is None:
                return None
            tried.append(server)
            request = self._request(msg, t_s, extra, "base")
            try:
                response = await server.wire.call(request, self._base_timeout_s)
            except ServerUnavailable as exc:
                self._lost(server, str(exc))
                server = self._dedicated(exclude=tried)
                continue
            except TimeoutError:
                server = self._dedicated(exclude=tried)
                continue
            self._health(server, response, "rma")
            return response
        return None

    def _health(self, server: _Server, response: RankResponse, lever: str) -> None:
        now = self._wall()
        t = server.shedder.on_response(now, response.health.overloaded, response.health.queue_ms)
        if self.metrics is not None:
            self.metrics.multiplier.labels(self.config.region, str(server.address)).set(
                server.shedder.multiplier_at(now)
            )
        if t is not None:
            self._shedding_event(t, lever, server)

    def _shedding_event(self, t: ShedTransition, lever: str, server: _Server) -> None:
        fields = {
            "side": "client",
            "lever": lever,
            "dropped": t.dropped,
            "multiplier": t.multiplier,
            "server": str(server.address),
        }
        self.log.info(f"client.{t.event.value}", **fields)
        self.add_task(self._emit(t.event.value, fields), name="shedding")

    def _lost(self, server: _Server, reason: str) -> None:
        if server.failures == 0:
            self.log.warning("client.server.lost", server=str(server.address), reason=reason)
        server.failures += 1
        server.retry_at = time.monotonic() + self.config.reconnect_s

    async def _connect(self, server: _Server) -> None:
        try:
            await server.wire.connect()
        except ServerUnavailable as exc:
            if server.failures == 0:
                self.log.warning(
                    "client.server.unreachable", server=str(server.address), reason=str(exc)
                )
            server.failures += 1
            server.retry_at = time.monotonic() + self.config.reconnect_s
            return
        if server.failures:
            self.log.info("client.server.reconnected", server=str(server.address))
        server.failures = 0

    # -- periodic work -----------------------------------------------------------------------------

    async def _tick(self) -> None:
        next_flush = time.monotonic() + self.config.flush_s
        while await self.sleep(self.config.publish_tick_s):
            now = self._wall()
            self._target_transitions()
            for server in self._servers:
                if not server.up and time.monotonic() >= server.retry_at:
                    await self._connect(server)
                t = server.shedder.poll(now)
                if t is not None:
                    lever = "rma" if server.address.pool == "dedicated" else "sbm"
                    self._shedding_event(t, lever, server)
            window_ended = self.windows.index(self.scenario_time(now)) > self._last_window
            if time.monotonic() >= next_flush or window_ended:
                next_flush = time.monotonic() + self.config.flush_s
                self._last_window = self.windows.index(self.scenario_time(now))
                await self.flush()

    async def flush(self) -> None:
        """Publish every finished request that can be (:meth:`OffsetTracker.release`), as one
        line per window it ended in, wait for the broker's acknowledgement, then commit."""
        async with self._publish_lock:
            now = self._wall()
            released = self.offsets.release_spans()
            for outcome in released.items:
                if outcome is not None:
                    self.windows.add(outcome)
            keys = self.windows.open_windows
            state = self.targets.state(now)
            targets = {"rma_candidates": state.rma_candidates, "sbm_coverage": state.sbm_coverage}
            self._collect_cache_counts(now)
            signals: list[messages.ValueSignal] = []  # sent once their lines are acknowledged
            lines: list[tuple[dict[str, Any], float]] = []  # this flush's window lines, ts
            line_futures = []
            for k in keys:
                w = self.windows.take(k)
                if w is None or w.requests == 0:
                    continue
                end_ts = self.config.t0 + (k + 1) * self.windows.window_s / self.config.speed
                ts = min(now, end_ts)
                fields = self.windows.event_fields(w, targets=targets, source=self.config.name)
                own = []
                for signal in self.windows.value_signals(w, ts):
                    own.append(
                        msgspec.structs.replace(
                            signal, producer=self.producer_id, seq=self._value_seq
                        )
                    )
                    self._value_seq += 1
                if own:
                    fields["value_signals"] = [msgspec.to_builtins(x) for x in own]
                    signals.extend(own)
                self._attach_cache_counts(fields)
                self._attach_duplicates(fields)
                lines.append((fields, ts))
                self.stats["published"] += w.requests
            uncovered = _uncovered(released.spans, [f for f, _ts in lines])
            if any(self._pre_pending.values()) or self._dup_pending or uncovered:
                # results that expired unused, duplicates dropped, while no request was
                # published: a line of their own
                k = self.windows.index(self.scenario_time(now))
                ws = self.windows.window_s
                fields = window_event(k * ws, (k + 1) * ws, client=self.config.name)
                self._attach_cache_counts(fields)
                self._attach_duplicates(fields)
                lines.append((fields, now))
            if uncovered:
                # the released offsets no request line covers (dropped duplicates): on the last
                # line, so the lines cover every offset released (the published-prefix check)
                spans = lines[-1][0].setdefault("offsets", {})
                for p, (first, last) in uncovered.items():
                    span = spans.get(str(p))
                    spans[str(p)] = [first, last] if span is None else [span[0], max(span[1], last)]
            for fields, ts in lines:
                line_futures.append(await self._send_event("window", fields, ts))
            if line_futures:
                results = await asyncio.gather(*line_futures)
                last = results[-1]
                self._events_mark = (int(last.partition), int(last.offset) + 1)
            if self.before_values is not None:
                await self.before_values()
            # the lines are acknowledged: now their value signals (a crash in between is
            # repaired from the lines by the restart, module docstring), then the commit
            await self._send_value_signals(signals)
            if self.before_commit is not None:
                await self.before_commit()
            await self._commit()

    async def _send_value_signals(
        self, signals: Sequence[messages.ValueSignal], *, resent: bool = False
    ) -> None:
        """Send ``signals`` and wait for the broker's acknowledgement of every one (``resent``:
        another process's, sent again: not in this process's value counters)."""
        futures = []
        for signal in signals:
            futures.append(
                await self._producer.send(
                    self.kafka.topic("value"), messages.encode(signal), key=signal.key()
                )
            )
            if not resent:
                self._count_value(signal)
        if futures:
            await asyncio.gather(*futures)

    def _count_value(self, signal: messages.ValueSignal) -> None:
        if self.metrics is not None:
            labels = (self.config.region, signal.lever, signal.arm)
            # values are non-negative (value signal × quality, world/ranking.py): a counter
            self.metrics.value.labels(*labels).inc(max(0.0, signal.value_sum))
            self.metrics.value_requests.labels(*labels).inc(signal.n)

    def _collect_cache_counts(self, now: float) -> None:
        """Expire the cache's results (so unused ones are counted when they expire, not when
        next looked up) and take what only the cache knows: results used for the first time and
        results that expired unused. Visits and hits come from the published requests instead,
        so they add up with the arms and the value signals exactly."""
        if self.precompute is None:
            return
        cache = self.precompute.cache
        cache.expire(now)
        counts = cache.take_window()
        for key in self._pre_pending:
            self._pre_pending[key] += int(counts.get(key, 0))

    def _attach_duplicates(self, fields: dict[str, Any]) -> None:
        """Requests dropped as duplicates since the last line (``duplicates_dropped``)."""
        if self._dup_pending:
            fields["duplicates_dropped"] = self._dup_pending
            self._dup_pending = 0

    def _attach_cache_counts(self, fields: dict[str, Any]) -> None:
        if self.precompute is None:
            return
        pre = fields.setdefault(
            "precompute", {"visits": 0, "hits": 0, "held_out": 0, "staleness_s": []}
        )
        pre.update(self._pre_pending)
        self._pre_pending = dict.fromkeys(self._pre_pending, 0)

    async def _commit(self) -> None:
        points = self.offsets.committable()
        if not points or self._consumer is None:
            return
        topic = self.kafka.topic("requests")
        offsets = {TopicPartition(topic, p): o for p, o in points.items() if p in self._assigned}
        if not offsets:
            return
        mark = self._events_mark
        meta = "" if mark is None else commit_metadata(*mark)
        try:
            await self._consumer.commit({tp: (o, meta) for tp, o in offsets.items()})
        except Exception as exc:  # a rebalance took them: the new owner re-reads (at least once)
            self.log.warning("client.commit.failed", error=f"{type(exc).__name__}: {exc}")
            return
        self.offsets.committed({tp.partition: o for tp, o in offsets.items()})
        self.stats["commits"] += 1

    # -- events ------------------------------------------------------------------------------------

    async def _send_event(self, kind: str, fields: Mapping[str, Any], ts: float) -> Any:
        extra = {"policy": self.config.policy}
        extra.update(fields)
        event = messages.Event(
            ts=ts, kind=kind, source="client", region=self.config.region, extra=extra
        )
        return await self._producer.send(
            self.kafka.topic("events"), messages.encode(event), key=event.key()
        )

    async def _emit(self, kind: str, fields: Mapping[str, Any]) -> None:
        if self._producer is None:
            return
        await self._send_event(kind, fields, self._wall())


def _uncovered(
    released: Mapping[int, tuple[int, int]], lines: Iterable[Mapping[str, Any]]
) -> dict[int, tuple[int, int]]:
    """Per partition, the released span ``[first, last]`` when no line's ``offsets`` reach its
    ``last`` (the newest requests released were dropped duplicates)."""
    covered: dict[int, int] = {}
    for fields in lines:
        for key, span in (fields.get("offsets") or {}).items():
            covered[int(key)] = max(covered.get(int(key), -1), int(span[1]))
    return {p: span for p, span in released.items() if covered.get(p, -1) < span[1]}
