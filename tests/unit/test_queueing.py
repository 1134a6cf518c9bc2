"""Admissible utilisation of an M/G/c stage, and the admission rule built on it
(defences/admission.py)."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from headroom.defences.admission import (
    admissible_utilization,
    admitted_level,
    admitted_share,
    mean_wait_ms,
)


def test_one_server_is_the_mm1_formula() -> None:
    # M/M/1: W = S·ρ/(1−ρ); Sakasegawa's exponent √(2·2) − 1 = 1 makes it exact
    assert mean_wait_ms(0.5, 1.0, 40.0) == pytest.approx(40.0)
    assert admissible_utilization(1.0, 40.0, 40.0) == pytest.approx(0.5, abs=1e-9)


def test_a_slice_of_a_device_is_one_slower_server() -> None:
    assert mean_wait_ms(0.5, 0.5, 40.0) == pytest.approx(mean_wait_ms(0.5, 1.0, 80.0))


@given(
    servers=st.floats(0.05, 500.0),
    service=st.floats(0.01, 1000.0),
    budget=st.floats(0.001, 1e4),
    cs2=st.floats(0.0, 4.0),
)
def test_the_admissible_utilisation_meets_its_budget(servers, service, budget, cs2) -> None:
    u = admissible_utilization(servers, service, budget, cs2)
    assert 0.0 <= u < 1.0
    assert mean_wait_ms(u, servers, service, cs2) <= budget * (1 + 1e-9)
    # and it is the highest such utilisation (to the bisection's resolution)
    if u < 1.0 - 1e-6:
        assert mean_wait_ms(min(u + 1e-6, 0.999999), servers, service, cs2) > budget * (1 - 1e-6)


@given(servers=st.floats(0.5, 100.0), budget=st.floats(0.1, 100.0))
def test_monotone_in_servers_and_budget(servers, budget) -> None:
    u = admissible_utilization(servers, 40.0, budget)
    assert admissible_utilization(servers * 2, 40.0, budget) >= u
    assert admissible_utilization(servers, 40.0, budget * 2) >= u


def test_degenerate_inputs_never_raise() -> None:
    assert admissible_utilization(0.0, 40.0, 10.0) == 1.0
    assert admissible_utilization(2.0, 0.0, 10.0) == 1.0
    assert admissible_utilization(2.0, 40.0, 0.0) == 0.0
    assert admissible_utilization(2.0, 40.0, math.nan) == 0.0
    assert admissible_utilization(2.0, 40.0, math.inf) == 1.0
    assert mean_wait_ms(1.0, 2.0, 40.0) == math.inf


@given(
    units=st.floats(0.0, 64.0),
    servers=st.floats(0.05, 500.0),
    service=st.floats(0.01, 1000.0),
    budget=st.floats(0.001, 1e4),
    ceiling=st.floats(0.0, 1.0),
)
def test_the_admitted_level_is_the_level_at_the_admissible_utilisation_under_a_ceiling(
    units: float, servers: float, service: float, budget: float, ceiling: float
) -> None:
    k = admitted_share(servers, service, budget, ceiling=ceiling)
    assert k == min(admissible_utilization(servers, service, budget), ceiling)
    assert 0.0 <= k <= ceiling
    assert admitted_level(units, servers, service, budget, ceiling=ceiling) == units * k
    # the queue of the stage at the admitted share meets the budget
    assert mean_wait_ms(k, servers, service) <= budget * (1 + 1e-9)


def test_a_small_stage_admits_less_of_its_level_than_a_large_one() -> None:
    # one strong device with 40 ms requests and a 42.5 ms budget: about half of it; sixteen: most
    one = admitted_share(1.0, 40.0, 42.5)
    sixteen = admitted_share(16.0, 40.0, 42.5)
    assert 0.4 < one < 0.6
    assert sixteen > 0.9
    assert admitted_level(2.0, 1.0, 40.0, 42.5) == pytest.approx(2.0 * one)
