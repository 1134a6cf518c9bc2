"""The precompute lever's budget and jobs: a token bucket, the pools a job may use, its jobs.

Pure code, like :mod:`headroom.controllers.precompute` (steps 5 and 6 of the algorithm described
there): time is passed in, and every stateful object snapshots and restores exactly.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from headroom.controllers.allocator import Pool, pools_from_capacity
from headroom.controllers.levers import CapacityUse, ResourceCost
from headroom.controllers.types import CapacityLevel
from headroom.kernel.jsonstate import Snapshotting, json_float

__all__ = ["Job", "JobBook", "JobStats", "TokenBucket", "eligible_pool", "usable_pools"]

_EPS = 1e-9  # slack on capacity comparisons (floating sums of draws)


# -- budget --------------------------------------------------------------------------------------


class TokenBucket:
    """Jobs per second with a bounded burst; time is given, never read."""

    __slots__ = ("burst_s", "last", "rate", "tokens")

    def __init__(self, rate: float, burst_s: float, now: float | None = None) -> None:
        self.rate = max(rate, 0.0)
        self.burst_s = burst_s
        self.tokens = 0.0  # start empty: no burst of work the moment a worker starts
        self.last = now

    @property
    def depth(self) -> float:
        return max(self.rate * self.burst_s, 1.0 if self.rate > 0.0 else 0.0)

    def refill(self, now: float) -> None:
        if self.last is not None and now > self.last:
            self.tokens = min(self.depth, self.tokens + self.rate * (now - self.last))
        if self.last is None or now > self.last:
            self.last = now

    def set_rate(self, rate: float, now: float) -> None:
        self.refill(now)
        self.rate = max(rate, 0.0) if math.isfinite(rate) else 0.0
        self.tokens = min(self.tokens, self.depth)

    def available(self, now: float) -> int:
        self.refill(now)
        return int(self.tokens + 1e-9)

    def take(self, n: int) -> None:
        self.tokens = max(self.tokens - n, 0.0)

    def snapshot(self) -> dict[str, Any]:
        return {
            "rate": self.rate,
            "burst_s": self.burst_s,
            "tokens": self.tokens,
            "last": self.last,
        }

    def restore(self, state: Mapping[str, Any]) -> None:
        """Continue from a :meth:`snapshot`: its rate (set by :meth:`set_rate` since), tokens and
        time; ``burst_s`` stays this bucket's own."""
        last = state["last"]
        self.rate = float(state["rate"])
        self.tokens = float(state["tokens"])
        self.last = None if last is None else float(last)


# -- capacity and jobs ---------------------------------------------------------------------------

PoolKey = tuple[str, str, bool]  # (resource, hardware, remote)


def eligible_pool(
    pool: Pool, *, use: CapacityUse, hardware: Sequence[str] | None, min_lifetime_s: float
) -> bool:
    """May work of this kind run on ``pool``? ``remote`` pools only for asynchronous work;
    accelerators only of the given types (``None`` = any); only pools that outlive
    ``min_lifetime_s``. The allocator applies the same rules (``Allocator.eligible``)."""
    if pool.remote and use is not CapacityUse.ASYNC:
        return False
    if pool.lifetime_s < min_lifetime_s:
        return False
    if pool.resource == "accelerator" and hardware is not None and pool.hardware not in hardware:
        return False
    return pool.units > 0.0


def usable_pools(
    levels: Iterable[CapacityLevel],
    now: float,
    *,
    use: CapacityUse,
    hardware: Sequence[str] | None,
    min_lifetime_s: float,
    safety_margin: float,
) -> list[Pool]:
    """The opportunistic pools this work may run on (dedicated capacity is the baseline's and
    never appears), after the safety margin, newest level per (resource, hardware, remote)."""
    pools = pools_from_capacity(levels, now, safety_margin)
    return [
        p
        for p in pools
        if eligible_pool(p, use=use, hardware=hardware, min_lifetime_s=min_lifetime_s)
    ]


@dataclass(frozen=True, slots=True)
class Job:
    """One running job: a user's ranking on one CPU pool and one accelerator pool."""

    id: int
    user: int
    segment: int
    started_at: float
    ends_at: float
    cpu_pool: PoolKey | None
    accelerator_pool: PoolKey | None
    cpu_draw: float  # cores while it runs
    accelerator_draw: float  # devices while it runs


@dataclass
class JobStats:
    """Counters of a :class:`JobBook` (unit-seconds are resource use actually spent)."""

    started: int = 0
    completed: int = 0
    stopped: int = 0  # wasted_partial: reclaimed mid-way, nothing delivered
    cpu_unit_s: float = 0.0
    accelerator_unit_s: float = 0.0


