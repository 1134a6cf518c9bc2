"""The whole streaming stack on a real broker: ``headroom up`` on a two-minute scenario.

One run of tests/integration/scenarios/stack-short.yaml (module fixture, ~2.5 min of wall time)
through :func:`headroom.commands.up.run_up` — the code behind ``headroom up`` — with three
dedicated replicas and, on top of the scenario's own events (preemption at 60 s, grant at 75 s, CPU
reclaim at 85 s, control outage 90-115 s), two faults injected by the test:

* t = 30 s: ``kill -9`` of one dedicated replica, restarted at t = 38 s on the same port;
* t = 45 s: ``kill -9`` of the client, restarted at once with the same static group id.

Each test then checks one promise on the collected event log (and the value topic), and the last
one runs the same scenario through ``simulate`` and reports the gap between the two engines.
"""

from __future__ import annotations

import asyncio
import json
import math
import signal
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from headroom.analysis.events import read_events
from headroom.analysis.metrics import compute_metrics
from headroom.commands.up import UpResult, run_up
from headroom.kernel.scenario import Scenario
from headroom.kernel.scenario_load import load_scenario
from headroom.streams import messages
from headroom.streams.kafka import KafkaTarget, delete_topics
from headroom.streams.topics import topics
from headroom.workers.up import Stack, StackConfig
from tests.conftest import run_async
from tests.integration.slo_windows import fault_window, slo_misses, window_p99s
from tests.integration.topic_reads import decode_topic

pytestmark = pytest.mark.integration

SCENARIO = Path(__file__).parent / "scenarios" / "stack-short.yaml"
REGION = "it-east"
KILLED_SERVER = f"server-{REGION}-dedicated-0"
CLIENT = f"client-{REGION}"
KILL_SERVER_AT, RESTART_SERVER_AT = 30.0, 38.0
KILL_CLIENT_AT = 45.0
PREEMPT_AT, GRANT_AT = 60.0, 75.0
OUTAGE = (90.0, 115.0)
SCRAPE_AT = 20.0


@dataclass
class StackRun:
    result: UpResult
    events: list[dict[str, Any]]
    value_signals: list[messages.ValueSignal]
    interval_s: float
    scraped: dict[str, str]  # process name -> its /metrics text at SCRAPE_AT

    @property
    def metrics(self) -> dict[str, Any]:
        return dict(self.result.metrics["policies"]["headroom"])

    def kinds(self, kind: str, source: str | None = None) -> list[dict[str, Any]]:
        return [
            e
            for e in self.events
            if e["kind"] == kind and (source is None or e["source"] == source)
        ]

    def client_windows(self) -> list[dict[str, Any]]:
        return self.kinds("window", "client")


