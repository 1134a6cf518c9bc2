"""The simulator's precompute model (sim/precompute_sim.py): the store's expiry, where jobs may
run, reclaims, the planner's choice, and the accounting identity — on synthetic value curves."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from headroom.controllers.precompute import PrecomputeConfig, PrecomputePlanner, UpliftModel
from headroom.kernel.scenario import Opportunistic, Scenario
from headroom.kernel.scenario_load import load_scenario
from headroom.sim.context import SimContext
from headroom.sim.precompute_sim import (
    PrecomputeRegion,
    PrecomputeStatic,
    precompute_capable,
    precompute_region,
    precompute_static,
    returning_share,
    select_slots,
    trace_arrivals,
)
from headroom.world.curves import ValueCurves

ROOT = Path(__file__).resolve().parents[2]


def fake_curves(segments: tuple[str, ...]) -> ValueCurves:
    """Strong better than base; a stored strong ranking loses quality linearly with age."""
    s = len(segments)
    n_grid = np.array([400, 800, 1200])
    mean = np.empty((2, s, 3))
    mean[0] = [0.60, 0.62, 0.63]
    mean[1] = [0.70, 0.72, 0.73]
    ages = np.array([0.0, 1800.0, 3600.0, 14400.0])
    pre = np.tile(np.array([0.72, 0.62, 0.55, 0.40]), (s, 1))
    return ValueCurves(
        segments=segments,
        n_grid=n_grid,
        mean=mean,
        std=np.full((2, s, 3), 0.1),
        age_grid_s=ages,
        precompute_mean=pre,
        precompute_std=np.full((s, 4), 0.1),
        precompute_n=1200,
        samples_per_segment=10,
    )


def scenario(pools: list[Opportunistic] | None = None, duration: float = 1200.0) -> Scenario:
    s = load_scenario(ROOT / "scenarios" / "precompute-remote.yaml")
    s = dataclasses.replace(s, duration_s=duration, events=())
    if pools is not None:
        s = dataclasses.replace(
            s, regions=(dataclasses.replace(s.regions[0], opportunistic=tuple(pools)),)
        )
    return s


def pool(resource: str, hardware: str, trace: list[list[float]], remote: bool) -> Opportunistic:
    return Opportunistic(resource=resource, hardware=hardware, trace=trace, remote=remote)  # type: ignore[arg-type]


def context(s: Scenario) -> SimContext:
    return SimContext(s, fake_curves(tuple(x.name for x in s.segments)))


def stub_run(n_pools: int) -> Any:
    """What the model reads of a RegionRun: targets, and the live levers' assignments."""
    return SimpleNamespace(
        targets=None, epoch_in_force=1, asg_rma=[0.0] * n_pools, asg_sbm=[0.0] * n_pools
    )


def drive(model: PrecomputeRegion, ctx: SimContext, until: float) -> list[dict[str, Any]]:
    """Advance window by window (visits from the scenario's traffic, 100 requests/s), flushing
    each window's line parts."""
    run = stub_run(len(ctx.regions[0].pools))
    fields = []
    w = ctx.window_s
    t = 0.0
    while t < until - 1e-9:
        model.advance(t, t + w, run)
        out = model.flush(np.array([100.0 * w]), np.full((1, ctx.pop.n_segments), 1.0), 1.0)
        fields.extend(out.fields)
        t += w
    return fields


def test_the_model_runs_only_for_precompute_policies_and_scenarios() -> None:
    ctx = context(scenario())
    assert precompute_region(ctx, 0, "static") is None
    assert precompute_region(ctx, 0, "greedy") is None
    assert precompute_region(ctx, 0, "central-only") is None
    assert isinstance(precompute_region(ctx, 0, "headroom"), PrecomputeRegion)
    assert isinstance(precompute_region(ctx, 0, "oracle"), PrecomputeRegion)
    quick = load_scenario(ROOT / "scenarios" / "quickstart.yaml")
    qctx = SimContext(quick, fake_curves(tuple(x.name for x in quick.segments)))
    assert precompute_static(qctx) is None
    assert precompute_region(qctx, 0, "headroom") is None
    assert not precompute_capable(qctx, 0)
    assert returning_share(qctx, 0) is None


def test_users_are_split_so_each_segment_returns_at_its_rate() -> None:
    st = precompute_static(context(scenario()))
    assert isinstance(st, PrecomputeStatic)
    # the scenario's own calibration: 9,000 premium and 102,000 casual users
    assert st.users.tolist() == [9000, 102000]


