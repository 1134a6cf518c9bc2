"""The ranking world: seeded, pure, and a funnel whose value has a ground truth."""

from __future__ import annotations

import ast
import math
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from headroom.kernel.scenario_load import load_scenario
from headroom.world.ranking import (
    DRIFT_STEP_S,
    Model,
    RankingWorld,
    SegmentParams,
    WorldParams,
)

REPO = Path(__file__).resolve().parents[2]


def params(**changes: object) -> WorldParams:
    base: dict[str, object] = {
        "seed": 3,
        "ads": 3000,
        "dim": 16,
        "base_candidates": 50,
        "max_candidates": 400,
        "segments": (
            SegmentParams("sharp", 0.1, 0.05),
            SegmentParams("noisy", 0.6, 0.1),
            SegmentParams("perfect", 0.0, 0.0),
        ),
        "drift_per_h": 0.0,
        "strong_width_ratio": 5,
    }
    base.update(changes)
    return WorldParams(**base)  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def world() -> RankingWorld:
    return RankingWorld(params())


@pytest.fixture(scope="module")
def drifting() -> RankingWorld:
    return RankingWorld(params(drift_per_h=0.3))


def test_same_seed_same_world_and_rankings() -> None:
    a, b = RankingWorld(params()), RankingWorld(params())
    assert np.array_equal(a.emb, b.emb)
    assert np.array_equal(a.bid, b.bid)
    ra, rb = a.rank(42, "noisy", 200, "strong"), b.rank(42, "noisy", 200, "strong")
    assert np.array_equal(ra.ranking, rb.ranking)
    assert ra.quality == rb.quality


def test_a_different_seed_gives_a_different_world() -> None:
    a, b = RankingWorld(params()), RankingWorld(params(seed=4))
    assert not np.array_equal(a.emb, b.emb)
    assert not np.array_equal(a.retrieve(1, 0, 50), b.retrieve(1, 0, 50))


def test_a_user_depends_only_on_seed_segment_and_id(world: RankingWorld) -> None:
    batch = world.users([5, 7, 9], "sharp")
    alone = world.users([7], "sharp")
    assert np.array_equal(batch.e[1], alone.e[0])
    assert np.array_equal(batch.r[1][1], alone.r[1][0])
    other_segment = world.users([7], "noisy")
    assert not np.array_equal(alone.e[0], other_segment.e[0])
    big = world.users([2**40 + 7], 0)  # ids beyond 32 bits are distinct users too
    assert not np.array_equal(big.e[0], alone.e[0])


@settings(max_examples=25, deadline=None)
@given(
    user=st.integers(0, 2**31),
    seg=st.integers(0, 2),
    n_small=st.integers(1, 200),
    extra=st.integers(0, 200),
)
def test_candidates_for_n_are_a_prefix_of_those_for_more(
    world: RankingWorld, user: int, seg: int, n_small: int, extra: int
) -> None:
    small = world.retrieve(user, seg, n_small)
    large = world.retrieve(user, seg, n_small + extra)
    assert np.array_equal(small, large[:n_small])
    assert len(set(large.tolist())) == n_small + extra


@settings(max_examples=25, deadline=None)
@given(
    user=st.integers(0, 10**6),
    seg=st.sampled_from(["sharp", "noisy"]),
    n=st.integers(1, 400),
    model=st.sampled_from(["base", "strong"]),
)
def test_a_ranking_orders_exactly_the_retrieved_candidates(
    world: RankingWorld, user: int, seg: str, n: int, model: str
) -> None:
    result = world.rank(user, seg, n, model)
    assert sorted(result.ranking.tolist()) == sorted(world.retrieve(user, seg, n).tolist())
    assert result.top_ad == result.ranking[0]
    assert 0 < result.quality <= 1
    assert math.isclose(result.quality, result.utility / result.best_utility, rel_tol=1e-9)
    scores = world.score(user, seg, result.ranking, model)
    assert np.all(np.diff(scores) <= 0)  # best first by the model's own score


def test_an_error_free_model_picks_the_truly_best_candidate(world: RankingWorld) -> None:
    for user in range(20):
        cands = world.retrieve(user, "perfect", 300)
        truth = world.ad_quality(user, "perfect", cands)
        assert world.rank(user, "perfect", 300, "base").quality == pytest.approx(truth.max())


def test_an_error_free_model_over_the_whole_corpus_finds_quality_one(world: RankingWorld) -> None:
    assert world.rank(11, "perfect", world.params.ads, "strong").quality == pytest.approx(1.0)


def test_a_noisy_model_often_misses_the_best_candidate(world: RankingWorld) -> None:
    misses = 0
    for user in range(40):
        cands = world.retrieve(user, "noisy", 300)
        best = world.ad_quality(user, "noisy", cands).max()
        misses += world.rank(user, "noisy", 300, "base").quality < best - 1e-9
    assert misses >= 20  # base_error 0.6: the error is larger than most gaps between candidates


def test_the_strong_model_beats_the_base_where_its_error_is_smaller(world: RankingWorld) -> None:
    users = range(150)
    base = np.mean([world.quality(u, "noisy", 200, Model.BASE) for u in users])
    strong = np.mean([world.quality(u, "noisy", 200, Model.STRONG) for u in users])
    assert strong > base + 0.05


