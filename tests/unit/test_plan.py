"""The one client plan (headroom.defences.plan): the rule, its per-request form (the streaming
client's) and its vectorised form (the simulator's), and that the two are the same rule — the
per-request planner, fed requests drawn from a population, treats each (segment, value bin)
cell in the shares the vectorised planner computes for it."""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from headroom.defences.plan import (
    HELD_AFTER_INTERVALS,
    HELD_MAX,
    HELD_STEP,
    VALUE_BINS,
    CellPlan,
    CellPlanner,
    PlanRule,
    RateMeter,
    RequestPlan,
    RequestPlanner,
    RoutedShare,
    held_scale,
    held_shares,
    live_share,
    rma_among,
    serves_from_store,
    value_stratum,
)
from headroom.kernel.errors import ConfigError
from headroom.kernel.scenario_load import load_scenario
from headroom.sim.population import Population
from headroom.workers.client import TargetState

BASE = 100
MAX = 300
SPAN = MAX - BASE
WARM = 3000  # requests before measuring: past the rankers' first half-life (2000)
MU, SIGMA = 1.0, 0.8  # log-normal values of the one-segment runs
REPO = Path(__file__).parents[2]
POP = Population.from_scenario(load_scenario(REPO / "scenarios" / "quickstart.yaml"), VALUE_BINS)


def _rule(**kw: object) -> PlanRule:
    args: dict[str, object] = {"holdout": 0.0, "base": BASE, "max": MAX}
    args.update(kw)
    return PlanRule(**args)  # type: ignore[arg-type]


def _planner(seed: int = 1, **kw: object) -> RequestPlanner:
    return RequestPlanner(_rule(**kw), np.random.default_rng(seed))


def _target(
    candidates: int = MAX, coverage: float = 0.5, p: float = 1.0, **segments: float
) -> TargetState:
    return TargetState(1, candidates, coverage, segments or {"casual": p, "premium": p}, False)


# -- the rule --------------------------------------------------------------------------------------


def test_value_stratum_is_the_equal_probability_bin_of_the_segment_rank() -> None:
    ranks = (0.0, 0.124, 0.125, 0.5, 0.874, 0.875, 0.999, 1.0)
    assert [value_stratum(r) for r in ranks] == [0, 0, 1, 4, 6, 7, 7, 7]
    assert value_stratum(-0.5) == 0
    assert value_stratum(1.5) == 7
    assert value_stratum(math.nan) == 0
    counts = np.bincount(
        [value_stratum(float(r)) for r in np.linspace(0.0, 1.0, 8000, endpoint=False)],
        minlength=VALUE_BINS,
    )
    assert counts.tolist() == [1000] * VALUE_BINS


def test_sbm_shares_go_to_each_segments_top_bins() -> None:
    rule = _rule()
    assert rule.sbm_shares(0.25).tolist() == [0.0] * 6 + [1.0, 1.0]
    assert rule.sbm_shares(0.05) == pytest.approx([0.0] * 7 + [0.4])
    assert rule.sbm_shares(0.0).tolist() == [0.0] * VALUE_BINS
    assert rule.sbm_shares(1.0).tolist() == [1.0] * VALUE_BINS
    # one request's share is its bin's entry of the table
    for p in (0.03, 0.3, 0.9):
        assert [rule.sbm_share(k, p) for k in range(VALUE_BINS)] == rule.sbm_shares(p).tolist()
    # several segments at once: one row each
    table = rule.sbm_shares([0.25, 0.05])
    assert table.shape == (2, VALUE_BINS)
    assert table[1].tolist() == rule.sbm_shares(0.05).tolist()
    # uniform: the segment's probability in every bin
    flat = _rule(value_ranked_sbm=False)
    assert flat.sbm_shares([0.3, 0.0]).tolist() == [[0.3] * VALUE_BINS, [0.0] * VALUE_BINS]
    assert flat.sbm_share(7, 0.3) == 0.3


