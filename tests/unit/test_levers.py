"""The lever interface, the cost model, the value book, and a toy fourth lever."""

from __future__ import annotations

import dataclasses
import json
import math

import numpy as np
import pytest

from headroom.controllers.allocator import Allocator
from headroom.controllers.config import AllocatorSettings, ControlConfig, SegmentInfo, ValueSettings
from headroom.controllers.levers import (
    CapacityUse,
    CostModel,
    Lever,
    LeverContext,
    LeverRegistry,
    PrecomputeLever,
    ResourceCost,
    RmaLever,
    SbmLever,
    ShedAction,
    ValueBook,
)
from headroom.controllers.plane import ControlPlane
from headroom.controllers.testing import arm_stats, capacity, observation
from headroom.controllers.types import ArmStats

COSTS = CostModel(0.1, 0.02, 0.005, 0.1, 400, ("gpu-a", "gpu-b"), ("gpu-b",), 120.0)


class IntegrityCheckLever(Lever):
    """A toy fourth lever, defined only here: an optional integrity check per request that
    costs 5 ms of CPU and no accelerator, on the live path."""

    name = "integrity"
    use = CapacityUse.LIVE
    shed_action = ShedAction.DROP

    def unit_cost(self) -> ResourceCost:
        return ResourceCost(cpu_s=0.005, accelerator_s=0.0)

    def demand(self, ctx: LeverContext) -> float:
        return 0.5 * ctx.request_rps


def test_costs_follow_the_contract_accounting() -> None:
    assert COSTS.rma_per_candidate == ResourceCost(0.1e-3, 0.02e-3)
    assert COSTS.sbm_per_request.cpu_s == pytest.approx(400 * 0.005e-3)
    assert COSTS.sbm_per_request.accelerator_s == pytest.approx(400 * 0.1e-3)
    job = COSTS.precompute_per_job
    assert job.cpu_s == pytest.approx(400 * (0.1 + 0.005) * 1e-3)
    assert job.accelerator_s == pytest.approx(400 * 0.1e-3)
    assert COSTS.request(400, "base") == ResourceCost(pytest.approx(0.04), pytest.approx(0.008))
    with pytest.raises(ValueError, match="model"):
        COSTS.request(400, "huge")


def test_standard_levers_declare_capacity_rules() -> None:
    reg = LeverRegistry.standard(COSTS, 400, 1200, precompute=True)
    assert reg.names == ("rma", "sbm", "precompute")
    assert isinstance(reg["rma"], RmaLever)
    assert reg["rma"].hardware == ("gpu-a", "gpu-b")
    sbm = reg["sbm"]
    assert isinstance(sbm, SbmLever)
    assert sbm.min_durability_s == 120.0
    assert sbm.hardware == ("gpu-b",)
    pre = reg["precompute"]
    assert isinstance(pre, PrecomputeLever)
    assert pre.use is CapacityUse.ASYNC
    assert [lv.shed_action for lv in reg] == [
        ShedAction.TRIM_CANDIDATES,
        ShedAction.DOWNGRADE_MODEL,
        ShedAction.STOP_JOBS,
    ]
    assert "precompute" not in LeverRegistry.standard(COSTS, 400, 1200)


def test_registry_rejects_duplicates_and_is_immutable() -> None:
    reg = LeverRegistry.standard(COSTS, 400, 1200)
    with pytest.raises(ValueError, match="twice"):
        reg.with_lever(RmaLever(COSTS, 400, 1200))
    bigger = reg.with_lever(IntegrityCheckLever())
    assert "integrity" in bigger
    assert "integrity" not in reg


def test_rma_demand_stops_one_rate_limit_step_above_the_target_in_force() -> None:
    capped = RmaLever(COSTS, 400, 1200, step_headroom=40)
    assert capped.demand(LeverContext(300.0, 300.0, rma_extra_candidates=100.0)) == 300.0 * 140
    assert capped.demand(LeverContext(300.0, 300.0, rma_extra_candidates=790.0)) == 300.0 * 800
    assert RmaLever(COSTS, 400, 1200).demand(LeverContext(300.0, 300.0)) == 300.0 * 800


def test_rate_for_is_set_by_the_binding_resource() -> None:
    rma = RmaLever(COSTS, 400, 1200)
    # 1 core pays for 10,000 candidates/s, 1 device for 50,000: CPU binds
    assert rma.rate_for(1.0, 1.0) == pytest.approx(10_000)
    assert rma.rate_for(0.0, 1.0) == 0.0
    assert IntegrityCheckLever().rate_for(1.0, 0.0) == pytest.approx(200)