def test_select_slots_is_the_planners_choice() -> None:
    s = scenario()
    ctx = context(s)
    st = precompute_static(ctx)
    assert st is not None
    a = PrecomputePlanner(st.config, st.uplift, np.random.default_rng(5))
    b = PrecomputePlanner(st.config, st.uplift, np.random.default_rng(5))
    rng = np.random.default_rng(1)
    for u in rng.choice(100_000, 5000, replace=False).tolist():
        seg = int(u % 2)
        a.users.observe(u, seg, 0.0)
        b.users.observe(u, seg, 0.0)
    for i, u in enumerate(a.users.ids[:300].tolist()):  # some users hold results of some age
        a.users.set_stored(u, -60.0 * i, -60.0 * i + 600.0)
        b.users.set_stored(u, -60.0 * i, -60.0 * i + 600.0)
    for k in (1, 50, 4000, 10_000):
        picks = a.select(100.0, k)
        slots = select_slots(b, 100.0, k)
        assert [p.user for p in picks] == b.users.ids[slots].tolist()


def test_a_result_past_its_expiry_is_never_served(monkeypatch: pytest.MonkeyPatch) -> None:
    s = scenario(duration=3600.0)
    ctx = context(s)
    model = precompute_region(ctx, 0, "oracle")
    assert model is not None
    life = model.s.uplift.lifetimes_s
    assert 0 < life.min() < 3000  # some results expire within the run
    served: list[tuple[np.ndarray, np.ndarray]] = []
    real = PrecomputeStatic.quality

    def spy(self: PrecomputeStatic, seg: np.ndarray, age: np.ndarray) -> np.ndarray:
        served.append((seg.copy(), age.copy()))
        return real(self, seg, age)

    monkeypatch.setattr(PrecomputeStatic, "quality", spy)
    fields = drive(model, ctx, 3600.0)
    seg = np.concatenate([x for x, _ in served])
    age = np.concatenate([a for _, a in served])
    assert seg.size > 1000  # plenty of hits
    assert (age >= 0).all()
    assert (age <= life[seg] + 1e-9).all()
    assert sum(f["expired_unused"] for f in fields) > 0  # and some results did expire


def test_no_job_runs_where_the_strong_model_cannot() -> None:
    # remote gpu-a accelerators and CPU: the strong model runs on gpu-b only
    s = scenario([pool("accelerator", "gpu-a", [[0, 4]], True), pool("cpu", "any", [[0, 8]], True)])
    ctx = context(s)
    model = precompute_region(ctx, 0, "oracle")
    assert model is not None
    fields = drive(model, ctx, 600.0)
    assert sum(f["jobs"] for f in fields) == 0
    assert not model.jobs.stats.started
    assert not precompute_capable(ctx, 0)
    # the same capacity on gpu-b runs jobs
    s2 = scenario(
        [pool("accelerator", "gpu-b", [[0, 4]], True), pool("cpu", "any", [[0, 8]], True)]
    )
    ctx2 = context(s2)
    model2 = precompute_region(ctx2, 0, "oracle")
    assert model2 is not None
    assert sum(f["jobs"] for f in drive(model2, ctx2, 600.0)) > 0
    assert precompute_capable(ctx2, 0)


def test_the_oracle_policy_uses_remote_pools_only_and_headroom_what_live_levers_leave() -> None:
    s = scenario(
        [pool("accelerator", "gpu-b", [[0, 2]], False), pool("cpu", "any", [[0, 8]], False)]
    )
    ctx = context(s)
    oracle = precompute_region(ctx, 0, "oracle")
    assert oracle is not None
    assert sum(f["jobs"] for f in drive(oracle, ctx, 300.0)) == 0
    head = precompute_region(ctx, 0, "headroom")
    assert head is not None
    run = stub_run(2)
    run.epoch_in_force = 0  # no target yet: the worker's default rate
    run.asg_sbm = [2.0, 0.0]  # SBM holds every local device: nothing left
    head.advance(0.0, 60.0, run)
    assert head.pending[-1].jobs == 0
    run.asg_sbm = [1.0, 0.0]  # one device left
    head.advance(60.0, 120.0, run)
    head.advance(120.0, 180.0, run)
    assert head.pending[-1].jobs > 0
    levels = head.levels(run, 150.0)
    assert [lv.units for lv in levels] == [1.0, 8.0]
    run.epoch_in_force = 3  # a target was in force and expired: no new job
    head.advance(180.0, 240.0, run)
    head.advance(240.0, 300.0, run)
    assert head.pending[-1].jobs == 0
    assert head.pending[-1].rate == 0.0


