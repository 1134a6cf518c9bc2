"""The analyzer's metrics, each checked against a hand computation on a small synthetic log."""

from __future__ import annotations

import math
import random
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from headroom.analysis.events import EventLog, EventWriter, pack_sketch, read_events
from headroom.analysis.metrics import (
    Z_95,
    AnalysisError,
    ArmSums,
    MetricsAccumulator,
    compute_metrics,
    holdout_estimate,
    nearest_rank,
    sketch_quantile,
)
from headroom.analysis.table import format_table
from headroom.analysis.testing import LogBuilder, arm, sketch_dict
from headroom.kernel.errors import ConfigError, HeadroomError
from headroom.kernel.sketch import LatencySketch

FAST = [50.0] * 100  # p99 50 ms
SLOW = [300.0] * 100  # p99 300 ms


def _p99(samples: list[float]) -> float:
    value = LatencySketch.from_values(samples).quantile(0.99)
    assert value is not None
    return value


# --- SLO windows ------------------------------------------------------------------------------


def test_violation_fraction_pools_windows_of_every_region_and_skips_empty_ones() -> None:
    log = LogBuilder(slo_p99_ms=200.0, regions=("r1", "r2"))
    log.run_started("headroom")
    log.window("headroom", "r1", 0.0, latencies_ms=SLOW)
    log.window("headroom", "r1", 10.0, latencies_ms=FAST)
    log.window("headroom", "r1", 20.0, latencies_ms=FAST)
    log.window("headroom", "r2", 0.0, latencies_ms=[400.0] * 50)
    log.window("headroom", "r2", 10.0, latencies_ms=[], requests=0)  # no requests: not a window
    slo = compute_metrics(log.events)["policies"]["headroom"]["slo"]
    assert slo["windows"] == 4
    assert slo["violation_fraction"] == pytest.approx(2 / 4)
    assert slo["worst_window_p99_ms"] == _p99([400.0] * 50)
    assert slo["worst_window_p99_ms"] == pytest.approx(400.0, rel=0.01)
    assert slo["by_region"]["r1"]["violation_fraction"] == pytest.approx(1 / 3)
    assert slo["by_region"]["r2"]["windows"] == 1


def test_window_p99_is_the_lower_sample_quantile_of_the_window() -> None:
    # 100 requests: rank floor(0.99 · 99) = 98 (0-based). One slow request sits at rank 99, so
    # the p99 is fast; two slow requests reach rank 98, so the p99 is slow.
    log = LogBuilder(slo_p99_ms=200.0)
    log.run_started("p")
    log.window("p", "r1", 0.0, latencies_ms=[50.0] * 99 + [500.0])
    log.window("p", "r1", 10.0, latencies_ms=[50.0] * 98 + [500.0] * 2)
    slo = compute_metrics(log.events)["policies"]["p"]["slo"]
    assert slo["windows"] == 2
    assert slo["violation_fraction"] == 0.5
    assert slo["worst_window_p99_ms"] == pytest.approx(500.0, rel=0.01)


def test_a_p99_exactly_at_the_limit_is_not_a_violation() -> None:
    limit = _p99([123.0] * 10)
    log = LogBuilder(slo_p99_ms=limit)
    log.run_started("p")
    log.window("p", "r1", 0.0, latencies_ms=[123.0] * 10)
    assert compute_metrics(log.events)["policies"]["p"]["slo"]["violation_fraction"] == 0.0


def test_sources_of_one_window_are_merged_not_averaged() -> None:
    # Source A: 100 requests at 50 ms. Source B: 98 at 50 ms and 2 at 500 ms (its own p99 is
    # 500 ms). Averaging the two p99s (275 ms) would call a violation; the merged window has
    # 200 requests of which 2 are slow, so its p99 (rank floor(0.99 * 199) = 197) is 50 ms.
    log = LogBuilder(slo_p99_ms=200.0)
    log.run_started("p")
    log.window("p", "r1", 0.0, latencies_ms=FAST, source="client")
    log.window("p", "r1", 0.0, latencies_ms=[50.0] * 98 + [500.0] * 2, source="client")
    slo = compute_metrics(log.events)["policies"]["p"]["slo"]
    assert slo["windows"] == 1
    assert slo["violation_fraction"] == 0.0
    assert slo["worst_window_p99_ms"] == pytest.approx(50.0, rel=0.01)