def test_the_segment_probability_needs_coverage_and_is_clipped() -> None:
    rule = _rule()
    assert rule.segment_probability(_target(p=0.4), "casual") == 0.4
    assert rule.segment_probability(_target(coverage=0.0, p=0.4), "casual") == 0.0
    assert rule.segment_probability(_target(casual=1.7), "casual") == 1.0
    assert rule.segment_probability(_target(casual=-0.2), "casual") == 0.0
    assert rule.segment_probability(_target(casual=math.nan), "casual") == 0.0
    assert rule.segment_probability(_target(casual=0.5), "premium") == 0.0
    assert rule.segment_probability(None, "casual") == 0.0


def test_rma_spend_is_the_targets_mean_work() -> None:
    ranked = _rule()
    s = ranked.rma(150, 1.0)
    assert (s.extra, s.share, s.ranked) == (SPAN, 0.25, True)  # a quarter get the whole span
    assert ranked.rma(150, 0.5).share == 0.125  # the multiplier scales the budget
    assert ranked.rma(900, 1.0).share == 1.0  # capped at max
    assert ranked.rma(BASE, 1.0).extra == 0  # nothing asked
    assert ranked.rma(20, 1.0).extra == 0
    assert ranked.rma(150, 1.7).share == 0.25  # the multiplier lies in [0, 1]
    uniform = _rule(value_ranked_rma=False).rma(150, 0.4)
    assert (uniform.extra, uniform.multiplier, uniform.ranked) == (50, 0.4, False)
    assert _rule(max=50).rma(150, 1.0).extra == 0  # max below base: no span


def test_rma_among_spends_the_budget_on_what_is_left() -> None:
    assert rma_among(0.25, 1.0) == 0.25
    assert rma_among(0.25, 0.5) == 0.5
    assert rma_among(0.25, 0.2) == 1.0
    assert rma_among(0.0, 0.5) == 0.0
    assert rma_among(0.25, 0.0) == 1.0


def test_the_rule_is_validated_naming_the_field() -> None:
    for bad in (1.0, -0.1, math.nan):
        with pytest.raises(ConfigError, match="holdout"):
            _rule(holdout=bad)
    with pytest.raises(ConfigError, match="value_bins"):
        _rule(bins=0)
    with pytest.raises(ConfigError, match="value_bins"):
        CellPlanner(_rule(bins=4), POP)


# -- properties ------------------------------------------------------------------------------------

_prob = st.one_of(st.floats(-0.5, 1.5), st.just(math.nan), st.sampled_from([0.0, 1.0]))


@settings(max_examples=200, deadline=None)
@given(p=_prob, bins=st.integers(1, 16), ranked=st.booleans())
def test_sbm_shares_are_shares_never_above_the_target_and_monotone_in_value(
    p: float, bins: int, ranked: bool
) -> None:
    rule = _rule(bins=bins, value_ranked_sbm=ranked)
    shares = rule.sbm_shares(p)
    q = min(max(p, 0.0), 1.0) if p == p else 0.0
    assert np.all((shares >= 0.0) & (shares <= 1.0))
    assert float(shares.mean()) == pytest.approx(q, abs=1e-12)  # the segment's p, never more
    assert np.all(np.diff(shares) >= 0.0)  # a higher value bin is never routed less


@dataclass(frozen=True)
class _Case:
    p: tuple[float, float]
    coverage: float
    candidates: int
    m_rma: float
    m_sbm: float
    eligible: float
    ranked_rma: bool
    ranked_sbm: bool


_cases = st.builds(
    _Case,
    p=st.tuples(st.floats(0.0, 1.0), st.floats(0.0, 1.0)),
    coverage=st.sampled_from([0.0, 0.3]),
    candidates=st.integers(0, 400),
    m_rma=st.floats(0.0, 1.0),
    m_sbm=st.floats(0.0, 1.0),
    eligible=st.floats(0.0, 1.0),
    ranked_rma=st.booleans(),
    ranked_sbm=st.booleans(),
)


def _cell_plan(c: _Case) -> tuple[CellPlanner, CellPlan]:
    rule = _rule(value_ranked_rma=c.ranked_rma, value_ranked_sbm=c.ranked_sbm)
    planner = CellPlanner(rule, POP, eligible=c.eligible)
    target = TargetState(
        1, c.candidates, c.coverage, dict(zip(POP.segments, c.p, strict=True)), False
    )
    return planner, planner.plan(target, c.m_rma, c.m_sbm)