def test_value_estimate_is_uplift_per_unit_of_work_with_a_lower_bound() -> None:
    rng = np.random.default_rng(3)
    book = ValueBook()
    book.add(
        {
            # 200 extra candidates per treated request, as the servers report them
            ("casual", "rma", "treatment"): arm_stats(
                rng, 20_000, 1.2, 0.5, 20_000 * 200 * 0.1, 20_000 * 200 * 0.02
            ),
            ("casual", "rma", "control"): arm_stats(rng, 20_000, 1.0, 0.5),
        }
    )
    rma = RmaLever(COSTS, 400, 1200)
    ctx = LeverContext(300.0, 300.0, rma_extra_candidates=200.0)
    est = rma.estimate(book, ctx, z=1.645, min_samples=30)
    assert est.known
    assert est.mean == pytest.approx(0.2 / 200, rel=0.05)  # value per extra candidate
    assert est.lcb < est.mean < est.ucb
    assert est.se == pytest.approx(math.sqrt(0.25 / 20_000 * 2) / 200, rel=0.05)


def test_no_estimate_below_min_samples() -> None:
    book = ValueBook()
    book.add(
        {
            ("casual", "sbm", "treatment"): ArmStats(10, 12.0, 15.0),
            ("casual", "sbm", "control"): ArmStats(10, 10.0, 11.0),
        }
    )
    est = SbmLever(COSTS).estimate(book, LeverContext(1.0, 1.0), 1.645, 30)
    assert not est.known
    assert est.lcb == -math.inf


def test_segments_are_stratified_so_a_different_control_mix_cannot_bias_uplift() -> None:
    # no uplift in either segment, but control is mostly the low-value segment
    book = ValueBook()
    book.add(
        {
            ("premium", "sbm", "treatment"): ArmStats(500, 1500.0, 500 * (9 + 0.01)),
            ("premium", "sbm", "control"): ArmStats(50, 150.0, 50 * (9 + 0.01)),
            ("casual", "sbm", "treatment"): ArmStats(500, 500.0, 500 * (1 + 0.01)),
            ("casual", "sbm", "control"): ArmStats(500, 500.0, 500 * (1 + 0.01)),
        }
    )
    assert book.uplift("sbm").mean == pytest.approx(0.0, abs=1e-9)


def test_discounting_lets_the_estimate_follow_a_drift() -> None:
    rng = np.random.default_rng(5)
    book = ValueBook()
    for window in range(40):
        uplift = 0.3 if window < 20 else -0.1  # the world changes half-way
        book.decay(0.5 ** (60 / 600))  # 10-minute half-life, one-minute windows
        book.add(
            {
                ("casual", "sbm", "treatment"): arm_stats(rng, 500, 1.0 + uplift, 0.3),
                ("casual", "sbm", "control"): arm_stats(rng, 500, 1.0, 0.3),
            }
        )
    assert book.uplift("sbm").mean < 0.0


def test_value_book_snapshot_round_trips_through_json() -> None:
    rng = np.random.default_rng(1)
    book = ValueBook()
    book.add({("casual", "rma", "treatment"): arm_stats(rng, 100, 1.0, 0.2)})
    book.decay(0.7)
    again = ValueBook()
    again.restore(json.loads(json.dumps(book.snapshot())))
    assert again.snapshot() == book.snapshot()


def test_value_book_reads_the_list_of_rows_earlier_versions_stored() -> None:
    rng = np.random.default_rng(2)
    book = ValueBook()
    book.add({("casual", "rma", "treatment"): arm_stats(rng, 100, 1.0, 0.2, cpu_ms=500.0)})
    book.add({("casual", "rma", "control"): arm_stats(rng, 100, 0.9, 0.2)})
    book.add_units("rma", 100.0, 40.0)
    unit = ResourceCost(0.001, 0.0)
    assert book.per_unit("rma", unit) is not None
    rows = book.snapshot()["rows"]
    old = ValueBook()
    old.restore(json.loads(json.dumps(rows)))  # the bare list earlier versions stored
    assert old.snapshot() == book.snapshot()
    assert old.uplift("rma") == book.uplift("rma")
    # rows without the cost columns (older still) read as no cost
    bare = ValueBook()
    bare.restore([r[:6] for r in rows])
    assert bare.uplift("rma") == book.uplift("rma")
    assert bare.per_unit("rma", unit) is None
    assert bare.mean_units("rma") == book.mean_units("rma")