def test_a_window_line_arriving_out_of_order_within_the_horizon_is_still_merged() -> None:
    log = LogBuilder(slo_p99_ms=200.0, window_s=10.0)
    log.run_started("p")
    log.window("p", "r1", 0.0, latencies_ms=[50.0] * 10)
    log.window("p", "r1", 10.0, latencies_ms=FAST)
    log.window("p", "r1", 20.0, latencies_ms=FAST)
    log.window("p", "r1", 0.0, latencies_ms=[900.0] * 10, source="client")  # late, but in time
    slo = compute_metrics(log.events)["policies"]["p"]["slo"]
    assert slo["windows"] == 3
    assert slo["late_window_lines"] == 0
    assert slo["violation_fraction"] == pytest.approx(1 / 3)


def test_a_line_later_than_the_horizon_is_counted_late_but_its_sums_still_count() -> None:
    log = LogBuilder(slo_p99_ms=200.0, window_s=10.0)
    log.run_started("p")
    log.window("p", "r1", 0.0, latencies_ms=FAST)
    log.window("p", "r1", 500.0, latencies_ms=FAST)  # judges window 0 (500 ≥ 10 + 60)
    log.window("p", "r1", 0.0, latencies_ms=SLOW, errors=2, source="client")
    m = compute_metrics(log.events)["policies"]["p"]
    assert m["slo"]["late_window_lines"] == 1
    assert m["slo"]["windows"] == 2
    assert m["slo"]["violation_fraction"] == 0.0
    assert m["requests"] == {"total": 300, "errors": 2, "timeouts": 0}


def test_the_lateness_horizon_can_be_set() -> None:
    log = LogBuilder(slo_p99_ms=200.0, window_s=10.0)
    log.run_started("p")
    log.window("p", "r1", 0.0, latencies_ms=FAST)
    log.window("p", "r1", 500.0, latencies_ms=FAST)
    log.window("p", "r1", 0.0, latencies_ms=SLOW, source="client")
    acc = MetricsAccumulator(lateness_s=1e9)
    for e in log.events:
        acc.add(e)
    slo = acc.result()["policies"]["p"]["slo"]
    assert slo["late_window_lines"] == 0
    assert slo["violation_fraction"] == pytest.approx(1 / 2)


def test_a_malformed_sketch_is_counted_and_its_window_not_judged() -> None:
    log = LogBuilder()
    log.run_started("p")
    log.window("p", "r1", 0.0, latencies_ms=FAST)
    bad = log.window("p", "r1", 10.0, latencies_ms=FAST)
    bad["sketch"] = {"alpha": 0.01, "bins": {"abc": 3}, "zeros": 0}
    slo = compute_metrics(log.events)["policies"]["p"]["slo"]
    assert slo["bad_sketches"] == 1
    assert slo["windows"] == 1


@settings(max_examples=200, deadline=None)
@given(
    samples=st.lists(
        st.one_of(st.just(0.0), st.floats(min_value=0.01, max_value=1e5)), min_size=0, max_size=80
    ),
    q=st.floats(min_value=0.0, max_value=1.0),
)
def test_fast_window_quantile_equals_the_sketch_quantile(samples: list[float], q: float) -> None:
    d = LatencySketch.from_values(samples).to_dict()
    assert sketch_quantile(d, q) == LatencySketch.from_dict(d).quantile(q)
    # a window line's packed form (or its keyed form, where the keys lie far apart) alike
    assert sketch_quantile(pack_sketch(d), q) == sketch_quantile(d, q)


def test_fast_window_quantile_handles_unsorted_and_non_canonical_bins() -> None:
    d = sketch_dict([10.0, 20.0, 30.0, 500.0])
    d["bins"] = dict(reversed(list(d["bins"].items())))
    assert sketch_quantile(d, 0.99) == LatencySketch.from_dict(d).quantile(0.99)
    key, count = next(iter(d["bins"].items()))
    d["bins"] = {"0" + key if not key.startswith("-") else key + "x": count}
    with pytest.raises(ValueError, match=r"sketch\.bins"):
        sketch_quantile(d, 0.99)


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 10_000))
def test_metrics_do_not_depend_on_the_order_of_lines(seed: int) -> None:
    rng = random.Random(seed)
    log = LogBuilder(regions=("r1", "r2"))
    log.run_started("p")
    for i in range(6):
        for region in ("r1", "r2"):
            for source in ("a", "b"):
                n = rng.randint(0, 30)
                log.window(
                    "p",
                    region,
                    10.0 * i,
                    latencies_ms=[rng.choice([40.0, 90.0, 250.0]) for _ in range(n)],
                    value_total=float(n),
                    value_baseline=0.5 * n,
                    source=source,
                )
    header, lines = log.events[:1], log.events[1:]

    def metrics(events: list[dict[str, object]]) -> dict[str, object]:
        acc = MetricsAccumulator(lateness_s=1e9)
        for e in events:
            acc.add(e)
        return acc.result()

    shuffled = lines[:]
    rng.shuffle(shuffled)
    a, b = metrics(header + lines), metrics(header + shuffled)
    for m in (a, b):  # sums in another order differ in the last bits only
        m["policies"]["p"]["value"]["total"] = round(m["policies"]["p"]["value"]["total"], 9)  # type: ignore[index]
    assert a == b


