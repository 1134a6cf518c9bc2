"""The optional scenario fields ``scenario from-recording`` writes: ``traffic.arrivals`` (recorded
arrivals per second, simulated as counts, scaled only by noise and surges), ``value.csv`` (a
recorded value histogram: the simulator's cells and the feed's draws) and ``eligible_share``."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from headroom.kernel.scenario import VALUE_BIN_RATIO
from headroom.kernel.scenario_load import ScenarioError, load_scenario
from headroom.kernel.schedule import FeedSchedule
from headroom.kernel.traces import ScenarioTraces
from headroom.sim.population import Population
from headroom.sim.replay import RecordedPopulation
from headroom.sim.replay_read import VALUE_ALPHA, ValueGrid
from headroom.sim.run import build_context

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


# --------------------------------------------------------------------------------------------
# value.csv and eligible_share
# --------------------------------------------------------------------------------------------

HISTOGRAM = "value,requests\n0.5,300\n2.0,100\n"  # two point masses, 3:1


def with_histogram(tmp_path: Path, hist: str = HISTOGRAM, extra: str = "") -> Path:
    counts = "t_s,requests\n" + "".join(f"{t},400\n" for t in range(6))
    path = write(tmp_path, counts, extra)
    (tmp_path / "values.csv").write_text(hist)
    text = path.read_text().replace(
        "value: {mean: 1.0, sigma: 0.5}", "value: {mean: 0.875, sigma: 0.6, csv: values.csv}"
    )
    path.write_text(text)
    return path


def test_a_value_histogram_is_the_simulators_population_and_the_feeds_draw(
    tmp_path: Path,
) -> None:
    scenario = load_scenario(with_histogram(tmp_path, extra="eligible_share: 0.25\n"))
    value = scenario.segments[0].value
    assert value.histogram == ((0.5, 300.0), (2.0, 100.0))
    assert scenario.eligible_share == 0.25
    pop = Population.from_scenario(scenario, 8)
    assert isinstance(pop, RecordedPopulation)
    # 8 equal-probability cells: six hold the 0.5 mass, two the 2.0 mass (within its grid bin)
    assert pop.v_mean.tolist() == pytest.approx([0.5] * 6 + [2.0] * 2, rel=0.011)
    assert float(pop.seg_share[0]) == 1.0
    # the simulator applies the scenario's eligible share
    ctx = build_context(scenario, curves=_FlatCurves())
    assert ctx.eligible == 0.25
    # the feed: values from the histogram (each within its row's bin), 3:1, a quarter eligible
    feed = FeedSchedule(scenario)
    reqs = [r for second in range(6) for r in feed.requests(second)]
    values = np.array([f["value"] for _, _, f in reqs])
    # each value in the grid bin of its row, as the simulator's cells have it
    grid = ValueGrid.make(VALUE_ALPHA)
    bins = grid.index(values)
    low = bins == grid.index(np.array([0.5]))[0]
    high = bins == grid.index(np.array([2.0]))[0]
    assert np.all(low | high)
    assert grid.edges[bins[low][0] + 1] / grid.edges[bins[low][0]] == pytest.approx(VALUE_BIN_RATIO)
    lo_cells = pop.v_lo[:6]
    assert np.all(values[low] >= lo_cells.min())
    n = values.size
    assert n == 2400
    assert abs(low.mean() - 0.75) <= 4 * np.sqrt(0.75 * 0.25 / n)
    eligible = np.array([f["eligible"] for _, _, f in reqs])
    assert abs(eligible.mean() - 0.25) <= 4 * np.sqrt(0.25 * 0.75 / n)


class _FlatCurves:
    """Value curves that do not matter here (no ranking world is measured)."""

    def mean_quality(self, segment_idx: object, model: object, n: object) -> np.ndarray:
        return np.full(np.shape(segment_idx), 0.5)

    def std_quality(self, segment_idx: object, model: object, n: object) -> np.ndarray:
        return np.full(np.shape(segment_idx), 0.1)


def test_a_scenario_without_the_new_fields_feeds_as_before(tmp_path: Path) -> None:
    plain = load_scenario(write(tmp_path, "t_s,requests\n0,50\n"))
    assert plain.eligible_share is None
    assert plain.segments[0].value.histogram is None
    reqs = FeedSchedule(plain).requests(0)
    assert len(reqs) == 50
    assert all(f["eligible"] for _, _, f in reqs)  # the default share, 1
    assert not isinstance(Population.from_scenario(plain, 8), RecordedPopulation)


@pytest.mark.parametrize(
    ("hist", "problem"),
    [
        ("value,requests\n0.5,1.5\n", "whole number"),
        ("value,requests\n0.5,0\n", "holds no request"),
        ("value,requests\n2.0,1\n0.5,1\n", "strictly increasing"),
        ("t_s,rps\n0,1\n", "header must be value,requests"),
    ],
)
def test_bad_value_histograms_are_refused_with_their_field(
    tmp_path: Path, hist: str, problem: str
) -> None:
    with pytest.raises(ScenarioError) as err:
        load_scenario(with_histogram(tmp_path, hist))
    text = "; ".join(err.value.problems)
    assert "segments[0].value.csv" in text
    assert problem in text


def test_eligible_share_must_be_a_share(tmp_path: Path) -> None:
    with pytest.raises(ScenarioError, match="eligible_share"):
        load_scenario(with_histogram(tmp_path, extra="eligible_share: 1.5\n"))