def test_value_book_restore_replaces_what_it_held() -> None:
    rng = np.random.default_rng(3)
    a, b = ValueBook(), ValueBook()
    a.add({("casual", "rma", "treatment"): arm_stats(rng, 100, 1.0, 0.2)})
    b.add({("premium", "sbm", "control"): arm_stats(rng, 100, 1.0, 0.2)})
    b.add_units("sbm", 10.0, 1.0)
    b.restore(a.snapshot())
    assert b.snapshot() == a.snapshot()
    assert b.mean_units("sbm") is None


def test_value_book_answers_follow_every_change_of_its_sums() -> None:
    # the book keeps its answers until its sums change: asked between every add, decay and
    # restore, it answers as a fresh book restored from its snapshot at that moment
    rng = np.random.default_rng(4)
    book = ValueBook()
    unit = ResourceCost(0.001, 0.0)
    other = ValueBook()
    other.add({("casual", "rma", "control"): arm_stats(rng, 300, 0.5, 0.2)})

    def fresh() -> ValueBook:
        again = ValueBook()
        again.restore(book.snapshot())
        return again

    for step in range(12):
        if step == 8:
            book.restore(other.snapshot())
        elif step % 3 == 2:
            book.decay(0.6)
        else:
            book.add(
                {
                    (seg, "rma", arm): _with_signal(
                        arm_stats(
                            rng, int(rng.integers(3, 60)), 1.0 + lift, 0.3, cpu_ms=200.0 * lift
                        )
                    )
                    for seg in ("casual", "premium")
                    for arm, lift in (("treatment", 0.2), ("control", 0.0))
                }
            )
        for segment in (None, "casual", "premium"):
            # a restored book adds its sums in another order: equal to the last bits or so
            for got, want in (
                (book.uplift("rma", segment), fresh().uplift("rma", segment)),
                (book.per_unit("rma", unit, segment), fresh().per_unit("rma", unit, segment)),
                (
                    book.scaled("rma", unit, _linear, segment),
                    fresh().scaled("rma", unit, _linear, segment),
                ),
            ):
                assert (got is None) == (want is None)
                if got is not None and want is not None:
                    assert dataclasses.astuple(got) == pytest.approx(
                        dataclasses.astuple(want), rel=1e-9
                    )
    assert book.scaled("rma", unit, _linear) is not None  # the signals carried value signals


def _with_signal(st: ArmStats) -> ArmStats:
    """``st`` with a value signal per request of mean 0.8, correlated with its value."""
    x_sum = 0.8 * st.n + 0.1 * (st.value_sum - st.n)
    return dataclasses.replace(
        st,
        signal_sum=x_sum,
        signal_sq_sum=x_sum * x_sum / st.n + 0.05 * st.n,
        signal_value_sum=x_sum * st.value_sum / st.n + 0.02 * st.n,
    )


def _linear(segment: str, units: float) -> float:
    return units


def _proven(lever: str, rng: np.random.Generator) -> dict[tuple[str, str, str], ArmStats]:
    # the strong model's cost per treated request, as SBM's servers report it (the integrity
    # lever's signals carry none: its estimate divides by the units book)
    cost = (5000 * 400 * 0.005, 5000 * 400 * 0.1) if lever == "sbm" else (0.0, 0.0)
    return {
        ("casual", lever, "treatment"): arm_stats(rng, 5000, 1.5, 0.3, *cost),
        ("casual", lever, "control"): arm_stats(rng, 5000, 1.0, 0.3),
    }


def test_a_fourth_lever_is_served_by_the_allocator_unchanged() -> None:
    reg = LeverRegistry.standard(COSTS, 400, 1200).with_lever(IntegrityCheckLever())
    rng = np.random.default_rng(0)
    book = ValueBook()
    book.add(_proven("integrity", rng) | _proven("sbm", rng))
    alloc = Allocator(AllocatorSettings(), ValueSettings(), reg).allocate(
        capacity(cpu=4.0, accelerator=2.0), 0.0, LeverContext(300.0, 300.0), book, 10.0
    )
    cpu, acc = alloc.budget("integrity")
    assert cpu > 0.0
    assert acc == 0.0
    # its demand (150 checks/s × 5 ms = 0.75 cores) is what it gets, no more
    assert cpu == pytest.approx(0.75)
    assert alloc.rates["integrity"] == pytest.approx(150.0)


