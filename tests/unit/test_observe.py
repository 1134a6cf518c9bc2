"""RegionAggregator: merged sketches, newest capacity level wins, value sums add exactly."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from headroom.controllers.coverage import observed_coverage
from headroom.controllers.observe import RegionAggregator
from headroom.controllers.types import (
    SLO_QUANTILE,
    STRONG_TAIL_SHARE,
    ArmStats,
    CapacityLevel,
    strong_tail_quantile,
)
from headroom.kernel.sketch import LatencySketch


def _sketch(values: np.ndarray) -> LatencySketch:
    sk = LatencySketch(0.01)
    sk.add_many(values)
    return sk


def test_p99_comes_from_merged_sketches_not_averaged_percentiles() -> None:
    rng = np.random.default_rng(1)
    fast = rng.uniform(10, 20, 990)
    slow = rng.uniform(500, 600, 10)
    agg = RegionAggregator()
    agg.add_latency("r", 0.0, "base", len(fast), _sketch(fast), None)
    agg.add_latency("r", 9.0, "rma", len(slow), _sketch(slow), None)
    obs = agg.observe("r", 10.0)
    truth = np.quantile(np.concatenate([fast, slow]), 0.99, method="lower")
    assert obs.p99_ms["all"] is not None
    assert abs(obs.p99_ms["all"] - truth) <= 0.011 * truth
    assert obs.p99_ms["sbm"] is None
    assert obs.request_rps == 1000 / 10.0  # event time 0..9 plus one 1 s message window


def test_request_rate_uses_event_time_so_a_backlog_does_not_inflate_it() -> None:
    agg = RegionAggregator()
    agg.observe("r", 100.0)
    # 20 s of one-second messages at 50 rps arrive together, one second after the last tick
    for i in range(20):
        agg.add_latency("r", 80.0 + i, "base", 50, _sketch(np.full(50, 5.0)), None, window_s=1.0)
    obs = agg.observe("r", 101.0)
    assert obs.request_rps == 50.0


def test_raw_samples_without_a_sketch_are_folded_in() -> None:
    agg = RegionAggregator()
    agg.add_latency("r", 0.0, "base", 3, None, (10.0, 20.0, 30.0))
    obs = agg.observe("r", 1.0)
    assert obs.p99_ms["base"] is not None
    assert 19.7 < obs.p99_ms["base"] < 20.3  # lower quantile: the 2nd of 3


def test_newest_capacity_level_wins_and_expired_opportunistic_counts_zero() -> None:
    agg = RegionAggregator()
    assert agg.add_capacity("r", CapacityLevel("cpu", "any", "opportunistic", 8.0, 100.0, ts=10.0))
    assert not agg.add_capacity(
        "r", CapacityLevel("cpu", "any", "opportunistic", 2.0, None, ts=5.0)
    )
    (level,) = agg.capacity("r", now=50.0)
    assert level.units == 8.0
    assert level.expires_in_s == 60.0
    (level,) = agg.capacity("r", now=200.0)
    assert level.units == 0.0


def test_window_restarts_after_each_observation() -> None:
    agg = RegionAggregator()
    agg.add_latency("r", 0.0, "base", 10, _sketch(np.full(10, 5.0)), None)
    agg.observe("r", 1.0)
    obs = agg.observe("r", 2.0)
    assert obs.request_rps == 0.0
    assert obs.p99_ms["all"] is None


@given(st.lists(st.tuples(st.integers(0, 1000), st.floats(0, 1e6), st.floats(0, 1e9)), max_size=30))
def test_value_sums_add_exactly(parts: list[tuple[int, float, float]]) -> None:
    agg = RegionAggregator()
    for i, (n, s, sq) in enumerate(parts):
        agg.add_value("r", float(i), ("casual", "sbm", "treatment"), ArmStats(n, s, sq))
    obs = agg.observe("r", 100.0)
    got = obs.value.get(("casual", "sbm", "treatment"), ArmStats())
    assert got.n == sum(p[0] for p in parts)
    total = sum(p[1] for p in parts)
    assert abs(got.value_sum - total) <= 1e-9 * (1 + total)


def test_a_remote_pool_does_not_overwrite_a_local_one_of_the_same_hardware() -> None:
    agg = RegionAggregator()
    agg.add_capacity("r", CapacityLevel("accelerator", "gpu-b", "opportunistic", 2.0, ts=1.0))
    agg.add_capacity(
        "r", CapacityLevel("accelerator", "gpu-b", "opportunistic", 6.0, remote=True, ts=2.0)
    )
    levels = agg.capacity("r", now=3.0)
    assert sorted((c.remote, c.units) for c in levels) == [(False, 2.0), (True, 6.0)]


def test_a_level_read_again_after_a_restart_gets_no_second_lifetime() -> None:
    """The lifetime counts from the announcement's ``ts``: the controller restoring its table
    (or reading the compacted topic again) re-adds old levels, and they stay lapsed."""
    agg = RegionAggregator()
    lvl = CapacityLevel("accelerator", "gpu-b", "opportunistic", 4.0, 30.0, ts=100.0)
    assert agg.add_capacity("r", lvl)
    assert not agg.add_capacity("r", lvl)  # the same message again: nothing changes
    restarted = RegionAggregator()
    restarted.add_capacity("r", lvl)
    (level,) = restarted.capacity("r", now=200.0)
    assert (level.units, level.expires_in_s) == (0.0, 0.0)
    (level,) = restarted.capacity("r", now=110.0)
    assert (level.units, level.expires_in_s, level.ts) == (4.0, 20.0, 110.0)


def test_observed_coverage_counts_only_the_requests_the_router_may_route() -> None:
    """The holdout's requests are never routed to the strong model: a window where the strong
    model took every eligible treatment request reads coverage 1.0, not 1 − holdout (which the
    coverage loop's calibration would answer by raising the command to its limit)."""
    agg = RegionAggregator(eligible_share=0.5, treat_share=0.8)
    # 1,000 requests: 500 eligible, 400 of them in the treatment arm, 300 of those on sbm
    agg.add_latency("r", 0.0, "base", 700, _sketch(np.full(700, 5.0)), None)
    agg.add_latency("r", 0.0, "sbm", 300, _sketch(np.full(300, 9.0)), None)
    obs = agg.observe("r", 1.0)
    assert obs.observed_coverage == 300 / 400
    assert obs.eligible_rps == 0.5 * obs.request_rps  # the rate stays that of all eligible


@given(
    requests=st.integers(0, 10_000),
    strong=st.integers(0, 10_000),
    eligible=st.floats(0.0, 1.0),
    treat=st.floats(0.0, 1.0),
)
def test_observed_coverage_is_a_share_or_none(
    requests: int, strong: int, eligible: float, treat: float
) -> None:
    c = observed_coverage(requests, strong, eligible, treat)
    if requests * eligible * treat > 0.0:
        assert c is not None
        assert 0.0 <= c <= 1.0
        if strong <= requests * eligible * treat:
            assert c == pytest.approx(strong / (requests * eligible * treat))
    else:
        assert c is None


def test_a_capacity_level_does_not_hide_when_the_first_window_began() -> None:
    """A level read first (as at start-up) leaves the window's start to the first latency or
    value message, so the first observation spans the data it holds, not 1 ms."""
    agg = RegionAggregator()
    agg.add_capacity("r", CapacityLevel("cpu", "any", "opportunistic", 8.0, None, ts=0.5))
    agg.add_latency("r", 2.0, "base", 10, _sketch(np.full(10, 5.0)), None)
    obs = agg.observe("r", 10.0)
    assert obs.window_s == 8.0


def test_precompute_hits_count_as_requests() -> None:
    """A hit calls no server, so no latency message counts it; its value signal does. The rate
    the controllers see is every request's, as in the simulator (the precompute lever's demand is
    a share of the visits: without the hits it would shrink as they grow)."""
    agg = RegionAggregator(treat_share=0.8)
    agg.add_latency("r", 0.0, "base", 540, _sketch(np.full(540, 5.0)), None)
    agg.add_latency("r", 9.0, "sbm", 60, _sketch(np.full(60, 9.0)), None)
    agg.add_value("r", 5.0, ("casual", "precompute", "treatment"), ArmStats(400, 40.0, 4.0))
    agg.add_value("r", 5.0, ("casual", "precompute", "control"), ArmStats(100, 9.0, 1.0))
    obs = agg.observe("r", 10.0)
    assert obs.request_rps == 1000 / 10.0
    assert obs.observed_coverage == 60 / (1000 * 0.8)


def test_the_strong_tail_is_read_at_the_quantile_its_share_of_requests_allows() -> None:
    # 900 baseline requests and 100 strong ones, 5 of them slow: the strong path's p99 is the
    # slow tail, but those 5 are 0.5 % of all requests, the share of the SLO's 1 % the strong
    # path may take, so the loop's measurement is its p95 (1 − 0.5 × 1 % × 1000 / 100)
    agg = RegionAggregator()
    agg.add_latency("r", 0.0, "base", 900, _sketch(np.full(900, 10.0)), None)
    strong = np.concatenate([np.full(95, 100.0), np.full(5, 400.0)])
    agg.add_latency("r", 0.5, "sbm", 100, _sketch(strong), None)
    obs = agg.observe("r", 1.0)
    assert obs.p99_ms["sbm"] == pytest.approx(400.0, rel=0.011)
    assert obs.sbm_tail_ms == pytest.approx(100.0, rel=0.011)
    assert strong_tail_quantile(1000, 100) == pytest.approx(0.95)


def test_no_strong_requests_no_strong_tail() -> None:
    agg = RegionAggregator()
    agg.add_latency("r", 0.0, "base", 10, _sketch(np.full(10, 10.0)), None)
    assert agg.observe("r", 1.0).sbm_tail_ms is None


@given(
    requests=st.integers(min_value=1, max_value=10**7),
    share=st.floats(min_value=0.0, max_value=1.0),
)
def test_the_strong_tail_quantile_keeps_its_excess_within_its_share_of_the_slo(
    requests: int, share: float
) -> None:
    strong = round(requests * share)
    q = strong_tail_quantile(requests, strong)
    assert 0.9 <= q <= SLO_QUANTILE or (q > SLO_QUANTILE and strong > 0.5 * requests)
    if strong == 0:
        assert q == SLO_QUANTILE
        return
    # the strong requests over its q-quantile, as a share of all requests: STRONG_TAIL_SHARE
    # of the SLO's 1 % unless the p90 floor holds (a strong path serving under 5 %)
    excess = (1.0 - q) * strong / requests
    assert excess <= STRONG_TAIL_SHARE * (1 - SLO_QUANTILE) + 1e-12 or q == 0.9
    # more strong requests among as many in all: a quantile as deep or shallower
    if strong < requests:
        assert strong_tail_quantile(requests, strong + 1) >= q
