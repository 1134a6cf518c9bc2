"""What a scenario publishes, and when: the capacity levels and the request traffic.

:class:`FeedSchedule` is pure and seeded: for a scenario and a seed it lists every capacity level
announcement (the initial levels at t = 0, then every change of a trace or of a ``preempt`` /
``grant`` event) and the requests of every second of scenario time, drawn as the simulator draws
them (the same traces, the same arrivals per second, users split by segment with
:func:`users_by_segment`). The streaming feed plays it onto Kafka; the simulator's replay writes it
as a recording. Both engines therefore see the same traffic for the same seed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from headroom.kernel import seeds
from headroom.kernel.scenario import VALUE_BIN_RATIO, VALUE_GRID_MIN, Scenario
from headroom.kernel.traces import CapacityChange, PoolTrace, ScenarioTraces

__all__ = [
    "ELIGIBLE_SHARE",
    "USER_ID_SPACE",
    "CapacityUpdate",
    "FeedSchedule",
    "users_by_segment",
]

IntArray = npt.NDArray[np.int64]

# Share of requests that may go to the strong model when the scenario does not give one
# (``eligible_share``): the simulator's default is 1.0 (sim/config.py); the two engines must agree.
ELIGIBLE_SHARE = 1.0
USER_ID_SPACE = 1 << 31


def users_by_segment(scenario: Scenario) -> tuple[IntArray, IntArray]:
    """``(users, offset)`` per segment: ``world.users`` split so that at the region's mean
    traffic a user of segment ``s`` returns at its ``return_rate_per_h`` (``N_s ∝ share_s /
    r_s``; 0 for a segment without a return rate), user ids ``offset_s … offset_s + N_s − 1``.
    The simulator's visits and the streaming feed's requests draw users this way alike."""
    n_users = int(scenario.world.users or 0)
    n_seg = len(scenario.segments)
    share = np.array([s.share for s in scenario.segments], dtype=np.float64)
    share = share / share.sum()
    rates = np.array([s.return_rate_per_h or 0.0 for s in scenario.segments], dtype=np.float64)
    rated = rates > 0.0
    weight = np.where(rated, share / np.where(rated, rates, 1.0), 0.0)
    users = np.zeros(n_seg, dtype=np.int64)
    if weight.sum() > 0 and n_users > 0:
        users = np.where(rated, np.maximum(1, np.round(n_users * weight / weight.sum())), 0)
    users = users.astype(np.int64)
    offset = np.concatenate([[0], np.cumsum(users)[:-1]]).astype(np.int64)
    return users, offset


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
        # The simulator's own draw (headroom.sim.engine.SimContext: the first child of
        # SeedSequence(seed), one-second steps): for a seed, both engines see the same rate and the
        # same number of arrivals in every second, so their runs (and the oracle's bound) are
        # comparable.
        self.traces = ScenarioTraces(scenario, seeds.traces_rng(self.seed), step_s=1.0)
        segs = scenario.segments
        self._seg_names = [s.name for s in segs]
        share = scenario.eligible_share
        self._eligible = ELIGIBLE_SHARE if share is None else share
        shares = np.array([s.share for s in segs], dtype=np.float64)
        self._seg_cdf = np.cumsum(shares / shares.sum())
        sig = np.array([s.value.sigma for s in segs], dtype=np.float64)
        self._sigma = sig
        self._mu = np.log([s.value.mean for s in segs]) - 0.5 * sig * sig
        # a segment with a recorded value histogram draws from it: (values, cumulative shares)
        self._hist: dict[int, tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]] = {}
        for i, s in enumerate(segs):
            if s.value.histogram is not None:
                h = np.asarray(s.value.histogram, dtype=np.float64)
                self._hist[i] = (h[:, 0], np.cumsum(h[:, 1]) / h[:, 1].sum())
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
            rng = seeds.feed_requests_rng(self.seed, ri, second)
            times = np.sort(second + rng.random(n))
            seg = np.searchsorted(self._seg_cdf, rng.random(n), side="right")
            seg = np.minimum(seg, len(self._seg_names) - 1)
            values = np.exp(self._mu[seg] + self._sigma[seg] * rng.standard_normal(n))
            eligible = rng.random(n) < self._eligible
            users = self._draw_users(rng, seg)
            for s_i, (h_values, h_cdf) in self._hist.items():
                # after every other draw, so a scenario without histograms draws as before
                sel = np.nonzero(seg == s_i)[0]
                u = rng.random((2, sel.size))
                row = np.minimum(np.searchsorted(h_cdf, u[0], side="right"), h_cdf.size - 1)
                values[sel] = _in_value_bin(h_values[row], u[1])
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


def _in_value_bin(v: npt.NDArray[np.float64], u: npt.NDArray[np.float64]) -> Any:
    """A value at position ``u`` of the value-grid bin holding ``v`` (kernel.scenario.ValueDist:
    uniform in bin 0 below ``VALUE_GRID_MIN``, log-uniform above): how the simulator's
    population spreads a histogram row."""
    with np.errstate(divide="ignore"):
        k = np.floor(
            np.log(np.maximum(v, VALUE_GRID_MIN) / VALUE_GRID_MIN) / np.log(VALUE_BIN_RATIO)
        )
    lo = VALUE_GRID_MIN * VALUE_BIN_RATIO**k
    return np.where(v < VALUE_GRID_MIN, u * VALUE_GRID_MIN, lo * VALUE_BIN_RATIO**u)


def _reason(change: CapacityChange, preempt: bool) -> str:
    if preempt:
        return "preempt"
    return "reclaim" if change.after < change.before else "grant"
