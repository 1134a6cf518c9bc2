"""The ranking server without Kafka: capacity book, slots, shedding on every request and at once
on a capacity drop, the strong model's load time, health in every response."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path

import numpy as np
import pytest
import pytest_asyncio

from headroom.controllers.config import ControlConfig
from headroom.defences.shedding import OptionalCapacity
from headroom.kernel.errors import ConfigError, HeadroomError
from headroom.kernel.scenario import Scenario
from headroom.kernel.scenario_load import load_scenario
from headroom.sim.context import Quotas
from headroom.streams import messages
from headroom.workers.server import RankingServer, ReplicaBook, ServerConfig, SlotPool
from headroom.workers.wire import RankRequest, RankResponse, WireClient
from headroom.world.ranking import RankingWorld

SCENARIO = Path(__file__).parents[1] / "integration" / "scenarios" / "stack-short.yaml"
REGION = "it-east"


@pytest.fixture(scope="module")
def scenario() -> Scenario:
    return load_scenario(SCENARIO)


@pytest.fixture(scope="module")
def world(scenario: Scenario) -> RankingWorld:
    return RankingWorld.from_scenario(scenario)


def _cap(
    resource: str, units: float, *, ts: float, hardware: str | None = None, **kw: object
) -> messages.Capacity:
    return messages.Capacity(
        ts=ts,
        region=str(kw.pop("region", REGION)),
        resource=resource,  # type: ignore[arg-type]
        hardware=hardware or ("any" if resource == "cpu" else "gpu-b"),
        pool=str(kw.pop("pool", "opportunistic")),  # type: ignore[arg-type]
        units=units,
        reason=str(kw.pop("reason", "grant")),  # type: ignore[arg-type]
        id=f"c-{resource}-{ts}",
        **kw,  # type: ignore[arg-type]
    )


# -- capacity book --------------------------------------------------------------------------------


def test_the_newest_level_wins_and_a_repeat_changes_nothing(scenario: Scenario) -> None:
    book = ReplicaBook(scenario, REGION, "dedicated", 1.0)
    assert book.update(_cap("cpu", 3.0, ts=10.0))
    assert not book.update(_cap("cpu", 3.0, ts=10.0))  # the same message again: nothing changes
    assert not book.update(_cap("cpu", 9.0, ts=5.0))  # older message: ignored
    assert book.update(_cap("cpu", 3.0, ts=11.0))
    cap = book.capacity(11.0)
    assert cap.level.cpu == 3.0
    assert cap.slots_cpu == pytest.approx(3.6 + 3.0)  # dedicated + opportunistic
    assert not book.update(_cap("cpu", 1.0, ts=12.0, region="elsewhere"))


def test_hardware_remote_pools_expiry_and_share(scenario: Scenario) -> None:
    mixed = ReplicaBook(scenario, REGION, "dedicated", 0.5)
    strong = ReplicaBook(scenario, REGION, "opportunistic", 1.0)
    msgs = [
        _cap("accelerator", 2.0, ts=1.0, hardware="gpu-b"),  # both models run on gpu-b
        _cap("accelerator", 4.0, ts=1.0, hardware="gpu-a"),  # only the base model does
        _cap("accelerator", 8.0, ts=1.0, hardware="gpu-c", remote=True),  # async work only
        _cap("cpu", 2.0, ts=1.0, expires_in_s=10.0),
    ]
    for m in msgs:
        mixed.update(m)
        strong.update(m)
    assert mixed.capacity(2.0).level.accelerator == pytest.approx(0.5 * 6.0)
    assert strong.capacity(2.0).level.accelerator == pytest.approx(2.0)
    assert mixed.capacity(2.0).level.cpu == pytest.approx(1.0)
    assert strong.capacity(11.0 - 1e-6).level.cpu == pytest.approx(2.0)
    assert strong.capacity(11.0).level.cpu == 0.0  # its announced lifetime lapsed at ts + 10 s
    assert strong.next_expiry(2.0) == 11.0
    # the strong replica's slots are the opportunistic pool alone
    assert strong.capacity(2.0).slots_accelerator == pytest.approx(2.0)


def simulator_shares(
    scenario: Scenario, q: Quotas, region: str = REGION
) -> tuple[float, float, float]:
    """(k_cpu, k_accelerator, k_strong): the admitted shares the simulator's servers apply to
    quotas ``q`` in ``region`` (``HeadroomRegion._admission``), for a stand-in run holding the
    parts of a ``RegionRun`` it reads."""
    from types import SimpleNamespace

    from headroom.controllers.plane import ControlPlane
    from headroom.sim.context import SimContext, baseline_plan, build_mix
    from headroom.sim.policies import HeadroomRegion
    from tests.unit.test_precompute_sim import fake_curves

    ctx = SimContext(scenario, fake_curves(tuple(x.name for x in scenario.segments)))
    plane = ControlPlane(ControlConfig.from_scenario(scenario), np.random.default_rng(0))
    sim_region = HeadroomRegion(plane, ctx)
    d = scenario.region(region).dedicated
    sim_region.bind(
        SimpleNamespace(  # type: ignore[arg-type]  # the parts of a RegionRun it reads
            static=SimpleNamespace(name=region, ded_cpu=d.cpu, ded_acc=d.accelerator),
            base_mix=build_mix(ctx, baseline_plan(ctx)),
            cfg=ctx.config,
        )
    )
    return sim_region._admission(q)


def test_optional_work_is_held_to_the_admitted_share_the_simulator_uses(
    scenario: Scenario,
) -> None:
    """The streaming replicas admit optional work up to ``level × admitted share`` of their
    stage — the same number the simulator's server model (``HeadroomRegion._admission``) gives
    the same stage: both call defences.admission.admitted_share with the same inputs."""
    mixed = ReplicaBook(scenario, REGION, "dedicated", 1.0)
    strong = ReplicaBook(scenario, REGION, "opportunistic", 1.0)
    for m in (_cap("cpu", 3.0, ts=1.0), _cap("accelerator", 2.0, ts=1.0)):
        mixed.update(m)
        strong.update(m)
    m_cap, s_cap = mixed.capacity(2.0), strong.capacity(2.0)
    # the simulator, its region holding the same levels as RMA's and SBM's quotas
    k_c, k_a, _ = simulator_shares(
        scenario, Quotas(rma_cpu=3.0, rma_acc=2.0, sbm_cpu=0.0, sbm_acc=0.0)
    )
    _, _, k_s = simulator_shares(
        scenario, Quotas(rma_cpu=0.0, rma_acc=0.0, sbm_cpu=0.0, sbm_acc=2.0)
    )
    d = scenario.region(REGION).dedicated
    assert m_cap.level == OptionalCapacity(3.0, 2.0)
    assert m_cap.optional.cpu == pytest.approx(3.0 * k_c, rel=1e-9)
    assert m_cap.optional.accelerator == pytest.approx(2.0 * k_a, rel=1e-9)
    assert s_cap.optional.accelerator == pytest.approx(2.0 * k_s, rel=1e-9)
    # a real cut, not a formality: small stages run well below full
    assert 0.2 < k_s < 0.9
    assert 0.0 < k_c <= 0.9
    assert 0.0 < k_a <= 0.9
    # the slots keep the whole level: the capacity is there, only optional work is held back
    assert m_cap.slots_cpu == pytest.approx(d.cpu + 3.0)
    assert s_cap.slots_accelerator == pytest.approx(2.0)


def test_an_unknown_region_is_a_config_error(scenario: Scenario) -> None:
    with pytest.raises(ConfigError, match="--region"):
        ReplicaBook(scenario, "mars", "dedicated", 1.0)


def test_server_config_names_bad_flags() -> None:
    with pytest.raises(ConfigError, match="--share") as info:
        ServerConfig(region="r", pool="dedicated", replica="x", share=0.0, speed=-1.0)
    assert any("--speed" in p for p in info.value.problems)


# -- slots ----------------------------------------------------------------------------------------


def test_fractional_units_become_slower_slots() -> None:
    pool = SlotPool("acc", 2.5)
    assert (pool.slots, pool.speed) == (3, pytest.approx(2.5 / 3))
    pool.resize(0.0)
    assert pool.slots == 0
    pool.resize(4.0)
    assert (pool.slots, pool.speed) == (4, 1.0)


async def test_slots_are_handed_out_in_order_and_a_shrink_keeps_held_slots() -> None:
    pool = SlotPool("cpu", 1.0)
    await pool.acquire()
    order: list[int] = []

    async def waiter(i: int) -> None:
        await pool.acquire()
        order.append(i)

    tasks = [asyncio.create_task(waiter(i)) for i in range(3)]
    await asyncio.sleep(0)
    assert pool.waiting == 3
    pool.resize(0.0)  # capacity gone: the held slot stays held, nobody new gets one
    pool.release()
    await asyncio.sleep(0)
    assert order == []
    pool.resize(2.0)  # back, and bigger: two waiters at once, first come first served
    await asyncio.sleep(0)
    assert order == [0, 1]
    pool.release()
    await asyncio.sleep(0)
    assert order == [0, 1, 2]
    for t in tasks:
        await t


async def test_a_wide_request_takes_several_slots_and_is_not_overtaken() -> None:
    pool = SlotPool("cpu", 3.0)
    assert await pool.acquire(2) == 2
    wide = asyncio.create_task(pool.acquire(3))  # needs all three: waits for the two
    await asyncio.sleep(0)
    narrow = asyncio.create_task(pool.acquire(1))  # one is free, but the wide one is first
    await asyncio.sleep(0)
    assert not wide.done()
    assert not narrow.done()
    pool.release(2)
    assert await wide == 3
    assert not narrow.done()
    pool.release(3)
    assert await narrow == 1
    pool.release(1)
    assert await asyncio.wait_for(pool.acquire(8), 1.0) == 3  # never more than the pool has
    assert pool.busy == 3


async def test_baseline_waiters_go_before_optional_ones() -> None:
    pool = SlotPool("cpu", 2.0)
    assert await pool.acquire(2) == 2
    order: list[str] = []

    async def waiter(name: str, n: int, low: bool) -> None:
        await pool.acquire(n, low=low)
        order.append(name)

    opt = asyncio.create_task(waiter("optional", 1, True))  # queued first, at low priority
    await asyncio.sleep(0)
    base = asyncio.create_task(waiter("baseline", 2, False))  # a wide baseline part, later
    await asyncio.sleep(0)
    assert pool.waiting == 2
    pool.release(1)  # one slot free: the baseline head needs two, and optional work may not pass
    await asyncio.sleep(0)
    assert order == []
    pool.release(1)
    await asyncio.sleep(0)
    assert order == ["baseline"]
    pool.release(1)
    await asyncio.sleep(0)
    assert order == ["baseline", "optional"]
    # with nobody waiting, optional work takes a free slot at once; a low waiter queued behind
    # another low waiter keeps its turn
    pool.release(2)
    assert await asyncio.wait_for(pool.acquire(1, low=True), 1.0) == 1
    for t in (opt, base):
        await t


async def test_a_cancelled_waiter_does_not_leak_a_slot() -> None:
    pool = SlotPool("cpu", 1.0)
    await pool.acquire()
    task = asyncio.create_task(pool.acquire())
    await asyncio.sleep(0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    pool.release()
    assert pool.busy == 0
    await asyncio.wait_for(pool.acquire(), 1.0)
    assert pool.busy == 1


# -- the server -----------------------------------------------------------------------------------


class Clock:
    """Wall clock that tests can move forward (the server's scenario time and shedding time)."""

    def __init__(self) -> None:
        self.offset = 0.0

    def __call__(self) -> float:
        return time.time() + self.offset


@pytest_asyncio.fixture(loop_scope="function")
async def mixed(scenario: Scenario, world: RankingWorld) -> AsyncIterator[RankingServer]:
    server = RankingServer(
        ServerConfig(region=REGION, pool="dedicated", replica="m1"), scenario, None, world=world
    )
    await server.start()
    try:
        yield server
    finally:
        await server.stop()


async def test_a_port_in_use_is_a_clear_error_naming_the_flag(
    scenario: Scenario, world: RankingWorld
) -> None:
    taken = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
    port = int(taken.sockets[0].getsockname()[1])
    server = RankingServer(
        ServerConfig(region=REGION, pool="dedicated", replica="m2", port=port),
        scenario,
        None,
        world=world,
    )
    try:
        with pytest.raises(HeadroomError, match=f"--port {port}: cannot listen on"):
            await server.start()
    finally:
        await server.stop()
        taken.close()
        await taken.wait_closed()


async def _client(server: RankingServer) -> WireClient:
    assert server.port is not None
    client = WireClient("127.0.0.1", server.port)
    await client.connect()
    return client


def _req(
    i: int, extra: int = 0, model: str = "base", value: float = 1.0, budget_ms: float = 1000.0
) -> RankRequest:
    return RankRequest(
        id=i, user=1000 + i, segment="casual", t_s=0.0, base=100, extra=extra,
        model=model, value=value, budget_ms=budget_ms,  # type: ignore[arg-type]
    )  # fmt: skip


async def test_without_opportunistic_capacity_extras_are_shed_and_the_baseline_is_served(
    mixed: RankingServer, world: RankingWorld
) -> None:
    client = await _client(mixed)
    try:
        r = await client.call(_req(1, extra=150), 10.0)
        assert r.ok
        assert r.candidates == 100
        assert r.decision == "SHED"
        # the baseline's pick, and it is the base model's choice among the first 100 candidates
        users = world.users([1001], "casual")
        cands = world.retrieve_batch(users, 100, 0.0)
        scores = world.score_batch(users, "casual", cands, "base", 0.0)[0]
        assert r.top_ad == r.base_top_ad == int(cands[0][scores.argmax()])
        assert r.health.queue_ms >= 0.0
        assert r.health.overloaded is False
    finally:
        await client.close()


async def test_with_opportunistic_capacity_extras_are_ranked(mixed: RankingServer) -> None:
    now = time.time()
    mixed.on_capacity(_cap("cpu", 3.0, ts=now))
    mixed.on_capacity(_cap("accelerator", 2.0, ts=now))
    client = await _client(mixed)
    try:
        r = await client.call(_req(2, extra=150), 10.0)
        assert (r.ok, r.candidates, r.decision) == (True, 250, "ADMIT")
        assert r.base_top_ad >= 0
    finally:
        await client.close()


async def test_extras_that_cannot_finish_within_the_budget_are_trimmed_before_they_start(
    mixed: RankingServer,
) -> None:
    now = time.time()
    mixed.on_capacity(_cap("cpu", 0.75, ts=now))  # 200 extras: 107 ms of CPU on 0.75 cores
    mixed.on_capacity(_cap("accelerator", 1.0, ts=now))
    client = await _client(mixed)
    try:
        r = await client.call(_req(3, extra=200, budget_ms=125.0), 10.0)
        assert r.ok
        assert r.decision == "TRIM"
        assert 100 < r.candidates < 300  # the extras that fit are ranked, not all of them
    finally:
        await client.close()


async def test_a_capacity_drop_cuts_optional_work_in_flight_at_once(mixed: RankingServer) -> None:
    now = time.time()
    mixed.on_capacity(_cap("cpu", 3.0, ts=now))
    mixed.on_capacity(_cap("accelerator", 2.0, ts=now))
    client = await _client(mixed)
    try:
        # extras of 1.2 s each (3000 × 0.4 ms): surely still running when the capacity goes
        calls = [
            asyncio.ensure_future(client.call(_req(10 + i, extra=3000), 30.0)) for i in range(6)
        ]
        for _ in range(200):
            await asyncio.sleep(0.01)
            if mixed._occ_cpu > 0.0:
                break
        assert mixed._occ_cpu > 0.0
        mixed.on_capacity(_cap("cpu", 0.0, ts=now + 1.0, reason="preempt"))
        mixed.on_capacity(_cap("accelerator", 0.0, ts=now + 1.0, reason="preempt"))
        responses = await asyncio.wait_for(asyncio.gather(*calls), 10.0)
        assert all(r.ok for r in responses)  # the baseline of every request is served
        assert all(r.candidates == 100 for r in responses)
        assert all(r.decision == "SHED" for r in responses)
        await asyncio.sleep(0.05)
        assert mixed.releases  # measured, on the server's own clock
        assert mixed._occ_cpu == 0.0
        assert mixed._occ_acc == 0.0
        assert mixed.shedder.stats.inflight_cut >= 1
    finally:
        await client.close()


async def _strong_server(
    scenario: Scenario, world: RankingWorld, clock: Clock
) -> tuple[RankingServer, WireClient]:
    """A started strong-model replica on ``clock`` (no capacity yet) and a client of it."""
    server = RankingServer(
        ServerConfig(region=REGION, pool="opportunistic", replica="s1"),
        scenario,
        None,
        world=world,
        clock=clock,
    )
    await server.start()
    return server, await _client(server)


async def test_the_strong_model_serves_only_once_loaded(
    scenario: Scenario, world: RankingWorld
) -> None:
    clock = Clock()
    server, client = await _strong_server(scenario, world, clock)
    try:
        r = await client.call(_req(1, model="strong", value=5.0), 10.0)
        assert (r.ok, r.downgraded) == (False, True)  # no capacity at all
        now = clock()
        server.on_capacity(_cap("cpu", 3.0, ts=now))
        server.on_capacity(_cap("accelerator", 2.0, ts=now))
        r = await client.call(_req(2, model="strong", value=5.0), 10.0)
        assert (r.ok, r.downgraded, r.error) == (False, True, "strong model not loaded")
        clock.offset += scenario.models.strong.load_s + 0.1
        r = await client.call(_req(3, model="strong", value=5.0), 10.0)
        assert (r.ok, r.model, r.candidates) == (True, "strong", 100)
        assert r.base_top_ad >= 0
        # a preemption unloads it
        server.on_capacity(_cap("accelerator", 0.0, ts=clock() + 1.0, reason="preempt"))
        r = await client.call(_req(4, model="strong", value=5.0), 10.0)
        assert r.downgraded
    finally:
        await client.close()
        await server.stop()


async def test_a_strong_replica_takes_a_burst_of_one_request_more_than_its_devices(
    scenario: Scenario, world: RankingWorld
) -> None:
    clock = Clock()
    server, client = await _strong_server(scenario, world, clock)
    try:
        one = server.book.admission.request_ms
        assert server.shedder.min_depth_ms == pytest.approx(2 * one)  # no device yet
        now = clock()
        server.on_capacity(_cap("cpu", 3.0, ts=now))
        server.on_capacity(_cap("accelerator", 3.0, ts=now))
        assert server.shedder.min_depth_ms == pytest.approx(4 * one)
        clock.offset += scenario.models.strong.load_s + 0.1
        # four strong requests at once all find a device or the one queue place
        got = await asyncio.gather(
            *(client.call(_req(i, model="strong", value=5.0), 10.0) for i in range(4))
        )
        assert [r.model for r in got] == ["strong"] * 4
        # fewer devices, a shallower bucket
        server.on_capacity(_cap("accelerator", 1.0, ts=clock() + 1.0, reason="preempt"))
        assert server.shedder.min_depth_ms == pytest.approx(2 * one)
    finally:
        await client.close()
        await server.stop()


async def test_requests_in_flight_finish_on_drain(mixed: RankingServer) -> None:
    client = await _client(mixed)
    try:
        calls = [asyncio.ensure_future(client.call(_req(40 + i), 10.0)) for i in range(4)]
        await asyncio.sleep(0.01)
        await mixed.drain()
        responses: list[RankResponse] = await asyncio.gather(*calls)
        assert all(r.ok for r in responses)
    finally:
        await client.close()


async def test_the_server_counts_requests_latency_shedding_and_capacity(
    scenario: Scenario, world: RankingWorld
) -> None:
    from prometheus_client import generate_latest

    from headroom.workers.metrics import make_metrics

    metrics = make_metrics()
    server = RankingServer(
        ServerConfig(region=REGION, pool="dedicated", replica="m2"),
        scenario,
        None,
        world=world,
        metrics=metrics,
    )
    await server.start()
    client = await _client(server)
    try:
        server.on_capacity(_cap("cpu", 0.0, ts=time.time()))  # no opportunistic CPU: extras shed
        await client.call(_req(1), 10.0)
        await client.call(_req(2, extra=50), 10.0)
    finally:
        await client.close()
        await server.stop()
    text = generate_latest(metrics.registry).decode()
    assert 'headroom_requests_total{outcome="ok",path="base",region="it-east"} 2.0' in text
    assert 'headroom_request_latency_seconds_count{path="base",region="it-east"} 2.0' in text
    assert 'headroom_shed_total{lever="rma",region="it-east",side="server"} 50.0' in text
    assert 'resource="cpu"} 0.0' in text
