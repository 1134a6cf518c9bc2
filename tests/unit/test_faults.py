"""Fault events: the loader and the schema, the simulator's model of them, the analyzer's
``faults`` section and exactly-once fields, the controller's liveness rule, request de-duplication
and the value signals' counting."""

from __future__ import annotations

import asyncio
import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

from headroom.analysis.metrics import compute_metrics
from headroom.controllers.liveness import Liveness
from headroom.kernel import faults as fault_model
from headroom.kernel.scenario_load import ScenarioError, load_scenario_text
from headroom.kernel.scenario_schema import SCHEMA
from headroom.sim.faults import fault_lines
from headroom.streams import messages
from headroom.workers.client import RecentIds
from headroom.workers.faults import fault_targets, with_resume
from tests.unit.test_scenario_load import MINIMAL, schema_problems

REPO = Path(__file__).resolve().parents[2]
FAULTS_SCENARIO = REPO / "tests" / "integration" / "scenarios" / "faults-short.yaml"

EVERY_KIND = [
    {"at_s": 40, "kind": "kill", "process": "client", "region": "us-east", "restart_after_s": 5},
    {
        "at_s": 60,
        "kind": "kill",
        "process": "server",
        "region": "us-east",
        "pool": "opportunistic",
        "restart_after_s": 3,
    },
    {"at_s": 80, "kind": "pause", "process": "controller", "duration_s": 20},
    {"at_s": 90, "kind": "broker_restart", "down_s": 10},
    {"at_s": 120, "kind": "capacity_silence", "duration_s": 30},
    {"at_s": 130, "kind": "kill", "process": "feed", "restart_after_s": 2},
    {"at_s": 140, "kind": "pause", "process": "precompute", "region": "us-east", "duration_s": 4},
    {"at_s": 150, "kind": "broker_restart", "down_s": 5, "broker": 0},
]


def doc(events: list[dict[str, Any]]) -> dict[str, Any]:
    d = copy.deepcopy(MINIMAL)
    d["events"] = events
    return d


def load(d: dict[str, Any]) -> Any:
    return load_scenario_text(yaml.safe_dump(d))


def problems(d: dict[str, Any]) -> list[str]:
    with pytest.raises(ScenarioError) as info:
        load(d)
    return [str(p) for p in info.value.problems]


def test_every_fault_kind_loads_with_its_fields() -> None:
    sc = load(doc(EVERY_KIND))
    kinds = [e.kind for e in sc.events]
    assert kinds == [e["kind"] for e in EVERY_KIND]
    kill, server, pause, broker, silence = sc.events[:5]
    assert (kill.process, kill.region, kill.restart_after_s, kill.fault_span_s) == (
        "client",
        "us-east",
        5.0,
        5.0,
    )
    assert (server.pool, server.fault_span_s) == ("opportunistic", 3.0)
    assert (pause.process, pause.region, pause.fault_span_s) == ("controller", None, 20.0)
    assert (broker.down_s, broker.broker, broker.fault_span_s) == (10.0, None, 10.0)
    assert sc.events[-1].broker == 0
    assert silence.fault_span_s == 30.0
    assert all(e.is_fault for e in sc.events)
    assert schema_problems(SCHEMA, doc(EVERY_KIND)) == []


