"""The window closing's one pass over every step of a batch, whatever mix each step ran under.

A server admitting part of the offered optional work gives a new request mix at almost every
step. The engine computes what a mix takes from its levels alone once per run
(:func:`headroom.sim.context.build_mix`'s shapes) and closes a batch of windows with one pass
over all their steps (:class:`headroom.sim.windows.MixTable`), not one per mix. These tests pin
that the one pass gives what each mix's own strata give, and that it runs once per batch.
"""

from __future__ import annotations

import dataclasses
from dataclasses import fields
from typing import Any

import numpy as np
import pytest

from headroom.sim.context import _ROW, Plan, SimContext, build_mix
from headroom.sim.latency import STRATA_FIELDS, optional_outcome
from headroom.sim.windows import _strata, _strata_rows, mix_table
from tests.simulation.test_sim_parts import scenario
from tests.simulation.test_sim_runs import curves_of


def _context() -> SimContext:
    s = scenario()
    return SimContext(s, curves_of(s))


def _plans(ctx: SimContext, rng: np.random.Generator) -> list[Plan]:
    """Plans of 0, 1 and 3 RMA levels, with shares of every kind, some cells admitted in part."""
    c = ctx.pop.n_cells
    out = []
    for levels in ((), (100,), (100, 300, 800), (100,), ()):
        j = len(levels)
        rma = rng.random((j, c)) * 0.3
        sbm = rng.random(c) * 0.3
        down = rng.random(c) * 0.05
        fail = np.where(rng.random(c) < 0.3, rng.random(c) * 0.05, 0.0)
        out.append(Plan(levels, rma, sbm, down, fail))
    return out


def _rows(n: int, rng: np.random.Generator) -> Any:
    """Block rows (sim/context.py ``_ROW``) of a loaded region: some stages over 1, backlogs."""
    g = np.zeros((n, len(_ROW)))
    col = {name: i for i, name in enumerate(_ROW)}
    g[:, col["a"]] = rng.random(n) * 200
    g[:, col["lam"]] = g[:, col["a"]]
    g[:, col["dt"]] = 1.0
    for name in ("rc", "ra", "rs", "src", "sra", "mc", "ma", "roc", "roa"):
        g[:, col[name]] = rng.random(n) * 1.2
    for name in ("c0", "c1", "a0", "a1", "s0", "s1", "sc0", "sc1", "sa0", "sa1"):
        g[:, col[name]] = np.where(rng.random(n) < 0.4, rng.random(n) * 0.05, 0.0)
    for name in ("oc0", "oc1", "oa0", "oa1"):
        g[:, col[name]] = np.where(rng.random(n) < 0.4, rng.random(n) * 0.08, 0.0)
    g[:, col["fail"]] = np.where(rng.random(n) < 0.2, rng.random(n) * 3, 0.0)
    g[:, col["speed"]] = 0.5 + 0.5 * rng.random(n)
    g[:, col["nc"]] = 6.0 + 2 * rng.random(n)
    g[:, col["na"]] = 4.0 + rng.random(n)
    g[:, col["ns"]] = rng.random(n) * 2
    return g


@pytest.mark.parametrize("ideal", [False, True])
def test_the_strata_of_many_mixes_in_one_pass_are_each_mixs_own(ideal: bool) -> None:
    """Steps under mixes of 0, 1 and 3 RMA levels, interleaved: the one pass (the classes laid
    out side by side, the padding left out) gives, step by step, the strata of the step's own
    mix computed alone — every field, exactly — and the in-time shares of the strata computed
    per mix (to the last bits: a reduction's order may differ with the batch's size)."""
    from headroom.sim.engine import RegionRun
    from headroom.sim.policies import StaticRegion

    ctx = _context()
    rng = np.random.default_rng(5)
    mixes = [build_mix(ctx, p, (0.75, 1.0)) for p in _plans(ctx, rng)]
    policy = StaticRegion()
    if ideal:
        policy.ideal = True  # type: ignore[misc]
    run = RegionRun(ctx, 0, policy, lambda *_: None, 60.0)
    n = 40
    g = _rows(n, rng)
    mi = rng.integers(0, len(mixes), n)
    table = mix_table(mixes)
    assert table.jmax == 3
    batched, real = _strata_rows(run, g, table, mi)
    assert int(real.sum()) == batched.size == sum(mixes[m].frac.size for m in mi)
    at = 0
    for i in range(n):
        own, k = _strata(run, g[i : i + 1], mixes[mi[i]])
        assert k == mixes[mi[i]].frac.size == own.size
        for f in STRATA_FIELDS:
            want = getattr(own, f)
            got = getattr(batched, f)
            assert (want is None) == (got is None) == ideal or f in STRATA_FIELDS[:12]
            if want is not None:
                np.testing.assert_array_equal(got[at : at + k], want, err_msg=f)
        at += k
    cfg = ctx.config.latency
    pi, keep = optional_outcome(batched, cfg, ctx.timeout_ms)
    by_mix = [
        optional_outcome(_strata(run, g[mi == m], mixes[m])[0], cfg, ctx.timeout_ms)
        for m in range(len(mixes))
    ]
    starts = np.concatenate([[0], np.cumsum([mixes[m].frac.size for m in mi])])
    for m, (pi_m, keep_m) in enumerate(by_mix):
        k = mixes[m].frac.size
        idx = np.concatenate([np.arange(starts[i], starts[i] + k) for i in np.flatnonzero(mi == m)])
        np.testing.assert_allclose(pi[idx], pi_m, rtol=1e-13, atol=1e-15)
        np.testing.assert_allclose(keep[idx], keep_m, rtol=1e-13, atol=1e-15)
    assert float(pi.min()) < 0.99  # the rows load the stages: not every request in time


