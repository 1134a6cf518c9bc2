"""RMA per stratum: the levels the control plane sets (controllers/allocator.py
``stratum_levels``, controllers/levers.py ``RmaCurve`` and RMA's concave tranches), the targets
field that carries them (``rma.levels``) and the one plan rule that spends them in both engines
(defences/plan.py)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from headroom.controllers.allocator import stratum_levels
from headroom.controllers.levers import (
    CostModel,
    LeverContext,
    RmaCurve,
    RmaLever,
    ValueBook,
    bin_means,
    concave_tranches,
    merge_uncontested,
)
from headroom.controllers.plane import ControlPlane
from headroom.controllers.testing import capacity, observation
from headroom.controllers.types import ArmStats, stratum_key
from headroom.defences.plan import VALUE_BINS, CellPlanner, PlanRule, RequestPlanner
from headroom.streams import messages
from headroom.workers.client import TargetBook, TargetState
from tests.unit.test_plan import POP
from tests.unit.test_plane import CFG

BASE, MAX = 400, 1200
EXTRAS = (0, 100, 200, 400, 800)


def _gain(scale: float = 1.0) -> tuple[float, ...]:
    """A concave gain: the square root of the extras, scaled."""
    return tuple(scale * math.sqrt(e) / 30.0 for e in EXTRAS)


# -- the levels -------------------------------------------------------------------------------


def test_concave_tranches_are_the_rising_hull() -> None:
    # a dip at 2 and a fall after 3: the hull skips the dip and stops where the gain stops rising
    got = concave_tranches([0, 1, 2, 3, 4], [0.0, 1.0, 1.1, 2.4, 2.0])
    assert [(a, b) for a, b, _ in got] == [(0, 1), (1, 3)]
    slopes = [s for _, _, s in got]
    assert slopes == pytest.approx([1.0, 0.7])
    assert concave_tranches([0, 1, 2], [0.0, 0.0, -1.0]) == []


def test_levels_spend_the_budget_highest_marginal_value_first() -> None:
    gain = np.outer([1.0, 2.0, 4.0, 8.0], _gain())
    share = [0.25] * 4
    for budget in (50.0, 100.0, 200.0, 400.0):
        lv = stratum_levels(budget, share, [1.0] * 4, gain, EXTRAS)
        assert lv is not None
        assert float(np.dot(share, lv)) == pytest.approx(budget)
        assert list(lv) == sorted(lv)  # a more valuable stratum never gets fewer extras
    lv = stratum_levels(400.0, share, [1.0] * 4, gain, EXTRAS)
    assert lv is not None
    assert lv.tolist() == [100.0, 200.0, 500.0, 800.0]
    # a budget the strata cannot use: every one at the span
    full = stratum_levels(10_000.0, share, [1.0] * 4, gain, EXTRAS)
    assert full is not None
    assert full.tolist() == [800.0] * 4
    assert stratum_levels(0.0, share, [1.0] * 4, gain, EXTRAS).tolist() == [0.0] * 4  # type: ignore[union-attr]


def test_no_levels_without_a_gain_to_order_by() -> None:
    assert stratum_levels(100.0, [0.5, 0.5], [1.0, 1.0], np.zeros((2, 5)), EXTRAS) is None


def test_the_strong_models_share_is_not_rmas_to_spend() -> None:
    gain = np.outer([1.0, 1.0], _gain())
    # the second stratum is all routed to the strong model: the budget goes to the first, and
    # the second is given the level of the same price (for the requests the strong model drops)
    lv = stratum_levels(100.0, [0.5, 0.5], [1.0, 0.0], gain, EXTRAS)
    assert lv is not None
    assert lv[0] == pytest.approx(200.0)
    assert lv[1] == pytest.approx(200.0)
    # a half-free stratum costs half: the same budget reaches further
    half = stratum_levels(100.0, [0.5, 0.5], [1.0, 0.5], gain, EXTRAS)
    assert half is not None
    assert 0.5 * half[0] + 0.25 * half[1] == pytest.approx(100.0)


@settings(max_examples=60, deadline=None)
@given(
    values=st.lists(st.floats(0.01, 50.0), min_size=1, max_size=12),
    budget=st.floats(0.0, 900.0),
    free=st.floats(0.05, 1.0),
)
def test_levels_are_the_budgets_optimum(values: list[float], budget: float, free: float) -> None:
    """Spent in full (or every stratum at the span), and no stratum's next extra candidate is
    worth more than the last one another stratum got (the optimum of a concave, separable
    objective under one budget)."""
    n = len(values)
    share = np.full(n, 1.0 / n)
    gain = np.outer(values, _gain())
    lv = stratum_levels(budget, share, np.full(n, free), gain, EXTRAS)
    assert lv is not None
    assert np.all(lv >= 0.0)
    assert np.all(lv <= EXTRAS[-1] + 1e-9)
    spent = float((share * free * lv).sum())
    cap = float((share * free).sum()) * EXTRAS[-1]
    assert spent == pytest.approx(min(budget, cap), rel=1e-9, abs=1e-6)

    def marginal(c: int, e: float, up: bool) -> float:
        for a, b, slope in concave_tranches(EXTRAS, gain[c]):
            if (a <= e < b) if up else (a < e <= b):
                return slope
        return 0.0 if up else math.inf

    got = [marginal(c, float(lv[c]), up=False) for c in range(n)]
    more = [marginal(c, float(lv[c]), up=True) for c in range(n)]
    assert max(more) <= min(got) * (1 + 1e-9)


def test_the_curve_is_read_from_the_worlds_measured_curves() -> None:
    class Curves:
        def mean_quality(self, segment_idx: object, model: object, n: object) -> np.ndarray:
            q = 0.5 + 0.01 * np.sqrt(np.asarray(n, dtype=float))
            return q * (1.0 if segment_idx == 0 else 2.0)

    curve = RmaCurve.from_curves(Curves(), ("premium", "casual"), BASE, MAX, steps=4)
    assert curve.extras == (0, 200, 400, 600, 800)
    assert curve.gains["premium"][0] == 0.0
    assert curve.gains["casual"][4] == pytest.approx(2 * curve.gains["premium"][4])
    assert curve.gain("premium", 100.0) == pytest.approx(0.5 * curve.gains["premium"][1])
    with pytest.raises(ValueError, match="extras"):
        RmaCurve((1, 2), {})
    with pytest.raises(ValueError, match="points"):
        RmaCurve((0, 2), {"x": (0.0,)})


# -- the plan rule ----------------------------------------------------------------------------


def test_the_rule_reads_a_segments_level_per_bin_clamped() -> None:
    rule = PlanRule(0.0, BASE, MAX)
    levels = {"casual": (0, 10, 20, 30, 40, 50, 60, 5000), "premium": (100, 900)}
    assert [rule.level(levels, "casual", k) for k in range(VALUE_BINS)] == [
        0, 10, 20, 30, 40, 50, 60, 800,
    ]  # fmt: skip
    # another length is read by rank: two entries, the lower half of the bins and the upper
    assert [rule.level(levels, "premium", k) for k in range(VALUE_BINS)] == [100] * 4 + [800] * 4
    assert rule.level(levels, "other", 3) == 0
    cells = rule.levels_by_cell(levels, ("premium", "casual"))
    assert cells.tolist() == [100] * 4 + [800] * 4 + [0, 10, 20, 30, 40, 50, 60, 800]


def _state(candidates: int, levels: dict[str, tuple[int, ...]]) -> TargetState:
    return TargetState(1, candidates, 0.3, {"premium": 0.6, "casual": 0.2}, False, levels)


LEVELS = {
    "premium": (100, 200, 300, 400, 500, 600, 700, 800),
    "casual": (0, 0, 0, 0, 50, 100, 150, 200),
}


def test_levels_need_an_rma_budget() -> None:
    rule = PlanRule(0.0, BASE, MAX)
    plan = CellPlanner(rule, POP).plan(_state(BASE, LEVELS))
    assert plan.levels is None
    assert plan.extra == 0
    assert not plan.rma.any()
    rp = RequestPlanner(rule, np.random.default_rng(1))
    got = rp.plan(
        segment="premium", eligible=False, target=_state(BASE, LEVELS), rma_multiplier=1.0,
        sbm_keeps=False, sbm_available=True, value=5.0, segment_rank=0.99,
    )  # fmt: skip
    assert got.extra == 0


@pytest.mark.parametrize("m_rma", [1.0, 0.5])
def test_the_per_request_planner_spends_the_levels_as_the_vectorised_plan_says(
    m_rma: float,
) -> None:
    """Per cell: the share of requests given extras is the vectorised plan's, and each gets its
    stratum's level; under a multiplier below 1 the lowest values lose theirs first."""
    rule = PlanRule(0.05, BASE, MAX)
    target = _state(600, LEVELS)
    want = CellPlanner(rule, POP).plan(target, m_rma, 0.8)
    assert want.levels is not None
    assert want.levels.tolist() == list(LEVELS["premium"]) + list(LEVELS["casual"])
    rng = np.random.default_rng(5)
    n = 40_000
    cells = rng.choice(POP.n_cells, size=n, p=POP.share / POP.share.sum())
    u = rng.random(n)
    values = POP.sample_values(cells, u)
    seg_rank = (cells % POP.bins + u) / POP.bins
    global_rank = np.array([POP.value_cdf(float(v)) for v in values])
    planner = RequestPlanner(rule, np.random.default_rng(6))
    rma = np.zeros(n, dtype=bool)
    live = np.zeros(n, dtype=bool)
    for i in range(n):
        c = int(cells[i])
        plan = planner.plan(
            segment=POP.segments[POP.seg[c]], eligible=True, target=target,
            rma_multiplier=m_rma, sbm_keeps=bool(global_rank[i] >= 0.2), sbm_available=True,
            rma_keeps=bool(global_rank[i] >= 1.0 - m_rma), value=float(values[i]),
            segment_rank=float(seg_rank[i]),
        )  # fmt: skip
        live[i] = not plan.control
        rma[i] = plan.extra > 0
        if plan.extra:
            assert plan.extra == want.levels[c]
    for c in range(POP.n_cells):
        sel = live & (cells == c)
        m = int(sel.sum())
        if m < 300:
            continue
        w = float(want.rma[c])
        assert rma[sel].mean() == pytest.approx(
            w, abs=0.03 + 4.5 * math.sqrt(max(w * (1 - w), 0.01) / m)
        )


