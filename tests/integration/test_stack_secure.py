"""The whole stack against a SASL_SSL broker: ``headroom kafka start --security sasl_ssl``, then
``headroom up --kafka-config STATE_DIR/client.properties`` (~80 s).

The broker is this module's own (a temporary state directory, a free port): TLS with the CA and
broker certificate it generated, SCRAM-SHA-512, and ``client.properties`` for its user. Checked:

* a client without credentials is refused — kcat without ``-F``, and headroom without
  ``--kafka-config`` — while kcat with ``-F client.properties`` lists the topics;
* ``up`` runs every process over SASL_SSL and its run holds the baseline SLO;
* the password is in no log line, event or output file of the run, nor in the broker's logs.

kcat reads the file through librdkafka; librdkafka before 2.6.1 sends a SCRAM final message that
Kafka 4 rejects (a client bug fixed upstream in 2.6.1), so when the system's library is older the
test runs kcat on the newer librdkafka the ``confluent-kafka`` wheel ships (a dev dependency).
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import re
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from headroom.streams import broker
from tests.conftest import REPO, start_private_broker

pytestmark = pytest.mark.integration

SCENARIO = Path(__file__).parent / "scenarios" / "secure-short.yaml"
Run = Callable[..., subprocess.CompletedProcess[str]]
SCRAM_FIXED = (2, 6, 1)  # the first librdkafka whose SCRAM final message Kafka 4 accepts


@dataclass
class SecureBroker:
    state_dir: Path
    bootstrap: str
    client_properties: Path

    @property
    def password(self) -> str:
        text = self.client_properties.read_text()
        match = re.search(r"^sasl\.password=(.+)$", text, re.MULTILINE)
        assert match is not None
        return match.group(1).strip()

    def every_password(self) -> list[str]:
        """The client's, the brokers' SCRAM password and the key-store password."""
        stored = json.loads((self.state_dir / "secrets.json").read_text())
        return [self.password, *stored.values()]


@pytest.fixture(scope="module")
def secure_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SecureBroker]:
    cfg, started = start_private_broker(
        tmp_path_factory, "kafka-sasl", security="sasl_ssl", start_timeout_s=180.0
    )
    state_dir = cfg.state_dir
    try:
        yield SecureBroker(state_dir, started.bootstrap, state_dir / "client.properties")
    finally:
        broker.stop(state_dir)


def _librdkafka_version(env: dict[str, str]) -> tuple[int, ...]:
    out = subprocess.run(["kcat", "-V"], capture_output=True, text=True, env=env, check=True)
    match = re.search(r"librdkafka (\d+)\.(\d+)\.(\d+)", out.stdout + out.stderr)
    assert match is not None, out.stdout
    return tuple(int(x) for x in match.groups())


@pytest.fixture(scope="module")
def kcat_env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """The environment to run kcat in: as it is when the system's librdkafka handles SCRAM with
    Kafka 4, else with the wheel's newer librdkafka first on the library path."""
    env = dict(os.environ)
    if _librdkafka_version(env) >= SCRAM_FIXED:
        return env
    files = importlib.metadata.files("confluent-kafka") or []
    libs = [f for f in files if f.name.startswith("librdkafka") and ".so" in f.name]
    assert libs, "confluent-kafka ships no librdkafka (install the dev extras)"
    lib_dir = tmp_path_factory.mktemp("librdkafka")
    (lib_dir / "librdkafka.so.1").symlink_to(Path(str(libs[0].locate())).resolve())
    env["LD_LIBRARY_PATH"] = f"{lib_dir}:{env.get('LD_LIBRARY_PATH', '')}".rstrip(":")
    version = _librdkafka_version(env)
    assert version >= SCRAM_FIXED, version
    return env


