"""The event log of a long run: compressed, read back by ``analyze`` to the same metrics, and
small enough that a simulated day of every policy stays under 100 MB (the full-size figure is the
``sim_event_log_mb_day`` benchmark; this checks the rate on a short run, which is deterministic:
the same code and seed write the same bytes)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from headroom.analysis.events import GZIP_MAGIC
from headroom.cli import main
from headroom.kernel.scenario_load import load_scenario
from headroom.sim.policies import POLICIES
from headroom.sim.run import build_context, run_simulation
from headroom.sim.runtime import COMPRESS_ABOVE_BYTES, estimate_run

ROOT = Path(__file__).resolve().parents[2]
DAY_LIMIT_BYTES = 100e6  # a simulated day of every policy, three regions
SHORT_S = 1800.0


def test_a_compressed_log_gives_the_same_metrics_and_stays_within_the_day_budget(
    tmp_path: Path,
) -> None:
    s = load_scenario(ROOT / "scenarios" / "diurnal-3region.yaml")
    assert estimate_run(s, list(POLICIES)).compress  # the full day would be compressed
    s = dataclasses.replace(s, duration_s=SHORT_S)
    assert not estimate_run(s, ["static"]).compress  # and a short run of one policy is not
    ctx = build_context(s)
    policies = ["static", "headroom"]
    plain = run_simulation(s, policies, tmp_path / "p", context=ctx, plots=False)
    packed = run_simulation(
        s, policies, tmp_path / "z", context=ctx, plots=False, compress_events=True
    )
    assert plain.events_path.read_bytes()[:2] != GZIP_MAGIC
    assert packed.events_path.name == "events.jsonl"
    assert packed.events_path.read_bytes()[:2] == GZIP_MAGIC
    assert packed.metrics == plain.metrics

    # analyze reads what simulate wrote, to the same metrics
    out = tmp_path / "a"
    assert main(["analyze", str(packed.events_path), "--out", str(out), "--no-plots"]) == 0
    analyzed = json.loads((out / "metrics.json").read_text())
    assert analyzed == json.loads(packed.metrics_path.read_text())

    # bytes per policy, region and simulated hour, against the budget of a simulated day of
    # every policy in three regions
    per_hour = packed.events_path.stat().st_size / (len(policies) * 3 * SHORT_S / 3600.0)
    budget = DAY_LIMIT_BYTES / (len(POLICIES) * 3 * 24)
    assert per_hour <= budget, f"{per_hour:.0f} B per policy-region-hour > {budget:.0f}"
    plain_per_hour = plain.events_path.stat().st_size / (len(policies) * 3 * SHORT_S / 3600.0)
    assert plain_per_hour > budget  # without compression the day would not fit
    assert COMPRESS_ABOVE_BYTES < DAY_LIMIT_BYTES
