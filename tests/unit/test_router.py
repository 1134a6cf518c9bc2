"""SBM router: coverage met, exploration floor, uplift per cost, determinism, propensities."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from headroom.controllers.config import RouterSettings
from headroom.controllers.levers import ValueBook
from headroom.controllers.router import SbmRouter
from headroom.controllers.testing import arm_stats

WEIGHTS = {"premium": 0.15, "casual": 0.85}


def book_with(uplift: dict[str, float], n: int = 5000, seed: int = 0) -> ValueBook:
    rng = np.random.default_rng(seed)
    book = ValueBook()
    for seg, d in uplift.items():
        book.add(
            {
                (seg, "sbm", "treatment"): arm_stats(rng, n, 1.0 + d, 0.5),
                (seg, "sbm", "control"): arm_stats(rng, n, 1.0, 0.5),
            }
        )
    return book


def mean(p: dict[str, float], w: dict[str, float]) -> float:
    total = sum(w.values())
    return sum(p[s] * (w[s] / total) for s in w)


weights = st.dictionaries(
    st.sampled_from(["a", "b", "c", "d", "e"]),
    st.floats(0.0, 1e4, allow_nan=False),
    min_size=1,
)
uplifts = st.dictionaries(st.sampled_from(["a", "b", "c", "d", "e"]), st.floats(-1.0, 1.0))


shares = st.none() | st.dictionaries(
    st.sampled_from(["a", "b", "c", "d", "e"]), st.floats(0.0, 1.0), max_size=5
)


@settings(max_examples=300, deadline=None)
@given(
    w=weights,
    up=uplifts,
    command=st.floats(0.0, 1.0),
    floor=st.floats(0.0, 0.5),
    seed=st.integers(0, 2**32 - 1),
    a=shares,
)
def test_floor_always_honoured_and_coverage_never_exceeded(w, up, command, floor, seed, a) -> None:
    """With or without the allocator's shares (which only order the fill)."""
    router = SbmRouter(RouterSettings(exploration_floor=floor))
    r = router.route(command, w, book_with(up, n=200), np.random.default_rng(seed), shares=a)
    assert set(r.probabilities) == set(w)
    for p in r.probabilities.values():
        assert 0.0 <= p <= 1.0
        assert p >= min(floor, command) - 1e-12
    weights_used = w if sum(w.values()) > 0 else dict.fromkeys(w, 1.0)
    assert mean(r.probabilities, weights_used) <= command + 1e-9
    assert r.achieved <= command + 1e-12


def test_coverage_is_met_exactly_when_every_segment_has_positive_uplift() -> None:
    router = SbmRouter(RouterSettings(exploration_floor=0.05))
    book = book_with({"premium": 0.2, "casual": 0.3})
    for seed in range(20):
        r = router.route(0.4, WEIGHTS, book, np.random.default_rng(seed))
        assert mean(r.probabilities, WEIGHTS) == pytest.approx(0.4)


def test_coverage_goes_to_the_segment_with_the_best_uplift_per_cost() -> None:
    router = SbmRouter(RouterSettings(exploration_floor=0.05))
    book = book_with({"premium": 0.05, "casual": 0.4})
    r = router.route(0.3, WEIGHTS, book, np.random.default_rng(1))
    assert r.probabilities["premium"] == pytest.approx(0.05)  # the floor only
    assert r.probabilities["casual"] > 0.3
    # the same uplifts, but casual requests cost ten times more: premium wins
    r = router.route(0.1, WEIGHTS, book, np.random.default_rng(1), {"premium": 1.0, "casual": 10.0})
    assert r.probabilities["premium"] > r.probabilities["casual"]


def test_segments_with_negative_uplift_keep_only_the_floor() -> None:
    router = SbmRouter(RouterSettings(exploration_floor=0.05))
    book = book_with({"premium": -0.3, "casual": -0.3})
    r = router.route(0.5, WEIGHTS, book, np.random.default_rng(0))
    assert r.probabilities == {"premium": 0.05, "casual": 0.05}
    assert r.achieved == pytest.approx(0.05)


def test_without_data_thompson_sampling_explores_both_segments() -> None:
    router = SbmRouter(RouterSettings(exploration_floor=0.0))
    favoured = set()
    for seed in range(40):
        r = router.route(0.1, WEIGHTS, ValueBook(), np.random.default_rng(seed))
        favoured.add(max(r.probabilities, key=r.probabilities.__getitem__))
    assert favoured == {"premium", "casual"}


def test_same_generator_state_same_probabilities() -> None:
    router = SbmRouter(RouterSettings())
    book = book_with({"premium": 0.1, "casual": 0.1}, n=50)
    a = router.route(0.3, WEIGHTS, book, np.random.default_rng(9))
    b = router.route(0.3, WEIGHTS, book, np.random.default_rng(9))
    assert a == b


def test_zero_command_routes_nothing() -> None:
    r = SbmRouter(RouterSettings()).route(0.0, WEIGHTS, ValueBook(), np.random.default_rng(0))
    assert r.probabilities == {"premium": 0.0, "casual": 0.0}


def test_segments_the_allocator_did_not_give_the_strong_model_get_nothing() -> None:
    # premium shows the larger sampled uplift, but the allocator found RMA worth more there:
    # no floor, no share; casual takes the whole command
    router = SbmRouter(RouterSettings(exploration_floor=0.05))
    book = book_with({"premium": 0.5, "casual": 0.2})
    r = router.route(0.3, WEIGHTS, book, np.random.default_rng(3), allowed={"casual"})
    assert r.probabilities["premium"] == 0.0
    assert mean(r.probabilities, WEIGHTS) == pytest.approx(0.3)
    assert r.probabilities["casual"] == pytest.approx(0.3 / 0.85)
    # every segment allowed: as before (premium first by its higher sampled uplift)
    r_all = router.route(0.3, WEIGHTS, book, np.random.default_rng(3), allowed=None)
    assert r_all.probabilities["premium"] == pytest.approx(1.0)


def test_the_allocators_shares_are_filled_first_then_the_rest_by_score() -> None:
    """The allocator chose the strong model for casual's top strata (a share 0.3 of casual's
    eligible requests) and a little of premium's (0.1): premium's mean uplift is higher, but the
    router fills each segment to the allocator's share first, and only a command beyond the
    shares goes by score."""
    router = SbmRouter(RouterSettings(exploration_floor=0.05))
    book = book_with({"premium": 0.4, "casual": 0.2})
    shares = {"premium": 0.1, "casual": 0.3}
    planned = mean(shares, WEIGHTS)
    for seed in range(10):
        r = router.route(planned, WEIGHTS, book, np.random.default_rng(seed), shares=shares)
        assert r.probabilities == pytest.approx(shares)
        # without the shares premium's better mean takes the command first
        free = router.route(planned, WEIGHTS, book, np.random.default_rng(seed))
        assert free.probabilities["premium"] > shares["premium"]
    # a command beyond the shares: the rest goes by score (premium), the shares kept
    r = router.route(planned + 0.05, WEIGHTS, book, np.random.default_rng(0), shares=shares)
    assert r.probabilities["casual"] == pytest.approx(0.3)
    assert r.probabilities["premium"] == pytest.approx(0.1 + 0.05 / WEIGHTS["premium"])
    # a command below the shares: filled in score order inside them
    r = router.route(0.07, WEIGHTS, book, np.random.default_rng(0), shares=shares)
    assert mean(r.probabilities, WEIGHTS) == pytest.approx(0.07)
    assert r.probabilities["premium"] == pytest.approx(0.1)
    assert r.probabilities["casual"] <= 0.3
