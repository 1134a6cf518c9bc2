"""The simulator's pure parts: traces, the request population, the latency model, the oracle's LP.

Each test pins down one property the engine relies on, against a closed form or an independent
computation (Monte Carlo, an exact LP), with fixed seeds.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from scipy.optimize import linprog

from headroom.kernel.scenario import (
    Opportunistic,
    Scenario,
    ScenarioEvent,
    Traffic,
)
from headroom.kernel.scenario_load import load_scenario_text
from headroom.kernel.traces import PoolKey, ScenarioTraces
from headroom.sim.latency import (
    LatencyConfig,
    Strata,
    baseline_wait_params,
    in_time_probability,
    low_priority_factor,
    optional_outcome,
    sample_window,
    serial_waits,
    sketch_from_keys,
    wait_params,
    wait_params_array,
)
from headroom.sim.population import EXACT_BELOW, Population, arm_signal_sums, arm_sums

SCENARIO = """
name: parts
seed: 3
duration_s: 600
slo: {p99_ms: 200, window_s: 10}
world: {ads: 2000, dim: 16, base_candidates: 400, max_candidates: 1200, holdout: 0.02}
models:
  base:   {cpu_ms_per_candidate: 0.1,   accelerator_ms_per_candidate: 0.02,
           hardware: [gpu-a, gpu-b]}
  strong: {cpu_ms_per_candidate: 0.005, accelerator_ms_per_candidate: 0.1,
           hardware: [gpu-b], load_s: 120}
segments:
  - {name: premium, share: 0.25, value: {mean: 3.0, sigma: 0.8}, base_error: 0.15,
     strong_error: 0.1}
  - {name: casual,  share: 0.75, value: {mean: 0.6, sigma: 0.6}, base_error: 0.5,
     strong_error: 0.2}
regions:
  - name: r1
    dedicated: {cpu: 24, accelerator: 4, hardware: gpu-a}
    traffic: {rps: 200, daily_amplitude: 0.5, peak_s: 300, period_s: 1200, noise: 0.0}
    opportunistic:
      - {resource: cpu,         hardware: any,   trace: [[0, 8], [100, 4]]}
      - {resource: accelerator, hardware: gpu-b, trace: [[0, 2]]}
events:
  - {at_s: 100, kind: preempt, region: r1, resource: cpu, hardware: any, units: 0}
  - {at_s: 200, kind: grant,   region: r1, resource: cpu, hardware: any, units: 6}
  - {at_s: 300, kind: surge,   region: r1, factor: 2.0, duration_s: 60}
  - {at_s: 400, kind: control_outage, duration_s: 50}
