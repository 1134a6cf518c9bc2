"""The from-recording round trip, closed loop: a recording simulated with ``--replay`` and the
scenario ``scenario from-recording`` derives from it, simulated, agree.

The recording is what ``headroom feed`` publishes for a ten-minute scenario with a capacity
step-up, a preemption, a grant and a traffic surge
(:func:`headroom.sim.replay.write_feed_recording`: the feed's own schedule, stamped as a feed at
speed 1 stamps it — no broker needed here; the integration tests record a real feed).

What differs between the two runs, and the tolerance it earns:

* arrivals — none: the replay's per-step counts are the recording's, and so are the derived
  scenario's (its ``traffic.arrivals``, the recorded count of every second);
* request values and segments — the replay's cells hold the recorded values (a 0.5 % log
  grid); the derived scenario's hold a log-normal fit of them with the recorded segment shares:
  the baseline value agrees within 2 %;
* capacity — the same level traces: offered unit-seconds agree to 1e-9;
* the oracle bound depends on arrivals, values and capacity only: within 2 %;
* a closed-loop policy (headroom) reacts to every one of those differences through its
  controllers; across seeds of the *same* scenario its ten-minute incremental value spans a
  factor of 3.5 (it decides within minutes which lever pays): a factor of 4.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest

from headroom.analysis.events import EventLog
from headroom.commands.sim_replay import write_derived
from headroom.kernel.scenario import Scenario
from headroom.kernel.scenario_load import load_scenario_text
from headroom.sim.replay import replay_context, write_feed_recording
from headroom.sim.replay_read import Recording, read_replay
from headroom.sim.run import run_simulation
from headroom.world.curves import curves_for
from tests.simulation.replay_scenario import replay_scenario_text

SCENARIO = replay_scenario_text("roundtrip")
POLICIES = ["static", "headroom", "oracle"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    tmp = tmp_path_factory.mktemp("replay-roundtrip")
    base = load_scenario_text(SCENARIO)
    path = tmp / "day.jsonl"
    with path.open("wb") as f:
        write_feed_recording(base, f)
    curves = curves_for(base)
    recording = read_replay(path, [s.name for s in base.segments])
    derived = write_derived(base, recording, tmp / "derived" / "day.yaml")
    scenario, ctx = replay_context(base, path, curves=curves)
    replayed = run_simulation(scenario, POLICIES, tmp / "replay", context=ctx, plots=False)
    simulated = run_simulation(derived, POLICIES, tmp / "derived-run", curves=curves, plots=False)
    return {
        "base": base,
        "recording": recording,
        "replay": replayed,
        "derived": simulated,
        "ctx": ctx,
    }


def _policy(run: Any, name: str) -> dict[str, Any]:
    policies: dict[str, Any] = run.metrics["policies"]
    return dict(policies[name])


def test_replay_and_derived_runs_are_complete(runs: dict[str, Any]) -> None:
    for name in ("replay", "derived"):
        for policy in POLICIES:
            m = _policy(runs[name], policy)
            assert m["complete"] is True, (name, policy, m["completeness"])


@pytest.mark.parametrize("policy", POLICIES)
def test_replay_and_the_derived_scenario_see_the_same_requests_and_capacity(
    runs: dict[str, Any], policy: str
) -> None:
    rec: Recording = runs["recording"]
    a, b = _policy(runs["replay"], policy), _policy(runs["derived"], policy)
    n = rec.requests
    assert a["requests"]["total"] == n
    assert b["requests"]["total"] == n
    for resource in ("cpu", "accelerator"):
        assert a["capacity"]["offered_unit_s"][resource] == pytest.approx(
            b["capacity"]["offered_unit_s"][resource], rel=1e-9
        )
    assert a["value"]["baseline"] == pytest.approx(b["value"]["baseline"], rel=0.02)
    assert a["value"]["oracle_incremental"] == pytest.approx(
        b["value"]["oracle_incremental"], rel=0.02
    )
    assert a["duration_s"] == pytest.approx(rec.span_s)


def test_closed_loop_value_agrees_within_the_stated_tolerance(runs: dict[str, Any]) -> None:
    a, b = _policy(runs["replay"], "headroom"), _policy(runs["derived"], "headroom")
    assert a["value"]["incremental"] > 0
    assert b["value"]["incremental"] > 0
    # headroom learns which lever pays within minutes, so in ten minutes its split between RMA
    # and SBM — and its value — turns on the first few value signals: across seeds 1–6 of this
    # very scenario it earned 511 to 1,810 (measured with `headroom simulate` on the SCENARIO
    # text). Two resamplings of the same inputs agree to within that spread, not better.
    ratio = a["value"]["incremental"] / b["value"]["incremental"]
    assert 1 / 4 <= ratio <= 4
    # 60 SLO windows per run; closed-loop feedback makes violations bursty
    assert abs(a["slo"]["violation_fraction"] - b["slo"]["violation_fraction"]) <= 0.15
    for p in ("static",):
        assert _policy(runs["replay"], p)["value"]["incremental"] == 0
        assert _policy(runs["derived"], p)["value"]["incremental"] == 0


def test_every_policy_saw_the_recorded_arrivals_and_levels_window_by_window(
    runs: dict[str, Any],
) -> None:
    rec: Recording = runs["recording"]
    base: Scenario = runs["base"]
    window = base.slo.window_s
    per_step = rec.arrivals["r1"]
    n_windows = math.ceil(rec.span_s / window - 1e-9)
    steps_per_window = round(window / rec.step_s)
    expected = [
        int(per_step[w * steps_per_window : (w + 1) * steps_per_window].sum())
        for w in range(n_windows)
    ]
    pools = rec.pools["r1"]

    def level_before(t: float) -> dict[str, float]:
        out = {"cpu": 0.0, "accelerator": 0.0}
        for p in pools:
            pts = np.array(p.points)
            i = int(np.searchsorted(pts[:, 0], t, side="left")) - 1
            out[p.key.resource] += float(pts[i, 1]) if i >= 0 else 0.0
        return out

    log = EventLog(runs["replay"].events_path)
    for policy in POLICIES:
        windows = [
            e
            for e in log
            if e.get("kind") == "window" and e.get("policy") == policy and e.get("region") == "r1"
        ]
        assert [w["requests"] for w in windows] == expected
        for w, ev in enumerate(windows):
            t1 = min((w + 1) * window, rec.span_s)
            assert ev["capacity"] == pytest.approx(level_before(t1))
