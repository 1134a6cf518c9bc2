"""The measured-uplift core of the precompute worker (controllers/precompute_value.py).

A manual stream of value signals and visit ages drives :class:`UpliftCalibrator`: a precise
measurement rescales its segment to exactly the measured uplift (at the visits' own staleness), a
noisy one changes nothing, a precisely measured uplift at or below zero switches the segment off
(and the planner then picks none of its users), signals of other levers, regions and segments are
ignored, and the memory fades so an off segment is tried again.
"""

from __future__ import annotations

import functools
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from headroom.controllers.levers import CostModel
from headroom.controllers.precompute import PrecomputeConfig, PrecomputePlanner, UpliftModel
from headroom.controllers.precompute_value import (
    CalibrationSettings,
    UpliftCalibrator,
    effective_age,
)
from headroom.kernel.errors import ConfigError
from tests.signals import value_signal

HOUR = 3600.0
REGION = "r1"
PREMIUM, CASUAL = 0, 1
WINDOW_S = 10.0
COSTS = CostModel(
    base_cpu_ms=0.1,
    base_accelerator_ms=0.02,
    strong_cpu_ms=0.005,
    strong_accelerator_ms=0.1,
    base_candidates=400,
    base_hardware=("gpu-a", "gpu-b"),
    strong_hardware=("gpu-b",),
    strong_load_s=120.0,
)
CONFIG = PrecomputeConfig(
    costs=COSTS,
    candidates=400,
    segment_names=("premium", "casual"),
    segment_values=(3.0, 0.6),
    return_rates_per_h=(6.0, 3.0),
)
# stored quality 1 − 0.1·age/h, fresh 1, live baseline 0.8: Δ_s(a) = v̄_s·(0.2 − 0.1·a/h), L = 2 h
AGES = [0.0, 4 * HOUR, 8 * HOUR]
BASE = UpliftModel.from_tables(
    CONFIG, [1.0, 1.0], [0.8, 0.8], AGES, [[1.0 - 0.1 * a / HOUR for a in AGES]] * 2
)


signal = functools.partial(value_signal, region=REGION, window_s=WINDOW_S)


def calibrator(**kw: float) -> UpliftCalibrator:
    return UpliftCalibrator(
        REGION, CONFIG.segment_names, WINDOW_S, CONFIG.max_ttl_s, CalibrationSettings(**kw)
    )


def feed(
    cal: UpliftCalibrator,
    segment: str,
    uplift: float,
    sd: float,
    *,
    n_t: int = 2000,
    n_c: int = 500,
    ages_s: tuple[float, ...] = (1800.0,),
    t: float = 0.0,
) -> None:
    """One window: ``n_t`` hits and ``n_c`` held-out visits of ``segment`` (control mean 1.0),
    and one visit age observed per visit, cycling through ``ages_s``."""
    seg = CONFIG.segment_index(segment)
    cal.add_signal(signal(segment, "treatment", n_t, 1.0 + uplift, sd, ts=t), t)
    cal.add_signal(signal(segment, "control", n_c, 1.0, sd, ts=t), t)
    for i in range(n_t + n_c):
        cal.observe_staleness(seg, ages_s[i % len(ages_s)], t)


def test_a_precise_measurement_rescales_its_segment_to_exactly_the_measured_uplift() -> None:
    cal = calibrator()
    predicted = float(BASE.uplift(CASUAL, 1800.0))  # 0.6 × (0.2 − 0.05) = 0.09
    assert predicted == pytest.approx(0.09, rel=0.02)
    feed(cal, "casual", 0.5 * predicted, sd=0.05)
    model, cals = cal.calibrate(BASE)
    c = cals[CASUAL]
    assert (c.status, c.reason, c.staleness_source) == ("measured", "confident", "measured")
    # the ages sit in one histogram bin: the prediction is Δ at its centre, 1800 s give or take
    assert c.predicted == pytest.approx(predicted, rel=0.01)
    assert c.scale == pytest.approx(0.5 * predicted / c.predicted, rel=1e-9)
    assert c.staleness_p50_s == pytest.approx(1800.0, abs=60.0)
    # the whole curve is scaled by k; the lifetime stays the curves'
    assert np.allclose(model.delta[CASUAL], c.scale * BASE.delta[CASUAL], rtol=1e-9, atol=1e-15)
    assert np.allclose(model.cumulative[CASUAL], c.scale * BASE.cumulative[CASUAL], rtol=1e-9)
    assert model.lifetime(CASUAL) == BASE.lifetime(CASUAL)
    assert np.array_equal(model.delta[PREMIUM], BASE.delta[PREMIUM])  # no signals: the curves'
    assert cals[PREMIUM].status == "curves"
    assert cals[PREMIUM].reason == "few_samples"
    fields = c.event_fields()
    assert fields["segment"] == "casual"
    assert fields["scale"] == pytest.approx(c.scale, abs=1e-6)
    assert fields["n_treatment"] == 2000
    assert fields["n_control"] == 500