@pytest.mark.parametrize(
    ("event", "expected"),
    [
        ({"at_s": 1, "kind": "kill", "process": "client", "region": "us-east"},
         "events[0].restart_after_s: required for a kill event"),
        ({"at_s": 1, "kind": "kill", "process": "client", "restart_after_s": 1},
         "events[0].region: required for a kill of a client"),
        ({"at_s": 1, "kind": "kill", "process": "controller", "region": "us-east",
          "restart_after_s": 1}, "events[0].region: not allowed for a kill of the controller"),
        ({"at_s": 1, "kind": "pause", "process": "server", "region": "us-east", "duration_s": 1},
         "events[0].pool: required for a pause of a server"),
        ({"at_s": 1, "kind": "pause", "process": "client", "region": "us-east", "pool": "dedicated",
          "duration_s": 1}, "events[0].pool: only a server has a pool"),
        ({"at_s": 1, "kind": "pause", "process": "gc", "duration_s": 1},
         "events[0].process: unknown value 'gc'"),
        ({"at_s": 1, "kind": "stall", "process": "client", "duration_s": 1},
         "events[0].process: a stall is of the controller's consumer, not the client"),
        ({"at_s": 1, "kind": "stall", "process": "controller"},
         "events[0].duration_s: required for a stall event"),
        ({"at_s": 1, "kind": "stall", "process": "controller", "duration_s": 1,
          "region": "us-east"}, "events[0].region: not allowed for a stall event"),
        ({"at_s": 1, "kind": "broker_restart", "down_s": 0},
         "events[0].down_s: must be > 0"),
        ({"at_s": 1, "kind": "broker_restart", "down_s": 1, "broker": -1},
         "events[0].broker: must be"),
        ({"at_s": 1, "kind": "capacity_silence", "duration_s": 1, "process": "feed"},
         "events[0].process: not allowed for a capacity_silence event"),
        ({"at_s": 1, "kind": "kill", "process": "client", "region": "nowhere",
          "restart_after_s": 1}, "events[0].region: unknown region 'nowhere'"),
        ({"at_s": 1, "kind": "surge", "region": "us-east", "factor": 10, "duration_s": 5,
          "down_s": 3}, "events[0].down_s: not allowed for a surge event"),
    ],
)  # fmt: skip
def test_bad_fault_fields_are_named(event: dict[str, Any], expected: str) -> None:
    got = problems(doc([event]))
    assert any(p.startswith(expected) for p in got), got
    # the schema refuses what the loader refuses by kind (fields a kind does not take or needs)
    if expected.endswith(" event") and ("not allowed" in expected or "required" in expected):
        assert schema_problems(SCHEMA, doc([event]))


def test_the_shipped_fault_scenario_is_valid_for_the_schema_too() -> None:
    assert schema_problems(SCHEMA, yaml.safe_load(FAULTS_SCENARIO.read_text())) == []


# -- the simulator's model ---------------------------------------------------------------------


def test_the_simulator_models_faults_by_their_effect() -> None:
    sc = load(doc([*EVERY_KIND, {"at_s": 200, "kind": "control_outage", "duration_s": 10}]))
    outages = fault_model.control_outages(sc, "us-east")
    # the controller's pause, both broker restarts and the control outage
    assert sorted(outages) == [(80.0, 100.0), (90.0, 100.0), (150.0, 155.0), (200.0, 210.0)]
    assert fault_model.baseline_only_spans(sc, "us-east") == ((40.0, 45.0),)
    assert fault_model.capacity_silences(sc, "us-east") == ((120.0, 150.0),)
    modelled = [fault_model.modelled(e) for e in sc.events if e.is_fault]
    assert modelled == [True, False, True, True, True, False, False, True]


def test_simulated_fault_lines_recover_at_the_next_control_step() -> None:
    sc = load(doc(EVERY_KIND))
    lines = fault_lines(sc, interval_s=60.0, t0=1000.0, policy="headroom")
    assert [t for t, _ in lines] == sorted(t for t, _ in lines)
    recovered = {line["fault_id"]: line for _t, line in lines if line["kind"] == "fault.recovered"}
    assert len(recovered) == len(EVERY_KIND)
    # the controller paused 80-100 s: the next step is at 120 s
    assert recovered["f2"]["recovery_s"] == pytest.approx(20.0)
    assert recovered["f2"]["healthy"] == "target.issued"
    # the broker down 90-100 s: the same step
    assert recovered["f3"]["recovery_s"] == pytest.approx(20.0)
    assert recovered["f0"]["recovery_s"] == 0.0
    assert recovered["f1"]["modelled"] is False
    injected = [line for _t, line in lines if line["kind"] == "fault.injected"]
    assert [line["ts"] - 1000.0 for line in injected] == [e["at_s"] for e in EVERY_KIND]


# -- the analyzer --------------------------------------------------------------------------------


