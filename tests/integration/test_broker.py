"""``headroom kafka start|status|stop`` with a real JVM: the life cycle, failures, and safety.

These start a second broker of their own (besides the session one) in a temporary state
directory, so they also cover the start path when ``make test`` supplies the session broker.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from headroom.streams import broker

Run = Callable[..., subprocess.CompletedProcess[str]]


@pytest.fixture
def state_dir(tmp_path: Path) -> Iterator[Path]:
    path = tmp_path / "kafka"
    yield path
    broker.stop(path)  # whatever a test did, no broker outlives it


@pytest.mark.integration
def test_start_status_stop_life_cycle(state_dir: Path, run_headroom: Run) -> None:
    port = broker.free_port()
    started = run_headroom("kafka", "start", "--port", str(port), "--state-dir", str(state_dir))
    assert started.returncode == 0, started.stderr
    address = f"127.0.0.1:{port}"
    assert started.stdout.strip().splitlines()[-1] == address
    assert broker.probe(address)  # a real metadata round trip answers
    assert (state_dir / "bootstrap").read_text().strip() == address
    pid = int((state_dir / "kafka.pid").read_text())

    status = run_headroom("kafka", "status", "--state-dir", str(state_dir))
    assert status.returncode == 0
    assert status.stdout.strip().splitlines()[-1] == address

    again = run_headroom("kafka", "start", "--port", str(port), "--state-dir", str(state_dir))
    assert again.returncode == 0
    assert again.stdout.strip().splitlines()[-1] == address
    assert "already running" in again.stderr
    assert int((state_dir / "kafka.pid").read_text()) == pid  # no second broker

    # The log4j2 binding works: the broker's own log fills (a wrong SLF4J binding leaves it
    # empty and prints an SLF4J warning on stdout instead).
    log = (state_dir / "logs" / "server.log").read_text()
    assert "Kafka Server started" in log
    assert "SLF4J" not in (state_dir / "logs" / "stdout.log").read_text()

    stopped = run_headroom("kafka", "stop", "--state-dir", str(state_dir))
    assert stopped.returncode == 0
    assert broker.read_cmdline(pid) is None  # the process is gone
    assert not (state_dir / "bootstrap").exists()
    assert run_headroom("kafka", "status", "--state-dir", str(state_dir)).returncode == 1
    assert run_headroom("kafka", "stop", "--state-dir", str(state_dir)).returncode == 0

    # Warm restart on the same storage: same address, data kept.
    restarted = run_headroom("kafka", "start", "--port", str(port), "--state-dir", str(state_dir))
    assert restarted.returncode == 0, restarted.stderr
    assert restarted.stdout.strip().splitlines()[-1] == address
    assert '"formatted": false' in restarted.stderr


@pytest.mark.integration
def test_a_broker_that_dies_at_start_up_is_reported_with_its_log(
    state_dir: Path, run_headroom: Run
) -> None:
    data = state_dir / "data"
    data.mkdir(parents=True)
    # Storage "formatted" for another node: the broker refuses it at start-up.
    (data / "meta.properties").write_text(
        "version=1\ncluster.id=AAAAAAAAAAAAAAAAAAAAAA\nnode.id=7\n"
        "directory.id=AAAAAAAAAAAAAAAAAAAAAA\n"
    )
    done = run_headroom(
        "kafka", "start", "--port", str(broker.free_port()), "--state-dir", str(state_dir)
    )
    assert done.returncode == 1
    assert "exited during start-up" in done.stderr
    assert "server.log" in done.stderr  # the tail of the log comes with the error
    assert not (state_dir / "kafka.pid").exists()
    assert done.stdout.strip() == ""  # no address printed for a broker that is not there


def test_start_refuses_a_port_in_use_without_launching_java(state_dir: Path) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        with pytest.raises(broker.BrokerError, match=f"port {port} .* already in use"):
            broker.start(broker.BrokerConfig(state_dir=state_dir, port=port))
    assert not (state_dir / "kafka.pid").exists()


def test_stop_never_signals_a_process_that_is_not_this_broker(state_dir: Path) -> None:
    state_dir.mkdir(parents=True)
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        (state_dir / "kafka.pid").write_text(f"{other.pid}\n")
        result = broker.stop(state_dir)
        assert result.stale_pid_removed
        assert not result.was_running
        time.sleep(0.2)
        assert other.poll() is None  # still alive: never signalled
        assert not (state_dir / "kafka.pid").exists()
        assert broker.status(state_dir).state is broker.BrokerState.STOPPED
    finally:
        os.kill(other.pid, signal.SIGKILL)
        other.wait()