# -- the targets field ------------------------------------------------------------------------


def _target_msg(**rma: object) -> messages.Target:
    return messages.Target(
        ts=100.0, region="us-east", epoch=3, ttl_s=180.0,
        rma={"candidates": 600, "base": BASE, "max": MAX, **rma},
        sbm={"coverage": 0.1, "segments": {"casual": 0.2}},
        budget={"cpu": 1.0, "accelerator": 1.0}, reason="pid",
    )  # fmt: skip


def test_the_levels_field_is_optional_on_the_wire() -> None:
    plain = _target_msg()
    assert "levels" not in messages.encode(plain).decode()
    back = messages.decode("targets", messages.encode(plain))
    assert isinstance(back, messages.Target)
    assert back.rma.levels is None
    with_levels = _target_msg(levels={"casual": [0, 50, 800]})
    raw = messages.encode(with_levels)
    assert b'"levels":{"casual":[0,50,800]}' in raw
    back = messages.decode("targets", raw)
    assert isinstance(back, messages.Target)
    assert back.rma.levels is not None
    assert tuple(back.rma.levels["casual"]) == (0, 50, 800)
    with pytest.raises(messages.ValidationError):
        messages.Target.from_dict(
            {**with_levels.to_dict(), "rma": {"candidates": 600, "base": BASE, "max": MAX,
                                               "levels": {"casual": [-1]}}}
        )  # fmt: skip


