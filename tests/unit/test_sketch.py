"""The latency sketch (docs/messages.md): the key mapping, quantiles within alpha of numpy's, exact
merges, and a validated snapshot form."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from headroom.kernel.codec import dumps, loads
from headroom.kernel.sketch import (
    MAX_BINS,
    LatencySketch,
    bin_keys,
    bin_values,
    quantiles_from_counts,
)
from headroom.streams.messages import ValidationError

QS = [0.0, 0.001, 0.01, 0.1, 0.25, 0.5, 0.75, 0.9, 0.95, 0.99, 0.999, 1.0]
# Rounding of ln at an exact bin boundary may put a value one bin over: allow 1e-12 relative.
SLACK = 1e-12


def _within(estimate: float | None, truth: float, alpha: float) -> bool:
    assert estimate is not None
    if truth == 0.0:
        return estimate == 0.0
    return abs(estimate - truth) <= (alpha + SLACK) * truth


def _distributions(rng: np.random.Generator) -> dict[str, np.ndarray]:
    n = 20_000
    return {
        "lognormal": rng.lognormal(3.5, 0.8, n),
        "exponential": rng.exponential(40.0, n),
        "uniform": rng.uniform(5.0, 250.0, n),
        "pareto_heavy_tail": (rng.pareto(1.5, n) + 1.0) * 10.0,
        "bimodal": np.concatenate(
            [rng.normal(30, 3, n // 2).clip(0.1), rng.normal(400, 40, n // 2)]
        ),
        "with_zeros": np.concatenate([np.zeros(n // 10), rng.gamma(2.0, 20.0, n)]),
        "constant": np.full(1000, 87.3),
        "tiny_and_huge": np.concatenate([rng.uniform(1e-6, 1e-5, 100), rng.uniform(1e5, 1e7, 100)]),
    }


@pytest.mark.parametrize("alpha", [0.005, 0.01, 0.05])
@pytest.mark.parametrize(
    "name",
    [
        "lognormal",
        "exponential",
        "uniform",
        "pareto_heavy_tail",
        "bimodal",
        "with_zeros",
        "constant",
        "tiny_and_huge",
    ],
)
def test_quantiles_are_within_alpha_of_numpy_lower_quantiles(name: str, alpha: float) -> None:
    x = _distributions(np.random.default_rng(20240601))[name]
    sketch = LatencySketch.from_values(x, alpha=alpha)
    assert sketch.count == x.size
    for q in QS:
        truth = float(np.quantile(x, q, method="lower"))
        assert _within(sketch.quantile(q), truth, alpha), (q, truth, sketch.quantile(q))


def test_a_coarser_sketch_really_is_coarser() -> None:
    # The bound is not vacuous: at alpha = 5 % some quantile misses the truth by more than 1 %.
    x = np.random.default_rng(3).lognormal(3.0, 1.0, 5000)
    coarse = LatencySketch.from_values(x, alpha=0.05)
    errors = [abs(coarse.quantile(q) - np.quantile(x, q, method="lower")) for q in QS]  # type: ignore[operator]
    relative = [e / np.quantile(x, q, method="lower") for e, q in zip(errors, QS, strict=True)]
    assert max(relative) > 0.01


_samples = st.lists(
    st.one_of(st.just(0.0), st.floats(min_value=1e-300, max_value=1e300)), min_size=1, max_size=300
)


@settings(max_examples=200, deadline=None)
@given(
    values=_samples,
    q=st.floats(0.0, 1.0),
    alpha=st.sampled_from([0.001, 0.01, 0.02, 0.1, 0.5]),
)
def test_any_quantile_of_any_sample_is_within_alpha(
    values: list[float], q: float, alpha: float
) -> None:
    x = np.array(values)
    sketch = LatencySketch.from_values(x, alpha)
    truth = float(np.quantile(x, q, method="lower"))
    assert _within(sketch.quantile(q), truth, alpha)
    assert _within(sketch.quantiles([q])[0], truth, alpha)


@settings(max_examples=150, deadline=None)
@given(a=_samples, b=_samples, alpha=st.sampled_from([0.01, 0.03]))
def test_merge_equals_the_sketch_of_the_concatenation(
    a: list[float], b: list[float], alpha: float
) -> None:
    left = LatencySketch.from_values(a, alpha)
    left.merge(LatencySketch.from_values(b, alpha))
    assert left == LatencySketch.from_values(a + b, alpha)
    assert left.count == len(a) + len(b)


def test_merged_of_many_replicas_matches_one_sketch_of_everything() -> None:
    rng = np.random.default_rng(11)
    parts = [rng.lognormal(3, 0.5, rng.integers(0, 500)) for _ in range(12)]
    merged = LatencySketch.merged(LatencySketch.from_values(p) for p in parts)
    assert merged == LatencySketch.from_values(np.concatenate(parts))
    assert LatencySketch.merged([], alpha=0.02) == LatencySketch(0.02)


def test_merging_sketches_of_different_alpha_is_refused() -> None:
    with pytest.raises(ValueError, match="different accuracy"):
        LatencySketch(0.01).merge(LatencySketch(0.02))


def test_key_mapping_follows_the_contract_formula() -> None:
    alpha = 0.01
    gamma = (1 + alpha) / (1 - alpha)
    for x in [1e-3, 0.5, 1.0, 41.2, 38.0, 97.5, 1234.5, 1e9]:
        sketch = LatencySketch(alpha)
        sketch.add(x)
        expected = math.ceil(math.log(x) / math.log(gamma))
        assert list(sketch.bins) == [expected]
        assert sketch.to_dict()["bins"] == {str(expected): 1}
    # Every value sits in (gamma**(k-1), gamma**k].
    xs = np.random.default_rng(5).uniform(0.01, 1e4, 10_000)
    k = bin_keys(xs, alpha)
    assert np.all(gamma ** (k - 1.0) < xs * (1 + 1e-12))
    assert np.all(xs <= gamma**k * (1 + 1e-12))
    # The representative is within alpha of both ends of its bin.
    rep = bin_values(k, alpha)
    assert np.all(np.abs(rep - xs) <= (alpha + SLACK) * xs)


def test_zeros_are_counted_apart_and_below_everything() -> None:
    sketch = LatencySketch.from_values([0.0, 0.0, 0.0, 5.0])
    assert sketch.zeros == 3
    assert len(sketch) == 1
    assert sketch.quantile(0.5) == 0.0
    assert sketch.quantile(1.0) == pytest.approx(5.0, rel=0.01)


def test_scalar_and_vectorised_ingest_agree() -> None:
    x = np.random.default_rng(8).lognormal(2.0, 1.5, 5000)
    one_by_one = LatencySketch()
    for value in x.tolist():
        one_by_one.add(value)
    assert one_by_one == LatencySketch.from_values(x)
    # Wide spans take the sort path instead of bincount: same result.
    wide = np.concatenate([x, [1e-200, 1e200]])
    slow = LatencySketch()
    for value in wide.tolist():
        slow.add(value)
    assert slow == LatencySketch.from_values(wide)


def test_weighted_ingest_equals_repeated_samples() -> None:
    values = np.array([0.0, 3.0, 50.0, 50.0, 700.0])
    counts = np.array([2, 0, 5, 1, 3])
    weighted = LatencySketch()
    weighted.add_many(values, counts)
    assert weighted == LatencySketch.from_values(np.repeat(values, counts))
    single = LatencySketch()
    single.add(50.0, 6)
    single.add(3.0, 0)
    assert single == LatencySketch.from_values([50.0] * 6)
    assert single.count == 6


@pytest.mark.parametrize("bad", [-1.0, math.nan, math.inf, -math.inf])
def test_invalid_samples_are_refused_and_change_nothing(bad: float) -> None:
    sketch = LatencySketch.from_values([1.0, 2.0])
    before = sketch.copy()
    with pytest.raises(ValueError, match="finite"):
        sketch.add(bad)
    with pytest.raises(ValueError, match="finite"):
        sketch.add_many([3.0, bad, 4.0])
    assert sketch == before
    assert sketch.count == 2


def test_add_many_checks_counts() -> None:
    sketch = LatencySketch()
    with pytest.raises(ValueError, match="length"):
        sketch.add_many([1.0, 2.0], [1])
    with pytest.raises(ValueError, match="integers"):
        sketch.add_many([1.0], [1.5])
    with pytest.raises(ValueError, match="non-negative"):
        sketch.add_many([1.0], [-1])
    with pytest.raises(ValueError, match="count"):
        sketch.add(1.0, -1)
    assert sketch.count == 0


@pytest.mark.parametrize("alpha", [0.0, 1.0, -0.1, 1e-114, 9e-7, math.nan, True, "0.01"])
def test_alpha_must_lie_strictly_between_0_and_1(alpha: Any) -> None:
    with pytest.raises(ValueError, match="alpha"):
        LatencySketch(alpha)


def test_empty_sketch_has_no_quantile() -> None:
    sketch = LatencySketch()
    assert sketch.count == 0
    assert sketch.quantile(0.99) is None
    assert sketch.quantiles([0.5, 0.99]) == [None, None]
    assert np.isnan(quantiles_from_counts([], [], [0.5])).all()
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        sketch.quantile(1.5)
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        LatencySketch.from_values([1.0]).quantile(-0.1)


def test_quantiles_from_counts_matches_the_sketch() -> None:
    x = np.concatenate([np.zeros(50), np.random.default_rng(9).exponential(30.0, 3000)])
    sketch = LatencySketch.from_values(x)
    keys = np.array(list(sketch.bins.keys()))
    counts = np.array(list(sketch.bins.values()))
    shuffled = np.random.default_rng(1).permutation(keys.size)
    fast = quantiles_from_counts(keys[shuffled], counts[shuffled], QS, zeros=sketch.zeros)
    assert fast.tolist() == [sketch.quantile(q) for q in QS]


def test_snapshot_round_trip_is_exact() -> None:
    x = np.concatenate([np.zeros(7), np.random.default_rng(4).lognormal(3, 1, 2000)])
    sketch = LatencySketch.from_values(x, alpha=0.02)
    snap = sketch.to_dict()
    assert set(snap) == {"alpha", "bins", "zeros"}
    assert all(isinstance(k, str) for k in snap["bins"])
    assert [int(k) for k in snap["bins"]] == sorted(int(k) for k in snap["bins"])
    back = LatencySketch.from_dict(loads(dumps(snap)))
    assert back == sketch
    assert back.count == sketch.count
    assert back.quantiles(QS) == sketch.quantiles(QS)


def test_copy_is_independent_and_sketches_are_unhashable() -> None:
    sketch = LatencySketch.from_values([1.0, 2.0])
    twin = sketch.copy()
    twin.add(3.0)
    assert sketch != twin
    assert sketch.count == 2
    with pytest.raises(TypeError):
        hash(sketch)
    with pytest.raises(TypeError):
        sketch.bins[1] = 5  # type: ignore[index]


@pytest.mark.parametrize(
    ("snapshot", "field", "fragment"),
    [
        ([], "sketch", "object"),
        ({"bins": {}, "zeros": 0}, "sketch.alpha", "missing"),
        ({"alpha": 2.0, "bins": {}}, "sketch.alpha", "1)"),
        ({"alpha": 1e-300, "bins": {}}, "sketch.alpha", "[1e-06, 1)"),
        ({"alpha": "0.01", "bins": {}}, "sketch.alpha", "number"),
        ({"alpha": True, "bins": {}}, "sketch.alpha", "number"),
        ({"alpha": 0.01}, "sketch.bins", "missing"),
        ({"alpha": 0.01, "bins": [1, 2]}, "sketch.bins", "object"),
        ({"alpha": 0.01, "bins": {"3.5": 1}}, "sketch.bins.3.5", "decimal integers"),
        ({"alpha": 0.01, "bins": {"01": 1}}, "sketch.bins.01", "decimal integers"),
        ({"alpha": 0.01, "bins": {"+1": 1}}, "sketch.bins.+1", "decimal integers"),
        ({"alpha": 0.01, "bins": {" 1": 1}}, "sketch.bins. 1", "decimal integers"),
        ({"alpha": 0.01, "bins": {"1\n": 1}}, "sketch.bins.1\n", "decimal integers"),
        ({"alpha": 0.01, "bins": {"372": -1}}, "sketch.bins.372", "non-negative"),
        ({"alpha": 0.01, "bins": {"372": 1.0}}, "sketch.bins.372", "integer"),
        ({"alpha": 0.01, "bins": {"372": True}}, "sketch.bins.372", "integer"),
        ({"alpha": 0.01, "bins": {"372": 2**64}}, "sketch.bins.372", "2**63-1"),
        ({"alpha": 0.01, "bins": {"99999999": 1}}, "sketch.bins.99999999", "range"),
        ({"alpha": 0.01, "bins": {"-99999999": 1}}, "sketch.bins.-99999999", "range"),
        ({"alpha": 0.01, "bins": {}, "zeros": -2}, "sketch.zeros", "non-negative"),
        ({"alpha": 0.01, "bins": {}, "zeros": 0.5}, "sketch.zeros", "integer"),
    ],
)
def test_invalid_snapshots_are_refused_naming_the_field(
    snapshot: Any, field: str, fragment: str
) -> None:
    with pytest.raises(ValidationError) as info:
        LatencySketch.from_dict(snapshot)
    assert info.value.field == field
    assert fragment in info.value.reason


def test_too_many_bins_are_refused() -> None:
    bins = {str(k): 1 for k in range(MAX_BINS + 1)}
    snap = {"alpha": 0.001, "bins": bins, "zeros": 0}
    with pytest.raises(ValidationError) as info:
        LatencySketch.from_dict(snap)
    assert info.value.field == "sketch.bins"
    bins.pop(str(MAX_BINS))
    assert len(LatencySketch.from_dict(snap)) == MAX_BINS


def test_empty_bins_in_a_snapshot_are_dropped_and_unknown_fields_ignored() -> None:
    snap = {"alpha": 0.01, "bins": {"10": 0, "11": 2}, "zeros": 1, "min": 0.0, "sum": 3.0}
    sketch = LatencySketch.from_dict(snap)
    assert dict(sketch.bins) == {11: 2}
    assert sketch.count == 3
    assert sketch == LatencySketch.from_dict({"alpha": 0.01, "bins": {"11": 2}, "zeros": 1})


def test_extreme_keys_give_finite_quantiles() -> None:
    sketch = LatencySketch.from_values([5e-324, 1.7976931348623157e308])
    assert LatencySketch.from_dict(sketch.to_dict()) == sketch
    low, high = sketch.quantiles([0.0, 1.0])
    assert low is not None
    assert high is not None
    assert math.isfinite(low)
    assert math.isfinite(high)
    assert high == pytest.approx(1.7976931348623157e308, rel=0.01)


def test_key_range_depends_on_alpha_even_for_keys_seen_before() -> None:
    # 5000 is a fine key at alpha = 1 % (≈ 1.4e43) but past the largest double at alpha = 50 %.
    assert len(LatencySketch.from_dict({"alpha": 0.01, "bins": {"5000": 1}})) == 1
    with pytest.raises(ValidationError) as info:
        LatencySketch.from_dict({"alpha": 0.5, "bins": {"5000": 1}})
    assert info.value.field == "sketch.bins.5000"
    assert "range" in info.value.reason
