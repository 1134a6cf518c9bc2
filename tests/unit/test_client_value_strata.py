"""Value signals per (segment, value bin) stratum in the streaming client: the
``ValueSignal.stratum`` extension, the client's per-segment value ranks, the strata adding up to
the per-segment sums (the window line unchanged), and the controller's keys. (Value-ranked SBM
routing by those bins is the plan's: tests/unit/test_plan.py.)"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from headroom.controllers.observe import RegionAggregator, arm_stats
from headroom.controllers.types import ArmStats, stratum_key
from headroom.defences import plan
from headroom.kernel.scenario_load import load_scenario
from headroom.sim.config import SimConfig
from headroom.streams import messages
from headroom.streams.kafka import KafkaTarget
from headroom.workers.client import (
    VALUE_BINS,
    ClientConfig,
    RankingClient,
    ServerAddress,
    value_stratum,
)
from headroom.workers.client_windows import Outcome, WindowBook

REPO = Path(__file__).parents[2]
SCENARIO = REPO / "tests" / "integration" / "scenarios" / "precompute-short.yaml"  # it-pre
T0 = 1_800_000_000.0
TARGETS = {"rma_candidates": 100, "sbm_coverage": 0.0}  # in force at the window's end


def _signal(**kw: Any) -> messages.ValueSignal:
    base: dict[str, Any] = {
        "ts": 10.0,
        "region": "r",
        "segment": "casual",
        "lever": "sbm",
        "arm": "treatment",
        "n": 4,
        "value_sum": 6.0,
        "value_sq_sum": 11.0,
        "window_s": 10.0,
        "cost": messages.Cost(cpu_ms=1.0, accelerator_ms=2.0),
    }
    base.update(kw)
    return messages.ValueSignal(**base)


# -- the message extension ------------------------------------------------------------------------


def test_stratum_round_trips_and_is_absent_on_the_wire_when_none() -> None:
    plain = _signal()
    assert plain.stratum is None
    assert "stratum" not in plain.to_dict()
    assert b"stratum" not in messages.encode(plain)
    assert messages.decode("value", messages.encode(plain)) == plain
    for k in (0, 3, messages.MAX_STRATUM):
        s = _signal(stratum=k)
        assert s.to_dict()["stratum"] == k
        back = messages.decode("value", messages.encode(s))
        assert back == s
        assert back.stratum == k


def test_a_message_without_stratum_still_decodes_and_an_unknown_consumer_ignores_it() -> None:
    wire = _signal(stratum=5).to_dict()
    old = {k: v for k, v in wire.items() if k != "stratum"}
    decoded = messages.decode("value", orjson.dumps(old))
    assert isinstance(decoded, messages.ValueSignal)
    assert decoded.stratum is None
    # everything but the extension is the docs/messages.md message, field for field
    assert decoded.to_dict() == old


@pytest.mark.parametrize("bad", [-1, 64, 1000, 1.5, 3.0, True, "3", [1]])
def test_an_invalid_stratum_is_refused_naming_the_field(bad: object) -> None:
    d = {**_signal().to_dict(), "stratum": bad}
    with pytest.raises(messages.ValidationError) as err:
        messages.decode("value", orjson.dumps(d))
    assert err.value.field == "stratum"
    with pytest.raises(messages.ValidationError) as err:
        _signal(stratum=bad)
    assert err.value.field == "stratum"


def test_a_null_stratum_reads_as_absent() -> None:
    d = {**_signal().to_dict(), "stratum": None}
    decoded = messages.decode("value", orjson.dumps(d))
    assert isinstance(decoded, messages.ValueSignal)
    assert decoded.stratum is None


# -- strata ---------------------------------------------------------------------------------------


def test_the_client_bins_values_as_the_plan_and_the_simulator_do() -> None:
    """The client's value bins are the plan's (headroom.defences.plan, tested there) and the
    simulator's default: both engines hand the control plane the same strata."""
    assert VALUE_BINS is plan.VALUE_BINS
    assert value_stratum is plan.value_stratum
    assert SimConfig().value_bins == VALUE_BINS
    assert VALUE_BINS - 1 <= messages.MAX_STRATUM


# -- per-stratum value signals --------------------------------------------------------------------

_outcomes = st.lists(
    st.tuples(
        st.sampled_from(["casual", "premium"]),
        st.integers(0, VALUE_BINS - 1),
        st.sampled_from(["control", "rma", "sbm", "precompute", "none"]),
        st.sampled_from([None, "hit", "held_out", "miss"]),
        st.floats(0.0, 50.0, allow_nan=False),
        st.booleans(),  # ok
        st.floats(0.0, 10.0, allow_nan=False),  # cost
    ),
    max_size=60,
)


