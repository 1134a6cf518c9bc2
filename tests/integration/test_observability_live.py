"""Every metric the Grafana dashboard and the alert rules name is in a live exposition, and a
real Prometheus evaluates the dashboard's queries and the alert rules on it.

One ``headroom up`` stack (:func:`headroom.workers.up.run_stack`) on a forty-second scenario
(tests/integration/scenarios/observe-short.yaml): controller, three ranking servers, a client and
the feed, each serving ``/metrics``. A Prometheus (Debian's, the one ``make promtool`` installs)
scrapes them every second with docker/prometheus/alerts.yml loaded; its targets carry the
``component`` label as the shipped scrape configs give it. At 12 s the test writes a message that
does not validate to the capacity topic (every consumer of it dead-letters it); the accelerators
are preempted at 25 s (a release); at 36 s it scrapes every process and queries Prometheus. Then:

* every ``headroom_*`` sample name of docker/grafana/dashboards/headroom.json and
  docker/prometheus/alerts.yml has at least one sample in those expositions (not only a
  declaration: the panels and rules have data);
* the numbers behind the panels are the run's: the dead letter is counted on the capacity topic,
  the release was observed, the controller's newest tick is recent, the client published value
  for both arms, and the SLO gauge is the scenario's;
* every panel's queries, run by Prometheus, return series, and the dead-letter alert fires while
  the alerts on expired targets and on the controller stay quiet (not even pending). (Alerts on
  latency are not judged here: a loaded two-core host decides those, not the code.)
"""

from __future__ import annotations

import asyncio
import json
import re
import shutil
import socket
import subprocess
import time
import urllib.parse
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from headroom.kernel.scenario_load import load_scenario
from headroom.streams.kafka import KafkaTarget, delete_topics, make_producer
from headroom.streams.topics import topics
from headroom.workers.up import Stack, StackConfig, run_stack
from tests.conftest import REPO, run_async

pytestmark = pytest.mark.integration

SCENARIO = Path(__file__).parent / "scenarios" / "observe-short.yaml"
REGION = "it-east"
TARGETS_AT, POISON_AT, SCRAPE_AT = 1.0, 12.0, 36.0
METRIC = re.compile(r"\bheadroom_[a-z0-9_]+")
SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)")


@dataclass
class Scraped:
    at: float = 0.0  # wall time of the scrape
    texts: dict[str, str] = field(default_factory=dict)  # process name -> /metrics text
    # Prometheus at the same time: (panel title, query) -> number of series; the alerts
    queries: dict[tuple[str, str], int] = field(default_factory=dict)
    alerts: list[dict[str, str]] = field(default_factory=list)

    def samples(self, name: str) -> list[tuple[str, str, float]]:
        """``(process, labels, value)`` of every sample called ``name``."""
        out = []
        for proc, text in self.texts.items():
            for line in text.splitlines():
                m = SAMPLE.match(line)
                if m and m.group(1) == name:
                    out.append((proc, m.group(2) or "", float(m.group(3))))
        return out

    def names(self) -> set[str]:
        found = set()
        for text in self.texts.values():
            for line in text.splitlines():
                m = SAMPLE.match(line)
                if m:
                    found.add(m.group(1))
        return found


def _get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as response:  # loopback, our own endpoint
        return str(response.read().decode())


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _dashboard() -> dict[str, Any]:
    doc = json.loads((REPO / "docker/grafana/dashboards/headroom.json").read_text())
    assert isinstance(doc, dict)
    return doc


