"""A derived scenario simulates like its recording: ``simulate BASE --replay REC`` and
``simulate`` of the scenario ``scenario from-recording REC --base BASE`` writes give the same
median incremental value over seeds 1–5.

The recording is ten minutes of a "production" fleet whose segment mix and request values are
not the base scenario's (35 % premium requests worth 5.0 on average instead of 20 % worth 3.0):
what ``headroom feed`` publishes for it (:func:`headroom.sim.replay.write_feed_recording`: the
feed's own schedule, stamped as a feed at speed 1 stamps it, no broker needed). The derived
scenario carries the recorded segment shares, a log-normal fit of each segment's values and the
recorded arrivals per second; what it cannot carry (the values' exact histogram: the replay
simulates the recorded values, the derived scenario their log-normal fit) is the remaining
difference.

The seed sets, in both runs alike, the ranking world (the value curves of RMA and SBM) and the
engine's random streams (segment counts per window, the holdout, latency samples, the value
signals the controllers learn from): across seeds the ten-minute incremental value of headroom
spans a factor of ~3, which is why the comparison is of medians over five seeds.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from headroom.commands.sim_replay import write_derived
from headroom.kernel.scenario import Scenario
from headroom.kernel.scenario_load import load_scenario_text
from headroom.sim.replay import replay_context, write_feed_recording
from headroom.sim.replay_read import Recording, read_replay
from headroom.sim.run import run_simulation
from headroom.world.curves import curves_for

BASE = """
name: base
seed: 21
duration_s: 600
slo: {p99_ms: 200, window_s: 10}
world: {ads: 4000, dim: 16, base_candidates: 200, max_candidates: 600, holdout: 0.05}
models:
  base:   {cpu_ms_per_candidate: 0.1,   accelerator_ms_per_candidate: 0.02,
           hardware: [gpu-a, gpu-b]}
  strong: {cpu_ms_per_candidate: 0.005, accelerator_ms_per_candidate: 0.1,
           hardware: [gpu-b], load_s: 30}
segments:
  - {name: premium, share: 0.2, value: {mean: 3.0, sigma: 0.8}, base_error: 0.15,
     strong_error: 0.10}
  - {name: casual,  share: 0.8, value: {mean: 0.6, sigma: 0.6}, base_error: 0.50,
     strong_error: 0.20}
regions:
  - name: r1
    dedicated: {cpu: 12, accelerator: 2, hardware: gpu-a}
    traffic: {rps: 100, noise: 0.05}
    opportunistic:
      - {resource: cpu,         hardware: any,   trace: [[0, 6], [200, 12], [450, 3]]}
      - {resource: accelerator, hardware: gpu-b, trace: [[0, 2]], expires_in_s: 600}
events:
  - {at_s: 250, kind: preempt, region: r1, resource: accelerator, hardware: gpu-b, units: 0}
  - {at_s: 330, kind: grant,   region: r1, resource: accelerator, hardware: gpu-b, units: 2}
  - {at_s: 480, kind: surge,   region: r1, factor: 1.5, duration_s: 60}
"""
# the fleet recorded: the base with another segment mix and other values
PRODUCTION = (
    BASE.replace("name: base", "name: production")
    .replace(
        "share: 0.2, value: {mean: 3.0, sigma: 0.8}", "share: 0.35, value: {mean: 5.0, sigma: 1.1}"
    )
    .replace(
        "share: 0.8, value: {mean: 0.6, sigma: 0.6}", "share: 0.65, value: {mean: 0.3, sigma: 0.9}"
    )
)
SEEDS = (1, 2, 3, 4, 5)


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    tmp = tmp_path_factory.mktemp("replay-derived")
    base = load_scenario_text(BASE)
    production = load_scenario_text(PRODUCTION)
    assert production.segments != base.segments
    path = tmp / "day.jsonl"
    with path.open("wb") as f:
        write_feed_recording(production, f)
    recording = read_replay(path, [s.name for s in base.segments])
    derived = write_derived(base, recording, tmp / "derived" / "day.yaml")
    replayed: list[float] = []
    simulated: list[float] = []
    for seed in SEEDS:
        curves = curves_for(base, seed=seed)
        scenario, ctx = replay_context(base, path, seed=seed, curves=curves)
        a = run_simulation(scenario, ["headroom"], tmp / f"r{seed}", context=ctx, plots=False)
        b = run_simulation(
            derived, ["headroom"], tmp / f"d{seed}", seed=seed, curves=curves, plots=False
        )
        replayed.append(_incremental(a))
        simulated.append(_incremental(b))
    return {
        "base": base,
        "production": production,
        "recording": recording,
        "derived": derived,
        "replay": replayed,
        "simulated": simulated,
    }


def _incremental(run: Any) -> float:
    return float(run.metrics["policies"]["headroom"]["value"]["incremental"])


def test_the_derived_scenario_carries_the_recorded_mix_values_and_arrivals(
    runs: dict[str, Any],
) -> None:
    rec: Recording = runs["recording"]
    derived: Scenario = runs["derived"]
    production: Scenario = runs["production"]
    n = rec.requests
    counts = rec.value_counts.sum(axis=1)
    for s, seg in enumerate(derived.segments):
        assert seg.share == counts[s] / n  # exactly the replay's share
        truth = production.segments[s]
        # a draw of n·share requests from the production's log-normal: 4 standard errors
        k = counts[s]
        sd_mean = truth.value.mean * np.sqrt(np.expm1(truth.value.sigma**2) / k)
        assert abs(seg.value.mean - truth.value.mean) <= 4 * sd_mean
        assert abs(seg.value.sigma - truth.value.sigma) <= 4 * truth.value.sigma / np.sqrt(2 * k)
    arrivals = derived.regions[0].traffic.arrivals
    assert arrivals is not None
    assert [int(c) for _, c in arrivals] == rec.arrivals["r1"].tolist()


def test_median_incremental_value_of_the_derived_scenario_is_within_10_percent_of_the_replay(
    runs: dict[str, Any],
) -> None:
    replay = float(np.median(runs["replay"]))
    derived = float(np.median(runs["simulated"]))
    assert replay > 0
    assert abs(derived - replay) <= 0.10 * replay, (runs["replay"], runs["simulated"])