def _outcome(i: int, t: tuple[Any, ...], stratum: int | None) -> Outcome:
    seg, _k, kind, looked, value, ok, cost = t
    control = kind == "control"
    routed = None if control else ("rma" if kind == "none" else kind)
    lever = None if control or kind == "none" else kind
    if kind == "precompute":
        looked = "hit"
    elif looked == "hit":
        looked = "miss"
    return Outcome(
        partition=0, offset=i, segment=seg, end_t=1.0, latency_ms=10.0, ok=ok, timeout=False,
        control=control, lever=lever, sbm_served=kind == "sbm", routed=routed,
        value_total=value, value_baseline=value * 0.9, cost_cpu_ms=cost,
        cost_accelerator_ms=2.0 * cost, precompute=looked, stratum=stratum,
    )  # fmt: skip


def _book_window(outcomes: list[Outcome]) -> tuple[WindowBook, Any]:
    book = WindowBook("r", 5.0, ["casual", "premium"])
    for o in outcomes:
        book.add(o)
    w = book.take(0)
    return book, w


@settings(max_examples=80, deadline=None)
@given(parts=_outcomes)
def test_per_stratum_value_signals_add_up_to_the_per_segment_ones(
    parts: list[tuple[Any, ...]],
) -> None:
    strata = [_outcome(i, t, t[1]) for i, t in enumerate(parts)]
    plain = [_outcome(i, t, None) for i, t in enumerate(parts)]
    book_s, w_s = _book_window(strata)
    book_p, w_p = _book_window(plain)
    if w_s is None:
        assert w_p is None
        return
    signals_s = book_s.value_signals(w_s, ts=5.0)
    signals_p = book_p.value_signals(w_p, ts=5.0)
    assert all(s.stratum is not None for s in signals_s)
    assert all(s.stratum is None for s in signals_p)
    # one message per (segment, stratum, lever, arm)
    keys = [(s.segment, s.stratum, s.lever, s.arm) for s in signals_s]
    assert len(keys) == len(set(keys))
    summed: dict[tuple[str, str, str], list[float]] = {}
    for s in signals_s:
        acc = summed.setdefault((s.segment, s.lever, s.arm), [0, 0.0, 0.0, 0.0, 0.0])
        acc[0] += s.n
        acc[1] += s.value_sum
        acc[2] += s.value_sq_sum
        acc[3] += s.cost.cpu_ms
        acc[4] += s.cost.accelerator_ms
    expect = {
        (s.segment, s.lever, s.arm): [
            s.n, s.value_sum, s.value_sq_sum, s.cost.cpu_ms, s.cost.accelerator_ms
        ]
        for s in signals_p
    }  # fmt: skip
    assert set(summed) == set(expect)
    for key, got in summed.items():
        want = expect[key]
        assert got[0] == want[0]
        assert got[1:] == pytest.approx(want[1:], rel=1e-9, abs=1e-9)
    # the window line stays per segment, exactly as without strata, but for the estimator's
    # ``strata``, whose value bins add up to the per-segment sums
    fields_s = book_s.event_fields(w_s, targets=TARGETS, source="c")
    fields_p = book_p.event_fields(w_p, targets=TARGETS, source="c")
    strata_s, strata_p = fields_s.pop("strata"), fields_p.pop("strata")
    assert fields_s == fields_p
    folded: dict[str, dict[str, dict[str, float]]] = {}
    for key, by_arm in strata_s.items():
        assert "#" in key
        for arm, sums in by_arm.items():
            acc = folded.setdefault(key.split("#")[0], {}).setdefault(arm, {})
            for name, v in sums.items():
                acc[name] = acc.get(name, 0.0) + v
    assert set(folded) == set(strata_p)
    for seg, by_arm in strata_p.items():
        assert set(folded[seg]) == set(by_arm)
        for arm, sums in by_arm.items():
            assert folded[seg][arm] == pytest.approx(sums, rel=1e-9, abs=1e-9)


def test_each_stratum_gets_its_own_control_under_every_lever() -> None:
    outs = [
        Outcome(
            partition=0, offset=i, segment="premium", end_t=1.0, latency_ms=5.0, ok=True,
            timeout=False, control=ctl, lever=None if ctl else "sbm", sbm_served=not ctl,
            routed=None if ctl else "sbm", value_total=float(k + 1), value_baseline=1.0,
            stratum=k,
        )
        for i, (k, ctl) in enumerate([(7, True), (7, False), (7, False), (2, True), (2, True)])
    ]  # fmt: skip
    book, w = _book_window(outs)
    got = {(s.stratum, s.lever, s.arm): s.n for s in book.value_signals(w, ts=5.0)}
    assert got == {
        (2, "rma", "control"): 2,
        (2, "sbm", "control"): 2,
        (7, "sbm", "treatment"): 2,
        (7, "rma", "control"): 1,
        (7, "sbm", "control"): 1,
    }