class Prometheus:
    """A Prometheus on loopback scraping the targets written to its file_sd file, every second,
    with the alert rules of docker/prometheus/alerts.yml."""

    def __init__(self, workdir: Path) -> None:
        binary = shutil.which("prometheus")
        assert binary, "prometheus is missing: `make promtool` installs Debian's package"
        self.dir = workdir
        self.port = _free_port()
        self.targets = workdir / "targets.json"
        self.targets.write_text("[]")
        shutil.copy(REPO / "docker/prometheus/alerts.yml", workdir / "alerts.yml")
        config = {
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "rule_files": ["alerts.yml"],
            "scrape_configs": [
                {
                    "job_name": "headroom",
                    "file_sd_configs": [{"files": [str(self.targets)], "refresh_interval": "1s"}],
                }
            ],
        }
        (workdir / "prometheus.yml").write_text(yaml.safe_dump(config))
        self.log = (workdir / "prometheus.log").open("w")
        self.proc = subprocess.Popen(
            [
                binary,
                f"--config.file={workdir / 'prometheus.yml'}",
                f"--storage.tsdb.path={workdir / 'data'}",
                f"--web.listen-address=127.0.0.1:{self.port}",
            ],
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + 60.0
        while True:
            try:
                _get(f"http://127.0.0.1:{self.port}/-/ready")
                break
            except OSError:
                assert self.proc.poll() is None, (workdir / "prometheus.log").read_text()
                assert time.monotonic() < deadline, "prometheus did not get ready in 60 s"
                time.sleep(0.2)

    def scrape(self, endpoints: dict[str, str]) -> None:
        """Scrape these ``/metrics`` URLs, each labelled with its component (the process name's
        first word: controller, server, client, precompute)."""
        groups = [
            {
                "targets": [urllib.parse.urlsplit(url).netloc],
                "labels": {"component": name.split("-")[0], "process": name},
            }
            for name, url in endpoints.items()
        ]
        tmp = self.targets.with_suffix(".tmp")
        tmp.write_text(json.dumps(groups))
        tmp.replace(self.targets)

    def query(self, expr: str) -> list[dict[str, Any]]:
        q = urllib.parse.urlencode({"query": expr})
        body = json.loads(_get(f"http://127.0.0.1:{self.port}/api/v1/query?{q}"))
        assert body["status"] == "success", body
        result = body["data"]["result"]
        assert isinstance(result, list)
        return result

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=20)
        self.log.close()


@pytest.fixture(scope="module")
def scraped(kafka_bootstrap: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Scraped]:
    prefix = f"t{uuid.uuid4().hex[:12]}."
    kafka = KafkaTarget(kafka_bootstrap, prefix)
    scenario = load_scenario(SCENARIO)
    config = StackConfig(
        scenario_path=SCENARIO,
        out_dir=tmp_path_factory.mktemp("observe"),
        kafka=kafka,
        dedicated_replicas=2,
        startup_margin_s=15.0,
    )
    result = Scraped()

    async def poison(_stack: Stack) -> None:
        producer = make_producer(kafka_bootstrap)
        await producer.start()
        try:
            await producer.send_and_wait(kafka.topic("capacity"), b"{not json", key=REGION.encode())
        finally:
            await producer.stop()

    prometheus = Prometheus(tmp_path_factory.mktemp("prometheus"))

    async def targets(stack: Stack) -> None:
        prometheus.scrape(stack.metrics_endpoints())

    async def scrape(stack: Stack) -> None:
        result.at = time.time()
        for name, url in stack.metrics_endpoints().items():
            result.texts[name] = await asyncio.to_thread(_get, url)
        for panel in _dashboard()["panels"]:
            for target in panel["targets"]:
                expr = target["expr"].replace("$__rate_interval", "1m").replace("$region", ".*")
                series = await asyncio.to_thread(prometheus.query, expr)
                result.queries[(panel["title"], target["expr"])] = len(series)
        alerts = await asyncio.to_thread(prometheus.query, "ALERTS")
        result.alerts = [a["metric"] for a in alerts]

    actions = [(TARGETS_AT, targets), (POISON_AT, poison), (SCRAPE_AT, scrape)]
    try:
        run_async(run_stack(config, scenario, actions=actions))
        yield result
    finally:
        prometheus.stop()
        run_async(delete_topics(kafka_bootstrap, [t.name for t in topics(prefix)]))


