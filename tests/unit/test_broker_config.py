"""The pure parts of the broker library: ids, properties, command lines, config validation, pom."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from headroom.kernel.errors import ConfigError
from headroom.streams import broker


def test_cluster_id_is_22_url_safe_characters() -> None:
    for _ in range(200):
        cid = broker.new_cluster_id()
        assert re.fullmatch(r"[A-Za-z0-9_-]{22}", cid)
        assert not cid.startswith("-")


def test_cluster_id_is_redrawn_when_it_would_start_with_a_dash() -> None:
    draws = iter([b"\xf8" + b"\0" * 15, b"\x00" * 16])  # 0xf8 → first base64 char '-'
    cid = broker.new_cluster_id(lambda n: next(draws))
    assert cid == "AAAAAAAAAAAAAAAAAAAAAA"


def _props(text: str) -> dict[str, str]:
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            key, _, value = line.partition("=")
            out[key] = value
    return out


def test_server_properties_describe_one_combined_kraft_node_on_loopback(tmp_path: Path) -> None:
    props = _props(
        broker.render_server_properties(
            port=19092, controller_port=19093, data_dir=tmp_path, overrides={}
        )
    )
    assert props["process.roles"] == "broker,controller"
    assert props["controller.quorum.voters"] == "1@127.0.0.1:19093"
    assert props["listeners"] == "PLAINTEXT://127.0.0.1:19092,CONTROLLER://127.0.0.1:19093"
    assert props["advertised.listeners"] == "PLAINTEXT://127.0.0.1:19092"
    assert props["log.dirs"] == str(tmp_path)
    # KAFKA.md's fast-test and single-node settings.
    for key, value in {
        "group.initial.rebalance.delay.ms": "0",
        "group.min.session.timeout.ms": "1000",
        "offsets.topic.replication.factor": "1",
        "offsets.topic.num.partitions": "1",
        "transaction.state.log.replication.factor": "1",
        "transaction.state.log.min.isr": "1",
        "transaction.state.log.num.partitions": "1",
        "auto.create.topics.enable": "false",
    }.items():
        assert props[key] == value, key


def test_overrides_win_over_the_defaults(tmp_path: Path) -> None:
    props = _props(
        broker.render_server_properties(
            port=1, controller_port=2, data_dir=tmp_path, overrides={"num.io.threads": "8"}
        )
    )
    assert props["num.io.threads"] == "8"


def test_the_jvm_command_carries_the_state_dir_marker_that_stop_checks(tmp_path: Path) -> None:
    paths = broker.BrokerPaths(tmp_path)
    argv = broker.java_command(
        "/usr/bin/java", tmp_path / "libs", paths, 512, broker.MAIN_CLASS, ["server.properties"]
    )
    assert argv[0] == "/usr/bin/java"
    assert "-Xmx512m" in argv
    assert f"-Dlog4j2.configurationFile={broker.LOG4J2_PATH}" in argv
    assert argv[-2:] == [broker.MAIN_CLASS, "server.properties"]
    assert broker.is_broker_cmdline(argv, tmp_path)
    assert not broker.is_broker_cmdline(argv, tmp_path / "other")
    assert not broker.is_broker_cmdline(["sleep", "60"], tmp_path)


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"port": 0}, "--port"),
        ({"port": 70000}, "--port"),
        ({"controller_port": 19092}, "--controller-port"),
        ({"heap_mb": 64}, "heap_mb"),
        ({"start_timeout_s": 0}, "--timeout"),
        ({"overrides": {"a=b": "c"}}, "overrides"),
    ],
)
def test_config_problems_name_the_field(
    kwargs: dict[str, object], field: str, tmp_path: Path
) -> None:
    with pytest.raises(ConfigError) as caught:
        broker.BrokerConfig(state_dir=tmp_path, **kwargs)  # type: ignore[arg-type]
    assert caught.value.problems[0].startswith(field)


def test_the_pom_pins_kafka_4_1_with_the_slf4j_1_binding() -> None:
    assert broker.kafka_version().startswith("4.1.")
    ns = {"m": "http://maven.apache.org/POM/4.0.0"}
    root = ET.parse(broker.POM_PATH).getroot()
    artifacts = {a.text for a in root.findall("m:dependencies/m:dependency/m:artifactId", ns)}
    # Kafka 4.1.1 pulls slf4j-api 1.7.36: its binding is log4j-slf4j-impl; the slf4j2 one would
    # be ignored and leave the broker's log empty.
    assert "log4j-slf4j-impl" in artifacts
    assert "log4j-slf4j2-impl" not in artifacts
    assert {"kafka_2.13", "log4j-api", "log4j-core", "log4j-1.2-api"} <= artifacts


def test_libs_are_stale_when_the_pom_changes(tmp_path: Path) -> None:
    pom = tmp_path / "pom.xml"
    pom.write_text("<project/>")
    libs = tmp_path / "libs"
    libs.mkdir()
    (libs / "kafka_2.13-4.1.1.jar").write_bytes(b"")
    assert not broker.libs_ready(libs, pom)  # no stamp yet
    (libs / broker.LIBS_STAMP).write_text(broker.pom_digest(pom))
    assert broker.libs_ready(libs, pom)
    pom.write_text("<project><!-- changed --></project>")
    assert not broker.libs_ready(libs, pom)


def test_status_of_an_empty_state_dir_is_stopped(tmp_path: Path) -> None:
    assert broker.status(tmp_path).state is broker.BrokerState.STOPPED


def test_jars_go_to_the_user_cache_when_the_package_is_not_writable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setattr(broker.os, "access", lambda path, mode: False)
    assert (
        broker.default_libs_dir("4.1.1") == tmp_path / "cache" / "headroom" / "kafka-4.1.1" / "libs"
    )
    monkeypatch.setattr(broker.os, "access", lambda path, mode: True)
    assert broker.default_libs_dir("4.1.1") == broker.BROKER_DIR / "libs"


def test_a_node_to_restart_must_exist_and_run(tmp_path: Path) -> None:
    """``broker_restart``'s node: 0-based, within the cluster ``broker.json`` records, and
    running (a pid file of a live broker process of that node) — else a BrokerError naming it."""
    import json

    paths = broker.BrokerPaths(tmp_path)
    paths.info_file.write_text(
        json.dumps({"nodes": [{"node_id": k, "port": 9000 + k} for k in (1, 2, 3)]})
    )
    with pytest.raises(broker.BrokerError, match=r"broker 3: .* has 3 node\(s\)"):
        broker.node_restart(tmp_path, 3, 60.0)
    with pytest.raises(broker.BrokerError, match=r"broker 1: node 2 .* is not running"):
        broker.node_restart(tmp_path, 1, 60.0)
