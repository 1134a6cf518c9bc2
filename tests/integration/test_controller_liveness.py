"""The controller's liveness check on a real broker (``headroom controller``).

The controller is fed capacity, latency and value messages until its control steps are live,
then its consumer gets nothing more while the broker keeps answering — from inside the app that is
exactly what a consumer that stopped fetching looks like (it cannot tell a stalled fetcher from
an input that stopped, which is why the rule is about input, docs/streaming.md *Faults*). It must
exit with status 3 and a ``controller.liveness.failed`` log line within 3 intervals (at least
30 s) of its last live step, plus start-up slack; not before 30 s.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import subprocess
import time
from pathlib import Path

import pytest
from aiokafka import AIOKafkaProducer

from headroom.controllers.app import LIVENESS_EXIT
from headroom.controllers.liveness import LIVENESS_MIN_S
from tests.integration.test_controller_app import SLO_MS, ControllerProcess, _feed

pytestmark = pytest.mark.integration


async def test_a_controller_whose_consumer_delivers_nothing_exits_non_zero(
    kafka_bootstrap: str, topic_prefix: str, tmp_path: Path
) -> None:
    controller = ControllerProcess(kafka_bootstrap, topic_prefix, tmp_path)
    controller.start()
    producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap)
    await producer.start()
    try:
        await _feed(producer, topic_prefix, value_ms=0.3 * SLO_MS, seconds=15.0)
        fed_until = time.monotonic()
        assert controller.proc is not None
        assert controller.proc.poll() is None, "the controller died while it was fed"
        with contextlib.suppress(subprocess.TimeoutExpired):
            await asyncio.to_thread(controller.proc.wait, LIVENESS_MIN_S + 45.0)
        exited_after = time.monotonic() - fed_until
        code = controller.proc.poll()
    finally:
        await producer.stop()
        controller.stop()
    assert code == LIVENESS_EXIT, f"exit status {code} after {exited_after:.0f} s"
    # not before the limit (the last live step came at most one interval after the last input)
    assert exited_after >= LIVENESS_MIN_S - 1.0, exited_after
    lines = [json.loads(x) for x in controller.log.read_text().splitlines() if x.startswith("{")]
    failed = [x for x in lines if x.get("event") == "controller.liveness.failed"]
    assert len(failed) == 1, lines[-5:]
    assert "stalled" in failed[0]["reason"]
    assert failed[0]["exit_status"] == LIVENESS_EXIT
