"""The precompute lever in virtual time: returning users, a result store with expiry, jobs on
asynchronous capacity, driven by the pure policy core (:mod:`headroom.controllers.precompute`).

Pure: no clock, no global random state. Every draw comes from generators derived from the run's
seed per (region, purpose) (:meth:`headroom.sim.engine.SimContext.rng`), so every policy that
precomputes sees the same users visit at the same instants (common random numbers).
docs/precompute.md (*In the simulator*) and docs/simulator.md describe the model; this header is
the summary.

Which policies precompute
-------------------------
``headroom`` (the job rate its control plane grants, ``RegionTargets.precompute_jobs_per_s``,
converted to this job's size with :func:`headroom.controllers.precompute.own_rate`; the worker's
default rate before the first target, nothing once a target has expired) and ``oracle`` (no rate
limit: whatever its pools hold). ``static`` is the baseline; ``greedy``, ``central-only``, ``aimd``
and ``gradient`` are live-path policies: none of them has a precompute worker, so they run no job.

Users and visits (per-user, vectorised)
---------------------------------------
``world.users`` are split between the segments that have a ``return_rate_per_h`` so that at the
region's mean traffic a user of segment ``s`` returns at ``r_s`` (``N_s ∝ share_s / r_s``). Each
request of a window is one visit: the window's request count is split by segment (multinomial) and
into the holdout (binomial), and every visit goes to a user drawn uniformly among the segment's
``N_s`` at a uniform instant of the window — so each user visits as a Poisson process at the
segment's traffic over ``N_s``. A user enters the policy's :class:`UserBook` at its first visit
(the planner knows only users it has seen, as the worker does). Users are per-user state in the
book's columns (about 110,000 on the reference scenario), all updates vectorised.

The store. A user has at most one result: ranked at ``as_of``, ``expires_at = as_of + L_s``
(:meth:`PrecomputePlanner.expires_at`). A treatment visit at ``t`` with
``as_of ≤ t ≤ expires_at`` is a hit, served at age ``t − as_of``; a holdout visit that finds one is
``held_out`` (the control arm of the precompute value signals). A result past its expiry is never
served. Each result ends exactly once: expired (``expired_unused`` if never served), superseded
by a newer result or still stored at the end, so over a run

    jobs = used + expired_unused + dropped_unused + stored_unused

(``dropped_unused``: superseded before any visit; ``stored_unused``: live and unserved at the end,
written on the run's last window line).

Whom and when. Every ``PLAN_S`` seconds the planner picks up to the jobs the next round can run
(:func:`select_slots`: exactly :meth:`PrecomputePlanner.select`'s choice, without building one
``Pick`` per job); they are marked in flight and started in that order; picks left at the end of a
round go back. A round that ran dry is planned again at once when the book has met users since the
last one (as the worker's next round would pick them), else after half a round. A hit runs nothing
live, so at each round the planner's uplift is taken over the policy's live alternative
(:meth:`headroom.sim.engine.RegionPolicy.live_alternative`, handed to
:meth:`UpliftModel.against_live`; None keeps the curves' uplift over the base ranking): headroom's
is live RMA under its targets (:func:`headroom.controllers.precompute.rma_live_alternative`), the
oracle's the bound's LP's (:meth:`headroom.sim.oracle.Oracle.live_alternative`).

The oracle policy's jobs. It knows every visit to come (:func:`future_visits` replays the draws
every policy sees) and plans every window (``plan_s`` = the SLO window) instead of by expected
gains: users with a treatment visit in the next window first (a job planned when a window opens
ends within it, so its result is then as young as it can be when served), then the others, each
by the
uplift the new result adds over its stored one on the user's visits of the next
:data:`FORESIGHT_HORIZON_S` (:meth:`PrecomputeRegion._foresight_slots`). On precompute-remote
(seed 11) this serves casual visits at 0.091 a hit against 0.083 by expected gains. Before the
oracle policy's first plan is in force it starts no job (it plans against its live plan).

Jobs (fluid throughput, the core's job book at every change)
------------------------------------------------------------
A window's jobs run when it opens (:meth:`PrecomputeRegion.visit`), at the rate and on the pools in
force then, after the events of that instant (a capacity change, a control step). The window is
cut at every capacity change of the region's pools. Over a piece ``[a, b)`` the
pools precompute may use are fixed: every ``remote`` pool at its level, plus (headroom) what of
each local pool the live levers are not assigned (``level − rma − sbm``); the oracle policy uses the
remote pools only (its live plan may use every local unit). They pass through
:func:`headroom.controllers.precompute_jobs.usable_pools` (accelerators only of the strong model's
types, safety margin, a pool must outlive one job). Jobs run at ``X = min(rate, C / d)`` per second,
``C`` the jobs that fit at once (:meth:`JobBook.capacity` on empty pools), ``d`` the batch time: the
ones that end inside the piece complete at their end; the ones still running at ``b`` are put in the
core's :class:`JobBook`, so that at the next piece :meth:`JobBook.set_pools` stops those on units
that are gone — at once, newest first, counted as ``wasted_partial``, their users' work lost.
A piece is planned in rounds of one job duration, and before each round the book observes the
window's visits made before it: a round picks among the users seen so far, as the worker, which
learns a user at its visit and plans every quarter second. A result is visible to a visit once its
job has ended and it has crossed the topic (``SimConfig.propagation_s``, the targets' delay); its
age counts from the job's end.

Value (ground truth, against the live path)
-------------------------------------------
A window's visits are drawn when it opens (:meth:`PrecomputeRegion.visit`: they depend only on
the store the earlier windows left and the window's own jobs), so the engine knows ``h_s``, the
drawn share of segment
``s``'s treatment visits that hit, before it runs the window's live path. A hit runs nothing of
its plan live (the client plan's rule for a stored result, :func:`headroom.defences.plan.
serves_from_store`, vectorised as :meth:`headroom.defences.plan.CellPlan.live`): the engine takes
``h_s`` out of every live lever's share of the segment's cells, so RMA and SBM neither run nor
charge work for the hits and no live treatment group counts them. A hit makes no server
call, as in the stack: it loads no stage (:func:`headroom.sim.context.build_mix`); it stays a
base-path request of the window's latency sample (the stack's records its store look-up, well
under a millisecond).

A hit delivers ``v̄_s · Q_s(a)``: the segment's mean request value (a request's value does not
depend on whether its user has a result) times the measured quality, at visit time, of a strong
ranking ``a`` seconds old, ``Q_s(a) = Q_s^strong(n) · P_s(a) / P_s(0)``
(:mod:`headroom.world.curves`, the same stale-ranking curves the core's expiry uses). Like the
engine's ground truth, window sums are expectations over the window's arrivals: with ``N_s`` the
fluid treatment requests of the segment in the window, the precompute increment is

    inc_precompute = Σ_s (N_s · h_s · v̄_s · Q̄_s − hit_live_s)

with ``Q̄_s`` the mean quality over the window's hits and ``hit_live_s`` what the live path
delivered for them: their baseline value, in time (the engine's, timeouts included). A hit
replaces that outcome of its request, so ``value_total`` rises by the same amount and
``incremental = Σ inc`` still holds, each lever counting only the requests it served.

Value signals. Per segment, treatment = hits (look-ups never time out), control = held-out visits
that found a result, drawn like the engine's arms (:func:`headroom.sim.population.arm_sums`); they
reach the control plane as ``(segment, "precompute", arm)`` sums, so its allocator learns what a
precompute job is worth.

The oracle's bound. A hit replaces its request's live outcome, so a treatment request gets *one*
option: the baseline, a live lever, or a stored result. :mod:`headroom.sim.oracle` adds the stored
result as a third option to its per-stretch LP, worth ``Δ*_s = v̄_s · max_a (Q_s(a) − B_s)⁺`` (the
most a stored result can ever add to one visit over the base ranking), costing no live capacity, and
open to at most ``ρ_{w,s}`` of the segment's requests in window ``w``:
:func:`returning_share` replays the visits (:func:`draw_visits`, the same draws every policy
sees) and counts the treatment visits whose user had first visited at least a job's duration and
the topic's delay earlier. No policy can serve more of them: the planner knows a user only from a
visit, a job starts after it, and its result reaches the visits after it has run and crossed the
topic.
Capacity, ageing and the remote pools' reclaims are left out (the bound stays loose there).
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from headroom.controllers.levers import CapacityUse, ResourceCost
from headroom.controllers.precompute import (
    PrecomputeConfig,
    PrecomputePlanner,
    UpliftModel,
    UserBook,
    own_rate,
)
from headroom.controllers.precompute_jobs import JobBook, usable_pools
from headroom.controllers.types import LEVER_PRECOMPUTE, ArmStats, CapacityLevel
from headroom.kernel.schedule import users_by_segment
from headroom.sim.population import arm_sums

if TYPE_CHECKING:
    from headroom.sim.context import SimContext
    from headroom.sim.engine import RegionRun

__all__ = [
    "PRECOMPUTE_POLICIES",
    "PrecomputeRegion",
    "PrecomputeStatic",
    "PrecomputeWindows",
    "draw_visits",
    "future_visits",
    "precompute_capable",
    "precompute_region",
    "precompute_static",
    "returning_share",
    "select_slots",
    "trace_arrivals",
]

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]

# policy -> how it precomputes ("targets": the control plane's rate; "foresight": no rate limit)
PRECOMPUTE_POLICIES: dict[str, str] = {"headroom": "targets", "oracle": "foresight"}
PLAN_S = 60.0  # a planning round: the planner scores every user once per round
# the oracle policy's foresight: the visits within this horizon after a result becomes visible
# count towards the job that makes it (module docstring, *The oracle policy's jobs*)
FORESIGHT_HORIZON_S = 1800.0
STALENESS_SAMPLES = 32  # per window line (docs/events.md)
# generator purposes (SimContext.rng): visits, value signals, the planner's tie-breaks
_RNG_VISITS, _RNG_SIGNALS, _RNG_PLANNER = 30, 31, 32
_EPS = 1e-9


# --------------------------------------------------------------------------------------------
# What every policy of a run shares
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class PrecomputeStatic:
    """The precompute world of one :class:`SimContext`: policy settings, users, value tables."""

    config: PrecomputeConfig
    uplift: UpliftModel
    lever_job: ResourceCost  # what the control plane's rate is counted in (PrecomputeLever)
    job: ResourceCost
    hardware: tuple[str, ...]  # the strong model's accelerator types
    users: IntArray  # (S,) users per segment (0: segment without a return rate)
    offset: IntArray  # (S,) first user id of each segment
    v_mean: FloatArray  # (S,) mean request value
    q_fresh: FloatArray  # (S,) Q_s^strong(n) of a job's ranking
    q_base: FloatArray  # (S,) B_s
    best_gain: FloatArray  # (S,) Δ*_s: the most a stored result adds to one visit
    ages: FloatArray  # decay grid (A,)
    decay: FloatArray  # (S, A) P_s(a) / P_s(0)

    def quality(self, seg: IntArray, age: FloatArray) -> FloatArray:
        """``Q_s(a)``: quality at visit time of a result ``age`` seconds old."""
        out = np.empty(age.size)
        for s in np.unique(seg).tolist():
            m = seg == s
            out[m] = self.q_fresh[s] * np.interp(age[m], self.ages, self.decay[s])
        return out


def precompute_static(ctx: SimContext) -> PrecomputeStatic | None:
    """The run's precompute world (built once per context); None when the scenario has no
    precompute fields (docs/scenarios.md) — then nothing here ever runs."""
    sc = ctx.scenario
    if not sc.precompute_enabled:
        return None
    got = ctx.oracle_cache.get("precompute")
    if got is not None:
        assert isinstance(got, PrecomputeStatic)
        return got
    curves: Any = ctx.curves
    n_seg = len(sc.segments)
    rated = np.array([(s.return_rate_per_h or 0.0) > 0.0 for s in sc.segments])
    users, offset = users_by_segment(sc)
    # the book remembers every user (no eviction: the store of a region is not that small)
    config = PrecomputeConfig.from_scenario(sc, max_users=max(int(users.sum()), 1))
    uplift = UpliftModel.from_curves(curves, config)
    seg_idx = np.arange(n_seg)
    q_fresh = np.asarray(curves.mean_quality(seg_idx, 1, config.candidates), dtype=np.float64)
    q_base = np.asarray(curves.baseline_quality(seg_idx), dtype=np.float64)
    ages = np.asarray(curves.age_grid_s, dtype=np.float64)
    p = np.asarray(curves.precompute_mean, dtype=np.float64)
    p0 = p[:, :1]
    decay = np.where(p0 > 0, p / np.where(p0 > 0, p0, 1.0), 0.0)
    v_mean = np.array([s.value.mean for s in sc.segments], dtype=np.float64)
    best_q = q_fresh * decay.max(axis=1)
    best_gain = np.where(rated, v_mean * np.maximum(best_q - q_base, 0.0), 0.0)
    static = PrecomputeStatic(
        config=config,
        uplift=uplift,
        lever_job=ctx.costs.precompute_per_job,
        job=config.job_cost,
        hardware=tuple(sc.models.strong.hardware),
        users=users,
        offset=offset,
        v_mean=v_mean,
        q_fresh=q_fresh,
        q_base=q_base,
        best_gain=best_gain,
        ages=ages,
        decay=decay,
    )
    ctx.oracle_cache["precompute"] = static
    return static


def precompute_region(ctx: SimContext, r: int, policy: str) -> PrecomputeRegion | None:
    """The precompute model of region ``r`` under ``policy``, or None (no precompute fields, or
    a policy that does not precompute: module docstring)."""
    mode = PRECOMPUTE_POLICIES.get(policy)
    if mode is None:
        return None
    static = precompute_static(ctx)
    if static is None:
        return None
    return PrecomputeRegion(ctx, r, mode, static)


def precompute_capable(ctx: SimContext, r: int) -> bool:
    """Whether region ``r`` can precompute at all: the scenario has the precompute fields and the
    region announces some opportunistic accelerator of the strong model's types."""
    static = precompute_static(ctx)
    if static is None:
        return False
    st = ctx.regions[r]
    rt = ctx.traces.regions[r]
    return any(
        k.resource == "accelerator"
        and k.hardware in static.hardware
        and float(p.levels.max(initial=0.0)) > 0.0
        for k, p in zip(st.pools, rt.pools, strict=True)
    )