def test_value_signals_carry_the_value_signals_sums_to_the_controllers_book() -> None:
    outs = [
        Outcome(
            partition=0, offset=i, segment="premium", end_t=1.0, latency_ms=5.0, ok=True,
            timeout=False, control=ctl, lever=None if ctl else "sbm", sbm_served=not ctl,
            routed=None if ctl else "sbm", value_total=v, value_baseline=1.0, stratum=3,
            value_signal=x,
        )
        for i, (ctl, v, x) in enumerate([(False, 2.0, 1.5), (False, 3.0, 2.5), (True, 1.0, 0.5)])
    ]  # fmt: skip
    book, w = _book_window(outs)
    got = {(s.lever, s.arm): s for s in book.value_signals(w, ts=5.0)}
    treated = got[("sbm", "treatment")]
    assert (treated.signal_sum, treated.signal_sq_sum) == (4.0, 1.5**2 + 2.5**2)
    assert treated.signal_value_sum == 1.5 * 2.0 + 2.5 * 3.0
    assert got[("sbm", "control")].signal_sum == 0.5
    wire = messages.decode("value", messages.encode(treated))
    assert isinstance(wire, messages.ValueSignal)
    agg = RegionAggregator()
    agg.add_value_signal(wire)
    # the sums reach the book as the simulator writes them (the per-stratum signal means)
    stats = arm_stats(wire)
    assert (stats.signal_sum, stats.signal_value_sum) == (4.0, 10.5)
    old = messages.decode("value", messages.encode(_signal()))  # a writer without them
    assert isinstance(old, messages.ValueSignal)
    assert arm_stats(old).signal_sum == 0.0


# -- the client: strata from the value rank within the segment -------------------------------------


async def test_the_client_bins_a_request_by_its_value_rank_within_its_segment() -> None:
    scenario = load_scenario(SCENARIO)
    config = ClientConfig(
        region="it-pre",
        servers=(ServerAddress("dedicated", "127.0.0.1", 9),),  # never connected: ok is False
        group="g",
        t0=T0,
        precompute=False,
    )
    client = RankingClient(config, scenario, KafkaTarget("127.0.0.1:9", "t."), clock=lambda: T0)
    assert set(client.segment_rankers) == {"casual", "premium"}
    rng = np.random.default_rng(0)

    def request(i: int, segment: str, value: float) -> messages.Request:
        return messages.Request(
            ts=T0, id=f"q{i}", region="it-pre", segment=segment, value=value, eligible=True, user=i
        )

    # premium values far above casual ones: a casual request's global rank is low
    for i, v in enumerate(rng.uniform(10.0, 20.0, 400)):
        await client.serve_request(request(i, "premium", float(v)), 0, i)
    for i, v in enumerate(rng.uniform(0.1, 1.0, 400), start=400):
        await client.serve_request(request(i, "casual", float(v)), 0, i)
    top_casual = await client.serve_request(request(900, "casual", 0.99), 0, 900)
    low_casual = await client.serve_request(request(901, "casual", 0.12), 0, 901)
    low_premium = await client.serve_request(request(902, "premium", 10.1), 0, 902)
    assert client.ranker.rank(0.99) < 0.6  # globally it is in the lower half...
    assert top_casual.stratum == VALUE_BINS - 1  # ...but the top bin of its segment
    assert low_casual.stratum == 0
    assert low_premium.stratum == 0


# -- the controller's keys ------------------------------------------------------------------------


def test_the_aggregator_keys_value_signals_by_stratum_and_rates_by_segment() -> None:
    agg = RegionAggregator()
    agg.add_value_signal(_signal(segment="casual", stratum=3, n=4, value_sum=6.0))
    agg.add_value_signal(_signal(segment="casual", stratum=3, n=1, value_sum=1.0))
    agg.add_value_signal(_signal(segment="casual", stratum=7, n=5, value_sum=20.0))
    agg.add_value_signal(_signal(segment="premium", n=10, value_sum=30.0, arm="control"))
    agg.add_latency("r", 10.0, "base", 20, None, (10.0,) * 20, window_s=10.0)
    obs = agg.observe("r", 20.0)
    assert set(obs.value) == {
        (stratum_key("casual", 3), "sbm", "treatment"),
        (stratum_key("casual", 7), "sbm", "treatment"),
        ("premium", "sbm", "control"),
    }
    assert obs.value[("casual#3", "sbm", "treatment")] == ArmStats(
        5, 7.0, 22.0, cpu_ms=2.0, accelerator_ms=4.0
    )
    assert obs.value[("casual#7", "sbm", "treatment")].n == 5
    # the request rate per segment folds the strata back into their segment
    assert set(obs.segment_rps) == {"casual", "premium"}
    assert obs.segment_rps["casual"] == pytest.approx(obs.segment_rps["premium"])
    assert obs.value_age_s == pytest.approx(10.0)