def test_the_client_applies_the_levels_until_the_target_expires() -> None:
    book = TargetBook("us-east", BASE)
    assert book.state(0.0).rma_levels == {}
    book.offer(_target_msg(levels={"casual": [0, 50, 800]}))
    assert dict(book.state(150.0).rma_levels) == {"casual": (0, 50, 800)}
    assert book.state(1000.0).rma_levels == {}  # expired: the baseline


# -- the control plane ------------------------------------------------------------------------


def _value(rng: np.random.Generator) -> dict[tuple[str, str, str], ArmStats]:
    """Proven RMA and SBM, with value signal sums per stratum (values rising with the bin)."""
    out = {}
    for seg, base in (("premium", 3.0), ("casual", 0.6)):
        for k in range(VALUE_BINS):
            key = stratum_key(seg, k)
            x = base * (0.3 + 0.2 * k)
            for lever, lift, cost in (
                ("rma", 0.05, (40_000.0, 8_000.0)),
                ("sbm", 0.2, (400.0, 8000.0)),
            ):
                for arm, n in (("treatment", 500), ("control", 100)):
                    y = x * (1.0 + (lift if arm == "treatment" else 0.0))
                    y_obs = rng.normal(y, 0.1 * y, n)
                    c = cost if arm == "treatment" else (0.0, 0.0)
                    out[(key, lever, arm)] = ArmStats(
                        n, float(y_obs.sum()), float((y_obs**2).sum()), c[0] * n / 500,
                        c[1] * n / 500, x * n, x * x * n, float((x * y_obs).sum()),
                    )  # fmt: skip
    return out