def _run_lines() -> list[dict[str, Any]]:
    base = {"v": 1, "policy": "headroom", "region": None}
    return [
        {**base, "ts": 0.0, "kind": "run.started", "source": "feed", "scenario": "s", "seed": 1,
         "duration_s": 20.0, "t0": 0.0, "slo": {"p99_ms": 200, "window_s": 10},
         "segments": ["casual"], "regions": ["r"], "levers": ["rma", "sbm"]},
        {**base, "region": "r", "ts": 10.0, "kind": "window", "source": "client", "t_start": 0.0,
         "t_end": 10.0, "requests": 5, "duplicates_dropped": 2},
        {**base, "region": "r", "ts": 20.0, "kind": "window", "source": "client", "t_start": 10.0,
         "t_end": 20.0, "requests": 3, "duplicates_dropped": 1},
        {**base, "ts": 3.0, "kind": "fault.injected", "source": "up", "fault_id": "f0",
         "fault": "kill", "process": "controller", "at_s": 3.0, "span_s": 2.0, "t": 3.0},
        {**base, "ts": 7.5, "kind": "fault.recovered", "source": "up", "fault_id": "f0",
         "fault": "kill", "process": "controller", "at_s": 3.0, "span_s": 2.0, "t": 7.5,
         "end_t": 5.0, "recovered": True, "recovery_s": 2.5, "healthy": "target.issued"},
        {**base, "ts": 8.0, "kind": "fault.injected", "source": "up", "fault_id": "f1",
         "fault": "broker_restart", "process": "broker", "at_s": 8.0, "span_s": 1.0, "t": 8.0},
        {**base, "ts": 19.0, "kind": "fault.recovered", "source": "up", "fault_id": "f1",
         "fault": "broker_restart", "process": "broker", "at_s": 8.0, "span_s": 1.0, "t": 19.0,
         "end_t": 9.0, "recovered": False, "problem": "TimeoutError"},
        {**base, "ts": 12.0, "kind": "process.restarted", "source": "up", "process": "controller",
         "exit_status": 3, "t": 12.0, "restarted": True},
        {**base, "ts": 15.0, "kind": "value.counted", "source": "controller", "counted": 4,
         "unattributed": 0, "producers": {"c.1.a": {"seq": 3, "counted": 4,
                                                   "duplicates_dropped": 0}}},
        {**base, "ts": 19.0, "kind": "value.counted", "source": "controller", "counted": 6,
         "unattributed": 1, "producers": {"c.1.a": {"seq": 5, "counted": 6,
                                                   "duplicates_dropped": 2}}},
        {**base, "ts": 21.0, "kind": "stack.audit", "source": "up",
         "requests": {"fed": 8, "messages": 11}, "value": {"published": 7, "messages": 9}},
        {**base, "ts": 21.0, "kind": "run.finished", "source": "feed", "wall_s": 20.0,
         "sim_s": 20.0},
    ]  # fmt: skip


def test_the_faults_section_and_the_exactly_once_fields() -> None:
    m = compute_metrics(_run_lines())["policies"]["headroom"]
    assert m["requests"]["total"] == 8
    assert m["requests"]["fed"] == 8
    assert m["requests"]["fed_messages"] == 11
    assert m["requests"]["duplicates_dropped"] == 3
    signals = m["value"]["signals"]
    assert signals["published"] == 7
    assert signals["counted"] == 7  # the newest record per producer (6) and one unattributed
    assert signals["duplicates_dropped"] == 2
    f = m["faults"]
    assert (f["injected"], f["recovered"], f["unrecovered"]) == (2, 1, 1)
    assert f["recovery_s_max"] == 2.5
    assert [x["fault_id"] for x in f["list"]] == ["f0", "f1"]
    assert f["list"][0]["healthy"] == "target.issued"
    assert f["list"][1]["recovery_s"] is None
    assert f["list"][1]["problem"] == "TimeoutError"
    assert f["restarts"] == [
        {"process": "controller", "t": 12.0, "exit_status": 3, "restarted": True}
    ]