def test_a_reclaim_stops_running_jobs_at_once_and_counts_them() -> None:
    # one remote gpu-b pool taken away at t = 305 s, inside a window
    s = scenario(
        [pool("accelerator", "gpu-b", [[0, 2], [305, 0]], True), pool("cpu", "any", [[0, 8]], True)]
    )
    ctx = context(s)
    model = precompute_region(ctx, 0, "oracle")
    assert model is not None
    fields = drive(model, ctx, 600.0)
    d = model.s.config.job_duration_s
    cost = model.s.job
    in_flight = int(2 * 0.9 / (cost.accelerator_s / d))  # jobs running at once before
    wasted = sum(f["wasted_partial"] for f in fields)
    assert 0 < wasted <= in_flight
    assert model.jobs.stats.stopped == wasted
    assert not model.jobs.jobs  # nothing runs on the lost units
    # no job completes after the reclaim (except those that ended before it)
    after = [f["jobs"] for f, t in zip(fields, range(0, 600, 10), strict=True) if t >= 310]
    assert sum(after) == 0


def test_every_job_is_accounted_for() -> None:
    s = scenario(duration=3600.0)
    ctx = context(s)
    model = precompute_region(ctx, 0, "headroom")
    assert model is not None
    run = stub_run(len(ctx.regions[0].pools))
    run.epoch_in_force = 0  # no target yet: the worker's default rate
    fields = []
    for w in range(360):
        model.advance(10.0 * w, 10.0 * w + 10.0, run)
        fields.extend(model.flush(np.array([1000.0]), np.ones((1, 2)), 1.0).fields)
    total = {k: sum(f[k] for f in fields) for k in ("jobs", "used", "expired_unused")}
    dropped = sum(f["dropped_unused"] for f in fields)
    stored_unused = fields[-1]["stored_unused"]
    assert total["jobs"] > 0
    assert total["used"] > 0
    assert total["jobs"] == total["used"] + total["expired_unused"] + dropped + stored_unused
    # the default rate: 20 jobs/s
    assert total["jobs"] <= 20 * 3600
    assert sum(f["hits"] for f in fields) <= sum(f["visits"] for f in fields)


def test_no_policy_serves_a_user_sooner_than_a_job_after_its_first_visit() -> None:
    # ample remote capacity and no rate limit: the oracle policy stores a result for every user
    # it knows; still only visits of users first seen a job's duration and the topic's delay
    # earlier can hit (the bound's ρ), in the window of the first visit or later
    ctx = context(scenario(duration=1200.0))
    rho = returning_share(ctx, 0)
    assert rho is not None
    assert rho.shape == (ctx.n_windows, ctx.pop.n_segments)
    assert ((rho >= 0.0) & (rho <= 1.0)).all()
    assert rho[-10:].mean() > rho[1:11].mean()  # users become known as they visit
    model2 = precompute_region(ctx, 0, "oracle")
    assert model2 is not None
    run = stub_run(len(ctx.regions[0].pools))
    hit_any = False
    for w in range(ctx.n_windows):
        t0 = w * ctx.window_s
        model2.advance(t0, min(t0 + ctx.window_s, ctx.duration_s), run)
        rec = model2.pending[-1]
        # same draws as the replay: the hits never exceed the returning visits
        assert (rec.hits <= np.round(rho[w] * rec.visits) + 1e-9).all(), w
        hit_any = hit_any or rec.hits.sum() > 0
    assert hit_any


def test_the_visits_come_from_the_trace_whatever_the_window_is_cut_into() -> None:
    ctx = context(scenario())
    whole = trace_arrivals(ctx, 0, 0.0, 600.0)
    parts = sum(trace_arrivals(ctx, 0, 10.0 * w, 10.0 * w + 10.0) for w in range(60))
    assert whole == pytest.approx(parts)
    assert whole == pytest.approx(
        float(ctx.traces.regions[0].arrivals.sum()) * 600.0 / 1200.0, rel=0.1
    )


def test_the_oracle_bound_counts_each_returning_visit_once_at_the_best_gain() -> None:
    from headroom.sim.oracle import Oracle

    # no local capacity: the live levers can do nothing; the bound is exactly every returning
    # treatment visit at the best gain (plus static's own losses, the relief term)
    remote = [pool("accelerator", "gpu-b", [[0, 2]], True), pool("cpu", "any", [[0, 8]], True)]
    ctx = context(scenario(remote))
    st = precompute_static(ctx)
    rho = returning_share(ctx, 0)
    assert st is not None
    assert rho is not None
    bound = Oracle(ctx).bound()
    want = 0.0
    for w in range(ctx.n_windows):
        t0 = w * ctx.window_s
        n = trace_arrivals(ctx, 0, t0, min(t0 + ctx.window_s, ctx.duration_s)) * ctx.treat
        want += n * float((ctx.pop.seg_share * rho[w] * st.best_gain).sum())
    assert bound.by_lever["rma"] == 0.0
    assert bound.by_lever["sbm"] == 0.0
    assert bound.total - bound.relief == pytest.approx(want, rel=1e-6)
    assert bound.by_lever["precompute"] == pytest.approx(want, rel=1e-6)
    # with live capacity too: more than without it, but a request still gets one option, so
    # less than the live part plus every visit at the best gain (the old, additive bound)
    local = [
        *remote,
        pool("accelerator", "gpu-b", [[0, 1]], False),
        pool("cpu", "any", [[0, 4]], False),
    ]
    ctx2 = context(scenario(local))
    joint = Oracle(ctx2).bound()
    arrivals = float(ctx2.traces.regions[0].arrivals.sum()) * ctx2.treat
    every_visit = arrivals * float((ctx2.pop.seg_share * st.best_gain).sum())
    live = joint.by_lever["rma"] + joint.by_lever["sbm"]
    assert live > 0.0
    assert joint.total > bound.total
    assert joint.total - joint.relief < live + every_visit