@settings(max_examples=60, deadline=None)
@given(c=_cases)
def test_cell_shares_are_shares_within_the_target_and_monotone_in_value(c: _Case) -> None:
    planner, got = _cell_plan(c)
    routed, sbm, rma = got.routed, got.sbm, got.rma
    for x in (routed, sbm, rma):
        assert np.all((x >= -1e-12) & (x <= 1.0 + 1e-12))
    assert np.all(sbm <= routed + 1e-12)  # the strong model takes only what was routed
    assert np.all(sbm + rma <= 1.0 + 1e-9)  # a request gets one lever at most
    share = POP.share / POP.share.sum()
    # SBM: the eligible share of each segment's p, never more than the target asks
    p = np.array(c.p) if c.coverage > 0 else np.zeros(2)
    assert float(share @ routed) == pytest.approx(c.eligible * float(POP.seg_share @ p), abs=1e-9)
    # RMA: never more than the target's mean work (× the multiplier) per treatment request
    wanted = max(0, min(c.candidates, MAX) - BASE)
    work = float(share @ rma) * got.extra
    if c.ranked_rma:
        assert work <= c.m_rma * wanted + 1e-6
        left = float(share @ (1.0 - sbm))
        spend = planner.rule.rma(c.candidates, c.m_rma)
        # the whole budget, or every request the strong model left
        assert float(share @ rma) == pytest.approx(min(spend.share, left), abs=1e-6)
    else:
        assert work <= wanted + 1e-9
    # monotone in value: within a segment, a higher value bin never gets less optional work
    any_work = (sbm + rma).reshape(POP.n_segments, POP.bins)
    assert np.all(np.diff(any_work, axis=1) >= -1e-9)


@settings(max_examples=60, deadline=None)
@given(
    c=_cases,
    holdout=st.floats(0.0, 0.99),
    draws=st.lists(st.tuples(st.floats(0.0, 1.0), st.floats(1e-3, 1e3)), max_size=30),
    keeps=st.booleans(),
)
def test_a_holdout_request_is_never_treated(
    c: _Case, holdout: float, draws: list[tuple[float, float]], keeps: bool
) -> None:
    planner = RequestPlanner(
        _rule(holdout=holdout, value_ranked_rma=c.ranked_rma, value_ranked_sbm=c.ranked_sbm),
        np.random.default_rng(0),
    )
    target = TargetState(1, c.candidates, c.coverage, {"casual": c.p[0]}, False)
    for rank, value in draws:
        u_arm = float(copy.deepcopy(planner.rng).random())
        plan = planner.plan(
            segment="casual", eligible=True, target=target, rma_multiplier=c.m_rma,
            sbm_keeps=keeps, sbm_available=True, rma_keeps=keeps, value=value,
            segment_rank=rank,
        )  # fmt: skip
        assert plan.control == (u_arm < holdout)
        if plan.control:
            assert not plan.strong
            assert plan.extra == 0
            assert plan.lever is None
        assert plan.extra in (0, SPAN, max(0, min(c.candidates, MAX) - BASE))


@settings(max_examples=80, deadline=None)
@given(
    ranks=st.tuples(st.floats(0.0, 1.0), st.floats(0.0, 1.0)),
    p=st.floats(0.0, 1.0),
    m_sbm=st.floats(0.0, 1.0),
    seed=st.integers(0, 1000),
)
def test_a_higher_value_request_is_never_routed_less(
    ranks: tuple[float, float], p: float, m_sbm: float, seed: int
) -> None:
    """The same draws and state for two requests: the one of higher value rank (within its
    segment, and among all, as the strong multiplier sees it) goes to the strong model whenever
    the lower one does."""
    lo, hi = sorted(ranks)
    planner = _planner(seed)
    for _ in range(20):  # some history
        planner.plan(
            segment="casual", eligible=True, target=_target(p=p), rma_multiplier=1.0,
            sbm_keeps=True, sbm_available=True, value=1.0, segment_rank=0.5,
        )  # fmt: skip

    def strong(rank: float) -> bool:
        twin = copy.deepcopy(planner)
        return twin.plan(
            segment="casual", eligible=True, target=_target(p=p), rma_multiplier=1.0,
            sbm_keeps=rank >= 1.0 - m_sbm, sbm_available=True, value=1.0, segment_rank=rank,
        ).strong  # fmt: skip

    assert strong(hi) >= strong(lo)


