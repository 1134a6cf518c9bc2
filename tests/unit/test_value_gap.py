"""The value-gap decomposition (``headroom.bench.value_gap``): each window of the policy falls in
one phase, and the phases add up to oracle − policy, read from an event log."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from headroom.analysis.events import EventWriter
from headroom.bench.value_gap import PHASES, decompose
from headroom.kernel.scenario_load import load_scenario

ROOT = Path(__file__).resolve().parents[2]
T0 = 1_796_000_000.0


def _window(policy: str, t: float, rma: float, *, candidates: int = 500) -> dict[str, Any]:
    return {
        "kind": "window", "ts": T0 + t + 10.0, "policy": policy, "region": "us-east",
        "t_start": t, "t_end": t + 10.0, "inc": {"rma": rma, "sbm": 0.0, "precompute": 0.0},
        "value_lost": 0.0, "targets": {"rma_candidates": candidates, "sbm_coverage": 0.0},
    }  # fmt: skip


def _issued(t: float, explored: list[str]) -> dict[str, Any]:
    return {
        "kind": "target.issued", "ts": T0 + t, "policy": "headroom", "region": "us-east",
        "explored": explored,
    }  # fmt: skip


def test_every_window_falls_in_one_phase_and_the_phases_add_up(tmp_path: Path) -> None:
    # quickstart: a preempt at 1,800 s and a grant at 2,000 s (strong model load 120 s, control
    # interval 60 s), a control outage from 3,000 s for 400 s (targets live 180 s)
    scenario = load_scenario(ROOT / "scenarios" / "quickstart.yaml")
    path = tmp_path / "events.jsonl"
    events = [
        {"kind": "run.started", "ts": T0, "policy": None, "t0": T0},
        {"kind": "oracle.bound", "ts": T0, "policy": "oracle", "feasible_bound": 100.0},
        _issued(60.0, []),
        _issued(600.0, ["rma"]),  # RMA unproven from 600 s
        _issued(700.0, ["precompute"]),  # proven again (an asynchronous lever is not live)
        _issued(2940.0, []),  # the last targets before the outage: they live until 3,120 s
        _issued(3460.0, []),  # the first after it: the regain
    ]
    expected = {
        0.0: "start-up",  # the baseline's targets still
        100.0: "steady",
        650.0: "learning",
        900.0: "steady",
        2100.0: "after capacity change",  # the grant's load and two intervals
        3050.0: "steady",  # in the outage, but the targets of 2,940 s are still in force
        3200.0: "outage",  # they have expired: the fail-safe
        3450.0: "outage",  # after the outage, before the policy's first targets
        3500.0: "steady",  # regained
    }
    for t in expected:
        candidates = 400 if t == 0.0 else 500
        events.append(_window("headroom", t, 1.0, candidates=candidates))
        events.append(_window("oracle", t, 3.0))
    events.append(_window("headroom", 1000.0, 1.0))  # no oracle window: not compared
    with EventWriter(path) as w:
        for e in events:
            w.write(e)
    gap, totals = decompose(scenario, path, "headroom", 400)
    assert list(gap) == list(PHASES)
    for phase in PHASES:
        n = sum(1 for p in expected.values() if p == phase)
        assert gap[phase]["rma"] == pytest.approx(2.0 * n), phase
    assert totals["policy"] == pytest.approx(len(expected))
    assert totals["oracle"] == pytest.approx(3.0 * len(expected))
    assert totals["rma"] == pytest.approx(totals["oracle"] - totals["policy"])
    assert totals["feasible_bound"] == 100.0


def test_an_outage_without_targets_after_it_lasts_a_lifetime_and_an_interval(
    tmp_path: Path,
) -> None:
    # no targets before it nor after it: the fail-safe from the outage's start until one
    # interval and a target lifetime after its end (quickstart: 3,000 + 400 + 180 + 60 s)
    scenario = load_scenario(ROOT / "scenarios" / "quickstart.yaml")
    path = tmp_path / "events.jsonl"
    events: list[dict[str, Any]] = [
        {"kind": "run.started", "ts": T0, "policy": None, "t0": T0},
        _window("headroom", 0.0, 1.0),  # targets other than the baseline's from the start
        _window("oracle", 0.0, 1.0),
    ]
    phases = {2990.0: "steady", 3000.0: "outage", 3630.0: "outage", 3640.0: "steady"}
    for t in phases:
        events += [_window("headroom", t, 1.0), _window("oracle", t, 2.0)]
    with EventWriter(path) as w:
        for e in events:
            w.write(e)
    gap, _ = decompose(scenario, path, "headroom", 400)
    for phase in ("outage", "steady"):
        n = sum(1 for p in phases.values() if p == phase)
        assert gap[phase]["rma"] == pytest.approx(float(n)), phase
