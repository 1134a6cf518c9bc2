"""``--kafka-config``: client properties parsed into the settings every Kafka client uses, and the
pure pieces of the secured, replicated local cluster (no broker, no JVM)."""

from __future__ import annotations

import argparse
import ssl
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from headroom.kernel.errors import ConfigError
from headroom.streams import broker, security
from headroom.streams.kafka import KafkaTarget
from headroom.streams.topics import default_replication, min_insync_replicas

PASSWORD = "s3cr3t-Pa55word-0123456789"


def _props(text: str) -> dict[str, str]:
    return {
        k: v
        for k, _, v in (
            line.partition("=") for line in text.splitlines() if line and not line.startswith("#")
        )
    }


@pytest.fixture
def ca(tmp_path: Path) -> Path:
    path = tmp_path / "ca.pem"
    path.write_text("not read by the parser\n")
    return path


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "client.properties"
    path.write_text(text)
    return path


def test_a_kcat_style_file_becomes_sasl_ssl_settings(tmp_path: Path, ca: Path) -> None:
    path = _write(
        tmp_path,
        "# comment\n! another\n\nbootstrap.servers=ignored:9092\n"
        "security.protocol=sasl_ssl\nsasl.mechanisms = SCRAM-SHA-512\n"
        f"sasl.username=headroom\nsasl.password={PASSWORD}\nssl.ca.location={ca}\n",
    )
    cfg = security.load(path)
    assert cfg.protocol == "SASL_SSL"
    assert cfg.mechanism == "SCRAM-SHA-512"
    assert cfg.username == "headroom"
    assert cfg.password is not None
    assert cfg.password.reveal() == PASSWORD
    assert cfg.ca_location == ca
    assert cfg.source == path.resolve()
    assert cfg.check_hostname
    assert security.ignored_keys(path) == ["bootstrap.servers"]


def test_the_password_shows_nowhere_but_in_the_kafka_client_kwargs(
    tmp_path: Path, ca: Path
) -> None:
    path = _write(
        tmp_path,
        "security.protocol=SASL_PLAINTEXT\nsasl.mechanism=SCRAM-SHA-256\n"
        f"sasl.username=u\nsasl.password={PASSWORD}\n",
    )
    cfg = security.load(path)
    for text in (str(cfg), repr(cfg), str(cfg.describe()), str(cfg.password), repr(cfg.password)):
        assert PASSWORD not in text
    kwargs = cfg.aiokafka_kwargs()
    assert kwargs == {
        "security_protocol": "SASL_PLAINTEXT",
        "sasl_mechanism": "SCRAM-SHA-256",
        "sasl_plain_username": "u",
        "sasl_plain_password": PASSWORD,
    }


def test_a_java_jaas_line_gives_the_user_and_password(tmp_path: Path) -> None:
    path = _write(
        tmp_path,
        "security.protocol=SASL_PLAINTEXT\nsasl.mechanism=PLAIN\n"
        "sasl.jaas.config=org.apache.kafka.common.security.plain.PlainLoginModule required "
        f'username="alice" password="{PASSWORD}";\n',
    )
    cfg = security.load(path)
    assert cfg.username == "alice"
    assert cfg.password is not None
    assert cfg.password.reveal() == PASSWORD


def test_problems_name_the_key_and_never_the_password(tmp_path: Path) -> None:
    path = _write(
        tmp_path,
        "security.protocol=SASL_SSL\nsasl.mechanism=SCRAM-SHA-1\n"
        f"sasl.password={PASSWORD}\nssl.ca.location=/nonexistent/ca.pem\n"
        "ssl.endpoint.identification.algorithm=maybe\n",
    )
    with pytest.raises(ConfigError) as caught:
        security.load(path)
    text = str(caught.value)
    for key in (
        "sasl.mechanism",
        "sasl.username",
        "ssl.ca.location",
        "ssl.endpoint.identification.algorithm",
    ):
        assert key in text
    assert PASSWORD not in text
    with pytest.raises(ConfigError, match=r"security\.protocol"):
        security.from_properties({"security.protocol": "KERBEROS"})
    with pytest.raises(ConfigError, match=r"(?i)no such file"):
        security.load(tmp_path / "missing.properties")


def test_plaintext_is_the_default_and_adds_no_client_settings() -> None:
    assert security.from_properties({}) == security.PLAINTEXT
    assert security.PLAINTEXT.aiokafka_kwargs() == {"security_protocol": "PLAINTEXT"}


def test_an_ssl_file_builds_a_verifying_context(tmp_path: Path) -> None:
    cfg = security.from_properties(
        {"security.protocol": "SSL", "ssl.endpoint.identification.algorithm": "none"}
    )
    context = cfg.aiokafka_kwargs()["ssl_context"]
    assert isinstance(context, ssl.SSLContext)
    assert context.verify_mode == ssl.CERT_REQUIRED
    assert not context.check_hostname


