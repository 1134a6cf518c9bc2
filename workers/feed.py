"""The capacity and traffic feed (``headroom feed SCENARIO [--speed X]``).

Publishes a scenario, in real time or ``X`` times faster, onto Kafka:

* ``headroom.capacity`` — the opportunistic level of every pool (region, resource, hardware;
  ``remote`` pools flagged) at scenario time 0 and at every change of its trace or of a
  ``preempt``/``grant`` event: a *level*, never a delta (docs/messages.md), reason ``preempt`` for a
  preempt event, ``reclaim`` for another step down, ``grant`` for a step up. Every level is
  re-announced every ``refresh_s`` (reason ``update``) so that a level with an announced lifetime
  (``expires_in_s``) does not lapse while the scenario still offers it; lifetimes are published
  in wall seconds (``expires_in_s / speed``).
* ``headroom.requests`` — every request of the scenario's traffic, keyed ``region/shard`` and
  written to partition ``shard``, a stable hash of the user id modulo the topic's partition
  count (:func:`headroom.streams.topics.request_shard`): a region's traffic is spread over every
  partition so that several clients of the region share it (docs/streaming.md, *Scaling out*).
  Fields: ``id``, ``segment`` (drawn by the segments' shares), ``value`` (log-normal with the
  segment's mean and sigma: ``exp(N(ln mean − σ²/2, σ))``), ``eligible`` (share
  :data:`ELIGIBLE_SHARE`, the simulator's default), ``user`` (uniform among its segment's share
  of ``world.users``, split as the simulator splits them so each user returns at its segment's
  rate; else a 31-bit id), at Poisson arrival times: per second of scenario time the count is
  the simulator's own draw (:class:`headroom.kernel.traces.ScenarioTraces`: diurnal or CSV rate,
  seeded noise, surges), spread uniformly over that second — the very counts the simulator
  draws for the same seed.
* ``headroom.events`` — ``run.started`` (scenario, seed, ``t0``, SLO, segments, regions, levers),
  one ``capacity.reclaimed`` per reclaim (every replica sees the same capacity message, so the feed
  is the one that counts it), one ``window`` line per region per SLO window with the opportunistic
  unit-seconds offered (``offered_unit_s``, all hardware, remote included, as the simulator counts
  them) and the levels at the window's end (``capacity``), and ``run.finished``.

Time: scenario time ``t`` is published at wall time ``t0 + t / speed``; every message's ``ts`` is
the wall clock when it is sent. The schedule itself (:class:`FeedSchedule`) is pure and seeded:
the same scenario and seed give the same requests and capacity changes, whatever the speed.
``control_outage`` events cannot be played by a feed (it does not own the controllers):
``headroom up`` pauses its controller for them.

Faults the feed plays itself (docs/streaming.md, *Faults*):

* ``capacity_silence`` — over ``[at_s, at_s + duration_s)`` (its region, or every region) no
  capacity message is sent, neither changes nor refreshes; at its end the newest level of every
  pool is published at once (a change that happened in the silence with its own reason, so a
  reclaim is released then) and a ``capacity.silence.ended`` event says so.
* a restart after a kill (``--resume-from S``, what ``headroom up`` passes) — no ``run.started``,
  the levels in force announced at once, the window lines from the first window ending after
  ``S``, and the requests from ``S −`` :data:`REPUBLISH_S` on: a request the killed feed had
  already sent is sent again with its id, and the clients drop it as a duplicate.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from headroom.analysis.events import window_event
from headroom.kernel.checks import FieldChecker
from headroom.kernel.scenario import Scenario
from headroom.kernel.schedule import ELIGIBLE_SHARE, CapacityUpdate, FeedSchedule
from headroom.streams import messages
from headroom.streams.kafka import KafkaTarget, make_producer
from headroom.workers.service import Service

__all__ = ["ELIGIBLE_SHARE", "CapacityUpdate", "FeedConfig", "FeedSchedule", "TrafficFeed"]

# a resumed feed publishes again the requests of this many scenario seconds before the kill: the
# killed process may have lost some it had not sent yet (the clients drop those it had)
REPUBLISH_S = 2.0
SEND_TIMEOUT_MS = 300_000  # how long a send waits for an unreachable broker before it fails


@dataclass(frozen=True, slots=True)
class FeedConfig:
    t0: float
    speed: float = 1.0
    seed: int | None = None  # None: the scenario's
    duration_s: float | None = None  # None: the scenario's
    refresh_s: float = 10.0  # wall seconds between re-announcements of every level
    policy: str = "headroom"
    lead_s: float = 0.002  # publish this early (wall): sends take a moment
    resume_from: float | None = None  # restarted after a kill at this scenario time

    def __post_init__(self) -> None:
        c = FieldChecker()
        c.clock(self.t0, self.speed)
        if self.duration_s is not None:
            c.positive("--duration", self.duration_s)
        c.positive("refresh_s", self.refresh_s)
        c.raise_if_any()


class TrafficFeed(Service):
    """Plays a :class:`FeedSchedule` onto Kafka in (scaled) real time."""

    name = "feed"

    def __init__(
        self,
        config: FeedConfig,
        scenario: Scenario,
        kafka: KafkaTarget,
        *,
        clock: Callable[[], float] = time.time,
    ) -> None:
        super().__init__()
        self.config = config
        self.scenario = scenario
        self.kafka = kafka
        self._wall = clock
        self.schedule = FeedSchedule(scenario, config.seed)
        end = self.schedule.duration_s
        if config.duration_s is not None:
            end = min(end, config.duration_s)
        self.end_t = end
        self._producer: Any = None
        self._request_partitions = 1  # of headroom.requests, known once started
        self._ids = 0
        self.finished = asyncio.Event()
        self.sent = {"requests": 0, "capacity": 0, "reclaims": 0}
        # capacity_silence spans (scenario seconds) and the region they silence (None: all)
        self.silences = [
            (e.at_s, e.at_s + (e.duration_s or 0.0), e.region)
            for e in scenario.events
            if e.kind == "capacity_silence"
        ]
        self._held: dict[tuple[str, str, str, bool], CapacityUpdate] = {}  # silenced changes
        # a restarted feed's capacity ids must not repeat the killed one's
        resume = config.resume_from
        self._id_tag = "" if resume is None else f"r{int(clock())}-"

    def wall(self, t: float) -> float:
        return self.config.t0 + t / self.config.speed

    def scenario_time(self, wall: float | None = None) -> float:
        wall = self._wall() if wall is None else wall
        return (wall - self.config.t0) * self.config.speed

    async def on_start(self) -> None:
        # the traffic source waits for a broker that restarts (a send waits up to
        # SEND_TIMEOUT_MS for it) rather than dropping what it could not send
        self._producer = make_producer(
            self.kafka.bootstrap, linger_ms=5, request_timeout_ms=SEND_TIMEOUT_MS
        )
        await self._producer.start()
        parts = await self._producer.partitions_for(self.kafka.topic("requests"))
        self._request_partitions = max(1, len(parts))
        self.add_task(self._play(), name="play")

    async def on_stop(self) -> None:
        if self._producer is not None:
            await self._producer.flush()
            await self._producer.stop()
        self.log.info("feed.stopped", **self.sent)

    async def _sleep_until(self, t: float) -> bool:
        delay = self.wall(t) - self._wall() - self.config.lead_s
        if delay > 0:
            return await self.sleep(delay)
        return not self.stop_requested

    def silenced(self, t: float, region: str) -> bool:
        """A ``capacity_silence`` holds the capacity messages of ``region`` at time ``t``."""
        return any(a <= t < b and (r is None or r == region) for a, b, r in self.silences)

    async def _play(self) -> None:
        started_wall = self._wall()
        resume = self.config.resume_from
        await self._announce_start()
        if not await self._sleep_until(0.0):
            return
        self.log.info("feed.started", t0=self.config.t0, speed=self.config.speed, end_t=self.end_t)
        updates = [u for u in self.schedule.capacity_updates() if u.t < self.end_t]
        u_next = 0
        window_s = self.scenario.slo.window_s
        next_window = window_s
        next_refresh = self.config.refresh_s * self.config.speed
        second = 0
        pending: list[tuple[float, str, dict[str, Any]]] = []
        levels: dict[tuple[str, str, str, bool], CapacityUpdate] = {}
        silence_ends = sorted({b for _a, b, _r in self.silences if b < self.end_t})
        if resume is not None:
            # restarted: the levels in force now, announced at once; the rest from here on
            now_t = max(resume, self.scenario_time())
            u_next = await self._resume_levels(updates, now_t, levels)
            next_window = (math.floor(resume / window_s) + 1) * window_s
            second = max(0, math.floor(resume - REPUBLISH_S))
            next_refresh = now_t + self.config.refresh_s * self.config.speed
            silence_ends = [b for b in silence_ends if b > now_t]
        while True:
            if not pending and second < math.ceil(self.end_t):
                pending = [r for r in self.schedule.requests(second) if r[0] < self.end_t]
                pending.reverse()  # pop() from the end = earliest first
                second += 1
                continue
            candidates = [self.end_t, next_window, next_refresh]
            candidates.extend(silence_ends[:1])
            if u_next < len(updates):
                candidates.append(updates[u_next].t)
            if pending:
                candidates.append(pending[-1][0])
            t = min(candidates)
            if t >= self.end_t:
                await self._sleep_until(self.end_t)
                break
            if not await self._sleep_until(t):
                break
            while u_next < len(updates) and updates[u_next].t <= t:
                update = updates[u_next]
                u_next += 1
                levels[(update.region, update.resource, update.hardware, update.remote)] = update
                await self._capacity(update)
            await self._end_silences(t, silence_ends, levels)
            if next_refresh <= t:
                for update in list(levels.values()):
                    await self._capacity(
                        CapacityUpdate(t, update.region, update.resource, update.hardware,
                                       update.remote, update.units, update.units, "update",
                                       update.expires_in_s)
                    )  # fmt: skip
                next_refresh += self.config.refresh_s * self.config.speed
            while pending and pending[-1][0] <= t + self.config.lead_s * self.config.speed:
                _t, region, fields = pending.pop()
                await self._request(region, fields)
            if next_window <= t:
                await self._windows(next_window - window_s, next_window)
                next_window += window_s
        # the last (possibly partial) window
        if next_window - window_s < self.end_t:
            await self._windows(next_window - window_s, min(next_window, self.end_t))
        wall_s = self._wall() - started_wall
        await self._event(
            None,
            "run.finished",
            {"wall_s": wall_s, "sim_s": self.end_t, "published": dict(self.sent)},
        )
        await self._producer.flush()
        self.log.info("feed.finished", wall_s=wall_s, **self.sent)
        self.finished.set()
        self.request_stop()

    async def _announce_start(self) -> None:
        """``run.started``, unless this feed resumes one that was killed."""
        if self.config.resume_from is None:
            await self._event(None, "run.started", self._run_fields(), ts=self.config.t0)

    async def _end_silences(
        self,
        t: float,
        ends: list[float],
        levels: dict[tuple[str, str, str, bool], CapacityUpdate],
    ) -> None:
        """The silences ending by ``t`` (``ends``, sorted, consumed)."""
        while ends and ends[0] <= t:
            ends.pop(0)
            await self._end_silence(t, levels)

    def _run_fields(self) -> dict[str, Any]:
        sc = self.scenario
        levers = ["rma", "sbm"] + (["precompute"] if sc.precompute_enabled else [])
        return {
            "scenario": sc.name,
            "seed": self.schedule.seed,
            "duration_s": self.end_t,
            "t0": self.config.t0,
            "speed": self.config.speed,
            "slo": {"p99_ms": sc.slo.p99_ms, "window_s": sc.slo.window_s},
            "segments": [s.name for s in sc.segments],
            "regions": [r.name for r in sc.regions],
            "levers": levers,
            "precompute_enabled": sc.precompute_enabled,
        }

    async def _resume_levels(
        self,
        updates: list[CapacityUpdate],
        now_t: float,
        levels: dict[tuple[str, str, str, bool], CapacityUpdate],
    ) -> int:
        """A restarted feed: the level of every pool at ``now_t`` into ``levels`` and announced
        at once; returns the index of the first update still to come."""
        u_next = 0
        while u_next < len(updates) and updates[u_next].t <= now_t:
            u = updates[u_next]
            levels[(u.region, u.resource, u.hardware, u.remote)] = u
            u_next += 1
        for u in levels.values():
            await self._capacity(
                CapacityUpdate(now_t, u.region, u.resource, u.hardware, u.remote, u.units,
                               u.units, "update", u.expires_in_s)
            )  # fmt: skip
        self.log.info("feed.resumed", resume_from=self.config.resume_from, t=now_t)
        return u_next

    async def _end_silence(
        self, t: float, levels: dict[tuple[str, str, str, bool], CapacityUpdate]
    ) -> None:
        """A silence ended: every level it held back, now (a change with its own reason, the
        others as updates), and the ``capacity.silence.ended`` event."""
        held, self._held = self._held, {}
        regions = set()
        for key, u in levels.items():
            if self.silenced(t, u.region):
                continue  # another silence still holds this region
            change = held.pop(key, None)
            if change is not None:
                u = CapacityUpdate(t, u.region, u.resource, u.hardware, u.remote, u.units,
                                   change.before, change.reason, u.expires_in_s)  # fmt: skip
            else:
                u = CapacityUpdate(t, u.region, u.resource, u.hardware, u.remote, u.units,
                                   u.units, "update", u.expires_in_s)  # fmt: skip
            await self._capacity(u)
            regions.add(u.region)
        self._held.update(held)
        await self._event(None, "capacity.silence.ended", {"t": t, "regions": sorted(regions)})

    async def _capacity(self, u: CapacityUpdate) -> None:
        if self.silenced(u.t, u.region):
            key = (u.region, u.resource, u.hardware, u.remote)
            if u.reason != "update":
                first = self._held.get(key)
                before = first.before if first is not None else u.before
                self._held[key] = CapacityUpdate(
                    u.t, u.region, u.resource, u.hardware, u.remote, u.units, before, u.reason,
                    u.expires_in_s,
                )  # fmt: skip
            return
        self._ids += 1
        expires = None if u.expires_in_s is None else u.expires_in_s / self.config.speed
        msg = messages.Capacity(
            ts=self._wall(),
            region=u.region,
            resource=u.resource,  # type: ignore[arg-type]
            hardware=u.hardware,
            pool="opportunistic",
            units=u.units,
            reason=u.reason,  # type: ignore[arg-type]
            id=f"c-{self.config.t0:.0f}-{self._id_tag}{self._ids}",
            expires_in_s=expires,
            remote=u.remote,
        )
        await self._producer.send(self.kafka.topic("capacity"), messages.encode(msg), key=msg.key())
        self.sent["capacity"] += 1
        if u.reason != "update":
            self.log.info(
                "feed.capacity.published",
                region=u.region,
                resource=u.resource,
                hardware=u.hardware,
                units=u.units,
                reason=u.reason,
                t=u.t,
            )
        if u.is_reclaim and u.reason != "update":
            self.sent["reclaims"] += 1
            await self._event(
                u.region,
                "capacity.reclaimed",
                {
                    "resource": u.resource,
                    "hardware": u.hardware,
                    "pool": "opportunistic",
                    "remote": u.remote,
                    "units_before": u.before,
                    "units_after": u.units,
                    "reason": u.reason,
                    "t": u.t,
                },
            )

    async def _request(self, region: str, fields: dict[str, Any]) -> None:
        msg = messages.Request(ts=self._wall(), region=region, **fields)
        parts = self._request_partitions
        await self._producer.send(
            self.kafka.topic("requests"),
            messages.encode(msg),
            key=msg.shard_key(parts),
            partition=msg.shard(parts),
        )
        self.sent["requests"] += 1

    async def _windows(self, t_start: float, t_end: float) -> None:
        for ri, region in enumerate(self.schedule.traces.regions):
            await self._event(
                region.name,
                "window",
                window_event(
                    t_start,
                    t_start + self.scenario.slo.window_s,
                    offered_unit_s=self.schedule.traces.offered_unit_s(ri, t_start, t_end),
                    capacity=self.schedule.levels_at(ri, max(t_start, t_end - 1e-9)),
                ),
                ts=self.wall(t_end),
            )

    async def _event(
        self, region: str | None, kind: str, fields: dict[str, Any], ts: float | None = None
    ) -> None:
        extra = {"policy": self.config.policy}
        extra.update(fields)
        event = messages.Event(
            ts=self._wall() if ts is None else ts,
            kind=kind,
            source="feed",
            region=region,
            extra=extra,
        )
        await self._producer.send(
            self.kafka.topic("events"), messages.encode(event), key=event.key()
        )
