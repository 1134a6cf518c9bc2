"""The lanes in which ``make test`` runs the suite (tests/conftest.py, ``pytest --lane``)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from tests.conftest import LANES, OFFLINE, RUN_LAST, STACKS, lane_of

TESTS = Path(__file__).resolve().parent.parent
INTEGRATION = TESTS / "integration"


def test_every_module_named_in_a_lane_list_exists_and_is_named_once() -> None:
    # a renamed module would otherwise fall silently into another lane
    named = [*RUN_LAST, *OFFLINE, *(m for modules in STACKS.values() for m in modules)]
    for name in named:
        assert (INTEGRATION / name).is_file(), name
    assert len(set(named)) == len(named), named


def test_unit_and_simulation_modules_run_in_the_compute_lane() -> None:
    modules = [*TESTS.glob("unit/test_*.py"), *TESTS.glob("simulation/test_*.py")]
    assert modules
    assert {lane_of(path) for path in modules} == {"compute"}


def test_the_integration_modules_fill_every_lane_and_each_is_in_one() -> None:
    modules = sorted(INTEGRATION.glob("test_*.py"))
    lanes = Counter(lane_of(path) for path in modules)
    assert set(lanes) == set(LANES)
    assert lanes["last"] == len(RUN_LAST)
    for lane, names in STACKS.items():
        assert lanes[lane] == len(names)
    assert lane_of(INTEGRATION / "test_engines_agree.py") == "last"
    assert lane_of(INTEGRATION / "test_wheel.py") == "compute"
    assert lane_of(INTEGRATION / "test_topics.py") == "kafka"
