"""The precompute worker and the client cache on a real broker.

A short run: capacity levels (a remote gpu-b pool and remote CPU the worker may use, a remote
gpu-a pool the strong model cannot use) and requests go in; the worker ranks the users with the
real strong model and writes results to the compacted ``precompute`` topic; a
:class:`PrecomputeCache` reading that topic serves them before their expiry, never after, and
deletes them when the worker's tombstones arrive. Then a reclaim of the remote accelerators stops
running jobs at once (``wasted_partial``), a malformed request is dead-lettered while the worker
goes on, and the events topic carries the worker's window lines. Value signals published on the
``value`` topic rescale the worker's uplift model (a precisely harmful segment is switched off,
with an event; other levers' and regions' signals are ignored, malformed ones dead-lettered).
Finally the command line runs the same worker as a process and drains on SIGTERM.
"""

from __future__ import annotations

import asyncio
import os
import selectors
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from headroom.controllers.precompute import PrecomputeConfig
from headroom.kernel.scenario import Scenario
from headroom.kernel.scenario_load import load_scenario
from headroom.streams import messages
from headroom.streams.kafka import KafkaTarget, make_consumer, make_producer
from headroom.workers.precompute import PrecomputeWorker, WorkerSettings, rank_batch
from headroom.workers.precompute_lookup import PrecomputeCache, VisitOutcome
from headroom.world.ranking import RankingWorld
from tests.signals import value_signal as shared_value_signal

pytestmark = pytest.mark.integration

REGION = "it-pre"
REPO = Path(__file__).resolve().parents[2]
SCENARIO = """
name: precompute-it
seed: 5
duration_s: 600
slo: {p99_ms: 200, window_s: 2}
world: {ads: 2000, dim: 16, base_candidates: 50, max_candidates: 100, holdout: 0.02,
        drift_per_h: 0.5, users: 1000}
models:
  base: {cpu_ms_per_candidate: 0.1, accelerator_ms_per_candidate: 0.02, hardware: [gpu-a, gpu-b]}
  strong: {cpu_ms_per_candidate: 0.005, accelerator_ms_per_candidate: 0.1, hardware: [gpu-b]}
segments:
  - {name: premium, share: 0.3, value: {mean: 3.0, sigma: 0.5}, base_error: 0.3, strong_error: 0.1,
     return_rate_per_h: 6.0}
  - {name: casual,  share: 0.7, value: {mean: 0.6, sigma: 0.5}, base_error: 0.5, strong_error: 0.2,
     return_rate_per_h: 3.0}
regions:
  - name: it-pre
    dedicated: {cpu: 8, accelerator: 2, hardware: gpu-a}
    traffic: {rps: 10}
"""
TTL_S = 6.0  # the lifetime cap: short, so results expire within the test
JOB_S = 2.0  # a job's batch time: long enough for a reclaim to find jobs running


def capacity(resource: str, hardware: str, units: float, n: int) -> messages.Capacity:
    return messages.Capacity(
        ts=time.time(),
        region=REGION,
        resource=resource,  # type: ignore[arg-type]
        hardware=hardware,
        pool="opportunistic",
        units=units,
        reason="grant" if units else "reclaim",
        id=f"cap-{n}",
        remote=True,
    )


def request(user: int, n: int, region: str = REGION) -> messages.Request:
    return messages.Request(
        ts=time.time(),
        id=f"q-{n}",
        region=region,
        segment="casual" if user % 2 else "premium",
        value=1.0,
        eligible=True,
        user=user,
    )


async def until(check: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout_s} s waiting for {what}")
        await asyncio.sleep(0.05)


async def read_all(kafka: KafkaTarget, kind: str, idle_s: float = 1.5) -> list[Any]:
    """Every record of a topic (all partitions, from the beginning) until ``idle_s`` of quiet."""
    consumer = make_consumer(kafka.bootstrap, kafka.topic(kind), group_id=None, from_beginning=True)
    await consumer.start()
    records: list[Any] = []
    try:
        quiet_since = time.monotonic()
        while time.monotonic() - quiet_since < idle_s:
            batch = await consumer.getmany(timeout_ms=200)
            for recs in batch.values():
                records.extend(recs)
                quiet_since = time.monotonic()
    finally:
        await consumer.stop()
    return records