@given(st.dictionaries(st.sampled_from(["a.b", "x", "sasl.username", "k.v_w"]), st.text()))
def test_properties_round_trip(entries: dict[str, str]) -> None:
    values = {k: " ".join(v.split()) for k, v in entries.items()}
    values = {k: v for k, v in values.items() if not v.endswith("\\")}
    text = "".join(f"{k}={v}\n" for k, v in values.items())
    assert security.parse_properties(text) == values


def test_resolution_order_flag_env_local_broker(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    flag = _write(tmp_path, "security.protocol=SSL\n")
    env = tmp_path / "env.properties"
    env.write_text("security.protocol=SASL_PLAINTEXT\nsasl.username=u\nsasl.password=p\n")
    local = tmp_path / "state"
    local.mkdir()
    (local / "client.properties").write_text(
        "security.protocol=SASL_SSL\nsasl.username=u\nsasl.password=p\n"
    )
    monkeypatch.setenv(security.ENV_VAR, str(env))
    assert security.resolve(str(flag), local).protocol == "SSL"
    assert security.resolve(None, local).protocol == "SASL_PLAINTEXT"
    monkeypatch.delenv(security.ENV_VAR)
    assert security.resolve(None, local).protocol == "SASL_SSL"
    assert security.resolve(None, None) is security.PLAINTEXT


def test_kafka_target_installs_the_settings_for_the_process(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = _write(tmp_path, "security.protocol=SSL\n")
    monkeypatch.delenv(security.ENV_VAR, raising=False)
    args = argparse.Namespace(bootstrap="127.0.0.1:1", prefix="p.", kafka_config=str(path))
    try:
        target = KafkaTarget.from_args(args)
        assert target.security.protocol == "SSL"
        assert security.current() is target.security
    finally:
        security.install(security.PLAINTEXT)


def test_replication_defaults() -> None:
    assert [default_replication(n) for n in (1, 2, 3, 5)] == [1, 2, 3, 3]
    assert [min_insync_replicas(r) for r in (1, 2, 3)] == [1, 2, 2]


def test_server_properties_of_a_secured_three_node_cluster(tmp_path: Path) -> None:
    tls = broker.TlsSettings(
        keystore=tmp_path / "k.p12",
        truststore=tmp_path / "t.p12",
        store_password=security.Secret("store-pw"),
        broker_password=security.Secret("broker-pw"),
    )
    nodes = [
        broker.NodeSpec(1, 9001, 9002),
        broker.NodeSpec(2, 9003, 9004),
        broker.NodeSpec(3, 9005, 9006),
        broker.NodeSpec(4, 9007, None),
    ]
    voters = broker.quorum_voters(nodes)
    assert voters == "1@127.0.0.1:9002,2@127.0.0.1:9004,3@127.0.0.1:9006"
    assert broker.cluster_bootstrap(nodes).split(",")[3] == "127.0.0.1:9007"
    props = _props(
        broker.render_server_properties(
            port=9007,
            controller_port=None,
            data_dir=tmp_path,
            overrides={},
            node_id=4,
            voters=voters,
            brokers=4,
            tls=tls,
        )
    )
    assert props["process.roles"] == "broker"
    assert props["node.id"] == "4"
    assert props["listeners"] == "SASL_SSL://127.0.0.1:9007"
    assert props["inter.broker.listener.name"] == "SASL_SSL"
    assert props["sasl.enabled.mechanisms"] == "SCRAM-SHA-512"
    assert props["offsets.topic.replication.factor"] == "3"
    assert props["min.insync.replicas"] == "2"
    assert 'password="broker-pw"' in props["listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config"]


def test_client_properties_are_what_the_parser_reads(tmp_path: Path, ca: Path) -> None:
    text = broker.render_client_properties("127.0.0.1:1", security.Secret(PASSWORD), ca)
    cfg = security.load(_write(tmp_path, text))
    assert (cfg.protocol, cfg.mechanism, cfg.username) == ("SASL_SSL", "SCRAM-SHA-512", "headroom")
    assert broker.scrub(f"oops {PASSWORD}!", [security.Secret(PASSWORD)]) == "oops ***!"


def test_cluster_options_are_checked(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="--brokers"):
        broker.BrokerConfig(state_dir=tmp_path, brokers=0)
    with pytest.raises(ConfigError, match="--security"):
        broker.BrokerConfig(state_dir=tmp_path, security="tls")
    with pytest.raises(ConfigError, match="--controller-port"):
        broker.BrokerConfig(state_dir=tmp_path, brokers=3, controller_port=9000)


def test_a_one_node_state_directory_is_not_turned_into_a_cluster(tmp_path: Path) -> None:
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "meta.properties").write_text("node.id=1\n")
    for kwargs in ({"brokers": 3}, {"security": "sasl_ssl"}):
        cfg = broker.BrokerConfig(state_dir=tmp_path, port=broker.free_port(), **kwargs)  # type: ignore[arg-type]
        with pytest.raises(broker.BrokerError, match="state directory of its own"):
            broker.start(cfg)
    assert not (tmp_path / "kafka.pid").exists()
