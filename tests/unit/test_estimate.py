"""The one holdout estimator (kernel/estimate.py): post-stratified, regression-adjusted."""

from __future__ import annotations

import math

import numpy as np
import numpy.typing as npt
import pytest

from headroom.kernel.estimate import (
    CONTROL,
    CONTROL_PRIOR_DOF,
    Moments,
    adjusted_difference,
    estimate,
    slope,
)

FloatArray = npt.NDArray[np.float64]


def _m(y: FloatArray, x: FloatArray) -> Moments:
    return Moments(
        float(y.size),
        float(y.sum()),
        float((y * y).sum()),
        float(x.sum()),
        float((x * x).sum()),
        float((x * y).sum()),
    )


def _world(
    rng: np.random.Generator, n: int, effect: float, holdout: float = 0.05
) -> dict[str, dict[str, Moments]]:
    """One segment in 8 equal-probability value bins (as the simulator's cells): value x
    log-normal, y0 = 0.8·x·u with u ~ N(1, 0.2); the treated top 30 % by x (a value-ranked
    lever, "rma") gain ``effect`` × x; the other treatment requests are "none"."""
    x = np.exp(rng.normal(0.0, 0.6, n))
    u = rng.normal(1.0, 0.2, n)
    control = rng.random(n) < holdout
    top = x >= np.quantile(x, 0.7)
    y = 0.8 * x * u + np.where(top & ~control, effect * x, 0.0)
    edges = np.quantile(x, np.linspace(0, 1, 9)[1:-1])
    bin_of = np.searchsorted(edges, x)
    out: dict[str, dict[str, Moments]] = {}
    for b in range(8):
        in_b = bin_of == b
        arms = {
            CONTROL: in_b & control,
            "rma": in_b & top & ~control,
            "none": in_b & ~top & ~control,
        }
        out[f"a#{b}"] = {name: _m(y[sel], x[sel]) for name, sel in arms.items() if sel.any()}
    return out


def _truth(strata: dict[str, dict[str, Moments]], effect: float) -> float:
    return sum(effect * by["rma"].x for by in strata.values() if "rma" in by)


def test_the_slope_is_the_pooled_within_stratum_least_squares_fit() -> None:
    rng = np.random.default_rng(1)
    parts = []
    for shift in (0.0, 10.0):  # strata with different levels, one slope
        x = rng.normal(shift, 1.0, 500)
        parts.append(_m(shift * 3.0 + 2.0 * x + rng.normal(0, 0.1, 500), x))
    assert slope(parts) == pytest.approx(2.0, abs=0.02)
    assert slope([Moments(10, 5.0, 3.0)]) == 0.0  # no signal sums: no regression term


def test_without_signal_sums_it_is_the_plain_stratified_difference() -> None:
    t = Moments(4, 10.0, 30.0)
    c = Moments(5, 8.0, 16.0)
    d, v = adjusted_difference(t, c, 0.0)
    var_t = (30.0 - 100.0 / 4) / 3
    # the control's own variance on 4 degrees of freedom, shrunk towards the treated arm's
    k = CONTROL_PRIOR_DOF
    var_c = (4 * (16.0 - 64.0 / 5) / 4 + k * var_t) / (4 + k)
    assert d == pytest.approx(10.0 / 4 - 8.0 / 5)
    assert v == pytest.approx(var_t / 4 + var_c / 5)
    est = estimate({"s": {CONTROL: c, "rma": t}})
    assert est.value == pytest.approx(4 * d)
    assert est.variance == pytest.approx(4 * var_t + 16 * var_c / 5)


def test_a_thin_control_arms_variance_leans_on_the_treated_arms() -> None:
    """A control arm of 11 requests counts half its own spread and half the treated arms'
    (pooled over them); one of 1,001 almost only its own; a lone treated request lends none."""
    rng = np.random.default_rng(3)
    wide = rng.normal(0.0, 2.0, 400)  # the treated arms: sd 2
    treated = {"rma": _m(wide[:200], wide[:200] * 0), "none": _m(wide[200:], wide[200:] * 0)}
    var_t = float(np.var(wide, ddof=1))
    for n, share in ((11, 0.5), (1001, 1000 / (1000 + CONTROL_PRIOR_DOF))):
        y = rng.normal(0.0, 0.5, n)  # a control arm that happens to read narrow
        c = _m(y, y * 0)
        est = estimate({"s": {CONTROL: c, **treated}})
        own = float(np.var(y, ddof=1))
        var_rma = float(np.var(wide[:200], ddof=1))
        var_none = float(np.var(wide[200:], ddof=1))
        pooled = (199 * var_rma + 199 * var_none) / 398
        var_c = share * own + (1 - share) * pooled
        assert est.variance == pytest.approx(200 * var_rma + 200 * var_none + 400**2 * var_c / n)
        assert pooled == pytest.approx(var_t, rel=0.01)
    lone = Moments(1, 3.0, 9.0)
    c = Moments(5, 8.0, 16.0)
    _, v = adjusted_difference(lone, c, 0.0)
    var_c = (16.0 - 64.0 / 5) / 4
    assert v == pytest.approx(var_c / 1 + var_c / 5)