@pytest.fixture
def scenario_file(tmp_path: Path) -> Path:
    path = tmp_path / "precompute-it.yaml"
    path.write_text(SCENARIO)
    return path


@dataclass
class Rig:
    """A precompute worker of this test's region on the scenario, and a producer to feed it."""

    scenario: Scenario
    config: PrecomputeConfig
    worker: PrecomputeWorker
    producer: Any
    kafka: KafkaTarget

    @classmethod
    async def start(cls, kafka: KafkaTarget, scenario_file: Path, **config: Any) -> Rig:
        """The worker (not started) with ``config`` over a fast default rate; the producer is."""
        scenario = load_scenario(scenario_file)
        world = RankingWorld.from_scenario(scenario)
        curves = world.measure_curves(samples_per_segment=32, grid_points=3)
        cfg = PrecomputeConfig.from_scenario(scenario, default_jobs_per_s=200.0, **config)
        producer = make_producer(kafka.bootstrap)
        await producer.start()
        worker = PrecomputeWorker(
            WorkerSettings(region=REGION, tick_s=0.05),
            scenario,
            kafka,
            config=cfg,
            world=world,
            curves=curves,
        )
        return cls(scenario, cfg, worker, producer, kafka)

    async def send(self, kind: str, msg: Any) -> None:
        topic = self.kafka.topic(kind)
        await self.producer.send_and_wait(topic, messages.encode(msg), key=msg.key())


