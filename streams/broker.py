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
import secrets
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
from headroom.streams import security

BROKER_DIR = PACKAGE_DIR / "broker"
POM_PATH = BROKER_DIR / "pom.xml"
LOG4J2_PATH = BROKER_DIR / "log4j2.properties"
HOST = "127.0.0.1"
NODE_ID = 1
STATE_DIR_PROPERTY = "headroom.kafka.state.dir"
MAIN_CLASS = "kafka.Kafka"
STORAGE_TOOL = "kafka.tools.StorageTool"  # in the core jar; not org.apache.kafka.tools.StorageTool
LIBS_STAMP = ".headroom-pom.sha256"
MAX_BROKERS = 9
MAX_CONTROLLERS = 3  # the first min(N, 3) nodes of a cluster are also KRaft controllers
SECURITY_CHOICES = ("plaintext", "sasl_ssl")
SCRAM_MECHANISM = "SCRAM-SHA-512"
CLIENT_USER = "headroom"  # the SCRAM user client.properties names
BROKER_USER = "broker"  # the SCRAM user brokers talk to each other as

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
    brokers: int = 1  # --brokers N: a local cluster of N nodes
    security: str = "plaintext"  # --security: plaintext or sasl_ssl

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
        if not 1 <= self.brokers <= MAX_BROKERS:
            problems.append(f"--brokers: {self.brokers} must be 1-{MAX_BROKERS}")
        if self.security not in SECURITY_CHOICES:
            problems.append(f"--security: {self.security!r} must be one of {SECURITY_CHOICES}")
        if self.brokers > 1 and self.controller_port is not None:
            problems.append("--controller-port: only for a single broker (--brokers 1)")
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

    @property
    def client_properties(self) -> Path:
        return self.root / "client.properties"

    @property
    def tls_dir(self) -> Path:
        return self.root / "tls"

    @property
    def secrets_file(self) -> Path:
        return self.root / "secrets.json"

    def node(self, node_id: int) -> BrokerPaths:
        """The files of one node of a cluster: node 1 in the state directory itself (so a
        one-node broker keeps the layout it always had), node k in ``node-k/``."""
        return self if node_id == NODE_ID else BrokerPaths(self.root / f"node-{node_id}")