# --- value, oracle, capture ---------------------------------------------------------------------


def test_incremental_value_by_lever_oracle_and_capture_ratio() -> None:
    log = LogBuilder(duration_s=20.0)  # two windows: the whole run
    log.run_started("p")
    log.oracle("p", 40.0, {"rma": 30.0, "sbm": 10.0})
    log.window(
        "p",
        "r1",
        0.0,
        latencies_ms=FAST,
        value_total=110.0,
        value_baseline=100.0,
        inc={"rma": 6.0, "sbm": 4.0},
    )
    log.window(
        "p", "r1", 10.0, latencies_ms=FAST, value_total=52.0, value_baseline=50.0, inc={"rma": 2.0}
    )
    log.run_finished("p")
    v = compute_metrics(log.events)["policies"]["p"]["value"]
    assert v["total"] == 162.0
    assert v["baseline"] == 150.0
    assert v["incremental"] == 12.0
    assert (v["incremental_rma"], v["incremental_sbm"], v["incremental_precompute"]) == (8, 4, 0)
    assert v["oracle_incremental"] == 40.0
    assert v["oracle_by_lever"] == {"rma": 30.0, "sbm": 10.0, "precompute": 0.0}
    assert v["capture_ratio"] == pytest.approx(12.0 / 40.0)


def test_capture_ratio_is_null_without_an_oracle_bound() -> None:
    log = LogBuilder(duration_s=10.0)
    log.run_started("p")
    log.window("p", "r1", 0.0, latencies_ms=FAST, value_total=3.0, value_baseline=1.0)
    log.run_finished("p")
    m = compute_metrics(log.events)["policies"]["p"]
    assert m["complete"] is True
    assert m["value"]["oracle_incremental"] == 0.0
    assert m["value"]["capture_ratio"] is None


def test_per_region_oracle_lines_add_up_and_a_run_wide_line_applies_to_every_policy() -> None:
    log = LogBuilder(regions=("r1", "r2"))
    log.run_started(None)
    log.oracle("a", 10.0, region="r1")
    log.oracle("a", 5.0, region="r2")
    log.oracle("a", 7.0, region="r2")  # a repeated line replaces, never double-counts
    log.oracle(None, 99.0)
    log.window("a", "r1", 0.0, latencies_ms=FAST)
    log.window("b", "r1", 0.0, latencies_ms=FAST)
    policies = compute_metrics(log.events)["policies"]
    assert policies["a"]["value"]["oracle_incremental"] == 17.0
    assert policies["b"]["value"]["oracle_incremental"] == 99.0


# --- holdout estimate ---------------------------------------------------------------------------


