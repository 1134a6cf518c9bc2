"""The client's pure parts: target TTL fallback, what it hands the one client plan (the plan
itself: test_plan.py), windows and value signals, and the offsets it may commit."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, cast

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from headroom.analysis.events import (
    WindowTraffic,
    base_sketch,
    pack_sketch,
    unpack_sketch,
    window_event,
)
from headroom.defences.plan import VALUE_BINS, PlanRule
from headroom.kernel.errors import ConfigError
from headroom.streams import messages
from headroom.workers.client import (
    ClientConfig,
    ServerAddress,
    TargetBook,
    TargetState,
    in_flight_limit,
)
from headroom.workers.client_windows import Outcome, WindowBook
from headroom.workers.offsets import OffsetTracker

BASE = 100


def _target(
    epoch: int, ts: float, *, candidates: int = 250, ttl: float = 10.0, region: str = "r"
) -> messages.Target:
    return messages.Target(
        ts=ts,
        region=region,
        epoch=epoch,
        ttl_s=ttl,
        rma=messages.RmaTarget(candidates=candidates, base=BASE, max=300),
        sbm=messages.SbmTarget(coverage=0.3, segments={"casual": 0.4, "premium": 0.1}),
        budget=messages.Budget(cpu=1.0, accelerator=1.0),
        reason="pid",
    )


# -- targets --------------------------------------------------------------------------------------


def test_the_highest_epoch_wins_and_older_ones_are_ignored() -> None:
    book = TargetBook("r", BASE)
    assert book.offer(_target(5, 100.0, candidates=200))
    assert not book.offer(_target(4, 101.0, candidates=280))  # reordered: older epoch
    assert not book.offer(_target(5, 102.0, candidates=280))  # re-delivered
    assert book.state(101.0).rma_candidates == 200
    assert book.offer(_target(6, 103.0, candidates=150))
    assert book.state(103.0).epoch == 6


def test_an_expired_target_falls_back_to_the_baseline_and_says_so_once() -> None:
    book = TargetBook("r", BASE)
    book.offer(_target(1, 100.0, ttl=10.0))
    assert book.transitions(101.0) == [("target.applied", 1)]
    assert book.transitions(105.0) == []
    live = book.state(110.0)  # at ts + ttl exactly: still valid
    assert not live.expired
    assert live.rma_candidates == 250
    gone = book.state(110.5)
    assert gone.expired
    assert gone.rma_candidates == BASE
    assert gone.sbm_coverage == 0.0
    assert gone.sbm_segments == {}
    assert book.transitions(110.5) == [("target.expired", 1)]
    assert book.transitions(120.0) == []
    book.offer(_target(2, 130.0))
    assert book.transitions(130.0) == [("target.applied", 2)]


def test_no_target_means_the_baseline_and_another_region_is_ignored() -> None:
    book = TargetBook("r", BASE)
    assert book.state(0.0) == TargetState(None, BASE, 0.0, {}, False)
    other = _target(9, 0.0, region="x")
    assert not book.offer(other)


@given(st.integers(-1000, 10_000), st.integers(BASE, 5000))
def test_candidates_in_force_stay_within_base_and_max(candidates: int, top: int) -> None:
    book = TargetBook("r", BASE)
    t = _target(1, 0.0)
    book.offer(
        messages.Target(
            ts=0.0,
            region="r",
            epoch=1,
            ttl_s=10.0,
            rma=messages.RmaTarget(candidates=max(0, candidates), base=BASE, max=top),
            sbm=t.sbm,
            budget=t.budget,
            reason="x",
        )
    )
    c = book.state(1.0).rma_candidates
    assert BASE <= c <= top


# -- the plan (headroom.defences.plan, tested in test_plan.py): what the client gives it ----------


def _client(**config: object) -> Any:
    from pathlib import Path

    from headroom.kernel.scenario_load import load_scenario
    from headroom.streams.kafka import KafkaTarget
    from headroom.workers.client import RankingClient

    scenario = load_scenario(
        Path(__file__).parents[1] / "integration" / "scenarios" / "stack-short.yaml"
    )
    args: dict[str, Any] = {
        "region": "it-east",
        "servers": (ServerAddress("dedicated", "127.0.0.1", 9),),  # never connected
        "group": "g",
        "t0": 1_800_000_000.0,
        "precompute": False,
    }
    clock = cast("Callable[[], float]", config.pop("clock", lambda: 1.8e9))
    args.update(config)
    return RankingClient(
        ClientConfig(**args), scenario, KafkaTarget("127.0.0.1:1", "t."), clock=clock
    )


def test_the_client_plans_with_the_scenarios_world_and_its_own_flags() -> None:
    client = _client(value_ranked_rma=False, seed=5)
    w = client.scenario.world
    assert client.planner.rule == PlanRule(
        holdout=w.holdout,
        base=w.base_candidates,
        max=w.max_candidates,
        value_ranked_rma=False,
        value_ranked_sbm=True,
        bins=VALUE_BINS,
    )
    assert client.planner.rng.random() == np.random.default_rng(5).random()


async def test_every_request_is_planned_once_in_its_arm() -> None:
    """Through serve_request: the holdout share is the control arm (no lever, no intent-to-treat
    group), every other request is in RMA's group here (no strong replica is configured, so none
    is routed), and each is binned by its value rank within its segment."""
    client = _client()
    holdout = client.scenario.world.holdout
    client.targets.offer(
        messages.Target(
            ts=1.8e9, region="it-east", epoch=1, ttl_s=60.0,
            rma=messages.RmaTarget(candidates=BASE + 50, base=BASE, max=300),
            sbm=messages.SbmTarget(coverage=1.0, segments={"casual": 1.0, "premium": 1.0}),
            budget=messages.Budget(cpu=1.0, accelerator=1.0), reason="pid",
        )
    )  # fmt: skip
    outs = []
    for i, v in enumerate(np.random.default_rng(3).lognormal(0.0, 1.0, 3000)):
        msg = messages.Request(
            ts=1.8e9, id=f"q{i}", region="it-east", segment="casual", value=float(v),
            eligible=True, user=i,
        )  # fmt: skip
        outs.append(await client.serve_request(msg, 0, i))
    control = np.array([o.control for o in outs])
    n = len(outs)
    assert abs(control.mean() - holdout) < 4.5 * np.sqrt(holdout * (1 - holdout) / n) + 1e-9
    assert all(o.routed is None and o.lever is None for o in outs if o.control)
    assert {o.routed for o in outs if not o.control} == {"rma"}
    strata = np.array([o.stratum for o in outs[1000:]])
    assert set(strata.tolist()) == set(range(VALUE_BINS))


async def test_a_target_held_past_its_interval_keeps_the_strong_models_planned_rate() -> None:
    """The held-target rule (defences/plan.py) as the client applies it: its own request rate
    when the target was applied against its rate now, once the target is 1.5 intervals old."""
    now = [1.8e9]
    client = _client(clock=lambda: now[0], control_interval_s=5.0)

    def traffic(rps: float, seconds: float) -> None:
        for _ in range(int(rps * seconds)):
            now[0] += 1.0 / rps
            client.rates.add(client.scenario_time(now[0]))

    traffic(20.0, 10.0)
    client.targets.offer(_target(1, now[0], ttl=60.0, region="it-east"))
    client._target_transitions()  # applied: the rate then is ~20 per second
    traffic(20.0, 5.0)
    state = client.targets.state(now[0])
    assert client.held_target(state, client.scenario_time(now[0])) == state  # not held yet
    traffic(10.0, 10.0)  # traffic halves; the target is now 15 s (3 intervals) old
    held = client.held_target(client.targets.state(now[0]), client.scenario_time(now[0]))
    k = held.sbm_coverage / state.sbm_coverage
    assert 1.6 <= k <= 2.0, k
    assert held.sbm_segments == pytest.approx({s: p * k for s, p in state.sbm_segments.items()})
    assert held.rma_candidates == state.rma_candidates  # RMA's levels are per request: kept
    # the same rate again: the target in force as issued
    traffic(20.0, 20.0)
    state = client.targets.state(now[0])
    assert client.held_target(state, client.scenario_time(now[0])) == state
    # a new share of the region's partitions is a new basis: nothing is held until the next
    # target is applied, whatever the rate does
    client.on_assigned([0, 1])
    traffic(10.0, 10.0)
    state = client.targets.state(now[0])
    assert client.held_target(state, client.scenario_time(now[0])) == state
    # an expired target is the baseline, held or not
    now[0] += 60.0
    expired = client.targets.state(now[0])
    assert expired.expired
    assert client.held_target(expired, client.scenario_time(now[0])) == expired


# -- windows and value signals --------------------------------------------------------------------


def _outcome(offset: int, end_t: float, **kw: object) -> Outcome:
    base = {
        "partition": 0,
        "offset": offset,
        "segment": "casual",
        "end_t": end_t,
        "latency_ms": 50.0,
        "ok": True,
        "timeout": False,
        "control": False,
        "lever": None,
        "sbm_served": False,
        "value_total": 1.0,
        "value_baseline": 1.0,
        "routed": "rma",
    }
    base.update(kw)
    if base["control"]:
        base["routed"] = None
    return Outcome(**base)  # type: ignore[arg-type]


def _traffic(**kw: object) -> WindowTraffic:
    args: dict[str, object] = {
        "requests": 3, "errors": 0, "timeouts": 0,
        "sketch": {"alpha": 0.01, "bins": {"372": 1}, "zeros": 2},
        "sketch_base": {"alpha": 0.01, "bins": {}, "zeros": 2},
        "value_total": 3.0, "value_baseline": 2.5, "inc": {"rma": 0.5}, "value_lost": 0.0,
        "arms": {}, "strata": {}, "itt": {}, "eligible_treated": {"rma": 1},
        "segments": {"casual": {"requests": 3, "sbm": 0, "inc": 0.5}},
        "targets": {"rma_candidates": 200, "sbm_coverage": 0.0},
    }  # fmt: skip
    args.update(kw)
    return WindowTraffic(**args)  # type: ignore[arg-type]


def test_the_window_builder_writes_every_field_alike_whoever_calls_it() -> None:
    """analysis/events.py window_event: the one builder of the window line (the client's and
    the simulator's), normalised so both engines write the same fields alike."""
    sums = {"n": 2, "value_sum": 3, "value_sq_sum": 5}
    f = window_event(
        0, 10, _traffic(
            arms={"casual": {"control": sums, "rma": {**sums, "n": 0}}, "premium": {"none": {
                "n": 0, "value_sum": 0.0, "value_sq_sum": 0.0}}},
            itt={"casual": {"rma": sums}},
            eligible_treated={"rma": 4.4, "precompute": 2},
        ),
        offered_unit_s={"cpu": 1}, used_unit_s={"cpu": 0.5, "accelerator": 0},
        capacity={"cpu": 2, "accelerator": 1}, offsets={3: (7, 9), 1: [0, 4]}, client="c1",
    )  # fmt: skip
    assert list(f) == [
        "t_start", "t_end", "requests", "errors", "timeouts", "sketch", "sketch_base",
        "value_total", "value_baseline", "inc", "value_lost", "arms", "strata", "itt",
        "eligible_treated", "segments", "offered_unit_s", "used_unit_s", "targets", "capacity",
        "offsets", "client",
    ]  # fmt: skip
    assert (f["t_start"], f["t_end"]) == (0.0, 10.0)
    assert isinstance(f["t_start"], float)
    # every lever's ground truth, every live lever's count (whole numbers), others kept
    assert f["inc"] == {"rma": 0.5, "sbm": 0.0, "precompute": 0.0}
    assert f["eligible_treated"] == {"rma": 4, "sbm": 0, "precompute": 2}
    # empty arms and segments are left out; sums are (int, float, float)
    assert f["arms"] == {"casual": {"control": {"n": 2, "value_sum": 3.0, "value_sq_sum": 5.0}}}
    assert isinstance(f["arms"]["casual"]["control"]["value_sum"], float)
    assert f["itt"] == {"casual": {"rma": {"n": 2, "value_sum": 3.0, "value_sq_sum": 5.0}}}
    assert f["offsets"] == {"1": [0, 4], "3": [7, 9]}
    assert f["used_unit_s"] == {"cpu": 0.5, "accelerator": 0.0}
    assert f["targets"] == {"rma_candidates": 200, "sbm_coverage": 0.0}
    # a line of a source that served no request: zero counts and its own groups only
    bare = window_event(10.0, 20.0, used_unit_s={"cpu": 1.0, "accelerator": 0.0}, replica="r0")
    assert bare == {
        "t_start": 10.0, "t_end": 20.0, "requests": 0, "errors": 0, "timeouts": 0,
        "used_unit_s": {"cpu": 1.0, "accelerator": 0.0}, "replica": "r0",
    }  # fmt: skip


def test_a_window_whose_requests_all_ran_without_optional_work_leaves_its_base_sketch_out() -> None:
    # the two sketches are the same: the line carries one, and a reader takes it for both
    same = {"alpha": 0.01, "bins": {"372": 3}, "zeros": 0}
    f = window_event(0, 10, _traffic(sketch=same, sketch_base=dict(same)))
    assert "sketch_base" not in f
    packed = {"alpha": 0.01, "offset": 372, "counts": [3], "zeros": 0}
    assert base_sketch(f) == f["sketch"] == packed
    assert unpack_sketch(base_sketch(f)) == same
    # different ones are both written, and the base one is read
    g = window_event(0, 10, _traffic())
    assert base_sketch(g) == g["sketch_base"] != g["sketch"]
    assert base_sketch({"t_start": 0.0}) is None  # a line without requests has neither


def test_a_window_line_packs_its_sketches_losslessly() -> None:
    """A window line writes a sketch as counts from an offset (docs/events.md): the same bins,
    read back by every reader; sparse keys stay keyed, and a malformed packed sketch is named."""
    from headroom.analysis.metrics import SketchSum, sketch_quantile
    from headroom.kernel.codec import ValidationError

    d = {"alpha": 0.01, "bins": {"370": 2, "372": 5, "373": 1, "375": 1}, "zeros": 1}
    packed = pack_sketch(d)
    assert packed == {"alpha": 0.01, "offset": 370, "counts": [2, 0, 5, 1, 0, 1], "zeros": 1}
    assert unpack_sketch(packed) == d
    for q in (0.0, 0.1, 0.5, 0.9, 0.99, 1.0):
        assert sketch_quantile(packed, q) == sketch_quantile(d, q)
    both, keyed = SketchSum(), SketchSum()
    both.add(packed), both.add(d), keyed.add(d), keyed.add(d)
    assert both.as_dict() == keyed.as_dict()
    # empty, and keys too far apart to be worth slots: kept as bins
    empty = {"alpha": 0.01, "bins": {}, "zeros": 4}
    assert unpack_sketch(pack_sketch(empty)) == empty
    sparse = {"alpha": 0.01, "bins": {"100": 1, "900": 1}, "zeros": 0}
    assert pack_sketch(sparse) == sparse
    # a sketch of the messages' form reads as before
    assert unpack_sketch(sparse) is sparse
    with pytest.raises(ValidationError, match=r"^counts\[1\]: must be a non-negative integer"):
        unpack_sketch({**packed, "counts": [1, -2]})
    with pytest.raises(ValidationError, match=r"^offset: "):
        unpack_sketch({**packed, "offset": "370"})
    with pytest.raises(ValidationError, match=r"^counts\[0\]"):
        sketch_quantile({**packed, "counts": [1.5]}, 0.99)
    bad = SketchSum()
    bad.add({**packed, "counts": [1.5]})
    bad.add({**packed, "offset": None})
    assert (bad.malformed, bad.count) == (2, 0)


def test_a_window_line_adds_up_requests_value_and_arms() -> None:
    book = WindowBook("r", 5.0, ["casual", "premium"])
    book.add(_outcome(0, 1.0, control=True, value_total=2.0, value_baseline=2.0))
    book.add(_outcome(1, 2.0, lever="rma", value_total=3.0, value_baseline=2.5, cost_cpu_ms=8.0))
    book.add(
        _outcome(
            2, 3.0, lever="sbm", sbm_served=True, routed="sbm", value_total=1.5,
            value_baseline=1.0,
        )
    )  # fmt: skip
    # failed: delivered nothing where the baseline would have delivered 0.8 (lost value)
    book.add(_outcome(3, 4.0, ok=False, value_total=0.0, value_baseline=0.8, latency_ms=900.0))
    book.add(_outcome(5, 4.5, value_total=0.5, value_baseline=0.5))  # treated, got nothing
    book.add(_outcome(4, 7.0))  # next window
    assert book.due(5.5) == [0]
    w = book.take(0)
    assert w is not None
    f = book.event_fields(w, targets={"rma_candidates": 200, "sbm_coverage": 0.1}, source="c1")
    assert (f["t_start"], f["t_end"]) == (0.0, 5.0)
    assert (f["requests"], f["errors"], f["timeouts"]) == (5, 1, 0)
    assert f["value_total"] == pytest.approx(7.0)
    assert f["value_baseline"] == pytest.approx(6.8)
    assert f["inc"] == {"rma": pytest.approx(0.5), "sbm": pytest.approx(0.5), "precompute": 0.0}
    # the levers and the lost value add up to value_total − value_baseline exactly
    assert f["value_lost"] == pytest.approx(-0.8)
    assert sum(f["inc"].values()) + f["value_lost"] == pytest.approx(
        f["value_total"] - f["value_baseline"]
    )
    assert f["arms"]["casual"]["control"] == {"n": 1, "value_sum": 2.0, "value_sq_sum": 4.0}
    assert f["arms"]["casual"]["rma"]["n"] == 1
    # a treatment request that got no optional work is in the "none" arm (unbiased estimate)
    assert f["arms"]["casual"]["none"] == {"n": 1, "value_sum": 0.5, "value_sq_sum": 0.25}
    assert f["eligible_treated"] == {"rma": 1, "sbm": 1}
    assert f["segments"]["casual"] == {"requests": 5, "sbm": 1, "inc": pytest.approx(0.2)}
    assert f["offsets"] == {"0": [0, 5]}
    assert messages.LatencySketch.from_dict(unpack_sketch(f["sketch"])).count == 5
    # the with/without-optional-work sketch holds the requests that got no lever
    assert messages.LatencySketch.from_dict(unpack_sketch(f["sketch_base"])).count == 3
    assert book.open_windows == [1]


def test_value_signals_publish_the_control_arm_under_each_lever() -> None:
    book = WindowBook("r", 5.0, ["casual"])
    for i in range(3):
        book.add(_outcome(i, 1.0, control=True, value_total=1.0 + i))
    book.add(
        _outcome(3, 1.0, lever="rma", value_total=4.0, cost_cpu_ms=8.0, cost_accelerator_ms=1.0)
    )
    # in RMA's intent-to-treat group but given no extras (value-ranked): still in its treatment
    book.add(_outcome(4, 1.0, value_total=1.0))
    w = book.take(0)
    assert w is not None
    signals = {(s.lever, s.arm): s for s in book.value_signals(w, ts=10.0)}
    assert set(signals) == {("rma", "control"), ("sbm", "control"), ("rma", "treatment")}
    for lever in ("rma", "sbm"):
        c = signals[(lever, "control")]
        assert (c.n, c.value_sum, c.value_sq_sum) == (3, 6.0, 14.0)
        assert c.cost.cpu_ms == 0.0
    t = signals[("rma", "treatment")]
    assert (t.n, t.value_sum, t.cost.cpu_ms, t.cost.accelerator_ms) == (2, 5.0, 8.0, 1.0)
    assert all(s.window_s == 5.0 and s.region == "r" for s in signals.values())


# -- offsets --------------------------------------------------------------------------------------


def test_requests_are_released_in_offset_order_and_commit_follows_the_release() -> None:
    t: OffsetTracker[str] = OffsetTracker()
    for o in range(10, 15):
        t.received(0, o)
    t.received(1, 3)
    assert t.committable() == {0: 10, 1: 3}
    t.committed({0: 10, 1: 3})
    t.completed(0, 11, "b")
    t.completed(0, 12, "c")
    assert t.release() == []  # 10 is still in flight: 11 and 12 wait behind it
    assert t.committable() == {}
    t.completed(0, 10, "a")
    t.completed(1, 3, "x")
    assert sorted(t.release()) == ["a", "b", "c", "x"]
    assert t.committable() == {0: 13, 1: 4}
    t.committed({0: 13, 1: 4})
    t.completed(0, 14, "e")
    t.completed(0, 13, "d")
    assert t.release() == ["d", "e"]
    assert t.committable() == {0: 15}
    assert t.pending(0) == 0


@given(st.permutations(list(range(30))), st.integers(0, 30))
def test_what_is_released_is_exactly_what_the_commit_covers(order: list[int], k: int) -> None:
    # a restart re-reads from the commit point: it must see every unreleased request (none lost)
    # and no released one (none counted twice)
    t: OffsetTracker[int] = OffsetTracker()
    for o in range(30):
        t.received(0, o)
    for o in order[:k]:
        t.completed(0, o, o)
    released = t.release()
    point = t.committable().get(0, 0)
    assert released == list(range(point))
    assert all(o not in released for o in range(point, 30))


def test_forgotten_partitions_are_dropped() -> None:
    t: OffsetTracker[int] = OffsetTracker()
    t.received(2, 5)
    t.forget([2])
    assert t.committable() == {}


def test_the_in_flight_limit_follows_the_peak_rate() -> None:
    from headroom.kernel.scenario_load import load_scenario
    from headroom.kernel.settings import default_scenario_path

    quickstart = load_scenario(default_scenario_path())
    # 300 rps x 1.4 (daily amplitude) x 1.6 (surge) x noise, 200 ms: some 290 at most in flight
    assert 250 < in_flight_limit(quickstart, "us-east") < 320
    with pytest.raises(KeyError):
        in_flight_limit(quickstart, "nowhere")


# -- configuration --------------------------------------------------------------------------------


def test_server_addresses_parse_and_bad_ones_name_the_flag() -> None:
    assert ServerAddress.parse("dedicated=127.0.0.1:7001") == ServerAddress(
        "dedicated", "127.0.0.1", 7001
    )
    for bad in ("127.0.0.1:7001", "gpu=h:1", "dedicated=h:x", "dedicated=:80", "dedicated=h:0"):
        with pytest.raises(ConfigError, match="--server"):
            ServerAddress.parse(bad)


def test_a_client_needs_a_dedicated_server() -> None:
    with pytest.raises(ConfigError, match="dedicated"):
        ClientConfig(region="r", servers=(ServerAddress("opportunistic", "h", 1),), group="g")
    with pytest.raises(ConfigError, match="--speed"):
        ClientConfig(region="r", servers=(ServerAddress("dedicated", "h", 1),), group="g", speed=0)


# -- the client's request handling, without Kafka or servers ---------------------------------------


async def test_an_unknown_segment_is_refused_for_the_dead_letter_topic() -> None:
    from pathlib import Path

    from headroom.kernel.scenario_load import load_scenario
    from headroom.streams.consume import Received
    from headroom.streams.kafka import KafkaTarget
    from headroom.workers.client import RankingClient

    scenario = load_scenario(
        Path(__file__).parents[1] / "integration" / "scenarios" / "stack-short.yaml"
    )
    client = RankingClient(
        ClientConfig(
            region="it-east", servers=(ServerAddress("dedicated", "127.0.0.1", 9),), group="g"
        ),
        scenario,
        KafkaTarget("127.0.0.1:1", "t."),
    )

    def received(offset: int, segment: str) -> Received:
        msg = messages.Request(
            ts=1.0, id=f"q{offset}", region="it-east", segment=segment, value=1.0,
            eligible=True, user=1,
        )  # fmt: skip
        return Received("t.requests", "requests", 0, offset, b"it-east", 0, msg)

    client.published_known.set()  # as after an assignment (no Kafka here)
    # the consumer loop dead-letters a message whose handler raises: the reason names the field
    with pytest.raises(ValueError, match="segment: 'whales'"):
        await client._on_request(received(7, "whales"))
    assert client.offsets.pending(0) == 0

    async def boom(*_args: object) -> Outcome:
        raise RuntimeError("a bug")

    client.serve_request = boom  # type: ignore[method-assign]
    await client._on_request(received(8, "casual"))
    for _ in range(100):  # the request task runs on the loop
        await asyncio.sleep(0)
        if client.stats["requests"]:
            break
    # a request that failed is still completed: it is counted as an error and never blocks
    # the commits of the requests behind it
    released = client.offsets.release()
    assert [o.offset for o in released] == [8]
    assert released[0].ok is False
    assert client.stats["errors"] == 1
