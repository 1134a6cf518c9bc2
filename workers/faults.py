"""Fault events executed by ``headroom up`` (docs/scenarios.md, *Fault events*), and the
supervisor that restarts a component that died on its own.

:class:`FaultRunner` runs every fault event of the scenario at its scenario time against the
processes of a :class:`~headroom.workers.up.Stack`:

* ``kill`` — SIGKILL to the process (a server: the first replica of its ``pool``), restart with
  the same command line after ``restart_after_s`` (a feed with ``--resume-from at_s``);
* ``pause`` — SIGSTOP, SIGCONT after ``duration_s``;
* ``stall`` (the controller) — the app's stall seam: SIGUSR1 pauses the fetching of its
  consumer's partitions, SIGUSR2 resumes it after ``duration_s``. The process is not expected
  down: a stall longer than the liveness limit ends in the controller's own exit (status 3), and
  the :class:`Supervisor` restarts it (``process.restarted``); a restarted process gets no
  SIGUSR2;
* ``broker_restart`` — SIGKILL to the local broker that ``headroom kafka start`` runs from the
  state directory (``up --broker-state-dir``), started again on the same storage and port after
  ``down_s``;
* ``capacity_silence`` — played by the feed itself (it owns the capacity messages); the runner
  only records it.

Each fault writes ``fault.injected`` when it starts and ``fault.recovered`` once the component is
healthy again, with ``recovery_s``: scenario seconds from the fault's end (restart, SIGCONT,
broker start, end of silence) to the first sign of health, as the event collector sees it:

======================= ==================================================================
process                 healthy when
======================= ==================================================================
controller              a ``target.issued`` from the controller
client                  a ``window`` or ``target.applied`` line from the region's client
server                  the replica answers a rank request on its port
precompute              the worker said it is ready again (its ``ready`` line)
feed                    the restarted feed is running (its first capacity announcement)
broker                  the broker answers a metadata request and a ``target.issued`` follows
capacity feed (silence) the feed's ``capacity.silence.ended`` (the newest levels sent)
======================= ==================================================================

A fault that does not recover within :data:`RECOVERY_TIMEOUT_S` wall seconds writes its
``fault.recovered`` with ``recovered: false``. :class:`Supervisor` checks every second that each
process that should run does; one that exited on its own (a crash, the controller's liveness
exit) is restarted with its command line and recorded as a ``process.restarted`` event.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from headroom.kernel.errors import HeadroomError
from headroom.kernel.logs import get_logger
from headroom.kernel.scenario import ScenarioEvent
from headroom.workers.wire import RankRequest, WireClient

if TYPE_CHECKING:
    from headroom.workers.up import Proc, Stack

__all__ = ["FaultRunner", "Supervisor", "fault_targets", "with_resume"]

log = get_logger("up")

RECOVERY_TIMEOUT_S = 120.0  # wall seconds a component has to come back after its fault
BROKER_START_TIMEOUT_S = 120.0

# the controller app's stall seam (headroom.controllers.app STALL_SIGNAL / RESUME_SIGNAL; kept
# here so up does not import faust)
STALL_SIGNAL = signal.SIGUSR1
RESUME_SIGNAL = signal.SIGUSR2

EventPredicate = Callable[[dict[str, Any]], bool]


def controller_name(index: int) -> str:
    """The process name of controller ``index``: ``controller``, ``controller-1``, …"""
    return "controller" if index == 0 else f"controller-{index}"


def client_name(region: str, index: int = 0) -> str:
    """The process name (and static group member id) of client ``index`` of ``region``:
    ``client-R``, ``client-R-1``, …"""
    return f"client-{region}" if index == 0 else f"client-{region}-{index}"


def fault_targets(e: ScenarioEvent, stack_names: list[str]) -> list[str]:
    """The process names of the stack a kill, pause or stall acts on (empty for other faults): the
    event's ``index`` (default 0) picks one of several controllers (``controller``,
    ``controller-1``, …), clients of the region (``client-R``, ``client-R-1``, …) or replicas of
    the server pool (``server-R-POOL-i``)."""
    if e.kind not in ("kill", "pause", "stall") or e.process is None:
        return []
    i = e.index or 0
    names: list[str]
    if e.process == "controller":
        names = [controller_name(i)]
    elif e.process == "feed":
        names = ["feed"]
    elif e.process == "server":
        names = [f"server-{e.region}-{e.pool}-{i}"]
    elif e.process == "client":
        names = [client_name(str(e.region), i)]
    else:
        names = [f"{e.process}-{e.region}"]
    return [n for n in names if n in stack_names]


@dataclass
class FaultRecord:
    """One fault of the run: what, when (scenario seconds) and how it ended."""

    index: int
    event: ScenarioEvent
    injected_t: float | None = None
    end_t: float | None = None
    recovered_t: float | None = None
    healthy: str | None = None
    problem: str | None = None
    targets: list[str] = field(default_factory=list)

    def fields(self) -> dict[str, Any]:
        e = self.event
        out: dict[str, Any] = {
            "fault_id": f"f{self.index}",
            "fault": e.kind,
            "process": e.process or ("broker" if e.kind == "broker_restart" else "feed"),
            "at_s": e.at_s,
            "span_s": e.fault_span_s,
        }
        if e.pool is not None:
            out["pool"] = e.pool
        if e.index is not None:
            out["index"] = e.index
        if self.targets:
            out["targets"] = list(self.targets)
        return out


class FaultRunner:
    """Runs a stack's fault events (see the module docstring); :meth:`events` gives their
    ``fault.injected`` / ``fault.recovered`` lines."""

    def __init__(self, stack: Stack, broker_state_dir: Path | None = None) -> None:
        self.stack = stack
        self.broker_state_dir = broker_state_dir
        self.records = [
            FaultRecord(i, e) for i, e in enumerate(e for e in stack.scenario.events if e.is_fault)
        ]
        self._tasks: list[asyncio.Task[None]] = []
        self.expected_down: set[str] = set()  # processes a fault keeps down (not a crash)
        self.broker_down = False

    def check(self) -> None:
        """Before the run: every fault can be carried out (HeadroomError naming it if not)."""
        names = [*self.stack.procs, "feed"]  # the feed starts last
        for r in self.records:
            e = r.event
            where = f"events: the {e.kind} at {e.at_s:g} s"
            if e.kind in ("kill", "pause", "stall") and not fault_targets(e, names):
                raise HeadroomError(f"{where}: this stack runs no {e.process} there")
            if e.kind == "broker_restart":
                if self.broker_state_dir is None:
                    raise HeadroomError(f"{where}: needs the broker's state directory")
                from headroom.streams import broker

                nodes = broker.recorded_nodes(broker.BrokerPaths(self.broker_state_dir))
                if e.broker is not None and not 0 <= e.broker < len(nodes):
                    raise HeadroomError(
                        f"{where}: broker {e.broker}: the broker in {self.broker_state_dir} has "
                        f"{len(nodes)} node(s) (0-based)"
                    )

    def start(self) -> None:
        for r in self.records:
            self._tasks.append(asyncio.create_task(self._run(r), name=f"fault-{r.index}"))

    async def cancel(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task

    async def settle(self) -> None:
        """Wait for the faults still running (a broker whose start outlasts the scenario, a
        recovery not seen yet), at most until they time out on their own."""
        pending = [t for t in self._tasks if not t.done()]
        if pending:
            log.info("up.faults.settling", pending=len(pending))
            await asyncio.wait(pending, timeout=BROKER_START_TIMEOUT_S + RECOVERY_TIMEOUT_S)

    @property
    def pending(self) -> bool:
        return any(not t.done() for t in self._tasks)

    # -- one fault ----------------------------------------------------------------------------

    async def _run(self, r: FaultRecord) -> None:
        stack = self.stack
        e = r.event
        await asyncio.sleep(max(0.0, stack.wall(e.at_s) - time.time()))
        r.injected_t = stack.scenario_time()
        r.targets = fault_targets(e, list(stack.procs))
        log.info("up.fault.injected", **r.fields())
        try:
            if e.kind == "kill":
                end_wall = await self._kill(r)
            elif e.kind == "pause":
                end_wall = await self._pause(r)
            elif e.kind == "stall":
                end_wall = await self._stall(r)
            elif e.kind == "broker_restart":
                end_wall = await self._broker_restart(r)
            else:  # capacity_silence: the feed holds its messages
                end_wall = stack.wall(e.at_s + e.fault_span_s)
                await asyncio.sleep(max(0.0, end_wall - time.time()))
            r.end_t = stack.scenario_time(end_wall)
            healthy_wall, r.healthy = await self._healthy(r, end_wall)
            r.recovered_t = stack.scenario_time(healthy_wall)
            log.info("up.fault.recovered", recovery_s=r.recovered_t - r.end_t, **r.fields())
        except (HeadroomError, TimeoutError, OSError) as exc:
            r.problem = f"{type(exc).__name__}: {exc}"
            log.warning("up.fault.unrecovered", problem=r.problem, **r.fields())
        finally:
            for name in r.targets:
                self.expected_down.discard(name)

    async def _kill(self, r: FaultRecord) -> float:
        stack = self.stack
        e = r.event
        self.expected_down.update(r.targets)
        for name in r.targets:
            await stack.kill(name, signal.SIGKILL)
        end_wall = stack.wall(e.at_s + e.fault_span_s)
        await asyncio.sleep(max(0.0, end_wall - time.time()))
        for name in r.targets:
            if name == "feed":
                proc = stack.procs[name]
                proc.argv = with_resume(proc.argv, max(e.at_s, 1e-3))
            await stack.restart(name)
        return end_wall

    async def _pause(self, r: FaultRecord) -> float:
        stack = self.stack
        e = r.event
        self.expected_down.update(r.targets)
        for name in r.targets:
            stack.procs[name].signal(signal.SIGSTOP)
        end_wall = stack.wall(e.at_s + e.fault_span_s)
        await asyncio.sleep(max(0.0, end_wall - time.time()))
        for name in r.targets:
            stack.procs[name].signal(signal.SIGCONT)
        return end_wall

    async def _stall(self, r: FaultRecord) -> float:
        stack = self.stack
        e = r.event
        starts = {}
        for name in r.targets:
            proc = stack.procs[name]
            starts[name] = proc.starts
            proc.signal(STALL_SIGNAL)
        end_wall = stack.wall(e.at_s + e.fault_span_s)
        await asyncio.sleep(max(0.0, end_wall - time.time()))
        for name in r.targets:
            proc = stack.procs[name]
            if proc.running and proc.starts == starts[name]:  # a restarted one is not stalled
                proc.signal(RESUME_SIGNAL)
        return end_wall

    async def _broker_restart(self, r: FaultRecord) -> float:
        from headroom.streams import broker

        stack = self.stack
        e = r.event
        assert self.broker_state_dir is not None
        state_dir = self.broker_state_dir.expanduser().resolve()
        try:
            node = await asyncio.to_thread(
                broker.node_restart, state_dir, e.broker, BROKER_START_TIMEOUT_S
            )
        except broker.BrokerError as exc:
            raise HeadroomError(str(exc)) from exc
        self.broker_down = True
        try:
            os.kill(node.pid, signal.SIGKILL)
            await _wait_gone(node.pid, 30.0)
            log.info("up.broker.killed", pid=node.pid, node=node.node_id, state_dir=str(state_dir))
            end_wall = stack.wall(e.at_s + e.fault_span_s)
            await asyncio.sleep(max(0.0, end_wall - time.time()))
            # a cluster's start starts the nodes that are down: just this one
            result = await asyncio.to_thread(broker.start, node.config)
            log.info(
                "up.broker.started", node=node.node_id, pid=result.pid, bootstrap=result.bootstrap
            )
        finally:
            self.broker_down = False
        return end_wall

    async def _healthy(self, r: FaultRecord, since: float) -> tuple[float, str]:
        """Wall time and name of the first sign of health after ``since``."""
        e = r.event
        stack = self.stack
        process = e.process
        if e.kind == "capacity_silence":
            return await stack.wait_event(
                lambda ev: ev.get("kind") == "capacity.silence.ended", since, RECOVERY_TIMEOUT_S
            ), "capacity.silence.ended"
        if e.kind == "broker_restart" or process == "controller":
            return await stack.wait_event(
                lambda ev: ev.get("kind") == "target.issued", since, RECOVERY_TIMEOUT_S
            ), "target.issued"
        if process == "client":
            region = e.region
            return await stack.wait_event(
                lambda ev: (
                    ev.get("source") == "client"
                    and ev.get("region") == region
                    and ev.get("kind") in ("window", "target.applied")
                ),
                since,
                RECOVERY_TIMEOUT_S,
            ), "client.window"
        if process == "server":
            return await self._server_answers(r.targets[0]), "server.answered"
        if process == "feed":
            return await stack.wait_event(
                lambda ev: ev.get("source") == "feed", since, RECOVERY_TIMEOUT_S
            ), "feed.event"
        # precompute: restarted and ready (a paused one: running again)
        return max(since, time.time()), "process.ready"

    async def _server_answers(self, name: str) -> float:
        """Until the replica answers a baseline rank request of one candidate."""
        addresses = [
            addr for addrs in self.stack.server_addresses.values() for _pool, addr in addrs
        ]
        proc = self.stack.procs[name]
        address = _address_of(proc, addresses)
        host, _, port = address.rpartition(":")
        deadline = time.monotonic() + RECOVERY_TIMEOUT_S
        segment = self.stack.scenario.segments[0].name
        n = 0
        while True:
            wire = WireClient(host, int(port))
            try:
                await wire.connect()
                n += 1
                await wire.call(
                    RankRequest(id=n, user=1, segment=segment, t_s=0.0, base=1), timeout_s=1.0
                )
                return time.time()
            except (HeadroomError, TimeoutError, OSError):
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{name} did not answer at {address}") from None
                await asyncio.sleep(0.05)
            finally:
                await wire.close()

    # -- the lines ----------------------------------------------------------------------------

    def events(self) -> list[dict[str, Any]]:
        """``fault.injected`` and ``fault.recovered`` lines of every fault that started."""
        stack = self.stack
        out = []
        for r in self.records:
            if r.injected_t is None:
                continue
            region = r.event.region
            base = {"v": 1, "source": "up", "policy": "headroom", "region": region}
            out.append(
                {
                    **base,
                    "ts": stack.wall(r.injected_t),
                    "kind": "fault.injected",
                    "t": r.injected_t,
                    **r.fields(),
                }
            )
            recovered = r.recovered_t is not None and r.end_t is not None
            line: dict[str, Any] = {
                **base,
                "ts": stack.wall(
                    r.recovered_t if r.recovered_t is not None else stack.scenario_time()
                ),
                "kind": "fault.recovered",
                **r.fields(),
                "recovered": recovered,
                "end_t": r.end_t,
            }
            if recovered:
                assert r.recovered_t is not None
                assert r.end_t is not None
                line.update(
                    t=r.recovered_t, recovery_s=max(0.0, r.recovered_t - r.end_t), healthy=r.healthy
                )
            else:
                line.update(t=stack.scenario_time(), problem=r.problem or "run ended first")
            out.append(line)
        return out


def with_resume(argv: list[str], t: float) -> list[str]:
    """A feed's command line resuming at scenario time ``t`` (replacing an earlier resume)."""
    out = list(argv)
    if "--resume-from" in out:
        i = out.index("--resume-from")
        del out[i : i + 2]
    return [*out, "--resume-from", repr(t)]