def trace_arrivals(ctx: SimContext, r: int, t0: float, t1: float) -> float:
    """Requests of region ``r`` in ``[t0, t1)`` (fluid, from the traffic trace): the count a
    window's visits are drawn from — the same for every policy and for the oracle's replay
    (:func:`returning_share`), whatever steps the engine cut the window into."""
    tr = ctx.traces
    arr = tr.regions[r].arrivals
    key = f"cum-arrivals-{r}"
    cum = ctx.oracle_cache.get(key)
    if cum is None:  # requests before each step, once per context
        cum = ctx.oracle_cache[key] = np.concatenate([[0.0], np.cumsum(arr, dtype=np.float64)])

    def before(t: float) -> float:
        i = min(max(int(np.searchsorted(tr.step_edges, t, side="right")) - 1, 0), tr.n_steps - 1)
        length = float(tr.step_len[i])
        into = min(max(t - float(tr.step_edges[i]), 0.0), length)
        part = float(arr[i]) * into / length if length > 0 else 0.0
        return float(cum[i]) + part

    return max(before(t1) - before(t0), 0.0)


def draw_visits(
    rng: np.random.Generator,
    ctx: SimContext,
    s: PrecomputeStatic,
    arrivals: float,
    t0: float,
    t1: float,
) -> tuple[IntArray, IntArray, IntArray, IntArray, FloatArray, npt.NDArray[np.bool_]]:
    """One window's visits: ``(n_seg, n_ctl, ids, seg, times, control)`` — requests split by
    segment (multinomial) and into the holdout (binomial), each a visit of a uniform user of its
    segment at a uniform instant. One code path for the policies and the oracle's replay, so
    both see the same users at the same instants."""
    n = max(round(arrivals), 0)
    n_seg = rng.multinomial(n, ctx.pop.seg_share)
    n_ctl = rng.binomial(n_seg, ctx.holdout)
    ids_l, seg_l, t_l, ctl_l = [], [], [], []
    for si in range(ctx.pop.n_segments):
        m = int(n_seg[si])
        if m == 0 or s.users[si] <= 0:
            continue
        ids_l.append(s.offset[si] + rng.integers(0, s.users[si], m))
        t_l.append(t0 + rng.random(m) * (t1 - t0))
        seg_l.append(np.full(m, si, dtype=np.int64))
        ctl = np.zeros(m, dtype=bool)
        ctl[: int(n_ctl[si])] = True  # users are drawn at random: the first are as good
        ctl_l.append(ctl)
    if not ids_l:
        z = np.zeros(0, dtype=np.int64)
        return n_seg, n_ctl, z, z, np.zeros(0), np.zeros(0, dtype=bool)
    return (
        n_seg,
        n_ctl,
        np.concatenate(ids_l).astype(np.int64),
        np.concatenate(seg_l),
        np.concatenate(t_l),
        np.concatenate(ctl_l),
    )


