"""The value table's summary (``headroom.bench.bench_value.summary``): headroom's lowest capture
over every run, and its mean over the quickstart seeds with that mean's standard error."""

from __future__ import annotations

import math
from typing import Any

import pytest

from headroom.bench.bench_value import summary


def _run(capture: float | None) -> dict[str, Any]:
    return {"policies": {"headroom": {"capture_feasible": capture}}}


def test_the_seeds_mean_comes_with_its_standard_error() -> None:
    results = {
        "diurnal-3region": _run(0.95),
        "quickstart/seed 1": _run(0.88),
        "quickstart/seed 2": _run(0.90),
        "quickstart/seed 3": _run(0.92),
        "quickstart/seed 4": _run(None),  # a run without a bound is left out
    }
    s = summary(results)
    assert s["headroom_min_capture_feasible"] == pytest.approx(0.88)
    assert s["headroom_mean_capture_feasible_quickstart_seeds"] == pytest.approx(0.90)
    # sample sd 0.02 over √3
    assert s["headroom_mean_capture_feasible_quickstart_seeds_se"] == pytest.approx(
        0.02 / math.sqrt(3)
    )


def test_one_seed_or_none_has_no_standard_error() -> None:
    s = summary({"quickstart/seed 1": _run(0.9)})
    assert s["headroom_mean_capture_feasible_quickstart_seeds_se"] is None
    s = summary({"worldcup98": _run(0.94)})
    assert s["headroom_mean_capture_feasible_quickstart_seeds"] is None
    assert s["headroom_mean_capture_feasible_quickstart_seeds_se"] is None
    assert s["headroom_min_capture_feasible"] == pytest.approx(0.94)