# -- the per-request form --------------------------------------------------------------------------


def _ask(planner: RequestPlanner, target: TargetState, **kw: object) -> RequestPlan:
    args: dict[str, object] = {
        "segment": "casual",
        "eligible": True,
        "target": target,
        "rma_multiplier": 1.0,
        "sbm_keeps": True,
        "sbm_available": True,
    }
    args.update(kw)
    return planner.plan(**args)  # type: ignore[arg-type]


def test_the_holdout_share_gets_no_optional_work() -> None:
    planner = _planner(1, holdout=0.2)
    plans = [_ask(planner, _target()) for _ in range(5000)]
    control = [x for x in plans if x.control]
    assert 0.17 < len(control) / len(plans) < 0.23
    assert all(not x.strong and x.extra == 0 and x.lever is None for x in control)
    assert all(x.lever == "sbm" for x in plans if not x.control)


def test_uniform_sbm_routes_by_segment_probability_only_for_eligible_requests() -> None:
    planner = _planner(2, value_ranked_sbm=False)
    target = _target(coverage=0.3, casual=0.25, premium=0.0)

    def share(segment: str, **kw: object) -> float:
        plans = [_ask(planner, target, segment=segment, **kw) for _ in range(4000)]
        return sum(x.strong for x in plans) / len(plans)

    assert 0.22 < share("casual") < 0.28
    assert share("premium") == 0.0
    assert share("casual", eligible=False) == 0.0
    assert share("casual", sbm_keeps=False) == 0.0  # the strong replica's multiplier drops it
    assert share("casual", sbm_available=False) == 0.0  # no strong replica reachable


def test_value_ranked_sbm_routes_the_segments_highest_value_bins_first() -> None:
    planner = _planner(7)
    rule = planner.rule
    ranks = np.random.default_rng(8).random(40_000)
    bins = np.array([value_stratum(float(r)) for r in ranks])

    def plan(p: float, rank: float, **kw: object) -> RequestPlan:
        args: dict[str, object] = {"value": 3.0, "segment_rank": rank, **kw}
        return _ask(planner, _target(BASE, 0.3, casual=p, premium=0.0), **args)

    for p in (0.0, 0.05, 0.25, 0.6, 1.0):
        strong = np.array([plan(p, float(r)).strong for r in ranks])
        assert abs(strong.mean() - p) < 0.01  # the same share as the uniform rule
        for k in range(VALUE_BINS):
            want = rule.sbm_share(k, p)
            got = strong[bins == k].mean()
            if want in (0.0, 1.0):
                assert got == want  # bins above 1 - p all routed, bins below none
            else:  # the boundary bin: a random part of it, not its highest ranks
                assert abs(got - want) < 0.05
                inside = ranks[bins == k]
                routed = strong[bins == k]
                assert abs(inside[routed].mean() - inside[~routed].mean()) < 0.005
    assert plan(0.25, 0.9).strong
    assert not plan(0.25, 0.6).strong
    assert not plan(0.0, 1.0).strong
    # the value itself (RMA's order) plays no part in routing
    assert plan(0.25, 0.9, value=1e-3).strong
    assert not plan(0.25, 0.6, value=1e3).strong
    for gate in ({"eligible": False}, {"sbm_keeps": False}, {"sbm_available": False}):
        assert not plan(1.0, 1.0, **gate).strong
    assert not plan(1.0, 1.0, segment="premium").strong


def test_the_random_stream_is_two_draws_per_request_whatever_the_rule() -> None:
    ranks = np.random.default_rng(3).random(500)
    values = np.random.default_rng(1).lognormal(MU, SIGMA, 500)
    arms = []
    for ranked_rma in (True, False):
        for ranked_sbm in (True, False):
            rng = np.random.default_rng(9)
            planner = RequestPlanner(
                _rule(holdout=0.1, value_ranked_rma=ranked_rma, value_ranked_sbm=ranked_sbm), rng
            )
            plans = [
                _ask(planner, _target(150, 0.5, 0.3), value=float(v), segment_rank=float(r))
                for v, r in zip(values, ranks, strict=True)
            ]
            arms.append([x.control for x in plans])
            fresh = np.random.default_rng(9)
            fresh.random(2 * 500)
            assert rng.random() == fresh.random()
    assert all(a == arms[0] for a in arms)  # the same holdout under every rule


