"""The local Apache Kafka broker that development and tests run: assemble, start, probe, stop.

Kafka's download site is not reachable from the machines this project targets, and there is no
Docker engine, so the broker is assembled from Maven Central: ``headroom/broker/pom.xml`` pins
``org.apache.kafka:kafka_2.13`` (the Scala core module, whose POM pulls the whole broker closure)
plus a log4j2 backend, and ``mvn dependency:copy-dependencies`` copies every runtime jar into a
``libs/`` folder once. The folder records the SHA-256 of the pom it came from, so editing the pom
re-resolves the jars on the next start instead of mixing two versions on one classpath.

Start-up, in order (each step's facts come from Kafka's own scripts; see docs/kafka.md):

1. ``<state>/server.properties`` for one combined KRaft node (``process.roles=broker,controller``)
   on 127.0.0.1: a PLAINTEXT client listener (default port 19092, away from a developer's own
   9092) and a CONTROLLER listener, a static ``controller.quorum.voters``, replication factor 1
   and one partition for every internal topic, and the fast-test group settings
   (``group.initial.rebalance.delay.ms=0``, ``group.min.session.timeout.ms=1000``).
2. Storage is formatted once with ``kafka.tools.StorageTool format -t <cluster id>``; the cluster
   id is 16 random bytes in URL-safe base64 without padding (22 characters, never starting with
   ``-``), made here so no extra JVM start is needed to generate it.
3. ``java … kafka.Kafka server.properties`` runs detached in its own session, with the state
   directory on its command line (``-Dheadroom.kafka.state.dir=…``) so that ``stop`` can prove a
   pid is really *this* broker before signalling it.
4. Ready means a Kafka Metadata request answered with this node among the brokers — an open port
   is not enough (the listener binds before the broker can serve). The bootstrap address is then
   written to ``<state>/bootstrap``, where :func:`headroom.kernel.settings.resolve_bootstrap` finds
   it.

Stop sends SIGTERM to the recorded pid (controlled shutdown takes about two seconds), waits, and
sends SIGKILL only after a timeout. A pid that is gone, or that belongs to any other process, is
never signalled: the stale pid file is removed and the caller told.

Nothing here reads a global clock for decisions that tests pin down except the start-up deadline
and the stop grace period, which are real-time by nature.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import signal
import socket
import subprocess
import time
import xml.etree.ElementTree as ET
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path

from headroom.kernel.errors import ConfigError, HeadroomError
from headroom.kernel.settings import DEFAULT_BROKER_PORT, PACKAGE_DIR

BROKER_DIR = PACKAGE_DIR / "broker"
POM_PATH = BROKER_DIR / "pom.xml"
LOG4J2_PATH = BROKER_DIR / "log4j2.properties"
HOST = "127.0.0.1"
NODE_ID = 1
STATE_DIR_PROPERTY = "headroom.kafka.state.dir"
MAIN_CLASS = "kafka.Kafka"
STORAGE_TOOL = "kafka.tools.StorageTool"  # in the core jar; not org.apache.kafka.tools.StorageTool
LIBS_STAMP = ".headroom-pom.sha256"

# Kafka's own kafka-run-class.sh / kafka-server-start.sh JVM flags (KAFKA_JVM_PERFORMANCE_OPTS).
JVM_PERFORMANCE_OPTS = (
    "-server",
    "-XX:+UseG1GC",
    "-XX:MaxGCPauseMillis=20",
    "-XX:InitiatingHeapOccupancyPercent=35",
    "-XX:+ExplicitGCInvokesConcurrent",
    "-Djava.awt.headless=true",
)


class BrokerError(HeadroomError):
    """The broker could not be assembled, started or stopped (exit 1)."""


class BrokerState(Enum):
    """What ``status`` found in a state directory."""

    RUNNING = "running"  # our process is alive and answers a metadata request
    UNRESPONSIVE = "unresponsive"  # our process is alive but did not answer in time
    STOPPED = "stopped"  # no pid file
    STALE = "stale"  # a pid file whose process is gone or is not this broker


@dataclass(frozen=True)
class BrokerConfig:
    """Everything ``start`` needs; validated on construction, errors name the field."""

    state_dir: Path
    port: int = DEFAULT_BROKER_PORT
    # None: port + 1 when free, else any free port (the choice is recorded in broker.json).
    controller_port: int | None = None
    heap_mb: int = 512  # KAFKA.md: plenty for tests; the default 1 GiB crowds a 2-core machine
    start_timeout_s: float = 120.0
    # Jar folder; None: headroom/broker/libs if writable, else a per-user cache (default_libs_dir).
    libs_dir: Path | None = None
    # Maven local repository; None: Maven's default (~/.m2). Benchmarks pass an empty one.
    maven_repo: Path | None = None
    # Extra server.properties lines (key -> value), applied last; for experiments and tests.
    overrides: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        problems = []
        if not 1 <= self.port <= 65535:
            problems.append(f"--port: {self.port} must be 1-65535")
        if self.controller_port is not None and not 1 <= self.controller_port <= 65535:
            problems.append(f"--controller-port: {self.controller_port} must be 1-65535")
        if self.controller_port is not None and self.controller_port == self.port:
            problems.append(f"--controller-port: {self.controller_port} must differ from --port")
        if self.heap_mb < 128:
            problems.append(f"heap_mb: {self.heap_mb} must be >= 128")
        if not self.start_timeout_s > 0:
            problems.append(f"--timeout: {self.start_timeout_s} must be > 0")
        for key in self.overrides:
            if not key or "=" in key or "\n" in key or "\n" in self.overrides[key]:
                problems.append(f"overrides: {key!r} is not a valid property")
        if problems:
            raise ConfigError(problems)


@dataclass(frozen=True)
class BrokerPaths:
    """The files of one state directory."""

    root: Path

    @property
    def pid_file(self) -> Path:
        return self.root / "kafka.pid"

    @property
    def bootstrap_file(self) -> Path:
        return self.root / "bootstrap"

    @property
    def info_file(self) -> Path:
        return self.root / "broker.json"

    @property
    def properties(self) -> Path:
        return self.root / "server.properties"

    @property
    def data_dir(self) -> Path:
        return self.root / "data"

    @property
    def logs_dir(self) -> Path:
        return self.root / "logs"

    @property
    def server_log(self) -> Path:
        return self.logs_dir / "server.log"

    @property
    def stdout_log(self) -> Path:
        return self.logs_dir / "stdout.log"

    @property
    def lock_file(self) -> Path:
        return self.root / ".lock"


@dataclass(frozen=True)
class BrokerStatus:
    state: BrokerState
    state_dir: Path
    pid: int | None = None
    bootstrap: str | None = None


@dataclass(frozen=True)
class StartResult:
    bootstrap: str
    pid: int
    already_running: bool
    libs_resolved: bool  # True when this start ran Maven (a cold start)
    formatted: bool  # True when this start formatted fresh storage
    elapsed_s: float  # wall seconds from the call to the first metadata answer
    resolve_s: float = 0.0  # of which Maven took this long


@dataclass(frozen=True)
class StopResult:
    was_running: bool
    pid: int | None
    killed: bool = False  # SIGKILL was needed after the grace period
    stale_pid_removed: bool = False


# --------------------------------------------------------------------------------------------
# Pure helpers (no processes, no I/O beyond reading the pom)
# --------------------------------------------------------------------------------------------


def kafka_version(pom: Path = POM_PATH) -> str:
    """The Kafka version the pom pins (its ``kafka.version`` property)."""
    ns = {"m": "http://maven.apache.org/POM/4.0.0"}
    root = ET.parse(pom).getroot()
    node = root.find("m:properties/m:kafka.version", ns)
    if node is None or not (node.text or "").strip():
        raise BrokerError(f"{pom}: no <kafka.version> property")
    return (node.text or "").strip()


def new_cluster_id(random_bytes: Callable[[int], bytes] = os.urandom) -> str:
    """A KRaft cluster id: 16 random bytes, URL-safe base64, no padding, not starting with '-'.

    Kafka's ``Uuid.randomUuid()`` rejects ids whose string form starts with '-' (they would parse
    as command-line flags); we redraw in that case, as Kafka does.
    """
    while True:
        text = base64.urlsafe_b64encode(random_bytes(16)).rstrip(b"=").decode("ascii")
        if not text.startswith("-"):
            return text


def render_server_properties(
    *, port: int, controller_port: int, data_dir: Path, overrides: Mapping[str, str]
) -> str:
    """server.properties of one combined KRaft node on loopback, tuned for fast tests.

    Each non-obvious value says where it comes from: Kafka's config/server.properties for the
    listener layout, KAFKA.md ("fast tests") for the group and internal-topic settings.
    """
    props: dict[str, str] = {
        "process.roles": "broker,controller",
        "node.id": str(NODE_ID),
        # Static quorum: format without --standalone (Kafka 4.x rejects the mix).
        "controller.quorum.voters": f"{NODE_ID}@{HOST}:{controller_port}",
        "listeners": f"PLAINTEXT://{HOST}:{port},CONTROLLER://{HOST}:{controller_port}",
        "advertised.listeners": f"PLAINTEXT://{HOST}:{port}",
        "controller.listener.names": "CONTROLLER",
        "inter.broker.listener.name": "PLAINTEXT",
        "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
        "log.dirs": str(data_dir),
        # One node: replication factor 1 and min ISR 1 everywhere, or InitProducerId never works.
        "offsets.topic.replication.factor": "1",
        "transaction.state.log.replication.factor": "1",
        "transaction.state.log.min.isr": "1",
        "share.coordinator.state.topic.replication.factor": "1",
        "share.coordinator.state.topic.min.isr": "1",
        "default.replication.factor": "1",
        "min.insync.replicas": "1",
        # Internal topics default to 50 partitions each: seconds of start-up on 2 cores.
        "offsets.topic.num.partitions": "1",
        "transaction.state.log.num.partitions": "1",
        # Fast consumer groups: no 3 s join delay; clients may use 1 s session timeouts.
        "group.initial.rebalance.delay.ms": "0",
        "group.min.session.timeout.ms": "1000",
        "num.network.threads": "2",
        "num.io.threads": "2",
        "num.partitions": "1",
        # The cleaner's dedupe buffer defaults to 128 MiB; it must fit a 512 MiB heap.
        "log.cleaner.dedupe.buffer.size": str(16 * 1024 * 1024),
        # headroom creates its topics explicitly (Faust co-partitioning breaks on auto-created
        # topics with another partition count).
        "auto.create.topics.enable": "false",
    }
    props.update(overrides)
    lines = ["# Written by `headroom kafka start`; rewritten on every start.", ""]
    lines += [f"{key}={value}" for key, value in props.items()]
    return "\n".join(lines) + "\n"


def java_command(
    java: str,
    libs_dir: Path,
    paths: BrokerPaths,
    heap_mb: int,
    main_class: str,
    args: list[str],
) -> list[str]:
    """The JVM command line: Kafka's performance flags, our log4j2 file, the state-dir marker."""
    return [
        java,
        f"-Xmx{heap_mb}m",
        f"-Xms{min(heap_mb, 256)}m",
        *JVM_PERFORMANCE_OPTS,
        f"-Dkafka.logs.dir={paths.logs_dir}",
        f"-Dlog4j2.configurationFile={LOG4J2_PATH}",
        f"-D{STATE_DIR_PROPERTY}={paths.root}",
        "-cp",
        f"{libs_dir}/*",
        main_class,
        *args,
    ]


