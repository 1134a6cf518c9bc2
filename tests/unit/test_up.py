"""``headroom up`` without a broker, its settings, and the pieces it computes before any process
starts (the controller interval, the oracle bound)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from headroom.commands.up import oracle_events
from headroom.kernel.errors import ConfigError
from headroom.kernel.scenario_load import load_scenario
from headroom.streams.broker import free_port
from headroom.streams.kafka import KafkaTarget
from headroom.workers.up import StackConfig, default_interval

REPO = Path(__file__).parents[2]
SCENARIO = REPO / "tests" / "integration" / "scenarios" / "stack-short.yaml"


@pytest.mark.parametrize(
    ("duration_s", "speed", "window_s", "interval_s"),
    [
        (120.0, 1.0, 5.0, 5.0),  # a short run: one SLO window, not 3 s
        (3600.0, 1.0, 10.0, 60.0),  # an hour: capped at a minute
        (3600.0, 10.0, 10.0, 9.0),  # ten times faster: 90 scenario seconds, 9 wall seconds
        (20.0, 1.0, 0.5, 1.0),  # never under a second
    ],
)
def test_the_controller_interval_scales_with_the_run(
    duration_s: float, speed: float, window_s: float, interval_s: float
) -> None:
    assert default_interval(duration_s, speed, window_s) == pytest.approx(interval_s)


def test_stack_config_names_bad_settings(tmp_path: Path) -> None:
    kafka = KafkaTarget("127.0.0.1:1", "t.")
    with pytest.raises(ConfigError, match="--speed") as info:
        StackConfig(SCENARIO, tmp_path, kafka, speed=0.0, interval_s=-1.0, dedicated_replicas=0)
    assert len(info.value.problems) == 3


def test_the_oracle_bound_is_the_simulators_for_the_same_scenario(tmp_path: Path) -> None:
    events = oracle_events(load_scenario(SCENARIO))
    assert len(events) == 1
    bound = events[0]
    assert bound["kind"] == "oracle.bound"
    assert bound["policy"] == "headroom"
    assert bound["oracle_incremental"] > 0.0
    assert set(bound["by_lever"]) >= {"rma", "sbm"}


def test_up_without_a_broker_exits_1_and_says_how_to_start_one(tmp_path: Path) -> None:
    nobody = f"127.0.0.1:{free_port()}"
    proc = subprocess.run(
        [sys.executable, "-m", "headroom.cli", "up", str(SCENARIO), "--out", str(tmp_path / "o"),
         "--bootstrap", nobody],
        capture_output=True, text=True, timeout=120, cwd=REPO, check=False,
    )  # fmt: skip
    assert proc.returncode == 1, proc.stderr[-1000:]
    assert f"cannot reach Kafka at {nobody}" in proc.stderr
    assert "headroom kafka start" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_up_with_a_bad_scenario_exits_2(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\nseed: 1\n")
    proc = subprocess.run(
        [sys.executable, "-m", "headroom.cli", "up", str(bad), "--bootstrap", "127.0.0.1:1"],
        capture_output=True, text=True, timeout=60, cwd=REPO, check=False,
    )  # fmt: skip
    assert proc.returncode == 2
    assert "duration_s" in proc.stderr


def test_a_precompute_scenario_gets_a_precompute_worker_per_region_on_the_runs_clock(
    tmp_path: Path,
) -> None:
    from headroom.cli import build_parser
    from headroom.workers.up import Stack

    path = REPO / "tests" / "integration" / "scenarios" / "precompute-short.yaml"
    scenario = load_scenario(path)
    assert scenario.precompute_enabled
    stack = Stack(StackConfig(path, tmp_path, KafkaTarget("x:1", "t."), speed=10.0), scenario)
    stack.t0 = 1_800_000_000.5
    proc = stack.precompute_proc("it-pre")
    assert proc.name == "precompute-it-pre"
    cli = proc.argv[proc.argv.index("headroom.cli") + 1 :]
    args = build_parser().parse_args(cli)  # every flag is one the command declares
    assert (args.command, args.region) == ("precompute", "it-pre")
    assert (args.t0, args.speed) == (1_800_000_000.5, 10.0)
    assert (args.bootstrap, args.prefix, args.scenario) == ("x:1", "t.", str(path))
