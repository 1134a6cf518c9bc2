"""A region's mixed replicas (headroom.defences.replicas): the rule both engines run extras by."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from headroom.defences.replicas import DEDICATED_REPLICAS, MixedReplicas, optional_units
from headroom.defences.shedding import extras_within_budget
from headroom.kernel.errors import ConfigError


def test_replicas_split_the_level_evenly() -> None:
    assert MixedReplicas().count == DEDICATED_REPLICAS == 2
    two = MixedReplicas(2)
    assert two.share == 0.5
    assert two.quota(1.5) == 0.75  # agree-precompute's local CPU: 0.75 of a core each
    assert two.quota(-1.0) == 0.0
    assert MixedReplicas(3).quota(3.0) == pytest.approx(1.0)


@pytest.mark.parametrize("count", [0, -1, 1.5, True])
def test_a_region_has_at_least_one_whole_replica(count: object) -> None:
    with pytest.raises(ConfigError, match="mixed replicas"):
        MixedReplicas(count)  # type: ignore[arg-type]


def test_an_optional_phase_runs_on_its_threads_within_what_the_quota_leaves() -> None:
    assert optional_units(4.0, 0.75) == 0.75  # the quota binds
    assert optional_units(4.0, 10.0) == 4.0  # the threads bind
    assert optional_units(4.0, 3.0, in_use=2.5) == 0.5  # other optional work holds the rest
    assert optional_units(4.0, 1.0, in_use=2.0) == 0.0  # never negative


def test_extras_run_on_the_threads_and_one_device_within_the_replicas_quota() -> None:
    two = MixedReplicas(2)
    assert two.extras_units(1.5, 2.0, 4.0) == (0.75, 1.0)
    assert two.extras_units(12.0, 1.0, 4.0) == (4.0, 0.5)  # a slice of a device
    assert two.extras_units(0.0, 0.0, 4.0) == (0.0, 0.0)


@given(
    extra=st.integers(0, 2000),
    left=st.floats(-10.0, 500.0),
    cpu=st.floats(0.0, 2.0),
    acc=st.floats(0.0, 1.0),
    cpu_level=st.floats(0.0, 20.0),
    acc_level=st.floats(0.0, 4.0),
    count=st.integers(1, 4),
)
def test_extras_that_fit_are_the_servers_trimming_rule(
    extra: int,
    left: float,
    cpu: float,
    acc: float,
    cpu_level: float,
    acc_level: float,
    count: int,
) -> None:
    """What a replica keeps is :func:`extras_within_budget` on the units its quota leaves one
    request: all of it when it fits, never more than finishes within what is left."""
    rule = MixedReplicas(count)
    units = rule.extras_units(cpu_level, acc_level, 4.0)
    n = rule.extras_that_fit(extra, left, cpu, acc, units)
    assert n == extras_within_budget(extra, left, ((cpu, units[0]), (acc, units[1])))
    assert 0 <= n <= extra
    if n > 0 and (cpu > 0 or acc > 0):
        per = (cpu / units[0] if cpu > 0 else 0.0) + (acc / units[1] if acc > 0 else 0.0)
        assert n * per <= left + 1e-6


def test_agree_precomputes_rma_request_is_trimmed_to_its_budget() -> None:
    """200 extras of 0.4 CPU ms and 0.08 device ms on 0.75 of a core and a device: 0.613 ms
    each, so ~94 ms left of a 125 ms budget after a 31 ms baseline part holds 153 of them."""
    rule = MixedReplicas(2)
    units = rule.extras_units(1.5, 2.0, 4.0)
    assert rule.extras_that_fit(200, 125.0 - 31.0, 0.4, 0.08, units) == 153
    assert rule.extras_that_fit(100, 125.0 - 31.0, 0.4, 0.08, units) == 100
