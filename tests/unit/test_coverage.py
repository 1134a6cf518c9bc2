"""SBM coverage: budget formula, latency correction, calibration loop, bounds, snapshot."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from headroom.controllers.config import CoverageSettings
from headroom.controllers.coverage import CoverageController, CoverageLimit, strong_admissible
from headroom.controllers.levers import CostModel

COSTS = CostModel(0.1, 0.02, 0.005, 0.1, 400, ("gpu-a", "gpu-b"), ("gpu-b",), 120.0)
SETPOINT = 170.0
ACC_PER_REQUEST = 0.04  # 400 candidates × 0.1 ms
CPU_PER_REQUEST = 0.002  # 400 candidates × 0.005 ms

finite = st.floats(min_value=0.0, max_value=1e9, allow_nan=False, allow_infinity=False)
maybe = st.one_of(st.none(), finite)
step_inputs = st.tuples(maybe, st.one_of(st.none(), st.floats(0.0, 1.0)), finite, finite, finite)


def controller(**kw: float) -> CoverageController:
    return CoverageController(CoverageSettings(**kw), SETPOINT, COSTS)


def run(c: CoverageController, history) -> None:
    for p99, observed, rps, cpu, acc in history:
        r = c.step(p99, observed, rps, cpu, acc, 1.0)
        c.settle(r.command, r.command, r.intended)


def test_coverage_is_the_servable_accelerator_budget_over_eligible_strong_work() -> None:
    c = controller()
    r = c.step(100.0, None, 300.0, 100.0, 2.0, 1.0)
    busy = c.admissible(2.0)
    # two devices of 40 ms strong requests run ~67 % busy within a 34 ms mean wait (0.2 × 170)
    assert 0.6 < busy < 0.72
    assert r.intended == pytest.approx(2.0 * busy / (300.0 * ACC_PER_REQUEST))
    assert r.limit is CoverageLimit.BUDGET
    # CPU can bind too: 0.1 cores pay for 50 requests/s
    r = controller().step(100.0, None, 300.0, 0.1, 100.0, 1.0)
    assert r.intended == pytest.approx(0.1 / (300.0 * CPU_PER_REQUEST))


def test_more_devices_run_busier_and_the_wait_budget_bounds_them() -> None:
    c = controller()
    busy = [c.admissible(u) for u in (1.0, 2.0, 4.0, 16.0)]
    assert busy == sorted(busy)
    assert busy[0] < 0.5
    assert busy[-1] > 0.85
    loose = controller(wait_budget_share=0.5)
    assert all(loose.admissible(u) > b for u, b in zip((1.0, 2.0, 4.0, 16.0), busy, strict=True))


def test_no_traffic_or_no_budget_means_no_coverage() -> None:
    assert controller().step(100.0, None, 0.0, 1.0, 1.0, 1.0).command == 0.0
    r = controller().step(100.0, None, 300.0, 1.0, 0.0, 1.0)
    assert r.command == 0.0
    assert r.limit is CoverageLimit.NO_BUDGET


@settings(max_examples=300, deadline=None)
@given(history=st.lists(step_inputs, max_size=10), last=step_inputs, cmax=st.floats(0.0, 1.0))
def test_outputs_stay_in_bounds_and_within_budget_for_any_finite_input(history, last, cmax) -> None:
    c = controller(max_coverage=cmax)
    run(c, history)
    p99, observed, rps, cpu, acc = last
    r = c.step(p99, observed, rps, cpu, acc, 1.0)
    assert 0.0 <= r.intended <= cmax
    assert 0.0 <= r.command <= cmax
    assert r.intended * rps * ACC_PER_REQUEST <= acc * (1 + 1e-9) + 1e-12
    assert r.intended * rps * CPU_PER_REQUEST <= cpu * (1 + 1e-9) + 1e-12
    reported = c.settle(r.command, r.command * 0.5, r.intended)
    assert 0.0 <= reported <= r.intended


def test_slow_strong_replicas_scale_coverage_down_and_fast_ones_never_up() -> None:
    c = controller()
    full = c.step(100.0, None, 300.0, 10.0, 2.0, 1.0).intended
    slow = [c.step(SETPOINT * 1.5, None, 300.0, 10.0, 2.0, 1.0) for _ in range(3)]
    assert slow[0].intended < full
    assert slow[-1].intended < slow[0].intended
    assert slow[-1].limit is CoverageLimit.LATENCY
    fast = [c.step(10.0, None, 300.0, 10.0, 2.0, 1.0) for _ in range(20)]
    assert fast[-1].intended == pytest.approx(full)  # back to the budget, never beyond


def test_calibration_closes_a_persistent_gap_between_intended_and_observed() -> None:
    # sixteen devices may run ~95 % busy, the plane plans them at most 80 % busy: the router's
    # probabilities deliver 0.9 of what they aim at (the next window's mix differs), and the
    # calibration closes that gap inside what the servers admit
    c = CoverageController(CoverageSettings(), SETPOINT, COSTS, ceiling=0.8)
    observed = None
    for _ in range(40):
        r = c.step(100.0, observed, 600.0, 100.0, 16.0, 1.0)
        reported = c.settle(r.command, r.command, r.intended)
        observed = 0.9 * r.command
    want = 16.0 * 0.8 / (600.0 * ACC_PER_REQUEST)
    assert c.admissible(16.0) == 0.8 < strong_admissible(CoverageSettings(), SETPOINT, COSTS, 16.0)
    assert r.intended == pytest.approx(want)
    assert reported == pytest.approx(want, rel=1e-3)
    assert observed == pytest.approx(r.intended, rel=1e-3)  # the gap is closed
    assert r.command == pytest.approx(want / 0.9, rel=1e-3)
    assert r.command < c.admitted_coverage(600.0, 100.0, 16.0)


@pytest.mark.parametrize("ceiling", [1.0, 0.9, 0.8])
def test_the_command_never_routes_more_than_the_strong_servers_admit(ceiling: float) -> None:
    # clients shed half the strong requests (their servers are overloaded): routing more to
    # make up for it would only buy downgrades and more overload, so the command stops at what
    # the servers admit on the budget's devices, and the calibration does not wind up beyond
    c = CoverageController(CoverageSettings(), SETPOINT, COSTS, ceiling=ceiling)
    server = c.admitted_coverage(600.0, 100.0, 16.0)
    observed = None
    commands = []
    for _ in range(40):
        r = c.step(100.0, observed, 600.0, 100.0, 16.0, 1.0)
        c.settle(r.command, r.command, r.intended)
        observed = 0.5 * r.command
        commands.append(r.command)
    assert r.intended == pytest.approx(c.budget_coverage(600.0, 100.0, 16.0))
    assert max(commands) <= server * (1 + 1e-12)
    assert commands[-1] == pytest.approx(server)
    assert c.calibration <= server - r.intended + 1e-9  # wound up no further than the cap
    # the cap is the servers' level: the whole admissible utilisation of the devices
    busy = strong_admissible(CoverageSettings(), SETPOINT, COSTS, 16.0)
    assert server == pytest.approx(16.0 * busy / (600.0 * ACC_PER_REQUEST))
    # and once the clients stop shedding the command comes back to the intended coverage
    for _ in range(40):
        r = c.step(100.0, observed, 600.0, 100.0, 16.0, 1.0)
        c.settle(r.command, r.command, r.intended)
        observed = r.command
    assert r.command == pytest.approx(r.intended, rel=1e-3)


def test_calibration_does_not_wind_up_when_the_router_cannot_deliver() -> None:
    c = controller()
    for _ in range(50):
        r = c.step(100.0, 0.0, 300.0, 10.0, 1.2, 1.0)  # nobody is ever observed on SBM
        c.settle(r.command, min(r.command, 0.05), r.intended)  # the router gives at most 0.05
    assert c.calibration < 0.2  # bounded, not 50 steps of integrated error


@settings(max_examples=200, deadline=None)
@given(
    history=st.lists(step_inputs, max_size=10), future=st.lists(step_inputs, min_size=1, max_size=4)
)
def test_snapshot_then_restore_gives_identical_next_outputs(history, future) -> None:
    a = controller()
    run(a, history)
    b = controller()
    b.restore(a.snapshot())
    for p99, observed, rps, cpu, acc in future:
        assert a.step(p99, observed, rps, cpu, acc, 1.0) == b.step(
            p99, observed, rps, cpu, acc, 1.0
        )


def test_the_strong_latency_loop_targets_the_slo_when_given_it() -> None:
    # setpoint 170, SLO 200: a strong p99 of 185 is over the setpoint but within the SLO
    at_setpoint = controller()
    at_slo = CoverageController(CoverageSettings(), SETPOINT, COSTS, slo_ms=200.0)
    assert at_slo.target_ms == pytest.approx(200.0)
    for _ in range(5):
        a = at_setpoint.step(185.0, None, 300.0, 10.0, 2.0, 1.0)
        b = at_slo.step(185.0, None, 300.0, 10.0, 2.0, 1.0)
    assert a.intended < b.intended
    assert b.limit is CoverageLimit.BUDGET