def test_uniform_rma_gives_the_extras_to_what_the_multiplier_keeps() -> None:
    planner = _planner(3, value_ranked_rma=False)
    for keeps in (True, False):
        for candidates, want in ((300, 200), (150, 50), (BASE, 0)):
            plan = _ask(planner, _target(candidates, coverage=0.0), rma_keeps=keeps)
            assert plan.extra == (want if keeps else 0)
            assert plan.lever == ("rma" if want and keeps else None)


def test_a_fallen_back_target_routes_nothing_optional() -> None:
    planner = _planner(4)
    baseline = TargetState(3, BASE, 0.0, {}, True)
    for _ in range(100):
        assert _ask(planner, baseline).lever is None


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
    """``n`` requests of one segment, every one eligible, through a planner whose target routes
    the segment's share ``p`` to the strong model and asks for ``candidates``."""
    values = np.random.default_rng(seed).lognormal(MU, SIGMA, n)
    ranks = _segment_rank(values)
    planner = RequestPlanner(
        _rule(holdout=holdout, value_ranked_rma=value_ranked, value_ranked_sbm=value_ranked_sbm),
        np.random.default_rng(seed + 1),
    )
    target = TargetState(1, candidates, 0.5, {"casual": p}, False)
    plans = [
        _ask(planner, target, rma_multiplier=m, value=float(v), segment_rank=float(r))
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


def test_value_ranked_rma_without_sbm_gives_the_top_share_the_span() -> None:
    run = _run(p=0.0, candidates=150, holdout=0.0)  # a quarter of a 200-candidate span
    cut = float(np.quantile(run.values, 0.75))
    assert set(run.extra.tolist()) == {0, SPAN}
    assert np.mean(run.extra) == pytest.approx(50.0, abs=2.0)  # the same work on average
    assert np.mean(run.extra[run.values >= cut * 1.05] == SPAN) > 0.99  # the top quarter
    assert np.mean(run.extra[run.values < cut / 1.05] == 0) > 0.99  # the rest none
    half = _run(p=0.0, candidates=150, holdout=0.0, m=0.5)
    assert np.mean(half.extra) == pytest.approx(25.0, abs=2.0)  # the multiplier halves it
    assert not _run(p=0.0, candidates=150, holdout=0.0, m=0.0, n=WARM + 100).extra.any()


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
    fresh = RoutedShare()  # normalised by the decayed count: no start-up bias
    fresh.add(True)
    assert fresh.value == 1.0
    with pytest.raises(ConfigError, match="half_life"):
        RoutedShare(half_life=0.0)


def test_the_planner_follows_a_change_of_the_routed_share() -> None:
    """When the target's SBM share changes, r̂ and the extras follow: the budget per treatment
    request is share × span before and, once the not-taken ranker has forgotten the old mix
    (a few of its half-lives of such requests), after."""
    planner = _planner(2)
    values = np.random.default_rng(5).lognormal(MU, SIGMA, 36_000)
    ranks = _segment_rank(values)
    extras = []
    for i, (v, r) in enumerate(zip(values, ranks, strict=True)):
        p = 0.1 if i < 12_000 else 0.5
        target = TargetState(1, 150, 0.5, {"casual": p}, False)
        plan = _ask(planner, target, value=float(v), segment_rank=float(r))
        extras.append(plan.extra)
        if i == 11_999:
            assert planner.routed_share.value == pytest.approx(0.1, abs=0.03)
    assert planner.routed_share.value == pytest.approx(0.5, abs=0.04)
    got = np.array(extras)
    assert got[WARM:12_000].mean() == pytest.approx(0.25 * SPAN, rel=0.06)
    assert got[-8000:].mean() == pytest.approx(0.25 * SPAN, rel=0.06)


# -- the vectorised form ---------------------------------------------------------------------------


def test_rma_budget_goes_to_the_highest_value_requests_the_strong_model_left() -> None:
    planner = CellPlanner(_rule(), POP)
    routed = planner.routed(_target(coverage=0.3, p=0.25))  # the top two bins of each segment
    assert routed.tolist() == ([0.0] * 6 + [1.0, 1.0]) * POP.n_segments
    keep = np.ones(POP.n_cells)
    got = planner.top_among(0.2, routed, keep)
    avail = 1.0 - routed
    # the same mean work: a fifth of all requests get the extras, none of them routed
    assert float((POP.share * got).sum()) == pytest.approx(0.2, rel=1e-6)
    assert np.all(got <= avail + 1e-12)
    assert np.all(got[routed >= 1.0] == 0.0)
    # highest value first: the threshold cuts at most one bin per segment
    partial = [c for c in range(POP.n_cells) if 1e-9 < got[c] < avail[c] - 1e-9]
    assert len(partial) <= POP.n_segments
    # without routing it is the plain top share; a budget beyond the available is all of it
    none = np.zeros(POP.n_cells)
    assert np.allclose(planner.top_among(0.2, none, keep), POP.keep_top(0.2), atol=1e-6)
    assert np.allclose(planner.top_among(0.9, routed, keep), avail)
    assert not planner.top_among(0.0, routed, keep).any()
    # cached, read-only
    again = planner.top_among(0.2, routed, keep)
    assert again is got
    assert not got.flags.writeable


def test_routed_requests_the_strong_multiplier_drops_may_get_rma() -> None:
    """With the strong replica's multiplier below 1, its routed requests of low value rank are
    not taken: they join RMA's requests, where the budget reaches them only above RMA's
    threshold, and the work stays the target's."""
    planner = CellPlanner(_rule(), POP)
    target = _target(200, coverage=0.3, p=0.5)
    full = planner.plan(target, 1.0, 1.0)
    cut = planner.plan(target, 1.0, 0.3)
    assert float(POP.share @ cut.sbm) < float(POP.share @ full.sbm)
    assert float(POP.share @ cut.rma) == pytest.approx(0.5, abs=1e-6)  # the same budget
    assert float(POP.share @ full.rma) == pytest.approx(0.5, abs=1e-6)
    assert np.all(cut.sbm + cut.rma <= 1.0 + 1e-9)
    # the dropped ones are the routed cells' low values: RMA covers what they leave
    assert np.any(cut.rma > full.rma + 1e-6)


# -- the two forms are one rule -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("ranked_rma", "ranked_sbm", "m_rma", "m_sbm", "candidates"),
    [
        (True, True, 1.0, 1.0, 180),
        (True, True, 0.6, 0.5, 180),
        (False, True, 0.5, 0.7, 180),
        (True, False, 1.0, 0.6, 180),
        # a budget that reaches low values: the routed requests the strong multiplier dropped
        # (uniform SBM routes low bins too) get RMA extras like the others left
        (True, False, 1.0, 0.4, 280),
    ],
)
def test_the_per_request_planner_treats_each_cell_as_the_vectorised_plan_says(
    ranked_rma: bool, ranked_sbm: bool, m_rma: float, m_sbm: float, candidates: int
) -> None:
    """Requests drawn from the population, their ranks exact (within the segment: the bin and
    the place in it; among all: the mixture CDF), through the per-request planner: per cell the
    shares taken by the strong model and given RMA extras are the vectorised plan's."""
    rule = _rule(holdout=0.05, value_ranked_rma=ranked_rma, value_ranked_sbm=ranked_sbm)
    target = TargetState(1, candidates, 0.3, {"premium": 0.6, "casual": 0.2}, False)
    want = CellPlanner(rule, POP).plan(target, m_rma, m_sbm)
    rng = np.random.default_rng(21)
    n = 120_000
    cells = rng.choice(POP.n_cells, size=n, p=POP.share / POP.share.sum())
    u = rng.random(n)
    values = POP.sample_values(cells, u)
    seg_rank = (cells % POP.bins + u) / POP.bins
    global_rank = np.array([POP.value_cdf(float(v)) for v in values])
    planner = RequestPlanner(rule, np.random.default_rng(22))
    strong = np.zeros(n, dtype=bool)
    rma = np.zeros(n, dtype=bool)
    control = np.zeros(n, dtype=bool)
    for i in range(n):
        plan = planner.plan(
            segment=POP.segments[POP.seg[cells[i]]], eligible=True, target=target,
            rma_multiplier=m_rma, sbm_keeps=bool(global_rank[i] >= 1.0 - m_sbm),
            sbm_available=True, rma_keeps=bool(global_rank[i] >= 1.0 - m_rma),
            value=float(values[i]), segment_rank=float(seg_rank[i]),
        )  # fmt: skip
        strong[i], rma[i], control[i] = plan.strong, plan.extra > 0, plan.control
        if plan.extra:
            assert plan.extra == want.extra
    live = ~control
    live[:WARM] = False
    assert control.mean() == pytest.approx(0.05, abs=0.005)
    for c in range(POP.n_cells):
        sel = live & (cells == c)
        m = int(sel.sum())
        assert m > 1500
        for got, w in ((strong[sel].mean(), want.sbm[c]), (rma[sel].mean(), want.rma[c])):
            # 4.5 binomial standard deviations, plus the rankers' resolution at a threshold
            assert got == pytest.approx(w, abs=0.02 + 4.5 * math.sqrt(max(w * (1 - w), 0.01) / m))
    share = POP.share / POP.share.sum()
    assert strong[live].mean() == pytest.approx(float(share @ want.sbm), abs=0.01)
    assert rma[live].mean() == pytest.approx(float(share @ want.rma), abs=0.015)


