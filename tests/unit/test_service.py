"""The worker Service lifecycle: start, drain, stop, background failures, early wake-up."""

from __future__ import annotations

import asyncio

import pytest

from headroom.workers.service import Service


class Recorder(Service):
    name = "recorder"

    def __init__(self, *, fail_start: bool = False, fail_task: bool = False) -> None:
        super().__init__()
        self.calls: list[str] = []
        self.fail_start = fail_start
        self.fail_task = fail_task

    async def on_start(self) -> None:
        self.calls.append("start")
        self.add_task(self._work(), name="work")
        if self.fail_start:
            raise RuntimeError("cannot start")

    async def _work(self) -> None:
        if self.fail_task:
            raise ValueError("task broke")
        while await self.sleep(10.0):
            pass

    async def on_drain(self) -> None:
        self.calls.append("drain")

    async def on_stop(self) -> None:
        self.calls.append("stop")


async def test_async_with_starts_and_stops_once() -> None:
    svc = Recorder()
    async with svc:
        assert svc.calls == ["start"]
    await svc.stop()
    assert svc.calls == ["start", "stop"]


async def test_a_failed_start_stops_what_was_started_and_reraises() -> None:
    svc = Recorder(fail_start=True)
    with pytest.raises(RuntimeError, match="cannot start"):
        await svc.start()
    assert svc.calls == ["start", "stop"]


async def test_a_stop_request_drains_then_stops_and_wakes_sleepers_at_once() -> None:
    svc = Recorder()
    runner = asyncio.create_task(svc.run_until_stopped())
    await asyncio.sleep(0.01)
    svc.request_stop()  # what SIGTERM does
    await asyncio.wait_for(runner, 2.0)  # the 10 s sleep of the background task ended early
    assert svc.calls == ["start", "drain", "stop"]
    assert await svc.sleep(5.0) is False


async def test_a_failing_background_task_stops_the_service_and_is_reraised() -> None:
    svc = Recorder(fail_task=True)
    with pytest.raises(ValueError, match="task broke"):
        await asyncio.wait_for(svc.run_until_stopped(), 2.0)
    assert svc.calls == ["start", "stop"]  # no drain after a failure


async def test_run_for_a_duration() -> None:
    svc = Recorder()
    await asyncio.wait_for(svc.run_until_stopped(duration_s=0.05), 2.0)
    assert svc.calls == ["start", "drain", "stop"]