@pytest.fixture(scope="module")
def stack_run(kafka_bootstrap: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[StackRun]:
    prefix = f"t{uuid.uuid4().hex[:12]}."
    kafka = KafkaTarget(kafka_bootstrap, prefix)
    out_dir = tmp_path_factory.mktemp("stack-up")
    scenario = load_scenario(SCENARIO)
    config = StackConfig(scenario_path=SCENARIO, out_dir=out_dir, kafka=kafka, dedicated_replicas=3)

    async def kill_server(stack: Stack) -> None:
        await stack.kill(KILLED_SERVER, signal.SIGKILL)

    async def restart_server(stack: Stack) -> None:
        await stack.restart(KILLED_SERVER)

    async def restart_client(stack: Stack) -> None:
        await stack.kill(CLIENT, signal.SIGKILL)
        await stack.restart(CLIENT)

    scraped: dict[str, str] = {}

    async def scrape(stack: Stack) -> None:
        for name, url in stack.metrics_endpoints().items():
            scraped[name] = await asyncio.to_thread(_get, url)

    async def run() -> tuple[UpResult, list[messages.ValueSignal]]:
        result = await run_up(
            config,
            scenario,
            actions=[
                (KILL_SERVER_AT, kill_server),
                (RESTART_SERVER_AT, restart_server),
                (KILL_CLIENT_AT, restart_client),
                (SCRAPE_AT, scrape),
            ],
        )
        return result, await decode_topic(kafka, "value")

    try:
        result, signals = run_async(run())
        yield StackRun(
            result, read_events(result.events_path), signals, result.stack.interval_s, scraped
        )
    finally:
        names = [t.name for t in topics(prefix)]
        run_async(delete_topics(kafka_bootstrap, names))


def test_every_process_started_and_the_run_was_collected(stack_run: StackRun) -> None:
    procs = stack_run.result.stack.procs
    assert set(procs) >= {"controller", "feed", CLIENT, KILLED_SERVER}
    assert procs[KILLED_SERVER].starts == 2
    assert procs[CLIENT].starts == 2
    assert len(stack_run.kinds("run.started", "feed")) == 1
    assert len(stack_run.kinds("run.finished", "feed")) == 1
    assert stack_run.kinds("target.issued", "controller")
    assert stack_run.kinds("target.applied", "client")
    assert (stack_run.result.out_dir / "events.jsonl").exists()


def test_baseline_p99_within_the_slo(stack_run: StackRun) -> None:
    slo = stack_run.metrics["slo"]
    assert slo["windows"] >= 20
    p99s = window_p99s(stack_run.events, REGION)
    assert len(p99s) == slo["windows"]
    assert max(p99s.values()) == pytest.approx(slo["worst_window_p99_ms"])
    # The window in which the client is killed and restarted is the fault's own: its new process
    # starts cold on a shared host and serves the backlog (paced, baseline-only). Nothing in it
    # may time out (twice the SLO); two full runs on a loaded 2-core host put its p99 at 302 and
    # 416 ms, every other window of those runs under 160 ms.
    restart = fault_window(KILL_CLIENT_AT, slo["window_s"])
    assert p99s[restart] < 2.0 * slo["p99_ms"], p99s
    # every other window, the server's kill and restart, the preemption, the reclaim and the
    # control outage included, keeps p99 of all requests under the SLO (but for one host stall:
    # tests/integration/slo_windows.py)
    assert not slo_misses(p99s, slo["p99_ms"], {restart}), p99s


def test_the_run_is_complete_with_the_run_wide_figures_of_simulate(stack_run: StackRun) -> None:
    m = stack_run.metrics
    # the feed's run.finished and a window line per region and window: nothing is missing
    assert m["complete"] is True, m["completeness"]
    assert m["duration_s"] == load_scenario(SCENARIO).duration_s
    assert stack_run.result.metrics["log"]["corrupt_lines"] == 0
    lat = m["latency"]
    # the clients' sketches: every request, and the ones served with no optional work
    assert 0 < lat["baseline_only_count"] <= lat["all_count"]
    assert lat["all_count"] == m["requests"]["total"]
    assert lat["all_p99_ms"] > 0
    assert lat["baseline_only_p99_ms"] > 0
    offered, used = m["capacity"]["offered_unit_s"], m["capacity"]["used_unit_s"]
    for r, share in m["capacity"]["captured_share"].items():
        assert share == pytest.approx(used[r] / offered[r]), r
    assert m["reclaims"]["releases"] == len(stack_run.kinds("optional.released"))


def test_optional_work_is_used_while_capacity_is_spare(stack_run: StackRun) -> None:
    before = [w for w in stack_run.client_windows() if w["t_end"] <= PREEMPT_AT]
    treated = {
        lever: sum(w["eligible_treated"].get(lever, 0) for w in before) for lever in ("rma", "sbm")
    }
    # SBM takes most treatment requests once its value is proven (~20 s in); RMA's extras go to
    # the others, a few percent of them at the candidates the PID allows here (~80-100 by 60 s)
    assert treated["rma"] > 40, treated
    assert treated["sbm"] > 20, treated
    used = stack_run.metrics["capacity"]["used_unit_s"]
    assert used["cpu"] > 0.0
    assert used["accelerator"] > 0.0
    value = stack_run.metrics["value"]
    assert value["incremental_rma"] > 0.0
    assert value["incremental_sbm"] > 0.0


def test_the_streaming_controller_spends_rma_per_stratum(stack_run: StackRun) -> None:
    # the control plane's per-stratum levels reach the wire (targets.rma.levels) once RMA has a
    # budget and value signals per bin, as in the simulator's headroom policy
    issued = stack_run.kinds("target.issued", "controller")
    with_levels = [e for e in issued if e.get("rma_levels")]
    assert with_levels, [e.get("rma_candidates") for e in issued]
    for e in with_levels:
        for levels in e["rma_levels"].values():
            assert all(0 <= x <= 200 for x in levels)  # within max − base candidates


def test_a_preemption_releases_optional_work_within_50_ms(stack_run: StackRun) -> None:
    reclaims = [e for e in stack_run.kinds("capacity.reclaimed", "feed") if e["t"] == PREEMPT_AT]
    assert len(reclaims) == 1
    released = [
        e
        for e in stack_run.kinds("optional.released", "server")
        if e["resource"] == "accelerator" and PREEMPT_AT <= e["t"] < PREEMPT_AT + 5.0
    ]
    # every replica holding that accelerator pool released it: two mixed ones still alive (the
    # killed one was back by then, so three) and the strong-model replica
    assert len(released) >= 3, released
    assert max(e["release_ms"] for e in released) <= 50.0
    # and the strong model served nothing while its accelerators were gone (5 s to notice)
    during = [
        w
        for w in stack_run.client_windows()
        if w["t_start"] >= PREEMPT_AT + 5.0 and w["t_end"] <= GRANT_AT
    ]
    assert during
    assert sum(w["eligible_treated"].get("sbm", 0) for w in during) == 0
    assert stack_run.metrics["reclaims"]["release_ms_p99"] <= 50.0


def test_a_control_outage_makes_clients_fall_back_when_targets_expire(stack_run: StackRun) -> None:
    ttl = 3.0 * stack_run.interval_s  # ControlConfig.from_scenario: ttl = 3 intervals
    expired = [
        e for e in stack_run.kinds("target.expired", "client") if _t(stack_run, e) >= OUTAGE[0]
    ]
    assert expired, "no target.expired during the control outage"
    t_expired = _t(stack_run, expired[0])
    # the last target before the outage was issued within one interval before it began
    last_issue = OUTAGE[0] - stack_run.interval_s
    assert last_issue + ttl - 2.0 <= t_expired <= OUTAGE[0] + ttl + 2.0
    fallback = [
        w
        for w in stack_run.client_windows()
        if w["t_start"] >= t_expired + 1.0 and w["t_end"] <= OUTAGE[1]
    ]
    assert fallback
    for w in fallback:
        assert w["eligible_treated"] == {"rma": 0, "sbm": 0}, w["t_start"]
        assert w["requests"] > 0  # the baseline goes on


def test_a_killed_server_is_routed_around_without_failed_requests(stack_run: StackRun) -> None:
    requests = stack_run.metrics["requests"]
    assert requests["errors"] == 0, requests
    assert requests["timeouts"] == 0, requests
    around = [
        w for w in stack_run.client_windows() if KILL_SERVER_AT <= w["t_start"] < RESTART_SERVER_AT
    ]
    assert sum(w["requests"] for w in around) > 100


def test_value_signals_add_up_across_a_client_restart(stack_run: StackRun) -> None:
    finished = stack_run.kinds("run.finished", "feed")[0]
    published = finished["published"]["requests"]
    windows = stack_run.client_windows()
    # every request the feed published is in exactly one window line: none lost, none twice
    assert sum(w["requests"] for w in windows) == published
    # the value topic carries the same sums as the window lines: the control arm (published
    # under each lever) and each lever's intent-to-treat group, segment by segment
    control: dict[str, list[float]] = {}
    itt: dict[tuple[str, str], list[float]] = {}
    treated_n = 0
    for w in windows:
        for segment, by_arm in w["arms"].items():
            for arm, sums in by_arm.items():
                if arm == "control":
                    c = control.setdefault(segment, [0, 0.0])
                    c[0] += sums["n"]
                    c[1] += sums["value_sum"]
                else:
                    treated_n += sums["n"]
        for segment, by_lever in w["itt"].items():
            for lever, sums in by_lever.items():
                t = itt.setdefault((segment, lever), [0, 0.0])
                t[0] += sums["n"]
                t[1] += sums["value_sum"]
    # every treatment request is in exactly one intent-to-treat group
    assert treated_n == sum(n for n, _v in itt.values())
    topic: dict[tuple[str, str, str], list[float]] = {}
    for s in stack_run.value_signals:
        t = topic.setdefault((s.segment, s.lever, s.arm), [0, 0.0])
        t[0] += s.n
        t[1] += s.value_sum
    for segment, (n, total) in control.items():
        for lever in ("rma", "sbm"):
            assert topic[(segment, lever, "control")][0] == n
            assert math.isclose(topic[(segment, lever, "control")][1], total, rel_tol=1e-9)
    for (segment, lever), (n, total) in itt.items():
        assert topic[(segment, lever, "treatment")][0] == n
        assert math.isclose(topic[(segment, lever, "treatment")][1], total, rel_tol=1e-9)
    # and the restart really happened mid-run, with requests on both sides of it
    assert sum(w["requests"] for w in windows if w["t_end"] <= KILL_CLIENT_AT) > 500
    assert sum(w["requests"] for w in windows if w["t_start"] >= KILL_CLIENT_AT + 5) > 500


def simulate_headroom(
    scenario: Scenario, interval_s: float
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The simulator's ``headroom`` policy on the same scenario, with the same control interval
    as the real run (the scenario's ``control.interval_s``, which ``simulate`` uses too): the
    events ``run_simulation`` writes, analysed the same way."""
    from headroom.controllers.config import ControlConfig
    from headroom.sim.context import SIM_EPOCH
    from headroom.sim.engine import run_policy
    from headroom.sim.oracle import oracle_for
    from headroom.sim.policies import PolicyFactory
    from headroom.sim.run import build_context

    ctx = build_context(scenario)
    factory = PolicyFactory(
        "headroom", ctx, control=ControlConfig.from_scenario(scenario, interval_s=interval_s)
    )
    bound = oracle_for(ctx).bound()
    events: list[dict[str, Any]] = [
        {
            "v": 1, "ts": SIM_EPOCH, "kind": "run.started", "source": "sim", "policy": None,
            "region": None, "scenario": scenario.name, "seed": ctx.seed,
            "duration_s": ctx.duration_s, "t0": SIM_EPOCH,
            "slo": {"p99_ms": scenario.slo.p99_ms, "window_s": scenario.slo.window_s},
            "segments": list(ctx.segment_names), "regions": [r.name for r in scenario.regions],
            "levers": ["rma", "sbm"], "precompute_enabled": False,
        },
        {
            "v": 1, "ts": SIM_EPOCH, "kind": "oracle.bound", "source": "sim",
            "policy": "headroom", "region": None, "oracle_incremental": bound.total,
            "by_lever": dict(bound.by_lever),
        },
    ]  # fmt: skip
    run_policy(
        ctx, "headroom", factory.region, events.append, control_interval_s=factory.interval_s
    )
    return dict(compute_metrics(events)["policies"]["headroom"]), events


def test_simulate_on_the_same_scenario_is_reported_beside_the_real_run(
    stack_run: StackRun,
) -> None:
    sim, sim_events = simulate_headroom(load_scenario(SCENARIO), stack_run.interval_s)
    real = stack_run.metrics
    gap = compare(real, stack_run.events, sim, sim_events)
    (stack_run.result.out_dir / "sim-vs-real.json").write_text(json.dumps(gap, indent=2))
    print("\nsimulate vs up on stack-short:", json.dumps(gap, indent=2))
    # the feed plays the simulator's own traffic draw: the same requests arrive in both engines
    assert gap["real"]["requests"] == gap["sim"]["requests"]
    assert all(math.isfinite(v) for v in gap["real"].values())
    assert all(math.isfinite(v) for v in gap["sim"].values())
    # the oracle bound of the real run is the simulator's for the same draw
    assert real["value"]["oracle_incremental"] == pytest.approx(sim["value"]["oracle_incremental"])


def compare(
    real: dict[str, Any],
    real_events: list[dict[str, Any]],
    sim: dict[str, Any],
    sim_events: list[dict[str, Any]],
) -> dict[str, Any]:
    """The figures of both engines and their relative gaps ((real − sim) / sim)."""

    def figures(m: dict[str, Any], events: list[dict[str, Any]]) -> dict[str, float]:
        p99s = sorted(window_p99s(events, REGION).values())
        return {
            "worst_window_p99_ms": float(m["slo"]["worst_window_p99_ms"]),
            "median_window_p99_ms": float(p99s[len(p99s) // 2]),
            "violation_fraction": float(m["slo"]["violation_fraction"]),
            "requests": float(m["requests"]["total"]),
            "incremental": float(m["value"]["incremental"]),
            "incremental_rma": float(m["value"]["incremental_rma"]),
            "incremental_sbm": float(m["value"]["incremental_sbm"]),
            "release_ms_p99": float(m["reclaims"]["release_ms_p99"]),
        }

    r, s = figures(real, real_events), figures(sim, sim_events)
    gaps = {
        k: (r[k] - s[k]) / abs(s[k]) if s[k] else (0.0 if r[k] == 0 else math.inf)
        for k in (
            "worst_window_p99_ms",
            "median_window_p99_ms",
            "incremental",
            "incremental_rma",
            "incremental_sbm",
            "requests",
        )
    }
    return {"real": r, "sim": s, "relative_gap": gaps}


def _get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as response:  # loopback, our own endpoint
        return str(response.read().decode())


def _t(run: StackRun, event: dict[str, Any]) -> float:
    started_ = run.kinds("run.started", "feed")[0]
    return float((event["ts"] - started_["t0"]) * started_.get("speed", 1.0))


def test_every_worker_serves_prometheus_metrics(stack_run: StackRun) -> None:
    scraped = stack_run.scraped
    servers = [n for n in scraped if n.startswith("server-")]
    assert len(servers) == 4
    assert {CLIENT, "controller"} <= set(scraped)
    for name in [*servers, CLIENT]:
        assert _has(scraped[name], "headroom_requests_total", 'outcome="ok"'), name
        assert _has(scraped[name], "headroom_request_latency_seconds_bucket", 'path="'), name
    for name in servers:
        assert _has(scraped[name], "headroom_capacity_units", 'hardware="gpu-b"'), name
    assert _has(scraped[CLIENT], "headroom_target_candidates", 'region="it-east"')
    assert _has(scraped[CLIENT], "headroom_optional_multiplier", 'server="dedicated=')


def _has(text: str, metric: str, label: str) -> bool:
    return any(line.startswith(metric + "{") and label in line for line in text.splitlines())


def test_stack_stops_every_process_it_started(stack_run: StackRun) -> None:
    for name, proc in stack_run.result.stack.procs.items():
        assert not proc.running, name