def returning_share(ctx: SimContext, r: int) -> FloatArray | None:
    """``ρ[w, s]``: the share of window ``w``'s treatment visits of segment ``s`` whose user had
    first visited at least a job's duration and the topic's delay earlier — the most of them any
    policy can serve from a stored result (module docstring, *The oracle's bound*). None without
    precompute fields."""
    static = precompute_static(ctx)
    if static is None:
        return None
    key = f"returning-{r}"
    got = ctx.oracle_cache.get(key)
    if got is not None:
        return np.asarray(got, dtype=np.float64)
    rng = ctx.rng(r, _RNG_VISITS)
    n_s = ctx.pop.n_segments
    lag = static.config.job_duration_s + ctx.config.propagation_s
    first = np.full(int(static.users.sum()), np.inf)  # each user's first visit
    out = np.zeros((ctx.n_windows, n_s))
    for w in range(ctx.n_windows):
        t0 = w * ctx.window_s  # the engine's window bounds, computed the same way
        t1 = min(t0 + ctx.window_s, ctx.duration_s)
        arrivals = trace_arrivals(ctx, r, t0, t1)
        _, _, ids, seg, tv, ctl = draw_visits(rng, ctx, static, arrivals, t0, t1)
        if ids.size == 0:
            continue
        np.minimum.at(first, ids, tv)
        seen = first[ids] <= tv - lag  # a job after the first visit could have served it
        treat = ~ctl
        num = np.bincount(seg[treat & seen], minlength=n_s)
        den = np.bincount(seg[treat], minlength=n_s)
        out[w] = np.where(den > 0, num / np.maximum(den, 1), 0.0)
    ctx.oracle_cache[key] = out
    return out