def test_the_prediction_is_the_mean_over_the_visits_staleness_not_one_age() -> None:
    cal = calibrator()
    # half the visits found a 10-minute-old result, half a 90-minute-old one: Δ is linear, so
    # the effective age is the mean staleness, 50 minutes
    feed(cal, "casual", 0.06, sd=0.02, ages_s=(600.0, 5400.0))
    model, cals = cal.calibrate(BASE)
    c = cals[CASUAL]
    assert c.at_age_s == pytest.approx(3000.0, abs=60.0)
    mean_delta = 0.5 * float(BASE.uplift(CASUAL, 600.0) + BASE.uplift(CASUAL, 5400.0))
    assert c.predicted == pytest.approx(mean_delta, rel=0.02)
    assert float(model.uplift(CASUAL, c.at_age_s)) == pytest.approx(0.06, rel=1e-9)
    assert c.scale == pytest.approx(0.06 / c.predicted, rel=1e-9)


def test_noise_changes_nothing_however_far_the_mean_lands() -> None:
    for uplift in (-0.2, 0.0, 0.3):  # harmful, useless, 3x: all within the noise here
        cal = calibrator()
        feed(cal, "casual", uplift, sd=2.0)  # se ≈ 0.1, above 0.25 × the 0.09 predicted
        model, cals = cal.calibrate(BASE)
        assert (cals[CASUAL].status, cals[CASUAL].reason) == ("curves", "noisy")
        assert cals[CASUAL].scale == 1.0
        assert cals[CASUAL].uplift == pytest.approx(uplift, abs=1e-9)
        assert model is BASE


def test_too_few_samples_in_either_arm_change_nothing() -> None:
    cal = calibrator(min_samples=100.0)
    feed(cal, "casual", -0.5, sd=0.01, n_t=5000, n_c=60)  # precise, but a small control arm
    model, cals = cal.calibrate(BASE)
    assert (cals[CASUAL].status, cals[CASUAL].reason) == ("curves", "few_samples")
    assert model is BASE


def test_a_precisely_harmful_segment_is_switched_off_and_the_planner_skips_it() -> None:
    cal = calibrator()
    feed(cal, "casual", -0.01, sd=0.05)
    model, cals = cal.calibrate(BASE)
    assert (cals[CASUAL].status, cals[CASUAL].scale) == ("off", 0.0)
    assert not np.any(model.delta[CASUAL])
    assert cals[PREMIUM].status == "curves"
    planner = PrecomputePlanner(CONFIG, model, np.random.default_rng(1))
    for user in range(20):
        planner.users.observe(user, user % 2, 0.0)  # even: premium, odd: casual
    picks = planner.select(1.0, 20)
    assert picks
    assert {p.segment for p in picks} == {PREMIUM}


def test_an_uplift_of_exactly_zero_measured_precisely_switches_off_too() -> None:
    cal = calibrator()
    feed(cal, "casual", 0.0, sd=0.05)
    _, cals = cal.calibrate(BASE)
    assert (cals[CASUAL].status, cals[CASUAL].scale) == ("off", 0.0)


