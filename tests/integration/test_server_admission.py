"""A streaming ranking server on a real broker holds optional work to the admitted share of its
level — the number the simulator's servers use for that level.

One replica (``headroom.workers.server.RankingServer``, share 1) reads its opportunistic level
from the ``capacity`` topic and is offered several times the optional work that level admits,
open loop. Its ``window`` lines on ``events`` carry the unit-seconds its optional work occupied;
over the windows after the ramp-up, the busy share of the level (``used ÷ (level × window)``)
must stay at or below :func:`headroom.defences.admission.admitted_share` of the replica's stage,
computed here with the simulator's own inputs (``headroom.sim.policies.HeadroomRegion``), and be
well above zero (the server does use what it may). The shedding core admits optional work at the
admitted level's rate and the phases run it at full speed; a loaded host only stretches phases a
little (``MARGIN``), and the offered work is several times what is admitted.

* mixed (RMA) replica: RMA requests with 200 extra candidates (up to ``max_candidates``),
  opportunistic CPU 2 cores and gpu-b 2 devices on top of 2 dedicated cores and 1 gpu-a device,
  under a 100 ms p99 (so the rule admits about 30 % of the CPU level);
* strong-model (SBM) replica: strong requests on 1 opportunistic gpu-b device and 3 cores.

A replica holding optional work to the whole level (the server before the rule) fails both: it
ran the mixed replica's CPU level 68 % busy and the strong replica's device 62 % busy here.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from headroom.kernel.scenario import Scenario
from headroom.kernel.scenario_load import load_scenario
from headroom.sim.context import Quotas
from headroom.streams import messages
from headroom.streams.kafka import KafkaTarget, make_producer
from headroom.workers.server import RankingServer, ServerConfig
from headroom.workers.wire import RankRequest, RankResponse, WireClient
from headroom.world.ranking import RankingWorld
from tests.conftest import run_async
from tests.integration.topic_reads import decode_topic
from tests.unit.test_stack_server import simulator_shares

pytestmark = pytest.mark.integration

SCENARIO = Path(__file__).parent / "scenarios" / "stack-short.yaml"
REGION = "it-east"
MEASURE_S = 25.0  # wall seconds of offered load (speed 1: five 5-second SLO windows)
VALUES = np.random.default_rng(7).lognormal(0.0, 1.0, 4096)  # the requests' value signals
# The admitted share bounds the *rate* of admitted work (plus one bucket, two requests deep);
# occupancy is measured on the wall clock, so a loaded host's event-loop lag stretches phases and
# inflates it a little (a 40 ms phase that ends 4 ms late: +10 %). Measured here: 0.85-0.9 × k.
MARGIN = 1.10  # over all measured windows
WINDOW_MARGIN = 1.25  # any one window (a bucket's burst weighs more in 5 s)


def capacity(resource: str, hardware: str, units: float) -> messages.Capacity:
    return messages.Capacity(
        ts=time.time(),
        region=REGION,
        resource=resource,  # type: ignore[arg-type]
        hardware=hardware,
        pool="opportunistic",
        units=units,
        reason="grant",
        id=f"adm-{resource}-{hardware}",
    )


@dataclass
class Run:
    windows: list[dict[str, Any]]  # the server's window lines over the measured span
    responses: list[RankResponse]
    window_s: float


async def _publish(kafka: KafkaTarget, msgs: list[messages.Capacity]) -> None:
    producer = make_producer(kafka.bootstrap)
    await producer.start()
    try:
        for m in msgs:
            await producer.send_and_wait(kafka.topic("capacity"), messages.encode(m), key=m.key())
    finally:
        await producer.stop()


async def _events(kafka: KafkaTarget) -> list[dict[str, Any]]:
    return [
        {"kind": ev.kind, "source": ev.source, **ev.extra}
        for ev in await decode_topic(kafka, "events")
    ]


async def _offer(
    server: RankingServer, make: Any, rps: float, duration_s: float
) -> list[RankResponse]:
    """Open loop: one request every ``1/rps`` seconds for ``duration_s``; waits for them all."""
    assert server.port is not None
    client = WireClient("127.0.0.1", server.port)
    await client.connect()
    calls: list[asyncio.Future[RankResponse]] = []
    try:
        start = time.monotonic()
        i = 0
        while time.monotonic() - start < duration_s:
            calls.append(asyncio.ensure_future(client.call(make(i), 30.0)))
            i += 1
            await asyncio.sleep(max(0.0, start + i / rps - time.monotonic()))
        return list(await asyncio.gather(*calls))
    finally:
        await client.close()


def _run(
    kafka: KafkaTarget,
    scenario: Scenario,
    pool: str,
    levels: list[messages.Capacity],
    make: Any,
    rps: float,
    warmup_s: float,
) -> Run:
    world = RankingWorld.from_scenario(scenario)

    async def go() -> Run:
        await _publish(kafka, levels)
        t0 = time.time()
        server = RankingServer(
            ServerConfig(region=REGION, pool=pool, replica=f"adm-{pool}", t0=t0),  # type: ignore[arg-type]
            scenario,
            kafka,
            world=world,
        )
        await server.start()
        try:
            await asyncio.wait_for(server.ready.wait(), 60.0)
            await asyncio.sleep(warmup_s)
            begin = server.scenario_time()
            responses = await _offer(server, make, rps, MEASURE_S)
            end = server.scenario_time()
        finally:
            await server.stop()
        window_s = scenario.slo.window_s
        events = await _events(kafka)
        windows = [
            e
            for e in events
            if e["kind"] == "window"
            and e["source"] == "server"
            # whole windows under load, after one window of ramp-up
            and e["t_start"] >= begin + window_s
            and e["t_end"] <= end
        ]
        return Run(windows, responses, window_s)

    return run_async(go())


def _busy(run: Run, resource: str, units: float) -> tuple[float, list[float]]:
    """The busy share of a level of ``units`` over all measured windows, and per window."""
    per = [w["used_unit_s"][resource] / (units * run.window_s) for w in run.windows]
    return sum(per) / len(per), per


def tight(scenario: Scenario) -> Scenario:
    """The short scenario with a 100 ms p99 and 2 dedicated cores: a mixed replica's CPU stage is
    one server of 10 ms requests with a 4.25 ms wait budget, so it admits optional work up to
    about 30 % of its level (a replica holding optional work to the whole level runs it ~55 %
    busy under this load)."""
    region = scenario.regions[0]
    return dataclasses.replace(
        scenario,
        slo=dataclasses.replace(scenario.slo, p99_ms=100.0),
        regions=(
            dataclasses.replace(region, dedicated=dataclasses.replace(region.dedicated, cpu=2.0)),
        ),
    )


def test_a_mixed_replica_holds_rma_work_to_the_admitted_share_of_its_stage(
    kafka_target: KafkaTarget,
) -> None:
    scenario = tight(load_scenario(SCENARIO))
    cpu, acc = 2.0, 2.0
    k_cpu, k_acc, _ = simulator_shares(scenario, Quotas(cpu, acc, 0.0, 0.0), REGION)
    assert 0.2 < k_cpu < 0.4  # the rule cuts here: a replica holding the whole level fails
    n0 = scenario.world.base_candidates
    extra = scenario.world.max_candidates - n0  # 80 ms of optional CPU each
    rps = 30.0  # 2.4 cores of optional work offered against 2 × k_cpu

    def make(i: int) -> RankRequest:
        return RankRequest(
            id=i, user=10_000 + i, segment="casual", t_s=0.0, base=n0, extra=extra,
            model="base", value=float(VALUES[i % VALUES.size]), budget_ms=2000.0,
        )  # fmt: skip

    run = _run(
        kafka_target,
        scenario,
        "dedicated",
        [capacity("cpu", "any", cpu), capacity("accelerator", "gpu-b", acc)],
        make,
        rps=rps,
        warmup_s=0.5,
    )
    assert len(run.windows) >= 3, run.windows
    assert all(r.ok for r in run.responses)  # the baseline of every request is served
    offered = len(run.responses) * extra * scenario.models.base.cpu_ms_per_candidate / 1000.0
    assert offered / MEASURE_S > 1.5 * cpu * k_cpu  # more optional work than the level admits
    assert any(r.candidates < n0 + extra for r in run.responses)  # so some of it was shed
    share, per = _busy(run, "cpu", cpu)
    assert share <= k_cpu * MARGIN + 0.01, (share, k_cpu, per)
    assert max(per) <= k_cpu * WINDOW_MARGIN + 0.02, (per, k_cpu)
    assert share >= 0.5 * k_cpu, (share, k_cpu, per)  # it does use what it may
    acc_share, acc_per = _busy(run, "accelerator", acc)
    assert acc_share <= k_acc * MARGIN + 0.01, (acc_share, k_acc, acc_per)
    print(f"mixed replica: cpu busy {share:.3f} of admitted {k_cpu:.3f} (windows {per}); "
          f"accelerator {acc_share:.3f} of {k_acc:.3f}")  # fmt: skip


def test_a_strong_replica_holds_strong_work_to_the_admitted_share_of_its_devices(
    kafka_target: KafkaTarget,
) -> None:
    scenario = load_scenario(SCENARIO)
    acc = 1.0
    _, _, k_strong = simulator_shares(scenario, Quotas(0.0, 0.0, 0.0, acc), REGION)
    assert 0.3 < k_strong < 0.8  # one device queues long: about half of it
    n0 = scenario.world.base_candidates
    strong_s = n0 * scenario.models.strong.accelerator_ms_per_candidate / 1000.0

    def make(i: int) -> RankRequest:
        return RankRequest(
            id=i, user=20_000 + i, segment="premium", t_s=0.0, base=n0, extra=0,
            model="strong", value=float(VALUES[i % VALUES.size]), budget_ms=2000.0,
        )  # fmt: skip

    rps = 40.0  # 1.6 device-seconds per second offered against 1 × k_strong
    run = _run(
        kafka_target,
        scenario,
        "opportunistic",
        [capacity("cpu", "any", 3.0), capacity("accelerator", "gpu-b", acc)],
        make,
        rps=rps,
        warmup_s=scenario.models.strong.load_s + 0.5,  # the strong model loads first
    )
    assert len(run.windows) >= 3, run.windows
    assert rps * strong_s > 2.0 * acc * k_strong
    served = sum(1 for r in run.responses if r.ok)
    assert 0 < served < len(run.responses)  # some served, the rest downgraded
    share, per = _busy(run, "accelerator", acc)
    assert share <= k_strong * MARGIN + 0.01, (share, k_strong, per)
    assert max(per) <= k_strong * WINDOW_MARGIN + 0.02, (per, k_strong)
    assert share >= 0.5 * k_strong, (share, k_strong, per)
    print(f"strong replica: accelerator busy {share:.3f} of admitted {k_strong:.3f} "
          f"(windows {per}); served {served} of {len(run.responses)}")  # fmt: skip