def is_broker_cmdline(argv: list[str], state_dir: Path) -> bool:
    """Whether a process command line is the broker ``start`` launched for ``state_dir``."""
    marker = f"-D{STATE_DIR_PROPERTY}={state_dir}"
    return MAIN_CLASS in argv and marker in argv


def pom_digest(pom: Path = POM_PATH) -> str:
    return hashlib.sha256(pom.read_bytes()).hexdigest()


# --------------------------------------------------------------------------------------------
# Tools, jars
# --------------------------------------------------------------------------------------------


def find_java() -> str:
    """The ``java`` executable: $JAVA_HOME/bin/java, else PATH; a clear error when missing."""
    home = os.environ.get("JAVA_HOME")
    if home and os.access(Path(home) / "bin" / "java", os.X_OK):
        return str(Path(home) / "bin" / "java")
    found = shutil.which("java")
    if found is None:
        raise BrokerError(
            "java not found: the local Kafka broker needs a JDK 17+ "
            "(e.g. `apt-get install openjdk-17-jdk-headless`), on PATH or in $JAVA_HOME"
        )
    return found


def find_maven() -> str:
    found = shutil.which("mvn")
    if found is None:
        raise BrokerError(
            "mvn not found: the first `headroom kafka start` assembles Kafka from Maven Central "
            "and needs Maven 3.8+ (e.g. `apt-get install maven`)"
        )
    return found


