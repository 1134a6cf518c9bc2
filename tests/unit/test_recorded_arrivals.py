"""The optional ``traffic.arrivals`` field: recorded arrivals per second, loaded, checked and
simulated as counts (kernel/traces.py), scaled only by noise and surges."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from headroom.kernel.scenario_load import ScenarioError, load_scenario
from headroom.kernel.traces import ScenarioTraces

SCENARIO = """
name: counts
seed: 1
duration_s: 6
slo: {p99_ms: 200, window_s: 2}
control: {interval_s: 2}
world: {ads: 100, dim: 4, base_candidates: 10, max_candidates: 20, holdout: 0.1}
models:
  base:   {cpu_ms_per_candidate: 0.1, accelerator_ms_per_candidate: 0.02, hardware: [gpu-a]}
  strong: {cpu_ms_per_candidate: 0.005, accelerator_ms_per_candidate: 0.1, hardware: [gpu-a]}
segments:
  - {name: all, share: 1.0, value: {mean: 1.0, sigma: 0.5}, base_error: 0.2, strong_error: 0.1}
regions:
  - name: r1
    dedicated: {cpu: 4, accelerator: 1, hardware: gpu-a}
    traffic: {trace: [[0, 100]], arrivals: counts.csv}
"""


def write(tmp_path: Path, counts: str, extra: str = "") -> Path:
    (tmp_path / "counts.csv").write_text(counts)
    path = tmp_path / "s.yaml"
    path.write_text(SCENARIO + extra)
    return path


def test_the_arrivals_are_the_recorded_counts_whatever_the_seed(tmp_path: Path) -> None:
    scenario = load_scenario(write(tmp_path, "t_s,requests\n0,7\n1,0\n3,250\n5,1\n"))
    assert scenario.regions[0].traffic.arrivals == ((0, 7), (1, 0), (3, 250), (5, 1))
    for seed in (1, 2):
        traces = ScenarioTraces(scenario, np.random.default_rng(seed))
        assert traces.regions[0].arrivals.tolist() == [7, 0, 0, 250, 0, 1]
        assert traces.regions[0].rate.tolist() == [100.0] * 6  # the rate is the trace's


def test_a_surge_scales_the_recorded_counts(tmp_path: Path) -> None:
    counts = "t_s,requests\n" + "".join(f"{t},1000\n" for t in range(6))
    surge = "events:\n  - {at_s: 2, kind: surge, region: r1, factor: 1.5, duration_s: 2}\n"
    calm = "events:\n  - {at_s: 2, kind: surge, region: r1, factor: 0.5, duration_s: 2}\n"
    up = ScenarioTraces(load_scenario(write(tmp_path, counts, surge)), np.random.default_rng(3))
    got = up.regions[0].arrivals
    assert got[[0, 1, 4, 5]].tolist() == [1000] * 4
    assert all(1500 - 4 * 23 <= n <= 1500 + 4 * 23 for n in got[2:4])  # + Poisson(500)
    down = ScenarioTraces(load_scenario(write(tmp_path, counts, calm)), np.random.default_rng(3))
    got = down.regions[0].arrivals
    assert got[[0, 1, 4, 5]].tolist() == [1000] * 4
    assert all(500 - 4 * 16 <= n <= 500 + 4 * 16 for n in got[2:4])  # Binomial(1000, 0.5)


@pytest.mark.parametrize(
    ("counts", "problem"),
    [
        ("t_s,requests\n0,1.5\n", "whole numbers"),
        ("t_s,requests\n0.5,1\n", "whole numbers"),
        ("t_s,requests\n0,1\n6,1\n", "second 6 is at or after the end of the run"),
        ("t_s,requests\n1,1\n1,2\n", "strictly increasing"),
        ("t_s,rps\n0,1\n", "header must be t_s,requests"),
        ("t_s,requests\n0,-1\n", "must be >= 0"),
    ],
)
def test_bad_arrival_files_are_refused_with_their_field(
    tmp_path: Path, counts: str, problem: str
) -> None:
    with pytest.raises(ScenarioError) as err:
        load_scenario(write(tmp_path, counts))
    text = "; ".join(err.value.problems)
    assert "regions[0].traffic.arrivals" in text
    assert problem in text