def test_holdout_estimate_matches_the_hand_computation() -> None:
    # Segment casual: control [1,2,3,4] (mean 2.5, s² 5/3); rma [3,4,5] (mean 4, s² 1);
    # sbm [5,7] (mean 6, s² 2). Estimate 3·1.5 + 2·3.5 = 11.5. The control's s² shrunk
    # towards the treated arms' pooled (2·1 + 1·2)/3 = 4/3 with 10 degrees of freedom:
    # (3·5/3 + 10·4/3)/13 = 55/39. Var = 3·1 + 2·2 + (3+2)²·(55/39)/4.
    # Segment premium: control [10,12] (mean 11, s² 2); rma [14] (n=1: borrows s² = 2, and
    # lends the control nothing). Estimate 3; Var = 1·2 + 1²·2/2 = 3.
    log = LogBuilder()
    log.run_started("p")
    arms0 = {
        "casual": {"control": arm([1, 2]), "rma": arm([3, 4]), "sbm": arm([5])},
        "premium": {"control": arm([10])},
    }
    arms1 = {
        "casual": {"control": arm([3, 4]), "rma": arm([5]), "sbm": arm([7])},
        "premium": {"control": arm([12]), "rma": arm([14])},
    }
    log.window("p", "r1", 0.0, latencies_ms=FAST, arms=arms0)
    log.window("p", "r1", 10.0, latencies_ms=FAST, arms=arms1)
    v = compute_metrics(log.events)["policies"]["p"]["value"]
    expected = 11.5 + 3.0
    variance = 7 + 25 * (55 / 39) / 4 + 3.0
    assert v["estimated_incremental"] == pytest.approx(expected)
    half = Z_95 * math.sqrt(variance)
    assert v["estimated_ci95"] == pytest.approx([expected - half, expected + half])
    assert v["estimate_unusable_segments"] == []


def test_a_segment_without_two_control_requests_is_left_out_of_the_estimate() -> None:
    est = holdout_estimate(
        {
            "casual": {"control": _sums([1.0]), "rma": _sums([5.0, 6.0])},
            "premium": {"control": _sums([1.0, 3.0]), "sbm": _sums([4.0, 4.0])},
        }
    )
    assert est.unusable_segments == ("casual",)
    assert est.value == pytest.approx(2 * (4.0 - 2.0))


def test_holdout_interval_covers_the_truth_about_95_percent_of_the_time() -> None:
    # Many treated requests and a small shared control arm: without the shared-control term
    # in the variance, the interval would be far too narrow and cover far less often.
    rng = np.random.default_rng(12345)
    effects = {"rma": 0.3, "sbm": 0.5}
    covered = 0
    trials = 400
    for _ in range(trials):
        arms: dict[str, dict[str, ArmSums]] = {}
        truth = 0.0
        for seg, (mu, sd) in {"casual": (1.0, 1.0), "premium": (3.0, 2.0)}.items():
            arms[seg] = {"control": _sums(rng.normal(mu, sd, 30))}
            for lever, effect in effects.items():
                n = 300
                arms[seg][lever] = _sums(rng.normal(mu + effect, sd, n))
                truth += n * effect
        low, high = holdout_estimate(arms).ci95
        covered += low <= truth <= high
    assert 0.92 <= covered / trials <= 0.98


def _strata_sums(y: list[float], x: list[float]) -> dict[str, float]:
    return {
        "n": len(y),
        "value_sum": sum(y),
        "value_sq_sum": sum(v * v for v in y),
        "signal_sum": sum(x),
        "signal_sq_sum": sum(v * v for v in x),
        "signal_value_sum": sum(a * b for a, b in zip(x, y, strict=True)),
    }


def test_the_estimate_reads_the_strata_with_the_value_signal_and_splits_by_lever() -> None:
    """Lines with ``strata``: the one estimator (kernel/estimate.py) post-stratified by value bin
    with the regression on the value signal, in total and per lever; the value-ranked rma arm
    holds the bin's most valuable requests, which the regression corrects for."""
    # bin 0: control x=[1,2,3], y=2x; "none" x=[1,2], y=2x (no effect)
    # bin 1: control x=[4,6], y=2x; rma x=[7,9], y=2x+1 (effect +1 each)
    strata = {
        "casual#0": {
            "control": _strata_sums([2, 4, 6], [1, 2, 3]),
            "none": _strata_sums([2, 4], [1, 2]),
        },
        "casual#1": {
            "control": _strata_sums([8, 12], [4, 6]),
            "rma": _strata_sums([15, 19], [7, 9]),
        },
    }
    log = LogBuilder()
    log.run_started("p")
    log.window("p", "r1", 0.0, latencies_ms=FAST, arms={"casual": {"control": arm([1, 2])}})
    log.events[-1]["strata"] = strata
    v = compute_metrics(log.events)["policies"]["p"]["value"]
    # slope 2 exactly (y = 2x in every control): rma gains 2 × 1, none 0
    assert v["estimated_incremental"] == pytest.approx(2.0)
    assert v["estimated_by_lever"]["rma"]["estimate"] == pytest.approx(2.0)
    assert set(v["estimated_by_lever"]) == {"rma"}
    # without the signal the rma arm would be credited with its higher values: 2·(17 − 10)
    plain = {k: {a: {**d, "signal_sum": 0, "signal_sq_sum": 0, "signal_value_sum": 0}
                 for a, d in by.items()} for k, by in strata.items()}  # fmt: skip
    log.events[-1]["strata"] = plain
    v = compute_metrics(log.events)["policies"]["p"]["value"]
    assert v["estimated_by_lever"]["rma"]["estimate"] == pytest.approx(14.0)


