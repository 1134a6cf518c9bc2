"""Value-ranked RMA in the streaming client spends its budget on the requests SBM did not take:
the top ``share / (1 − r)`` of the non-routed treatment requests by value get the extras, so the
mean extras per treatment request is ``share × span`` whatever share ``r`` SBM routes (the
simulator's ``Population.keep_top_among``); ``r̂`` follows a changing routed share."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pytest

from headroom.kernel.errors import ConfigError
from headroom.workers.client import RoutedShare, Router, TargetState

BASE = 100
MAX = 300
SPAN = MAX - BASE
WARM = 3000  # requests before measuring: past the rankers' first half-life (2000)
MU, SIGMA = 1.0, 0.8  # log-normal values


@dataclass
class Run:
    values: np.ndarray
    control: np.ndarray
    strong: np.ndarray
    extra: np.ndarray


def _segment_rank(v: np.ndarray) -> np.ndarray:
    """The exact CDF of the log-normal: the rank a segment's ValueRanker converges to."""
    z = (np.log(v) - MU) / (SIGMA * math.sqrt(2.0))
    return np.array([0.5 * (1.0 + math.erf(float(x))) for x in z])


def _run(
    *,
    p: float,
    candidates: int,
    n: int = 30_000,
    holdout: float = 0.1,
    value_ranked_sbm: bool = True,
    value_ranked: bool = True,
    m: float = 1.0,
    seed: int = 3,
) -> Run:
    """``n`` requests of one segment, every one eligible, through a Router whose target routes
    the segment's share ``p`` to the strong model and asks for ``candidates``."""
    values = np.random.default_rng(seed).lognormal(MU, SIGMA, n)
    ranks = _segment_rank(values)
    router = Router(
        holdout,
        BASE,
        np.random.default_rng(seed + 1),
        max_candidates=MAX,
        value_ranked=value_ranked,
        value_ranked_sbm=value_ranked_sbm,
    )
    target = TargetState(1, candidates, 0.5, {"casual": p}, False)
    plans = [
        router.plan(
            segment="casual",
            eligible=True,
            target=target,
            rma_multiplier=m,
            sbm_keeps=True,
            sbm_available=True,
            value=float(v),
            segment_rank=float(r),
        )
        for v, r in zip(values, ranks, strict=True)
    ]
    cut = slice(WARM, None)
    return Run(
        values=values[cut],
        control=np.array([x.control for x in plans])[cut],
        strong=np.array([x.strong for x in plans])[cut],
        extra=np.array([x.extra for x in plans])[cut],
    )


@pytest.mark.parametrize("value_ranked_sbm", [True, False])
@pytest.mark.parametrize(("p", "candidates"), [(0.3, 150), (0.5, 130), (0.1, 200)])
def test_the_extras_go_to_the_top_of_the_requests_sbm_did_not_take(
    p: float, candidates: int, value_ranked_sbm: bool
) -> None:
    run = _run(p=p, candidates=candidates, value_ranked_sbm=value_ranked_sbm)
    share = (candidates - BASE) / SPAN
    treat = ~run.control
    r = run.strong[treat].mean()
    assert r == pytest.approx(p, abs=0.015)  # the routed share is what the target asks
    assert not run.extra[run.strong].any()  # a routed request gets no extras
    assert not run.extra[run.control].any()  # nor does the holdout
    rest = treat & ~run.strong
    got = run.extra[rest]
    assert set(got.tolist()) <= {0, SPAN}
    want = share / (1.0 - p)
    assert (got == SPAN).mean() == pytest.approx(want, abs=0.025)  # share / (1 − r) of them
    # the whole budget is spent: share × span per treatment request, as without SBM
    assert run.extra[treat].mean() == pytest.approx(share * SPAN, rel=0.05)
    # and on the highest values among them: above their 1 − share/(1 − r) quantile, all
    # (but for the ranker's resolution at the boundary), below it none
    values = run.values[rest]
    cut = float(np.quantile(values, 1.0 - want))
    assert (got[values > cut * 1.1] == SPAN).mean() > 0.99
    assert (got[values < cut / 1.1] == 0).mean() > 0.99


