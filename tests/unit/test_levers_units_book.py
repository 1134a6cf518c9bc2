"""ValueBook's units book: value per unit divides by the units the book's requests received."""

from __future__ import annotations

import pytest

from headroom.controllers.levers import ValueBook
from headroom.controllers.types import ArmStats, segment_of, stratum_key


def test_mean_units_follows_the_discounted_mix_of_targets_in_force() -> None:
    book = ValueBook()
    assert book.mean_units("rma") is None
    book.add_units("rma", 100.0, 400.0)
    book.decay(0.5)
    book.add_units("rma", 100.0, 100.0)
    # weights 50 and 100: (50·400 + 100·100) / 150
    assert book.mean_units("rma") == pytest.approx(200.0)
    book.add_units("rma", 0.0, 1e9)  # nothing treated: nothing recorded
    book.add_units("rma", 10.0, float("nan"))
    assert book.mean_units("rma") == pytest.approx(200.0)


def test_units_survive_a_snapshot_round_trip() -> None:
    book = ValueBook()
    book.add({("casual", "rma", "treatment"): ArmStats(50, 30.0, 25.0)})
    book.add_units("rma", 50.0, 320.0)
    again = ValueBook()
    again.restore(book.snapshot())
    assert again.mean_units("rma") == pytest.approx(320.0)
    assert again.snapshot() == book.snapshot()


def test_strata_fold_into_their_segment() -> None:
    assert stratum_key("casual", None) == "casual"
    assert segment_of(stratum_key("casual", 3)) == "casual"
    book = ValueBook()
    for k in range(4):
        key = stratum_key("casual", k)
        book.add({(key, "sbm", "treatment"): ArmStats(40, 40.0 * (k + 1.1), 60.0 * (k + 1.5) ** 2)})
        book.add({(key, "sbm", "control"): ArmStats(40, 40.0 * k, 40.0 * (k + 0.5) ** 2)})
    assert book.segments("sbm") == ["casual"]
    up = book.uplift("sbm", "casual")
    assert up.n_treatment == 160
    assert up.mean == pytest.approx(1.1)  # every stratum's difference of means is 1.1
    assert book.uplift("sbm") == up


def test_per_unit_value_uses_only_strata_where_the_lever_did_work() -> None:
    from headroom.controllers.levers import ResourceCost

    unit = ResourceCost(cpu_s=0.0001, accelerator_s=0.00002)  # one RMA candidate
    book = ValueBook()
    assert book.per_unit("rma", unit) is None  # nothing yet
    # a stratum without work: pure noise, a large spurious difference
    book.add({("casual#0", "rma", "treatment"): ArmStats(1000, 900.0, 1000.0)})
    book.add({("casual#0", "rma", "control"): ArmStats(100, 50.0, 60.0)})
    assert book.per_unit("rma", unit) is None  # no cost anywhere: the other estimate serves
    # a stratum where 1000 requests got 100 extra candidates each (10 ms CPU apiece)
    book.add({("casual#7", "rma", "treatment"): ArmStats(1000, 1100.0, 1400.0, 10_000.0, 2_000.0)})
    book.add({("casual#7", "rma", "control"): ArmStats(100, 100.0, 120.0)})
    est = book.per_unit("rma", unit)
    assert est is not None
    # d = 1.1 − 1.0 per treated request over 100 candidates each: 0.001 per candidate
    assert est.mean == pytest.approx(0.001)
    assert est.n_treatment == 1000  # the stratum without work is left out
    assert 0.0 < est.se < 0.01


def test_per_unit_weights_strata_by_precision() -> None:
    from headroom.controllers.levers import ResourceCost

    unit = ResourceCost(cpu_s=0.0001, accelerator_s=0.0)
    book = ValueBook()
    # two strata, the same per-unit value 0.001; one far noisier (larger value spread)
    for key, q_t, q_c in (("a#1", 1300.0, 110.0), ("a#2", 200_000.0, 20_000.0)):
        book.add({(key, "rma", "treatment"): ArmStats(1000, 1100.0, q_t, 10_000.0, 0.0)})
        book.add({(key, "rma", "control"): ArmStats(100, 100.0, q_c)})
    est = book.per_unit("rma", unit)
    assert est is not None
    assert est.mean == pytest.approx(0.001)
    quiet = ValueBook()
    quiet.add({("a#1", "rma", "treatment"): ArmStats(1000, 1100.0, 1300.0, 10_000.0, 0.0)})
    quiet.add({("a#1", "rma", "control"): ArmStats(100, 100.0, 110.0)})
    alone = quiet.per_unit("rma", unit)
    assert alone is not None
    assert est.se <= alone.se  # a noisy stratum never makes the estimate less precise


def test_precompute_value_per_job_counts_every_job_run_not_one_per_request() -> None:
    from headroom.controllers.levers import CostModel, LeverContext, PrecomputeLever, RmaLever

    costs = CostModel(0.1, 0.02, 0.005, 0.1, 400, ("gpu-a", "gpu-b"), ("gpu-b",), 120.0)
    ctx = LeverContext(100.0, 100.0, rma_extra_candidates=50.0, precompute_jobs_per_s=10.0)
    pre = PrecomputeLever(costs)
    # 300 hits in a minute while 10 jobs/s ran: 600 jobs behind them, 2 per hit
    assert pre.work_in_window(ctx, 60.0, 300.0) == pytest.approx(600.0)
    rma = RmaLever(costs, 400, 1200)
    assert rma.work_in_window(ctx, 60.0, 300.0) == pytest.approx(300.0 * 50.0)


def test_no_work_on_record_gives_no_units() -> None:
    book = ValueBook()
    book.add_units("precompute", 100.0, 0.0)  # hits while no job ran in the window
    assert book.mean_units("precompute") is None