@dataclass(frozen=True, eq=False)
class FutureVisits:
    """Every treatment visit of a region's run, in time order (the oracle policy's foresight)."""

    t: FloatArray
    ids: IntArray
    seg: IntArray


def future_visits(ctx: SimContext, r: int) -> FutureVisits | None:
    """The treatment visits region ``r`` will see, replayed from the draws every policy sees
    (:func:`draw_visits`, as :func:`returning_share` does); None without precompute fields."""
    static = precompute_static(ctx)
    if static is None:
        return None
    key = f"future-visits-{r}"
    got = ctx.oracle_cache.get(key)
    if isinstance(got, FutureVisits):
        return got
    rng = ctx.rng(r, _RNG_VISITS)
    t_l, id_l, seg_l = [], [], []
    for w in range(ctx.n_windows):
        t0 = w * ctx.window_s
        t1 = min(t0 + ctx.window_s, ctx.duration_s)
        _, _, ids, seg, tv, ctl = draw_visits(
            rng, ctx, static, trace_arrivals(ctx, r, t0, t1), t0, t1
        )
        t_l.append(tv[~ctl])
        id_l.append(ids[~ctl])
        seg_l.append(seg[~ctl])
    t = np.concatenate(t_l) if t_l else np.zeros(0)
    order = np.argsort(t, kind="stable")
    out = FutureVisits(
        t=t[order],
        ids=(np.concatenate(id_l) if id_l else np.zeros(0, dtype=np.int64))[order],
        seg=(np.concatenate(seg_l) if seg_l else np.zeros(0, dtype=np.int64))[order],
    )
    ctx.oracle_cache[key] = out
    return out


def select_slots(planner: PrecomputePlanner, now: float, k: int) -> IntArray:
    """Book slots of the users :meth:`PrecomputePlanner.select` picks (the same users in the
    same order, the same draws from its generator), without building a ``Pick`` per user."""
    book = planner.users
    if k <= 0 or len(book) == 0:
        return np.zeros(0, dtype=np.int64)
    if planner.config.explore_share > 0.0:
        picks = planner.select(now, k)
        return np.array([book.slot(p.user) for p in picks], dtype=np.int64)
    gain, eligible, _ = planner.gains(now)
    idx = np.flatnonzero(eligible)
    if len(idx) == 0:
        return np.zeros(0, dtype=np.int64)
    idx = idx[planner.rng.permutation(len(idx))]
    n_best = min(k, len(idx))
    best = idx[np.argpartition(-gain[idx], n_best - 1)[:n_best]] if n_best < len(idx) else idx
    return np.asarray(best[np.argsort(-gain[best], kind="stable")], dtype=np.int64)


# --------------------------------------------------------------------------------------------
# One region under one policy
# --------------------------------------------------------------------------------------------


@dataclass(slots=True)
class _Window:
    """What one window's simulation leaves for its ``window`` line."""

    t0: float
    t1: float
    visits: IntArray  # (S,) treatment visits
    held: IntArray  # (S,) holdout visits
    hits: IntArray  # (S,)
    held_out: IntArray  # (S,) holdout visits that found a result
    q_sum: FloatArray  # (S,) Σ quality over hits
    staleness: list[float]
    jobs: int
    used: int
    expired_unused: int
    dropped_unused: int
    wasted_partial: int
    rate: float  # jobs/s the policy allowed (inf: no limit)
    stored_unused: int | None = None


@dataclass(slots=True)
class PrecomputeWindows:
    """A batch of window lines' precompute parts (:meth:`PrecomputeRegion.flush`)."""

    inc: FloatArray  # (W,) precompute increment per window
    inc_seg: FloatArray  # (W, S)
    fields: list[dict[str, Any]]
    value_obs: dict[tuple[str, str, str], ArmStats] = field(default_factory=dict)
    hit_share: dict[str, float] = field(default_factory=dict)  # segment -> hits / visits