@dataclass(frozen=True)
class BrokerStatus:
    state: BrokerState
    state_dir: Path
    pid: int | None = None
    bootstrap: str | None = None
    nodes: int = 1  # nodes of the cluster
    nodes_running: int = 0  # of which this many are our live processes


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
    *,
    port: int,
    controller_port: int | None,
    data_dir: Path,
    overrides: Mapping[str, str],
    node_id: int = NODE_ID,
    voters: str | None = None,
    brokers: int = 1,
    tls: TlsSettings | None = None,
) -> str:
    """server.properties of one KRaft node on loopback, tuned for fast tests.

    One node by default (``process.roles=broker,controller``). In a cluster of ``brokers``
    nodes, ``voters`` is the static quorum (``id@host:port,…``) and a node without a
    ``controller_port`` is a broker only; internal topics get min(3, brokers) replicas and a
    min ISR of min(2, R). With ``tls`` the client listener is SASL_SSL (SCRAM-SHA-512, brokers
    talk to each other over it as their own SCRAM user); the controller listener stays
    PLAINTEXT on loopback (KRaft cannot check SCRAM before the metadata is loaded).

    Each non-obvious value says where it comes from: Kafka's config/server.properties for the
    listener layout, KAFKA.md ("fast tests") for the group and internal-topic settings.
    """
    replication = max(1, min(3, brokers))
    min_isr = str(max(1, min(2, replication)))
    client = "SASL_SSL" if tls is not None else "PLAINTEXT"
    listeners = [f"{client}://{HOST}:{port}"]
    if controller_port is not None:
        listeners.append(f"CONTROLLER://{HOST}:{controller_port}")
    props: dict[str, str] = {
        "process.roles": "broker,controller" if controller_port is not None else "broker",
        "node.id": str(node_id),
        # Static quorum: format without --standalone (Kafka 4.x rejects the mix).
        "controller.quorum.voters": voters or f"{node_id}@{HOST}:{controller_port}",
        "listeners": ",".join(listeners),
        "advertised.listeners": f"{client}://{HOST}:{port}",
        "controller.listener.names": "CONTROLLER",
        "inter.broker.listener.name": client,
        "listener.security.protocol.map": f"{client}:{client},CONTROLLER:PLAINTEXT",
        "log.dirs": str(data_dir),
        # One node: replication factor 1 and min ISR 1 everywhere, or InitProducerId never works;
        # a cluster: min(3, brokers) copies, min ISR min(2, R) (docs/kafka.md).
        "offsets.topic.replication.factor": str(replication),
        "transaction.state.log.replication.factor": str(replication),
        "transaction.state.log.min.isr": min_isr,
        "share.coordinator.state.topic.replication.factor": str(replication),
        "share.coordinator.state.topic.min.isr": min_isr,
        "default.replication.factor": str(replication),
        "min.insync.replicas": min_isr,
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
    if brokers > 1:
        # A killed broker is fenced (its partitions get new leaders) after 3 s, not 9 s.
        props["broker.session.timeout.ms"] = "3000"
        props["broker.heartbeat.interval.ms"] = "500"
    if tls is not None:
        props.update(tls.server_properties())
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


@dataclass(frozen=True)
class TlsSettings:
    """The broker side of ``--security sasl_ssl``: its key and trust stores (PKCS12, one
    password) and the SCRAM password brokers log in to each other with."""

    keystore: Path
    truststore: Path
    store_password: security.Secret
    broker_password: security.Secret

    def server_properties(self) -> dict[str, str]:
        store = self.store_password.reveal()
        jaas = (
            "org.apache.kafka.common.security.scram.ScramLoginModule required "
            f'username="{BROKER_USER}" password="{self.broker_password.reveal()}";'
        )
        return {
            "sasl.enabled.mechanisms": SCRAM_MECHANISM,
            "sasl.mechanism.inter.broker.protocol": SCRAM_MECHANISM,
            "listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config": jaas,
            "ssl.keystore.type": "PKCS12",
            "ssl.keystore.location": str(self.keystore),
            "ssl.keystore.password": store,
            "ssl.key.password": store,
            "ssl.truststore.type": "PKCS12",
            "ssl.truststore.location": str(self.truststore),
            "ssl.truststore.password": store,
        }


@dataclass(frozen=True)
class NodeSpec:
    """One node of a local cluster: its id and ports (no controller port: a broker only)."""

    node_id: int
    port: int
    controller_port: int | None

    def as_dict(self) -> dict[str, int | None]:
        return {"node_id": self.node_id, "port": self.port, "controller_port": self.controller_port}


def quorum_voters(nodes: list[NodeSpec]) -> str:
    """``controller.quorum.voters`` of a cluster: every node with a controller port."""
    return ",".join(
        f"{n.node_id}@{HOST}:{n.controller_port}" for n in nodes if n.controller_port is not None
    )


def cluster_bootstrap(nodes: list[NodeSpec]) -> str:
    """The bootstrap list of a cluster: every node's client address, comma-separated."""
    return ",".join(f"{HOST}:{n.port}" for n in nodes)


def render_client_properties(bootstrap: str, password: security.Secret, ca: Path) -> str:
    """``client.properties`` for the SCRAM user, in the keys librdkafka (kcat ``-F``) and the
    Java client share; ``--kafka-config`` reads the same file."""
    return (
        "# Written by `headroom kafka start --security sasl_ssl`: the local cluster's client\n"
        "# credentials (keep this file private). Use: --kafka-config <this file>, kcat -F.\n"
        f"bootstrap.servers={bootstrap}\n"
        "security.protocol=SASL_SSL\n"
        f"sasl.mechanism={SCRAM_MECHANISM}\n"
        f"sasl.username={CLIENT_USER}\n"
        f"sasl.password={password.reveal()}\n"
        f"ssl.ca.location={ca}\n"
    )


def scrub(text: str, secrets: list[security.Secret]) -> str:
    """``text`` with every secret's value replaced by ``***`` (for error messages)."""
    for secret in secrets:
        if secret.reveal():
            text = text.replace(secret.reveal(), security.REDACTED)
    return text


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


def _alive(pid: int) -> bool:
    """Whether ``pid`` still runs. For our own child (a broker this process started) ``waitpid``
    is the authority; /proc is asked only about other processes (a JVM starting up has been seen
    to show no command line for an instant, which made a live broker look dead)."""
    try:
        done, _ = os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        return read_cmdline(pid) is not None  # not our child: /proc tells
    return done != pid


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


async def probe_async(
    bootstrap: str, timeout_s: float = 2.0, client: security.ClientSecurity | None = None
) -> bool:
    """A real Kafka Metadata round trip: True when some broker of ``bootstrap`` lists itself.

    Uses aiokafka's connection directly rather than a client's bootstrap, which logs an error
    for every refused attempt while the broker is still starting. ``client``: the security
    settings to connect with (default: this process's, :func:`headroom.streams.security.current`).
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
                    host or HOST,
                    port,
                    request_timeout_ms=int(timeout_s * 1000),
                    **(client or security.current()).aiokafka_kwargs(),
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


def probe(
    bootstrap: str, timeout_s: float = 2.0, client: security.ClientSecurity | None = None
) -> bool:
    """Blocking wrapper of :func:`probe_async` (for the CLI and for fixtures)."""
    return asyncio.run(probe_async(bootstrap, timeout_s, client))


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
# TLS and SCRAM material (``--security sasl_ssl``)
# --------------------------------------------------------------------------------------------


def _private_write(path: Path, text: str) -> None:
    """Write a file only its owner can read (0600), also when it already exists."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(text)
    os.chmod(path, 0o600)


def _load_secrets(paths: BrokerPaths) -> dict[str, security.Secret]:
    """The state directory's passwords (made once, kept in a 0600 file): the key-store password,
    the brokers' SCRAM password and the client user's."""
    try:
        raw = json.loads(paths.secrets_file.read_text())
    except FileNotFoundError:
        raw = {}
    names = ("store", "broker", "client")
    if not all(isinstance(raw.get(k), str) and raw[k] for k in names):
        raw = {k: secrets.token_hex(16) for k in names}
        _private_write(paths.secrets_file, json.dumps(raw) + "\n")
    return {k: security.Secret(raw[k]) for k in names}


def _run_tool(
    cmd: list[str], env: Mapping[str, str], what: str, hidden: list[security.Secret]
) -> None:
    proc = subprocess.run(
        cmd, capture_output=True, text=True, check=False, env={**os.environ, **env}
    )
    if proc.returncode != 0:
        out = scrub((proc.stdout + proc.stderr).strip(), hidden)
        raise BrokerError(f"{what} failed (exit {proc.returncode}): {' '.join(cmd)}\n{out}")


def ensure_tls(paths: BrokerPaths) -> tuple[TlsSettings, security.Secret]:
    """Make (once) a CA, a broker certificate for 127.0.0.1 and localhost signed by it, and the
    PKCS12 key and trust stores, in ``STATE_DIR/tls`` (openssl and the JDK's keytool); return
    the broker's settings and the client user's password. Passwords reach the tools through
    the environment, never their command lines."""
    found = {tool: shutil.which(tool) for tool in ("openssl", "keytool")}
    missing = [tool for tool, where in found.items() if where is None]
    if missing:
        raise BrokerError(
            f"--security sasl_ssl needs {' and '.join(missing)} on PATH "
            "(openssl; keytool comes with the JDK)"
        )
    openssl, keytool = str(found["openssl"]), str(found["keytool"])
    pw = _load_secrets(paths)
    tls = paths.tls_dir
    tls.mkdir(parents=True, exist_ok=True)
    os.chmod(tls, 0o700)
    settings = TlsSettings(
        keystore=tls / "broker.p12",
        truststore=tls / "truststore.p12",
        store_password=pw["store"],
        broker_password=pw["broker"],
    )
    if settings.keystore.is_file() and settings.truststore.is_file() and (tls / "ca.pem").is_file():
        return settings, pw["client"]
    env = {"HEADROOM_STORE_PASS": pw["store"].reveal()}
    hidden = list(pw.values())
    ext = tls / "broker.ext"
    ext.write_text(
        "basicConstraints=CA:FALSE\n"
        "keyUsage=critical,digitalSignature,keyEncipherment\n"
        "extendedKeyUsage=serverAuth,clientAuth\n"
        "subjectAltName=IP:127.0.0.1,DNS:localhost\n"
        "subjectKeyIdentifier=hash\n"
        "authorityKeyIdentifier=keyid,issuer\n"
    )
    days = "3650"
    steps = [
        (
            [openssl, "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-sha256", "-days", days,
             "-subj", "/CN=headroom local CA", "-keyout", str(tls / "ca.key"),
             "-out", str(tls / "ca.pem"),
             "-addext", "basicConstraints=critical,CA:TRUE",
             "-addext", "keyUsage=critical,keyCertSign,cRLSign"],
            "making the CA",
        ),
        (
            [openssl, "req", "-newkey", "rsa:2048", "-nodes", "-sha256",
             "-subj", "/CN=localhost", "-keyout", str(tls / "broker.key"),
             "-out", str(tls / "broker.csr")],
            "making the broker key",
        ),
        (
            [openssl, "x509", "-req", "-sha256", "-days", days, "-in", str(tls / "broker.csr"),
             "-CA", str(tls / "ca.pem"), "-CAkey", str(tls / "ca.key"), "-CAcreateserial",
             "-extfile", str(ext), "-out", str(tls / "broker.pem")],
            "signing the broker certificate",
        ),
        (
            [openssl, "pkcs12", "-export", "-in", str(tls / "broker.pem"),
             "-inkey", str(tls / "broker.key"), "-certfile", str(tls / "ca.pem"),
             "-name", "broker", "-out", str(settings.keystore),
             "-passout", "env:HEADROOM_STORE_PASS"],
            "writing the broker key store",
        ),
    ]  # fmt: skip
    for cmd, what in steps:
        _run_tool(cmd, env, what, hidden)
    settings.truststore.unlink(missing_ok=True)
    _run_tool(
        [keytool, "-importcert", "-noprompt", "-alias", "headroom-ca",
         "-file", str(tls / "ca.pem"), "-keystore", str(settings.truststore),
         "-storetype", "PKCS12", "-storepass:env", "HEADROOM_STORE_PASS"],
        env,
        "writing the trust store",
        hidden,
    )  # fmt: skip
    for key in ("ca.key", "broker.key"):
        os.chmod(tls / key, 0o600)
    return settings, pw["client"]


def client_security(paths: BrokerPaths) -> security.ClientSecurity | None:
    """The client settings of a state directory's ``client.properties`` (None: no file, the
    broker is PLAINTEXT)."""
    if not paths.client_properties.is_file():
        return None
    return security.load(paths.client_properties)


# --------------------------------------------------------------------------------------------
# A local cluster (``--brokers N``, ``--security sasl_ssl``)
# --------------------------------------------------------------------------------------------


def _read_info(paths: BrokerPaths) -> dict[str, object]:
    try:
        loaded = json.loads(paths.info_file.read_text())
    except (FileNotFoundError, ValueError):
        return {}
    return loaded if isinstance(loaded, dict) else {}


def recorded_nodes(paths: BrokerPaths) -> list[NodeSpec]:
    """The nodes ``broker.json`` records (one node at the state directory's root when it
    records none: a broker started as a single node)."""
    info = _read_info(paths)
    raw = info.get("nodes")
    if isinstance(raw, list) and raw:
        return [
            NodeSpec(int(n["node_id"]), int(n["port"]), n.get("controller_port"))
            for n in raw
            if isinstance(n, dict)
        ]
    port = info.get("port")
    return [NodeSpec(NODE_ID, int(port) if isinstance(port, int) else 0, None)]


def _is_cluster(paths: BrokerPaths) -> bool:
    info = _read_info(paths)
    return isinstance(info.get("nodes"), list)


def _plan_nodes(cfg: BrokerConfig) -> list[NodeSpec]:
    """Ports of a new cluster: node 1 on ``--port`` (its controller on the next port when free),
    every other port a free one."""
    nodes = []
    taken: set[int] = {cfg.port}
    for k in range(1, cfg.brokers + 1):
        if k == 1:
            port = cfg.port
        else:
            port = free_port()
            while port in taken:
                port = free_port()
        taken.add(port)
        controller: int | None = None
        if k <= MAX_CONTROLLERS:
            if k == 1 and cfg.controller_port is not None:
                controller = cfg.controller_port
            elif k == 1 and cfg.port < 65535 and port_free(cfg.port + 1):
                controller = cfg.port + 1
            else:
                controller = free_port()
                while controller in taken:
                    controller = free_port()
            taken.add(controller)
        nodes.append(NodeSpec(k, port, controller))
    return nodes


@dataclass(frozen=True)
class _NodeLaunch:
    """What launching one node of a cluster needs besides the node itself."""

    java: str
    libs_dir: Path
    heap_mb: int
    cluster_id: str
    scram: list[str]  # --add-scram arguments for a first format (sasl_ssl)
    hidden: list[security.Secret]  # scrubbed from any error text

    def run(self, node: NodeSpec, np: BrokerPaths, properties: str) -> tuple[int, bool]:
        """Write the node's properties, format its storage the first time, start it; returns
        (pid, formatted now)."""
        _forget(np)
        for port in (node.port, node.controller_port):
            if port is not None and not port_free(port):
                raise BrokerError(f"port {port} on {HOST} (node {node.node_id}) is already in use")
        np.logs_dir.mkdir(parents=True, exist_ok=True)
        np.data_dir.mkdir(parents=True, exist_ok=True)
        _private_write(np.properties, properties)
        formatted = False
        if not (np.data_dir / "meta.properties").exists():
            args = ["format", "-t", self.cluster_id, "-c", str(np.properties), *self.scram]
            cmd = java_command(self.java, self.libs_dir, np, self.heap_mb, STORAGE_TOOL, args)
            proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
            if proc.returncode != 0:
                out = scrub((proc.stdout + proc.stderr).strip(), self.hidden)
                raise BrokerError(
                    f"formatting Kafka storage in {np.data_dir} failed "
                    f"(exit {proc.returncode}):\n{out}"
                )
            formatted = True
        argv = java_command(
            self.java, self.libs_dir, np, self.heap_mb, MAIN_CLASS, [str(np.properties)]
        )
        pid = _spawn_detached(argv, np.stdout_log)
        np.pid_file.write_text(f"{pid}\n")
        return pid, formatted


@dataclass(frozen=True)
class NodeRestart:
    """How to crash one node of the broker in a state directory and start it again (a scenario's
    ``broker_restart``): its pid now, and the configuration whose ``start`` starts the nodes
    that are down (just that one) on the same storage and ports."""

    node_id: int
    pid: int
    config: BrokerConfig


def node_restart(state_dir: Path, broker: int | None, start_timeout_s: float) -> NodeRestart:
    """The running node ``broker`` (0-based; None: the first) of the broker or local cluster in
    ``state_dir``; :class:`BrokerError` naming the problem when there is none such."""
    paths = BrokerPaths(state_dir.expanduser().resolve())
    info = _read_info(paths)
    nodes = recorded_nodes(paths)
    index = 0 if broker is None else int(broker)
    if not 0 <= index < len(nodes):
        raise BrokerError(
            f"broker {index}: the broker in {paths.root} has {len(nodes)} node(s) (0-based)"
        )
    node = nodes[index]
    pid = _read_pid(paths.node(node.node_id))
    if pid is None or not _alive(pid) or not _our_broker(pid, paths.node(node.node_id).root):
        raise BrokerError(f"broker {index}: node {node.node_id} in {paths.root} is not running")
    first = nodes[0]
    # a cluster's ports are in broker.json (its nodes'): only a single broker takes one
    controller = info.get("controller_port") if len(nodes) == 1 else None
    config = BrokerConfig(
        state_dir=paths.root,
        port=first.port,
        controller_port=int(controller) if isinstance(controller, int) else None,
        start_timeout_s=start_timeout_s,
        brokers=len(nodes),
        security=str(info.get("security", "plaintext")),
    )
    return NodeRestart(node.node_id, pid, config)


def _start_cluster(cfg: BrokerConfig, say: Callable[..., None], began: float) -> StartResult:
    """Start every node of the cluster that is not running (all of them the first time; after a
    node was killed, just that one), then wait until each started node answers."""
    paths = BrokerPaths(cfg.state_dir.expanduser().resolve())
    info = _read_info(paths)
    formatted_before = (paths.data_dir / "meta.properties").exists()
    if formatted_before and _is_cluster(paths):
        nodes = recorded_nodes(paths)
        sec = str(info.get("security", "plaintext"))
        if len(nodes) != cfg.brokers or sec != cfg.security:
            say(
                "broker.cluster.kept",
                nodes=len(nodes),
                security=sec,
                hint="the state directory holds this cluster; use a new one to change it",
            )
        cluster_id = str(info.get("cluster_id") or new_cluster_id())
    elif formatted_before:
        raise BrokerError(
            f"{paths.root} holds the storage of a one-node PLAINTEXT broker: a cluster "
            "(--brokers N) or --security sasl_ssl needs a state directory of its own "
            "(--state-dir DIR)"
        )
    else:
        nodes = _plan_nodes(cfg)
        sec = cfg.security
        cluster_id = new_cluster_id()
    java = find_java()
    version = kafka_version()
    libs_dir = (cfg.libs_dir or default_libs_dir(version)).expanduser().resolve()
    if not libs_ready(libs_dir):
        say("broker.assembly.started", kafka_version=version, libs_dir=str(libs_dir))
    resolved, resolve_s = ensure_libs(libs_dir, maven_repo=cfg.maven_repo)

    bootstrap = cluster_bootstrap(nodes)
    tls: TlsSettings | None = None
    client: security.ClientSecurity | None = None
    hidden: list[security.Secret] = []
    scram: list[str] = []
    if sec == "sasl_ssl":
        tls, client_password = ensure_tls(paths)
        hidden = [tls.store_password, tls.broker_password, client_password]
        _private_write(
            paths.client_properties,
            render_client_properties(bootstrap, client_password, paths.tls_dir / "ca.pem"),
        )
        client = security.load(paths.client_properties)
        scram = [
            "--add-scram",
            f"{SCRAM_MECHANISM}=[name={BROKER_USER},password={tls.broker_password.reveal()}]",
            "--add-scram",
            f"{SCRAM_MECHANISM}=[name={CLIENT_USER},password={client_password.reveal()}]",
        ]
    voters = quorum_voters(nodes)
    launched: list[tuple[NodeSpec, int, BrokerPaths]] = []
    formatted = False

    def write_info() -> None:
        """``broker.json``: the cluster's nodes, id and security, recorded before any node is
        formatted so that a failed first start is still known as this cluster's."""
        info = {
            "pid": _read_pid(paths),
            "bootstrap": bootstrap,
            "port": nodes[0].port,
            "controller_port": nodes[0].controller_port,
            "kafka_version": version,
            "libs_dir": str(libs_dir),
            "cluster_id": cluster_id,
            "security": sec,
            "nodes": [n.as_dict() for n in nodes],
        }
        paths.info_file.write_text(json.dumps(info, indent=2) + "\n")

    paths.root.mkdir(parents=True, exist_ok=True)
    write_info()
    try:
        for node in nodes:
            np = paths.node(node.node_id)
            pid = _read_pid(np)
            if pid is not None and _alive(pid) and _our_broker(pid, np.root):
                continue
            properties = render_server_properties(
                port=node.port,
                controller_port=node.controller_port,
                data_dir=np.data_dir,
                overrides=cfg.overrides,
                node_id=node.node_id,
                voters=voters,
                brokers=len(nodes),
                tls=tls,
            )
            launch = _NodeLaunch(java, libs_dir, cfg.heap_mb, cluster_id, scram, hidden)
            pid, formatted_now = launch.run(node, np, properties)
            formatted = formatted or formatted_now
            launched.append((node, pid, np))
            say("broker.process.launched", pid=pid, node=node.node_id, bootstrap=bootstrap)
        write_info()
        deadline = began + cfg.start_timeout_s
        for node, pid, np in launched:
            _wait_ready(pid, f"{HOST}:{node.port}", node.port, np, deadline, client)
    except BaseException:
        for _node, pid, np in launched:
            if _alive(pid):
                _signal_and_wait(pid, 10.0)
            _forget(np)
        raise
    paths.bootstrap_file.write_text(bootstrap + "\n")
    first = _read_pid(paths)
    return StartResult(
        bootstrap,
        first if first is not None else 0,
        not launched,
        resolved,
        formatted,
        time.monotonic() - began,
        resolve_s,
    )


# --------------------------------------------------------------------------------------------
# The three operations
# --------------------------------------------------------------------------------------------


def status(state_dir: Path, probe_timeout_s: float = 3.0) -> BrokerStatus:
    """What runs in ``state_dir``: RUNNING only when our process answers a metadata request.

    A cluster is RUNNING while at least one of its nodes is ours and the bootstrap list answers
    (``nodes_running`` says how many); STALE when pid files remain but none of them is ours."""
    state_dir = state_dir.resolve()
    paths = BrokerPaths(state_dir)
    nodes = recorded_nodes(paths) if _is_cluster(paths) else [NodeSpec(NODE_ID, 0, None)]
    pids = [_read_pid(paths.node(n.node_id)) for n in nodes]
    first = pids[0] if pids[0] is not None else next((p for p in pids if p is not None), None)
    if first is None:
        return BrokerStatus(BrokerState.STOPPED, state_dir, nodes=len(nodes))
    bootstrap = _read_bootstrap(paths)
    running = sum(
        1
        for n, pid in zip(nodes, pids, strict=True)
        if pid is not None and _alive(pid) and _our_broker(pid, paths.node(n.node_id).root)
    )
    if running == 0:
        return BrokerStatus(BrokerState.STALE, state_dir, first, bootstrap, len(nodes), 0)
    try:
        client = client_security(paths)
    except ConfigError:
        client = None
    if bootstrap is not None and probe(bootstrap, probe_timeout_s, client or security.PLAINTEXT):
        return BrokerStatus(BrokerState.RUNNING, state_dir, first, bootstrap, len(nodes), running)
    return BrokerStatus(BrokerState.UNRESPONSIVE, state_dir, first, bootstrap, len(nodes), running)


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
        if cfg.brokers > 1 or cfg.security != "plaintext" or _is_cluster(paths):
            return _start_cluster(cfg, say, began)
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


def _wait_ready(
    pid: int,
    bootstrap: str,
    port: int,
    paths: BrokerPaths,
    deadline: float,
    client: security.ClientSecurity | None = None,
) -> None:
    client = client or security.PLAINTEXT
    while True:
        if not _alive(pid):
            raise BrokerError(
                f"the Kafka broker (pid {pid}) exited during start-up\n{log_tail(paths)}"
            )
        # A cheap TCP connect first; only then the metadata round trip that proves readiness.
        if _tcp_open(port) and probe(bootstrap, timeout_s=2.0, client=client):
            return
        if time.monotonic() > deadline:
            raise BrokerError(
                f"the Kafka broker (pid {pid}) did not answer at {bootstrap} in time; "
                f"stopped it\n{log_tail(paths)}"
            )
        time.sleep(0.2)


def stop(state_dir: Path, timeout_s: float = 30.0) -> StopResult:
    """Stop the broker ``start`` launched from ``state_dir`` — only that process (every node of
    a cluster, signalled together so none waits for a quorum that is already gone).

    The pid must still run ``kafka.Kafka`` with this state directory on its command line;
    anything else (a recycled pid, another broker) is left alone and the stale pid file removed.
    """
    state_dir = state_dir.expanduser().resolve()
    paths = BrokerPaths(state_dir)
    if not state_dir.exists():
        return StopResult(False, None)
    with _file_lock(paths.lock_file):
        nodes = recorded_nodes(paths) if _is_cluster(paths) else [NodeSpec(NODE_ID, 0, None)]
        ours: list[int] = []
        first: int | None = None
        stale = False
        for node in nodes:
            np = paths.node(node.node_id)
            pid = _read_pid(np)
            if pid is None:
                _forget(np)
                continue
            first = pid if first is None else first
            if _alive(pid) and _our_broker(pid, np.root):
                ours.append(pid)
            else:
                stale = True
                _forget(np)
        if not ours:
            _forget(paths)
            return StopResult(False, first, stale_pid_removed=stale)
        killed = _signal_all_and_wait(ours, timeout_s)
        for node in nodes:
            _forget(paths.node(node.node_id))
        return StopResult(True, ours[0], killed=killed)


def _signal_all_and_wait(pids: list[int], timeout_s: float) -> bool:
    """SIGTERM to every pid at once, wait up to ``timeout_s``, then SIGKILL the rest; True when
    SIGKILL was needed."""
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not any(_alive(pid) for pid in pids):
            return False
        time.sleep(0.05)
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 10.0
    while time.monotonic() < deadline and any(_alive(pid) for pid in pids):
        time.sleep(0.05)
    return True