@dataclass
class JobBook:
    """Jobs in flight on the usable pools; reclaims stop them at once (module docstring, 6)."""

    cost: ResourceCost
    duration_s: float
    pools: dict[PoolKey, Pool] = field(default_factory=dict)
    jobs: dict[int, Job] = field(default_factory=dict)
    stats: JobStats = field(default_factory=JobStats)
    next_id: int = 1

    @property
    def cpu_draw(self) -> float:
        return self.cost.cpu_s / self.duration_s

    @property
    def accelerator_draw(self) -> float:
        return self.cost.accelerator_s / self.duration_s

    def in_use(self) -> dict[PoolKey, float]:
        used: dict[PoolKey, float] = {}
        for j in self.jobs.values():
            if j.cpu_pool is not None:
                used[j.cpu_pool] = used.get(j.cpu_pool, 0.0) + j.cpu_draw
            if j.accelerator_pool is not None:
                used[j.accelerator_pool] = used.get(j.accelerator_pool, 0.0) + j.accelerator_draw
        return used

    def set_pools(self, pools: Iterable[Pool], now: float) -> list[Job]:
        """New usable pools (:func:`usable_pools`). Where the jobs on a pool now draw more than
        it has (a reclaim, a preemption, a pool that is gone or no longer eligible), the most
        recently started ones stop at once; they are returned and counted as stopped."""
        self.pools = {(p.resource, p.hardware, p.remote): p for p in pools}
        stopped: list[Job] = []
        for key in sorted(self.in_use()):
            pool = self.pools.get(key)
            have = pool.units if pool is not None else 0.0
            on_pool = [j for j in self.jobs.values() if key in (j.cpu_pool, j.accelerator_pool)]
            load = sum(j.cpu_draw if key == j.cpu_pool else j.accelerator_draw for j in on_pool)
            # newest first: the least progress is lost
            for j in sorted(on_pool, key=lambda j: (j.started_at, j.id), reverse=True):
                if load <= have + _EPS:
                    break
                self._stop(j, now)
                stopped.append(j)
                load -= j.cpu_draw if key == j.cpu_pool else j.accelerator_draw
        return stopped

    def _stop(self, job: Job, now: float) -> None:
        del self.jobs[job.id]
        ran = max(min(now, job.ends_at) - job.started_at, 0.0)
        self.stats.stopped += 1
        self.stats.cpu_unit_s += job.cpu_draw * ran
        self.stats.accelerator_unit_s += job.accelerator_draw * ran

    def _order(self, resource: str) -> list[Pool]:
        """Preference: remote first (nothing else may use it), then longest-lived, then most."""
        pools = [p for p in self.pools.values() if p.resource == resource]
        return sorted(pools, key=lambda p: (not p.remote, -p.lifetime_s, -p.units, p.hardware))

    def _free(self) -> dict[PoolKey, float]:
        used = self.in_use()
        return {
            key: max(p.units - used.get(key, 0.0), 0.0)
            for key, p in self.pools.items()
            if p.lifetime_s >= self.duration_s
        }

    def capacity(self) -> int:
        """How many more jobs fit on the pools now."""
        return self._place(10**9, dry_run=True)[0]

    def _place(
        self, n: int, dry_run: bool
    ) -> tuple[int, list[tuple[PoolKey | None, PoolKey | None]]]:
        free = self._free()
        cpu_need, acc_need = self.cpu_draw, self.accelerator_draw
        cpu_order = [(p.resource, p.hardware, p.remote) for p in self._order("cpu")]
        acc_order = [(p.resource, p.hardware, p.remote) for p in self._order("accelerator")]
        cpu_order = [k for k in cpu_order if k in free]
        acc_order = [k for k in acc_order if k in free]
        slots: list[tuple[PoolKey | None, PoolKey | None]] = []
        ci = ai = 0
        count = 0
        while count < n:
            cpu_key: PoolKey | None = None
            acc_key: PoolKey | None = None
            if cpu_need > 0.0:
                while ci < len(cpu_order) and free[cpu_order[ci]] + _EPS < cpu_need:
                    ci += 1
                if ci == len(cpu_order):
                    break
                cpu_key = cpu_order[ci]
            if acc_need > 0.0:
                while ai < len(acc_order) and free[acc_order[ai]] + _EPS < acc_need:
                    ai += 1
                if ai == len(acc_order):
                    break
                acc_key = acc_order[ai]
            if cpu_key is None and acc_key is None:
                break  # free work: nothing to place it on, nothing to account
            step = 1
            if dry_run:  # closed form for the rest: the binding pool decides
                fits = n - count
                if cpu_key is not None:
                    fits = min(fits, int((free[cpu_key] + _EPS) // cpu_need))
                if acc_key is not None:
                    fits = min(fits, int((free[acc_key] + _EPS) // acc_need))
                step = max(1, fits)
            if cpu_key is not None:
                free[cpu_key] -= cpu_need * step
            if acc_key is not None:
                free[acc_key] -= acc_need * step
            if not dry_run:
                slots.append((cpu_key, acc_key))
            count += step
        return count, slots

    def start(self, now: float, picks: Sequence[tuple[int, int]]) -> list[Job]:
        """Start jobs for ``(user, segment)`` pairs, as many as fit (in the given order)."""
        _, slots = self._place(len(picks), dry_run=False)
        started = []
        for (user, segment), (cpu_key, acc_key) in zip(picks, slots, strict=False):
            job = Job(
                id=self.next_id,
                user=user,
                segment=segment,
                started_at=now,
                ends_at=now + self.duration_s,
                cpu_pool=cpu_key,
                accelerator_pool=acc_key,
                cpu_draw=self.cpu_draw if cpu_key is not None else 0.0,
                accelerator_draw=self.accelerator_draw if acc_key is not None else 0.0,
            )
            self.next_id += 1
            self.jobs[job.id] = job
            started.append(job)
        self.stats.started += len(started)
        return started

    def due(self, now: float) -> list[Job]:
        """Jobs that ran to their end by ``now`` (removed, counted as completed)."""
        done = [j for j in self.jobs.values() if j.ends_at <= now]
        for j in done:
            del self.jobs[j.id]
            self.stats.completed += 1
            self.stats.cpu_unit_s += j.cpu_draw * self.duration_s
            self.stats.accelerator_unit_s += j.accelerator_draw * self.duration_s
        return sorted(done, key=lambda j: (j.ends_at, j.id))

    def next_end(self) -> float | None:
        return min((j.ends_at for j in self.jobs.values()), default=None)

    def stop_all(self, now: float) -> list[Job]:
        """Stop every job (the worker is shutting down, or its budget went to zero)."""
        jobs = sorted(self.jobs.values(), key=lambda j: j.id)
        for j in jobs:
            self._stop(j, now)
        return jobs

    def snapshot(self) -> dict[str, Any]:
        return {
            "next_id": self.next_id,
            "stats": {
                "started": self.stats.started,
                "completed": self.stats.completed,
                "stopped": self.stats.stopped,
                "cpu_unit_s": self.stats.cpu_unit_s,
                "accelerator_unit_s": self.stats.accelerator_unit_s,
            },
            "pools": [
                [p.resource, p.hardware, p.units, p.announced, p.remote, json_float(p.lifetime_s)]
                for p in self.pools.values()
            ],
            "jobs": [
                [
                    j.id,
                    j.user,
                    j.segment,
                    j.started_at,
                    j.ends_at,
                    None if j.cpu_pool is None else list(j.cpu_pool),
                    None if j.accelerator_pool is None else list(j.accelerator_pool),
                    j.cpu_draw,
                    j.accelerator_draw,
                ]
                for j in sorted(self.jobs.values(), key=lambda j: j.id)
            ],
        }

    def restore(self, state: Mapping[str, Any]) -> None:
        """Replace pools, jobs and counters with those of a :meth:`snapshot`; the job cost and
        duration stay this book's own."""

        def key(x: Any) -> PoolKey | None:
            return None if x is None else (str(x[0]), str(x[1]), bool(x[2]))

        st = state["stats"]
        stats = JobStats(
            int(st["started"]),
            int(st["completed"]),
            int(st["stopped"]),
            float(st["cpu_unit_s"]),
            float(st["accelerator_unit_s"]),
        )
        pools: dict[PoolKey, Pool] = {}
        for r, hw, units, announced, remote, life in state["pools"]:
            p = Pool(str(r), str(hw), float(units), float(announced), bool(remote), float(life))
            pools[(p.resource, p.hardware, p.remote)] = p
        jobs: dict[int, Job] = {}
        for jid, user, seg, t0, t1, cpu, acc, dc, da in state["jobs"]:
            job = Job(
                *(int(jid), int(user), int(seg), float(t0), float(t1)),
                *(key(cpu), key(acc), float(dc), float(da)),
            )
            jobs[job.id] = job
        self.next_id = int(state["next_id"])
        self.stats = stats
        self.pools = pools
        self.jobs = jobs


_SNAPSHOTTING: tuple[type[Snapshotting], ...] = (TokenBucket, JobBook)  # checked by mypy
