"""workers/metrics.py: the series read at scrape time — dead letters and consumer lag of the
consumer loops a worker registers, the controller's ticks — and the bind address."""

from __future__ import annotations

import urllib.request
from dataclasses import dataclass, field
from typing import Any

import msgspec
import pytest
from prometheus_client import CollectorRegistry, generate_latest

from headroom.streams.consume import LoopStats, Outcome
from headroom.workers.metrics import (
    METRICS_HOST_ENV,
    consumer_lag,
    make_metrics,
    metrics_host,
    serve_metrics,
    watch_controller,
)


@dataclass(frozen=True)
class TP:
    topic: str
    partition: int


@dataclass
class State:
    highwater: int | None
    position: int | None

    @property
    def has_valid_position(self) -> bool:
        return self.position is not None


@dataclass
class Assignment:
    states: dict[TP, State]

    def state_value(self, tp: TP) -> State:
        return self.states[tp]


@dataclass
class Subscription:
    assignment: Assignment


@dataclass
class SubscriptionState:
    subscription: Subscription


class FakeConsumer:
    """What consumer_lag reads of an aiokafka consumer: its assignment and per-partition state."""

    def __init__(self, states: dict[TP, State]) -> None:
        self._subscription = SubscriptionState(Subscription(Assignment(states)))

    def assignment(self) -> set[TP]:
        return set(self._subscription.subscription.assignment.states)


@dataclass
class FakeLoop:
    stats: LoopStats = field(default_factory=LoopStats)


def _samples(registry: CollectorRegistry, name: str) -> dict[str, float]:
    out = {}
    for line in generate_latest(registry).decode().splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            key, _, value = line.rpartition(" ")
            out[key.removeprefix(name)] = float(value)
    return out


def test_lag_is_the_high_water_mark_minus_the_position_summed_per_topic() -> None:
    consumer = FakeConsumer(
        {
            TP("h.requests", 0): State(highwater=120, position=100),
            TP("h.requests", 1): State(highwater=7, position=7),
            TP("h.targets", 0): State(highwater=3, position=1),
            TP("h.targets", 1): State(highwater=None, position=0),  # not fetched yet: left out
            TP("h.value", 0): State(highwater=9, position=None),  # no position yet: left out
        }
    )
    assert consumer_lag(consumer) == {"h.requests": 20, "h.targets": 2}


def test_a_consumer_not_started_has_no_lag() -> None:
    assert consumer_lag(object()) == {}


def test_watched_loops_export_dead_letters_and_lag() -> None:
    metrics = make_metrics()
    a, b = FakeLoop(), FakeLoop()
    a.stats.add("h.capacity", Outcome.PROCESSED, 5)
    a.stats.add("h.capacity", Outcome.DEADLETTERED, 2)
    b.stats.add("h.capacity", Outcome.DEADLETTERED, 1)
    b.stats.add("h.requests", Outcome.PROCESSED, 3)
    metrics.watch(a, FakeConsumer({TP("h.capacity", 0): State(10, 4)}))
    metrics.watch(b, FakeConsumer({TP("h.requests", 0): State(50, 45)}))
    dead = _samples(metrics.registry, "headroom_messages_deadlettered_total")
    assert dead == {'{topic="h.capacity"}': 3.0, '{topic="h.requests"}': 0.0}
    lag = _samples(metrics.registry, "headroom_consumer_lag_messages")
    assert lag == {'{topic="h.capacity"}': 6.0, '{topic="h.requests"}': 5.0}
    # counted at scrape time: a later dead letter shows in the next scrape
    a.stats.add("h.capacity", Outcome.DEADLETTERED, 1)
    dead = _samples(metrics.registry, "headroom_messages_deadlettered_total")
    assert dead['{topic="h.capacity"}'] == 4.0


@dataclass
class Targets:
    ts: float
    epoch: int


@dataclass
class Decision:
    targets: Targets