def test_a_log_without_faults_has_no_new_sections() -> None:
    lines = [
        line
        for line in _run_lines()
        if line["kind"] in ("run.started", "run.finished")
        or (line["kind"] == "window" and line.pop("duplicates_dropped", None) is not None)
    ]
    m = compute_metrics(lines)["policies"]["headroom"]
    assert "faults" not in m
    assert "fed" not in m["requests"]
    assert "duplicates_dropped" not in m["requests"]
    assert "signals" not in m["value"]


# -- liveness --------------------------------------------------------------------------------


def test_liveness_fails_after_three_intervals_without_a_live_step() -> None:
    live = Liveness(interval_s=10.0, frozen_gap_s=5.0)
    assert live.check(0.0) is None  # not armed before the first live step
    live.consumed()
    assert live.step(10.0) is True
    assert live.check(10.0) is None
    t = 10.0
    while t < 40.0:  # checks every second; steps run but the consumer delivers nothing
        t += 1.0
        if t % 10 == 0:
            assert live.step(t) is False
        assert live.check(t) is None, t
    t += 1.0
    reason = live.check(t)
    assert reason is not None
    assert "stalled" in reason


def test_liveness_waits_at_least_its_floor_with_short_intervals() -> None:
    live = Liveness(interval_s=1.0, frozen_gap_s=5.0)
    assert live.limit_s == 30.0
    live.consumed()
    live.step(1.0)
    for t in range(1, 32):
        assert live.check(float(t)) is None, t
    assert live.check(32.0) is not None


def test_liveness_stays_healthy_while_input_flows() -> None:
    live = Liveness(interval_s=10.0, frozen_gap_s=5.0)
    for k in range(1, 20):
        live.consumed(3)
        assert live.step(10.0 * k)
        for s in range(10):
            assert live.check(10.0 * k + s) is None


def test_a_frozen_process_is_not_judged_stalled_when_it_wakes() -> None:
    live = Liveness(interval_s=10.0, frozen_gap_s=5.0)
    live.consumed()
    live.step(10.0)
    assert live.check(11.0) is None
    # SIGSTOP for 60 s: the next check comes late, and starts the deadline again
    assert live.check(71.0) is None
    for t in range(72, 102):
        assert live.check(float(t)) is None, t
    assert live.check(102.0) is not None  # still no input 30 s after waking


# -- exactly once ------------------------------------------------------------------------------


def test_recent_ids_drop_repeats_and_stay_bounded() -> None:
    ids = RecentIds(3)
    assert [ids.add(x) for x in ("a", "b", "a", "c", "d")] == [True, True, False, True, True]
    assert len(ids) == 3
    assert ids.add("a") is True  # forgotten: the oldest went first
    assert ids.add("d") is False


def test_value_signals_carry_producer_and_sequence_only_when_set() -> None:
    base = messages.ValueSignal(
        ts=1.0, region="r", segment="casual", lever="rma", arm="treatment", n=2,
        value_sum=1.0, value_sq_sum=1.0, window_s=1.0,
        cost=messages.Cost(cpu_ms=0.0, accelerator_ms=0.0),
    )  # fmt: skip
    assert b"producer" not in messages.encode(base)
    import msgspec

    tagged = msgspec.structs.replace(base, producer="client-r.12.ab", seq=7)
    back = messages.decode("value", messages.encode(tagged))
    assert isinstance(back, messages.ValueSignal)
    assert (back.producer, back.seq) == ("client-r.12.ab", 7)
    with pytest.raises(messages.ValidationError):
        messages.decode("value", messages.encode(tagged).replace(b'"seq":7', b'"seq":-1'))


def _signal(seq: int | None, producer: str | None) -> messages.ValueSignal:
    """A value signal of one request of region us-east, numbered ``seq`` by ``producer``."""
    return messages.ValueSignal(
        ts=1.0, region="us-east", segment="casual", lever="rma", arm="treatment", n=1,
        value_sum=1.0, value_sq_sum=1.0, window_s=1.0,
        cost=messages.Cost(cpu_ms=0.0, accelerator_ms=0.0), producer=producer, seq=seq,
    )  # fmt: skip