def test_the_best_gain_is_never_negative_nor_below_a_fresh_result() -> None:
    ctx = context(scenario())
    st = precompute_static(ctx)
    assert st is not None
    assert (st.best_gain >= 0).all()
    cfg = PrecomputeConfig.from_scenario(ctx.scenario)
    up = UpliftModel.from_curves(fake_curves(st.config.segment_names), cfg)
    # the best gain is at least the core's uplift of a fresh result
    assert (st.best_gain >= up.delta[:, 0] - 1e-12).all()


def test_the_hit_share_known_when_a_window_opens_is_the_windows_and_changes_nothing() -> None:
    """The engine asks for the window's visits when it opens (to take the hits out of the live
    plan): the share it gets is the window line's ``hits / visits`` of treatment visits, and
    asking early draws nothing more — the run is the one of a model never asked."""
    s = scenario(duration=900.0)
    ctx = context(s)
    asked = precompute_region(ctx, 0, "headroom")
    plain = precompute_region(ctx, 0, "headroom")
    assert asked is not None
    assert plain is not None
    run = stub_run(len(ctx.regions[0].pools))
    run.epoch_in_force = 0  # no target yet: the worker's default rate
    w = ctx.window_s
    hit_windows = 0
    for k in range(int(900.0 / w)):
        t0, t1 = k * w, (k + 1) * w
        h = asked.visit(t0, t1, run)
        assert asked.visit(t0, t1, run) is h  # once per window
        asked.advance(t0, t1, run)
        plain.advance(t0, t1, run)
        rec, ref = asked.pending[-1], plain.pending[-1]
        assert rec.hits.tolist() == ref.hits.tolist()
        assert rec.jobs == ref.jobs
        want = np.where(rec.visits > 0, rec.hits / np.maximum(rec.visits, 1), 0.0)
        assert h.tolist() == pytest.approx(want.tolist())
        hit_windows += int(rec.hits.sum() > 0)
    assert hit_windows > 10


def test_a_result_reaches_the_visits_after_its_job_and_the_topics_delay_in_its_own_window(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A window's jobs pick among the users seen so far, round by round, and a visit finds a
    result once its job has ended and it has crossed the topic (``propagation_s``): users who
    come back every ~15 s are served within the window of their first visit, never sooner."""
    from headroom.sim.config import SimConfig

    s = load_scenario(ROOT / "tests" / "integration" / "scenarios" / "agree-precompute.yaml")
    segments = tuple(x.name for x in s.segments)

    def first_windows(propagation_s: float) -> tuple[list[int], list[float]]:
        ctx = SimContext(s, fake_curves(segments), config=SimConfig(propagation_s=propagation_s))
        model = precompute_region(ctx, 0, "headroom")
        assert model is not None
        ages: list[float] = []
        real = PrecomputeStatic.quality

        def spy(self: PrecomputeStatic, seg: np.ndarray, age: np.ndarray) -> np.ndarray:
            ages.extend(age.tolist())
            return real(self, seg, age)

        monkeypatch.setattr(PrecomputeStatic, "quality", spy)
        run = stub_run(len(ctx.regions[0].pools))
        run.epoch_in_force = 0  # no target yet: the worker's default rate
        hits = []
        for w in range(3):
            model.advance(10.0 * w, 10.0 * w + 10.0, run)
            hits.append(int(model.pending[-1].hits.sum()))
        return hits, ages

    hits, ages = first_windows(0.5)
    assert hits[0] > 0  # served in the window of the users' first visits
    assert min(ages) >= 0.5 - 1e-9  # a result is never served before it crossed the topic
    # a topic as slow as the window: nothing found in the first one, some in the next
    slow, slow_ages = first_windows(10.0)
    assert slow[0] == 0
    assert sum(slow) > 0
    assert min(slow_ages) >= 10.0 - 1e-9
    assert sum(slow) < sum(hits)