async def test_results_stored_served_before_expiry_tombstoned_after_and_reclaim_stops_jobs(
    kafka_target: KafkaTarget, scenario_file: Path
) -> None:
    rig = await Rig.start(
        kafka_target, scenario_file, job_duration_s=JOB_S, max_ttl_s=TTL_S, refresh_after=1.0
    )
    worker, producer, send, config = rig.worker, rig.producer, rig.send, rig.config
    cache = PrecomputeCache(REGION, kafka_target)
    try:
        await send("capacity", capacity("accelerator", "gpu-b", 2.0, 1))
        await send("capacity", capacity("cpu", "any", 2.0, 2))
        await send("capacity", capacity("accelerator", "gpu-a", 8.0, 3))  # not for the strong model
        await worker.start()
        await asyncio.wait_for(worker.ready.wait(), 60)
        assert {key[1] for key in worker.jobs.pools} == {"gpu-b", "any"}
        await cache.start()
        await asyncio.wait_for(cache.ready.wait(), 60)

        users = list(range(30))
        for i, user in enumerate(users):
            await send("requests", request(user, i))
        await send("requests", request(999, 99, region="elsewhere"))
        await producer.send_and_wait(kafka_target.topic("requests"), b"{not json", key=b"x")

        # stored: every user gets a result, the real strong-model ranking of the world
        await until(lambda: all(cache.lookup(u, time.time()) for u in users), 30, "30 results")
        now = time.time()
        check_world = RankingWorld.from_scenario(
            rig.scenario
        )  # not the worker's: it ranks in a thread
        for user in users[:6]:
            result = cache.lookup(user, now)
            assert result is not None
            assert result.expires_at > now
            seg = config.segment_index(result.segment)
            t_rank = worker.scenario_time(result.ts)
            expected = rank_batch(check_world, [user], seg, config.candidates, t_rank, config.keep)
            assert result.ranking == expected[0]
        # served before expiry
        visit = cache.visit(users[0], time.time())
        assert visit.outcome is VisitOutcome.HIT
        assert worker.stats.requests == 30  # the other region's request was not ours
        assert worker.stats.jobs_completed == 30

        # never served after expiry, and tombstoned: the cache forgets them
        latest = max(r.expires_at for r in cache.store)
        await until(lambda: time.time() > latest, TTL_S + 5, "the results to expire")
        assert all(cache.lookup(u, time.time()) is None for u in users)
        await until(lambda: cache.counts.tombstones >= 30, 15, "30 tombstones")
        assert len(cache.store) == 0
        # a tombstone for a result already past its expiry ends it as expired, not deleted, so
        # every result is counted once, by how it really ended
        assert cache.store.counts.expired_used == 1  # the one served result
        assert cache.store.counts.expired_unused == 29
        assert cache.store.counts.deleted_used + cache.store.counts.deleted_unused == 0

        # a reclaim of the remote accelerators stops running jobs at once
        for i, user in enumerate(range(100, 140)):
            await send("requests", request(user, 200 + i))
        await until(lambda: len(worker.jobs.jobs) > 0, 15, "jobs to run")
        running = len(worker.jobs.jobs)
        completed_before = worker.stats.jobs_completed
        await send("capacity", capacity("accelerator", "gpu-b", 0.0, 4))
        await until(lambda: worker.stats.wasted_partial >= running, 10, "the reclaim")
        assert not worker.jobs.jobs
        assert worker.stats.releases_ms
        await asyncio.sleep(JOB_S + 0.5)
        assert worker.stats.jobs_completed == completed_before  # nothing half-done delivered
    finally:
        await cache.stop()
        await worker.stop()
        await producer.stop()

    # the topic: every key ends with a tombstone
    last: dict[bytes, bytes | None] = {}
    for record in await read_all(kafka_target, "precompute"):
        last[record.key] = record.value
    keys = {messages.precompute_key(REGION, u) for u in users}
    assert keys <= set(last)
    assert all(last[k] is None for k in keys)

    # the malformed request went to the dead-letter topic
    letters = [
        messages.decode("deadletter", r.value) for r in await read_all(kafka_target, "deadletter")
    ]
    assert any(d.topic == kafka_target.topic("requests") for d in letters)

    # the event log: jobs per window add up, expiries and the release are there
    events = [messages.decode("events", r.value) for r in await read_all(kafka_target, "events")]
    mine = [e for e in events if e.source == "precompute" and e.region == REGION]
    windows = [e for e in mine if e.kind == "window"]
    assert sum(e["precompute"]["jobs"] for e in windows) == worker.stats.jobs_completed
    assert sum(e["precompute"]["wasted_partial"] for e in windows) == worker.stats.wasted_partial
    expired = [e for e in mine if e.kind == "precompute.result.expired"]
    assert sum(e["expired"] for e in expired) == worker.stats.tombstoned
    completed = [e for e in mine if e.kind == "precompute.job.completed"]
    assert sum(e["jobs"] for e in completed) == worker.stats.jobs_completed
    released = [e for e in mine if e.kind == "optional.released"]
    assert sum(e["dropped"]["precompute_jobs"] for e in released) == worker.stats.wasted_partial


def value_signal(segment: str, arm: str, n: int, mean: float, **kw: Any) -> messages.ValueSignal:
    """A value signal of this test's region, stamped now (stratum 3)."""
    kw.setdefault("region", REGION)
    return shared_value_signal(segment, arm, n, mean, ts=time.time(), window_s=2.0, stratum=3, **kw)