def test_the_controller_counts_each_signal_once_across_a_restart() -> None:
    from headroom.controllers.app import Controller, ControllerSettings
    from headroom.controllers.config import ControlConfig
    from headroom.kernel.codec import dumps

    sc = load(doc([]))
    settings = ControllerSettings(bootstrap="x:1", prefix="t.", scenario=sc)
    ctl = Controller(settings, ControlConfig.from_scenario(sc))

    def sig(seq: int | None, producer: str | None = "p.1.a") -> messages.ValueSignal:
        return _signal(seq, producer)

    assert [ctl.count_value(sig(s), None) for s in (0, 1, 1, 2, 0)] == [
        True, True, False, True, False,
    ]  # fmt: skip
    assert ctl.count_value(sig(None, None), None) is True
    counts = ctl.value_counts()
    assert (counts["counted"], counts["duplicates_dropped"], counts["unattributed"]) == (4, 2, 1)
    # a restarted controller starts from the table's record: re-delivered signals are dropped
    stored = dumps(ctl.value_seen["p.1.a"])
    again = Controller(settings, ControlConfig.from_scenario(sc))
    assert again.count_value(sig(2), stored) is False
    assert again.count_value(sig(3), stored) is True
    assert again.value_counts()["producers"]["p.1.a"] == {
        "seq": 3, "counted": 4, "duplicates_dropped": 3, "value_sum": 4.0, "missing": 0,
    }  # fmt: skip
    # a record written before value sums were kept: [seq, counted, dropped]
    old = Controller(settings, ControlConfig.from_scenario(sc))
    assert old.count_value(sig(3), dumps([2, 3, 0])) is True
    assert old.value_counts()["producers"]["p.1.a"]["value_sum"] == 1.0
    # out of order (a rebalance: buffered records go on while the partition is read again):
    # a seq below the newest is counted once if it was never seen, even across a restart
    late = Controller(settings, ControlConfig.from_scenario(sc))
    got = [late.count_value(sig(s, "p.2.b"), None) for s in (0, 3, 1, 1)]
    assert got == [True, True, True, False]
    stored = dumps(late.value_seen["p.2.b"])
    after = Controller(settings, ControlConfig.from_scenario(sc))
    assert [after.count_value(sig(s, "p.2.b"), stored) for s in (3, 2, 2, 4)] == [
        False, True, False, True,
    ]  # fmt: skip
    assert after.value_counts()["producers"]["p.2.b"]["counted"] == 5  # seqs 0-4, once each


def test_a_released_value_book_resumes_from_the_newer_of_itself_and_the_table() -> None:
    from headroom.controllers.app import Controller, ControllerSettings
    from headroom.controllers.config import ControlConfig
    from headroom.kernel.codec import dumps

    sc = load(doc([]))
    ctl = Controller(ControllerSettings(bootstrap="x:1", prefix="t.", scenario=sc),
                     ControlConfig.from_scenario(sc))  # fmt: skip

    def sig(seq: int) -> messages.ValueSignal:
        return _signal(seq, "p.3.c")

    for seq in range(4):
        ctl.count_value(sig(seq), None)
    trailing = dumps(ctl.value_seen["p.3.c"])  # the table's record, behind what was counted
    for seq in (4, 5):
        ctl.count_value(sig(seq), None)
    ctl.value_partition["p.3.c"] = 1
    # a rebalance gives partition 1 away for a moment: the book is set aside, not dropped; the
    # next signal resumes it, not the trailing record (seqs 4 and 5 are committed: no re-delivery)
    ctl.release(set(), {1})
    assert "p.3.c" not in ctl.value_seen
    assert ctl.count_value(sig(6), trailing) is True
    assert ctl.value_counts()["producers"]["p.3.c"]["counted"] == 7  # seqs 0-6, once each
    # another worker held the partition meanwhile and counted on: its record is the newer
    ctl.value_partition["p.3.c"] = 1
    ctl.release(set(), {1})
    newer = {"p.3.c": dumps([9, 10, 0, 10.0, []])}
    ctl.regain_values({0}, newer)
    assert "p.3.c" not in ctl.value_seen  # partition 1 is not held yet
    ctl.regain_values({0, 1}, newer)
    assert ctl.count_value(sig(9), None) is False
    assert ctl.count_value(sig(10), None) is True
    assert ctl.value_counts()["producers"]["p.3.c"]["counted"] == 11