def test_a_budget_larger_than_the_requests_left_gives_each_of_them_the_span() -> None:
    run = _run(p=0.5, candidates=250)  # three quarters of the requests' worth, half left
    treat = ~run.control
    rest = treat & ~run.strong
    assert (run.extra[rest] == SPAN).all()
    assert not run.extra[run.strong].any()
    assert run.extra[treat].mean() == pytest.approx(0.5 * SPAN, rel=0.05)  # all there is


def test_the_multiplier_scales_the_budget_among_the_requests_left() -> None:
    run = _run(p=0.3, candidates=200, m=0.4)  # budget 0.4 × 0.5 = 0.2 of the requests
    treat = ~run.control
    assert run.extra[treat].mean() == pytest.approx(0.2 * SPAN, rel=0.05)
    assert (run.extra[treat & ~run.strong] == SPAN).mean() == pytest.approx(0.2 / 0.7, abs=0.025)


def test_uniform_rma_is_unchanged_every_request_left_gets_the_mean() -> None:
    run = _run(p=0.3, candidates=150, value_ranked=False)
    treat = ~run.control
    assert set(run.extra[treat & ~run.strong].tolist()) == {50}
    assert not run.extra[run.strong].any()


def test_the_random_stream_is_two_draws_per_request_whatever_the_rule() -> None:
    for value_ranked in (True, False):
        run_rng = np.random.default_rng(9)
        router = Router(0.1, BASE, run_rng, max_candidates=MAX, value_ranked=value_ranked)
        target = TargetState(1, 150, 0.5, {"casual": 0.3}, False)
        for v in np.random.default_rng(1).lognormal(MU, SIGMA, 500):
            router.plan(
                segment="casual",
                eligible=True,
                target=target,
                rma_multiplier=1.0,
                sbm_keeps=True,
                sbm_available=True,
                value=float(v),
                segment_rank=0.9,
            )
        fresh = np.random.default_rng(9)
        fresh.random(2 * 500)
        assert run_rng.random() == fresh.random()


def test_the_routed_share_tracks_a_change() -> None:
    rng = np.random.default_rng(4)
    share = RoutedShare(half_life=2000.0)
    assert share.value == 0.0
    for _ in range(8000):
        share.add(bool(rng.random() < 0.2))
    assert share.value == pytest.approx(0.2, abs=0.03)
    for _ in range(2000):  # one half-life after the change: halfway there
        share.add(bool(rng.random() < 0.6))
    assert share.value == pytest.approx(0.4, abs=0.04)
    for _ in range(12_000):  # six more: there
        share.add(bool(rng.random() < 0.6))
    assert share.value == pytest.approx(0.6, abs=0.03)
    # normalised by the decayed count: no start-up bias
    fresh = RoutedShare()
    fresh.add(True)
    assert fresh.value == 1.0
    with pytest.raises(ConfigError, match="half_life"):
        RoutedShare(half_life=0.0)


def test_the_router_follows_a_change_of_the_routed_share() -> None:
    """When the target's SBM share changes, r̂ and the extras follow: the budget per treatment
    request is share × span before and, once the non-routed ranker has forgotten the old mix
    (a few of its half-lives of non-routed requests), after."""
    router = Router(0.0, BASE, np.random.default_rng(2), max_candidates=MAX)
    values = np.random.default_rng(5).lognormal(MU, SIGMA, 36_000)
    ranks = _segment_rank(values)
    extras = []
    for i, (v, r) in enumerate(zip(values, ranks, strict=True)):
        p = 0.1 if i < 12_000 else 0.5
        plan = router.plan(
            segment="casual",
            eligible=True,
            target=TargetState(1, 150, 0.5, {"casual": p}, False),
            rma_multiplier=1.0,
            sbm_keeps=True,
            sbm_available=True,
            value=float(v),
            segment_rank=float(r),
        )
        extras.append(plan.extra)
        if i == 11_999:
            assert router.routed_share.value == pytest.approx(0.1, abs=0.03)
    assert router.routed_share.value == pytest.approx(0.5, abs=0.04)
    got = np.array(extras)
    assert got[WARM:12_000].mean() == pytest.approx(0.25 * SPAN, rel=0.06)
    assert got[-8000:].mean() == pytest.approx(0.25 * SPAN, rel=0.06)