def _named() -> set[str]:
    dashboard = json.loads((REPO / "docker/grafana/dashboards/headroom.json").read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    exprs += [v["definition"] for v in dashboard["templating"]["list"]]
    alerts = yaml.safe_load((REPO / "docker/prometheus/alerts.yml").read_text())
    exprs += [r["expr"] for g in alerts["groups"] for r in g["rules"]]
    return {n for e in exprs for n in METRIC.findall(e)}


def test_every_process_was_scraped(scraped: Scraped) -> None:
    names = set(scraped.texts)
    assert {"controller", f"client-{REGION}"} <= names
    assert len([n for n in names if n.startswith("server-")]) >= 3


def test_every_metric_of_the_dashboard_and_the_rules_has_live_samples(scraped: Scraped) -> None:
    named = _named()
    assert len(named) >= 12
    live = scraped.names()
    missing = sorted(named - live)
    assert not missing, f"no live sample of {missing}"


def test_the_live_numbers_are_the_runs(scraped: Scraped) -> None:
    dead = scraped.samples("headroom_messages_deadlettered_total")
    # the one bad capacity message, dead-lettered by every server that consumes the topic
    on_capacity = [v for p, labels, v in dead if p.startswith("server-") and "capacity" in labels]
    assert on_capacity, dead
    assert all(v == 1.0 for v in on_capacity), dead
    # the controller counts it too (over all its inputs)
    assert [v for p, _l, v in dead if p == "controller"] == [1.0], dead

    releases = scraped.samples("headroom_release_latency_seconds_count")
    assert sum(v for _p, _l, v in releases) >= 1, releases

    ticks = scraped.samples("headroom_controller_last_tick_timestamp_seconds")
    assert [labels for _p, labels, _v in ticks] == [f'{{region="{REGION}"}}']
    interval = scraped.samples("headroom_controller_interval_seconds")[0][2]
    assert scraped.at - ticks[0][2] <= 3 * interval

    value = scraped.samples("headroom_value_requests_total")
    arms = {labels for _p, labels, v in value if v > 0}
    assert any('arm="treatment"' in a for a in arms), value
    assert any('arm="control"' in a for a in arms), value

    slo = scraped.samples("headroom_slo_p99_seconds")
    assert slo
    assert {v for _p, _l, v in slo} == {0.25}

    expired = scraped.samples("headroom_target_expired")
    assert [v for _p, _l, v in expired] == [0.0]  # targets flow: none expired

    lag = scraped.samples("headroom_consumer_lag_messages")
    assert lag
    assert all(v >= 0 for _p, _l, v in lag)


def test_prometheus_runs_every_panel_query_on_the_live_stack(scraped: Scraped) -> None:
    assert scraped.queries
    empty = sorted(key for key, n in scraped.queries.items() if n == 0)
    # shedding: nothing in this light run needs it, so its rate has no series (the panel's
    # released-work query, on the same panel, has them); every other query has data
    assert all("headroom_shed_total" in expr for _title, expr in empty), empty
    panels = {title for title, _expr in scraped.queries}
    for title in panels:
        assert any(n for (t, _e), n in scraped.queries.items() if t == title), title


def test_the_dead_letter_alert_fires_and_the_control_alerts_stay_quiet(scraped: Scraped) -> None:
    firing = [a for a in scraped.alerts if a["alertstate"] == "firing"]
    dead = [a for a in firing if a["alertname"] == "HeadroomDeadLettersRising"]
    assert dead, scraped.alerts
    # the servers count it on the capacity topic, the controller over all its inputs ("any")
    topics_ = {a["topic"] for a in dead}
    assert any(t.endswith("capacity") for t in topics_), dead
    assert all(t.endswith("capacity") or t == "any" for t in topics_), dead
    quiet = {
        "HeadroomTargetsExpired",
        "HeadroomControllerStoppedTicking",
        "HeadroomControllerDown",
    }
    assert not [a for a in scraped.alerts if a["alertname"] in quiet], scraped.alerts