# -- up's fault runner helpers ---------------------------------------------------------------------


def test_fault_targets_name_the_processes_of_the_stack() -> None:
    sc = load(doc(EVERY_KIND))
    names = ["controller", "feed", "client-us-east", "server-us-east-opportunistic-0",
             "server-us-east-dedicated-0"]  # fmt: skip
    got = [fault_targets(e, names) for e in sc.events]
    assert got == [
        ["client-us-east"], ["server-us-east-opportunistic-0"], ["controller"], [], [], ["feed"],
        [], [],
    ]  # fmt: skip


def test_a_restarted_feed_resumes_once() -> None:
    argv = ["python", "-m", "headroom.cli", "feed", "s.yaml"]
    once = with_resume(argv, 72.0)
    assert once[-2:] == ["--resume-from", "72.0"]
    twice = with_resume(once, 90.0)
    assert twice.count("--resume-from") == 1
    assert twice[-1] == "90.0"


# -- the feed's capacity silence and resume ------------------------------------------------------


class _Sent:
    def __init__(self) -> None:
        self.records: list[tuple[str, bytes]] = []

    async def send(self, topic: str, value: bytes, key: bytes | None = None) -> None:
        self.records.append((topic, value))

    def of(self, suffix: str) -> list[Any]:
        kind = suffix
        return [messages.decode(kind, v) for t, v in self.records if t.endswith(f".{suffix}")]


def _feed(resume_from: float | None = None) -> Any:
    from headroom.streams.kafka import KafkaTarget
    from headroom.workers.feed import FeedConfig, TrafficFeed

    sc = load_scenario_text(FAULTS_SCENARIO.read_text())
    feed = TrafficFeed(
        FeedConfig(t0=1000.0, resume_from=resume_from), sc, KafkaTarget("x:1", "t."),
        clock=lambda: 1000.0,
    )  # fmt: skip
    feed._producer = _Sent()
    return feed


def test_a_silence_holds_capacity_and_sends_the_newest_levels_at_its_end() -> None:
    from headroom.kernel.schedule import CapacityUpdate
    from tests.conftest import run_async

    feed = _feed()
    assert feed.silenced(20.0, "it-east")
    assert not feed.silenced(28.0, "it-east")
    cpu = ("it-east", "cpu", "any", False)
    levels = {cpu: CapacityUpdate(0.0, "it-east", "cpu", "any", False, 2.0, 0.0, "grant", None)}

    async def play() -> None:
        # a reclaim and a refresh inside the silence: nothing is sent
        await feed._capacity(
            CapacityUpdate(22.0, "it-east", "cpu", "any", False, 1.0, 2.0, "reclaim", None)
        )
        levels[cpu] = CapacityUpdate(22.0, "it-east", "cpu", "any", False, 1.0, 2.0, "reclaim",
                                     None)  # fmt: skip
        await feed._capacity(
            CapacityUpdate(24.0, "it-east", "cpu", "any", False, 1.0, 1.0, "update", None)
        )
        assert feed._producer.of("capacity") == []
        await feed._end_silence(28.0, levels)

    run_async(play())
    sent = feed._producer.of("capacity")
    assert len(sent) == 1
    assert (sent[0].units, sent[0].reason) == (1.0, "reclaim")  # the held change, its own reason
    events = feed._producer.of("events")
    assert [e.kind for e in events] == ["capacity.reclaimed", "capacity.silence.ended"]


def test_a_resumed_feed_announces_the_levels_in_force_with_new_ids() -> None:
    from tests.conftest import run_async

    feed = _feed(resume_from=72.0)
    updates = [u for u in feed.schedule.capacity_updates() if u.t < feed.end_t]
    levels: dict[Any, Any] = {}
    nxt = run_async(feed._resume_levels(updates, 75.0, levels))
    assert nxt == sum(1 for u in updates if u.t <= 75.0)
    sent = feed._producer.of("capacity")
    assert sorted((m.resource, m.units, m.reason) for m in sent) == [
        ("accelerator", 2.0, "update"), ("cpu", 2.0, "update"),
    ]  # fmt: skip
    assert all(m.id.startswith("c-1000-r1000-") for m in sent)
    assert feed._producer.of("events") == []  # no second run.started


