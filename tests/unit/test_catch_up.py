"""The catch-up rule of a lagging client (headroom.defences.catch_up) and its use by the client."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from headroom.defences.catch_up import (
    CatchUp,
    CatchUpConfig,
    baseline_capacity_rps,
    catch_up_rate,
    peak_rps,
)
from headroom.kernel.errors import ConfigError
from headroom.kernel.scenario_load import load_scenario
from headroom.streams import messages

STACK_SHORT = Path(__file__).parents[1] / "integration" / "scenarios" / "stack-short.yaml"


def test_a_request_is_late_once_it_waited_longer_than_the_lag() -> None:
    rule = CatchUp(CatchUpConfig(rate=10.0, lag_s=1.0), now=0.0)
    assert not rule.late(100.0, 100.5)
    assert not rule.late(100.0, 101.0)
    assert rule.late(100.0, 101.01)
    assert rule.late_requests == 1


def test_a_burst_goes_at_once_then_late_requests_are_spaced_by_the_rate() -> None:
    rule = CatchUp(CatchUpConfig(rate=50.0, burst=4), now=0.0)
    waits = [rule.wait(10.0) for _ in range(8)]
    assert waits[:4] == [0.0] * 4
    assert waits[4:] == pytest.approx([0.02, 0.04, 0.06, 0.08])
    # idle time refills the bucket up to its depth only
    assert rule.wait(100.0) == 0.0
    rule2 = CatchUp(CatchUpConfig(rate=50.0, burst=2), now=0.0)
    assert [rule2.wait(1000.0) for _ in range(3)] == pytest.approx([0.0, 0.0, 0.02])


@given(
    rate=st.floats(1.0, 500.0),
    burst=st.integers(1, 20),
    gaps=st.lists(st.floats(0.0, 0.05), min_size=1, max_size=300),
)
def test_late_requests_never_go_faster_than_the_rate_plus_one_burst(
    rate: float, burst: int, gaps: list[float]
) -> None:
    # a backlog read as fast as the consumer hands it out: each request is dispatched after its
    # wait, and the next one is taken once the previous one went (the consumer loop's order)
    rule = CatchUp(CatchUpConfig(rate=rate, burst=burst), now=0.0)
    t = 0.0
    sent = []
    for gap in gaps:
        t += gap
        t += rule.wait(t)
        sent.append(t)
    times = np.array(sent)
    for i, start in enumerate(times):
        for span in (0.0, 0.1, 1.0):
            count = int(np.sum((times >= start) & (times <= start + span + 1e-9)))
            assert count <= burst + rate * span + 1e-6, (i, span, count)


def test_the_config_is_checked() -> None:
    for bad in ({"rate": 0.0}, {"rate": 1.0, "lag_s": 0.0}, {"rate": 1.0, "burst": 0}):
        with pytest.raises(ConfigError):
            CatchUpConfig(**bad)  # type: ignore[arg-type]


def test_the_rate_is_a_share_of_the_dedicated_baseline_capacity_or_drains_the_peak() -> None:
    s = load_scenario(STACK_SHORT)
    # 3.6 CPU units at 100 candidates × 0.4 ms: 90 baseline requests/s (the accelerator, 1 unit
    # at 100 × 0.08 ms, would take 125)
    assert baseline_capacity_rps(s, "it-east") == pytest.approx(90.0)
    assert catch_up_rate(s, "it-east") == pytest.approx(72.0)
    peak = peak_rps(s, "it-east")
    assert peak == pytest.approx(40.0 * math.exp(0.1))
    # little spare capacity: the backlog still drains at the peak rate (× drain)
    assert catch_up_rate(s, "it-east", utilisation=0.1) == pytest.approx(1.25 * peak)
    # scenario seconds per wall second scale the rate the requests come at
    assert catch_up_rate(s, "it-east", speed=4.0, utilisation=0.1) == pytest.approx(5.0 * peak)
    with pytest.raises(KeyError):
        catch_up_rate(s, "nowhere")


# -- the client: a late request is served baseline-only, in its arm --------------------------------


def _client(clock: list[float]) -> Any:
    from headroom.streams.kafka import KafkaTarget
    from headroom.workers.client import ClientConfig, RankingClient, ServerAddress

    config = ClientConfig(
        region="it-east",
        servers=(ServerAddress("dedicated", "127.0.0.1", 9),),  # never connected
        group="g",
        t0=1.8e9,
        precompute=False,
    )
    return RankingClient(
        config, load_scenario(STACK_SHORT), KafkaTarget("127.0.0.1:1", "t."),
        clock=lambda: clock[0],
    )  # fmt: skip


async def test_a_late_request_gets_no_optional_work_and_keeps_its_holdout_draw() -> None:
    clock = [1.8e9 + 10.0]
    client = _client(clock)
    base = client.scenario.world.base_candidates
    client.targets.offer(
        messages.Target(
            ts=clock[0], region="it-east", epoch=1, ttl_s=60.0,
            rma=messages.RmaTarget(candidates=base + 50, base=base, max=300),
            sbm=messages.SbmTarget(coverage=1.0, segments={"casual": 1.0, "premium": 1.0}),
            budget=messages.Budget(cpu=1.0, accelerator=1.0), reason="pid",
        )
    )  # fmt: skip
    extras: list[int] = []

    async def call_base(msg: Any, t_s: float, extra: int, first: Any) -> None:
        extras.append(extra)
        return None

    client._call_base = call_base
    server = client._servers[0]
    client._dedicated = lambda exclude=(): server  # as if connected: its multiplier is 1
    outs: dict[bool, list[Any]] = {False: [], True: []}
    for i, v in enumerate(np.random.default_rng(3).lognormal(0.0, 1.0, 2000)):
        lag = 5.0 if i % 2 else 0.1
        msg = messages.Request(
            ts=clock[0] - lag, id=f"q{i}", region="it-east", segment="casual", value=float(v),
            eligible=True, user=i,
        )  # fmt: skip
        late = client._late(msg)
        assert late == (lag > 1.0)
        outs[late].append(await client.serve_request(msg, 0, i, late=late))
    assert len(extras) == 2000  # one base call per request (no strong replica, no cache)
    on_time, late_extras = extras[0::2], extras[1::2]
    assert max(on_time) > 0  # the target's extras reach the requests on time
    assert len(late_extras) == 1000
    assert max(late_extras) == 0
    holdout = client.scenario.world.holdout
    for group in outs.values():
        control = np.array([o.control for o in group])
        n = len(group)
        assert abs(control.mean() - holdout) < 4.5 * np.sqrt(holdout * (1 - holdout) / n)
        assert {o.routed for o in group if not o.control} == {"rma"}  # no strong replica here
    assert client.catch_up.late_requests == 1000


async def test_a_backlog_is_dispatched_at_the_catch_up_rate_and_fresh_requests_at_once() -> None:
    import asyncio
    import time

    from headroom.streams.consume import Received
    from headroom.workers.client import Outcome

    clock = [1.8e9 + 100.0]
    client = _client(clock)
    rate = client.catch_up.config.rate  # 72 per second on stack-short
    burst = client.catch_up.config.burst
    sent: list[tuple[float, bool]] = []

    async def serve(msg: Any, partition: int, offset: int, *, late: bool = False) -> Outcome:
        sent.append((time.monotonic(), late))
        return Outcome(
            partition=partition, offset=offset, segment=msg.segment, end_t=0.0, latency_ms=1.0,
            ok=True, timeout=False, control=False, lever=None, sbm_served=False, routed=None,
            value_total=0.0, value_baseline=0.0,
        )  # fmt: skip

    client.serve_request = serve
    client.published_known.set()  # as after an assignment (no Kafka here)

    def received(offset: int, lag_s: float) -> Received:
        msg = messages.Request(
            ts=clock[0] - lag_s, id=f"q{offset}", region="it-east", segment="casual",
            value=1.0, eligible=True, user=offset,
        )  # fmt: skip
        return Received("t.requests", "requests", 0, offset, b"it-east", 0, msg)

    backlog = 40
    start = time.monotonic()
    for offset in range(backlog):  # waited 5 s in the topic: late
        await client._on_request(received(offset, 5.0))
    paced = time.monotonic() - start
    for offset in range(backlog, backlog + 20):  # fresh: never held
        await client._on_request(received(offset, 0.05))
    fresh = time.monotonic() - start - paced
    await asyncio.sleep(0.05)
    assert len(sent) == backlog + 20
    assert [late for _t, late in sent] == [True] * backlog + [False] * 20
    # the backlog went no faster than the rate after its burst (~0.5 s); the upper bounds are
    # loose for a loaded host (a bucket that never refilled would take ~9 s, 1/72 s more each)
    assert paced >= (backlog - burst) / rate - 0.01
    assert paced < 4.0
    assert fresh < 2.0
    assert client.stats["requests"] == backlog + 20
