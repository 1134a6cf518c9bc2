"""The rule for a control step between ticks (controllers/react.py) and its settings."""

from __future__ import annotations

import itertools
import math
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from headroom.controllers.config import ControlConfig
from headroom.controllers.plane import ControlPlane
from headroom.controllers.react import ReactSettings, material_change, reacts, spaced
from headroom.controllers.types import CapacityLevel, RegionObservation
from headroom.kernel.errors import ConfigError
from headroom.kernel.scenario_load import load_scenario

ROOT = Path(__file__).resolve().parents[2]


def _levels(cpu: float, gpu_b: float, remote: float = 0.0) -> list[CapacityLevel]:
    return [
        CapacityLevel("cpu", "any", "dedicated", 24.0),
        CapacityLevel("accelerator", "gpu-a", "dedicated", 4.0),
        CapacityLevel("cpu", "any", "opportunistic", cpu),
        CapacityLevel("accelerator", "gpu-b", "opportunistic", gpu_b),
        CapacityLevel("accelerator", "gpu-r", "opportunistic", remote, remote=True),
    ]


def test_a_tenth_of_the_resource_is_material_and_less_is_not() -> None:
    assert material_change(_levels(10, 2), _levels(9, 2), 0.1)  # 1 of 10 cores
    assert not material_change(_levels(10, 2), _levels(9.5, 2), 0.1)
    assert material_change(_levels(10, 2), _levels(10, 1.5), 0.1)  # a quarter of the devices
    assert material_change(_levels(9, 2), _levels(10, 2), 0.1)  # rises count as falls do
    assert not material_change(_levels(10, 2), _levels(10, 2), 0.1)


def test_a_pool_that_appears_or_disappears_is_material_whatever_its_size() -> None:
    big = [CapacityLevel("cpu", "any", "opportunistic", 100.0)]
    small = CapacityLevel("cpu", "arm", "opportunistic", 0.5)
    assert material_change(big, [*big, small], 0.1)
    assert material_change([*big, small], big, 0.1)
    assert material_change(
        [*big, small], [*big, CapacityLevel("cpu", "arm", "opportunistic", 0.0)], 0.1
    )


def test_dedicated_levels_and_remote_pools_without_precompute_are_ignored() -> None:
    before, after = _levels(10, 2), _levels(10, 2)
    after[0] = CapacityLevel("cpu", "any", "dedicated", 1.0)
    assert not material_change(before, after, 0.1)
    assert not material_change(_levels(10, 2, 0.0), _levels(10, 2, 3.0), 0.1)
    assert material_change(_levels(10, 2, 0.0), _levels(10, 2, 3.0), 0.1, remote_ok=True)


def test_spacing_from_the_previous_step_and_the_next_tick() -> None:
    # ticks every 60 s from t0 = 5: an extra step keeps 15 s from both
    assert spaced(5 + 80.0, 5 + 60.0, 60.0, 0.25, t0=5.0)
    assert not spaced(5 + 70.0, 5 + 60.0, 60.0, 0.25, t0=5.0)  # 10 s after the last step
    assert not spaced(5 + 110.0, 5 + 60.0, 60.0, 0.25, t0=5.0)  # 10 s before the next tick
    assert not spaced(5 + 120.0, 5 + 60.0, 60.0, 0.25, t0=5.0)  # a tick is the regular step
    assert spaced(5 + 105.0, 5 + 60.0, 60.0, 0.25, t0=5.0)  # exactly 15 s before the tick
    assert spaced(5 + 80.0, None, 60.0, 0.25, t0=5.0)
    assert not spaced(math.nan, 0.0, 60.0, 0.25)
    assert not spaced(30.0, 0.0, 0.0, 0.25)


@settings(max_examples=200, deadline=None)
@given(
    changes=st.lists(st.floats(0.0, 600.0, allow_nan=False), max_size=40),
    gap_share=st.floats(0.05, 0.5),
    interval=st.sampled_from([10.0, 30.0, 60.0]),
)
def test_extra_steps_are_rate_limited_and_keep_away_from_ticks(
    changes: list[float], gap_share: float, interval: float
) -> None:
    """On a manual clock, every change material: the steps (ticks and extras) that the rule
    makes are never closer than the gap, except a tick after an extra step — which the rule
    keeps a gap away from too."""
    rule = ReactSettings(min_gap_share=gap_share)
    gap = gap_share * interval
    events = sorted({round(t, 3) for t in changes} | {k * interval for k in range(1, 11)})
    last: float | None = None
    extras: list[float] = []
    for t in events:
        if abs(t / interval - round(t / interval)) < 1e-9 and t > 0:
            last = t  # a regular tick
            continue
        if reacts(rule, interval, t, last, _levels(10, 0), _levels(10, 2)):
            extras.append(t)
            last = t
    steps = sorted(set(extras) | {k * interval for k in range(1, 11)})
    for a, b in itertools.pairwise(steps):
        assert b - a >= gap - 1e-6, (a, b)
    per_interval = np.bincount(np.floor(np.array(extras) / interval).astype(int)) if extras else [0]
    assert max(per_interval) <= math.floor(1.0 / gap_share)


def test_disabled_never_reacts() -> None:
    off = ReactSettings(enabled=False)
    assert not reacts(off, 60.0, 30.0, 0.0, _levels(10, 0), _levels(10, 2))
    assert reacts(ReactSettings(), 60.0, 30.0, 0.0, _levels(10, 0), _levels(10, 2))


def _config(**overrides: object) -> ControlConfig:
    return ControlConfig.from_scenario(
        load_scenario(ROOT / "scenarios" / "quickstart.yaml"), **overrides
    )


def test_settings_are_validated_with_their_field_path() -> None:
    assert _config().react == ReactSettings()
    assert _config(react={"min_change_share": 0.2}).react.min_change_share == 0.2
    with pytest.raises(ConfigError, match=r"control\.react\.min_change_share"):
        _config(react={"min_change_share": 0.0})
    with pytest.raises(ConfigError, match=r"control\.react\.min_gap_share"):
        _config(react={"min_gap_share": 1.5})
    with pytest.raises(ConfigError, match=r"control\.react\.enabled"):
        _config(react={"enabled": "yes"})
    with pytest.raises(ConfigError, match=r"control\.react\.nope"):
        _config(react={"nope": 1})


def test_the_plane_reacts_only_to_a_region_it_has_stepped() -> None:
    plane = ControlPlane(_config(), np.random.default_rng(0))
    assert not plane.reacts("r", 30.0, _levels(10, 0), _levels(10, 2))
    plane.step(
        RegionObservation(
            region="r",
            now=60.0,
            window_s=60.0,
            p99_ms={"all": 100.0},
            request_rps=100.0,
            eligible_rps=100.0,
            segment_rps={},
            capacity=tuple(_levels(10, 0)),
        )
    )
    assert plane.reacts("r", 90.0, _levels(10, 0), _levels(10, 2))
    assert not plane.reacts("r", 70.0, _levels(10, 0), _levels(10, 2))  # too soon
    assert not plane.reacts("r", 90.0, _levels(10, 2), _levels(10, 2))  # no change