# -- a stored result (step 5) ----------------------------------------------------------------------


def test_a_stored_result_serves_a_treatment_request_only() -> None:
    assert serves_from_store(control=False, found=True)
    assert not serves_from_store(control=True, found=True)  # the holdout ranks live
    assert not serves_from_store(control=False, found=False)
    assert not serves_from_store(control=True, found=False)


def test_the_live_share_is_what_the_hits_leave() -> None:
    assert live_share([0.0, 0.25, 1.0, 1.5, -0.1, float("nan")]).tolist() == [
        1.0, 0.75, 0.0, 0.0, 1.0, 1.0,
    ]  # fmt: skip
    plan = CellPlanner(_rule(holdout=0.05), POP).plan(_target(candidates=250, coverage=0.4))
    assert plan.live(0.0) is plan
    hit = np.linspace(0.0, 1.0, POP.n_cells)
    live = plan.live(hit)
    for got, was in ((live.routed, plan.routed), (live.sbm, plan.sbm), (live.rma, plan.rma)):
        assert np.allclose(got, was * (1.0 - hit))
    assert live.extra == plan.extra
    nothing = plan.live(1.0)
    assert not nothing.sbm.any()
    assert not nothing.rma.any()
    assert not nothing.routed.any()


def test_the_requests_the_store_serves_leave_each_cells_plan_as_the_vectorised_rule_says() -> None:
    """Requests drawn from the population, each planned by the per-request planner, then looked
    up: a user's stored result does not depend on the request's value (a hit with the segment's
    probability), and a hit runs nothing of its plan live (:func:`serves_from_store`). Per
    segment, the share of treatment requests the strong model takes live and the share given RMA
    extras live are :meth:`CellPlan.live`'s."""
    rule = _rule(holdout=0.05)
    target = TargetState(1, 240, 0.3, {"premium": 0.6, "casual": 0.2}, False)
    h_seg = {"premium": 0.6, "casual": 0.25}
    hit_cells = np.array([h_seg[POP.segments[POP.seg[c]]] for c in range(POP.n_cells)])
    want = CellPlanner(rule, POP).plan(target).live(hit_cells)
    rng = np.random.default_rng(31)
    n = 60_000
    cells = rng.choice(POP.n_cells, size=n, p=POP.share / POP.share.sum())
    u = rng.random(n)
    values = POP.sample_values(cells, u)
    seg_rank = (cells % POP.bins + u) / POP.bins
    found = rng.random(n) < hit_cells[cells]
    planner = RequestPlanner(rule, np.random.default_rng(32))
    strong = np.zeros(n, dtype=bool)
    rma = np.zeros(n, dtype=bool)
    control = np.zeros(n, dtype=bool)
    for i in range(n):
        plan = planner.plan(
            segment=POP.segments[POP.seg[cells[i]]], eligible=True, target=target,
            rma_multiplier=1.0, sbm_keeps=True, sbm_available=True,
            value=float(values[i]), segment_rank=float(seg_rank[i]),
        )  # fmt: skip
        control[i] = plan.control
        if serves_from_store(control=plan.control, found=bool(found[i])):
            continue  # served from the store: nothing of the plan runs live
        strong[i], rma[i] = plan.strong, plan.extra > 0
    treat = ~control
    treat[:WARM] = False
    share = POP.share / POP.share.sum()
    for si, seg in enumerate(POP.segments):
        in_seg = POP.seg == si
        w = share * in_seg / float(share[in_seg].sum())
        sel = treat & (POP.seg[cells] == si)
        m = int(sel.sum())
        assert m > 5_000
        for got, cell_share in ((strong[sel].mean(), want.sbm), (rma[sel].mean(), want.rma)):
            x = float(w @ cell_share)
            assert got == pytest.approx(x, abs=0.015 + 4.5 * math.sqrt(x * (1 - x) / m)), seg