def _writable(directory: Path) -> bool:
    probe = directory
    while not probe.exists():
        probe = probe.parent
    return os.access(probe, os.W_OK)


def default_libs_dir(version: str | None = None) -> Path:
    """``headroom/broker/libs`` when writable (a source checkout), else the per-user cache.

    An installed package usually sits in a read-only site-packages; then the jars go to
    ``$XDG_CACHE_HOME/headroom/kafka-<version>/libs`` (default ``~/.cache/…``).
    """
    in_package = BROKER_DIR / "libs"
    if _writable(in_package):
        return in_package
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return cache / "headroom" / f"kafka-{version or kafka_version()}" / "libs"


def libs_ready(libs_dir: Path, pom: Path = POM_PATH) -> bool:
    stamp = libs_dir / LIBS_STAMP
    if not stamp.is_file() or stamp.read_text().strip() != pom_digest(pom):
        return False
    return any(libs_dir.glob("kafka_2.13-*.jar"))


@contextlib.contextmanager
def _file_lock(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def ensure_libs(
    libs_dir: Path, *, maven_repo: Path | None = None, pom: Path = POM_PATH
) -> tuple[bool, float]:
    """Make ``libs_dir`` hold the jars of ``pom``; returns (resolved now, seconds Maven took).

    Maven copies into a fresh sibling folder which then replaces ``libs_dir`` in one rename, so
    a stale jar (e.g. a logging binding the pom no longer names) never survives, and a failed
    resolve leaves the previous folder untouched. A file lock keeps two concurrent starts from
    resolving at once.
    """
    with _file_lock(libs_dir.parent / ".libs.lock"):
        if libs_ready(libs_dir, pom):
            return False, 0.0
        mvn = find_maven()
        fresh = libs_dir.parent / f".libs-resolving-{os.getpid()}"
        shutil.rmtree(fresh, ignore_errors=True)
        cmd = [
            mvn,
            "-B",
            "-q",
            "-Dstyle.color=never",
            "-f",
            str(pom),
            "dependency:copy-dependencies",
            f"-Dheadroom.libs.dir={fresh}",
        ]
        if maven_repo is not None:
            cmd.append(f"-Dmaven.repo.local={maven_repo}")
        began = time.monotonic()
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
        took = time.monotonic() - began
        if proc.returncode != 0 or not any(fresh.glob("kafka_2.13-*.jar")):
            shutil.rmtree(fresh, ignore_errors=True)
            tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-20:])
            raise BrokerError(
                f"assembling Kafka from Maven Central failed (mvn exit {proc.returncode}); "
                f"command: {' '.join(cmd)}\n{tail}"
            )
        (fresh / LIBS_STAMP).write_text(pom_digest(pom) + "\n")
        old = libs_dir.parent / f".libs-old-{os.getpid()}"
        if libs_dir.exists():
            libs_dir.rename(old)
        fresh.rename(libs_dir)
        shutil.rmtree(old, ignore_errors=True)
        return True, took