def test_the_plane_sets_levels_that_spend_the_rma_target() -> None:
    curve = RmaCurve((0, 200, 400, 800), {"premium": (0.0, 0.03, 0.045, 0.06),
                                          "casual": (0.0, 0.08, 0.12, 0.15)})  # fmt: skip
    rng = np.random.default_rng(3)
    with_curve = ControlPlane(CFG, np.random.default_rng(1), rma_curve=curve)
    without = ControlPlane(CFG, np.random.default_rng(1))
    for plane in (with_curve, without):
        for i in range(12):
            t = plane.step(
                observation(
                    60.0 * (i + 1), p99_ms=60.0, capacity=capacity(16, 2), value=_value(rng),
                    segment_rps={"premium": 45.0, "casual": 255.0}, value_age_s=5.0,
                )
            )  # fmt: skip
        assert t.rma_candidates > BASE
        if plane is without:
            assert t.rma_levels == {}
            continue
        assert set(t.rma_levels) == {"premium", "casual"}
        ev = plane.decision("us-east").event_fields()  # type: ignore[union-attr]
        assert ev["rma_levels"] == {s: list(v) for s, v in t.rma_levels.items()}
        for seg, row in t.rma_levels.items():
            assert len(row) == VALUE_BINS
            assert list(row) == sorted(row), seg  # higher value bins never get fewer extras
            assert all(0 <= e <= MAX - BASE for e in row)
        # the levels spend the target's extras per treatment request (the strong model's routed
        # share is not RMA's: the mean over the requests RMA serves is at least the budget)
        mean = sum(
            w / VALUE_BINS * e
            for seg, w in (("premium", 0.15), ("casual", 0.85))
            for e in t.rma_levels[seg]
        )
        assert mean >= (t.rma_candidates - BASE) * 0.97


def test_rmas_tranches_with_a_curve_are_concave_bands_calibrated_to_the_estimate() -> None:
    costs = CostModel(0.1, 0.02, 0.005, 0.1, BASE, ("gpu-a", "gpu-b"), ("gpu-b",), 120.0)
    curve = RmaCurve((0, 200, 400, 800), {"premium": (0.0, 0.03, 0.045, 0.06),
                                          "casual": (0.0, 0.08, 0.12, 0.15)})  # fmt: skip
    lever = RmaLever(costs, BASE, MAX, None, curve)
    plain = RmaLever(costs, BASE, MAX)
    book = ValueBook()
    book.add(_value(np.random.default_rng(4)))
    ctx = LeverContext(300.0, 300.0, 200.0, segment_rps={"premium": 45.0, "casual": 255.0})
    bands = lever.tranches(book, ctx, 1.645, 30.0)
    pooled = lever.estimate(book, ctx, 1.645, 30.0)
    assert pooled.known
    assert pooled.lcb > 0.0
    # a band per piece of every stratum's hull (3 pieces per stratum here), in value order
    assert len(bands) == 2 * VALUE_BINS * 3
    assert all(len(b.strata) == 1 and b.strata[0][1] > 0.0 for b in bands)
    lcbs = [b.estimate.lcb for b in bands]
    assert lcbs == sorted(lcbs, reverse=True)
    assert lcbs[0] > lcbs[-1]
    assert sum(b.demand for b in bands) == pytest.approx(300.0 * (MAX - BASE))
    # calibrated: the bands' value, weighted by demand, brackets the measured estimate
    assert lcbs[0] > pooled.lcb > lcbs[-1]
    assert all(b.estimate.known and b.own for b in bands)
    # without a curve (or without value signals), the per-segment tranches of today
    assert [t.segment for t in plain.tranches(book, ctx, 1.645, 30.0)] == ["casual", "premium"]
    empty = ValueBook()
    assert lever.tranches(empty, ctx, 1.645, 30.0) == plain.tranches(empty, ctx, 1.645, 30.0)