# -- a held target ---------------------------------------------------------------------------------


def test_a_target_is_held_only_past_its_interval_allowance() -> None:
    interval = 60.0
    fresh = HELD_AFTER_INTERVALS * interval
    # traffic fell to 1/1.6 of what the target was sized for
    assert held_scale(fresh, interval, 160.0, 100.0) == 1.0
    assert held_scale(fresh + 1.0, interval, 160.0, 100.0) == pytest.approx(1.6)
    # and rose: the shares shrink so the strong model keeps its planned rate
    assert held_scale(fresh + 1.0, interval, 100.0, 160.0) == pytest.approx(0.6)  # 0.625, down


def test_the_held_factor_is_bounded_stepped_and_1_near_equal_rates() -> None:
    old = 1000.0
    assert held_scale(old, 60.0, 100.0, 95.0) == 1.0  # within the dead band
    assert held_scale(old, 60.0, 100.0, 1.0) == HELD_MAX
    assert held_scale(old, 60.0, 1.0, 100.0) == 1.0 / HELD_MAX
    for then, now in ((0.0, 10.0), (10.0, 0.0), (math.inf, 10.0), (math.nan, 10.0)):
        assert held_scale(old, 60.0, then, now) == 1.0, (then, now)


_RATES = st.one_of(st.floats(0.0, 1e9), st.just(math.nan), st.just(math.inf))


