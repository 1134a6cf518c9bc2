"""The feasible bound (sim/oracle.py, *The feasible bound*) and the oracle policy that runs it
through the engine's real queues; the peer policies envoy and sre-throttle run to completion."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest

from headroom.defences.admission import admitted_share
from headroom.sim.config import SimConfig
from headroom.sim.context import run_levels
from headroom.sim.oracle import _HIT_GRID, BOUND_STEP, PRICE_STEP, SPLIT_STEP, Oracle
from headroom.sim.run import build_context, run_simulation
from tests.simulation.test_sim_runs import curves_of, short


@pytest.fixture(scope="module")
def oracle() -> Oracle:
    s = short("quickstart")
    return Oracle(build_context(s, curves=curves_of(s)))


def test_the_feasible_bound_is_below_the_loose_one_and_splits_into_levers(oracle: Oracle) -> None:
    loose = oracle.bound()
    feasible = oracle.feasible()
    assert 0 < feasible.total < loose.total
    assert sum(feasible.by_lever.values()) + feasible.relief == pytest.approx(feasible.total)
    assert feasible.relief == loose.relief  # the same relief term


def test_no_optional_work_while_targets_are_expired(oracle: Oracle) -> None:
    # quickstart: an outage [3000, 3400) with a 60 s interval and targets living 180 s: the
    # last targets before it (2940) expire at 3120, the first after it (issued as it ends, at
    # 3400, not at the next tick) reach clients 2 s on
    rules = oracle.rules
    assert [(a, b) for a, b, _ in rules.expired] == [(3120.0, 3402.0)]
    assert rules.options_at(0, 3119.0).any()
    assert not rules.options_at(0, 3200.0).any()
    assert not rules.options_at(0, 3401.0).any()
    assert rules.options_at(0, 3402.0).any()


def test_strong_devices_are_whole_and_loaded(oracle: Oracle) -> None:
    rules = oracle.rules
    grid = [1.0 + k * SPLIT_STEP for k in range(round(1.0 / SPLIT_STEP) + 1)]  # 1 .. 2
    # gpu-b (2 devices, both models) is present from 0: nothing loaded before load_s (120 s)
    ms, _ = rules.split_options(0, 60.0)
    assert ms == [0.0]
    ms, opts = rules.split_options(0, 600.0)
    # a replica needs one whole device; above it, slices (the engine's rule)
    assert ms == pytest.approx([0.0, *grid])
    # preempted at 1800, granted back at 2000: loaded again only from 2120
    assert rules.split_options(0, 1900.0)[0] == [0.0]
    assert rules.split_options(0, 2100.0)[0] == [0.0]
    assert rules.split_options(0, 2130.0)[0] == pytest.approx([0.0, *grid])
    # each option is the admission rule's share of its units: the strong stage of m devices
    s_units = opts[:, 2]
    strong_ms = oracle.ctx.n0 * oracle.ctx.costs.strong_accelerator_ms
    for m, s in zip(ms, s_units.tolist(), strict=True):
        k = admitted_share(m, strong_ms, rules.sbm_budget_ms) if m > 0 else 0.0
        assert s == pytest.approx(m * k)
        assert s < m or m == 0  # never 100 % busy
    # and RMA's devices shrink as the strong model takes them
    assert np.all(np.diff(opts[:, 1]) < 0)


def test_the_bound_covers_every_split_the_engine_allows(oracle: Oracle) -> None:
    # the bound's options: none for the strong model, then per BOUND_STEP interval [m_i, m_i+1]
    # its optimistic corner (RMA's devices at m_i, the strong model's at m_i+1)
    rules = oracle.rules
    price, corners = rules.bound_options(0, 600.0)
    assert price.shape[0] == 1 + round(1.0 / PRICE_STEP) + 1  # 0, then 1 .. 2
    assert corners.shape[0] == round(1.0 / BOUND_STEP)
    np.testing.assert_allclose(rules.options_at(0, 600.0)[0], price[0])
    for i in range(corners.shape[0]):
        lo, hi = 1.0 + i * BOUND_STEP, 1.0 + (i + 1) * BOUND_STEP
        assert corners[i, 1] == pytest.approx(rules.caps_for(0, 0.0, 2.0 - lo, lo)[1])
        assert corners[i, 2] == pytest.approx(rules.caps_for(0, 0.0, 2.0 - hi, hi)[2])
    # any split the engine allows (one whole device or more, slices above it) fits a corner:
    # a policy holding 1.8 of the 2 devices for the strong model passed the whole-device bound
    for m in np.linspace(1.0, 2.0, 37).tolist():
        caps = rules.caps_for(0, 0.0, 2.0 - m, m)  # (the CPU column is not compared)
        assert any(np.all(c[1:3] >= caps[1:3] - 1e-9) for c in corners), m


def test_the_oracle_policy_attains_the_feasible_bound_within_the_slo(tmp_path: Path) -> None:
    s = short("quickstart")
    run = run_simulation(
        s, ["static", "headroom", "oracle"], tmp_path, curves=curves_of(s), plots=False
    )
    m = run.metrics["policies"]
    feasible = m["oracle"]["value"]["feasible_bound"]
    assert feasible > 0
    oracle = m["oracle"]
    assert oracle["value"]["incremental"] >= 0.95 * feasible
    assert oracle["value"]["capture_feasible"] == pytest.approx(
        oracle["value"]["incremental"] / feasible
    )
    assert oracle["slo"]["violation_fraction"] <= m["static"]["slo"]["violation_fraction"] + 0.001
    assert oracle["requests"]["errors"] <= m["static"]["requests"]["errors"]
    # headroom runs under the same rules: it cannot pass the feasible bound
    assert m["headroom"]["value"]["incremental"] <= feasible


def test_envoy_and_sre_throttle_run(tmp_path: Path) -> None:
    s = dataclasses.replace(short("quickstart"), duration_s=900.0)
    run = run_simulation(
        s, ["static", "envoy", "sre-throttle"], tmp_path, curves=curves_of(s), plots=False
    )
    m = run.metrics["policies"]
    for p in ("envoy", "sre-throttle"):
        assert m[p]["complete"] is True
        assert m[p]["value"]["feasible_bound"] == m["static"]["value"]["feasible_bound"]
        assert m[p]["requests"]["total"] == m["static"]["requests"]["total"]


# eight mixed replicas: one replica's quota of quickstart's levels (4–16 cores, 2 devices) is
# 0.5–2 cores and a quarter device, too little for 800 extra candidates within the optional
# budget (the engine trims them: headroom.defences.replicas)
EIGHT = SimConfig().with_overrides(mixed_replicas=8)


def test_the_mixed_replicas_quota_trims_the_bounds_rma_options(tmp_path: Path) -> None:
    s = dataclasses.replace(short("quickstart"), duration_s=700.0)
    curves = curves_of(s)
    oracle = Oracle(build_context(s, config=EIGHT, curves=curves))
    rules = oracle.rules
    units = rules.extras_units(0, 600.0)  # 8 cores, 2 devices: 1 core, 0.25 device each
    assert units == pytest.approx((1.0, 0.25))
    menu = oracle.menu_levels(units)
    # the engine's trimming of every grid level, without repeats
    assert menu == tuple(sorted(set(run_levels(oracle.ctx, oracle.levels, units)) - {0}))
    assert max(menu) < max(oracle.levels)
    assert oracle.menu_levels(None) == oracle.levels
    trimmed = oracle.feasible().total
    # the same bound offering the whole grid whatever the quota (the bound before the rule)
    loose = Oracle(build_context(s, config=EIGHT, curves=curves))
    loose.menu_levels = lambda units: loose.levels  # type: ignore[method-assign]
    untrimmed = loose.feasible().total
    assert trimmed < untrimmed
    # it still bounds what the policies reach under the rule
    run = run_simulation(
        s, ["static", "headroom", "oracle"], tmp_path, config=EIGHT, curves=curves, plots=False
    )
    m = run.metrics["policies"]
    assert m["oracle"]["value"]["feasible_bound"] == pytest.approx(trimmed)
    assert 0 < m["oracle"]["value"]["incremental"] <= trimmed
    assert m["headroom"]["value"]["incremental"] <= trimmed


def test_the_oracle_plans_its_live_path_over_the_requests_the_store_does_not_serve(
    oracle: Oracle,
) -> None:
    # a share h of a cell's treatment requests served from the store leaves the plan's classes
    # on the other 1 − h (the engine's rule): the plan fills the budgets on those, no more
    budgets = oracle.budgets(oracle.rules.options_at(0, 600.0)[0], 1000.0)  # binding
    key = oracle._key(budgets)
    n_seg = oracle.ctx.pop.n_segments
    hit_key = tuple([_HIT_GRID // 2] * n_seg)  # half of every segment's requests hit
    keep = 0.5
    blind = oracle._plan_of(key, oracle.levels)
    live = oracle._plan_of(key, oracle.levels, hit_key)
    cost = oracle.ctx.costs.base_accelerator_ms

    def acc_ms(plan: object) -> float:  # RMA's accelerator work per treatment request, run live
        lv = np.array(plan.levels, dtype=np.float64)  # type: ignore[attr-defined]
        x = plan.rma  # type: ignore[attr-defined]
        return float(keep * (oracle.share * (lv[:, None] * x).sum(axis=0)).sum() * cost)

    assert acc_ms(live) <= budgets[1] * (1 + 1e-6)
    assert acc_ms(live) > acc_ms(blind)
    assert np.all(live.rma.sum(axis=0) <= 1.0 + 1e-9)
