"""``headroom up`` without a broker, its settings, and the pieces it computes before any process
starts (the controller interval, the oracle bound)."""

from __future__ import annotations

import argparse
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from headroom.commands.up import oracle_events
from headroom.kernel.errors import ConfigError
from headroom.kernel.scenario import Control
from headroom.kernel.scenario_load import load_scenario, load_scenario_text
from headroom.streams.broker import free_port
from headroom.streams.kafka import KafkaTarget, KafkaUnavailable
from headroom.workers.up import StackConfig

REPO = Path(__file__).parents[2]
SCENARIO = REPO / "tests" / "integration" / "scenarios" / "stack-short.yaml"


def _controller_args(path: Path, tmp_path: Path, **config: Any) -> argparse.Namespace:
    from headroom.cli import build_parser
    from headroom.workers.up import Stack

    config_ = StackConfig(path, tmp_path, KafkaTarget("x:1", "t."), **config)
    stack = Stack(config_, load_scenario(path))
    stack.t0 = 1_800_000_000.25
    argv = stack.controller_argv()
    args = build_parser().parse_args(argv[argv.index("headroom.cli") + 1 :])
    assert args.command == "controller"
    return args


def test_the_controller_runs_on_the_scenarios_control_clock(tmp_path: Path) -> None:
    # stack-short.yaml: control {interval_s: 5}; the ttl is 3 intervals; scenario seconds, with
    # the run's t0 and speed (the controller steps at t0 + k × 5 / speed)
    args = _controller_args(SCENARIO, tmp_path)
    assert (args.interval, args.ttl, args.t0, args.speed) == (5.0, 15.0, 1_800_000_000.25, 1.0)
    args = _controller_args(SCENARIO, tmp_path, speed=2.5)
    assert (args.interval, args.ttl, args.speed) == (5.0, 15.0, 2.5)
    # --interval / --ttl (scenario seconds) override the scenario
    args = _controller_args(SCENARIO, tmp_path, interval_s=8.0)
    assert (args.interval, args.ttl) == (8.0, 24.0)
    args = _controller_args(SCENARIO, tmp_path, interval_s=8.0, ttl_s=30.0, speed=2.0)
    assert (args.interval, args.ttl) == (8.0, 30.0)
    # a step shorter than the SLO window (5 s) is refused, naming the flag
    with pytest.raises(ConfigError, match=r"--interval: must be >= the scenario's slo\.window_s"):
        _controller_args(SCENARIO, tmp_path, interval_s=4.0)


def test_the_controller_steps_at_the_simulators_instants() -> None:
    from headroom.controllers.app import next_step

    t0, interval = 1000.0, 5.0
    assert next_step(980.0, t0, interval) == 1  # started before t0: the first step at t0 + 5
    assert next_step(1004.9, t0, interval) == 1
    assert next_step(1005.0, t0, interval) == 2
    assert next_step(1005.0, t0, interval, last=1) == 2
    assert next_step(1004.999, t0, interval, last=1) == 2  # never the same step twice
    assert next_step(1061.0, t0, interval, last=3) == 13  # a pause: missed steps are skipped


def test_a_scenario_without_a_control_section_gets_the_simulators_default(tmp_path: Path) -> None:
    text = SCENARIO.read_text()
    assert "control: {interval_s: 5}" in text
    text = text.replace("control: {interval_s: 5}", "")
    assert load_scenario_text(text).control == Control()
    path = tmp_path / "no-control.yaml"
    path.write_text(text)
    assert load_scenario(path).control == Control()
    args = _controller_args(path, tmp_path)
    assert (args.interval, args.ttl) == (60.0, 180.0)


def test_a_ttl_shorter_than_the_interval_is_refused_naming_the_flag(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="--ttl: must be >= the control interval"):
        _controller_args(SCENARIO, tmp_path, interval_s=10.0, ttl_s=5.0)


def test_stack_config_names_bad_settings(tmp_path: Path) -> None:
    kafka = KafkaTarget("127.0.0.1:1", "t.")
    with pytest.raises(ConfigError, match="--speed") as info:
        StackConfig(
            SCENARIO, tmp_path, kafka, speed=0.0, interval_s=-1.0, ttl_s=math.nan,
            dedicated_replicas=0,
        )  # fmt: skip
    assert len(info.value.problems) == 4
    assert [p.split(":")[0] for p in info.value.problems] == [
        "--speed",
        "--interval",
        "--ttl",
        "dedicated_replicas",
    ]


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
    assert proc.argv[:3] == ["nice", "-n", "19"]  # the live path's CPU comes first
    cli = proc.argv[proc.argv.index("headroom.cli") + 1 :]
    args = build_parser().parse_args(cli)  # every flag is one the command declares
    assert (args.command, args.region) == ("precompute", "it-pre")
    assert (args.t0, args.speed) == (1_800_000_000.5, 10.0)
    assert (args.bootstrap, args.prefix, args.scenario) == ("x:1", "t.", str(path))