def test_the_supervisor_restarts_a_process_that_died_and_records_it(tmp_path: Path) -> None:
    import asyncio
    import os
    import sys
    from types import SimpleNamespace

    from headroom.workers.faults import Supervisor
    from headroom.workers.up import Proc
    from tests.conftest import run_async

    async def scenario() -> tuple[list[dict[str, Any]], int]:
        # dies at once the first time, then runs until stopped
        marker = tmp_path / "started-once"
        code = (
            "import pathlib, sys, time\n"
            f"p = pathlib.Path({str(marker)!r})\n"
            "if not p.exists():\n    p.write_text('1'); sys.exit(5)\n"
            "time.sleep(60)\n"
        )
        proc = Proc("client-r", [sys.executable, "-c", code], tmp_path / "c.log", dict(os.environ))

        class FakeStack:
            def __init__(self) -> None:
                self.procs = {"client-r": proc}

            def scenario_time(self) -> float:
                return 12.5

            async def restart(self, name: str) -> Proc:
                await self.procs[name].stop(0.0)
                await self.procs[name].start()
                return self.procs[name]

        await proc.start()
        await proc.wait(10.0)
        sup = Supervisor(FakeStack(), SimpleNamespace(expected_down=set()), period_s=0.05)  # type: ignore[arg-type]
        sup.start()
        for _ in range(200):
            if sup.restarts:
                break
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.3)
        await sup.cancel()
        starts = proc.starts
        await proc.stop(2.0)
        return sup.restarts, starts

    restarts, starts = run_async(scenario())
    assert starts == 2
    assert len(restarts) == 1
    r = restarts[0]
    assert (r["kind"], r["process"], r["exit_status"], r["restarted"], r["t"]) == (
        "process.restarted", "client-r", 5, True, 12.5,
    )  # fmt: skip


def test_a_stall_of_the_controller_is_a_fault_modelled_as_a_control_outage() -> None:
    from headroom.controllers.app import RESUME_SIGNAL, STALL_SIGNAL
    from headroom.workers import faults as up_faults

    d = doc([{"at_s": 30, "kind": "stall", "process": "controller", "duration_s": 40}])
    sc = load(d)
    (stall,) = sc.events
    assert stall.is_fault
    assert stall.fault_span_s == 40.0
    assert schema_problems(SCHEMA, d) == []
    assert fault_model.control_outages(sc, "us-east") == ((30.0, 70.0),)
    assert fault_model.modelled(stall)
    assert up_faults.fault_targets(stall, ["controller", "feed"]) == ["controller"]
    # up signals the seam the controller app listens on
    assert (up_faults.STALL_SIGNAL, up_faults.RESUME_SIGNAL) == (STALL_SIGNAL, RESUME_SIGNAL)
    lines = fault_lines(sc, interval_s=60.0, t0=0.0, policy="headroom")
    recovered = [line for _t, line in lines if line["kind"] == "fault.recovered"]
    assert recovered[0]["healthy"] == "target.issued"
    assert recovered[0]["recovery_s"] == pytest.approx(50.0)  # the step at 120 s


def test_a_table_write_checks_its_source_partitions_from_the_producers_metadata() -> None:
    """Faust's own check reads the consumer's metadata snapshot, which says 0 partitions for a
    changelog topic created after it was taken: every write until the next rebalance crashed the
    value agent. The check is made from the producer's fresh metadata instead, once."""
    from types import SimpleNamespace

    from faust.exceptions import PartitionsMismatch

    from headroom.controllers.app import _changelog_known

    partitions = {"t.value": {0, 1, 2, 3}, "t.value_seen-changelog": {0, 1, 2, 3}, "t.odd": {0}}
    asked: list[str] = []

    async def partitions_for(topic: str) -> set[int]:
        asked.append(topic)
        return partitions[topic]

    producer = SimpleNamespace(partitions_for=partitions_for)
    app = SimpleNamespace(producer=SimpleNamespace(_producer=producer))
    table = SimpleNamespace(
        name="value_seen",
        changelog_topic=SimpleNamespace(get_topic_name=lambda: "t.value_seen-changelog"),
        _verified_source_topics_for_partitions=set(),
    )
    asyncio.run(_changelog_known(app, table, "t.value"))  # type: ignore[arg-type]
    assert table._verified_source_topics_for_partitions == {"t.value"}
    asked.clear()
    asyncio.run(_changelog_known(app, table, "t.value"))  # type: ignore[arg-type]
    assert asked == ["t.value_seen-changelog"]  # checked once per source topic
    with pytest.raises(PartitionsMismatch):
        asyncio.run(_changelog_known(app, table, "t.odd"))  # type: ignore[arg-type]
    assert "t.odd" not in table._verified_source_topics_for_partitions


