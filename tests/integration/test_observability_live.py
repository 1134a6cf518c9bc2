"""Every metric the Grafana dashboard and the alert rules name is in a live exposition.

One ``headroom up`` stack (:func:`headroom.workers.up.run_stack`) on a forty-second scenario
(tests/integration/scenarios/observe-short.yaml): controller, three ranking servers, a client and
the feed, each serving ``/metrics``. At 12 s the test writes a message that does not validate to
the capacity topic (every consumer of it dead-letters it); the accelerators are preempted at 25 s
(a release); at 36 s it scrapes every process. Then:

* every ``headroom_*`` sample name of docker/grafana/dashboards/headroom.json and
  docker/prometheus/alerts.yml has at least one sample in those expositions (not only a
  declaration: the panels and rules have data);
* the numbers behind the panels are the run's: the dead letter is counted on the capacity topic,
  the release was observed, the controller's newest tick is recent, the client published value
  for both arms, and the SLO gauge is the scenario's.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

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
POISON_AT, SCRAPE_AT = 12.0, 36.0
METRIC = re.compile(r"\bheadroom_[a-z0-9_]+")
SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)")


@dataclass
class Scraped:
    at: float = 0.0  # wall time of the scrape
    texts: dict[str, str] = field(default_factory=dict)  # process name -> /metrics text

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

    async def scrape(stack: Stack) -> None:
        result.at = time.time()
        for name, url in stack.metrics_endpoints().items():
            result.texts[name] = await asyncio.to_thread(_get, url)

    try:
        run_async(run_stack(config, scenario, actions=[(POISON_AT, poison), (SCRAPE_AT, scrape)]))
        yield result
    finally:
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