def test_other_levers_regions_and_segments_are_ignored() -> None:
    cal = calibrator()
    feed(cal, "casual", 0.045, sd=0.05)
    reference = cal.calibrate(BASE)[1][CASUAL]
    noise = [
        signal("casual", "treatment", 5000, -9.0, 0.1, lever="rma"),
        signal("casual", "control", 5000, 9.0, 0.1, lever="sbm"),
        signal("casual", "treatment", 5000, -9.0, 0.1, region="elsewhere"),
        signal("premium", "control", 5000, 9.0, 0.1, region="elsewhere"),
        signal("unknown", "treatment", 5000, -9.0, 0.1),
    ]
    assert not any(cal.add_signal(s, 0.0) for s in noise)
    assert cal.ignored == {"lever": 2, "region": 2, "segment": 1}
    assert cal.used == 2
    after = cal.calibrate(BASE)[1]
    assert after[CASUAL] == reference
    assert after[PREMIUM].reason == "few_samples"


def test_strata_are_post_stratified_like_the_controllers_book() -> None:
    """Two value bins with different means and arm mixes: the segment's uplift is the
    treated-weighted mean of the bins' differences, not the difference of the pooled means."""
    cal = calibrator()
    cal.add_signal(signal("casual", "treatment", 900, 2.05, 0.01, stratum=7), 0.0)
    cal.add_signal(signal("casual", "control", 100, 2.0, 0.01, stratum=7), 0.0)
    cal.add_signal(signal("casual", "treatment", 100, 0.15, 0.01, stratum=0), 0.0)
    cal.add_signal(signal("casual", "control", 900, 0.1, 0.01, stratum=0), 0.0)
    for _ in range(100):
        cal.observe_staleness(CASUAL, 1800.0, 0.0)
    c = cal.measure(BASE)[CASUAL]
    assert c.uplift == pytest.approx(0.05, rel=1e-6)  # pooled means would say 1.855 − 0.29
    assert c.n_treatment == 1000
    assert c.n_control == 1000


def test_without_staleness_the_model_predicts_uniform_ages_over_the_lifetime() -> None:
    cal = calibrator()
    cal.add_signal(signal("casual", "treatment", 2000, 1.05, 0.05), 0.0)
    cal.add_signal(signal("casual", "control", 500, 1.0, 0.05), 0.0)
    c = cal.measure(BASE)[CASUAL]
    life = BASE.lifetime(CASUAL)
    assert life == pytest.approx(2 * HOUR, rel=0.01)
    assert c.staleness_source == "model"
    assert c.predicted == pytest.approx(float(BASE.integral(CASUAL, life)) / life)
    assert c.predicted == pytest.approx(0.6 * 0.1, rel=0.02)  # Δ at the mid-life, linear decay
    assert c.at_age_s == pytest.approx(life / 2, rel=0.02)
    assert c.scale == pytest.approx(0.05 / c.predicted)


def test_the_memory_fades_so_an_off_segment_is_tried_again() -> None:
    cal = calibrator(half_life_s=600.0)
    feed(cal, "casual", -0.01, sd=0.05)
    assert cal.calibrate(BASE)[1][CASUAL].status == "off"
    cal.advance(599.0)  # within the first half-life: 59 windows of discount, still confident
    assert cal.calibrate(BASE)[1][CASUAL].status == "off"
    assert cal.book.uplift("precompute", "casual").n_treatment == pytest.approx(
        2000 * 0.5 ** (590.0 / 600.0)
    )
    cal.advance(6000.0)  # ten half-lives: the evidence is gone, the curves stand again
    c = cal.calibrate(BASE)[1][CASUAL]
    assert (c.status, c.scale) == ("curves", 1.0)
    assert cal.staleness_weight(CASUAL) == pytest.approx(2500 * 0.5 ** (6000.0 / 600.0))
    cal.advance(10.0)  # time never runs backwards: an old event time discounts nothing
    assert cal.staleness_weight(CASUAL) == pytest.approx(2500 * 0.5 ** (6000.0 / 600.0))


def test_changes_worth_reporting() -> None:
    cal = calibrator()
    feed(cal, "casual", 0.045, sd=0.05)
    c = cal.measure(BASE)[CASUAL]
    assert c.changed_from(None, 0.1)  # curves → measured
    assert not c.changed_from(c, 0.1)
    curves = cal.measure(BASE)[PREMIUM]
    assert not curves.changed_from(None, 0.1)  # nothing measured: nothing to report


