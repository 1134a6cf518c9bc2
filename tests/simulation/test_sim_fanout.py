"""A policy's regions simulated in parallel processes give the log one process writes.

``run_policy(jobs=N)`` forks processes for groups of regions (sim/fanout.py) and writes their
events window by window, region by region: the lines must be the serial run's, bit for bit, for
every policy, with the scenario's faults in their place among the windows; a child's failure
must stop the run with the child's own exception.
"""

from __future__ import annotations

import dataclasses
import multiprocessing
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from headroom.analysis.events import encode_event
from headroom.kernel.scenario_load import load_scenario
from headroom.sim import fanout
from headroom.sim.context import SimContext
from headroom.sim.engine import run_policy
from headroom.sim.policies import POLICIES, PolicyFactory
from tests.simulation.test_sim_runs import curves_of

REPO = Path(__file__).resolve().parents[2]
FAULTS = REPO / "tests" / "integration" / "scenarios" / "faults-short.yaml"

pytestmark = pytest.mark.skipif(
    "fork" not in multiprocessing.get_all_start_methods(),
    reason="the regions' processes are forked (POSIX)",
)


def _two_regions() -> SimContext:
    """faults-short (every fault kind, one region) with a second region beside the first:
    the faults that name a region stay in the first."""
    s = load_scenario(FAULTS)
    east = s.regions[0]
    west = dataclasses.replace(east, name="it-west")
    s = dataclasses.replace(s, regions=(east, west), duration_s=120.0)
    return SimContext(s, curves_of(s))


def _run(
    ctx: SimContext,
    policy: str,
    jobs: int,
    write: Callable[[dict[str, Any]], None] = lambda _ev: None,
    **options: Any,
) -> None:
    factory = PolicyFactory(policy, ctx)
    run_policy(
        ctx,
        policy,
        factory.region,
        write,
        control_interval_s=factory.interval_s,
        jobs=jobs,
        **options,
    )


def _lines(ctx: SimContext, policy: str, jobs: int) -> list[bytes]:
    out: list[bytes] = []
    _run(ctx, policy, jobs, lambda ev: out.append(encode_event(ev)))
    return out


@pytest.mark.parametrize("policy", POLICIES)
def test_every_policy_writes_the_same_lines_in_parallel(policy: str) -> None:
    ctx = _two_regions()
    serial = _lines(ctx, policy, jobs=1)
    assert _lines(ctx, policy, jobs=2) == serial
    for region in (b'"region":"it-east"', b'"region":"it-west"'):
        assert any(region in line for line in serial)  # both regions wrote


def test_more_processes_than_regions_and_regions_dealt_in_turn() -> None:
    ctx = _two_regions()
    assert _lines(ctx, "headroom", jobs=8) == _lines(ctx, "headroom", jobs=1)
    assert fanout.groups_of(5, 2) == [[0, 2, 4], [1, 3]]
    assert fanout.groups_of(2, 8) == [[0], [1]]
    assert 1 <= fanout.default_jobs(3) <= 3
    assert fanout.default_jobs(1) == 1


def test_progress_reaches_the_end_and_never_goes_back() -> None:
    ctx = _two_regions()
    seen: list[tuple[int, int]] = []
    _run(ctx, "static", 2, progress=lambda done, total: seen.append((done, total)))
    assert seen[-1] == (ctx.n_windows, ctx.n_windows)
    assert [d for d, _ in seen] == sorted(d for d, _ in seen)


class _Broken(Exception):
    pass


@pytest.mark.parametrize("jobs", [1, 2])
def test_the_parents_own_work_runs_in_it_and_writes_before_the_regions(jobs: int) -> None:
    """``meanwhile`` (the oracle's bounds, in ``simulate``): done in the calling process, its
    events first in the log, the regions' lines as without it."""
    ctx = _two_regions()
    out: list[bytes] = []
    ran_in: list[int] = []

    def meanwhile() -> None:
        ran_in.append(os.getpid())
        out.append(b"marker")

    _run(ctx, "headroom", jobs, lambda ev: out.append(encode_event(ev)), meanwhile=meanwhile)
    assert ran_in == [os.getpid()]
    assert out[0] == b"marker"
    assert out[1:] == _lines(ctx, "headroom", jobs=1)


def test_the_parents_own_work_fails_the_run_with_its_own_exception() -> None:
    def meanwhile() -> None:
        raise _Broken("no bound")

    with pytest.raises(_Broken, match="no bound"):
        _run(_two_regions(), "static", 2, meanwhile=meanwhile)


def test_a_failing_region_stops_the_run_with_its_own_exception() -> None:
    ctx = _two_regions()
    factory = PolicyFactory("static", ctx)

    def region(c: SimContext, r: int) -> Any:
        if r == 1:
            raise _Broken("region 1 cannot start")
        return factory.region(c, r)

    with pytest.raises(_Broken, match="region 1 cannot start") as info:
        run_policy(
            ctx, "static", region, lambda _ev: None, control_interval_s=factory.interval_s, jobs=2
        )
    assert any("region group 1" in note for note in getattr(info.value, "__notes__", []))
