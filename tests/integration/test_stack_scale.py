"""The stack scaled out: ``headroom up --controllers 2 --clients-per-region 3``.

One run (module fixture) of scenarios/scale-short.yaml (two regions, 40 s) on the shared broker
under its own topic prefix, with one dedicated replica per region to keep the process count
down (2 controllers, 4 servers, 6 clients, the feed). Promised:

* the stack runs the processes the flags ask for, under their names, each with its metrics;
* every client of a region serves a share of the region's requests (the request key's shard
  spreads a region over the partitions its clients split), and the requests the clients served
  add up to what was fed, region by region, none twice;
* the value signals of a region's three clients add up exactly: what the controllers counted per
  client equals what the client published, and the region's totals (signals, ``n``,
  ``value_sum``) equal the sums of each client's;
* both regions got targets, each step from one controller only.
"""

from __future__ import annotations

import math
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from headroom.analysis.events import read_events
from headroom.commands.up import UpResult, run_up
from headroom.kernel.scenario_load import load_scenario
from headroom.streams.kafka import KafkaTarget, delete_topics
from headroom.streams.topics import topics
from headroom.workers.up import StackConfig, client_name
from tests.conftest import run_async

pytestmark = pytest.mark.integration

SCENARIO = Path(__file__).parent / "scenarios" / "scale-short.yaml"
REGIONS = ("us-east", "eu-west")
CLIENTS = 3


@dataclass
class ScaleRun:
    result: UpResult
    events: list[dict[str, Any]]

    @property
    def audit(self) -> dict[str, Any]:
        return dict(self.result.stack.audit or {})

    def kinds(self, kind: str, source: str | None = None) -> list[dict[str, Any]]:
        return [
            e
            for e in self.events
            if e["kind"] == kind and (source is None or e["source"] == source)
        ]


@pytest.fixture(scope="module")
def scale_run(kafka_bootstrap: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ScaleRun]:
    prefix = f"t{uuid.uuid4().hex[:12]}."
    kafka = KafkaTarget(kafka_bootstrap, prefix)
    out_dir = tmp_path_factory.mktemp("stack-scale")
    config = StackConfig(
        scenario_path=SCENARIO,
        out_dir=out_dir,
        kafka=kafka,
        dedicated_replicas=1,
        controllers=2,
        clients_per_region=CLIENTS,
        startup_margin_s=45.0,  # 13 processes start on a two-core machine
    )
    try:
        result = run_async(run_up(config, load_scenario(SCENARIO)))
        yield ScaleRun(result, read_events(result.events_path))
    finally:
        run_async(delete_topics(kafka_bootstrap, [t.name for t in topics(prefix)]))


def test_the_stack_runs_the_processes_the_flags_ask_for(scale_run: ScaleRun) -> None:
    procs = scale_run.result.stack.procs
    assert {"controller", "controller-1"} <= set(procs)
    assert not any(n.startswith("controller-2") for n in procs)
    for region in REGIONS:
        names = {client_name(region, i) for i in range(CLIENTS)}
        assert names == {"client-" + region, f"client-{region}-1", f"client-{region}-2"}
        assert names <= set(procs)
        assert client_name(region, CLIENTS) not in procs
    endpoints = scale_run.result.stack.metrics_endpoints()
    assert {"controller", "controller-1", *(client_name(r, 2) for r in REGIONS)} <= set(endpoints)
    assert len(set(endpoints.values())) == len(endpoints)  # each its own port


def _producers(run: ScaleRun, region: str) -> dict[str, dict[str, Any]]:
    got = run.audit["value"]["producers"]
    return {p: rec for p, rec in got.items() if rec["region"] == region}


def test_each_client_serves_a_share_and_the_requests_add_up(scale_run: ScaleRun) -> None:
    fed = scale_run.audit["requests"]["regions"]
    windows = scale_run.kinds("window", "client")
    for region in REGIONS:
        served: dict[str, int] = {}
        for w in windows:
            if w["region"] == region:
                served[w["client"]] = served.get(w["client"], 0) + int(w["requests"])
        assert len(served) == CLIENTS, served
        assert all(n > 0 for n in served.values()), served
        assert sum(served.values()) == fed[region], (region, served, fed)
    assert scale_run.audit["requests"]["fed"] == sum(fed[r] for r in REGIONS)
    assert scale_run.result.metrics["policies"]["headroom"]["requests"]["duplicates_dropped"] == 0


def test_the_value_signals_of_a_regions_clients_add_up_exactly(scale_run: ScaleRun) -> None:
    counted: dict[str, int] = {}  # newest count per producer, over every controller's events
    counted_value: dict[str, float] = {}  # and the value it counted with that count
    for e in scale_run.kinds("value.counted", "controller"):
        for producer, rec in e["producers"].items():
            if int(rec["counted"]) >= counted.get(producer, 0):
                counted[producer] = int(rec["counted"])
                counted_value[producer] = float(rec["value_sum"])
    for region in REGIONS:
        producers = _producers(scale_run, region)
        assert len(producers) == CLIENTS, producers  # one per client process, none restarted
        assert all(rec["published"] > 0 for rec in producers.values()), producers
        for producer, rec in producers.items():
            assert counted.get(producer) == rec["published"], (producer, rec, counted)
        region_counted = sum(counted[p] for p in producers)
        assert region_counted == sum(rec["published"] for rec in producers.values())
        # the region's value in the controllers' books is the sum of what each client published
        # (read back from the topic)
        n = sum(rec["n"] for rec in producers.values())
        total = sum(rec["value_sum"] for rec in producers.values())
        assert n > 0
        assert math.isfinite(total)
        assert total > 0.0
        for producer, rec in producers.items():
            assert math.isclose(counted_value[producer], rec["value_sum"], rel_tol=1e-9), (
                producer,
                counted_value[producer],
                rec["value_sum"],
            )
        region_value = sum(counted_value[p] for p in producers)
        assert math.isclose(region_value, total, rel_tol=1e-9), (region, region_value, total)
    signals = scale_run.result.metrics["policies"]["headroom"]["value"]["signals"]
    assert signals["counted"] == signals["published"], signals
    assert signals["duplicates_dropped"] == 0


def test_both_regions_get_targets_each_step_from_one_controller(scale_run: ScaleRun) -> None:
    issued = scale_run.kinds("target.issued", "controller")
    for region in REGIONS:
        epochs = sorted(int(e["epoch"]) for e in issued if e["region"] == region)
        assert len(epochs) >= 2, (region, epochs)
        assert len(epochs) == len(set(epochs)), (region, epochs)  # no step issued twice