def test_effective_age_and_settings_and_snapshot() -> None:
    ages = np.array([0.0, 10.0, 20.0])
    assert effective_age(ages, np.array([3.0, 1.0, -1.0]), 2.0) == pytest.approx(5.0)
    assert effective_age(ages, np.array([3.0, 2.0, 2.0]), 2.0) == pytest.approx(10.0)
    assert effective_age(ages, np.array([3.0, 3.0, 3.0]), 2.0) is None
    with pytest.raises(ConfigError, match=r"precompute\.calibration\.max_rel_se"):
        CalibrationSettings(max_rel_se=0.0)
    with pytest.raises(ConfigError, match=r"precompute\.calibration\.min_samples"):
        CalibrationSettings(min_samples=math.nan)
    cal = calibrator()
    feed(cal, "casual", 0.045, sd=0.05, t=25.0)
    cal.add_signal(signal("casual", "treatment", 1, 0.0, 0.0, lever="rma"), 25.0)
    copy = calibrator()
    copy.restore(cal.snapshot())
    assert copy.measure(BASE) == cal.measure(BASE)
    assert copy.snapshot() == cal.snapshot()


@settings(max_examples=150, deadline=None)
@given(
    truth=st.tuples(st.floats(-0.1, 0.2), st.floats(-0.1, 0.2)),  # uplift per segment
    sd=st.sampled_from([0.0, 0.01, 0.1, 1.0]),
    stream=st.lists(
        st.tuples(
            st.sampled_from(["premium", "casual"]),
            st.sampled_from(["treatment", "control"]),
            st.one_of(st.none(), st.integers(0, 7)),
            st.integers(1, 400),  # n
            st.floats(0.0, 600.0),  # event time
        ),
        min_size=1,
        max_size=30,
    ),
    foreign=st.lists(st.integers(0, 29), max_size=10),
    ages=st.lists(st.floats(0.0, 2.5 * HOUR), max_size=20),
)
def test_property_foreign_signals_never_matter_and_a_rescale_always_passes_the_rule(
    truth: tuple[float, float],
    sd: float,
    stream: list[tuple[str, str, int | None, int, float]],
    foreign: list[int],
    ages: list[float],
) -> None:
    a, b = calibrator(min_samples=20.0), calibrator(min_samples=20.0)
    for j, (seg, arm, stratum, n, t) in enumerate(stream):
        level = 1.0 + 0.1 * (stratum or 0)
        mean = level + (truth[CONFIG.segment_index(seg)] if arm == "treatment" else 0.0)
        msg = signal(seg, arm, n, mean, sd, stratum=stratum)
        a.add_signal(msg, t)
        b.add_signal(msg, t)
        if j in foreign:  # the same stream, with other levers' and regions' signals mixed in
            b.add_signal(signal(seg, arm, n, -mean, sd, lever="sbm", stratum=stratum), t)
            b.add_signal(signal(seg, arm, n, mean + 1.0, sd, region="r2"), t)
        for age in ages[j % 3 :: 3]:
            a.observe_staleness(CONFIG.segment_index(seg), age, t)
            b.observe_staleness(CONFIG.segment_index(seg), age, t)
    model_a, cals_a = a.calibrate(BASE)
    model_b, cals_b = b.calibrate(BASE)
    assert cals_a == cals_b
    assert np.array_equal(model_a.delta, model_b.delta)
    assert np.array_equal(model_a.lifetimes_s, BASE.lifetimes_s)
    for c in cals_a:
        if c.status == "curves":
            assert c.scale == 1.0
            assert np.array_equal(model_a.delta[c.index], BASE.delta[c.index])
            continue
        # rescaled: both arms big enough, the estimate precise relative to the prediction,
        # and the model is the curves times the measured scale
        assert c.uplift is not None
        assert c.se is not None
        assert c.predicted is not None
        assert min(c.n_treatment, c.n_control) >= 20.0
        assert c.se <= 0.25 * c.predicted
        assert (c.status == "off") == (c.uplift <= 0.0)
        assert c.scale == pytest.approx(max(c.uplift, 0.0) / c.predicted)
        assert np.allclose(model_a.delta[c.index], c.scale * BASE.delta[c.index], atol=1e-12)