def test_thin_control_arms_keep_the_intervals_coverage() -> None:
    """Worlds with a 1 % holdout of 4,000 requests (about 5 control requests per value bin,
    as a small holdout holds in the first minutes): the 95 % interval of a null lever still
    covers 0 in at least 90 % of them (each bin's control variance alone covered it less)."""
    rng = np.random.default_rng(11)
    covered = 0
    reps = 400
    for _ in range(reps):
        strata = _world(rng, 4000, effect=0.0, holdout=0.01)
        lo, hi = estimate(strata, arms=["rma"]).ci95
        covered += lo <= 0.0 <= hi
    assert covered / reps >= 0.90


def test_a_value_selected_arm_is_estimated_without_bias_and_the_interval_covers() -> None:
    """The regression term removes the selection of the highest values: per arm (and in
    total) the 95 % interval covers the truth in about 95 % of worlds."""
    rng = np.random.default_rng(7)
    covered_arm = covered_total = 0
    errors = []
    reps = 300
    for _ in range(reps):
        strata = _world(rng, 20000, effect=0.02)
        truth = _truth(strata, 0.02)
        arm = estimate(strata, arms=["rma"])
        total = estimate(strata)
        errors.append(arm.value - truth)
        lo, hi = arm.ci95
        covered_arm += lo <= truth <= hi
        lo, hi = total.ci95
        covered_total += lo <= truth <= hi
    se = float(np.std(errors)) / math.sqrt(reps)
    assert abs(float(np.mean(errors))) < 4 * se
    assert 0.91 <= covered_arm / reps <= 0.99
    assert 0.91 <= covered_total / reps <= 0.99


def test_the_regression_term_narrows_the_interval() -> None:
    """The same world with the signal sums dropped (post-stratification alone): the regression
    on the value signal removes most of the within-bin spread of value (variance reduction)."""
    rng = np.random.default_rng(7)
    strata = _world(rng, 20000, effect=0.02)
    plain = {k: {a: Moments(m.n, m.y, m.yy) for a, m in by.items()} for k, by in strata.items()}
    truth = _truth(strata, 0.02)
    adjusted = estimate(strata, arms=["rma"])
    assert adjusted.ci95[0] <= truth <= adjusted.ci95[1]
    assert adjusted.se < 0.7 * estimate(plain, arms=["rma"]).se
    assert estimate(strata).se < 0.7 * estimate(plain).se


def test_strata_without_a_control_arm_are_merged_or_reported_unusable() -> None:
    c = Moments(3, 3.0, 3.5, 3.0, 3.5, 3.5)
    t = Moments(5, 6.0, 8.0, 5.0, 5.5, 6.5)
    # "s#1" has no control: merged with "s#2" (whose control alone is too small)
    merged = estimate(
        {"s#0": {CONTROL: c, "rma": t}, "s#1": {"rma": t}, "s#2": {CONTROL: Moments(1, 1, 1)}},
        group_of=lambda k: k.split("#")[0],
    )
    assert merged.unusable == ("s",)
    assert merged.n_treatment == 5
    alone = estimate({"s#1": {"rma": t}}, group_of=lambda k: k.split("#")[0])
    assert alone.unusable == ("s",)
    assert alone.value == 0.0


def test_failed_control_requests_count_as_harm_done_by_optional_work() -> None:
    """Interference: optional work slows the shared queues, so 5 % of *every* arm's requests
    fail (deliver 0), where the baseline would have served them all. With the failed requests'
    signal sums the estimator imputes the control's failures and counts the control's own loss,
    so the interval covers the truth (effect − every arm's lost value); without them the loss
    cancels out of the difference and the estimate sits far above the truth."""
    rng = np.random.default_rng(11)
    n = 200_000
    x = np.exp(rng.normal(0.0, 0.6, n))
    y0 = 0.8 * x * rng.normal(1.0, 0.2, n)
    control = rng.random(n) < 0.05
    treated = ~control
    failed = rng.random(n) < 0.05
    y1 = y0 + np.where(treated, 0.03 * x, 0.0)
    y = np.where(failed, 0.0, y1)
    truth = float((y - y0).sum())
    edges = np.quantile(x, np.linspace(0, 1, 9)[1:-1])
    bin_of = np.searchsorted(edges, x)
    with_failures: dict[str, dict[str, Moments]] = {}
    for b in range(8):
        for name, sel in ((CONTROL, control), ("rma", treated)):
            s = (bin_of == b) & sel
            m = _m(y[s], x[s])
            f = s & failed
            m.nf, m.xf, m.xxf = float(f.sum()), float(x[f].sum()), float((x[f] ** 2).sum())
            with_failures.setdefault(f"a#{b}", {})[name] = m
    est = estimate(with_failures, group_of=lambda k: k.split("#")[0])
    assert est.ci95[0] <= truth <= est.ci95[1]
    blind = {
        k: {a: Moments(m.n, m.y, m.yy, m.x, m.xx, m.xy) for a, m in by.items()}
        for k, by in with_failures.items()
    }
    assert estimate(blind, group_of=lambda k: k.split("#")[0]).ci95[0] > truth