# --------------------------------------------------------------------------------------------
# Processes
# --------------------------------------------------------------------------------------------


def read_cmdline(pid: int) -> list[str] | None:
    """The argv of a live process, or None when it is gone (or a zombie)."""
    proc = Path("/proc") / str(pid)
    try:
        stat = (proc / "stat").read_text()
        # Field 3 after the parenthesised command name is the state; Z = zombie (already dead).
        if stat.rsplit(")", 1)[1].split()[0] == "Z":
            return None
        raw = (proc / "cmdline").read_bytes()
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return None
    except PermissionError:
        return None
    if not raw:
        return None
    return raw.rstrip(b"\0").decode(errors="replace").split("\0")


def _reap(pid: int) -> bool:
    """Reap ``pid`` if it is our exited child; True when it is known to be dead."""
    try:
        done, _ = os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        return False  # not our child: /proc tells
    return done == pid


def _alive(pid: int) -> bool:
    if _reap(pid):
        return False
    return read_cmdline(pid) is not None


def _our_broker(pid: int, state_dir: Path) -> bool:
    argv = read_cmdline(pid)
    return argv is not None and is_broker_cmdline(argv, state_dir)


def _read_pid(paths: BrokerPaths) -> int | None:
    try:
        text = paths.pid_file.read_text().strip()
    except FileNotFoundError:
        return None
    try:
        pid = int(text)
    except ValueError:
        return None
    return pid if pid > 0 else None