def test_a_mixs_level_shape_is_computed_once_and_gives_the_same_mix() -> None:
    """Mixes of many plans of the same levels share one shape (what depends on the levels and
    the extras' units alone); a mix built on the kept shape equals one built afresh."""
    ctx = _context()
    rng = np.random.default_rng(11)
    c = ctx.pop.n_cells
    z = np.zeros(c)
    plans = [
        Plan((100, 300), rng.random((2, c)) * 0.4, rng.random(c) * 0.3, z, z) for _ in range(20)
    ]
    kept = [build_mix(ctx, p, (0.75, 1.0)) for p in plans]
    assert len(ctx.mix_shapes) == 1
    for p, mix in zip(plans, kept, strict=True):
        ctx.mix_shapes.clear()
        fresh = build_mix(ctx, p, (0.75, 1.0))
        for f in fields(mix):
            a, b = getattr(mix, f.name), getattr(fresh, f.name)
            if isinstance(a, np.ndarray):
                np.testing.assert_array_equal(a, b, err_msg=f.name)
            elif f.name != "plan":
                assert a == b, f.name
    build_mix(ctx, dataclasses.replace(plans[0], levels=(100, 800)), (0.75, 1.0))
    build_mix(ctx, plans[0], None)
    assert len(ctx.mix_shapes) == 3


def test_a_batch_of_windows_is_closed_in_one_pass_whatever_the_mixes() -> None:
    """The headroom policy on a region whose servers admit part of the offered work: many more
    mixes than batches of windows, and the strata are computed once per batch."""
    from headroom.sim import engine
    from headroom.sim.policies import PolicyFactory

    s = dataclasses.replace(scenario(), duration_s=1200.0)
    ctx = SimContext(s, curves_of(s))
    factory = PolicyFactory("headroom", ctx)
    calls: list[int] = []
    built: list[int] = []
    rows_of = engine._strata_rows
    mix_of = engine.build_mix

    def counting_rows(run: Any, g: Any, table: Any, mi: Any) -> Any:
        calls.append(len(table.mixes))
        return rows_of(run, g, table, mi)

    def counting_mix(*args: Any) -> Any:
        built.append(1)
        return mix_of(*args)

    steps: list[float] = []
    step_of = engine.RegionRun._on_control

    def counting_step(run: Any, t: float, extra: bool = False) -> None:
        steps.append(t)
        step_of(run, t, extra)

    mp = pytest.MonkeyPatch()
    try:
        mp.setattr(engine, "_strata_rows", counting_rows)
        mp.setattr(engine, "build_mix", counting_mix)
        mp.setattr(engine.RegionRun, "_on_control", counting_step)
        windows: list[dict[str, Any]] = []
        engine.run_policy(
            ctx,
            "headroom",
            factory.region,
            lambda ev: windows.append(ev) if ev["kind"] == "window" else None,
            control_interval_s=factory.interval_s,
        )
    finally:
        mp.undo()
    batches = len(calls)
    # a batch closes at each control step (the ticks, and the steps between ticks a capacity
    # change or an outage's end brings) and at the run's end
    assert round(s.duration_s / factory.interval_s) <= batches <= len(steps) + 1
    assert len(windows) == round(s.duration_s / s.slo.window_s)
    assert sum(calls) > batches  # several mixes per batch: one pass for all of them
    assert len(built) > batches
