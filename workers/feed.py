"""The capacity and traffic feed (``headroom feed SCENARIO [--speed X]``).

Publishes a scenario, in real time or ``X`` times faster, onto Kafka:

* ``headroom.capacity`` — the opportunistic level of every pool (region, resource, hardware;
  ``remote`` pools flagged) at scenario time 0 and at every change of its trace or of a
  ``preempt``/``grant`` event: a *level*, never a delta (CONTRACT §2), reason ``preempt`` for a
  preempt event, ``reclaim`` for another step down, ``grant`` for a step up. Every level is
  re-announced every ``refresh_s`` (reason ``update``) so that a level with an announced lifetime
  (``expires_in_s``) does not lapse while the scenario still offers it; lifetimes are published
  in wall seconds (``expires_in_s / speed``).
* ``headroom.requests`` — every request of the scenario's traffic, keyed by region: ``id``,
  ``segment`` (drawn by the segments' shares), ``value`` (log-normal with the segment's mean and
  sigma: ``exp(N(ln mean − σ²/2, σ))``), ``eligible`` (share :data:`ELIGIBLE_SHARE`, the
  simulator's default), ``user`` (uniform among its segment's share of ``world.users``, split
  as the simulator splits them so each user returns at its segment's rate; else a 31-bit id), at
  Poisson arrival times: per second of scenario time the count is the simulator's own draw
  (:class:`sim.traces.ScenarioTraces`: diurnal or CSV rate, seeded noise, surges), spread uniformly
  over that second — the very counts the simulator draws for the same seed.
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
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from headroom.errors import ConfigError
from headroom.scenario import Scenario
from sim.precompute_sim import users_by_segment
from sim.traces import CapacityChange, PoolTrace, ScenarioTraces
from streams import messages
from streams.kafka import KafkaTarget, make_producer
from workers.service import Service

__all__ = ["ELIGIBLE_SHARE", "CapacityUpdate", "FeedConfig", "FeedSchedule", "TrafficFeed"]

# Share of requests that may go to the strong model: the scenario format has no field for it, and
# the simulator's default is 1.0 (sim/config.py, eligible_share); the two engines must agree.
ELIGIBLE_SHARE = 1.0
USER_ID_SPACE = 1 << 31


@dataclass(frozen=True, slots=True)
class FeedConfig:
    t0: float
    speed: float = 1.0
    seed: int | None = None  # None: the scenario's
    duration_s: float | None = None  # None: the scenario's
    refresh_s: float = 10.0  # wall seconds between re-announcements of every level
    policy: str = "headroom"
    lead_s: float = 0.002  # publish this early (wall): sends take a moment

    def __post_init__(self) -> None:
        problems = []
        if not (math.isfinite(self.speed) and self.speed > 0.0):
            problems.append(f"--speed: must be > 0, got {self.speed}")
        if not (math.isfinite(self.t0) and self.t0 >= 0.0):
            problems.append(f"--t0: must be a time >= 0, got {self.t0}")
        if self.duration_s is not None and not self.duration_s > 0.0:
            problems.append(f"--duration: must be > 0, got {self.duration_s}")
        if not self.refresh_s > 0.0:
            problems.append(f"refresh_s: must be > 0, got {self.refresh_s}")
        if problems:
            raise ConfigError(problems)


@dataclass(frozen=True, slots=True)
class CapacityUpdate:
    """One pool's level at scenario time ``t``, and why it is published."""

    t: float
    region: str
    resource: str
    hardware: str
    remote: bool
    units: float
    before: float
    reason: str  # grant | reclaim | preempt | update
    expires_in_s: float | None

    @property
    def is_reclaim(self) -> bool:
        return self.units < self.before