def _read_bootstrap(paths: BrokerPaths) -> str | None:
    try:
        return paths.bootstrap_file.read_text().strip() or None
    except FileNotFoundError:
        return None


def port_free(port: int, host: str = HOST) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def free_port(host: str = HOST) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def log_tail(paths: BrokerPaths, lines: int = 40) -> str:
    """The last lines of the broker's log (and of its stdout, where JVM errors land)."""
    parts = []
    for path in (paths.server_log, paths.stdout_log):
        try:
            text = path.read_text(errors="replace")
        except FileNotFoundError:
            continue
        tail = text.strip().splitlines()[-lines:]
        if tail:
            parts.append(f"--- {path} (last {len(tail)} lines)\n" + "\n".join(tail))
    return "\n".join(parts) if parts else f"(no log yet in {paths.logs_dir})"


async def probe_async(bootstrap: str, timeout_s: float = 2.0) -> bool:
    """A real Kafka Metadata round trip: True when some broker of ``bootstrap`` lists itself.

    Uses aiokafka's connection directly rather than a client's bootstrap, which logs an error
    for every refused attempt while the broker is still starting.
    """
    from aiokafka.conn import create_conn
    from aiokafka.errors import KafkaError
    from aiokafka.protocol.metadata import MetadataRequest

    for address in bootstrap.split(","):
        host, _, port_text = address.strip().rpartition(":")
        try:
            port = int(port_text)
        except ValueError:
            continue
        try:
            async with asyncio.timeout(timeout_s):
                conn = await create_conn(
                    host or HOST, port, request_timeout_ms=int(timeout_s * 1000)
                )
                try:
                    response = await conn.send(MetadataRequest([]))
                finally:
                    conn.close()
        except (OSError, KafkaError, TimeoutError):
            continue
        brokers = response.to_object().get("brokers", [])
        if brokers:
            return True
    return False


def probe(bootstrap: str, timeout_s: float = 2.0) -> bool:
    """Blocking wrapper of :func:`probe_async` (for the CLI and for fixtures)."""
    return asyncio.run(probe_async(bootstrap, timeout_s))


def _tcp_open(port: int, timeout_s: float = 0.5) -> bool:
    try:
        with socket.create_connection((HOST, port), timeout=timeout_s):
            return True
    except OSError:
        return False


def _spawn_detached(argv: list[str], log_path: Path) -> int:
    """Start ``argv`` in its own session (a Ctrl-C in the caller's terminal does not reach it),
    stdin from /dev/null, stdout and stderr appended to ``log_path``; returns the pid.

    ``os.posix_spawn`` rather than ``subprocess.Popen``: the broker outlives the command that
    started it, and a Popen object for a still-running child warns when it is collected.
    """
    log_path.parent.mkdir(parents=True, exist_ok=True)
    flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND
    actions = [
        (os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0),
        (os.POSIX_SPAWN_OPEN, 1, str(log_path), flags, 0o644),
        (os.POSIX_SPAWN_DUP2, 1, 2),
    ]
    return os.posix_spawn(argv[0], argv, dict(os.environ), file_actions=actions, setsid=True)


