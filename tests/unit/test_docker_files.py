"""docker/: no Docker engine runs here, so check what can be checked without one — the compose
file parses, names every service of the stack, uses the official Kafka image in KRaft mode, and
every headroom command it runs is accepted by ``headroom``'s own parser (so a renamed flag breaks
this test, not a user's deployment); the Dockerfile builds the package and runs ``headroom``."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml

from headroom.cli import build_parser

DOCKER = Path(__file__).parents[2] / "docker"
SERVICES = {
    "kafka",
    "topics",
    "controller",
    "server-dedicated-0",
    "server-dedicated-1",
    "server-opportunistic",
    "client",
    "feed",
    "prometheus",
    "grafana",
}


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    doc = yaml.safe_load((DOCKER / "compose.yaml").read_text())
    assert isinstance(doc, dict)
    return doc


def headroom_services(compose: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {
        name: svc
        for name, svc in compose["services"].items()
        if svc.get("image", "").startswith("headroom")
    }


def test_the_compose_file_names_every_service(compose: dict[str, Any]) -> None:
    assert set(compose["services"]) == SERVICES


def test_kafka_runs_in_kraft_mode_from_the_official_image(compose: dict[str, Any]) -> None:
    kafka = compose["services"]["kafka"]
    assert kafka["image"].startswith("apache/kafka:")
    env = kafka["environment"]
    assert env["KAFKA_PROCESS_ROLES"] == "broker,controller"
    assert env["KAFKA_CONTROLLER_QUORUM_VOTERS"] == "1@kafka:9093"
    assert "healthcheck" in kafka
    assert "ZOOKEEPER" not in " ".join(env)


@pytest.mark.parametrize("name", sorted(SERVICES - {"kafka", "prometheus", "grafana"}))
def test_every_command_is_accepted_by_headroom(compose: dict[str, Any], name: str) -> None:
    svc = headroom_services(compose)[name]
    argv = svc["command"]
    assert all(isinstance(a, str) for a in argv)
    args = build_parser().parse_args(argv)  # SystemExit(2) on an unknown command or flag
    assert args._handler  # a command that dispatches somewhere
    if "--bootstrap" in argv:
        assert args.bootstrap == "kafka:9092"


def test_services_share_t0_and_the_client_reaches_every_server(compose: dict[str, Any]) -> None:
    services = headroom_services(compose)
    for svc in services.values():
        assert "HEADROOM_T0" in svc["environment"]
    client = build_parser().parse_args(services["client"]["command"])
    hosts = {s.partition("=")[2].split(":")[0] for s in client.server}
    assert hosts == {"server-dedicated-0", "server-dedicated-1", "server-opportunistic"}
    for name in hosts:
        server = build_parser().parse_args(services[name]["command"])
        assert server.region == client.region
        assert (server.host, server.port) == ("0.0.0.0", 7001)
    dedicated = [
        build_parser().parse_args(services[h]["command"]) for h in hosts if "dedicated" in h
    ]
    assert sum(s.share for s in dedicated) == pytest.approx(1.0)


def test_the_dockerfile_installs_the_package_and_runs_headroom() -> None:
    text = (DOCKER / "Dockerfile").read_text()
    assert text.startswith("#")
    assert "FROM python:3.11" in text
    assert 'ENTRYPOINT ["headroom"]' in text
    pyproject = tomllib.loads((DOCKER.parent / "pyproject.toml").read_text())
    folders = set(pyproject["tool"]["setuptools"]["package-dir"].values())
    assert "kernel" in folders
    for package in sorted(folders):  # every folder the package is built from
        assert f"COPY {package} ./{package}" in text
    ignore = (DOCKER / "Dockerfile.dockerignore").read_text().split()
    assert "headroom/broker/libs" in ignore
