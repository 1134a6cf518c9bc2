"""The client's precompute path without a broker: the look-up before live ranking (an in-memory
:class:`PrecomputeCache` stands in for the topic), what a hit delivers, the holdout arm, and how
window lines and value signals count lever ``precompute``."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from headroom.kernel.scenario import Scenario
from headroom.kernel.scenario_load import load_scenario
from headroom.streams import messages
from headroom.streams.kafka import KafkaTarget
from headroom.workers.client import ClientConfig, PrecomputePath, RankingClient, ServerAddress
from headroom.workers.client_windows import Outcome, WindowBook
from headroom.workers.precompute_lookup import PrecomputeCache
from headroom.workers.precompute_store import Visit, VisitOutcome
from headroom.world.ranking import RankingWorld

REPO = Path(__file__).parents[2]
SCENARIO = REPO / "tests" / "integration" / "scenarios" / "precompute-short.yaml"
NO_PRECOMPUTE = REPO / "tests" / "integration" / "scenarios" / "stack-short.yaml"
REGION = "it-pre"
T0 = 1_800_000_000.0
SPEED = 10.0


@pytest.fixture(scope="module")
def scenario() -> Scenario:
    return load_scenario(SCENARIO)


@pytest.fixture(scope="module")
def world(scenario: Scenario) -> RankingWorld:
    return RankingWorld.from_scenario(scenario)


class Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


TARGETS = {"rma_candidates": 100, "sbm_coverage": 0.0}  # in force at the window's end


def _result(
    user: int, *, ts: float, life_s: float, segment: str = "premium", first: int = 7
) -> messages.Precompute:
    return messages.Precompute(
        ts=ts,
        region=REGION,
        user=user,
        segment=segment,
        model="strong",
        expires_at=ts + life_s,
        ranking=(first, first + 1, first + 2),
        cost=messages.Cost(cpu_ms=1.0, accelerator_ms=4.0),
    )


def _request(user: int, segment: str = "premium", value: float = 2.0) -> messages.Request:
    return messages.Request(
        ts=T0, id=f"q-{user}", region=REGION, segment=segment, value=value, eligible=True, user=user
    )


def _client(
    scenario: Scenario, world: RankingWorld, cache: PrecomputeCache, clock: Clock, holdout: float
) -> RankingClient:
    # a server address that is never connected: a request that went live would fail (ok False)
    config = ClientConfig(
        region=REGION,
        servers=(ServerAddress("dedicated", "127.0.0.1", 9),),
        group="g",
        t0=T0,
        speed=SPEED,
    )
    client = RankingClient(
        config, scenario, KafkaTarget("127.0.0.1:9", "t."), clock=clock, world=world, cache=cache
    )
    # 0: nobody held out; 0.999…: everybody
    client.planner.rule = dataclasses.replace(client.planner.rule, holdout=holdout)
    return client


# -- the look-up before live ranking --------------------------------------------------------------


async def test_a_hit_is_served_from_the_stored_ranking_without_a_server_call(
    scenario: Scenario, world: RankingWorld
) -> None:
    clock = Clock(T0 + 30.0)
    cache = PrecomputeCache(REGION, speed=SPEED, clock=clock)
    stored = _result(42, ts=T0 + 10.0, life_s=60.0, first=123)
    cache.apply(None, stored, clock())
    client = _client(scenario, world, cache, clock, holdout=0.0)

    out = await client.serve_request(_request(42), partition=0, offset=5)

    t_s = 30.0 * SPEED  # scenario time of the visit
    q_stored = float(world.ad_quality(42, "premium", [123], t_s)[0])
    base_top = world.rank(42, "premium", scenario.world.base_candidates, "base", t_s).top_ad
    q_base = float(world.ad_quality(42, "premium", [base_top], t_s)[0])
    assert out.ok  # no server was reachable: only the stored result can have served it
    assert (out.lever, out.routed, out.precompute, out.control) == (
        "precompute",
        "precompute",
        "hit",
        False,
    )
    assert out.value_total == pytest.approx(2.0 * q_stored)
    assert out.value_baseline == pytest.approx(2.0 * q_base)
    assert out.staleness_s == pytest.approx(20.0 * SPEED)  # 20 wall seconds old, in scenario s
    assert out.remaining_s == pytest.approx(40.0 * SPEED)
    assert out.cost_accelerator_ms == 0.0  # the look-up only
    assert cache.store.counts.hits == 1
    assert cache.store.counts.used == 1


async def test_a_result_past_its_expiry_is_never_served(
    scenario: Scenario, world: RankingWorld
) -> None:
    clock = Clock(T0 + 10.0)
    cache = PrecomputeCache(REGION, speed=SPEED, clock=clock)
    cache.apply(None, _result(42, ts=T0, life_s=20.0), clock())
    client = _client(scenario, world, cache, clock, holdout=0.0)
    at_expiry = await client.serve_request(_request(42), 0, 0)
    assert at_expiry.precompute == "hit"  # valid up to expires_at included
    clock.now = T0 + 20.001  # no tombstone has arrived: the cache must still refuse it
    late = await client.serve_request(_request(42), 0, 1)
    assert late.precompute == "miss"
    assert late.lever != "precompute"
    assert not late.ok  # it went live (and found no server)
    assert cache.store.counts.hits == 1


async def test_a_held_out_request_is_ranked_live_and_is_the_precompute_control(
    scenario: Scenario, world: RankingWorld
) -> None:
    clock = Clock(T0 + 5.0)
    cache = PrecomputeCache(REGION, speed=SPEED, clock=clock)
    cache.apply(None, _result(42, ts=T0, life_s=60.0), clock())
    client = _client(scenario, world, cache, clock, holdout=0.999999)
    out = await client.serve_request(_request(42), 0, 0)
    assert out.control
    assert out.precompute == "held_out"
    assert out.lever is None  # not served from the result: the live path (no server here)
    assert (cache.store.counts.held_out, cache.store.counts.hits) == (1, 0)


async def test_a_result_of_another_segment_or_user_is_a_miss(
    scenario: Scenario, world: RankingWorld
) -> None:
    clock = Clock(T0 + 5.0)
    cache = PrecomputeCache(REGION, speed=SPEED, clock=clock)
    cache.apply(None, _result(42, ts=T0, life_s=60.0, segment="casual"), clock())
    client = _client(scenario, world, cache, clock, holdout=0.0)
    assert (await client.serve_request(_request(42, "premium"), 0, 0)).precompute == "miss"
    assert (await client.serve_request(_request(43, "casual"), 0, 1)).precompute == "miss"
    assert cache.store.counts.hits == 0


def test_the_client_builds_its_cache_only_when_the_scenario_enables_precompute(
    scenario: Scenario,
) -> None:
    config = ClientConfig(
        region=REGION, servers=(ServerAddress("dedicated", "127.0.0.1", 9),), group="g"
    )
    kafka = KafkaTarget("127.0.0.1:9", "t.")
    on = RankingClient(config, scenario, kafka)
    assert on.precompute is not None
    assert isinstance(on.precompute.cache, PrecomputeCache)
    off_config = ClientConfig(
        region=REGION,
        servers=config.servers,
        group="g",
        precompute=False,
    )
    assert RankingClient(off_config, scenario, kafka).precompute is None
    plain = load_scenario(NO_PRECOMPUTE)
    other = ClientConfig(region="it-east", servers=config.servers, group="g")
    assert RankingClient(other, plain, kafka).precompute is None


def test_only_an_unexpired_hit_can_be_turned_into_a_served_request(world: RankingWorld) -> None:
    path = PrecomputePath(PrecomputeCache(REGION), base_candidates=100)
    stored = _result(1, ts=T0, life_s=10.0)
    common = {"wall": T0 + 1.0, "t_s": 1.0, "partition": 0, "offset": 0, "lookup_ms": 0.01}
    with pytest.raises(ValueError, match="not a servable hit"):
        path.hit(_request(1), Visit(VisitOutcome.HELD_OUT, stored, 1.0), world, **common)  # type: ignore[arg-type]
    late = {**common, "wall": T0 + 11.0}
    with pytest.raises(ValueError, match="expired"):
        path.hit(_request(1), Visit(VisitOutcome.HIT, stored, 11.0), world, **late)  # type: ignore[arg-type]


# -- windows and value signals --------------------------------------------------------------------


def _outcome(offset: int, kind: str, *, value: float = 1.0, ok: bool = True) -> Outcome:
    """``kind``: hit, held_out (control with a result), control (no result), rma, none."""
    control = kind in ("held_out", "control")
    hit = kind == "hit"
    return Outcome(
        partition=0,
        offset=offset,
        segment="premium",
        end_t=1.0,
        latency_ms=0.01 if hit else 40.0,
        ok=ok,
        timeout=False,
        control=control,
        lever="precompute" if hit else ("rma" if kind == "rma" else None),
        sbm_served=False,
        routed=None if control else ("precompute" if hit else "rma"),
        value_total=value,
        value_baseline=value - 0.5 if hit else value,
        cost_cpu_ms=0.01 if hit else 0.0,
        precompute={"hit": "hit", "held_out": "held_out"}.get(kind, "miss"),
        staleness_s=float(offset) if hit else None,
        remaining_s=100.0 - offset if hit else None,
    )


def test_hits_and_held_out_requests_are_the_arms_of_lever_precompute() -> None:
    book = WindowBook(REGION, 50.0, ["premium", "casual"])
    kinds = ["hit", "hit", "hit", "held_out", "held_out", "control", "rma", "none"]
    for i, kind in enumerate(kinds):
        book.add(_outcome(i, kind, value=1.0 + i))
    w = book.take(0)
    assert w is not None
    f = book.event_fields(w, targets=TARGETS, source="c")
    assert f["inc"]["precompute"] == pytest.approx(1.5)  # three hits, 0.5 each above baseline
    assert f["arms"]["premium"]["precompute"]["n"] == 3
    assert f["arms"]["premium"]["control"]["n"] == 3  # the holdout, with and without a result
    assert f["eligible_treated"]["precompute"] == 3
    pre = f["precompute"]
    assert (pre["visits"], pre["hits"], pre["held_out"]) == (8, 3, 2)
    assert pre["staleness_s"] == [0.0, 1.0, 2.0]
    assert pre["remaining_s_min"] == 98.0
    signals = {(s.lever, s.arm): s for s in book.value_signals(w, ts=T0)}
    assert signals[("precompute", "treatment")].n == 3
    assert signals[("precompute", "treatment")].value_sum == pytest.approx(1.0 + 2.0 + 3.0)
    assert signals[("precompute", "control")].n == 2  # the held-out requests only
    assert signals[("precompute", "control")].value_sum == pytest.approx(4.0 + 5.0)
    for lever in ("rma", "sbm"):  # their control: the holdout requests that found no result
        assert signals[(lever, "control")].n == 1
        assert signals[(lever, "control")].value_sum == pytest.approx(6.0)
    assert signals[("rma", "treatment")].n == 2
    assert ("sbm", "treatment") not in signals


def test_without_precompute_the_window_line_has_no_precompute_field() -> None:
    book = WindowBook(REGION, 50.0, ["premium"])
    plain = _outcome(0, "control")
    book.add(Outcome(**{**{k: getattr(plain, k) for k in plain.__slots__}, "precompute": None}))
    w = book.take(0)
    assert w is not None
    f = book.event_fields(w, targets=TARGETS, source="c")
    assert "precompute" not in f
    assert {(s.lever, s.arm) for s in book.value_signals(w, ts=T0)} == {
        ("rma", "control"),
        ("sbm", "control"),
    }


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from(["hit", "held_out", "control", "rma", "none"]), st.booleans()),
        min_size=1,
        max_size=60,
    )
)
def test_the_precompute_value_signals_add_up_to_the_visits_that_found_a_result(
    draws: list[tuple[str, bool]],
) -> None:
    book = WindowBook(REGION, 50.0, ["premium"])
    for i, (kind, ok) in enumerate(draws):
        book.add(_outcome(i, kind, ok=ok or kind == "hit"))  # a hit never fails: no call
    w = book.take(0)
    assert w is not None
    pre = book.event_fields(w, targets=TARGETS, source="c")["precompute"]
    signals = {(s.lever, s.arm): s.n for s in book.value_signals(w, ts=T0)}
    held_ok = sum(1 for kind, ok in draws if kind == "held_out" and ok)
    found = pre["hits"] + pre["held_out"]
    assert pre["visits"] == len(draws)
    assert signals.get(("precompute", "treatment"), 0) == pre["hits"]
    assert signals.get(("precompute", "control"), 0) == held_ok
    assert signals.get(("precompute", "treatment"), 0) + held_ok <= found
    # the holdout is split between the two control arms, never counted twice
    control_ok = sum(1 for kind, ok in draws if kind in ("held_out", "control") and ok)
    assert signals.get(("rma", "control"), 0) + signals.get(("precompute", "control"), 0) == (
        control_ok
    )


def test_a_seeded_client_draws_the_same_holdout_for_precompute_and_live_levers(
    scenario: Scenario, world: RankingWorld
) -> None:
    """One draw decides both: over many requests that all find a result, the held-out share is
    the scenario's holdout (0.2), and none of them got optional work."""
    import asyncio

    clock = Clock(T0 + 1.0)
    cache = PrecomputeCache(REGION, speed=SPEED, clock=clock)
    users = range(400)
    for u in users:
        cache.apply(None, _result(u, ts=T0, life_s=600.0), clock())
    client = _client(scenario, world, cache, clock, holdout=scenario.world.holdout)
    client.planner.rng = np.random.default_rng(3)

    async def run() -> list[Outcome]:
        return [await client.serve_request(_request(u), 0, u) for u in users]

    outs = asyncio.run(run())
    held = [o for o in outs if o.precompute == "held_out"]
    assert all(o.control and o.lever is None for o in held)
    assert all(o.precompute in ("hit", "held_out") for o in outs)
    assert 0.14 < len(held) / len(outs) < 0.26  # binomial(400, 0.2): ±3 standard deviations


def test_a_tombstone_for_a_result_that_expired_unused_counts_it_as_expired_unused() -> None:
    cache = PrecomputeCache(REGION)
    cache.apply(None, _result(1, ts=T0, life_s=10.0), T0)
    cache.apply(None, _result(2, ts=T0, life_s=100.0), T0)
    key = messages.precompute_key(REGION, 1)
    cache.apply(key, None, T0 + 10.5)  # the worker's tombstone, after the expiry
    cache.apply(messages.precompute_key(REGION, 2), None, T0 + 11.0)  # deleted while valid
    window = cache.take_window()
    assert window["expired_unused"] == 1
    assert cache.store.counts.deleted_unused == 1