def _signal_and_wait(pid: int, timeout_s: float) -> bool:
    """SIGTERM, wait up to ``timeout_s``, then SIGKILL; returns True when SIGKILL was needed."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not _alive(pid):
            return False
        time.sleep(0.05)
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 10.0
    while time.monotonic() < deadline and _alive(pid):
        time.sleep(0.05)
    return True


def _forget(paths: BrokerPaths) -> None:
    for path in (paths.pid_file, paths.bootstrap_file):
        with contextlib.suppress(FileNotFoundError):
            path.unlink()


# --------------------------------------------------------------------------------------------
# The three operations
# --------------------------------------------------------------------------------------------


def status(state_dir: Path, probe_timeout_s: float = 3.0) -> BrokerStatus:
    """What runs in ``state_dir``: RUNNING only when our process answers a metadata request."""
    state_dir = state_dir.resolve()
    paths = BrokerPaths(state_dir)
    pid = _read_pid(paths)
    if pid is None:
        return BrokerStatus(BrokerState.STOPPED, state_dir)
    bootstrap = _read_bootstrap(paths)
    if not (_alive(pid) and _our_broker(pid, state_dir)):
        return BrokerStatus(BrokerState.STALE, state_dir, pid, bootstrap)
    if bootstrap is not None and probe(bootstrap, probe_timeout_s):
        return BrokerStatus(BrokerState.RUNNING, state_dir, pid, bootstrap)
    return BrokerStatus(BrokerState.UNRESPONSIVE, state_dir, pid, bootstrap)


def start(cfg: BrokerConfig, *, on_progress: Callable[..., None] | None = None) -> StartResult:
    """Assemble (first time), format (first time) and start the broker; return once it answers.

    Idempotent: when this state directory's broker already runs and answers, returns its address
    with ``already_running=True``. ``on_progress(event, **fields)`` hears the slow steps
    (``broker.assembly.started``, ``broker.process.launched``, ``broker.pidfile.removed``).
    Blocking: call it from synchronous code, not from inside a running event loop.

    Raises :class:`BrokerError` (with the log's tail) when the broker exits or does not answer
    within ``cfg.start_timeout_s``; a broker that did not come up is stopped, never left behind.
    """
    say = on_progress or (lambda _event, **_fields: None)
    began = time.monotonic()
    state_dir = cfg.state_dir.expanduser().resolve()
    paths = BrokerPaths(state_dir)
    state_dir.mkdir(parents=True, exist_ok=True)
    with _file_lock(paths.lock_file):
        current = status(state_dir)
        if current.state is BrokerState.RUNNING:
            assert current.pid is not None
            assert current.bootstrap is not None
            return StartResult(
                current.bootstrap, current.pid, True, False, False, time.monotonic() - began
            )
        if current.state is BrokerState.UNRESPONSIVE:
            raise BrokerError(
                f"a broker from {state_dir} (pid {current.pid}) is running but does not answer "
                f"at {current.bootstrap}; stop it with `headroom kafka stop --state-dir "
                f"{state_dir}` and start again\n{log_tail(paths)}"
            )
        if current.state is BrokerState.STALE:
            say("broker.pidfile.removed", pid=current.pid, reason="process is not this broker")
            _forget(paths)

        java = find_java()
        if not port_free(cfg.port):
            raise BrokerError(
                f"port {cfg.port} on {HOST} is already in use; pick another with --port N"
            )
        controller_port = cfg.controller_port
        if controller_port is None:
            controller_port = cfg.port + 1 if cfg.port < 65535 and port_free(cfg.port + 1) else 0
            if controller_port == 0:
                controller_port = free_port()
        elif not port_free(controller_port):
            raise BrokerError(f"controller port {controller_port} on {HOST} is already in use")

        version = kafka_version()
        libs_dir = (cfg.libs_dir or default_libs_dir(version)).expanduser().resolve()
        if not libs_ready(libs_dir):
            say("broker.assembly.started", kafka_version=version, libs_dir=str(libs_dir))
        resolved, resolve_s = ensure_libs(libs_dir, maven_repo=cfg.maven_repo)

        paths.logs_dir.mkdir(parents=True, exist_ok=True)
        paths.data_dir.mkdir(parents=True, exist_ok=True)
        paths.properties.write_text(
            render_server_properties(
                port=cfg.port,
                controller_port=controller_port,
                data_dir=paths.data_dir,
                overrides=cfg.overrides,
            )
        )
        formatted = False
        if not (paths.data_dir / "meta.properties").exists():
            cluster_id = new_cluster_id()
            cmd = java_command(
                java,
                libs_dir,
                paths,
                cfg.heap_mb,
                STORAGE_TOOL,
                ["format", "-t", cluster_id, "-c", str(paths.properties)],
            )
            proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
            if proc.returncode != 0:
                raise BrokerError(
                    f"formatting Kafka storage in {paths.data_dir} failed "
                    f"(exit {proc.returncode}):\n{(proc.stdout + proc.stderr).strip()}"
                )
            formatted = True

        bootstrap = f"{HOST}:{cfg.port}"
        argv = java_command(java, libs_dir, paths, cfg.heap_mb, MAIN_CLASS, [str(paths.properties)])
        pid = _spawn_detached(argv, paths.stdout_log)
        paths.pid_file.write_text(f"{pid}\n")
        paths.info_file.write_text(
            json.dumps(
                {
                    "pid": pid,
                    "bootstrap": bootstrap,
                    "port": cfg.port,
                    "controller_port": controller_port,
                    "kafka_version": version,
                    "libs_dir": str(libs_dir),
                },
                indent=2,
            )
            + "\n"
        )
        say("broker.process.launched", pid=pid, bootstrap=bootstrap, kafka_version=version)
        try:
            _wait_ready(pid, bootstrap, cfg.port, paths, began + cfg.start_timeout_s)
        except BaseException:
            if _alive(pid):
                _signal_and_wait(pid, 10.0)
            _forget(paths)
            raise
        paths.bootstrap_file.write_text(bootstrap + "\n")
        return StartResult(
            bootstrap, pid, False, resolved, formatted, time.monotonic() - began, resolve_s
        )


def _wait_ready(pid: int, bootstrap: str, port: int, paths: BrokerPaths, deadline: float) -> None:
    while True:
        if not _alive(pid):
            raise BrokerError(
                f"the Kafka broker (pid {pid}) exited during start-up\n{log_tail(paths)}"
            )
        # A cheap TCP connect first; only then the metadata round trip that proves readiness.
        if _tcp_open(port) and probe(bootstrap, timeout_s=2.0):
            return
        if time.monotonic() > deadline:
            raise BrokerError(
                f"the Kafka broker (pid {pid}) did not answer at {bootstrap} in time; "
                f"stopped it\n{log_tail(paths)}"
            )
        time.sleep(0.2)


def stop(state_dir: Path, timeout_s: float = 30.0) -> StopResult:
    """Stop the broker ``start`` launched from ``state_dir`` — only that process.

    The pid must still run ``kafka.Kafka`` with this state directory on its command line;
    anything else (a recycled pid, another broker) is left alone and the stale pid file removed.
    """
    state_dir = state_dir.expanduser().resolve()
    paths = BrokerPaths(state_dir)
    if not state_dir.exists():
        return StopResult(False, None)
    with _file_lock(paths.lock_file):
        pid = _read_pid(paths)
        if pid is None:
            _forget(paths)
            return StopResult(False, None)
        if not (_alive(pid) and _our_broker(pid, state_dir)):
            _forget(paths)
            return StopResult(False, pid, stale_pid_removed=True)
        killed = _signal_and_wait(pid, timeout_s)
        _forget(paths)
        return StopResult(True, pid, killed=killed)