# -- exploration at random inside a segment ---------------------------------------------------


def test_a_segment_only_explored_is_routed_at_random_over_its_bins() -> None:
    rule = PlanRule(0.0, BASE, MAX)
    assert rule.sbm_shares(0.05, explore=0.05).tolist() == pytest.approx([0.05] * VALUE_BINS)
    assert rule.sbm_shares(0.04, explore=0.05).tolist() == pytest.approx([0.04] * VALUE_BINS)
    # above the floor the segment is served on merit: its highest values first, as without it
    assert rule.sbm_shares(0.25, explore=0.05).tolist() == rule.sbm_shares(0.25).tolist()
    assert rule.sbm_shares(0.05).tolist() == pytest.approx([0.0] * 7 + [0.4])
    assert [rule.sbm_share(k, 0.05, 0.05) for k in (0, 7)] == pytest.approx([0.05, 0.05])
    assert rule.sbm_share(7, 0.05) == pytest.approx(0.4)


def test_both_planners_explore_at_random_inside_the_segment() -> None:
    rule = PlanRule(0.0, BASE, MAX)
    target = TargetState(1, MAX, 0.2, {"premium": 0.05, "casual": 0.3}, False, {}, 0.05)
    routed = CellPlanner(rule, POP).routed(target).reshape(2, VALUE_BINS)
    premium = POP.segments.index("premium")
    assert routed[premium].tolist() == pytest.approx([0.05] * VALUE_BINS)
    assert routed[1 - premium].tolist() == pytest.approx(rule.sbm_shares(0.3).tolist())
    planner = RequestPlanner(rule, np.random.default_rng(9))
    top = low = 0
    n = 20_000
    for i in range(n):
        rank = 0.95 if i % 2 else 0.05  # the top bin and the lowest, alternately
        plan = planner.plan(
            segment="premium", eligible=True, target=target, rma_multiplier=1.0,
            sbm_keeps=True, sbm_available=True, value=None, segment_rank=rank,
        )  # fmt: skip
        if plan.strong:
            top += i % 2
            low += 1 - i % 2
    for got in (top, low):
        assert got / (n / 2) == pytest.approx(0.05, abs=0.01)


def test_the_floor_travels_in_the_target() -> None:
    msg = _target_msg()
    assert "explore" not in messages.encode(msg).decode()
    explored = messages.Target(
        ts=100.0, region="us-east", epoch=4, ttl_s=180.0,
        rma={"candidates": 600, "base": BASE, "max": MAX},
        sbm={"coverage": 0.1, "segments": {"casual": 0.2}, "explore": 0.05},
        budget={"cpu": 1.0, "accelerator": 1.0}, reason="pid",
    )  # fmt: skip
    back = messages.decode("targets", messages.encode(explored))
    assert isinstance(back, messages.Target)
    assert back.sbm.explore == pytest.approx(0.05)
    book = TargetBook("us-east", BASE)
    book.offer(msg)
    assert book.state(150.0).sbm_explore == 0.0
    book.offer(explored)
    assert book.state(150.0).sbm_explore == pytest.approx(0.05)
    plane = ControlPlane(CFG, np.random.default_rng(1))
    rng = np.random.default_rng(2)
    for i in range(10):
        t = plane.step(
            observation(
                60.0 * (i + 1), p99_ms=60.0, capacity=capacity(16, 2), value=_value(rng),
                segment_rps={"premium": 45.0, "casual": 255.0}, value_age_s=5.0,
            )
        )  # fmt: skip
    route = plane.decision("us-east").route  # type: ignore[union-attr]
    assert t.sbm_coverage > 0.0
    assert t.sbm_explore == pytest.approx(route.floor)
    assert t.sbm_explore > 0.0


