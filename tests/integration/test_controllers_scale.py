"""Two controller processes share the regions through Kafka's group assignment.

Two ``headroom controller`` processes with the same app id run on the shared broker under their
own topic prefix, on scenarios/scale-short.yaml (two regions on different partitions, a 10 s
control interval). The test feeds capacity and latency for both regions, waits until each region
gets targets, then kills (SIGKILL) the controller that steps the most regions. Promised:

* while both run, a region's targets come from one controller only (its partition's owner);
* the killed controller's regions get targets from the other within two control intervals of
  the kill, and the new owner adopted them from the changelogged state (``restored``);
* per region, the epochs on the targets topic never go back over the whole run.
"""

from __future__ import annotations

import itertools
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Literal

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

from headroom.kernel.sketch import LatencySketch
from headroom.streams import messages
from headroom.streams.topics import region_partition
from tests.conftest import run_async, terminate

pytestmark = pytest.mark.integration

SCENARIO = Path(__file__).parent / "scenarios" / "scale-short.yaml"
REGIONS = ("us-east", "eu-west")
INTERVAL_S = 10.0


def test_the_scenario_regions_fall_on_different_partitions() -> None:
    assert len({region_partition(r, 4) for r in REGIONS}) == len(REGIONS)


@dataclass
class Controller:
    name: str
    proc: subprocess.Popen[bytes]
    log: Path

    def issued(self) -> list[dict[str, object]]:
        """The ``controller.target.issued`` and ``controller.region.adopted`` log lines."""
        out = []
        for line in self.log.read_text(errors="replace").splitlines():
            try:
                rec = json.loads(line)
            except ValueError:
                continue
            if isinstance(rec, dict) and str(rec.get("event", "")).startswith("controller."):
                out.append(rec)
        return out

    def regions(self) -> set[str]:
        return {str(r["region"]) for r in self.issued() if r["event"] == "controller.target.issued"}

    def stop(self) -> None:
        terminate(self.proc)


def _log_time(rec: dict[str, object]) -> float:
    """The wall time of a JSON log line (its ISO ``timestamp``, UTC)."""
    stamp = str(rec["timestamp"]).replace("Z", "+00:00")
    return datetime.fromisoformat(stamp).timestamp()


def _start(name: str, bootstrap: str, prefix: str, workdir: Path, t0: float) -> Controller:
    own = workdir / name
    own.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, HEADROOM_CONTROLLER_DIR=str(own), HEADROOM_LOG_FORMAT="json")
    log = own / "controller.log"
    argv = [
        sys.executable, "-m", "headroom.cli", "controller",
        "--scenario", str(SCENARIO), "--t0", f"{t0:.6f}",
        "--bootstrap", bootstrap, "--prefix", prefix,
    ]  # fmt: skip
    proc = subprocess.Popen(
        argv,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=log.open("ab"),
    )
    return Controller(name, proc, log)


@pytest.fixture
def controllers(
    kafka_bootstrap: str, topic_prefix: str, tmp_path: Path
) -> Iterator[list[Controller]]:
    t0 = time.time()
    procs = [_start(f"c{i}", kafka_bootstrap, topic_prefix, tmp_path, t0) for i in range(2)]
    try:
        yield procs
    finally:
        for c in procs:
            c.stop()


def _inputs(region: str, n: int) -> list[tuple[str, bytes]]:
    now = time.time()
    out = []
    pools: tuple[tuple[Literal["cpu", "accelerator"], str], ...] = (
        ("cpu", "any"),
        ("accelerator", "gpu-b"),
    )
    for resource, hardware in pools:
        cap = messages.Capacity(
            ts=now, region=region, resource=resource, hardware=hardware, pool="opportunistic",
            units=2.0, expires_in_s=None, reason="grant", id=f"cap-{region}-{resource}-{n}",
        )  # fmt: skip
        out.append(("capacity", messages.encode(cap)))
    sk = LatencySketch(0.01)
    for i in range(40):
        sk.add(60.0 + i)
    lat = messages.Latency(
        ts=now, region=region, replica="r1", pool="dedicated", path="base", window_s=0.5,
        count=40, samples_ms=None, sketch=sk, inflight=2, queue_ms=1.0,
    )  # fmt: skip
    out.append(("latency", messages.encode(lat)))
    return out


