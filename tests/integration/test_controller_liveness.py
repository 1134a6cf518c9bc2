"""The controller's liveness check on a real broker (``headroom controller``), by stalling its
consumer for real.

The controller is fed capacity, latency and value messages until its control steps are live;
then its consumer is stalled through the app's stall seam (SIGUSR1 pauses the fetching of every
partition it holds: the process runs, the broker answers, docs/streaming.md *Faults*) while the
input keeps flowing. It must exit with status 3 and one ``controller.liveness.failed`` line
within 3 intervals (at least 30 s) of its last live step, plus slack; not before 30 s. That
``headroom up`` restarts a controller that exits so is checked by the fault run
(tests/integration/test_stack_faults.py, the ``stall`` fault).
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

from headroom.controllers.app import LIVENESS_EXIT, STALL_SIGNAL
from headroom.controllers.liveness import LIVENESS_MIN_S
from tests.integration.test_controller_app import SLO_MS, ControllerProcess, _feed

pytestmark = pytest.mark.integration

START_S = 60.0  # the longest the controller may take to issue its first target


def _log_lines(path: Path) -> list[dict[str, object]]:
    return [json.loads(x) for x in path.read_text().splitlines() if x.startswith("{")]


async def test_a_controller_whose_consumer_stalls_exits_non_zero(
    kafka_bootstrap: str, topic_prefix: str, tmp_path: Path
) -> None:
    controller = ControllerProcess(kafka_bootstrap, topic_prefix, tmp_path)
    controller.start()
    producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap)
    await producer.start()
    feeding: asyncio.Task[None] | None = None
    try:
        # fed until its control steps are live (a loaded host can take long to start the app)
        assert controller.proc is not None
        issued: list[dict[str, object]] = []
        deadline = time.monotonic() + START_S
        while not issued and time.monotonic() < deadline:
            await _feed(producer, topic_prefix, value_ms=0.3 * SLO_MS, seconds=2.0)
            assert controller.proc.poll() is None, "the controller died while it was fed"
            lines = _log_lines(controller.log)
            issued = [x for x in lines if x.get("event") == "controller.target.issued"]
        assert issued, "no live control step before the stall"
        controller.proc.send_signal(STALL_SIGNAL)
        stalled_at = time.monotonic()
        # the input keeps flowing while the consumer is stalled
        feeding = asyncio.create_task(
            _feed(producer, topic_prefix, value_ms=0.3 * SLO_MS, seconds=LIVENESS_MIN_S + 45.0)
        )
        with contextlib.suppress(subprocess.TimeoutExpired):
            await asyncio.to_thread(controller.proc.wait, LIVENESS_MIN_S + 45.0)
        exited_after = time.monotonic() - stalled_at
        code = controller.proc.poll()
        assert not feeding.done(), "the input stopped before the controller exited"
    finally:
        if feeding is not None:
            feeding.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await feeding
        await producer.stop()
        controller.stop()
    assert code == LIVENESS_EXIT, f"exit status {code} after {exited_after:.0f} s"
    # not before the limit (the last live step came at most one interval before the stall)
    assert exited_after >= LIVENESS_MIN_S - 2.0, exited_after
    lines = _log_lines(controller.log)
    assert [x for x in lines if x.get("event") == "controller.stall.injected"], lines[-5:]
    failed = [x for x in lines if x.get("event") == "controller.liveness.failed"]
    assert len(failed) == 1, lines[-5:]
    assert "stalled" in str(failed[0]["reason"])
    assert failed[0]["exit_status"] == LIVENESS_EXIT