class PrecomputeRegion:
    """State of the precompute lever of one region for one policy run (module docstring)."""

    def __init__(self, ctx: SimContext, r: int, mode: str, static: PrecomputeStatic) -> None:
        self.ctx = ctx
        self.r = r
        self.mode = mode
        self.s = static
        cfg = static.config
        self.book = UserBook(cfg.max_users, initial=min(cfg.max_users, 4096))
        self.planner = PrecomputePlanner(
            cfg, static.uplift, ctx.rng(r, _RNG_PLANNER), users=self.book
        )
        self.jobs = JobBook(static.job, cfg.job_duration_s)
        self.visit_rng = ctx.rng(r, _RNG_VISITS)
        self.signal_rng = ctx.rng(r, _RNG_SIGNALS)
        self.known = np.zeros(0, dtype=np.int64)  # user ids seen, ascending
        self.known_slot = np.zeros(0, dtype=np.int64)  # their book slots
        self.served = np.zeros(len(self.book.ids), dtype=bool)  # current result served once
        self.queue = np.zeros(0, dtype=np.int64)  # picked slots not started yet
        self.next_plan = -math.inf
        self.last_plan = -math.inf
        self._planned_size = 0  # the book's size at the last planning round
        # the oracle policy plans every window, on the visits to come (foresight)
        self.plan_s = ctx.window_s if mode == "foresight" else PLAN_S
        self.future = future_visits(ctx, r) if mode == "foresight" else None
        self.carry = 0.0
        self.evicted = 0
        self.pending: list[_Window] = []
        # the open window: (t0, t1, hit share per segment) and its visits (:meth:`visit`)
        self._opened: tuple[float, float, FloatArray] | None = None
        # the open window's record and its jobs' (cpu, accelerator) unit-seconds (:meth:`visit`)
        self._visited: tuple[_Window, float, float] | None = None
        self.totals = {"jobs": 0, "used": 0, "expired_unused": 0, "dropped_unused": 0}
        st = ctx.regions[r]
        self.pool_keys = st.pools
        self.pool_traces = ctx.traces.regions[r].pools
        self.change_times = np.unique(
            np.concatenate([p.times for p in self.pool_traces] or [np.zeros(0)])
        )

    # -- the rate and the pools --------------------------------------------------------------

    def rate(self, run: RegionRun) -> float:
        """Jobs per second (of this job's size) the policy allows now."""
        if self.mode == "foresight":
            return math.inf
        tg = run.targets
        if tg is None:
            # no target yet: the worker's default; an expired one stops new jobs
            return self.s.config.default_jobs_per_s if run.epoch_in_force == 0 else 0.0
        budget = float(getattr(tg, "precompute_jobs_per_s", 0.0))
        return own_rate(budget, self.s.lever_job, self.s.job)

    def levels(self, run: RegionRun, t: float) -> list[CapacityLevel]:
        """The capacity precompute may use at ``t``: remote pools at their level; local ones
        (headroom) what the live levers are not assigned."""
        out = []
        for i, (key, tr) in enumerate(zip(self.pool_keys, self.pool_traces, strict=True)):
            units = tr.level_at(t)
            if not key.remote:
                if self.mode == "foresight":
                    continue
                units = max(units - run.asg_rma[i] - run.asg_sbm[i], 0.0)
            out.append(
                CapacityLevel(
                    resource=key.resource,  # type: ignore[arg-type]  # "cpu" | "accelerator"
                    hardware=key.hardware,
                    pool="opportunistic",
                    units=units,
                    expires_in_s=tr.expires_in_s,
                    remote=key.remote,
                    ts=t,
                )
            )
        return out

    # -- users -------------------------------------------------------------------------------

    def _slots(self, ids: IntArray) -> IntArray:
        pos = np.searchsorted(self.known, ids)
        pos = np.minimum(pos, max(self.known.size - 1, 0))
        if self.known.size == 0:
            return np.full(ids.size, -1, dtype=np.int64)
        found = self.known[pos] == ids
        return np.where(found, self.known_slot[pos], -1)

    def _observe(self, ids: IntArray, seg: IntArray, times: FloatArray) -> IntArray:
        """Visits of ``ids`` at ``times``: new users enter the book; returns every visit's slot."""
        book = self.book
        slots = self._slots(ids)
        new = slots < 0
        if new.any():
            order = np.argsort(times[new], kind="stable")
            n_ids, n_seg, n_t = ids[new][order], seg[new][order], times[new][order]
            uniq, first = np.unique(n_ids, return_index=True)
            for u, j in zip(uniq.tolist(), first.tolist(), strict=True):
                book.observe(int(u), int(n_seg[j]), float(n_t[j]))
            if book.evicted != self.evicted:
                self._rebuild()
            else:
                new_slots = np.array([book.slot(int(u)) for u in uniq.tolist()], dtype=np.int64)
                at = np.searchsorted(self.known, uniq)
                self.known = np.insert(self.known, at, uniq)
                self.known_slot = np.insert(self.known_slot, at, new_slots)
            if len(book.ids) > self.served.size:
                grown = np.zeros(len(book.ids), dtype=bool)
                grown[: self.served.size] = self.served
                self.served = grown
            slots = self._slots(ids)
            # observe() counted the first visit of each new user; count the others here
            again = np.ones(ids.size, dtype=bool)
            idx_new = np.flatnonzero(new)[order][first]
            again[idx_new] = False
            returning = slots[again]
            t_ret = times[again]
        else:
            returning, t_ret = slots, times
        if returning.size:
            np.add.at(book.visits, returning, 1)
            np.maximum.at(book.last, returning, t_ret)
        return slots

    def _rebuild(self) -> None:
        """The book evicted users: map ids to slots anew (an evicted user's result is lost)."""
        book = self.book
        n = book.size
        live = np.flatnonzero(book.active[:n])
        ids = book.ids[live]
        order = np.argsort(ids)
        self.known = ids[order]
        self.known_slot = live[order]
        gone = ~book.active[:n]
        self.served[:n][gone] = False
        self.evicted = book.evicted

    # -- one window ----------------------------------------------------------------------------

    def visit(self, t0: float, t1: float, run: RegionRun) -> FloatArray:
        """The window ``[t0, t1)``: its jobs, its visits and the ones that hit; returns ``h``
        (S,), per segment the share of its treatment visits that hit. Called when the window
        opens, so that the engine takes the hits' share out of the window's live plan
        (:func:`headroom.defences.plan.live_share`); :meth:`advance` finishes the window.

        The window's jobs run at the rate and on the pools in force when it opens (``run``), in
        rounds that pick among the users its visits made known so far (:meth:`_run_jobs`). A
        visit finds the result of one of them once the job has ended and the result has crossed
        the topic (``propagation_s``, the targets' delay); before that, the result its user had
        (if still live)."""
        got = self._opened
        if got is not None and got[0] == t0 and got[1] == t1:
            return got[2]
        ctx = self.ctx
        s = self.s
        n_seg_all = ctx.pop.n_segments
        book = self.book
        # visits: the same draws whatever the policy does (and the oracle's bound replays them),
        # from the window's requests in the traffic trace; in time order
        n_seg, n_ctl, ids, seg, tv, ctl = draw_visits(
            self.visit_rng, ctx, s, trace_arrivals(ctx, self.r, t0, t1), t0, t1
        )
        order = np.argsort(tv, kind="stable")
        ids, seg, tv, ctl = ids[order], seg[order], tv[order], ctl[order]
        # the jobs, planned as the visits make users known
        cpu_s, acc_s, (done_ids, done_at), wasted, rate = self._run_jobs(
            t0, t1, run, (ids, seg, tv)
        )
        hits = np.zeros(n_seg_all, dtype=np.int64)
        q_sum: FloatArray = np.zeros(n_seg_all)
        staleness: list[FloatArray] = []
        # slots as the book stands now (a user it evicted in the window has none: no hit)
        slots = self._slots(ids)
        found = slots >= 0
        seg, tv, ctl, slots = seg[found], tv[found], ctl[found], slots[found]
        done_slots = self._slots(done_ids)
        kept = done_slots >= 0  # an evicted user's result is lost
        done = (done_slots[kept], done_at[kept])
        # the time each visit's user gets this window's result (the newest of its jobs'), if any
        newest = np.full(book.size, -np.inf)
        np.maximum.at(newest, done[0], done[1])
        fresh_at = np.where(np.isneginf(newest), np.inf, newest)
        delay = ctx.config.propagation_s
        new_seen = fresh_at[slots] + delay <= tv
        # the store as the earlier windows left it serves the visits before that (a result of
        # the end of the last window, too, once it has crossed the topic)
        old_live = (book.cov_until[slots] >= tv) & (book.cov_at[slots] + delay <= tv) & ~new_seen
        used = self._serve(old_live & ~ctl, slots, seg, tv, hits, q_sum, staleness)
        dropped = self._store(done)
        # ... and the window's results the visits after them (a result may expire in the window)
        new_live = new_seen & (book.cov_until[slots] >= tv)
        used += self._serve(new_live & ~ctl, slots, seg, tv, hits, q_sum, staleness)
        visits = (n_seg - n_ctl).astype(np.int64)
        age_all = np.concatenate(staleness) if staleness else np.zeros(0)
        if age_all.size > STALENESS_SAMPLES:
            q = (np.arange(STALENESS_SAMPLES) + 0.5) / STALENESS_SAMPLES
            age_all = np.quantile(age_all, q)
        rec = _Window(
            t0=t0,
            t1=t1,
            visits=visits,
            held=n_ctl.astype(np.int64),
            hits=hits,
            held_out=np.bincount(seg[(old_live | new_live) & ctl], minlength=n_seg_all).astype(
                np.int64
            ),
            q_sum=q_sum,
            staleness=[float(x) for x in age_all.tolist()],
            jobs=int(done[0].size),
            used=used,
            expired_unused=0,  # counted when the window ends (:meth:`advance`)
            dropped_unused=dropped,
            wasted_partial=wasted,
            rate=rate,
        )
        h = np.where(visits > 0, hits / np.maximum(visits, 1), 0.0).astype(np.float64)
        self._visited = (rec, cpu_s, acc_s)
        self._opened = (t0, t1, h)
        return h

    def _serve(
        self,
        served: npt.NDArray[np.bool_],
        slots: IntArray,
        seg: IntArray,
        tv: FloatArray,
        hits: IntArray,
        q_sum: FloatArray,
        staleness: list[FloatArray],
    ) -> int:
        """The visits ``served`` (a mask over ``slots``, ``seg``, ``tv``) are served from their
        users' stored results: their hits, quality and ages added in place; returns how many
        results were served a first time."""
        if not served.any():
            return 0
        slots, seg, tv = slots[served], seg[served], tv[served]
        n_seg_all = hits.size
        hits += np.bincount(seg, minlength=n_seg_all).astype(np.int64)
        age = tv - self.book.cov_at[slots]
        q_sum += np.bincount(seg, weights=self.s.quality(seg, age), minlength=n_seg_all)
        staleness.append(age)
        first = np.unique(slots[~self.served[slots]])
        self.served[slots] = True
        return int(first.size)

    def advance(self, t0: float, t1: float, run: RegionRun) -> tuple[float, float]:
        """Finish the window ``[t0, t1)``: its jobs and visits (:meth:`visit`, if the engine did
        not ask for them when the window opened), expiry. Returns the (cpu, accelerator)
        unit-seconds the jobs used (counted in the window in which they end or stop)."""
        self.visit(t0, t1, run)
        assert self._visited is not None
        rec, cpu_s, acc_s = self._visited
        self._opened = None
        book = self.book
        # expiry: results that expired in the window end now
        nb = book.size
        ended = np.flatnonzero(~np.isnan(book.cov_at[:nb]) & (book.cov_until[:nb] < t1))
        rec.expired_unused = int((~self.served[ended]).sum())
        self._clear(ended)
        tot = self.totals
        tot["jobs"] += rec.jobs
        tot["used"] += rec.used
        tot["expired_unused"] += rec.expired_unused
        tot["dropped_unused"] += rec.dropped_unused
        if t1 >= self.ctx.duration_s - _EPS:
            live_now = ~np.isnan(book.cov_at[: book.size]) & book.active[: book.size]
            rec.stored_unused = int((live_now & ~self.served[: book.size]).sum())
        self.pending.append(rec)
        return cpu_s, acc_s

    def _clear(self, slots: IntArray) -> None:
        book = self.book
        book.cov_at[slots] = np.nan
        book.cov_until[slots] = -np.inf
        self.served[slots] = False

    def _store(self, done: tuple[IntArray, FloatArray]) -> int:
        """Completed jobs' results (slot, as_of) go into the store; returns how many live,
        never-served results they superseded."""
        slots, as_of = done
        book = self.book
        if slots.size == 0:
            return 0
        order = np.argsort(as_of, kind="stable")
        slots, as_of = slots[order], as_of[order]
        # a user with two results in one batch keeps the newer (the older is superseded)
        _, last = np.unique(slots[::-1], return_index=True)
        keep = slots.size - 1 - last
        dup_dropped = slots.size - keep.size  # superseded before anyone could see them
        slots, as_of = slots[keep], as_of[keep]
        had = ~np.isnan(book.cov_at[slots]) & (book.cov_until[slots] >= as_of)
        dropped = int((had & ~self.served[slots]).sum()) + dup_dropped
        life = self.planner.uplift.lifetimes_s[book.seg[slots]]
        book.cov_at[slots] = as_of
        book.cov_until[slots] = as_of + life
        book.inflight[slots] = False
        self.served[slots] = False
        return dropped

    # -- jobs ----------------------------------------------------------------------------------

    def _plan(self, now: float, k: int, run: RegionRun) -> None:
        book = self.book
        if self.queue.size:
            book.inflight[self.queue] = False
        # a hit runs nothing live: a result is worth what it adds over the live alternative the
        # policy would otherwise give the visit (UpliftModel.against_live)
        policy = getattr(run, "policy", None)  # None: a bare run (the unit tests' stand-in)
        live = policy.live_alternative(now, run) if policy is not None else None
        if live is None and self.future is not None and policy is not None:
            # the oracle policy plans its jobs against its live plan: none is in force yet
            self.queue = np.zeros(0, dtype=np.int64)
            return
        self.planner.uplift = self.s.uplift if live is None else self.s.uplift.against_live(live)
        if self.future is None:
            picked = select_slots(self.planner, now, k)
        else:
            picked = self._foresight_slots(now, k)
        book.inflight[picked] = True
        self.queue = picked

    def _foresight_slots(self, now: float, k: int) -> IntArray:
        """The oracle policy's picks (it knows every visit to come): a job started now is
        visible from the next window on (``vis``); it is worth, to each of its user's treatment
        visits in ``[vis, vis + FORESIGHT_HORIZON_S)``, the uplift of a result that young over
        the one the user's stored result would give then (both over the live alternative,
        :meth:`UpliftModel.against_live`). Users with a visit in the next window come first
        (just in time: the result is as young as it can be when it is served), then the others,
        each by that gain; known users only, none with a job in flight, gains > 0."""
        fut = self.future
        assert fut is not None
        book = self.book
        n = book.size
        if k <= 0 or n == 0:
            return np.zeros(0, dtype=np.int64)
        w = self.ctx.window_s
        vis = (math.floor(now / w + _EPS) + 1) * w
        lo, hi = np.searchsorted(fut.t, [vis, vis + FORESIGHT_HORIZON_S])
        slot_of = np.full(int(self.s.users.sum()), -1, dtype=np.int64)  # user id -> book slot
        slot_of[self.known] = self.known_slot
        slots = slot_of[fut.ids[lo:hi]]
        ok = slots >= 0
        slots, tv, seg = slots[ok], fut.t[lo:hi][ok], fut.seg[lo:hi][ok]
        up = self.planner.uplift
        new = self._uplift(up, seg, tv - now)
        cov_at = book.cov_at[slots]
        held = (cov_at <= tv) & (book.cov_until[slots] >= tv)  # ~isnan: NaN compares False
        old = np.where(held, self._uplift(up, seg, tv - np.where(held, cov_at, tv)), 0.0)
        gain = np.bincount(slots, weights=np.maximum(new - old, 0.0), minlength=n)
        soon = np.zeros(n, dtype=bool)
        soon[slots[tv < vis + w]] = True
        eligible = book.active[:n] & ~book.inflight[:n] & (gain > _EPS)
        idx = np.flatnonzero(eligible)
        if idx.size == 0:
            return np.zeros(0, dtype=np.int64)
        order = np.lexsort((-gain[idx], ~soon[idx]))
        return np.asarray(idx[order[:k]], dtype=np.int64)

    @staticmethod
    def _uplift(up: UpliftModel, seg: IntArray, age: FloatArray) -> FloatArray:
        """``max(Δ_s(a), 0)`` within the lifetime, 0 beyond (a result past it is not served)."""
        out = np.zeros(age.size)
        for si in range(up.lifetimes_s.size):
            if not up.lifetimes_s[si] > 0.0:
                continue  # never served: 0
            m = seg == si
            if not m.any():
                continue
            a = age[m]
            d = np.maximum(np.interp(a, up.ages_s, up.delta[si]), 0.0)
            out[m] = np.where(a <= up.lifetimes_s[si], d, 0.0)
        return out

    def _take(self, n: int, now: float, x: float, run: RegionRun) -> IntArray:
        """The next ``n`` picks: a new planning round when the round is over, or early when it
        ran dry: at once if the book has met users since the last round (the worker would pick
        them at its next round), else at most every half round."""
        due = now >= self.next_plan - _EPS
        dry = self.queue.size < n and (
            now >= self.last_plan + self.plan_s / 2 - _EPS or self.book.size > self._planned_size
        )
        if due or dry:
            self.last_plan = now
            self.next_plan = now + self.plan_s
            self._planned_size = self.book.size
            self._plan(now, math.ceil(min(x, 1e6) * self.plan_s * 1.1) + n + 16, run)
        got, self.queue = self.queue[:n], self.queue[n:]
        return got

    def _run_jobs(
        self,
        t0: float,
        t1: float,
        run: RegionRun,
        visits: tuple[IntArray, IntArray, FloatArray],
    ) -> tuple[float, float, tuple[IntArray, FloatArray], int, float]:
        """The jobs of the window ``[t0, t1)`` at the rate and on the pools in force when it
        opens, in pieces cut at the pools' changes and every job duration. Before each piece the
        book observes the ``visits`` (ids, segments, times; in time order) made before it, so a
        piece's picks are among the users seen so far (the worker learns a user at its visit and
        plans every round). Returns the unit-seconds used, the finished jobs (user ids, end
        times), the jobs stopped, and the rate."""
        cfg = self.s.config
        d = cfg.job_duration_s
        cost = self.s.job
        rate = self.rate(run)
        inner = self.change_times[(self.change_times > t0 + _EPS) & (self.change_times < t1 - _EPS)]
        cuts = [t0, *inner.tolist(), t1]
        ids, seg, tv = visits
        seen = 0
        done_ids: list[IntArray] = []
        done_at: list[FloatArray] = []
        wasted = 0
        st0 = self.jobs.stats
        unit_cpu0, unit_acc0 = st0.cpu_unit_s, st0.accelerator_unit_s
        fluid_jobs = 0
        for a_cap, b_cap in itertools.pairwise(cuts):
            # the pools hold from a_cap to b_cap
            pools = usable_pools(
                self.levels(run, a_cap),
                a_cap,
                use=CapacityUse.ASYNC,
                hardware=self.s.hardware,
                min_lifetime_s=d,
                safety_margin=cfg.safety_margin,
            )
            stopped = self.jobs.set_pools(pools, a_cap)
            wasted += len(stopped)
            for j in stopped:  # a stopped job delivers nothing: its user may be picked again
                slot = self.book.slot(j.user)
                if slot is not None:
                    self.book.inflight[slot] = False
            for j in self.jobs.due(b_cap):
                done_ids.append(np.array([j.user], dtype=np.int64))
                done_at.append(np.array([j.ends_at]))
            empty = JobBook(cost, d)
            empty.set_pools(pools, a_cap)
            x = min(rate, empty.capacity() / d)
            if not (x > 0.0) or b_cap - a_cap <= _EPS:
                continue
            # planning rounds every job duration; a job runs on until it ends or the pools change
            rounds = np.arange(a_cap + d, b_cap - _EPS, d)
            for a, b in itertools.pairwise([a_cap, *rounds.tolist(), b_cap]):
                upto = int(np.searchsorted(tv, a, side="left"))
                if upto > seen:
                    self._observe(ids[seen:upto], seg[seen:upto], tv[seen:upto])
                    seen = upto
                want = self.carry + x * (b - a)
                n = int(want)
                self.carry = want - n
                if n == 0:
                    continue
                picks = self._take(n, a, x, run)
                n = picks.size
                if n == 0:
                    self.carry = 0.0
                    continue
                starts = a + (np.arange(n) + 0.5) * (b - a) / n
                inside = starts + d <= b_cap + _EPS
                if inside.any():
                    done_ids.append(self.book.ids[picks[inside]])
                    done_at.append(starts[inside] + d)
                    fluid_jobs += int(inside.sum())
                tail = picks[~inside]
                if tail.size:
                    t_mid = float(starts[~inside].mean())
                    users = self.book.ids[tail]
                    segs = self.book.seg[tail]
                    started = self.jobs.start(
                        t_mid, list(zip(users.tolist(), segs.tolist(), strict=True))
                    )
                    if len(started) < tail.size:  # did not fit: back to the pool of users
                        self.book.inflight[tail[len(started) :]] = False
        st = self.jobs.stats
        cpu_s = st.cpu_unit_s - unit_cpu0 + fluid_jobs * cost.cpu_s
        acc_s = st.accelerator_unit_s - unit_acc0 + fluid_jobs * cost.accelerator_s
        if seen < ids.size:
            self._observe(ids[seen:], seg[seen:], tv[seen:])
        users = np.concatenate(done_ids) if done_ids else np.zeros(0, dtype=np.int64)
        at = np.concatenate(done_at) if done_at else np.zeros(0)
        return cpu_s, acc_s, (users, at), wasted, rate

    # -- window lines --------------------------------------------------------------------------

    def flush(self, arrivals: FloatArray, hit_live: FloatArray, pi_ctl: float) -> PrecomputeWindows:
        """The precompute parts of the pending windows' lines: ``arrivals`` (W,) the windows'
        fluid arrivals, ``hit_live`` (W, S) the value the live path delivered for the hits
        (their baseline, in time: module docstring)."""
        ctx = self.ctx
        s = self.s
        pop = ctx.pop
        recs = self.pending
        self.pending = []
        n_w = len(recs)
        n_s = pop.n_segments
        inc_seg = np.zeros((n_w, n_s))
        fields: list[dict[str, Any]] = []
        for w, rec in enumerate(recs):
            count = arrivals[w] * pop.seg_share  # fluid requests per segment
            with np.errstate(divide="ignore", invalid="ignore"):
                h = np.where(rec.visits > 0, rec.hits / np.maximum(rec.visits, 1), 0.0)
                q_bar = np.where(rec.hits > 0, rec.q_sum / np.maximum(rec.hits, 1), 0.0)
            inc_seg[w] = count * ctx.treat * h * s.v_mean * q_bar - hit_live[w]
            f: dict[str, Any] = {
                "jobs": rec.jobs,
                "used": rec.used,
                "expired_unused": rec.expired_unused,
                "visits": int(rec.visits.sum() + rec.held.sum()),
                "hits": int(rec.hits.sum()),
                "wasted_partial": rec.wasted_partial,
                "staleness_s": rec.staleness,
                "held_out": int(rec.held_out.sum()),
                "dropped_unused": rec.dropped_unused,
                "jobs_per_s": rec.rate if math.isfinite(rec.rate) else None,
            }
            if rec.stored_unused is not None:
                f["stored_unused"] = rec.stored_unused
            fields.append(f)
        hits = np.sum([r.hits for r in recs], axis=0) if recs else np.zeros(n_s)
        visits = np.sum([r.visits for r in recs], axis=0) if recs else np.zeros(n_s)
        return PrecomputeWindows(
            inc=inc_seg.sum(axis=1),
            inc_seg=inc_seg,
            fields=fields,
            value_obs=self._signals(recs, pi_ctl),
            hit_share={
                name: float(hits[i] / visits[i])
                for i, name in enumerate(ctx.segment_names)
                if visits[i] > 0
            },
        )

    def _signals(self, recs: list[_Window], pi_ctl: float) -> dict[tuple[str, str, str], ArmStats]:
        """Observed value sums of lever precompute per segment: treatment = hits, control =
        held-out visits that found a result (drawn like the engine's arms)."""
        ctx = self.ctx
        pop = ctx.pop
        n_s = pop.n_segments
        hits = np.sum([r.hits for r in recs], axis=0) if recs else np.zeros(n_s, np.int64)
        held = np.sum([r.held_out for r in recs], axis=0) if recs else np.zeros(n_s, np.int64)
        q_sum = np.sum([r.q_sum for r in recs], axis=0) if recs else np.zeros(n_s)
        if not (hits.sum() > 0 or held.sum() > 0):
            return {}
        q_bar = np.where(hits > 0, q_sum / np.maximum(hits, 1), 0.0)
        cells = np.arange(pop.n_cells)
        seg = pop.seg
        n_all = np.concatenate([hits, held]).astype(np.int64)
        s1, s2 = arm_sums(
            self.signal_rng,
            pop,
            n_all,
            np.concatenate([pop.share, pop.share]),
            np.concatenate([seg, n_s + seg]),
            np.concatenate([cells, cells]),
            np.concatenate([q_bar[seg], ctx.q_base]),
            np.concatenate([ctx.sd_strong, ctx.sd_base]),
            np.concatenate([np.ones(pop.n_cells), np.full(pop.n_cells, pi_ctl)]),
        )
        out: dict[tuple[str, str, str], ArmStats] = {}
        for si, name in enumerate(ctx.segment_names):
            for gi, arm in ((si, "treatment"), (n_s + si, "control")):
                if n_all[gi] > 0:
                    out[(name, LEVER_PRECOMPUTE, arm)] = ArmStats(
                        int(n_all[gi]), float(s1[gi]), float(s2[gi])
                    )
        return out