class Plane:
    def __init__(self, decisions: dict[str, Decision | None]) -> None:
        self._decisions = decisions

    @property
    def regions(self) -> tuple[str, ...]:
        return tuple(self._decisions)

    def decision(self, region: str) -> Decision | None:
        return self._decisions[region]


@dataclass
class Controller:
    plane: Any
    deadlettered: int = 0


def test_the_controller_exports_its_newest_tick_per_region() -> None:
    metrics = make_metrics()
    ctl = Controller(Plane({"eu": Decision(Targets(1000.5, 7)), "us": None}), deadlettered=2)
    watch_controller(ctl, 60.0, metrics)
    reg = metrics.registry
    ticks = _samples(reg, "headroom_controller_last_tick_timestamp_seconds")
    assert ticks == {'{region="eu"}': 1000.5}  # us: no step yet, no series
    assert _samples(reg, "headroom_controller_target_epoch") == {'{region="eu"}': 7.0}
    assert _samples(reg, "headroom_controller_interval_seconds") == {"": 60.0}
    dead = _samples(reg, "headroom_messages_deadlettered_total")
    assert dead == {'{topic="any"}': 2.0}


def test_the_bind_address_is_loopback_unless_set(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(METRICS_HOST_ENV, raising=False)
    assert metrics_host() == "127.0.0.1"
    monkeypatch.setenv(METRICS_HOST_ENV, " ")
    assert metrics_host() == "127.0.0.1"
    monkeypatch.setenv(METRICS_HOST_ENV, "0.0.0.0")
    assert metrics_host() == "0.0.0.0"


def test_serve_metrics_binds_the_configured_address(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(METRICS_HOST_ENV, "127.0.0.1")
    metrics = make_metrics()
    metrics.slo.labels("eu").set(0.25)
    port = serve_metrics(0, metrics.registry)
    url = f"http://127.0.0.1:{port}/metrics"
    with urllib.request.urlopen(url, timeout=10) as response:  # loopback, our own endpoint
        text = response.read().decode()
    assert 'headroom_slo_p99_seconds{region="eu"} 0.25' in text


async def test_a_server_counts_the_work_a_reclaim_releases_and_how_long_it_took() -> None:
    import asyncio
    import time

    from headroom.kernel.scenario_load import load_scenario
    from headroom.workers.server import RankingServer, ServerConfig
    from headroom.world.ranking import RankingWorld
    from tests.unit.test_stack_server import REGION, SCENARIO, _cap, _client, _req

    scenario = load_scenario(SCENARIO)
    metrics = make_metrics()
    server = RankingServer(
        ServerConfig(region=REGION, pool="dedicated", replica="m9"),
        scenario,
        None,
        world=RankingWorld.from_scenario(scenario),
        metrics=metrics,
    )
    await server.start()
    client = await _client(server)
    try:
        now = time.time()
        server.on_capacity(_cap("cpu", 3.0, ts=now))
        server.on_capacity(_cap("accelerator", 2.0, ts=now))
        # extras of 1.2 s each: still running when the capacity goes
        calls = [
            asyncio.ensure_future(client.call(_req(10 + i, extra=3000), 30.0)) for i in range(4)
        ]
        for _ in range(200):
            await asyncio.sleep(0.01)
            if server._occ_cpu > 0.0:
                break
        server.on_capacity(_cap("cpu", 0.0, ts=now + 1.0, reason="preempt"))
        await asyncio.wait_for(asyncio.gather(*calls), 10.0)
        await asyncio.sleep(0.05)
    finally:
        await client.close()
        await server.stop()
    reg = metrics.registry
    assert _samples(reg, "headroom_slo_p99_seconds") == {
        f'{{region="{REGION}"}}': scenario.slo.p99_ms / 1000.0
    }
    # labelled with the pool whose capacity was reclaimed
    count = _samples(reg, "headroom_release_latency_seconds_count")
    assert count == {f'{{pool="opportunistic",region="{REGION}"}}': float(len(server.releases))}
    assert server.releases
    total = _samples(reg, "headroom_release_latency_seconds_sum")
    assert total[f'{{pool="opportunistic",region="{REGION}"}}'] == pytest.approx(
        sum(server.releases) / 1000.0
    )
    released = _samples(reg, "headroom_released_total")
    # the extras of the requests in flight were cut: candidates of the rma lever
    assert released[f'{{lever="rma",region="{REGION}"}}'] > 0


async def test_a_client_flags_an_expired_target_and_counts_the_value_it_publishes() -> None:
    from headroom.kernel.scenario_load import load_scenario
    from headroom.streams import messages
    from headroom.streams.kafka import KafkaTarget
    from headroom.workers.client import ClientConfig, RankingClient, ServerAddress
    from tests.unit.test_stack_server import SCENARIO

    now = [1.8e9]
    metrics = make_metrics()
    scenario = load_scenario(SCENARIO)
    client = RankingClient(
        ClientConfig(
            region="it-east", servers=(ServerAddress("dedicated", "127.0.0.1", 9),), group="g"
        ),
        scenario,
        KafkaTarget("127.0.0.1:1", "t."),
        metrics=metrics,
        clock=lambda: now[0],
    )

    async def emit(*_args: object, **_kw: object) -> None:  # no broker here
        return None

    client._emit = emit  # type: ignore[method-assign]
    reg = metrics.registry
    assert _samples(reg, "headroom_slo_p99_seconds") == {'{region="it-east"}': 0.25}
    target = messages.Target(
        ts=now[0],
        region="it-east",
        epoch=3,
        ttl_s=10.0,
        rma=messages.RmaTarget(candidates=250, base=100, max=300),
        sbm=messages.SbmTarget(coverage=0.3, segments={"casual": 0.4}),
        budget=messages.Budget(cpu=1.0, accelerator=1.0),
        reason="pid",
    )
    assert client.targets.offer(target)
    client._target_transitions()
    assert _samples(reg, "headroom_target_expired") == {'{region="it-east"}': 0.0}
    assert _samples(reg, "headroom_target_candidates") == {'{region="it-east"}': 250.0}
    now[0] += 11.0  # past the target's ttl: the baseline is in force
    client._target_transitions()
    assert _samples(reg, "headroom_target_expired") == {'{region="it-east"}': 1.0}
    assert _samples(reg, "headroom_target_candidates") == {'{region="it-east"}': 100.0}
    # a held target's factor (defences/plan.py): 1 until one is held
    assert _samples(reg, "headroom_target_held_scale") == {'{region="it-east"}': 1.0}
    held = msgspec.structs.replace(target, epoch=4, ts=now[0])
    assert client.targets.offer(held)
    client._target_transitions()
    client._rate_at_apply = 40.0  # the client's rate when it applied the target
    later = client.scenario_time(now[0]) + 8.0  # past 1.5 intervals of 5 s
    client.rates.add(later, 100.0)  # and a rate far below it
    client.held_target(client.targets.state(now[0] + 8.0), later)
    assert _samples(reg, "headroom_target_held_scale")['{region="it-east"}'] > 1.0

    def signal(lever: str, arm: str, n: int, value_sum: float) -> messages.ValueSignal:
        return messages.ValueSignal(
            ts=now[0], region="it-east", segment="casual", lever=lever,  # type: ignore[arg-type]
            arm=arm, n=n, value_sum=value_sum, value_sq_sum=value_sum**2, window_s=5.0,  # type: ignore[arg-type]
            cost=messages.Cost(cpu_ms=1.0, accelerator_ms=0.0), stratum=None,
        )  # fmt: skip

    for s in (signal("rma", "treatment", 10, 6.0), signal("rma", "control", 2, 1.0)):
        client._count_value(s)
    client._count_value(signal("rma", "treatment", 5, 3.5))
    value = _samples(reg, "headroom_value_total")
    requests = _samples(reg, "headroom_value_requests_total")
    treated = '{arm="treatment",lever="rma",region="it-east"}'
    control = '{arm="control",lever="rma",region="it-east"}'
    assert value == {treated: 9.5, control: 1.0}
    assert requests == {treated: 15.0, control: 2.0}