def test_a_client_without_credentials_is_refused(
    secure_broker: SecureBroker, kcat_env: dict[str, str], run_headroom: Run
) -> None:
    plain = subprocess.run(
        ["kcat", "-b", secure_broker.bootstrap, "-L", "-m", "5"],
        capture_output=True, text=True, timeout=60, env=kcat_env, check=False,
    )  # fmt: skip
    assert plain.returncode != 0
    assert "Metadata for" not in plain.stdout
    headroom = run_headroom(
        "topics", "create", "--bootstrap", secure_broker.bootstrap, "--prefix", "refused.",
        env={"HEADROOM_KAFKA_CONFIG": ""}, timeout=120,
    )  # fmt: skip
    assert headroom.returncode == 1, headroom.stderr[-2000:]
    assert "cannot reach Kafka" in headroom.stderr


def test_kcat_with_the_client_properties_lists_the_cluster(
    secure_broker: SecureBroker, kcat_env: dict[str, str], run_headroom: Run
) -> None:
    # the environment variable is the flag's default
    created = run_headroom(
        "topics", "create", "--bootstrap", secure_broker.bootstrap, "--prefix", "listed.",
        env={"HEADROOM_KAFKA_CONFIG": str(secure_broker.client_properties)},
    )  # fmt: skip
    assert created.returncode == 0, created.stderr[-2000:]
    listed = subprocess.run(
        ["kcat", "-F", str(secure_broker.client_properties), "-L", "-m", "30"],
        capture_output=True, text=True, timeout=90, env=kcat_env, check=False,
    )  # fmt: skip
    assert listed.returncode == 0, listed.stderr[-2000:]
    assert 'topic "listed.capacity"' in listed.stdout
    assert secure_broker.password not in created.stderr + created.stdout


@pytest.fixture(scope="module")
def secure_run(
    secure_broker: SecureBroker, tmp_path_factory: pytest.TempPathFactory
) -> tuple[subprocess.CompletedProcess[str], Path]:
    out_dir = tmp_path_factory.mktemp("up-sasl")
    env = {**os.environ, "HEADROOM_LOG_FORMAT": "json"}
    env.pop("HEADROOM_KAFKA_CONFIG", None)
    done = subprocess.run(
        [sys.executable, "-m", "headroom.cli", "up", str(SCENARIO), "--out", str(out_dir),
         "--bootstrap", secure_broker.bootstrap, "--prefix", "secure.",
         "--kafka-config", str(secure_broker.client_properties), "--no-plots"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=400, check=False,
    )  # fmt: skip
    return done, out_dir


def test_up_runs_the_whole_stack_over_sasl_ssl(
    secure_run: tuple[subprocess.CompletedProcess[str], Path],
) -> None:
    done, out_dir = secure_run
    assert done.returncode == 0, done.stderr[-3000:]
    metrics = json.loads((out_dir / "metrics.json").read_text())["policies"]["headroom"]
    assert metrics["slo"]["windows"] >= 5
    # the baseline SLO is held (the scenario's dedicated CPU runs at ~45%)
    assert metrics["slo"]["violation_fraction"] == 0.0, metrics["slo"]
    assert metrics["complete"] is True, metrics.get("completeness")
    events = [json.loads(line) for line in (out_dir / "events.jsonl").open()]
    kinds = {e["kind"] for e in events}
    assert {"run.started", "run.finished", "target.issued", "window"} <= kinds
    started = [
        json.loads(line)
        for line in (out_dir / "logs" / "controller.log").open()
        if '"controller.started"' in line
    ]
    assert started
    assert started[0]["security_protocol"] == "SASL_SSL"
    assert started[0]["sasl_mechanism"] == "SCRAM-SHA-512"


def test_no_password_in_any_log_event_or_output_file(
    secure_broker: SecureBroker, secure_run: tuple[subprocess.CompletedProcess[str], Path]
) -> None:
    done, out_dir = secure_run
    files = [p for p in out_dir.rglob("*") if p.is_file()]
    files += [p for p in (secure_broker.state_dir / "logs").rglob("*") if p.is_file()]
    assert any(p.name == "events.jsonl" for p in files)
    assert sum(1 for p in files if p.suffix == ".log") >= 6  # every process's log
    for secret in secure_broker.every_password():
        assert len(secret) >= 16
        assert secret not in done.stdout + done.stderr
        leaked = [p for p in files if secret.encode() in p.read_bytes()]
        assert not leaked, f"a password is in {leaked}"