def test_a_worker_reads_a_value_partition_again_from_its_mark() -> None:
    from headroom.controllers.app import Controller, ControllerSettings
    from headroom.controllers.config import ControlConfig
    from headroom.controllers.read_marks import mark_key
    from headroom.kernel.codec import dumps

    sc = load(doc([]))
    settings = ControllerSettings(bootstrap="x:1", prefix="t.", scenario=sc)
    # a predecessor processed every offset below 243 and died with Faust's commit at 398
    table = {mark_key(1): dumps(243)}
    ctl = Controller(settings, ControlConfig.from_scenario(sc))
    assert ctl.read_mark(1, 398, table) == 243  # read again from there
    assert ctl.read_mark(1, 399, table) is None  # once
    assert ctl.read_marks.low(1) == 243
    # a mark at or past the first offset read: nothing to read again
    again = Controller(settings, ControlConfig.from_scenario(sc))
    assert again.read_mark(1, 243, table) is None
    assert again.read_mark(2, 17, table) is None  # no mark yet: starts where it reads
    assert again.read_marks.low(2) == 17
    # a partition released forgets its mark: it is read from the table when it comes back
    again.release(set(), {1})
    assert not again.read_marks.known(1)


def test_signals_folded_after_the_last_snapshot_are_folded_again_by_the_successor() -> None:
    """A controller killed between folding value signals into its window and its next snapshot
    took those sums with it; its successor adopts the snapshot (the books, and the seqs and the
    read mark they hold), reads the partition again from that mark, and folds each signal the
    snapshot lacks — once — though each was counted already."""
    from headroom.controllers.app import Controller, ControllerSettings, _take_value
    from headroom.controllers.config import ControlConfig
    from headroom.streams.topics import region_partition

    sc = load(doc([]))
    settings = ControllerSettings(bootstrap="x:1", prefix="t.", scenario=sc)
    part = region_partition("us-east", settings.partitions)

    def sig(seq: int) -> messages.ValueSignal:
        return _signal(seq, "p.4.d")

    folded: list[int] = []
    table: dict[str, bytes] = {}
    old = Controller(settings, ControlConfig.from_scenario(sc))
    old.read_marks.start(part, 100)
    for offset in range(5):  # signals 0-4 at offsets 100-104, then the tick's snapshot
        _take_value(old, sig(offset), table, part, 100 + offset)
        old.read_marks.processed(part, 100 + offset)
    old.capture_folds("us-east")
    snapshot = {"regions": {}, "value_folded": old.fold_capture["us-east"]}
    assert snapshot["value_folded"]["mark"] == [part, 105]
    for offset in range(5, 8):  # 5-7 counted and folded; the kill comes before the next tick
        _take_value(old, sig(offset), table, part, 100 + offset)

    new = Controller(settings, ControlConfig.from_scenario(sc))
    new.aggregator.add_value_signal = lambda msg: folded.append(msg.seq)  # type: ignore[method-assign]
    new.adopt("us-east", snapshot)
    assert new.fold_reread == {part: 105}
    for offset in (103, 104, 105, 106, 107, 107):  # read again from below the mark, one twice
        _take_value(new, sig(offset - 100), table, part, offset, quiet=True)
    assert folded == [5, 6, 7]  # each signal the snapshot lacked, once
    assert new.value_counts()["producers"]["p.4.d"]["counted"] == 8  # counted once, by `old`
