"""RMA PID: bounds, monotonicity, anti-windup, rate limits, budget cap, snapshot, bumpless."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from simple_pid import PID

from headroom.controllers.config import PidSettings
from headroom.controllers.levers import CostModel
from headroom.controllers.pid import PidController, RmaController, RmaLimit

COSTS = CostModel(0.1, 0.02, 0.005, 0.1, 400, ("gpu-a", "gpu-b"), ("gpu-b",), 120.0)
SETPOINT = 170.0
BASE, MAX = 400, 1200
BIG = 1e6  # a budget that never binds

p99s = st.one_of(
    st.none(),
    st.floats(min_value=0.0, max_value=1e12, allow_nan=False, allow_infinity=False),
)
rates = st.floats(min_value=0.0, max_value=1e7, allow_nan=False, allow_infinity=False)
budgets = st.floats(min_value=0.0, max_value=1e4, allow_nan=False, allow_infinity=False)
step_inputs = st.tuples(p99s, rates, budgets, budgets)


def rma(settings_: PidSettings | None = None) -> RmaController:
    return RmaController(settings_ or PidSettings(), SETPOINT, BASE, MAX, COSTS)


def drive(c: RmaController, history: list[tuple[float | None, float, float, float]]) -> None:
    for i, (p99, rps, cpu, acc) in enumerate(history):
        c.step(p99, 60.0 * i, 1.0, rps, cpu, acc)


def test_matches_simple_pid_while_no_limit_binds() -> None:
    s = PidSettings(
        kp=0.3, ki=0.2, kd=0.1, derivative_filter=0.0, max_step_up=1.0, max_step_down=1.0
    )
    ours = PidController(s, output=0.5)
    ref = PID(0.3, 0.2, 0.1, setpoint=1.0, sample_time=None, time_fn=lambda: 0.0)
    ref.set_auto_mode(False)
    ref.set_auto_mode(True, last_output=0.5)
    # small errors around the setpoint, below it, so neither the limits nor the guard act
    for y in [0.9, 0.95, 0.97, 0.92, 0.99, 0.96, 0.98]:
        mine = ours.update(1.0 - y, y, 0.0, 1.0, lo=-10.0, hi=10.0)
        theirs = ref(y, dt=1.0)
        assert mine == pytest.approx(theirs, abs=1e-12)


@settings(max_examples=300, deadline=None)
@given(history=st.lists(step_inputs, max_size=12), last=step_inputs)
def test_targets_stay_within_base_and_max_for_any_finite_input(history, last) -> None:
    c = rma()
    drive(c, history)
    p99, rps, cpu, acc = last
    r = c.step(p99, 1e6, 1.0, rps, cpu, acc)
    assert BASE <= r.candidates <= MAX
    assert 0.0 <= r.output <= 1.0


@settings(max_examples=300, deadline=None)
@given(
    history=st.lists(step_inputs, max_size=12),
    low=st.floats(min_value=0.0, max_value=1e6, allow_nan=False),
    extra=st.floats(min_value=0.0, max_value=1e6, allow_nan=False),
    rps=rates,
    cpu=budgets,
    acc=budgets,
)
def test_a_higher_p99_never_raises_the_target(history, low, extra, rps, cpu, acc) -> None:
    a, b = rma(), rma()
    drive(a, history)
    drive(b, history)
    ra = a.step(low, 1e6, 1.0, rps, cpu, acc)
    rb = b.step(low + extra, 1e6, 1.0, rps, cpu, acc)
    assert rb.candidates <= ra.candidates
    assert rb.output <= ra.output + 1e-12


@settings(max_examples=200, deadline=None)
@given(history=st.lists(step_inputs, max_size=12), over=st.floats(1.0001, 1e6))
def test_never_adds_work_while_over_the_setpoint(history, over) -> None:
    c = rma()
    drive(c, history)
    before = c.pid.state.output
    r = c.step(SETPOINT * over, 1e6, 1.0, 300.0, BIG, BIG)
    assert r.output <= before


@settings(max_examples=300, deadline=None)
@given(history=st.lists(step_inputs, max_size=12), last=step_inputs)
def test_the_rma_budget_is_never_exceeded(history, last) -> None:
    c = rma()
    drive(c, history)
    p99, rps, cpu, acc = last
    r = c.step(p99, 1e6, 1.0, rps, cpu, acc)
    extra = r.candidates - BASE
    if cpu == 0.0 or acc == 0.0:
        assert r.candidates == BASE
    assert extra * rps * COSTS.rma_per_candidate.cpu_s <= cpu * (1 + 1e-9)
    assert extra * rps * COSTS.rma_per_candidate.accelerator_s <= acc * (1 + 1e-9)


@settings(max_examples=200, deadline=None)
@given(history=st.lists(step_inputs, max_size=12), p99=p99s)
def test_moves_at_most_one_rate_limit_step_when_the_budget_allows(history, p99) -> None:
    s = PidSettings()
    c = rma(s)
    drive(c, history)
    before = c.pid.state.output
    r = c.step(p99, 1e6, 1.0, 300.0, BIG, BIG)
    assert before - s.max_step_down - 1e-12 <= r.output <= before + s.max_step_up + 1e-12


def test_zero_budget_on_either_resource_means_base() -> None:
    for cpu, acc in [(0.0, 5.0), (5.0, 0.0), (0.0, 0.0)]:
        c = rma()
        for i in range(20):
            r = c.step(50.0, 60.0 * i, 1.0, 300.0, cpu, acc)
        assert r.candidates == BASE
        assert r.limit is RmaLimit.NO_BUDGET


def test_a_budget_cut_applies_at_once_not_a_step_at_a_time() -> None:
    c = rma()
    for i in range(30):
        r = c.step(60.0, 60.0 * i, 1.0, 300.0, BIG, BIG)
    assert r.candidates == MAX
    # 1.5 cores at 300 rps and 0.1 ms per candidate pay for 50 extra candidates
    r = c.step(60.0, 60.0 * 30, 1.0, 300.0, 1.5, BIG)
    assert r.candidates == BASE + 50
    assert r.limit is RmaLimit.BUDGET


def test_leaves_saturation_at_max_on_the_first_step_over_the_setpoint() -> None:
    c = rma()
    for i in range(200):  # long saturation: latency far below the setpoint
        r = c.step(20.0, 60.0 * i, 1.0, 300.0, BIG, BIG)
    assert r.candidates == MAX
    r = c.step(SETPOINT * 1.2, 60.0 * 200, 1.0, 300.0, BIG, BIG)
    assert r.candidates < MAX  # no integral to unwind first
    for i in range(201, 204):
        r = c.step(SETPOINT * 1.2, 60.0 * i, 1.0, 300.0, BIG, BIG)
    assert r.candidates <= MAX - 3 * 0.1 * (MAX - BASE)


def test_ramps_up_from_base_after_long_saturation_at_zero_budget() -> None:
    s = PidSettings()
    c = rma(s)
    for i in range(200):
        c.step(20.0, 60.0 * i, 1.0, 300.0, 0.0, 0.0)
    r = c.step(20.0, 60.0 * 200, 1.0, 300.0, BIG, BIG)
    assert r.candidates == BASE + math.floor(s.max_step_up * (MAX - BASE))
    assert r.limit is RmaLimit.RATE_LIMIT


def test_holds_when_a_window_has_no_latency_samples() -> None:
    c = rma()
    for i in range(5):
        r = c.step(100.0, 60.0 * i, 1.0, 300.0, BIG, BIG)
    held = c.step(None, 300.0, 1.0, 300.0, BIG, BIG)
    assert held.candidates == r.candidates
    assert held.limit is RmaLimit.HOLD


def test_derivative_is_filtered_and_taken_on_the_measurement() -> None:
    unfiltered = PidController(PidSettings(kp=0.0, ki=0.0, kd=1.0, derivative_filter=0.0), 0.5)
    filtered = PidController(PidSettings(kp=0.0, ki=0.0, kd=1.0, derivative_filter=0.5), 0.5)
    for pid in (unfiltered, filtered):
        pid.update(0.0, 1.0, 0.0, 1.0, lo=-10, hi=10)
        pid.update(0.0, 0.9, 1.0, 1.0, lo=-10, hi=10)  # measurement falls by 0.1
    assert unfiltered.components[2] == pytest.approx(0.1)
    assert filtered.components[2] == pytest.approx(0.05)


@settings(max_examples=200, deadline=None)
@given(
    history=st.lists(step_inputs, max_size=15), future=st.lists(step_inputs, min_size=1, max_size=5)
)
def test_snapshot_then_restore_gives_identical_next_outputs(history, future) -> None:
    a = rma()
    drive(a, history)
    b = rma()
    b.restore(a.snapshot())
    for i, (p99, rps, cpu, acc) in enumerate(future):
        ra = a.step(p99, 1e6 + i, 1.0, rps, cpu, acc)
        rb = b.step(p99, 1e6 + i, 1.0, rps, cpu, acc)
        assert ra == rb


def test_track_hands_over_without_a_bump() -> None:
    s = PidSettings()
    c = rma(s)
    c.track(900)
    r = c.step(100.0, 0.0, 1.0, 300.0, BIG, BIG)
    assert abs(r.candidates - 900) <= s.max_step_up * (MAX - BASE) + 1