async def _run(bootstrap: str, prefix: str, ctls: list[Controller]) -> dict[str, object]:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap)
    consumer = AIOKafkaConsumer(
        f"{prefix}targets", bootstrap_servers=bootstrap, auto_offset_reset="earliest"
    )
    await producer.start()
    await consumer.start()
    targets: list[tuple[float, messages.Target]] = []  # (receipt wall time, target), topic order
    killed: Controller | None = None
    killed_at = 0.0
    killed_regions: set[str] = set()
    deadline = time.monotonic() + 150.0
    n = 0
    try:
        while time.monotonic() < deadline:
            for region in REGIONS:
                for kind, raw in _inputs(region, n):
                    await producer.send_and_wait(f"{prefix}{kind}", raw, key=region.encode())
            n += 1
            batch = await consumer.getmany(timeout_ms=500)
            for records in batch.values():
                for r in records:
                    msg = messages.decode("targets", r.value)
                    if isinstance(msg, messages.Target):
                        targets.append((time.time(), msg))
            if killed is None:
                per_region = {r: sum(1 for _, t in targets if t.region == r) for r in REGIONS}
                if min(per_region.values()) >= 2:
                    killed = max(ctls, key=lambda c: len(c.regions()))
                    killed_regions = killed.regions()
                    killed.proc.send_signal(signal.SIGKILL)
                    killed.proc.wait(timeout=10)
                    killed_at = time.time()
            elif time.time() > killed_at + 3.0 * INTERVAL_S:
                break
    finally:
        await consumer.stop()
        await producer.stop()
    return {
        "targets": targets,
        "killed": killed,
        "killed_at": killed_at,
        "killed_regions": killed_regions,
    }


def test_a_killed_controllers_regions_move_to_the_other_with_epochs_that_never_go_back(
    kafka_bootstrap: str, topic_prefix: str, controllers: list[Controller]
) -> None:
    got = run_async(_run(kafka_bootstrap, topic_prefix, controllers))
    targets: list[tuple[float, messages.Target]] = got["targets"]  # type: ignore[assignment]
    killed = got["killed"]
    assert isinstance(killed, Controller), "no region got two targets: the controllers never ran"
    killed_at = float(got["killed_at"])  # type: ignore[arg-type]
    killed_regions: set[str] = got["killed_regions"]  # type: ignore[assignment]
    survivor = next(c for c in controllers if c is not killed)
    assert killed_regions, "the controller that stepped the most regions stepped none"
    # while both ran, each region was stepped by one of them only: the last step before the
    # kill issued one target per region (two owners would have issued two)
    for region in REGIONS:
        last = [t for ts, t in targets if t.region == region and ts <= killed_at]
        near = [t for t in last if t.ts > killed_at - 0.9 * INTERVAL_S]
        assert len(near) == 1, (region, [(t.ts, t.epoch) for t in last])
    # the survivor steps every region after the kill, the killed one's within two intervals
    for region in sorted(killed_regions):
        after = [ts for ts, t in targets if t.region == region and t.ts > killed_at]
        assert after, f"{region}: no target after the kill of {killed.name}"
        print(f"takeover of {region}: first target {after[0] - killed_at:.1f} s after the kill")
        assert after[0] - killed_at <= 2.0 * INTERVAL_S, (region, after[0] - killed_at)
    moved = [
        _log_time(r) - killed_at
        for r in survivor.issued()
        if r["event"] == "controller.partitions.assigned" and _log_time(r) >= killed_at
    ]
    print(f"the survivor's new assignment: {moved[:1]} s after the kill")
    # (adoptions after the kill: at start-up the first worker to join adopts every region, with
    # nothing to restore, before the second one joins and takes its share)
    adopted = [
        r
        for r in survivor.issued()
        if r["event"] == "controller.region.adopted"
        and r["region"] in killed_regions
        and _log_time(r) >= killed_at
    ]
    assert {str(r["region"]) for r in adopted} == killed_regions, adopted
    # resumed from the changelogged state: the epoch it adopted is the last one issued before
    for r in adopted:
        assert r["restored"] is True, r
        issued = [t.epoch for ts, t in targets if t.region == r["region"] and ts <= killed_at]
        assert r["epoch"] is not None, r
        assert int(str(r["epoch"])) >= min(issued), (r, issued)
    # epochs never go back, per region, over the whole run (topic order: what clients see)
    for region in REGIONS:
        epochs = [t.epoch for _, t in targets if t.region == region]
        assert len(epochs) >= 4, (region, epochs)
        assert all(b >= a for a, b in itertools.pairwise(epochs)), (region, epochs)