async def test_value_signals_on_the_value_topic_rescale_the_worker_uplift(
    kafka_target: KafkaTarget, scenario_file: Path
) -> None:
    """Value signals published on ``value``: the worker keeps its region's ``precompute`` ones,
    ignores the others, dead-letters malformed records, and at the next window switches off the
    segment whose measured uplift is precisely harmful (an event on ``events``)."""
    rig = await Rig.start(kafka_target, scenario_file, job_duration_s=0.2, max_ttl_s=60.0)
    worker, producer, send, config = rig.worker, rig.producer, rig.send, rig.config
    users = list(range(20))  # even: premium, odd: casual
    try:
        await send("capacity", capacity("accelerator", "gpu-b", 2.0, 1))
        await send("capacity", capacity("cpu", "any", 2.0, 2))
        await worker.start()
        await asyncio.wait_for(worker.ready.wait(), 60)
        for i, user in enumerate(users):
            await send("requests", request(user, i))
        await until(lambda: worker.stats.jobs_completed >= len(users), 30, "20 results")
        for i, user in enumerate(users):  # they come back and find their results
            await send("requests", request(user, 100 + i))
        await until(lambda: worker.stats.requests >= 2 * len(users), 30, "the second visits")
        assert worker.planner is not None
        curves_model = worker.planner.uplift
        casual = worker.calibrator.measure(curves_model)[config.segment_index("casual")]
        assert casual.staleness_source == "measured"
        assert casual.predicted is not None
        assert casual.predicted > 0.0
        harmful = 1.0 - casual.predicted

        await send("value", value_signal("casual", "treatment", 2000, harmful))
        await send("value", value_signal("casual", "control", 500, 1.0))
        await send("value", value_signal("casual", "treatment", 2000, 5.0, lever="sbm"))
        await send("value", value_signal("casual", "control", 500, 1.0, region="elsewhere"))
        value_topic = kafka_target.topic("value")
        await producer.send_and_wait(value_topic, b"{not json", key=REGION.encode())
        bad = messages.encode(value_signal("casual", "control", 5, 1.0)).replace(
            b'"lever":"precompute"', b'"lever":"nonsense"'
        )
        assert bad != messages.encode(value_signal("casual", "control", 5, 1.0))
        await producer.send_and_wait(value_topic, bad, key=REGION.encode())

        await until(lambda: worker.stats.rescaled >= 1, 30, "the rescale")
        assert (worker.stats.value_signals, worker.stats.value_ignored) == (2, 2)
        await until(lambda: worker.stats.deadlettered >= 2, 15, "two dead letters")
        casual_now = worker.calibration[config.segment_index("casual")]
        assert (casual_now.status, casual_now.scale) == ("off", 0.0)
        assert worker.calibration[config.segment_index("premium")].status == "curves"
        assert not worker.planner.uplift.delta[config.segment_index("casual")].any()
    finally:
        await worker.stop()
        await producer.stop()

    events = [messages.decode("events", r.value) for r in await read_all(kafka_target, "events")]
    rescaled = [
        e
        for e in events
        if e.kind == "precompute.uplift.rescaled"
        and e.source == "precompute"
        and e.region == REGION
    ]
    assert [(e["segment"], e["status"], e["scale"]) for e in rescaled] == [("casual", "off", 0.0)]
    assert rescaled[0]["uplift_per_visit"] == pytest.approx(-casual.predicted, rel=1e-3)
    letters = [
        messages.decode("deadletter", r.value) for r in await read_all(kafka_target, "deadletter")
    ]
    assert sum(d.topic == value_topic for d in letters) == 2


def _wait_line(proc: subprocess.Popen[str], needle: str, timeout_s: float) -> str:
    assert proc.stdout is not None
    deadline = time.monotonic() + timeout_s
    with selectors.DefaultSelector() as sel:
        sel.register(proc.stdout, selectors.EVENT_READ)
        while (left := deadline - time.monotonic()) > 0:
            if not sel.select(timeout=left):
                continue
            line = proc.stdout.readline()
            if needle in line:
                return line
            if not line:
                break
    pytest.fail(f"no {needle!r} line from the worker (exit code {proc.poll()})")


def test_the_command_runs_the_worker_and_drains_on_sigterm(
    kafka_target: KafkaTarget, scenario_file: Path, tmp_path: Path
) -> None:
    env = {
        **os.environ,
        "HEADROOM_LOG_FORMAT": "json",
        "HEADROOM_CACHE_DIR": str(tmp_path / "cache"),
    }
    command = [sys.executable, "-m", "headroom.cli", "precompute", "--region", REGION]
    command += ["--scenario", str(scenario_file), "--bootstrap", kafka_target.bootstrap]
    command += ["--prefix", kafka_target.prefix]
    proc = subprocess.Popen(
        command, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        line = _wait_line(proc, "precompute worker ready", 90)
        assert REGION in line
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
        assert proc.returncode == 0, err[-2000:]
        assert "precompute.worker.stopped" in err
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_the_command_refuses_a_scenario_without_precompute_fields(
    run_headroom: Callable[..., subprocess.CompletedProcess[str]],
) -> None:
    done = run_headroom("precompute", "--region", REGION, "--bootstrap", "127.0.0.1:1")
    assert done.returncode == 2
    assert "no precompute fields" in done.stderr