def test_a_fourth_lever_reaches_the_targets_through_the_control_plane() -> None:
    cfg = ControlConfig(
        slo_p99_ms=200.0,
        base_candidates=400,
        max_candidates=1200,
        costs=COSTS,
        segments=(SegmentInfo("casual", 1.0),),
    )
    reg = LeverRegistry.standard(COSTS, 400, 1200).with_lever(IntegrityCheckLever())
    plane = ControlPlane(cfg, np.random.default_rng(0), levers=reg)
    rng = np.random.default_rng(1)
    t = plane.step(
        observation(
            60.0,
            capacity=capacity(cpu=4.0, accelerator=2.0),
            value=_proven("integrity", rng) | _proven("sbm", rng),
            value_age_s=5.0,
        )
    )
    shares = {s.lever: s for s in t.allocation}
    assert shares["integrity"].cpu == pytest.approx(0.75)
    assert shares["integrity"].hardware is None
    assert shares["integrity"].value_per_unit_lcb > 0.0


def test_a_costed_lever_that_did_no_work_is_unknown_not_its_noise() -> None:
    # RMA's servers report the cost of the work its treatment requests got; none at all means
    # it did no work, so treatment and control differ by noise only: unknown, to be explored
    rng = np.random.default_rng(7)
    noise = {
        ("casual", "rma", "treatment"): arm_stats(rng, 5000, 0.9, 0.5),
        ("casual", "rma", "control"): arm_stats(rng, 5000, 1.0, 0.5),
        ("casual", "precompute", "treatment"): arm_stats(rng, 5000, 1.1, 0.5),
        ("casual", "precompute", "control"): arm_stats(rng, 5000, 1.0, 0.5),
    }
    book = ValueBook()
    book.add(noise)
    ctx = LeverContext(300.0, 300.0, rma_extra_candidates=20.0, precompute_jobs_per_s=5.0)
    est = RmaLever(COSTS, 400, 1200).estimate(book, ctx, 1.645, 30)
    assert not est.known
    assert est.n_treatment == 5000  # the counts still say what was seen
    # precompute's signals never carry cost: its uplift per job serves as before
    pre = PrecomputeLever(COSTS).estimate(book, ctx, 1.645, 30)
    assert pre.known
    assert pre.mean > 0.0
    # once RMA's treatment carries cost somewhere, that stratum measures it
    book.add(
        {
            ("casual#1", "rma", "treatment"): arm_stats(rng, 5000, 1.2, 0.5, 5000 * 20 * 0.1),
            ("casual#1", "rma", "control"): arm_stats(rng, 5000, 1.0, 0.5),
        }
    )
    est = RmaLever(COSTS, 400, 1200).estimate(book, ctx, 1.645, 30)
    assert est.known
    assert est.mean == pytest.approx(0.2 / 20, rel=0.1)


def _signal_stats(y: np.ndarray, x: np.ndarray) -> ArmStats:
    return ArmStats(
        int(y.size),
        float(y.sum()),
        float((y * y).sum()),
        signal_sum=float(x.sum()),
        signal_sq_sum=float((x * x).sum()),
        signal_value_sum=float((x * y).sum()),
    )


def test_value_book_adjusts_on_the_value_signal_with_the_one_estimator() -> None:
    """With the value signal's sums (the simulator's value signals carry them), the book's
    stratum difference is the regression-adjusted one of kernel/estimate.py: a treated group
    holding a stratum's most valuable requests is compared with the control at the same value,
    and the interval narrows; snapshots keep the signal columns."""
    rng = np.random.default_rng(3)
    x = np.exp(rng.normal(0.0, 0.5, 40_000))
    y0 = 0.8 * x * rng.normal(1.0, 0.2, x.size)
    control = rng.random(x.size) < 0.05
    top = x >= np.quantile(x, 0.5)
    treated = top & ~control
    y = y0 + np.where(treated, 0.05 * x, 0.0)
    truth = float((0.05 * x[treated]).mean())
    book = ValueBook()
    book.add(
        {
            ("casual#0", "rma", "control"): _signal_stats(y[control], x[control]),
            ("casual#0", "rma", "treatment"): _signal_stats(y[treated], x[treated]),
        }
    )
    adjusted = book.uplift("rma")
    assert abs(adjusted.mean - truth) < 3 * adjusted.se
    plain = ValueBook()
    plain.add(
        {
            ("casual#0", "rma", "control"): arm_stats_of(y[control]),
            ("casual#0", "rma", "treatment"): arm_stats_of(y[treated]),
        }
    )
    naive = plain.uplift("rma")
    assert naive.mean - truth > 5 * naive.se  # the selected group looks far better than it is
    again = ValueBook()
    again.restore(json.loads(json.dumps(book.snapshot())))
    assert again.uplift("rma") == adjusted


def arm_stats_of(y: np.ndarray) -> ArmStats:
    return ArmStats(int(y.size), float(y.sum()), float((y * y).sum()))