"""


def scenario() -> Scenario:
    return load_scenario_text(SCENARIO)


# --- traces --------------------------------------------------------------------------------------


def test_synthetic_rate_follows_the_daily_formula_and_surges_multiply_it() -> None:
    tr = ScenarioTraces(scenario(), np.random.default_rng(0))
    rate = tr.regions[0].rate
    mid = tr.step_edges[:-1] + 0.5
    expected = 200.0 * (1 + 0.5 * np.cos(2 * np.pi * (mid - 300.0) / 1200.0))
    expected = np.where((mid >= 300) & (mid < 360), 2.0 * expected, expected)
    np.testing.assert_allclose(rate, expected, rtol=1e-12)


def test_arrivals_are_poisson_around_the_rate_and_fixed_by_the_seed() -> None:
    a = ScenarioTraces(scenario(), np.random.default_rng(5)).regions[0]
    b = ScenarioTraces(scenario(), np.random.default_rng(5)).regions[0]
    c = ScenarioTraces(scenario(), np.random.default_rng(6)).regions[0]
    np.testing.assert_array_equal(a.arrivals, b.arrivals)
    assert not np.array_equal(a.arrivals, c.arrivals)
    z = (a.arrivals.sum() - a.rate.sum()) / math.sqrt(a.rate.sum())
    assert abs(z) < 4


def test_csv_traffic_is_linear_between_rows_and_flat_outside() -> None:
    s = scenario()
    region = dataclasses.replace(
        s.regions[0], traffic=Traffic(trace=((100.0, 10.0), (300.0, 50.0)), csv="x.csv")
    )
    s = dataclasses.replace(s, regions=(region,), events=())
    rate = ScenarioTraces(s, np.random.default_rng(0)).regions[0].rate
    assert rate[0] == pytest.approx(10.0)
    assert rate[200] == pytest.approx(10.0 + 40.0 * (200.5 - 100.0) / 200.0)
    assert rate[500] == pytest.approx(50.0)


def test_events_set_levels_on_top_of_traces_in_time_order() -> None:
    tr = ScenarioTraces(scenario(), np.random.default_rng(0)).regions[0]
    cpu = tr.pools[tr.pool_index(PoolKey("cpu", "any"))]
    # trace step to 4 and the preempt to 0 at the same instant: the event wins
    assert [cpu.level_at(t) for t in (0, 99.9, 100, 199, 200, 599)] == [8, 8, 0, 0, 6, 6]
    assert cpu.min_over(50, 250) == 0.0
    reclaims = [c for c in tr.changes if c.is_reclaim]
    assert [(c.t, c.before, c.after) for c in reclaims] == [(100.0, 8.0, 0.0)]
    assert tr.in_outage(400)
    assert tr.in_outage(449.9)
    assert not tr.in_outage(450)


def test_offered_unit_seconds_integrate_the_levels() -> None:
    tr = ScenarioTraces(scenario(), np.random.default_rng(0))
    off = tr.offered_unit_s(0, 90, 210)
    assert off["cpu"] == pytest.approx(8 * 10 + 0 * 100 + 6 * 10)
    assert off["accelerator"] == pytest.approx(2 * 120)


def test_a_pool_that_only_events_name_starts_at_zero() -> None:
    s = scenario()
    region = dataclasses.replace(
        s.regions[0],
        opportunistic=(Opportunistic("cpu", "any", ((0.0, 8.0),)),),
    )
    ev = ScenarioEvent(at_s=50, kind="grant", region="r1", resource="accelerator", hardware="x")
    s = dataclasses.replace(s, regions=(region,), events=(dataclasses.replace(ev, units=3.0),))
    tr = ScenarioTraces(s, np.random.default_rng(0)).regions[0]
    acc = tr.pools[tr.pool_index(PoolKey("accelerator", "x"))]
    assert acc.level_at(49) == 0.0
    assert acc.level_at(50) == 3.0


# --- population ----------------------------------------------------------------------------------


def test_value_bins_reproduce_the_lognormal_moments() -> None:
    pop = Population.from_scenario(scenario(), bins=8)
    for s, seg in enumerate(scenario().segments):
        cells = pop.seg == s
        mean = pop.v_moments[0, cells].mean()
        second = pop.v_moments[1, cells].mean()
        assert mean == pytest.approx(seg.value.mean, rel=1e-9)
        assert second == pytest.approx(seg.value.mean**2 * math.exp(seg.value.sigma**2), rel=1e-9)
        assert np.all(np.diff(pop.v_mean[cells]) > 0)


def test_keep_top_keeps_exactly_the_requested_share_highest_values_first() -> None:
    pop = Population.from_scenario(scenario(), bins=8)
    for share in (0.05, 0.3, 0.77):
        keep = pop.keep_top(share)
        assert float(keep @ pop.share) == pytest.approx(share, abs=1e-6)
        # a kept cell never has a lower value bound than a dropped one's upper bound
        kept_lo = pop.v_lo[keep > 0].min()
        dropped_hi = pop.v_hi[keep < 1].max()
        assert kept_lo <= dropped_hi  # partial cells straddle the threshold
        assert pop.v_hi[keep == 0].max(initial=0) <= pop.v_lo[keep == 1].min(initial=np.inf)


@pytest.mark.parametrize("n", [EXACT_BELOW // 2, 5000])
def test_arm_sums_have_the_mixture_mean_and_variance(n: int) -> None:
    pop = Population.from_scenario(scenario(), bins=8)
    rng = np.random.default_rng(11)
    q = np.full(pop.n_cells, 0.8)
    sd = np.full(pop.n_cells, 0.1)
    pit = np.full(pop.n_cells, 0.9)
    cells = np.arange(pop.n_cells)
    n_arr = np.array([n, 0])
    means, variances = [], []
    for _ in range(300):
        s1, s2 = arm_sums(rng, pop, n_arr, pop.share, np.zeros_like(cells), cells, q, sd, pit)
        means.append(s1[0] / n)
        variances.append((s2[0] - s1[0] ** 2 / n) / (n - 1))
        assert s1[1] == 0
        assert s2[1] == 0
    ev = float(pop.v_moments[0] @ pop.share)
    ev2 = float(pop.v_moments[1] @ pop.share)
    ey = 0.9 * 0.8 * ev
    ey2 = 0.9 * (0.8**2 + 0.1**2) * ev2
    var_y = ey2 - ey**2
    assert np.mean(means) == pytest.approx(ey, rel=4 * math.sqrt(var_y / n / 300) / ey + 0.01)
    assert np.mean(variances) == pytest.approx(var_y, rel=0.15)


@pytest.mark.parametrize("n", [EXACT_BELOW // 2, 5000])
def test_arm_signal_sums_have_the_mixture_means_and_covariance(n: int) -> None:
    """The value signal's sums (Σx, Σx², Σxy) and the late requests' (count, Σx, Σx²) beside
    the value's: exact draws and the normal limit alike have the mixture's means, and Σy, Σx
    co-vary as y = V·U·I and x = V do."""
    pop = Population.from_scenario(scenario(), bins=8)
    rng = np.random.default_rng(12)
    q = np.full(pop.n_cells, 0.8)
    sd = np.full(pop.n_cells, 0.1)
    pit = np.full(pop.n_cells, 0.9)
    cells = np.arange(pop.n_cells)
    n_arr = np.array([n, 0])
    draws = np.array(
        [
            arm_signal_sums(rng, pop, n_arr, pop.share, np.zeros_like(cells), cells, q, sd, pit)[
                :, 0
            ]
            for _ in range(400)
        ]
    )  # (400, 8): Σy, Σy², Σx, Σx², Σxy, late requests, Σx and Σx² of the late ones
    ev = float(pop.v_moments[0] @ pop.share)
    ev2 = float(pop.v_moments[1] @ pop.share)
    expect = np.array(
        [
            0.9 * 0.8 * ev,
            0.9 * (0.8**2 + 0.1**2) * ev2,
            ev,
            ev2,
            0.9 * 0.8 * ev2,
            0.1,
            0.1 * ev,
            0.1 * ev2,
        ]
    )
    got = draws.mean(axis=0) / n
    sd_mean = draws.std(axis=0) / n / math.sqrt(len(draws))
    assert np.all(np.abs(got - expect) < 4 * sd_mean + 1e-9), (got, expect)
    # covariance of the two first sums: n · Cov(y, x) = n · (E[xy] − E[y]E[x])
    cov = float(np.cov(draws[:, 0], draws[:, 2])[0, 1]) / n
    assert cov == pytest.approx(expect[4] - expect[0] * expect[2], rel=0.2)


# --- latency -------------------------------------------------------------------------------------


def _strata(**kw: float) -> Strata:
    base = {
        "count": 100.0,
        "service_ms": 30.0,
        "penalty_ms": 0.0,
        "fc0": 0.0,
        "fc1": 0.0,
        "fa0": 0.0,
        "fa1": 0.0,
        "p1": 0.6,
        "r1": 0.05,
        "p2": 0.4,
        "r2": 0.02,
        "path": 0,
    }
    base.update(kw)
    return Strata(
        **{k: np.array([v], dtype=np.int64 if k == "path" else np.float64) for k, v in base.items()}
    )


@pytest.mark.parametrize(
    "kw",
    [{}, {"fc0": 0.05, "fc1": 0.25}, {"p1": 0.95, "r1": 0.01, "r2": 0.01}, {"service_ms": 200.0}],
)
def test_in_time_share_matches_the_sampled_latencies(kw: dict[str, float]) -> None:
    cfg = LatencyConfig()
    st = _strata(**kw)
    p = float(in_time_probability(st, cfg, 400.0)[0])
    rng = np.random.default_rng(1)
    lat, _w, _ = sample_window(st, cfg, 1e9, rng.random((4, 200_000)))
    mc = float((lat <= 400.0).mean())
    assert p == pytest.approx(mc, abs=0.01)


def _droppable(**kw: float) -> Strata:
    """One RMA stratum whose extras (20 ms of its 30 ms service) wait at low priority, with an
    optional budget of 100 ms."""
    opt = {"po": 0.8, "ro": 0.02, "fo0": 0.0, "fo1": 0.0, "opt_ms": 20.0, "budget_ms": 100.0}
    opt.update({k: v for k, v in kw.items() if k in opt})
    st = _strata(path=1, **{k: v for k, v in kw.items() if k not in opt})
    return replace(st, **{k: np.array([v]) for k, v in opt.items()})


@pytest.mark.parametrize(
    "kw",
    [
        {},
        {"fo0": 0.05, "fo1": 0.09},  # a backlog near the budget: some extras start, some not
        {"fo0": 0.2, "fo1": 0.3},  # beyond it: every extra is dropped
        {"po": 0.99, "ro": 0.005, "service_ms": 120.0},
    ],
)
def test_the_optional_budget_closed_form_matches_the_sampled_latencies(
    kw: dict[str, float],
) -> None:
    cfg = LatencyConfig()
    st = _droppable(**kw)
    pi, keep = optional_outcome(st, cfg, 250.0)
    u = np.random.default_rng(2).random((4, 200_000))
    lat, _w, _ = sample_window(st, cfg, 1e9, u)
    assert float(pi[0]) == pytest.approx(float((lat <= 250.0).mean()), abs=0.015)
    # the share that started its extras: the sampled optional wait within the budget
    po, ro, fo0, fo1, _opt, _budget = st.optional()
    fo = 1000.0 * (fo0[0] + (fo1[0] - fo0[0]) * u[0])
    u_o = np.mod(u[1] + u[2], 1.0)
    tail = np.clip((1.0 - u_o) / po[0], 1e-300, 1.0)
    w = fo + np.where(u_o > 1.0 - po[0], -np.log(tail) / ro[0], 0.0)
    started = float((w <= 100.0).mean())
    assert float(keep[0]) * float(pi[0]) <= started + 0.02
    if started < 1e-9:
        assert float(keep[0]) == 0.0


def test_a_dropped_extra_bounds_its_requests_wait_by_the_budget() -> None:
    cfg = LatencyConfig()
    # an optional backlog far past the budget: without the rule these requests would wait 5 s
    st = _droppable(fo0=5.0, fo1=5.0, service_ms=30.0)
    lat, _w, _ = sample_window(st, cfg, 1e9, np.random.default_rng(3).random((4, 20_000)))
    plain = _strata(service_ms=10.0)
    base, _w, _ = sample_window(plain, cfg, 1e9, np.random.default_rng(3).random((4, 20_000)))
    assert np.allclose(lat, base + 100.0, rtol=1e-6)  # the budget waited, no optional service
    pi, keep = optional_outcome(st, cfg, 250.0)
    assert float(keep[0]) == 0.0
    assert float(pi[0]) == pytest.approx(float(in_time_probability(plain, cfg, 150.0)[0]))


def test_strata_without_optional_parts_are_unchanged_by_the_budget_rule() -> None:
    cfg = LatencyConfig()
    st = _strata()
    pi, keep = optional_outcome(st, cfg, 250.0)
    assert float(pi[0]) == float(in_time_probability(st, cfg, 250.0)[0])
    assert float(keep[0]) == 1.0
    filled = st.with_optional()
    u = np.random.default_rng(4).random((4, 1000))
    a, _, _ = sample_window(st, cfg, 1e9, u)
    b, _, _ = sample_window(filled, cfg, 1e9, u)
    assert np.array_equal(a, b)


@pytest.mark.parametrize("droppable", [False, True])
def test_sampling_by_index_equals_sampling_the_taken_strata(droppable: bool) -> None:
    """``sample_window(st, index=i)`` is ``sample_window(st.take_index(i), allocated=True)``
    number for number (the window sampler skips copying every field first)."""
    rng = np.random.default_rng(5)
    n = 7
    fields = {
        "count": rng.integers(0, 50, n).astype(np.float64),
        "service_ms": rng.uniform(5.0, 40.0, n),
        "penalty_ms": rng.uniform(0.0, 5.0, n),
        "fc0": rng.uniform(0.0, 0.1, n),
        "fc1": rng.uniform(0.0, 0.1, n),
        "fa0": rng.uniform(0.0, 0.1, n),
        "fa1": rng.uniform(0.0, 0.1, n),
        "p1": rng.uniform(0.0, 1.0, n),
        "r1": rng.uniform(0.01, 0.5, n),
        "p2": rng.uniform(0.0, 1.0, n),
        "r2": rng.uniform(0.01, 0.5, n),
        "path": rng.integers(0, 3, n),
    }
    if droppable:
        fields |= {
            "po": rng.uniform(0.0, 1.0, n),
            "ro": rng.uniform(0.01, 0.5, n),
            "fo0": rng.uniform(0.0, 0.2, n),
            "fo1": rng.uniform(0.0, 0.2, n),
            "opt_ms": rng.uniform(0.0, 5.0, n),
            "budget_ms": np.where(rng.random(n) < 0.5, 100.0, np.inf),
        }
    st = Strata(**fields)
    idx = np.repeat(np.flatnonzero(st.count > 0), 3)
    u = rng.random((4, 64))
    want = sample_window(st.take_index(idx), LatencyConfig(), 300.0, u, allocated=True)
    got = sample_window(st, LatencyConfig(), 300.0, u, index=idx)
    for a, b in zip(got, want, strict=True):
        np.testing.assert_array_equal(a, b)


def test_wait_grows_with_utilisation_and_shrinks_with_servers() -> None:
    waits = [wait_params(r, 4.0, 10.0, 0.1).mean_ms for r in (0.3, 0.6, 0.9, 0.99)]
    assert waits == sorted(waits)
    assert waits[-1] > 20 * waits[0]
    assert wait_params(0.9, 16.0, 10.0, 0.1).mean_ms < wait_params(0.9, 2.0, 10.0, 0.1).mean_ms


def test_a_baseline_part_never_waits_longer_than_under_static() -> None:
    # baseline first: whatever optional work does with its quota, the baseline parts find the
    # dedicated servers (static's) and the quota servers it leaves idle
    rng = np.random.default_rng(5)
    rho = rng.uniform(0.0, 0.99, 400)
    ded = 2.5
    quota = rng.uniform(0.0, 4.0, 400)
    rho_opt = rng.uniform(0.0, 1.5, 400)  # optional work may be offered beyond its quota
    p, r = baseline_wait_params(rho, ded, ded + quota, rho_opt, 10.0, 0.2)
    ps, rs = wait_params_array(rho, np.full(400, ded), 10.0, 0.2)
    mean, mean_static = p / r, ps / rs
    assert (mean <= mean_static * (1 + 1e-12)).all()
    assert (p <= ps + 1e-12).all()
    # a quota busy with optional work all the time leaves the baseline exactly static's queue
    busy = baseline_wait_params(rho, ded, ded + quota, np.ones(400), 10.0, 0.2)
    assert np.allclose(busy[0], ps)
    assert np.allclose(busy[1], rs)
    # an idle quota shortens the wait
    idle = baseline_wait_params(np.array([0.8]), ded, np.array([ded + 4.0]), np.zeros(1), 10.0, 0)
    static = wait_params(0.8, ded, 10.0, 0.0)
    assert idle[0][0] / idle[1][0] < 0.5 * static.mean_ms


def test_optional_parts_wait_longer_at_low_priority_and_two_waits_fold_into_one() -> None:
    f = low_priority_factor(np.array([0.0, 0.5, 0.9, 2.0]), 3.0, np.array([4.0, 4.0, 3.0, 4.0]))
    assert f[0] == 1.0
    assert f[1] == pytest.approx(1.0 - 0.5 * 3.0 / 4.0)
    assert f[2] == pytest.approx(0.1)
    assert f[3] == pytest.approx(0.01)  # never 0: the fluid backlog carries an overload
    p1, r1, p2, r2 = (np.array([x]) for x in (0.3, 0.05, 0.6, 0.02))
    p, r = serial_waits(p1, r1, p2, r2)
    assert p[0] == pytest.approx(1 - 0.7 * 0.4)  # waits at all unless both are free
    assert p[0] / r[0] == pytest.approx(0.3 / 0.05 + 0.6 / 0.02)  # the mean adds up
    z = np.zeros(1)
    p, r = serial_waits(p1, r1, z, np.ones(1))
    assert (p[0], r[0]) == pytest.approx((0.3, 0.05))  # one wait alone is itself


def test_window_sketch_holds_one_count_per_request() -> None:
    rng = np.random.default_rng(2)
    keys = rng.integers(100, 140, size=500)
    weights = rng.random(500)
    sk = sketch_from_keys(keys, weights, 1234, 0.01)
    assert sum(sk["bins"].values()) == 1234  # type: ignore[attr-defined]


# --- oracle LP -----------------------------------------------------------------------------------


def test_dual_bound_is_valid_and_tight_on_random_budgets() -> None:
    from headroom.sim.context import SimContext
    from headroom.sim.oracle import Oracle
    from tests.simulation.test_sim_runs import curves_of

    s = scenario()
    ctx = SimContext(s, curves_of(s))
    o = Oracle(ctx)
    obj, a_ub = o._build_lp(pre=False)
    bounds = o._bounds(None)
    n_c = o.share.size
    rng = np.random.default_rng(4)
    for _ in range(12):
        b = rng.uniform(0, 120, 4) * rng.integers(0, 2, 4)
        exact = linprog(obj, A_ub=a_ub, b_ub=np.concatenate([np.ones(n_c), b]), bounds=bounds)
        key = o._key(b)
        sol = o._solve(key)
        dual = float(b @ sol.y + sol.h)
        assert dual >= -exact.fun - 1e-9  # a valid upper bound at the real budgets
        assert sol.value <= -exact.fun + 1e-9  # the plan at the rounded-down budgets fits
        assert dual <= -exact.fun * 1.02 + 1e-6  # and the bound is tight to the grid


def test_joint_dual_bound_with_precompute_is_valid_and_tight_on_random_budgets() -> None:
    """The joint LP (a stored-result option capped by the returning share): the dual at the
    real budgets and shares, with prices from the coarse grid, is never below the exact optimum
    and stays close to it."""
    from scipy.optimize import linprog

    from headroom.kernel.scenario_load import load_scenario
    from headroom.sim.context import SimContext
    from headroom.sim.oracle import _PRE_KEY_STEPS, _ZERO_KEY, RHO_GRID, Oracle
    from tests.simulation.test_sim_runs import curves_of

    root = Path(__file__).resolve().parents[2]
    s = load_scenario(root / "scenarios" / "precompute-remote.yaml")
    ctx = SimContext(s, curves_of(s))
    o = Oracle(ctx)
    assert o.pre_gain is not None
    obj, a_ub = o._build_lp(pre=True)
    n_c = o.share.size
    rng = np.random.default_rng(5)
    gaps = []
    for _ in range(12):
        b = rng.uniform(0, 120, 4) * rng.integers(0, 2, 4)
        rho = rng.uniform(0, 1, ctx.pop.n_segments)
        exact = linprog(
            obj, A_ub=a_ub, b_ub=np.concatenate([np.ones(n_c), b]), bounds=o._bounds(rho)
        )
        key = tuple(
            k if k == _ZERO_KEY else k // _PRE_KEY_STEPS * _PRE_KEY_STEPS for k in o._key(b)
        )
        sol = o._solve(key, tuple(int(k) for k in np.ceil(rho * RHO_GRID - 1e-9)))
        dual = float(b @ sol.y + o._h_pre(sol.y, rho[None, :])[0])
        assert dual >= -exact.fun - 1e-9  # a valid upper bound at the real budgets and shares
        gaps.append(dual / max(-exact.fun, 1e-12))
    assert max(gaps) < 1.25  # prices from the coarse grid: close, not exact
    assert float(np.median(gaps)) < 1.05


@pytest.mark.parametrize(
    ("ranked", "m_rma", "m_sbm"), [(True, 1.0, 1.0), (True, 0.5, 0.3), (False, 0.7, 1.0)]
)
def test_the_engine_asks_what_the_client_plan_says(
    ranked: bool, m_rma: float, m_sbm: float
) -> None:
    """The engine's clients are the one client plan (headroom.defences.plan, tested in
    tests/unit/test_plan.py) over the population's cells: the shares a region's mix asks for are
    the plan's, with the policy's ranking flags, and the holdout takes the base path."""
    from headroom.defences.plan import CellPlanner
    from headroom.sim.context import SimContext, Targets
    from headroom.sim.engine import RegionRun
    from headroom.sim.policies import StaticRegion
    from tests.simulation.test_sim_runs import curves_of

    class Clients(StaticRegion):
        value_ranked_rma = ranked
        value_ranked_sbm = ranked

        def multipliers(self, now: float) -> tuple[float, float]:
            return m_rma, m_sbm

    s = scenario()
    ctx = SimContext(s, curves_of(s))
    run = RegionRun(ctx, 0, Clients(), lambda *_: None, 60.0)
    rule = run.planner.rule
    assert (rule.value_ranked_rma, rule.value_ranked_sbm) == (ranked, ranked)
    assert (rule.holdout, rule.base, rule.max, rule.bins) == (0.02, 400, 1200, ctx.pop.bins)
    tg = Targets(
        epoch=1, issued_at=0.0, ttl_s=60.0, rma_candidates=800,
        sbm_segments={"premium": 0.7, "casual": 0.1}, sbm_coverage=0.2,
    )  # fmt: skip
    run.targets = tg
    mix = run._current_mix(0.0, 1.0)
    want = CellPlanner(rule, ctx.pop, eligible=ctx.eligible).plan(tg, m_rma, m_sbm)
    assert mix.plan.levels == (want.extra,)
    assert want.extra == (800 if ranked else 400)
    assert np.array_equal(mix.plan.rma[0], want.rma)
    # no strong replica is loaded yet: what the strong model takes fails over
    assert np.array_equal(mix.plan.sbm + mix.plan.down + mix.plan.fail, want.sbm)
    assert want.sbm.any()
    # the holdout's share of every cell takes the base path
    assert float(mix.frac[0]) >= ctx.holdout - 1e-12
    assert ctx.holdout == rule.holdout


def test_both_engines_write_the_window_line_with_one_builder() -> None:
    """The simulator's window lines and the streaming client's come from one builder
    (headroom.analysis.events.window_event): the requests' part has the same fields, and the
    analyzer reads both alike."""
    from headroom.analysis.metrics import MetricsAccumulator
    from headroom.sim.context import SimContext, Targets
    from headroom.sim.engine import RegionRun
    from headroom.sim.policies import StaticRegion
    from headroom.workers.client_windows import Outcome, WindowBook
    from tests.simulation.test_sim_runs import curves_of

    class Clients(StaticRegion):
        value_ranked_rma = True
        value_ranked_sbm = True

    s = scenario()
    ctx = SimContext(s, curves_of(s))
    lines: list[dict[str, object]] = []
    run = RegionRun(ctx, 0, Clients(), lambda kind, t, f: lines.append(f), 60.0)
    run.targets = Targets(
        epoch=1, issued_at=0.0, ttl_s=600.0, rma_candidates=800,
        sbm_segments={"premium": 0.5, "casual": 0.1}, sbm_coverage=0.2,
    )  # fmt: skip
    for w in range(6):  # one control interval: its windows are written together
        run.run_window(w)
    assert len(lines) == 6
    sim = lines[-1]
    book = WindowBook("r1", 10.0, ctx.segment_names)
    for i in range(4):
        book.add(
            Outcome(
                partition=0, offset=i, segment="casual", end_t=1.0, latency_ms=20.0, ok=True,
                timeout=False, control=i == 0, lever="rma" if i == 1 else None, sbm_served=False,
                routed=None if i == 0 else "rma", value_total=1.0 + i, value_baseline=1.0,
                stratum=0,
            )
        )  # fmt: skip
    w0 = book.take(0)
    assert w0 is not None
    client = book.event_fields(
        w0, targets={"rma_candidates": 800, "sbm_coverage": 0.2}, source="c1"
    )
    capacity = {"offered_unit_s", "used_unit_s", "demand_unit_s", "capacity", "quotas"}
    assert set(sim) - capacity == set(client) - {"offsets", "client"}
    for key in ("inc", "eligible_treated", "targets"):
        assert set(sim[key]) == set(client[key])  # type: ignore[arg-type]
    assert set(sim["segments"]["casual"]) == set(client["segments"]["casual"])  # type: ignore[index]
    acc = MetricsAccumulator()
    for source, line, policy in (("sim", sim, "a"), ("client", client, "b")):
        acc.add({"v": 1, "ts": 0.0, "kind": "run.started", "source": source, "policy": policy,
                 "region": None, "duration_s": 60.0, "t0": 0.0,
                 "slo": {"p99_ms": 200.0, "window_s": 10.0}, "segments": ["premium", "casual"],
                 "regions": ["r1"]})  # fmt: skip
        acc.add({"v": 1, "ts": 0.0, "kind": "window", "source": source, "policy": policy,
                 "region": "r1", **line})  # fmt: skip
    doc = acc.result()["policies"]
    assert doc["a"]["requests"]["total"] == sim["requests"]
    assert doc["b"]["requests"]["total"] == 4
    assert doc["b"]["value"]["incremental_rma"] == pytest.approx(client["inc"]["rma"])  # type: ignore[index]


def test_the_block_keeps_the_stages_only_while_the_mix_and_quotas_hold() -> None:
    """A region run keeps its stages' loads and units while the mix and the quotas in force are
    the same objects, and computes them again otherwise; the stages' utilisations are
    :func:`headroom.sim.engine._rho` of every step and stage, number for number (no units, no
    work and negative work included)."""
    from headroom.sim.context import Quotas, SimContext
    from headroom.sim.engine import RegionRun, _rho, _Stages
    from headroom.sim.policies import StaticRegion
    from tests.simulation.test_sim_runs import curves_of

    s = scenario()
    ctx = SimContext(s, curves_of(s))
    run = RegionRun(ctx, 0, StaticRegion(), lambda *_: None, 60.0)
    q = Quotas(2.0, 0.0, 1.5, 3.0)
    first = run._stages(run.base_mix, q)
    assert run._stages(run.base_mix, q) is first
    again = run._stages(run.base_mix, Quotas(2.0, 0.0, 1.5, 3.0))  # equal, another object
    assert again is not first
    np.testing.assert_array_equal(again.loads, first.loads)
    np.testing.assert_array_equal(again.units, first.units)
    other = run._stages(run.base_mix, Quotas(2.0, 1.0, 1.5, 3.0))
    assert other.units.tolist() != first.units.tolist()
    lam = np.random.default_rng(9).uniform(0.0, 500.0, 6)
    odd = _Stages(
        run.base_mix,
        q,
        (1.0, 0.0, 3.5, -1.0, 2.0, 0.5, 7.0),
        (4.0, 0.0, 0.0, 2.0, 1.0, 3.0, 0.5),
    )
    for stages in (first, other, odd):
        pairs = list(zip(stages.loads.tolist(), stages.units.tolist(), strict=True))
        want = [[_rho(x * ld, u) for ld, u in pairs] for x in lam.tolist()]
        np.testing.assert_array_equal(stages.rho(lam), np.array(want))


def test_an_rma_requests_extras_run_on_its_replicas_quota_within_its_budget() -> None:
    """The mixed replicas' rule (headroom.defences.replicas) in the simulator: an RMA class's
    extras run on the units one replica's quota leaves a request (its threads at most, one
    device), and what would not finish within the optional budget there is trimmed — less work,
    the quality of fewer extras; a class with nothing left is served the baseline. Without the
    rule (None) they run at the request's threads, untrimmed. A precompute hit loads no stage."""
    from headroom.sim.context import PATH_BASE, PATH_RMA, Plan, SimContext, build_mix, extras_units
    from headroom.sim.engine import RegionRun, _live_plan
    from headroom.sim.policies import StaticRegion
    from tests.simulation.test_sim_runs import curves_of

    s = scenario()  # 400 base candidates, 0.1 CPU ms and 0.02 device ms each; SLO 200 ms
    ctx = SimContext(s, curves_of(s))
    assert ctx.optional_budget_ms == 100.0
    c = ctx.pop.n_cells
    z = np.zeros(c)
    plan = Plan((100, 800), np.full((2, c), 0.1), z, z, z)
    base_ms = 400 * (0.1 / 4 + 0.02)
    free = build_mix(ctx, plan)
    assert free.run_levels == (100, 800)
    np.testing.assert_allclose(free.service_ms[1:3], [500 * 0.045, 1200 * 0.045])

    units = ctx.replicas.extras_units(1.5, 2.0, 4.0)
    assert units == (0.75, 1.0)
    capped = build_mix(ctx, plan, units)
    per = 0.1 / 0.75 + 0.02 / 1.0
    fit = math.floor((100.0 - base_ms) / per)
    assert capped.run_levels == (100, fit)
    assert fit < 800
    np.testing.assert_allclose(capped.service_ms[1:3], [base_ms + 100 * per, base_ms + fit * per])
    assert capped.service_ms[2] <= 100.0 + 1e-9  # the trimmed extras end within the budget
    assert capped.path[1:3].tolist() == [PATH_RMA, PATH_RMA]
    assert capped.opt_cpu < free.opt_cpu
    assert float(capped.value.sum()) < float(free.value.sum())

    starved = build_mix(ctx, plan, (0.0, 1.0))  # no CPU left of the quota
    assert starved.run_levels == (0, 0)
    assert starved.path[1:3].tolist() == [PATH_BASE, PATH_BASE]
    np.testing.assert_allclose(starved.service_ms[1:3], [base_ms, base_ms])
    assert starved.opt_cpu == 0.0

    # a hit makes no server call: half of every cell's treatment requests served from the store
    hit = np.full(c, 0.5)
    with_hits = build_mix(ctx, _live_plan(plan, hit), units)
    f_hit = ctx.treat * 0.5
    assert with_hits.base_cpu == pytest.approx((1.0 - f_hit) * 400 * 0.1)
    assert with_hits.base_acc == pytest.approx((1.0 - f_hit) * 400 * 0.02)
    assert capped.base_cpu == pytest.approx(400 * 0.1)

    # the region run keeps the units with the levels in force
    run = RegionRun(ctx, 0, StaticRegion(), lambda *_: None, 60.0)
    assert run.extras_units == (0.0, 0.0)  # nothing announced yet
    run.level = [8.0, 2.0]  # the scenario's pools: CPU (any), gpu-b devices
    # 4 cores and 1 device each: the threads bind
    assert extras_units(ctx, run.r, run.level) == (4.0, 1.0)
    run.level = [3.0, 1.0]
    assert extras_units(ctx, run.r, run.level) == (1.5, 0.5)
