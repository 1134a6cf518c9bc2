"""A small Service lifecycle for worker processes: start, drain, stop (after mode's ``Service``).

Every worker (ranking server, client, feed) is a :class:`Service`:

* :meth:`Service.start` runs :meth:`on_start` (open connections, start servers) and then the
  service's background tasks (:meth:`add_task`); a failure in ``on_start`` stops what was started
  and re-raises.
* :meth:`Service.drain` asks the service to finish what it is doing without taking new work
  (:meth:`on_drain`: a client stops consuming and waits for requests in flight, publishes its last
  windows and commits; a server stops accepting connections and lets running requests finish).
* :meth:`Service.stop` cancels the background tasks and runs :meth:`on_stop` (close everything),
  once, whatever happened before.
* ``async with service:`` = start … stop. :meth:`run_until_stopped` installs SIGINT/SIGTERM
  handlers that call :meth:`request_stop` (drain, then stop), and returns when the service is
  stopped, when a background task fails (its exception is re-raised after the stop), or after
  ``duration_s``.

:meth:`sleep` returns early (False) once a stop is requested, so periodic loops end promptly.
Nothing here reads a clock but the event loop's own (timers); services take their time from it.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import Coroutine
from types import TracebackType
from typing import Any

from headroom.kernel.logs import get_logger

__all__ = ["Service"]


class Service:
    """Base class of worker services; subclasses override the ``on_*`` hooks."""

    name = "service"
    drain_timeout_s = 10.0  # a drain that takes longer is cut short by the stop

    def __init__(self) -> None:
        self.log = get_logger(self.name)
        self._tasks: set[asyncio.Task[Any]] = set()
        self._stop_requested = asyncio.Event()
        self._stopped = asyncio.Event()
        self._started = False
        self._stopping = False
        self._failure: BaseException | None = None

    # -- hooks ------------------------------------------------------------------------------

    async def on_start(self) -> None:
        """Open resources; raise to abort the start."""

    async def on_drain(self) -> None:
        """Finish in-flight work; take no new work."""

    async def on_stop(self) -> None:
        """Close resources (called once, even after a failed start)."""

    # -- lifecycle ------------------------------------------------------------------------------

    @property
    def stop_requested(self) -> bool:
        return self._stop_requested.is_set()

    def add_task(
        self, coro: Coroutine[Any, Any, Any], name: str | None = None
    ) -> asyncio.Task[Any]:
        """Run ``coro`` in the background until the service stops; its failure stops the service."""
        task = asyncio.create_task(coro, name=name)
        task.add_done_callback(self._task_done)
        self._tasks.add(task)
        return task

    def _task_done(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if task.cancelled():
            return
        exc = task.exception()
        if exc is not None and self._failure is None:
            self._failure = exc
            self.log.error(
                f"{self.name}.task.failed",
                task=task.get_name(),
                error=f"{type(exc).__name__}: {exc}",
            )
            self._stop_requested.set()

    async def start(self) -> None:
        if self._started:
            return
        self._started = True
        try:
            await self.on_start()
        except BaseException:
            await self.stop()
            raise

    async def drain(self) -> None:
        try:
            await asyncio.wait_for(self.on_drain(), self.drain_timeout_s)
        except TimeoutError:
            self.log.warning(f"{self.name}.drain.timed_out", timeout_s=self.drain_timeout_s)

    async def stop(self) -> None:
        if self._stopping:
            await self._stopped.wait()
            return
        self._stopping = True
        self._stop_requested.set()
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        try:
            await self.on_stop()
        finally:
            self._stopped.set()

    def request_stop(self) -> None:
        """Ask for a graceful stop (drain, then stop): what SIGINT and SIGTERM do."""
        self._stop_requested.set()

    async def sleep(self, seconds: float) -> bool:
        """Sleep, but wake at once on a stop request; True when the full time passed."""
        if self._stop_requested.is_set():
            return False
        try:
            await asyncio.wait_for(self._stop_requested.wait(), seconds)
        except TimeoutError:
            return True
        return False

    async def wait_stop_requested(self) -> None:
        await self._stop_requested.wait()

    async def run_until_stopped(self, duration_s: float | None = None) -> None:
        """Start, serve until a signal / a failed task / ``duration_s``, drain, stop."""
        loop = asyncio.get_running_loop()
        installed: list[signal.Signals] = []
        for sig in (signal.SIGINT, signal.SIGTERM):
            try:
                loop.add_signal_handler(sig, self.request_stop)
                installed.append(sig)
            except (NotImplementedError, RuntimeError):  # not the main thread
                continue
        try:
            await self.start()
            if duration_s is None:
                await self._stop_requested.wait()
            else:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._stop_requested.wait(), duration_s)
            if self._failure is None:
                await self.drain()
        finally:
            await self.stop()
            for sig in installed:
                loop.remove_signal_handler(sig)
        if self._failure is not None:
            raise self._failure

    async def __aenter__(self) -> Service:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()
