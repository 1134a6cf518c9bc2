"""The precompute lever end to end on a real broker: ``headroom up`` with a precompute worker.

One run of tests/integration/scenarios/precompute-short.yaml (returning users, drift, remote
accelerators; 450 scenario seconds at 15× real time) through :func:`headroom.commands.up.run_up`,
the code behind ``headroom up``, which starts a precompute worker for the region because the
scenario enables precompute. Then, from the compacted ``precompute`` topic, the ``value`` topic
and the collected event log: results were stored, the client served some of them before their
expiry and none after it, no job ran once every strong-capable pool was reclaimed, the results
left unrefreshed by that expired and were tombstoned, and the value signals under lever
``precompute`` add up with the look-ups the client's window lines report.

Expiry has to have a cause: with capacity to spare the worker refreshes every live result after
``refresh_after`` (0.15) of its lifetime, so none would ever expire. The scenario reclaims every
gpu-b device at :data:`RECLAIM_S` (its comment says why that is the test's choice).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from headroom.analysis.events import read_events
from headroom.commands.up import UpResult, run_up
from headroom.kernel.scenario_load import load_scenario
from headroom.streams import messages
from headroom.streams.kafka import KafkaTarget, delete_topics
from headroom.streams.topics import topics
from headroom.workers.precompute_lookup import parse_precompute_key
from headroom.workers.up import StackConfig
from tests.conftest import run_async
from tests.integration.topic_reads import read_topic

pytestmark = pytest.mark.integration

SCENARIO = Path(__file__).parent / "scenarios" / "precompute-short.yaml"
REGION = "it-pre"
SPEED = 15.0
WORKER = f"precompute-{REGION}"


def _strong_pools_gone_at() -> float:
    """Scenario time from which no opportunistic accelerator the strong model can use has a
    unit left (the last step of those traces, which must end at 0)."""
    scenario = load_scenario(SCENARIO)
    region = next(r for r in scenario.regions if r.name == REGION)
    pools = [
        p
        for p in region.opportunistic
        if p.resource == "accelerator" and p.hardware in scenario.models.strong.hardware
    ]
    assert pools
    assert all(p.trace and p.trace[-1][1] == 0.0 for p in pools), pools
    return max(p.trace[-1][0] for p in pools)


RECLAIM_S = _strong_pools_gone_at()


@dataclass(frozen=True)
class Record:
    key: tuple[str, int]
    ts: float  # broker timestamp of the record (wall seconds)
    result: messages.Precompute | None  # None: a tombstone


@dataclass
class PrecomputeRun:
    result: UpResult
    events: list[dict[str, Any]]
    records: list[Record]
    value_signals: list[messages.ValueSignal]

    def windows(self, source: str) -> list[dict[str, Any]]:
        return [e for e in self.events if e["kind"] == "window" and e["source"] == source]


@pytest.fixture(scope="module")
def run(kafka_bootstrap: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[PrecomputeRun]:
    prefix = f"t{uuid.uuid4().hex[:12]}."
    kafka = KafkaTarget(kafka_bootstrap, prefix)
    out_dir = tmp_path_factory.mktemp("stack-precompute")
    scenario = load_scenario(SCENARIO)
    config = StackConfig(
        scenario_path=SCENARIO, out_dir=out_dir, kafka=kafka, speed=SPEED, dedicated_replicas=1
    )

    async def go() -> tuple[UpResult, list[Record], list[messages.ValueSignal]]:
        result = await run_up(config, scenario)
        records = []
        for r in await read_topic(kafka, "precompute"):
            key = parse_precompute_key(r.key)
            assert key is not None, r.key
            body = None if r.value is None else messages.decode("precompute", r.value)
            assert body is None or isinstance(body, messages.Precompute)
            records.append(Record(key, r.timestamp / 1000.0, body))
        signals = []
        for r in await read_topic(kafka, "value"):
            signal = messages.decode("value", r.value)
            assert isinstance(signal, messages.ValueSignal)
            signals.append(signal)
        return result, records, signals

    try:
        result, records, signals = run_async(go())
        yield PrecomputeRun(result, read_events(result.events_path), records, signals)
    finally:
        run_async(delete_topics(kafka_bootstrap, [t.name for t in topics(prefix)]))


def test_up_ran_a_precompute_worker_that_stored_results(run: PrecomputeRun) -> None:
    worker = run.result.stack.procs[WORKER]
    assert worker.returncode() == 0, worker.log_path.read_text()[-2000:]  # drained on SIGTERM
    results = [r for r in run.records if r.result is not None]
    assert results, "no result on the precompute topic"
    assert all(r.key == (REGION, r.result.user) for r in results if r.result is not None)
    jobs = sum(w.get("precompute", {}).get("jobs", 0) for w in run.windows("precompute"))
    assert jobs >= len({r.key for r in results})  # every user's result came from a job


def test_results_are_served_before_their_expiry_and_never_after(run: PrecomputeRun) -> None:
    pre = [w["precompute"] for w in run.windows("client") if "precompute" in w]
    assert pre, "the client's window lines carry no precompute field"
    hits = sum(p["hits"] for p in pre)
    assert hits > 0
    # the least life any served result had left, per window: never negative
    remaining = [p["remaining_s_min"] for p in pre if "remaining_s_min" in p]
    assert remaining
    assert min(remaining) >= 0.0
    lifetimes = [
        (r.result.expires_at - r.result.ts) * SPEED for r in run.records if r.result is not None
    ]
    staleness = [s for p in pre for s in p["staleness_s"]]
    assert staleness
    assert max(staleness) <= max(lifetimes) + 1e-6  # no result served older than it may live
    assert sum(p["visits"] for p in pre) >= hits + sum(p["held_out"] for p in pre)


def test_no_job_completes_once_the_strong_capable_pools_are_reclaimed(run: PrecomputeRun) -> None:
    windows = run.windows("precompute")
    before = [w for w in windows if w["t_end"] <= RECLAIM_S]
    after = [w for w in windows if w["t_start"] > RECLAIM_S]  # the window of the reclaim: skipped
    assert before
    assert after
    assert sum(w["precompute"]["jobs"] for w in before) > 0
    assert [w["precompute"]["jobs"] for w in after] == [0] * len(after)


def test_expired_results_are_tombstoned(run: PrecomputeRun) -> None:
    tombstones = [r for r in run.records if r.result is None]
    assert tombstones, "no tombstone on the precompute topic"
    last: dict[tuple[str, int], Record] = {}
    for r in run.records:
        if r.result is None:
            before = last.get(r.key)
            # a tombstone deletes a result that had expired by then (the worker's clock)
            assert before is not None, r.key
            assert before.result is not None, r.key
            assert before.result.expires_at <= r.ts + 0.5
        last[r.key] = r
    # every result that expired well before the worker stopped ends with its tombstone
    horizon = max(r.ts for r in run.records) - 2.0
    overdue = [
        r.key for r in last.values() if r.result is not None and r.result.expires_at < horizon
    ]
    assert not overdue, f"expired results left without a tombstone: {overdue[:5]}"
    expired = sum(
        e.get("expired", 0) for e in run.events if e["kind"] == "precompute.result.expired"
    )
    assert expired == len(tombstones)


def test_the_value_signals_of_lever_precompute_add_up(run: PrecomputeRun) -> None:
    windows = run.windows("client")
    pre = [w["precompute"] for w in windows if "precompute" in w]
    hits = sum(p["hits"] for p in pre)
    held_out = sum(p["held_out"] for p in pre)
    signals = [s for s in run.value_signals if s.lever == "precompute" and s.region == REGION]
    treatment = sum(s.n for s in signals if s.arm == "treatment")
    control = sum(s.n for s in signals if s.arm == "control")
    assert treatment == hits
    assert control > 0
    errors = sum(w.get("errors", 0) for w in windows)
    # treatment n + control n = visits that found a result (a failed live call is not a signal)
    if errors == 0:
        assert treatment + control == hits + held_out
    else:
        assert hits + held_out - errors <= treatment + control <= hits + held_out
    arms = sum(
        a["precompute"]["n"]
        for w in windows
        for a in w.get("arms", {}).values()
        if "precompute" in a
    )
    assert arms == hits
    inc = sum(w["inc"]["precompute"] for w in windows if "inc" in w)
    metrics = run.result.metrics["policies"]["headroom"]
    assert metrics["value"]["incremental_precompute"] == pytest.approx(inc)
    section = metrics["precompute"]
    assert section["hits"] == hits
    assert 0.0 < section["hit_rate"] <= 1.0
    assert section["used"] <= section["jobs"]