def test_the_servers_emulate_the_simulators_service_times() -> None:
    """One service-time model in both engines: the request's parallelism on the CPU stage; the
    simulator's service-time variability is available to the servers, whose emulation is exact
    by default (their real compute on a shared host varies on its own)."""
    from headroom.sim.latency import LatencyConfig
    from headroom.workers.server import ServerConfig

    server = ServerConfig(region="r", pool="dedicated", replica="x")
    sim = LatencyConfig()
    assert server.cpu_parallelism == sim.cpu_parallelism
    assert server.service_cv == 0.0
    jittered = ServerConfig(region="r", pool="dedicated", replica="x", service_cv=sim.service_cv)
    assert jittered.service_cv == sim.service_cv


def test_the_stop_waits_until_the_controllers_counted_every_value_signal(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import asyncio

    from headroom.streams import messages
    from headroom.workers import up
    from headroom.workers.up import Stack

    path = REPO / "tests" / "integration" / "scenarios" / "precompute-short.yaml"
    stack = Stack(StackConfig(path, tmp_path, KafkaTarget("x:1", "t.")), load_scenario(path))
    audit = {"value": {"producers": {"a": {"published": 5}, "b": {"published": 2}}}}

    def counted(**producers: int) -> messages.Event:
        recs = {
            p: {"seq": n - 1, "counted": n, "duplicates_dropped": 0} for p, n in producers.items()
        }
        return messages.Event(
            ts=1.0, kind="value.counted", source="controller", extra={"producers": recs}
        )

    async def settle_while_counting() -> float:
        loop = asyncio.get_running_loop()
        start = loop.time()
        task = asyncio.create_task(stack._settle_value_counts(audit))
        stack._saw(counted(a=5, b=1))  # b is one short: the stop keeps waiting
        await asyncio.sleep(0.5)
        assert not task.done()
        stack._saw(counted(a=4))  # an older count of another controller changes nothing
        stack._saw(counted(b=2))
        await task
        return loop.time() - start

    assert 0.5 <= asyncio.run(settle_while_counting()) < 5.0
    # a count that never comes: the stop goes on after VALUE_SETTLE_S
    monkeypatch.setattr(up, "VALUE_SETTLE_S", 0.3)
    short = {"value": {"producers": {"c": {"published": 1}}}}
    asyncio.run(asyncio.wait_for(stack._settle_value_counts(short), 5.0))
    assert stack._value_counted == {"a": 5, "b": 2}


def test_a_collector_that_fails_at_start_up_fails_the_start_with_its_own_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the start waits for the event collector to reach the end of the events topic; a collector
    # that stopped first is reported by its own exception, one that never gets there by name
    import asyncio

    from headroom.kernel.errors import HeadroomError
    from headroom.workers import up
    from headroom.workers.up import Stack

    stack = Stack(
        StackConfig(SCENARIO, tmp_path, KafkaTarget("x:1", "t.")), load_scenario(SCENARIO)
    )

    async def failing() -> int:
        raise KafkaUnavailable("cannot reach Kafka at x:1: refused")

    async def hanging() -> int:
        await asyncio.sleep(60.0)
        return 0

    async def ready() -> int:
        stack._collector_ready.set()
        await asyncio.sleep(60.0)
        return 0

    async def start(collect: Any) -> None:
        stack._collector_ready = asyncio.Event()
        stack._collector = asyncio.create_task(collect())
        try:
            await stack._collector_started()
        finally:
            stack._collector.cancel()

    with pytest.raises(KafkaUnavailable, match="cannot reach Kafka at x:1"):
        asyncio.run(start(failing))
    monkeypatch.setattr(up, "READY_TIMEOUT_S", 0.2)
    with pytest.raises(HeadroomError, match=r"did not reach the end of t\.events within 0\.2 s"):
        asyncio.run(start(hanging))
    asyncio.run(start(ready))  # returns