class FeedSchedule:
    """What to publish when, for one scenario and seed (pure: no clock, seeded generators).

    :meth:`capacity_updates` lists every level announcement in time order (the initial levels at
    t = 0, then every change); :meth:`requests` yields the requests of one second of scenario time,
    in arrival order, as ``(t, region, Request-fields)``.
    """

    def __init__(self, scenario: Scenario, seed: int | None = None) -> None:
        self.scenario = scenario
        self.seed = scenario.seed if seed is None else int(seed)
        # The simulator's own draw (sim.engine.SimContext: the first child of SeedSequence(seed),
        # one-second steps): for a seed, both engines see the same rate and the same number of
        # arrivals in every second, so their runs (and the oracle's bound) are comparable.
        traces_seq = np.random.SeedSequence(self.seed).spawn(1)[0]
        self.traces = ScenarioTraces(scenario, np.random.default_rng(traces_seq), step_s=1.0)
        segs = scenario.segments
        self._seg_names = [s.name for s in segs]
        shares = np.array([s.share for s in segs], dtype=np.float64)
        self._seg_cdf = np.cumsum(shares / shares.sum())
        sig = np.array([s.value.sigma for s in segs], dtype=np.float64)
        self._sigma = sig
        self._mu = np.log([s.value.mean for s in segs]) - 0.5 * sig * sig
        # users by segment, as the simulator splits them (a user belongs to one segment and
        # returns at its rate); a segment without a return rate gets never-returning ids
        self._seg_users, self._seg_offset = users_by_segment(scenario)

    @property
    def duration_s(self) -> float:
        return self.traces.duration_s

    def capacity_updates(self) -> list[CapacityUpdate]:
        out: list[CapacityUpdate] = []
        preempts = {
            (e.at_s, e.region, e.resource, e.hardware, bool(e.remote))
            for e in self.scenario.events
            if e.kind == "preempt"
        }
        for region in self.traces.regions:
            for pool in region.pools:
                if not len(pool.times) or pool.times[0] > 0.0:
                    out.append(self._update(0.0, region.name, pool, 0.0, 0.0, "update"))
            for change in region.changes:
                pool = region.pools[change.pool]
                key = (change.t, region.name, pool.key.resource, pool.key.hardware, pool.key.remote)
                reason = _reason(change, key in preempts)
                out.append(
                    self._update(change.t, region.name, pool, change.after, change.before, reason)
                )
        out.sort(key=lambda u: u.t)
        return out

    @staticmethod
    def _update(
        t: float, region: str, pool: PoolTrace, units: float, before: float, reason: str
    ) -> CapacityUpdate:
        return CapacityUpdate(
            t=t,
            region=region,
            resource=pool.key.resource,
            hardware=pool.key.hardware,
            remote=pool.key.remote,
            units=units,
            before=before,
            reason=reason,
            expires_in_s=pool.expires_in_s,
        )

    def levels_at(self, region_index: int, t: float) -> dict[str, float]:
        """Opportunistic units per resource in force at ``t`` (all hardware, remote included)."""
        out = {"cpu": 0.0, "accelerator": 0.0}
        for pool in self.traces.regions[region_index].pools:
            out[pool.key.resource] += pool.level_at(t)
        return out

    def requests(self, second: int) -> list[tuple[float, str, dict[str, Any]]]:
        """The requests arriving in ``[second, second + 1)`` of scenario time, every region."""
        out: list[tuple[float, str, dict[str, Any]]] = []
        for ri, region in enumerate(self.traces.regions):
            if not 0 <= second < len(region.arrivals):
                continue
            n = int(region.arrivals[second])
            if n == 0:
                continue
            # one stream per (region, second): any second can be generated on its own
            rng = np.random.default_rng([self.seed & 0xFFFFFFFF, 0xFEED, ri, second])
            times = np.sort(second + rng.random(n))
            seg = np.searchsorted(self._seg_cdf, rng.random(n), side="right")
            seg = np.minimum(seg, len(self._seg_names) - 1)
            values = np.exp(self._mu[seg] + self._sigma[seg] * rng.standard_normal(n))
            eligible = rng.random(n) < ELIGIBLE_SHARE
            users = self._draw_users(rng, seg)
            for i in range(n):
                out.append(
                    (
                        float(times[i]),
                        region.name,
                        {
                            "id": f"q-{ri}-{second}-{i}",
                            "segment": self._seg_names[int(seg[i])],
                            "value": float(values[i]),
                            "eligible": bool(eligible[i]),
                            "user": int(users[i]),
                        },
                    )
                )
        out.sort(key=lambda r: r[0])
        return out

    def _draw_users(self, rng: np.random.Generator, seg: npt.NDArray[np.int64]) -> Any:
        """A user per request: uniform among its segment's users (``users_by_segment``), or a
        31-bit id for a segment without any."""
        pool = self._seg_users[seg]
        uniform = rng.random(seg.size)
        own = self._seg_offset[seg] + np.floor(uniform * np.maximum(pool, 1)).astype(np.int64)
        anon = (uniform * USER_ID_SPACE).astype(np.int64)
        return np.where(pool > 0, own, anon)


def _reason(change: CapacityChange, preempt: bool) -> str:
    if preempt:
        return "preempt"
    return "reclaim" if change.after < change.before else "grant"


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
        self._ids = 0
        self.finished = asyncio.Event()
        self.sent = {"requests": 0, "capacity": 0, "reclaims": 0}

    def wall(self, t: float) -> float:
        return self.config.t0 + t / self.config.speed

    def scenario_time(self, wall: float | None = None) -> float:
        wall = self._wall() if wall is None else wall
        return (wall - self.config.t0) * self.config.speed

    async def on_start(self) -> None:
        self._producer = make_producer(self.kafka.bootstrap, linger_ms=5)
        await self._producer.start()
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

    async def _play(self) -> None:
        started_wall = self._wall()
        await self._event(None, "run.started", self._run_fields(), ts=self.config.t0)
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
        while True:
            if not pending and second < math.ceil(self.end_t):
                pending = [r for r in self.schedule.requests(second) if r[0] < self.end_t]
                pending.reverse()  # pop() from the end = earliest first
                second += 1
                continue
            candidates = [self.end_t, next_window, next_refresh]
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

    async def _capacity(self, u: CapacityUpdate) -> None:
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
            id=f"c-{self.config.t0:.0f}-{self._ids}",
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
        await self._producer.send(self.kafka.topic("requests"), messages.encode(msg), key=msg.key())
        self.sent["requests"] += 1

    async def _windows(self, t_start: float, t_end: float) -> None:
        for ri, region in enumerate(self.schedule.traces.regions):
            await self._event(
                region.name,
                "window",
                {
                    "t_start": t_start,
                    "t_end": t_start + self.scenario.slo.window_s,
                    "requests": 0,
                    "errors": 0,
                    "timeouts": 0,
                    "offered_unit_s": self.schedule.traces.offered_unit_s(ri, t_start, t_end),
                    "capacity": self.schedule.levels_at(ri, max(t_start, t_end - 1e-9)),
                },
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