def test_the_strong_model_does_more_work_per_candidate(world: RankingWorld) -> None:
    hidden = [mlp.w1.shape[1] for mlp in world._mlp]
    assert hidden[1] == hidden[0] * world.params.strong_width_ratio


def test_model_errors_are_standardised_and_fixed_per_user_and_ad(world: RankingWorld) -> None:
    users = world.users(np.arange(200), 0)
    cands = world.retrieve_batch(users, 300)
    for m in (0, 1):
        eps = world.model_error(m, users, cands)
        assert abs(float(eps.mean())) < 0.1
        assert 0.85 < float(eps.std()) < 1.15
        assert np.array_equal(eps, world.model_error(m, users, cands))
    corr = np.corrcoef(
        world.model_error(0, users, cands).ravel(), world.model_error(1, users, cands).ravel()
    )[0, 1]
    assert abs(corr) < 0.1  # the two models make independent mistakes


def test_unknown_segment_and_bad_n_are_errors(world: RankingWorld) -> None:
    with pytest.raises(KeyError):
        world.rank(1, "nobody", 10, "base")
    with pytest.raises(KeyError):
        world.rank(1, 7, 10, "base")
    with pytest.raises(ValueError, match="n must be"):
        world.retrieve(1, 0, 0)
    with pytest.raises(ValueError, match="model must be"):
        world.rank(1, 0, 10, "huge")


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"ads": 0}, "ads and dim"),
        ({"max_candidates": 5000}, "max_candidates <= ads"),
        ({"base_candidates": 500}, "base_candidates <= max_candidates"),
        ({"segments": ()}, "at least one segment"),
        ({"drift_per_h": 1.0}, "drift_per_h"),
        ({"strong_width_ratio": 0}, "strong_width_ratio"),
    ],
)
def test_world_params_are_validated(change: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        params(**change)


def test_params_from_a_scenario() -> None:
    scenario = load_scenario(REPO / "scenarios" / "quickstart.yaml")
    p = WorldParams.from_scenario(scenario)
    assert p.seed == scenario.seed
    assert p.ads == scenario.world.ads
    assert [s.name for s in p.segments] == [s.name for s in scenario.segments]
    assert p.drift_per_h == 0.0
    ratio = (
        scenario.models.strong.accelerator_ms_per_candidate
        / scenario.models.base.accelerator_ms_per_candidate
    )
    assert p.strong_width_ratio == round(ratio)
    assert WorldParams.from_scenario(scenario, seed=99).seed == 99


# ------------------------------------------------------------------------------------------------
# Drift


def test_without_drift_the_world_is_frozen(world: RankingWorld) -> None:
    assert np.array_equal(world.ad_drift(0.0), world.ad_drift(86400.0))
    a = world.rank(5, "sharp", 100, "base", t_s=0.0)
    b = world.rank(5, "sharp", 100, "base", t_s=50_000.0)
    assert np.array_equal(a.ranking, b.ranking)


def test_drift_is_deterministic_in_seed_and_time(drifting: RankingWorld) -> None:
    fresh = RankingWorld(params(drift_per_h=0.3))
    for t in (0.0, 3600.0, 12345.0):
        assert np.array_equal(drifting.ad_drift(t), fresh.ad_drift(t))
    # evaluated on a one-minute grid
    assert np.array_equal(drifting.ad_drift(60.0), drifting.ad_drift(60.0 + DRIFT_STEP_S - 1))
    assert not np.array_equal(drifting.ad_drift(0.0), drifting.ad_drift(3600.0))
    with pytest.raises(ValueError, match="read-only"):
        drifting.ad_drift(0.0)[0] = 1.0


def test_drift_decorrelates_at_the_declared_rate(drifting: RankingWorld) -> None:
    q0 = drifting.ad_drift(0.0)
    assert abs(float(q0.mean())) < 0.05
    assert 0.9 < float(q0.std()) < 1.1
    for hours in (1, 3):
        corr = float(np.corrcoef(q0, drifting.ad_drift(3600.0 * hours))[0, 1])
        assert corr == pytest.approx((1 - 0.3) ** hours, abs=0.06)


def test_a_stored_ranking_goes_stale_as_the_world_drifts(drifting: RankingWorld) -> None:
    fresh, stale = [], []
    for user in range(60):
        top = drifting.rank(user, "perfect", 400, "strong", t_s=0.0).top_ad
        fresh.append(drifting.ad_quality(user, "perfect", [top], t_s=0.0)[0])
        stale.append(drifting.ad_quality(user, "perfect", [top], t_s=6 * 3600.0)[0])
    assert np.mean(stale) < np.mean(fresh) - 0.05


# ------------------------------------------------------------------------------------------------
# Purity


def test_the_world_module_is_pure() -> None:
    import headroom.world.ranking as module

    tree = ast.parse(Path(module.__file__).read_text())
    imported = {
        alias.name.split(".")[0]
        for node in ast.walk(tree)
        if isinstance(node, ast.Import | ast.ImportFrom)
        for alias in (
            node.names if isinstance(node, ast.Import) else [ast.alias(node.module or "")]
        )
    }
    assert imported.isdisjoint({"time", "asyncio", "random", "faust", "aiokafka", "datetime"})
    source = Path(module.__file__).read_text()
    for banned in ("np.random.rand(", "np.random.seed", "np.random.normal(", "default_rng()"):
        assert banned not in source
