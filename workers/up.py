"""``headroom up SCENARIO``: the whole streaming stack, locally, against a real Kafka.

:class:`Stack` starts every component as its own process (``python -m headroom.cli …``), the way
a user would run them on several machines, and wires them together:

1. topics under the prefix (idempotent), and a **collector** reading ``headroom.events`` from its
   current end (so only this run's events are kept), written to ``DIR/events.jsonl``;
2. the **controller** (Faust app) on the scenario's control clock: ``control.interval_s`` and
   ``control.ttl_s`` (docs/scenarios.md; ``--interval`` / ``--ttl`` override them), the settings
   ``simulate`` runs its control plane with, and the run's ``t0`` and speed, so it steps at
   scenario time ``k × interval_s`` as the simulator does; with ``--controllers N``, N controller
   processes of one app id (``controller``, ``controller-1``, …, each with its own data
   directory) that split the regions by Kafka's group assignment (docs/streaming.md, *Scaling
   out*);
3. per region, **servers**: ``dedicated_replicas`` mixed RMA replicas sharing the dedicated
   capacity and the opportunistic levels evenly (``--share 1/n``:
   :class:`headroom.defences.replicas.MixedReplicas`, the rule the simulator runs an RMA
   request's extras by) and one strong-model replica on the opportunistic pool; each prints the
   port it listens on;
4. per region, ``--clients-per-region M`` **clients** (default 1: ``client-R``; then
   ``client-R-1``, …) with every server of its region (``--server POOL=HOST:PORT``), sharing a
   consumer group of the region for this run (each its own static member id), so the region's
   requests partitions are split between them; each prints ``ready`` once it owns its
   partitions;
5. per region, when the scenario enables precompute (docs/scenarios.md optional fields), one
   **precompute worker** (``headroom precompute --region R``) on the same clock; it prints
   ``precompute worker ready (region R)`` once it has joined its requests group, and the clients
   look its results up before ranking live;
6. the **feed**, with the run's ``t0`` (the wall-clock time of scenario time 0, agreed by every
   process so their SLO windows line up) and ``--speed``; scenario ``control_outage`` events pause
   the controller process (SIGSTOP … SIGCONT) over their span: the control plane goes silent;
7. the scenario's **fault events** (kill, pause, broker_restart, capacity_silence) at their
   scenario times (:class:`headroom.workers.faults.FaultRunner`), and a **supervisor** that
   restarts a process that exited on its own (:class:`headroom.workers.faults.Supervisor`);
   before the feed starts, the end offsets of ``headroom.requests`` and ``headroom.value`` are
   noted, and after the run both topics are read from there (:mod:`headroom.workers.audit`): the
   ``stack.audit`` line (requests fed, value signals published). The fault and restart lines are
   added to the event log at the end (source ``up``).

When the feed has played the scenario, the clients are stopped with SIGTERM (they drain:
requests in flight finish, last windows are published and committed); both audited topics are
then final and are read; the stop waits (up to ``VALUE_SETTLE_S``) until the controllers' newest
``value.counted`` events account for every value signal of every producer; then the precompute
workers (running jobs are published), the servers and the controller are stopped;
the collector reads until the topic is quiet; the oracle bound is added (the simulator's oracle on
the same scenario, when the simulator is installed); and the event log is analysed exactly as
``headroom analyze`` does: ``DIR/metrics.json`` (policy ``headroom``), the table, the report.

Every process this stack started is stopped on the way out — also on Ctrl-C and on any failure
(SIGCONT first if paused, then SIGTERM, then SIGKILL after a grace period). Logs of every process
are in ``DIR/logs/``.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
import time
import uuid
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from aiokafka import TopicPartition

from headroom.analysis.events import EventWriter
from headroom.defences.replicas import DEDICATED_REPLICAS, MixedReplicas
from headroom.kernel.checks import FieldChecker
from headroom.kernel.errors import HeadroomError
from headroom.kernel.logs import get_logger
from headroom.kernel.scenario import Control, Scenario
from headroom.kernel.scenario_load import control_with_flags
from headroom.streams import messages, security
from headroom.streams.broker import probe_async
from headroom.streams.kafka import (
    KafkaTarget,
    create_topics,
    make_consumer,
    started,
    wait_for_topics,
)
from headroom.streams.topics import topics
from headroom.workers.audit import audit_event, audit_topics, end_offsets
from headroom.workers.faults import FaultRunner, Supervisor, client_name, controller_name

__all__ = ["Proc", "Stack", "StackConfig", "client_name", "controller_name"]

log = get_logger("up")

READY_TIMEOUT_S = 90.0  # a process that has not said it is ready by then failed to start
PRECOMPUTE_NICENESS = 19  # the precompute workers' CPU priority (precompute_proc)
# how long the stop waits for the controllers to count the last value signals (they publish
# their counts every second; a restarted controller first replays its backlog)
VALUE_SETTLE_S = 20.0
SEEN_EVENTS = 200_000  # collected events remembered for fault recovery (the oldest go first)


@dataclass(frozen=True)
class StackConfig:
    scenario_path: Path
    out_dir: Path
    kafka: KafkaTarget
    speed: float = 1.0
    # the control interval and target lifetime in scenario seconds (--interval, --ttl); None:
    # the scenario's control section
    interval_s: float | None = None
    ttl_s: float | None = None
    dedicated_replicas: int = DEDICATED_REPLICAS
    startup_margin_s: float = 20.0  # t0 is this far after the processes are launched
    drain_s: float = 15.0  # grace for SIGTERM before SIGKILL
    quiet_s: float = 3.0  # the collector stops after this long without an event, at the end
    run_id: str = field(default_factory=lambda: uuid.uuid4().hex[:8])
    python: str = sys.executable
    # the state directory of the local broker (``headroom kafka start``) a broker_restart event
    # restarts; None: the local broker's default
    broker_state_dir: Path | None = None
    controllers: int = 1  # controller processes (--controllers)
    clients_per_region: int = 1  # client processes per region (--clients-per-region)

    def __post_init__(self) -> None:
        c = FieldChecker()
        c.positive("--speed", self.speed)
        c.integer("--controllers", self.controllers, 1)
        c.integer("--clients-per-region", self.clients_per_region, 1)
        for flag, v in (("--interval", self.interval_s), ("--ttl", self.ttl_s)):
            if v is not None:
                c.positive(flag, v)
        c.integer("dedicated_replicas", self.dedicated_replicas, 1)
        c.raise_if_any()


class Proc:
    """One child process of the stack: its command line, its log file, its lines on stdout."""

    def __init__(self, name: str, argv: Sequence[str], log_path: Path, env: dict[str, str]):
        self.name = name
        self.argv = list(argv)
        self.log_path = log_path
        self.env = env
        self.process: asyncio.subprocess.Process | None = None
        self.lines: list[str] = []
        self._line_event = asyncio.Event()
        self._reader: asyncio.Task[None] | None = None
        self._log: TextIO | None = None
        self.paused = False
        self.starts = 0

    @property
    def pid(self) -> int | None:
        return None if self.process is None else self.process.pid

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.returncode is None

    async def start(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        # opening a local log file is quick; closed in stop()
        self._log = open(self.log_path, "a")  # noqa: SIM115, ASYNC230
        self.lines = []
        self.process = await asyncio.create_subprocess_exec(
            *self.argv,
            stdout=asyncio.subprocess.PIPE,
            stderr=self._log,
            env=self.env,
            start_new_session=True,  # a Ctrl-C at the terminal reaches `up`, which stops us
        )
        self.starts += 1
        self._reader = asyncio.create_task(self._read_stdout(), name=f"stdout-{self.name}")
        log.info("up.process.started", name=self.name, pid=self.process.pid)

    async def _read_stdout(self) -> None:
        assert self.process is not None
        assert self.process.stdout is not None
        while True:
            raw = await self.process.stdout.readline()
            if not raw:
                break
            self.lines.append(raw.decode(errors="replace").rstrip("\n"))
            self._line_event.set()

    async def wait_line(self, predicate: Callable[[str], bool], timeout_s: float) -> str:
        """The first stdout line matching ``predicate``; HeadroomError on exit or timeout."""
        deadline = time.monotonic() + timeout_s
        seen = 0
        while True:
            for line in self.lines[seen:]:
                if predicate(line):
                    return line
            seen = len(self.lines)
            if not self.running:
                raise HeadroomError(
                    f"{self.name} exited with status {self.returncode()} before it was ready "
                    f"(log: {self.log_path})"
                )
            left = deadline - time.monotonic()
            if left <= 0:
                raise HeadroomError(
                    f"{self.name} was not ready after {timeout_s:.0f} s (log: {self.log_path})"
                )
            self._line_event.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._line_event.wait(), min(left, 0.5))

    def pin_port(self, address: str) -> None:
        """Restart on the port the process announced (``HOST:PORT``): a replica restarted after a
        crash is found again at the address the clients know. The first start binds port 0, so
        no port is picked here and taken by another socket before the process binds it."""
        port = address.rsplit(":", 1)[1]
        i = self.argv.index("--port")
        self.argv[i + 1] = port

    def returncode(self) -> int | None:
        return None if self.process is None else self.process.returncode

    def signal(self, sig: signal.Signals) -> None:
        if self.running:
            assert self.process is not None
            with contextlib.suppress(ProcessLookupError):
                self.process.send_signal(sig)
            if sig == signal.SIGSTOP:
                self.paused = True
            elif sig == signal.SIGCONT:
                self.paused = False

    async def wait(self, timeout_s: float) -> int | None:
        if self.process is None:
            return None
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.process.wait(), timeout_s)
        return self.process.returncode

    async def stop(self, grace_s: float) -> None:
        """SIGCONT (if paused), SIGTERM, and SIGKILL after ``grace_s``; only this process."""
        if self.running:
            if self.paused:
                self.signal(signal.SIGCONT)
            self.signal(signal.SIGTERM)
            if await self.wait(grace_s) is None:
                log.warning("up.process.killed", name=self.name, pid=self.pid, grace_s=grace_s)
                self.signal(signal.SIGKILL)
                await self.wait(10.0)
        if self._reader is not None:
            self._reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reader
            self._reader = None
        if self._log is not None:
            self._log.close()
            self._log = None


class Stack:
    """The processes of one ``up`` run (see the module docstring). Use as ``async with``."""

    def __init__(self, config: StackConfig, scenario: Scenario) -> None:
        self.config = config
        self.scenario = scenario
        self.kafka = config.kafka
        # the control clock of both engines (scenario seconds): the scenario's, or the flags'
        self.control: Control = control_with_flags(
            scenario.control, config.interval_s, config.ttl_s, window_s=scenario.slo.window_s
        )
        self.interval_s = self.control.interval_s
        self.ttl_s = self.control.target_ttl_s
        self.procs: dict[str, Proc] = {}
        self.server_addresses: dict[str, list[tuple[str, str]]] = {}  # region -> [(pool, addr)]
        self.t0: float | None = None
        self.events_path = config.out_dir / "events.jsonl"
        self._collector: asyncio.Task[int] | None = None
        self._collector_stop = asyncio.Event()
        self._collector_ready = asyncio.Event()
        self._outage_tasks: list[asyncio.Task[None]] = []
        self.logs_dir = config.out_dir / "logs"
        if config.broker_state_dir is not None:
            broker_dir: Path | None = config.broker_state_dir
        else:
            from headroom.kernel.settings import default_state_dir

            broker_dir = default_state_dir()
        self.faults = FaultRunner(self, broker_dir)
        self.supervisor = Supervisor(self, self.faults)
        self._audit_start: dict[str, Any] | None = None
        self.audit: dict[str, Any] | None = None
        # (receipt wall time, kind, source, region) of every collected event: fault recovery
        self._seen: list[tuple[float, dict[str, Any]]] = []
        self._seen_event = asyncio.Event()
        self._value_counted: dict[str, int] = {}  # producer -> newest count by the controllers

    # -- helpers ------------------------------------------------------------------------------

    def _env(self, name: str = "") -> dict[str, str]:
        env = dict(os.environ)
        env["HEADROOM_LOG_FORMAT"] = "json"
        env.setdefault("PYTHONUNBUFFERED", "1")
        # every controller its own data directory (``controller``, ``controller-1``, …)
        own = name if name.startswith("controller") else "controller"
        env["HEADROOM_CONTROLLER_DIR"] = str(self.config.out_dir / own)
        return env

    def _cmd(self, *args: str) -> list[str]:
        # the client properties by path (this stack's, else the process's): a password is
        # never on a command line
        source = self.kafka.security.source or security.current().source
        config = [] if source is None else ["--kafka-config", str(source)]
        return [
            self.config.python,
            "-m",
            "headroom.cli",
            *args,
            "--bootstrap",
            self.kafka.bootstrap,
            "--prefix",
            self.kafka.prefix,
            *config,
        ]

    def _proc(self, name: str, argv: list[str]) -> Proc:
        proc = Proc(name, argv, self.logs_dir / f"{name}.log", self._env(name))
        self.procs[name] = proc
        return proc

    def scenario_time(self, wall: float | None = None) -> float:
        assert self.t0 is not None
        return ((time.time() if wall is None else wall) - self.t0) * self.config.speed

    def wall(self, t: float) -> float:
        assert self.t0 is not None
        return self.t0 + t / self.config.speed

    # -- lifecycle ------------------------------------------------------------------------------

    async def __aenter__(self) -> Stack:
        try:
            await self.start()
        except BaseException:
            await self.stop()
            raise
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def start(self) -> None:
        cfg = self.config
        if not await probe_async(self.kafka.bootstrap, timeout_s=10.0):
            raise HeadroomError(
                f"cannot reach Kafka at {self.kafka.bootstrap}: start the local broker with "
                "`headroom kafka start`, or set KAFKA_BOOTSTRAP_SERVERS (or --bootstrap) to a "
                "running cluster"
            )
        wanted = topics(self.kafka.prefix)
        await create_topics(self.kafka.bootstrap, wanted)
        partitions = await wait_for_topics(self.kafka.bootstrap, [t.name for t in wanted])
        cfg.out_dir.mkdir(parents=True, exist_ok=True)
        events = self.kafka.topic("events")
        self._collector = asyncio.create_task(
            self._collect(events, partitions[events]), name="collector"
        )
        await self._collector_started()
        scenario_flag = ["--scenario", str(cfg.scenario_path)]
        self.t0 = time.time() + cfg.startup_margin_s
        clock = ["--t0", f"{self.t0:.6f}", "--speed", repr(cfg.speed)]
        metrics = ["--metrics-port", "0"]  # every worker serves Prometheus on a free port
        for name in self.controller_names():
            await self._proc(name, self.controller_argv()).start()
        servers: list[Proc] = []
        meta: list[tuple[str, str]] = []
        for region in self.scenario.regions:
            replicas = MixedReplicas(cfg.dedicated_replicas)
            for i in range(replicas.count):
                name = f"server-{region.name}-dedicated-{i}"
                servers.append(
                    self._proc(
                        name,
                        self._cmd(
                            "server",
                            "--region",
                            region.name,
                            "--pool",
                            "dedicated",
                            "--replica",
                            name,
                            "--share",
                            repr(replicas.share),
                            "--port",
                            "0",  # pinned to the port it announces (pin_port) once it is up
                            *metrics,
                            *clock,
                            *scenario_flag,
                        ),
                    )
                )
                meta.append((region.name, "dedicated"))
            name = f"server-{region.name}-opportunistic-0"
            servers.append(
                self._proc(
                    name,
                    self._cmd(
                        "server",
                        "--region",
                        region.name,
                        "--pool",
                        "opportunistic",
                        "--replica",
                        name,
                        "--port",
                        "0",
                        *metrics,
                        *clock,
                        *scenario_flag,
                    ),
                )
            )
            meta.append((region.name, "opportunistic"))
        for proc in servers:
            await proc.start()
        for proc, (region_name, pool) in zip(servers, meta, strict=True):
            line = await proc.wait_line(lambda s: s.startswith("listening on "), READY_TIMEOUT_S)
            address = line.removeprefix("listening on ").strip()
            proc.pin_port(address)
            self.server_addresses.setdefault(region_name, []).append((pool, address))
        if self.scenario.precompute_enabled:
            workers = [self.precompute_proc(region.name) for region in self.scenario.regions]
            for proc in workers:
                await proc.start()
            for region, proc in zip(self.scenario.regions, workers, strict=True):
                await proc.wait_line(
                    f"precompute worker ready (region {region.name})".__eq__, READY_TIMEOUT_S
                )
        await self._start_clients()
        for e in self.scenario.events:
            if e.kind == "control_outage":
                self._outage_tasks.append(
                    asyncio.create_task(self._outage(e.at_s, e.duration_s or 0.0))
                )
        self.faults.check()
        self._audit_start = await end_offsets(self.kafka)
        if time.time() > self.t0 - 1.0:
            raise HeadroomError(
                f"the stack took longer than {cfg.startup_margin_s:.0f} s to start (logs: "
                f"{self.logs_dir}); raise the start-up margin"
            )
        feed = self._proc("feed", self._cmd("feed", str(cfg.scenario_path), *clock))
        await feed.start()
        self.faults.start()
        self.supervisor.start()
        log.info("up.metrics.endpoints", **self.metrics_endpoints())
        log.info(
            "up.stack.started",
            t0=self.t0,
            speed=cfg.speed,
            interval_s=self.interval_s,
            processes=len(self.procs),
        )

    async def _start_clients(self) -> None:
        """Every client of every region, then wait until each is ready."""
        started = []
        for region in self.scenario.regions:
            for i in range(self.config.clients_per_region):
                started.append((region.name, i))
                await self.start_client(region.name, i)
        for region_name, i in started:
            await self.wait_client(region_name, i)

    def controller_names(self) -> list[str]:
        """``controller``, then ``controller-1``, … (``--controllers``)."""
        return [controller_name(i) for i in range(self.config.controllers)]

    def client_names(self, region: str) -> list[str]:
        """``client-R``, then ``client-R-1``, … (``--clients-per-region``)."""
        return [client_name(region, i) for i in range(self.config.clients_per_region)]

    def controller_argv(self) -> list[str]:
        """The controller's command line: the control clock of the run (scenario seconds) and
        the run's ``t0`` and speed, so its steps fall at scenario time ``k × interval``."""
        assert self.t0 is not None
        return self._cmd(
            "controller",
            "--interval", repr(self.interval_s), "--ttl", repr(self.ttl_s),
            "--t0", f"{self.t0:.6f}", "--speed", repr(self.config.speed),
            "--metrics-port", "0", "--scenario", str(self.config.scenario_path),
        )  # fmt: skip

    def metrics_endpoints(self) -> dict[str, str]:
        """The Prometheus ``/metrics`` URL each process printed at start-up."""
        out = {}
        for name, proc in self.procs.items():
            for line in proc.lines:
                if line.startswith("metrics on "):
                    out[name] = line.removeprefix("metrics on ").strip()
        return out

    def precompute_proc(self, region: str) -> Proc:
        """The precompute worker of ``region`` (``headroom precompute``), on the run's clock.

        It runs under ``nice``: precompute spends capacity too remote or unstable for the live
        path, which in a deployment is another machine's; on the one host of ``up`` the lowest
        CPU priority stands for that, so its ranking never delays the live servers' baseline."""
        assert self.t0 is not None
        return self._proc(
            f"precompute-{region}",
            [
                "nice", "-n", str(PRECOMPUTE_NICENESS),
                *self._cmd(
                    "precompute", "--region", region,
                    "--t0", f"{self.t0:.6f}", "--speed", repr(self.config.speed),
                    "--scenario", str(self.config.scenario_path), "--metrics-port", "0",
                ),
            ],
        )  # fmt: skip

    def client_argv(self, region: str, index: int = 0) -> list[str]:
        """Client ``index`` of ``region``: the region's group of this run (its clients split the
        requests partitions), its own static member id (a restart gets its partitions back)."""
        assert self.t0 is not None
        servers = [f"--server={pool}={addr}" for pool, addr in self.server_addresses[region]]
        return self._cmd(
            "client", "--region", region, *servers,
            "--group", f"{self.kafka.prefix}client-{region}-{self.config.run_id}",
            "--instance", client_name(region, index), "--interval", repr(self.interval_s),
            "--t0", f"{self.t0:.6f}", "--speed", repr(self.config.speed),
            "--scenario", str(self.config.scenario_path), "--metrics-port", "0",
        )  # fmt: skip

    async def start_client(self, region: str, index: int = 0) -> Proc:
        name = client_name(region, index)
        proc = self.procs.get(name) or self._proc(name, self.client_argv(region, index))
        await proc.start()
        return proc

    async def wait_client(self, region: str, index: int = 0) -> None:
        await self.procs[client_name(region, index)].wait_line(
            lambda s: s == "ready", READY_TIMEOUT_S
        )

    async def kill(self, name: str, sig: signal.Signals = signal.SIGKILL) -> None:
        """Send ``sig`` to one process of the stack (tests: ``kill -9``) and wait for it. The
        supervisor leaves it down until :meth:`restart` starts it again."""
        proc = self.procs[name]
        self.faults.expected_down.add(name)
        log.info("up.process.signalled", name=name, pid=proc.pid, signal=sig.name)
        proc.signal(sig)
        await proc.wait(30.0)

    async def restart(self, name: str) -> Proc:
        """Start a stopped process again with the same command line (same port, same id)."""
        proc = self.procs[name]
        if proc.running:
            raise HeadroomError(f"{name} is still running (pid {proc.pid})")
        await proc.stop(0.0)
        await proc.start()
        self.faults.expected_down.discard(name)
        if name.startswith("server-"):
            await proc.wait_line(lambda s: s.startswith("listening on "), READY_TIMEOUT_S)
        elif name.startswith("client-"):
            await proc.wait_line(lambda s: s == "ready", READY_TIMEOUT_S)
        elif name.startswith("precompute-"):
            await proc.wait_line(lambda s: s.startswith("precompute worker ready"), READY_TIMEOUT_S)
        return proc

    async def wait_event(
        self, predicate: Callable[[dict[str, Any]], bool], since: float, timeout_s: float
    ) -> float:
        """The wall time the collector received the first event after ``since`` (wall) that
        matches ``predicate`` (called with its ``kind``, ``source`` and ``region``);
        TimeoutError after ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        i = 0
        while True:
            while i < len(self._seen):
                at, ev = self._seen[i]
                i += 1
                if at >= since and predicate(ev):
                    return at
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"no matching event within {timeout_s:.0f} s")
            self._seen_event.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._seen_event.wait(), min(left, 1.0))

    async def _outage(self, at_s: float, duration_s: float) -> None:
        """A ``control_outage``: every controller paused over the span (the control plane is
        silent, however many processes run it)."""
        controllers = [self.procs[name] for name in self.controller_names()]
        await asyncio.sleep(max(0.0, self.wall(at_s) - time.time()))
        log.info("up.controller.paused", t=at_s, duration_s=duration_s)
        for proc in controllers:
            proc.signal(signal.SIGSTOP)
        await asyncio.sleep(duration_s / self.config.speed)
        for proc in controllers:
            proc.signal(signal.SIGCONT)
        log.info("up.controller.resumed", t=at_s + duration_s)

    async def at(self, t: float, action: Callable[[], Awaitable[Any]]) -> Any:
        """Run ``action`` at scenario time ``t`` (tests: kill a server, restart a client)."""
        await asyncio.sleep(max(0.0, self.wall(t) - time.time()))
        return await action()

    async def wait_finished(self) -> None:
        """Until the feed has played the whole scenario (a feed killed by a fault, or that
        died and was restarted by the supervisor, is waited for again) and the faults under way
        have ended (:meth:`FaultRunner.settle`)."""
        feed = self.procs["feed"]
        while True:
            process = feed.process
            assert process is not None
            code = await process.wait()
            if code == 0 and feed.process is process:
                await self.faults.settle()
                return
            # killed: wait for the fault runner or the supervisor to start it again
            deadline = time.monotonic() + READY_TIMEOUT_S + 600.0
            while feed.process is process and time.monotonic() < deadline:
                if "feed" not in self.faults.expected_down and self.supervisor.stopping:
                    break
                await asyncio.sleep(0.2)
            if feed.process is process:
                raise HeadroomError(f"the feed failed with status {code} (log: {feed.log_path})")

    async def stop(self) -> None:
        """Stop every process this stack started (clients and servers drain first); then the
        audit of the topics, and the fault and restart lines into the event log."""
        await self.supervisor.cancel()
        await self.faults.cancel()
        for task in self._outage_tasks:
            task.cancel()
        for prefix in ("feed", "client"):  # what publishes requests and value signals
            await self._stop_group(prefix)
        if self._audit_start is not None and self._collector is not None:
            # both audited topics are final now: count them, and give the controllers the time
            # to count the last value signals before they stop (their counts go out once a
            # second, so the newest ones are otherwise lost with the process)
            try:
                self.audit = await audit_topics(self.kafka, self._audit_start)
            except Exception as exc:  # the run's other outputs still count
                log.warning("up.audit.failed", error=f"{type(exc).__name__}: {exc}")
            else:
                await self._settle_value_counts(self.audit)
        for prefix in ("precompute", "server", "controller"):
            await self._stop_group(prefix)
        if self._collector is not None and not self._collector.done():
            self._collector_stop.set()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._collector, self.config.quiet_s + 30.0)
        if self._collector is None:
            return
        lines = self.faults.events() + self.supervisor.restarts
        if self.audit is not None:
            lines.append(audit_event(self.audit))
        if lines and self.events_path.exists():
            self.add_events(lines)

    async def _stop_group(self, prefix: str) -> None:
        group = [p for name, p in self.procs.items() if name.startswith(prefix)]
        await asyncio.gather(*(p.stop(self.config.drain_s) for p in group))

    async def _settle_value_counts(self, audit: dict[str, Any]) -> None:
        """Until the controllers' ``value.counted`` events account for every value signal the
        audit found (per producer), or :data:`VALUE_SETTLE_S`; a shortfall then is logged
        (``up.value.unsettled``) and shows in metrics.json as counted < published."""
        value = audit.get("value", {})
        published = {p: int(rec["published"]) for p, rec in value.get("producers", {}).items()}
        deadline = time.monotonic() + VALUE_SETTLE_S
        while True:
            short = {
                p: n - self._value_counted.get(p, 0)
                for p, n in published.items()
                if self._value_counted.get(p, 0) < n
            }
            if not short:
                return
            if time.monotonic() >= deadline:
                log.warning("up.value.unsettled", short=short, waited_s=VALUE_SETTLE_S)
                return
            await asyncio.sleep(0.2)

    # -- the collector ----------------------------------------------------------------------------

    async def _collector_started(self) -> None:
        """Until the collector reads the events topic from its end; its own error if it failed
        first (the broker unreachable, the topic gone), :class:`HeadroomError` after
        :data:`READY_TIMEOUT_S`."""
        assert self._collector is not None
        ready = asyncio.ensure_future(self._collector_ready.wait())
        try:
            await asyncio.wait(
                {ready, self._collector},
                timeout=READY_TIMEOUT_S,
                return_when=asyncio.FIRST_COMPLETED,
            )
        finally:
            ready.cancel()
        if self._collector_ready.is_set():
            return
        if self._collector.done():
            self._collector.result()  # raises what stopped it
        raise HeadroomError(
            f"the event collector did not reach the end of {self.kafka.topic('events')} "
            f"within {READY_TIMEOUT_S:g} s"
        )

    async def _collect(self, topic: str, partitions: int) -> int:
        # every partition, assigned by hand: a consumer subscribed without a group is assigned
        # only once its own metadata shows the topic (on a busy three-broker cluster such a
        # collector once did not become ready within a minute of the topic's creation)
        consumer = make_consumer(self.kafka.bootstrap)
        parts = [TopicPartition(topic, p) for p in range(partitions)]
        count = 0
        async with started(consumer, self.kafka.bootstrap):
            consumer.assign(parts)
            await consumer.seek_to_end(*parts)
            for tp in parts:
                await consumer.position(tp)
            self._collector_ready.set()
            quiet_since: float | None = None
            with EventWriter(self.events_path) as writer:
                while True:
                    batch = await consumer.getmany(timeout_ms=200, max_records=1000)
                    got = False
                    for records in batch.values():
                        for record in records:
                            try:
                                event = messages.decode("events", record.value)
                            except messages.ValidationError as exc:
                                log.warning("up.event.rejected", error=str(exc))
                                continue
                            assert isinstance(event, messages.Event)
                            writer.write(event.to_dict())
                            self._saw(event)
                            count += 1
                            got = True
                    if got:
                        writer.flush()
                    if self._collector_stop.is_set():
                        now = time.monotonic()
                        if got or quiet_since is None:
                            quiet_since = now
                        elif now - quiet_since >= self.config.quiet_s:
                            break
        log.info("up.events.collected", events=count, path=str(self.events_path))
        return count

    def _saw(self, event: messages.Event) -> None:
        """Note a collected event for :meth:`wait_event` (only what recovery checks need), and
        the newest count of every value-signal producer (:meth:`_settle_value_counts`)."""
        if event.kind == "value.counted":
            producers = event.extra.get("producers")
            for p, rec in producers.items() if isinstance(producers, Mapping) else ():
                counted = rec.get("counted") if isinstance(rec, Mapping) else None
                if isinstance(counted, int) and counted > self._value_counted.get(p, 0):
                    self._value_counted[p] = counted
        self._seen.append(
            (time.time(), {"kind": event.kind, "source": event.source, "region": event.region})
        )
        if len(self._seen) > SEEN_EVENTS:
            del self._seen[: SEEN_EVENTS // 2]
        self._seen_event.set()

    def add_events(self, events: Sequence[dict[str, Any]]) -> None:
        with EventWriter(self.events_path, append=True) as writer:
            for e in events:
                writer.write(e)


Action = Callable[[Stack], Awaitable[Any]]


async def run_stack(
    config: StackConfig,
    scenario: Scenario,
    *,
    actions: Sequence[tuple[float, Action]] = (),
) -> Stack:
    """Start the stack, play the scenario (running ``actions`` at their scenario times) and stop
    everything; the returned stack's ``events_path`` holds every event of the run. The command
    line adds the oracle's bound and computes the metrics (:mod:`headroom.commands.up`)."""
    stack = Stack(config, scenario)
    async with stack:
        tasks = [asyncio.create_task(stack.at(t, _bind(a, stack))) for t, a in actions]
        try:
            await stack.wait_finished()
            for task in tasks:
                exc = task.exception() if task.done() and not task.cancelled() else None
                if exc is not None:
                    raise exc
        finally:
            for task in tasks:
                task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await asyncio.gather(*tasks)
    return stack


def _bind(action: Action, stack: Stack) -> Callable[[], Awaitable[Any]]:
    return lambda: action(stack)
