"""The Grafana dashboard, the Prometheus alert rules and scrape configs, checked without a running
Prometheus or Grafana: the files parse, the dashboard has the panels an operator needs, every
metric a panel or a rule names is declared by the workers' exposition (the live check is
tests/integration/test_observability_live.py), and Prometheus' own ``promtool`` accepts the rules,
runs their unit tests (docker/prometheus/alerts_test.yml) and accepts both scrape configs.

``promtool`` comes with Debian's prometheus package (``make promtool``, part of ``make test``).
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client import generate_latest

from headroom.workers.metrics import make_metrics, watch_controller
from headroom.workers.precompute import PrecomputeMetrics

REPO = Path(__file__).parents[2]
DOCKER = REPO / "docker"
PROMETHEUS = DOCKER / "prometheus"
DASHBOARD = DOCKER / "grafana" / "dashboards" / "headroom.json"
ALERTS = PROMETHEUS / "alerts.yml"

# the alerts an operator of headroom needs (one per concern)
ALERT_NAMES = {
    "HeadroomTargetsExpired",
    "HeadroomDeadLettersRising",
    "HeadroomReleaseP99Over50ms",
    "HeadroomBaselineP99OverSLO",
    "HeadroomControllerStoppedTicking",
    "HeadroomControllerDown",
}
# what the dashboard must show: a panel whose title holds each of these
PANELS = (
    "Targets against capacity",
    "shed and released",
    "Release latency",
    "p99 latency against the SLO",
    "Value by lever",
    "Holdout estimate",
    "Dead letters",
    "Consumer lag",
    "Controller ticks",
)
METRIC = re.compile(r"\bheadroom_[a-z0-9_]+")
SUFFIXES = ("_bucket", "_count", "_sum", "_total", "_created")


def _promtool() -> str:
    path = shutil.which("promtool")
    assert path, "promtool is missing: `make promtool` installs Debian's prometheus package"
    return path


def _promtool_run(*args: str, cwd: Path | None = None) -> str:
    done = subprocess.run(
        [_promtool(), *args], capture_output=True, text=True, timeout=60, cwd=cwd, check=False
    )
    out = done.stdout + done.stderr
    assert done.returncode == 0, out
    return out


@pytest.fixture(scope="module")
def dashboard() -> dict[str, Any]:
    doc = json.loads(DASHBOARD.read_text())
    assert isinstance(doc, dict)
    return doc


@pytest.fixture(scope="module")
def rules() -> list[dict[str, Any]]:
    doc = yaml.safe_load(ALERTS.read_text())
    return [rule for group in doc["groups"] for rule in group["rules"]]


def dashboard_exprs(dashboard: dict[str, Any]) -> list[str]:
    exprs = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]
    for var in dashboard["templating"]["list"]:
        exprs.append(var["definition"])
    return exprs


def declared_families() -> set[str]:
    """Every metric family a worker process of any kind declares (names as exposed)."""
    metrics = make_metrics()
    PrecomputeMetrics.make(metrics.registry)

    class _Plane:
        regions: tuple[str, ...] = ()

    class _Controller:
        plane = _Plane()
        deadlettered = 0

    watch_controller(_Controller(), 60.0, metrics)
    text = generate_latest(metrics.registry).decode()
    names = (line.split()[2] for line in text.splitlines() if line.startswith("# TYPE "))
    return {family(n) for n in names}


def family(name: str) -> str:
    """The family a sample name belongs to (``x_bucket`` → ``x``, ``x_total`` → ``x``)."""
    for suffix in SUFFIXES:
        if name.endswith(suffix):
            return name.removesuffix(suffix)
    return name


def test_the_dashboard_has_a_panel_for_each_concern(dashboard: dict[str, Any]) -> None:
    assert dashboard["uid"] == "headroom"
    titles = [p["title"] for p in dashboard["panels"]]
    for wanted in PANELS:
        assert any(wanted.lower() in t.lower() for t in titles), (wanted, titles)
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    for p in dashboard["panels"]:
        assert p["targets"], p["title"]
        refs = [t["refId"] for t in p["targets"]]
        assert len(refs) == len(set(refs)), p["title"]
        g = p["gridPos"]
        assert g["x"] >= 0, p["title"]
        assert g["x"] + g["w"] <= 24, p["title"]


def test_the_dashboard_uses_the_provisioned_data_source(dashboard: dict[str, Any]) -> None:
    sources = yaml.safe_load(
        (DOCKER / "grafana" / "provisioning" / "datasources" / "prometheus.yml").read_text()
    )["datasources"]
    uids = {s["uid"] for s in sources if s["type"] == "prometheus"}
    assert len(uids) == 1
    for p in dashboard["panels"]:
        assert p["datasource"]["uid"] in uids, p["title"]
        for t in p["targets"]:
            assert t["datasource"]["uid"] in uids, p["title"]
    provider = yaml.safe_load(
        (DOCKER / "grafana" / "provisioning" / "dashboards" / "headroom.yml").read_text()
    )["providers"][0]
    compose = yaml.safe_load((DOCKER / "compose.yaml").read_text())
    mounts = compose["services"]["grafana"]["volumes"]
    # the provider's folder is where compose mounts the dashboards
    assert f"./grafana/dashboards:{provider['options']['path']}:ro" in mounts


def test_every_dashboard_query_is_valid_promql(dashboard: dict[str, Any], tmp_path: Path) -> None:
    # promtool parses the expressions of recording rules: the panels' queries as such rules,
    # with Grafana's variables given the values Grafana would substitute
    exprs = [
        e.replace("$__rate_interval", "1m").replace("$region", ".*")
        for e in dashboard_exprs(dashboard)
        if not e.startswith("label_values(")  # a Grafana function, not PromQL
    ]
    assert not [e for e in exprs if "$" in e]
    group = {
        "name": "dashboard",
        "rules": [{"record": f"dashboard:query{i}", "expr": e} for i, e in enumerate(exprs)],
    }
    path = tmp_path / "dashboard_rules.yml"
    path.write_text(yaml.safe_dump({"groups": [group]}))
    out = _promtool_run("check", "rules", str(path))
    assert f"SUCCESS: {len(exprs)} rules found" in out
    # and a broken query is caught the same way
    group["rules"] = [{"record": "dashboard:bad", "expr": "sum by (region (rate(x[1m]))"}]
    path.write_text(yaml.safe_dump({"groups": [group]}))
    done = subprocess.run(
        [_promtool(), "check", "rules", str(path)], capture_output=True, timeout=60, check=False
    )
    assert done.returncode != 0


def test_every_alert_the_operators_need_is_there(rules: list[dict[str, Any]]) -> None:
    assert {r["alert"] for r in rules} == ALERT_NAMES
    for r in rules:
        assert r["labels"]["severity"] in {"warning", "critical"}
        assert r["annotations"]["summary"]
        assert r["annotations"]["description"]


def test_every_metric_named_by_a_panel_or_a_rule_is_declared_by_the_workers(
    dashboard: dict[str, Any], rules: list[dict[str, Any]]
) -> None:
    declared = declared_families()
    named = set()
    for expr in [*dashboard_exprs(dashboard), *(r["expr"] for r in rules)]:
        named |= set(METRIC.findall(expr))
    assert len(named) >= 12
    missing = {n for n in named if family(n) not in declared}
    assert not missing, f"not in the exposition: {sorted(missing)}"


def test_a_rule_naming_an_undeclared_metric_would_be_caught() -> None:
    declared = declared_families()
    assert family("headroom_release_latency_seconds_bucket") in declared
    assert family("headroom_released_total") in declared
    assert family("headroom_releases_total") not in declared  # a typo is not declared


def test_the_alert_rules_pass_promtool_and_their_unit_tests() -> None:
    out = _promtool_run("check", "rules", str(ALERTS))
    assert f"SUCCESS: {len(ALERT_NAMES)} rules found" in out
    out = _promtool_run("test", "rules", "alerts_test.yml", cwd=PROMETHEUS)
    assert "SUCCESS" in out
    tests = yaml.safe_load((PROMETHEUS / "alerts_test.yml").read_text())["tests"]
    tested = {a["alertname"] for t in tests for a in t["alert_rule_test"] if a["exp_alerts"]}
    assert tested == ALERT_NAMES  # every alert is shown to fire on a case of its own


def test_the_rule_unit_tests_fail_on_a_wrong_threshold(tmp_path: Path) -> None:
    # the unit tests are not vacuous: a release threshold of 200 ms no longer fires on 100 ms
    broken = ALERTS.read_text().replace("> 0.05", "> 0.2")
    assert broken != ALERTS.read_text()
    (tmp_path / "alerts.yml").write_text(broken)
    shutil.copy(PROMETHEUS / "alerts_test.yml", tmp_path / "alerts_test.yml")
    done = subprocess.run(
        [_promtool(), "test", "rules", "alerts_test.yml"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
        check=False,
    )
    assert done.returncode != 0
    assert "HeadroomReleaseP99Over50ms" in done.stdout + done.stderr


@pytest.mark.parametrize(
    "config", [PROMETHEUS / "prometheus.yml", REPO / "deploy" / "prometheus.yml"], ids=str
)
def test_the_scrape_configs_pass_promtool(config: Path, tmp_path: Path) -> None:
    # each config loads alerts.yml from beside itself (docker: mounted there; deploy: copied)
    shutil.copy(config, tmp_path / "prometheus.yml")
    shutil.copy(ALERTS, tmp_path / "alerts.yml")
    out = _promtool_run("check", "config", str(tmp_path / "prometheus.yml"))
    assert "SUCCESS: 1 rule files found" in out
    doc = yaml.safe_load(config.read_text())
    components = set()
    for job in doc["scrape_configs"]:
        for static in job.get("static_configs", []):
            components.add(static["labels"]["component"])
        for relabel in job.get("relabel_configs", []):
            if relabel.get("target_label") == "component" and "replacement" in relabel:
                components.add(relabel["replacement"])
    # the rules and panels select on component="client" and "controller"
    assert {"controller", "server", "client"} <= components


def test_compose_scrapes_every_headroom_worker_on_its_metrics_port() -> None:
    compose = yaml.safe_load((DOCKER / "compose.yaml").read_text())
    services = compose["services"]
    doc = yaml.safe_load((PROMETHEUS / "prometheus.yml").read_text())
    targets = {
        t for job in doc["scrape_configs"] for s in job["static_configs"] for t in s["targets"]
    }
    workers = {
        name
        for name, svc in services.items()
        if svc.get("image", "").startswith("headroom") and "--metrics-port" in svc["command"]
    }
    assert workers
    assert targets == {f"{name}:9100" for name in workers}
    for name in workers:
        argv = services[name]["command"]
        assert argv[argv.index("--metrics-port") + 1] == "9100"
    # reachable from the Prometheus container, not only on the worker's loopback
    assert services["controller"]["environment"]["HEADROOM_METRICS_HOST"] == "0.0.0.0"
    prom = services["prometheus"]
    assert "./prometheus/alerts.yml:/etc/prometheus/alerts.yml:ro" in prom["volumes"]