def _address_of(proc: Proc, addresses: list[str]) -> str:
    """The HOST:PORT a server process listens on (its ``--port`` flag)."""
    argv = proc.argv
    port = argv[argv.index("--port") + 1]
    for addr in addresses:
        if addr.endswith(f":{port}"):
            return addr
    return f"127.0.0.1:{port}"


async def _wait_gone(pid: int, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        with contextlib.suppress(ChildProcessError, OSError):
            os.waitpid(pid, os.WNOHANG)  # noqa: ASYNC222  # WNOHANG: never blocks (a broker we
            # started again is our child: reap it, or it lingers as a zombie)
        await asyncio.sleep(0.05)
    raise TimeoutError(f"process {pid} still runs {timeout_s:.0f} s after SIGKILL")


class Supervisor:
    """Restarts a process of the stack that exited on its own while the run goes on, and keeps a
    ``process.restarted`` line for each."""

    def __init__(self, stack: Stack, faults: FaultRunner, period_s: float = 1.0) -> None:
        self.stack = stack
        self.faults = faults
        self.period_s = period_s
        self.restarts: list[dict[str, Any]] = []
        self._task: asyncio.Task[None] | None = None
        self.stopping = False

    def start(self) -> None:
        self._task = asyncio.create_task(self._watch(), name="supervisor")

    async def cancel(self) -> None:
        self.stopping = True
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task

    async def _watch(self) -> None:
        while not self.stopping:
            await asyncio.sleep(self.period_s)
            for name, proc in list(self.stack.procs.items()):
                if self.stopping:
                    return
                if proc.running or name in self.faults.expected_down or proc.process is None:
                    continue
                code = proc.returncode()
                if name == "feed" and code == 0:
                    continue  # the feed finished the scenario
                await self._restart(name, code)

    async def _restart(self, name: str, code: int | None) -> None:
        t = self.stack.scenario_time()
        log.warning("up.process.died", name=name, status=code, t=t)
        if name == "feed":
            proc = self.stack.procs[name]
            proc.argv = with_resume(proc.argv, max(t, 1e-3))
        try:
            await self.stack.restart(name)
            ok = True
        except HeadroomError as exc:
            log.warning("up.process.restart_failed", name=name, error=str(exc))
            ok = False
        self.restarts.append(
            {
                "v": 1,
                "ts": time.time(),
                "kind": "process.restarted",
                "source": "up",
                "policy": "headroom",
                "region": None,
                "process": name,
                "exit_status": code,
                "t": t,
                "restarted": ok,
            }
        )
