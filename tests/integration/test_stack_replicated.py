"""The whole stack on a three-broker cluster: ``headroom kafka start --brokers 3``, topics with
three replicas, and one broker killed (SIGKILL: a crash) during an ``up`` run and started again
10 s later — by ``up`` itself, from the scenario's ``broker_restart`` event naming the cluster's
second node (``broker: 1``), which ``headroom kafka start`` on the cluster's state directory
brings back alone (~150 s on a busy machine).

The cluster is this module's own (a temporary state directory). Checked on the run: every
request the feed published is in exactly one client window line (none lost, none twice), the
value topic carries exactly the window lines' sums, no request failed or timed out, and the SLO
held (within a loaded host's margin) in every window but the crash's own — with a broker gone
for ten seconds, its partitions' leaders moved elsewhere.

After the crash the requests topic stalls for about five seconds (three until the dead broker is
fenced, then new leaders and a new group coordinator are found) and the backlog then reaches the
servers at once; ten seconds later the broker's JVM starts again on the same two cores as the
stack. Those windows are the run's worst (p99 172 ms against the 250 ms SLO on an otherwise idle
2-core machine; 268, 354 and 424 ms, over it, on one loaded by other work, with the requests that
ran no optional work as slow as the rest). docs/kafka.md says so.
"""

from __future__ import annotations

import math
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from headroom.analysis.events import read_events
from headroom.commands.up import UpResult, run_up
from headroom.kernel.scenario_load import load_scenario
from headroom.streams import broker, messages
from headroom.streams.kafka import KafkaTarget, admin, topic_configs, topic_replicas
from headroom.streams.topics import topics
from headroom.workers.up import StackConfig
from tests.conftest import run_async, start_private_broker
from tests.integration.slo_windows import fault_windows, slo_misses, window_p99s
from tests.integration.topic_reads import decode_topic

pytestmark = pytest.mark.integration

SCENARIO = Path(__file__).parent / "scenarios" / "replicated-short.yaml"
KILL_AT, RESTART_AT = 10.0, 20.0  # the scenario's broker_restart: at 10 s, down for 10 s
KILLED_NODE = 2  # its `broker: 1` (0-based)
REGION = "it-east"


@dataclass
class Cluster:
    config: broker.BrokerConfig
    bootstrap: str

    def node_pid(self, node_id: int) -> int:
        paths = broker.BrokerPaths(self.config.state_dir).node(node_id)
        return int(paths.pid_file.read_text())


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    cfg, started = start_private_broker(
        tmp_path_factory, "kafka-3", brokers=3, start_timeout_s=240.0
    )
    try:
        yield Cluster(cfg, started.bootstrap)
    finally:
        broker.stop(cfg.state_dir)


@dataclass
class ReplicatedRun:
    result: UpResult
    events: list[dict[str, Any]]
    value_signals: list[messages.ValueSignal]
    replicas: dict[str, int]
    min_isr: dict[str, str]
    killed_pid: int
    restarted_pid: int

    def kinds(self, kind: str, source: str | None = None) -> list[dict[str, Any]]:
        return [
            e
            for e in self.events
            if e["kind"] == kind and (source is None or e["source"] == source)
        ]