def test_a_stratum_without_a_value_signal_yet_does_not_cost_the_levels() -> None:
    """One sparse bin (no request of it seen yet) takes its neighbours' value: the target still
    carries per-stratum levels instead of the plan's one block of maximal extras to the top
    requests."""
    curve = RmaCurve((0, 200, 400, 800), {"premium": (0.0, 0.03, 0.045, 0.06),
                                          "casual": (0.0, 0.08, 0.12, 0.15)})  # fmt: skip
    plane = ControlPlane(CFG, np.random.default_rng(1), rma_curve=curve)
    rng = np.random.default_rng(3)
    sparse = stratum_key("premium", 3)
    for i in range(12):
        value = {k: v for k, v in _value(rng).items() if k[0] != sparse}
        t = plane.step(
            observation(
                60.0 * (i + 1), p99_ms=60.0, capacity=capacity(16, 2), value=value,
                segment_rps={"premium": 45.0, "casual": 255.0}, value_age_s=5.0,
            )
        )  # fmt: skip
    assert t.rma_candidates > BASE
    assert set(t.rma_levels) == {"premium", "casual"}
    row = t.rma_levels["premium"]
    assert list(row) == sorted(row)
    assert row[2] <= row[3] <= row[4]


def test_a_sparse_bin_takes_its_nearest_known_bins() -> None:
    k = VALUE_BINS
    known = {stratum_key("s", 1): 1.0, stratum_key("s", 4): 4.0}
    row = bin_means(known, "s")
    assert row is not None
    assert row[:6] == [1.0, 1.0, 2.5, 2.5, 4.0, 4.0]
    assert row[6:] == [4.0] * (k - 6)
    full = {stratum_key("s", i): float(i) for i in range(k)}
    assert bin_means(full, "s") == [float(i) for i in range(k)]
    assert bin_means(known, "other") is None


def test_bands_merge_where_no_other_lever_serves_their_stratum() -> None:
    costs = CostModel(0.1, 0.02, 0.005, 0.1, BASE, ("gpu-a", "gpu-b"), ("gpu-b",), 120.0)
    curve = RmaCurve((0, 200, 400, 800), {"premium": (0.0, 0.03, 0.045, 0.06),
                                          "casual": (0.0, 0.08, 0.12, 0.15)})  # fmt: skip
    lever = RmaLever(costs, BASE, MAX, None, curve)
    book = ValueBook()
    book.add(_value(np.random.default_rng(4)))
    ctx = LeverContext(300.0, 300.0, 200.0, segment_rps={"premium": 45.0, "casual": 255.0})
    bands = lever.tranches(book, ctx, 1.645, 30.0)
    contested = {stratum_key("casual", k) for k in range(VALUE_BINS)}
    merged = merge_uncontested(bands, contested, 8)
    # the casual pieces stay alone; the premium ones merge into bands of >= 1/8 of the demand
    alone = [t for t in bands if t.strata[0][0] in contested]
    assert [t for t in merged if any(k in contested for k, _ in t.strata)] == alone
    premium = [t for t in merged if t not in alone]
    assert len(premium) < len([t for t in bands if t not in alone])
    assert sum(t.demand for t in merged) == pytest.approx(sum(t.demand for t in bands))
    # a merged band is worth its parts' demand-weighted value and treats their requests: the
    # totals over the premium bands are those of the pieces, and the order is kept
    pieces = [t for t in bands if t not in alone]
    for get in (lambda t: t.estimate.lcb, lambda t: sum(r for _, r in t.strata)):
        assert sum(get(t) * t.demand for t in premium) == pytest.approx(
            sum(get(t) * t.demand for t in pieces)
        )
    order = [t.segment for t in bands]
    assert [order.index(t.segment) for t in merged] == sorted(
        order.index(t.segment) for t in merged
    )
    # nothing contested: the bands of before, at most 8
    assert len(merge_uncontested(bands, set(), 8)) <= 8