def test_lines_without_strata_estimate_from_the_segments_arms() -> None:
    log = LogBuilder()
    log.run_started("p")
    arms = {"casual": {"control": arm([1, 2, 3]), "rma": arm([3, 4]), "sbm+rma": arm([5])}}
    log.window("p", "r1", 0.0, latencies_ms=FAST, arms=arms)
    v = compute_metrics(log.events)["policies"]["p"]["value"]
    assert v["estimated_incremental"] == pytest.approx(2 * 1.5 + 3.0)
    # an arm that received several levers counts for each of them
    assert v["estimated_by_lever"]["rma"]["estimate"] == pytest.approx(2 * 1.5 + 3.0)
    assert v["estimated_by_lever"]["sbm"]["estimate"] == pytest.approx(3.0)


def test_the_lost_value_is_summed_from_the_window_lines() -> None:
    log = LogBuilder()
    log.run_started("p")
    log.window("p", "r1", 0.0, latencies_ms=FAST, value_total=9.0, value_baseline=10.0,
               inc={"rma": 1.5}, value_lost=-2.5)  # fmt: skip
    log.window("p", "r1", 10.0, latencies_ms=FAST, value_total=5.0, value_baseline=5.0,
               value_lost=-0.5, inc={"sbm": 0.5})  # fmt: skip
    v = compute_metrics(log.events)["policies"]["p"]["value"]
    assert v["incremental_lost"] == pytest.approx(-3.0)
    assert v["incremental"] == pytest.approx(
        v["incremental_rma"] + v["incremental_sbm"] + v["incremental_precompute"] - 3.0
    )


def _sums(values: object) -> ArmSums:
    s = ArmSums()
    s.add(arm([float(v) for v in values]))  # type: ignore[attr-defined]
    return s


# --- capacity, reclaims, shedding, segments, precompute ----------------------------------------


def test_capacity_reclaims_release_percentiles_and_shedding() -> None:
    log = LogBuilder()
    log.run_started("p")
    log.window(
        "p",
        "r1",
        0.0,
        latencies_ms=FAST,
        offered={"cpu": 80.0, "accelerator": 20.0},
        used={"cpu": 30.0, "accelerator": 5.0},
    )
    log.window("p", "r1", 10.0, latencies_ms=FAST, offered={"cpu": 40.0}, used={"cpu": 10.0})
    for _ in range(3):
        log.event("capacity.reclaimed", "p", "r1", resource="cpu", hardware="any")
    for ms in range(1, 101):  # release times 1..100 ms, shuffled order
        log.event("optional.released", "p", "r1", release_ms=float((ms * 37) % 100 + 1))
    log.event("shedding.started", "p", "r1", side="server", lever="rma")
    log.event("shedding.started", "p", "r1", side="server", lever="sbm")
    log.event("shedding.started", "p", "r1", side="client", lever="rma")
    log.event("shedding.stopped", "p", "r1", side="client", lever="rma")
    m = compute_metrics(log.events)["policies"]["p"]
    assert m["capacity"] == {
        "offered_unit_s": {"cpu": 120.0, "accelerator": 20.0},
        "used_unit_s": {"cpu": 40.0, "accelerator": 5.0},
        "captured_share": {"cpu": 40.0 / 120.0, "accelerator": 5.0 / 20.0},
    }
    assert m["reclaims"]["count"] == 3
    # nearest rank over 1..100: p50 is the 50th value, p99 the 99th
    assert (m["reclaims"]["release_ms_p50"], m["reclaims"]["release_ms_p99"]) == (50.0, 99.0)
    assert m["reclaims"]["release_ms_max"] == 100.0
    assert m["shedding"]["server_activations"] == 2
    assert m["shedding"]["client_activations"] == 1
    assert m["shedding"]["by_lever"] == {"rma": 2, "sbm": 1}