@given(st.floats(0.0, 1e6), st.floats(1e-3, 1e4), _RATES, _RATES)
def test_the_held_factor_stays_in_its_bounds_and_steps(
    age: float, interval: float, then: float, now: float
) -> None:
    k = held_scale(age, interval, then, now)
    assert 1.0 / HELD_MAX - 1e-12 <= k <= HELD_MAX + 1e-12
    assert k == 1.0 or abs(k / HELD_STEP - round(k / HELD_STEP)) < 1e-9


def test_held_shares_scale_each_segment_and_clip_at_one() -> None:
    segments, coverage = held_shares({"casual": 0.4, "premium": 0.8}, 0.45, 1.5)
    assert segments == pytest.approx({"casual": 0.6, "premium": 1.0})
    assert coverage == pytest.approx(0.675)
    assert held_shares({"casual": 0.4}, 0.8, 2.0)[1] == 1.0


def test_the_rate_meter_reads_a_steady_rate_from_the_start_and_follows_a_drop() -> None:
    meter = RateMeter(10.0, 100.0)
    t = 100.0
    for _ in range(300):  # 3 s at 100 per second
        t += 0.01
        meter.add(t)
    assert meter.rate(t) == pytest.approx(100.0, rel=0.02)
    for _ in range(3000):  # then 60 s at 50 per second
        t += 0.02
        meter.add(t)
    assert meter.rate(t) == pytest.approx(50.0, rel=0.02)


def test_counting_a_block_at_once_is_counting_it_one_by_one() -> None:
    times = np.linspace(1.0, 30.0, 30)
    counts = np.full(30, 7.0)
    one, block = RateMeter(10.0, 0.0), RateMeter(10.0, 0.0)
    for t, n in zip(times, counts, strict=True):
        one.add(float(t), float(n))
    block.add_spread(times, counts)
    assert block.rate(31.0) == pytest.approx(one.rate(31.0))
    with pytest.raises(ConfigError, match="tau_s"):
        RateMeter(0.0, 0.0)