@pytest.fixture(scope="module")
def replicated_run(cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> ReplicatedRun:
    prefix = f"r{uuid.uuid4().hex[:12]}."
    kafka = KafkaTarget(cluster.bootstrap, prefix)
    out_dir = tmp_path_factory.mktemp("up-replicated")
    scenario = load_scenario(SCENARIO)
    config = StackConfig(
        scenario_path=SCENARIO,
        out_dir=out_dir,
        kafka=kafka,
        broker_state_dir=cluster.config.state_dir,
    )
    killed = cluster.node_pid(KILLED_NODE)

    async def run() -> tuple[UpResult, list[messages.ValueSignal], dict[str, int], Any]:
        result = await run_up(config, scenario)
        names = [t.name for t in topics(prefix)]
        async with admin(cluster.bootstrap) as client:
            replicas = await topic_replicas(client, names)
            configs = await topic_configs(client, names)
        return result, await decode_topic(kafka, "value"), replicas, configs

    result, signals, replicas, configs = run_async(run())
    return ReplicatedRun(
        result,
        read_events(result.events_path),
        signals,
        replicas,
        {name: c.get("min.insync.replicas", "") for name, c in configs.items()},
        killed,
        cluster.node_pid(KILLED_NODE),
    )


def test_topics_have_three_replicas_and_a_min_isr_of_two(replicated_run: ReplicatedRun) -> None:
    assert len(replicated_run.replicas) == len(topics("x."))
    assert set(replicated_run.replicas.values()) == {3}
    assert set(replicated_run.min_isr.values()) == {"2"}


def test_the_broker_was_really_killed_and_restarted(
    cluster: Cluster, replicated_run: ReplicatedRun
) -> None:
    assert broker.read_cmdline(replicated_run.killed_pid) is None
    assert replicated_run.restarted_pid != replicated_run.killed_pid
    found = broker.status(cluster.config.state_dir)
    assert found.state is broker.BrokerState.RUNNING
    assert found.nodes_running == 3
    # up ran the fault and saw the stack recover from it
    faults = replicated_run.result.metrics["policies"]["headroom"]["faults"]
    assert (faults["injected"], faults["recovered"], faults["unrecovered"]) == (1, 1, 0), faults
    assert faults["list"][0]["process"] == "broker"


def test_nothing_lost_or_doubled_and_the_baseline_slo_held(replicated_run: ReplicatedRun) -> None:
    metrics = replicated_run.result.metrics["policies"]["headroom"]
    assert metrics["complete"] is True, metrics.get("completeness")
    assert metrics["requests"]["errors"] == 0, metrics["requests"]
    assert metrics["requests"]["timeouts"] == 0, metrics["requests"]
    slo = metrics["slo"]
    assert slo["windows"] >= 6
    # The SLO holds in every window but the crash's own (docs/kafka.md), within the margin a
    # loaded host's stalls need (tests/integration/slo_windows.py): from the kill until one
    # window after the stack was healthy again. There the stall's backlog reaches the servers at
    # once and the broker's JVM starts again on the same two cores as the stack; the requests
    # that ran with no optional work are as slow as the rest there (two runs on a loaded host:
    # 268 and 424 ms in the kill's and the restart's window, baseline-only alike). Nothing in
    # them may time out (twice the SLO: asserted above).
    p99s = window_p99s(replicated_run.events, REGION)
    assert len(p99s) == slo["windows"]
    assert max(p99s.values()) == pytest.approx(slo["worst_window_p99_ms"])
    (fault,) = metrics["faults"]["list"]
    crash = fault_windows(fault, slo["window_s"])
    assert len(set(p99s) - crash) >= 4, (crash, p99s)
    assert not slo_misses(p99s, slo["p99_ms"], crash), (crash, p99s)
    finished = replicated_run.kinds("run.finished", "feed")
    assert len(finished) == 1
    windows = replicated_run.kinds("window", "client")
    # every request the feed published is in exactly one window line: none lost, none twice
    assert sum(w["requests"] for w in windows) == finished[0]["published"]["requests"]
    assert sum(w["requests"] for w in windows if KILL_AT <= w["t_start"] < RESTART_AT) > 100
    # the value topic carries exactly the window lines' sums (each signal once)
    lines: dict[tuple[str, str], list[float]] = {}
    for w in windows:
        for segment, by_lever in w["itt"].items():
            for lever, sums in by_lever.items():
                t = lines.setdefault((segment, lever), [0, 0.0])
                t[0] += sums["n"]
                t[1] += sums["value_sum"]
    topic: dict[tuple[str, str], list[float]] = {}
    for s in replicated_run.value_signals:
        if s.arm == "treatment":
            t = topic.setdefault((s.segment, s.lever), [0, 0.0])
            t[0] += s.n
            t[1] += s.value_sum
    assert lines
    for key, (n, total) in lines.items():
        assert topic[key][0] == n, key
        assert math.isclose(topic[key][1], total, rel_tol=1e-9), key