def test_nearest_rank_percentiles_are_observed_values() -> None:
    assert nearest_rank([1.0, 3.0, 5.0], 0.5) == 3.0
    assert nearest_rank([1.0, 3.0, 5.0], 0.99) == 5.0
    assert nearest_rank([1.0, 3.0, 5.0], 0.0) == 1.0
    assert nearest_rank([], 0.5) == 0.0


def test_segment_exposure_and_declared_segments_without_traffic() -> None:
    log = LogBuilder(segments=("casual", "premium", "new"))
    log.run_started("p")
    log.window(
        "p",
        "r1",
        0.0,
        latencies_ms=FAST,
        segments={
            "casual": {"requests": 80, "sbm": 8, "inc": 1.5},
            "premium": {"requests": 20, "sbm": 10, "inc": 4.0},
        },
    )
    log.window(
        "p",
        "r1",
        10.0,
        latencies_ms=FAST,
        segments={"casual": {"requests": 20, "sbm": 2, "inc": 0.5}},
    )
    segs = compute_metrics(log.events)["policies"]["p"]["segments"]
    assert segs["casual"] == {"requests": 100, "sbm_share": 0.1, "incremental": 2.0}
    assert segs["premium"] == {"requests": 20, "sbm_share": 0.5, "incremental": 4.0}
    assert segs["new"] == {"requests": 0, "sbm_share": 0.0, "incremental": 0.0}


def test_precompute_section_from_window_sums() -> None:
    log = LogBuilder(precompute_enabled=True)
    log.run_started("p")
    pre = {
        "jobs": 10,
        "used": 4,
        "expired_unused": 5,
        "visits": 50,
        "hits": 5,
        "wasted_partial": 1,
        "staleness_s": [30.0, 10.0],
    }
    log.window("p", "r1", 0.0, latencies_ms=FAST, precompute=pre)
    log.window(
        "p",
        "r1",
        10.0,
        latencies_ms=FAST,
        precompute={**pre, "hits": 15, "staleness_s": [20.0, 90.0, 60.0]},
    )
    p = compute_metrics(log.events)["policies"]["p"]["precompute"]
    assert (p["jobs"], p["used"], p["expired_unused"]) == (20, 8, 10)
    assert p["hit_rate"] == pytest.approx(20 / 100)
    assert p["staleness_s_p50"] == 30.0  # nearest-rank median of 10, 20, 30, 60, 90


def test_no_precompute_section_when_the_scenario_has_none() -> None:
    log = LogBuilder(precompute_enabled=False)
    log.run_started("p")
    log.window("p", "r1", 0.0, latencies_ms=FAST)
    assert "precompute" not in compute_metrics(log.events)["policies"]["p"]


# --- several policies, run bracket, robustness --------------------------------------------------


def test_every_policy_of_the_log_gets_its_own_entry_with_every_contract_field() -> None:
    log = LogBuilder(scenario="quick", seed=42, duration_s=10.0)
    for policy in ("static", "headroom"):
        log.run_started(policy)
    log.window("static", "r1", 0.0, latencies_ms=FAST, value_total=5.0, value_baseline=5.0)
    log.window("headroom", "r1", 0.0, latencies_ms=SLOW, value_total=9.0, value_baseline=5.0)
    for policy in ("static", "headroom"):
        log.run_finished(policy)
    doc = compute_metrics(log.events)
    assert (doc["scenario"], doc["seed"]) == ("quick", 42)
    assert list(doc["policies"]) == ["static", "headroom"]
    assert doc["policies"]["static"]["value"]["incremental"] == 0.0
    assert doc["policies"]["headroom"]["value"]["incremental"] == 4.0
    assert doc["policies"]["headroom"]["slo"]["violation_fraction"] == 1.0
    m = doc["policies"]["headroom"]
    assert m["policy"] == "headroom"
    assert m["duration_s"] == 10.0
    assert m["complete"] is True
    contract = {
        "slo": {"p99_ms", "window_s", "violation_fraction", "worst_window_p99_ms"},
        "requests": {"total", "errors", "timeouts"},
        "value": {
            "total",
            "baseline",
            "incremental",
            "incremental_rma",
            "incremental_sbm",
            "incremental_precompute",
            "oracle_incremental",
            "capture_ratio",
            "estimated_incremental",
            "estimated_ci95",
        },
        "capacity": {"offered_unit_s", "used_unit_s", "captured_share"},
        "reclaims": {"count", "releases", "release_ms_p50", "release_ms_p99", "release_ms_max"},
        "shedding": {"server_activations", "client_activations"},
        "latency": {"all_p99_ms", "baseline_only_p99_ms"},
    }
    for section, fields in contract.items():
        assert fields <= set(m[section]), section
    assert set(m["capacity"]["offered_unit_s"]) >= {"cpu", "accelerator"}
    assert "segments" in m


