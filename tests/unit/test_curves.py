"""Value curves measured on the world: their shape, their look-ups, their cache."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import headroom.world.curves as curves_module
from headroom.kernel.scenario_load import load_scenario
from headroom.world.curves import (
    CostMeasurement,
    Model,
    ValueCurves,
    curves_for,
    curves_key,
    measure_cost,
    measure_curves,
)
from headroom.world.ranking import RankingWorld, SegmentParams, WorldParams

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def measured() -> ValueCurves:
    """A small world with a sharp and a noisy segment; the strong model helps the noisy one."""
    world = RankingWorld(
        WorldParams(
            seed=5,
            ads=4000,
            dim=32,
            base_candidates=50,
            max_candidates=450,
            segments=(SegmentParams("sharp", 0.1, 0.07), SegmentParams("noisy", 0.6, 0.15)),
            drift_per_h=0.2,
        )
    )
    return world.measure_curves(samples_per_segment=192, grid_points=9)


@pytest.fixture(scope="module")
def quickstart() -> ValueCurves:
    return measure_curves(load_scenario(REPO / "scenarios" / "quickstart.yaml"))


def test_shapes_and_grid(measured: ValueCurves) -> None:
    assert measured.n_grid.tolist() == [50, 100, 150, 200, 250, 300, 350, 400, 450]
    assert measured.mean.shape == (2, 2, 9)
    assert measured.std.shape == (2, 2, 9)
    assert measured.segments == ("sharp", "noisy")
    assert np.all((measured.mean > 0) & (measured.mean <= 1))
    assert np.all(measured.std > 0)


def test_value_rises_with_candidates_with_diminishing_returns(measured: ValueCurves) -> None:
    for model in (Model.BASE, Model.STRONG):
        curve = measured.mean[model, 0]  # the sharp segment: ranking is accurate, so N matters
        first_half = curve[4] - curve[0]
        second_half = curve[8] - curve[4]
        assert curve[-1] > curve[0] + 0.03
        assert first_half > second_half > -0.005


def test_strong_uplift_is_larger_where_the_error_gap_is_larger(measured: ValueCurves) -> None:
    uplift = measured.uplift([0, 1], measured.base_candidates)
    assert uplift[1] > uplift[0] + 0.05  # noisy: 0.6 -> 0.15; sharp: 0.1 -> 0.07
    assert uplift[0] > -0.01


def test_reference_scenario_curves_have_the_same_shape(quickstart: ValueCurves) -> None:
    premium, casual = quickstart.segment_index("premium"), quickstart.segment_index("casual")
    base = quickstart.mean[Model.BASE]
    assert base[premium, -1] > base[premium, 0] + 0.03  # RMA pays in the low-error segment
    gap = quickstart.uplift([premium, casual], quickstart.base_candidates)
    assert gap[1] > gap[0] + 0.05  # SBM pays in the high-error segment


def test_precomputed_rankings_decay_with_age(measured: ValueCurves) -> None:
    assert measured.age_grid_s[0] == 0
    pre = measured.precompute_mean
    # At age 0 a stored ranking is the strong model's ranking of max_candidates.
    assert np.allclose(pre[:, 0], measured.mean[Model.STRONG, :, -1])
    assert np.all(pre[:, -1] < pre[:, 0] - 0.1)
    assert np.all(np.diff(pre, axis=1) < 0.02)  # non-increasing up to sampling noise
    q = measured.precompute_quality([0, 1], [0.0, 1e9])
    assert q[0] == pytest.approx(pre[0, 0])
    assert q[1] == pytest.approx(pre[1, -1])  # clamped at the last age


def test_without_drift_precompute_quality_is_flat(quickstart: ValueCurves) -> None:
    assert quickstart.age_grid_s.tolist() == [0.0]
    assert np.allclose(
        quickstart.precompute_quality(0, [0, 3600, 86400]), quickstart.mean[Model.STRONG, 0, -1]
    )


# ------------------------------------------------------------------------------------------------
# Look-ups


def toy_curves() -> ValueCurves:
    grid = np.array([100, 200, 400])
    mean = np.array([[[0.5, 0.6, 0.7], [0.3, 0.35, 0.4]], [[0.55, 0.65, 0.75], [0.5, 0.55, 0.6]]])
    return ValueCurves(
        segments=("a", "b"),
        n_grid=grid,
        mean=mean,
        std=mean / 10,
        age_grid_s=np.array([0.0, 3600.0]),
        precompute_mean=np.array([[0.75, 0.65], [0.6, 0.4]]),
        precompute_std=np.full((2, 2), 0.1),
        precompute_n=400,
        samples_per_segment=1,
    )


def test_lookups_interpolate_linearly_and_clamp() -> None:
    c = toy_curves()
    assert c.mean_quality(0, "base", 100) == pytest.approx(0.5)
    assert c.mean_quality(0, "base", 150) == pytest.approx(0.55)
    assert c.mean_quality(0, "base", 300) == pytest.approx(0.65)
    assert c.mean_quality(1, "strong", 50) == pytest.approx(0.5)  # below the grid: clamped
    assert c.mean_quality(1, "strong", 10_000) == pytest.approx(0.6)
    assert c.std_quality(0, Model.STRONG, 400) == pytest.approx(0.075)
    assert c.baseline_quality([0, 1]).tolist() == pytest.approx([0.5, 0.3])
    assert c.precompute_quality(1, 1800.0) == pytest.approx(0.5)


def test_lookups_are_vectorised_and_broadcast() -> None:
    c = toy_curves()
    seg = np.array([0, 1, 0, 1])
    model = np.array([0, 0, 1, 1])
    n = np.array([100, 400, 200, 300])
    out = c.mean_quality(seg, model, n)
    assert out.shape == (4,)
    assert out.tolist() == pytest.approx([0.5, 0.4, 0.65, 0.575])
    grid = c.mean_quality(np.array([[0], [1]]), "base", np.array([100, 200, 400]))
    assert grid.shape == (2, 3)
    assert np.allclose(grid, c.mean[0])


def test_a_single_point_grid_works() -> None:
    c = ValueCurves(
        segments=("a",),
        n_grid=np.array([400]),
        mean=np.full((2, 1, 1), 0.5),
        std=np.full((2, 1, 1), 0.1),
        age_grid_s=np.array([0.0]),
        precompute_mean=np.full((1, 1), 0.5),
        precompute_std=np.full((1, 1), 0.1),
        precompute_n=400,
        samples_per_segment=1,
    )
    assert c.mean_quality([0, 0], "base", [1, 9999]).tolist() == [0.5, 0.5]


@settings(max_examples=100, deadline=None)
@given(st.floats(0, 1000, allow_nan=False), st.integers(0, 1), st.integers(0, 1))
def test_an_interpolated_value_lies_between_its_grid_neighbours(
    n: float, seg: int, model: int
) -> None:
    c = toy_curves()
    table = c.mean[model, seg]
    v = float(c.mean_quality(seg, model, n))
    assert table.min() - 1e-12 <= v <= table.max() + 1e-12
    j = int(np.clip(np.searchsorted(c.n_grid, n), 1, len(c.n_grid) - 1))
    lo, hi = sorted((table[j - 1], table[j]))
    if c.n_grid[0] <= n <= c.n_grid[-1]:
        assert lo - 1e-12 <= v <= hi + 1e-12


def test_curves_are_read_only_and_checked() -> None:
    c = toy_curves()
    with pytest.raises(ValueError, match="read-only"):
        c.mean[0, 0, 0] = 1.0
    with pytest.raises(ValueError, match="strictly increasing"):
        ValueCurves(
            ("a", "b"),
            np.array([200, 100, 300]),
            c.mean,
            c.std,
            c.age_grid_s,
            c.precompute_mean,
            c.precompute_std,
            400,
            1,
        )
    with pytest.raises(ValueError, match="shape"):
        ValueCurves(
            ("a",),
            c.n_grid,
            c.mean,
            c.std,
            c.age_grid_s,
            c.precompute_mean,
            c.precompute_std,
            400,
            1,
        )
    with pytest.raises(KeyError, match="unknown segment"):
        c.segment_index("z")
    with pytest.raises(ValueError, match="model must be"):
        c.mean_quality(0, "medium", 100)


# ------------------------------------------------------------------------------------------------
# Cache


def test_save_and_load_round_trip(tmp_path: Path) -> None:
    c = toy_curves()
    c.save(tmp_path / "c.npz")
    back = ValueCurves.load(tmp_path / "c.npz")
    assert back.segments == c.segments
    for name in ("n_grid", "mean", "std", "age_grid_s", "precompute_mean", "precompute_std"):
        assert np.array_equal(getattr(back, name), getattr(c, name))
    assert not list(tmp_path.glob(".*.tmp"))  # written atomically


def test_curves_are_measured_once_then_loaded_from_the_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HEADROOM_CACHE_DIR", str(tmp_path))
    scenario = load_scenario(REPO / "scenarios" / "quickstart.yaml")
    calls: list[int | None] = []
    real = curves_module.measure_curves

    def counting(*args: object, **kwargs: object) -> ValueCurves:
        calls.append(1)
        return real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(curves_module, "measure_curves", counting)
    first = curves_for(scenario, samples_per_segment=32)
    second = curves_for(scenario, samples_per_segment=32)
    assert len(calls) == 1
    assert np.array_equal(first.mean, second.mean)
    files = list(tmp_path.glob("curves-*.npz"))
    assert [f.name for f in files] == [f"curves-{curves_key(scenario, None, 32)}.npz"]
    # Another seed is another world: measured again, cached beside.
    curves_for(scenario, seed=scenario.seed + 1, samples_per_segment=32)
    assert len(calls) == 2
    # A corrupt file is measured again and replaced.
    files[0].write_bytes(b"not an npz")
    again = curves_for(scenario, samples_per_segment=32)
    assert len(calls) == 3
    assert np.array_equal(again.mean, first.mean)  # same seed, same measurement


def test_the_cache_key_changes_with_what_changes_the_world() -> None:
    scenario = load_scenario(REPO / "scenarios" / "quickstart.yaml")
    import dataclasses

    key = curves_key(scenario)
    assert curves_key(scenario, seed=scenario.seed + 1) != key
    seg = dataclasses.replace(scenario.segments[0], base_error=0.9)
    changed = dataclasses.replace(scenario, segments=(seg, *scenario.segments[1:]))
    assert curves_key(changed) != key
    slo = dataclasses.replace(scenario.slo, p99_ms=999)
    assert curves_key(dataclasses.replace(scenario, slo=slo)) == key  # irrelevant to the world


def test_measure_cost_reports_real_positive_times() -> None:
    scenario = load_scenario(REPO / "scenarios" / "quickstart.yaml")
    cost = measure_cost(scenario, repeats=3)
    assert isinstance(cost, CostMeasurement)
    assert cost.candidates == scenario.world.max_candidates
    assert cost.retrieval_ms_per_candidate > 0
    assert cost.base_ms_per_candidate > 0
    assert cost.strong_ms_per_candidate > 0
