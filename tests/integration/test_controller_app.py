"""The Faust controller app on a real broker, run as a worker process (`headroom controller`).

Scenario of the tests: one region with spare opportunistic CPU and accelerators announced on the
capacity topic. Latency samples well below the SLO must make the RMA candidate target rise above
base; samples above the SLO (some produced by kcat) must make it fall back toward base,
monotonically. Malformed samples go to the dead-letter topic while the app runs on. After kill -9
and a restart the app resumes from its tables: the first new target is within one rate-limit step
of the last one. A material rise of the spare capacity between ticks steps the region at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

from headroom.controllers.config import ControlConfig
from headroom.kernel.scenario_load import load_scenario
from headroom.kernel.settings import default_scenario_path
from headroom.kernel.sketch import LatencySketch
from headroom.streams import messages
from tests.conftest import terminate

pytestmark = pytest.mark.integration

REGION = "it-east"
SLO_MS = 200.0  # the quickstart scenario's slo.p99_ms
START_S = 60.0  # the longest the controller may take to issue its first target


def _capacity(ts: float, resource: str, hardware: str, units: float, n: int) -> bytes:
    return messages.encode(
        messages.Capacity(
            ts=ts,
            region=REGION,
            resource=resource,
            hardware=hardware,
            pool="opportunistic",
            units=units,
            expires_in_s=None,
            reason="grant",
            id=f"cap-{resource}-{n}",
        )
    )


def _value(ts: float, segment: str, lever: str, arm: str, mean: float) -> bytes:
    n = 200
    # a tight spread so the uplift's lower confidence bound is clearly positive
    return messages.encode(
        messages.ValueSignal(
            ts=ts,
            region=REGION,
            segment=segment,
            lever=lever,
            arm=arm,
            n=n,
            value_sum=n * mean,
            value_sq_sum=n * (mean * mean + 0.01),
            window_s=0.25,
            cost=messages.Cost(cpu_ms=0.0, accelerator_ms=0.0),
        )
    )


def _latency(ts: float, value_ms: float, count: int = 50) -> bytes:
    sk = LatencySketch(0.01)
    for i in range(count):
        sk.add(value_ms * (0.6 + 0.4 * i / count))
    return messages.encode(
        messages.Latency(
            ts=ts,
            region=REGION,
            replica="r1",
            pool="dedicated",
            path="base",
            window_s=0.25,
            count=count,
            samples_ms=None,
            sketch=sk,
            inflight=4,
            queue_ms=1.0,
        )
    )


class ControllerProcess:
    def __init__(self, bootstrap: str, prefix: str, workdir: Path) -> None:
        self.bootstrap = bootstrap
        self.prefix = prefix
        self.workdir = workdir
        self.proc: subprocess.Popen[bytes] | None = None
        self.log = workdir / "controller.log"

    def start(self, ttl_s: float | None = None, interval_s: float = 1.0) -> None:
        # Faust's own lines at info: where a controller stalls, its log shows where
        env = dict(
            os.environ,
            HEADROOM_CONTROLLER_DIR=str(self.workdir),
            HEADROOM_LOG_FORMAT="json",
            HEADROOM_FAUST_LOG_LEVEL="info",
        )
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "headroom.cli",
                "controller",
                "--interval",
                str(interval_s),
                "--bootstrap",
                self.bootstrap,
                "--prefix",
                self.prefix,
                *([] if ttl_s is None else ["--ttl", str(ttl_s)]),
            ],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=self.log.open("ab"),
        )

    def kill9(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=10)

    def stop(self) -> None:
        terminate(self.proc)


@pytest.fixture
def controller(
    kafka_bootstrap: str, topic_prefix: str, tmp_path: Path
) -> Iterator[ControllerProcess]:
    proc = ControllerProcess(kafka_bootstrap, topic_prefix, tmp_path)
    proc.start()
    try:
        yield proc
    finally:
        proc.stop()


async def _collect_targets(
    consumer: AIOKafkaConsumer, n: int, timeout_s: float
) -> list[messages.Target]:
    out: list[messages.Target] = []
    deadline = time.monotonic() + timeout_s
    while len(out) < n and time.monotonic() < deadline:
        batch = await consumer.getmany(timeout_ms=500)
        for records in batch.values():
            for r in records:
                msg = messages.decode("targets", r.value)
                if isinstance(msg, messages.Target) and msg.region == REGION:
                    out.append(msg)
    return out


def _kcat_produce(bootstrap: str, topic: str, key: str, payload: bytes) -> None:
    subprocess.run(
        ["kcat", "-P", "-b", bootstrap, "-t", topic, "-k", key],
        input=payload,
        check=True,
        timeout=30,
    )


async def _feed(
    producer: AIOKafkaProducer,
    prefix: str,
    value_ms: float,
    seconds: float,
    bad: bool = False,
    cpu: float = 16.0,
    accelerator: float = 4.0,
) -> None:
    end = time.monotonic() + seconds
    n = 0
    while time.monotonic() < end:
        now = time.time()
        await producer.send_and_wait(
            f"{prefix}capacity", _capacity(now, "cpu", "any", cpu, n), key=REGION.encode()
        )
        await producer.send_and_wait(
            f"{prefix}capacity",
            _capacity(now, "accelerator", "gpu-b", accelerator, n),
            key=REGION.encode(),
        )
        await producer.send_and_wait(
            f"{prefix}latency", _latency(now, value_ms), key=REGION.encode()
        )
        for segment in ("premium", "casual"):
            for lever in ("rma", "sbm"):
                for arm, mean in (("treatment", 1.2), ("control", 1.0)):
                    await producer.send_and_wait(
                        f"{prefix}value",
                        _value(now, segment, lever, arm, mean),
                        key=REGION.encode(),
                    )
        if bad:
            await producer.send_and_wait(
                f"{prefix}latency", b'{"v":1,"ts":"soon"}', key=REGION.encode()
            )
        n += 1
        await asyncio.sleep(0.25)


def _rate_limit_step() -> int:
    config = ControlConfig.from_scenario(load_scenario(default_scenario_path()), interval_s=1.0)
    span = config.max_candidates - config.base_candidates
    step = max(config.pid.max_step_up, config.pid.max_step_down)
    return max(1, round(step * span))


async def test_candidate_target_rises_when_fast_and_falls_monotonically_when_slow(
    controller: ControllerProcess, kafka_bootstrap: str, topic_prefix: str
) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap)
    consumer = AIOKafkaConsumer(
        f"{topic_prefix}targets", bootstrap_servers=kafka_bootstrap, auto_offset_reset="earliest"
    )
    await producer.start()
    await consumer.start()
    try:
        # Fast samples and spare capacity: the target rises above base.
        _, rising = await asyncio.gather(
            _feed(producer, topic_prefix, value_ms=0.3 * SLO_MS, seconds=14.0),
            _collect_targets(consumer, 1000, timeout_s=14.0),
        )
        assert rising, "the controller published no target"
        base = rising[-1].rma.base
        assert rising[-1].rma.candidates > base, [t.rma.candidates for t in rising]

        # Slow samples (one batch produced by kcat, a third-party client): the target falls
        # toward base, never rising on the way.
        _kcat_produce(
            kafka_bootstrap, f"{topic_prefix}latency", REGION, _latency(time.time(), 3 * SLO_MS)
        )
        peak_epoch = rising[-1].epoch
        _, late = await asyncio.gather(
            _feed(producer, topic_prefix, value_ms=2.5 * SLO_MS, seconds=14.0),
            _collect_targets(consumer, 1000, timeout_s=14.0),
        )
        falling = [t for t in late if t.epoch > peak_epoch]
        values = [t.rma.candidates for t in falling]
        assert len(values) >= 5, values
        assert all(b <= a for a, b in itertools.pairwise(values)), values
        assert values[-1] < rising[-1].rma.candidates
        assert values[-1] <= base + _rate_limit_step(), values
    finally:
        await consumer.stop()
        await producer.stop()


async def test_malformed_samples_are_deadlettered_while_the_app_runs_on(
    controller: ControllerProcess, kafka_bootstrap: str, topic_prefix: str
) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap)
    targets = AIOKafkaConsumer(
        f"{topic_prefix}targets", bootstrap_servers=kafka_bootstrap, auto_offset_reset="earliest"
    )
    dead = AIOKafkaConsumer(
        f"{topic_prefix}deadletter", bootstrap_servers=kafka_bootstrap, auto_offset_reset="earliest"
    )
    await producer.start()
    await targets.start()
    await dead.start()
    try:
        # First make sure the app consumes (it starts at the latest offset): fed until its first
        # target (a loaded host can take long to start the app), then send bad input: kcat's
        # non-JSON bytes and, between good samples, structurally invalid ones.
        feeding = asyncio.create_task(
            _feed(producer, topic_prefix, value_ms=0.3 * SLO_MS, seconds=START_S)
        )
        try:
            ready = await _collect_targets(targets, 1, timeout_s=START_S)
        finally:
            feeding.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await feeding
        assert ready, "the controller published no target"
        _kcat_produce(kafka_bootstrap, f"{topic_prefix}latency", REGION, b"not json at all")
        await _feed(producer, topic_prefix, value_ms=0.3 * SLO_MS, seconds=6.0, bad=True)
        letters: list[messages.DeadLetter] = []
        deadline = time.monotonic() + 10
        while len(letters) < 2 and time.monotonic() < deadline:
            for records in (await dead.getmany(timeout_ms=500)).values():
                for r in records:
                    m = messages.decode("deadletter", r.value)
                    assert isinstance(m, messages.DeadLetter)
                    letters.append(m)
        assert len(letters) >= 2
        assert all(dl.topic == f"{topic_prefix}latency" for dl in letters)
        errors = [dl.error for dl in letters]
        assert any("json" in e.lower() for e in errors), errors  # kcat's non-JSON bytes
        # A field-level failure: '{"v":1,"ts":"soon"}' is named at its first fault in the
        # bytes (ts) or at a missing field.
        assert any(e.startswith(("ts:", "region:")) for e in errors), errors
        # ... and the app kept issuing targets after the bad input.
        issued = await _collect_targets(targets, 3, timeout_s=10.0)
        assert len(issued) >= 3
    finally:
        await dead.stop()
        await targets.stop()
        await producer.stop()


# Targets outlive the restart (a Kafka group needs a session timeout to notice a killed member):
# otherwise clients would rightly have fallen back to the baseline, and so would the plane.
@pytest.mark.parametrize("controller", [120.0], indirect=True)
async def test_kill9_restart_resumes_within_one_rate_limit_step(
    controller: ControllerProcess, kafka_bootstrap: str, topic_prefix: str
) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap)
    consumer = AIOKafkaConsumer(
        f"{topic_prefix}targets", bootstrap_servers=kafka_bootstrap, auto_offset_reset="earliest"
    )
    await producer.start()
    await consumer.start()
    try:
        _, before = await asyncio.gather(
            _feed(producer, topic_prefix, value_ms=0.3 * SLO_MS, seconds=12.0),
            _collect_targets(consumer, 1000, timeout_s=12.0),
        )
        assert before
        assert before[-1].rma.candidates > before[-1].rma.base
        controller.kill9()
        last = before[-1]
        controller.start(ttl_s=120.0)
        # Keep the inputs flowing while the new worker joins and recovers its tables.
        feeding = asyncio.create_task(
            _feed(producer, topic_prefix, value_ms=0.3 * SLO_MS, seconds=25.0)
        )
        after: list[messages.Target] = []
        deadline = time.monotonic() + 30
        while not after and time.monotonic() < deadline:
            after = [
                t
                for t in await _collect_targets(consumer, 1, timeout_s=1.0)
                if t.epoch > last.epoch
            ]
        feeding.cancel()
        assert after, "the restarted controller published no target"
        first = after[0]
        assert abs(first.rma.candidates - last.rma.candidates) <= _rate_limit_step(), (
            last.rma.candidates,
            first.rma.candidates,
        )
    finally:
        await consumer.stop()
        await producer.stop()


REACT_INTERVAL_S = 16.0  # long enough that a loaded host's tick lands well before a quarter of it


async def test_a_capacity_rise_between_ticks_steps_the_region_at_once(
    kafka_bootstrap: str, topic_prefix: str, tmp_path: Path
) -> None:
    # Ticks at k × 16 s. Capacity unchanged: targets only at ticks. Then, a third of an
    # interval after a tick, the region's spare CPU rises from 2 to 16 cores: the controller
    # steps the region at once (controllers/react.py), between ticks, with the larger budget,
    # rather than leaving the cores idle until the next tick.
    proc = ControllerProcess(kafka_bootstrap, topic_prefix, tmp_path)
    proc.start(interval_s=REACT_INTERVAL_S)
    producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap)
    consumer = AIOKafkaConsumer(
        f"{topic_prefix}targets", bootstrap_servers=kafka_bootstrap, auto_offset_reset="earliest"
    )
    await producer.start()
    await consumer.start()
    interval = REACT_INTERVAL_S

    def phase(t: messages.Target) -> float:
        return (t.ts % interval) / interval

    try:

        async def small(seconds: float) -> None:
            await _feed(producer, topic_prefix, 0.3 * SLO_MS, seconds, cpu=2.0, accelerator=1.0)

        seen: list[messages.Target] = []
        deadline = time.monotonic() + START_S + interval
        while not seen and time.monotonic() < deadline:
            _, got = await asyncio.gather(
                small(1.0),
                _collect_targets(consumer, 1000, timeout_s=1.0),
            )
            seen += got
        assert seen, "the controller published no target"
        # the next tick's target, with the small capacity known for a whole interval
        tick: list[messages.Target] = []
        deadline = time.monotonic() + 2 * interval
        while not tick and time.monotonic() < deadline:
            _, got = await asyncio.gather(
                small(1.0),
                _collect_targets(consumer, 1000, timeout_s=1.0),
            )
            tick += [t for t in got if t.epoch > seen[-1].epoch]
        assert tick, "no target at the next tick"
        at_tick = tick[-1]
        # unchanged capacity stepped the region at ticks only
        assert all(min(phase(t), 1.0 - phase(t)) < 0.2 for t in [*seen, *tick]), [
            round(phase(t), 3) for t in [*seen, *tick]
        ]
        # a third of an interval after that tick, the rise
        await small(max(at_tick.ts + interval / 3.0 - time.time(), 0.0))
        _, after = await asyncio.gather(
            _feed(producer, topic_prefix, value_ms=0.3 * SLO_MS, seconds=interval / 3.0),
            _collect_targets(consumer, 1000, timeout_s=interval / 3.0),
        )
        between = [t for t in after if t.epoch > at_tick.epoch and 0.25 <= phase(t) <= 0.75]
        assert between, [(round(phase(t), 3), t.budget.cpu) for t in after]
        assert between[0].budget.cpu > at_tick.budget.cpu, (at_tick.budget, between[0].budget)
    finally:
        await consumer.stop()
        await producer.stop()
        proc.stop()