def test_a_log_without_run_started_or_policies_is_bad_input() -> None:
    with pytest.raises(AnalysisError, match="no events"):
        compute_metrics([])
    with pytest.raises(AnalysisError, match="no policy"):
        compute_metrics([{"kind": "run.started", "policy": None}])
    log = LogBuilder()
    log.window("p", "r1", 0.0, latencies_ms=FAST)
    with pytest.raises(AnalysisError, match=r"no run\.started"):
        compute_metrics(log.events)
    assert issubclass(AnalysisError, ConfigError)


def test_unknown_kinds_and_junk_fields_do_not_break_the_metrics() -> None:
    log = LogBuilder()
    log.run_started("p")
    log.event("brand.new", "p", "r1", anything=[1, 2])
    log.event("brand.new", None, None)
    w = log.window("p", "r1", 0.0, latencies_ms=FAST, value_total=2.0)
    w["requests"] = "many"  # junk counts as 0, never crashes
    w["inc"] = {"rma": float("nan")}
    acc = MetricsAccumulator()
    for e in log.events:
        acc.add(e)
    m = acc.result()["policies"]["p"]
    assert acc.unknown_kinds == {"brand.new": 2}
    assert m["requests"]["total"] == 0
    assert m["value"]["incremental_rma"] == 0.0
    assert m["value"]["total"] == 2.0


def test_table_shows_one_row_per_policy() -> None:
    log = LogBuilder(scenario="quick", duration_s=10.0)
    for policy in ("static", "headroom"):
        log.run_started(policy)
        log.oracle(policy, 10.0)
    log.window("static", "r1", 0.0, latencies_ms=FAST)
    log.window("headroom", "r1", 0.0, latencies_ms=SLOW, value_total=5.0, value_baseline=0.0)
    for policy in ("static", "headroom"):
        log.run_finished(policy)
    text = format_table(compute_metrics(log.events))
    lines = text.splitlines()
    assert lines[0].startswith("verdict — headroom:")  # the answer first
    assert any(line.startswith("scenario quick") for line in lines)
    rows = {line.split()[0]: line for line in lines if line.startswith(("static ", "headroom "))}
    assert set(rows) == {"static", "headroom"}
    assert "100.00%" in rows["headroom"]
    assert "0.500" in rows["headroom"]
    assert "0.00%" in rows["static"]


# --- reading and writing the log ------------------------------------------------------------------


def test_event_writer_and_log_round_trip_with_numpy_values(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    with EventWriter(path) as w:
        w.write({"kind": "window", "n": np.int64(3), "x": np.float64(0.5), "a": np.arange(2)})
        w.write({"kind": "run.finished"})
    assert w.closed
    with pytest.raises(HeadroomError, match="after close"):
        w.write({"kind": "x"})
    assert read_events(path) == [
        {"kind": "window", "n": 3, "x": 0.5, "a": [0, 1]},
        {"kind": "run.finished"},
    ]
    with EventWriter(path, append=True) as w:
        w.write({"kind": "run.started"})
    assert len(read_events(path)) == 3


def test_event_log_skips_corrupt_lines_and_names_their_numbers(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    path.write_bytes(
        b'{"kind":"run.started"}\n'
        b"\n"
        b"{broken\n"
        b"[1,2]\n"
        b'{"no_kind":1}\n'
        b'{"kind":"from.the.future"}\n'
        b'{"kind":"window"}'  # no trailing newline
    )
    log = EventLog(path)
    events = list(log)
    assert [e["kind"] for e in events] == ["run.started", "from.the.future", "window"]
    assert log.stats.corrupt == 3
    assert [n for n, _ in log.stats.problems] == [3, 4, 5]
    assert "not JSON" in log.stats.problems[0][1]
    assert log.stats.unknown_kinds == {"from.the.future": 1}
    assert "3 corrupt line(s) skipped (first: line 3" in log.stats.summary()


def test_event_log_of_a_missing_file_is_bad_input(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no such event log"):
        EventLog(tmp_path / "missing.jsonl")
    with pytest.raises(ConfigError, match="not a file"):
        EventLog(tmp_path)
