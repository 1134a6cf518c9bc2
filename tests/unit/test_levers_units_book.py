"""ValueBook's units book: value per unit divides by the units the book's requests received."""

from __future__ import annotations

import pytest

from controllers.levers import ValueBook
from controllers.types import ArmStats, segment_of, stratum_key


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
    again = ValueBook.restore(book.snapshot())
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
