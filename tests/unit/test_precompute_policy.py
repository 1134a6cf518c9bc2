"""The precompute policy core: expiry, visit model, gains, the planner, the budget, capacity.

Everything runs on given times and an injected generator; the properties that the issue asks
for are here: no job ever runs on capacity the strong model cannot use (or on dedicated
capacity), no live-path work is ever allowed on a ``remote`` pool, and a reclaim stops jobs at
once with every stopped job counted.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import integrate

from headroom.controllers.levers import CapacityUse, CostModel, ResourceCost
from headroom.controllers.precompute import (
    PrecomputeConfig,
    PrecomputePlanner,
    UpliftModel,
    UserBook,
    VisitModel,
    job_cost,
    own_rate,
    visit_probability,
)
from headroom.controllers.precompute_jobs import JobBook, TokenBucket, eligible_pool, usable_pools
from headroom.controllers.types import CapacityLevel
from headroom.kernel.errors import ConfigError
from headroom.kernel.scenario_load import load_scenario

REPO = Path(__file__).resolve().parents[2]
STRONG_HW = ("gpu-b",)
COSTS = CostModel(
    base_cpu_ms=0.1,
    base_accelerator_ms=0.02,
    strong_cpu_ms=0.005,
    strong_accelerator_ms=0.1,
    base_candidates=400,
    base_hardware=("gpu-a", "gpu-b"),
    strong_hardware=STRONG_HW,
    strong_load_s=120.0,
)
HOUR = 3600.0


def config(**overrides: object) -> PrecomputeConfig:
    base: dict[str, object] = {
        "costs": COSTS,
        "candidates": 400,
        "segment_names": ("premium", "casual"),
        "segment_values": (3.0, 0.6),
        "return_rates_per_h": (6.0, 2.0),
    }
    base.update(overrides)
    return PrecomputeConfig(**base)  # type: ignore[arg-type]


def linear_uplift(cfg: PrecomputeConfig, slope_per_h: float = 0.1) -> UpliftModel:
    """Stored quality 1 − slope·age/h, fresh 1, live baseline 0.8 in both segments."""
    ages = [0.0, 4 * HOUR, 8 * HOUR]
    decay = [[1.0 - slope_per_h * a / HOUR for a in ages]] * 2
    return UpliftModel.from_tables(cfg, [1.0, 1.0], [0.8, 0.8], ages, decay)


def planner(cfg: PrecomputeConfig | None = None, seed: int = 1, **kw: object) -> PrecomputePlanner:
    cfg = cfg or config(**kw)
    return PrecomputePlanner(cfg, linear_uplift(cfg), np.random.default_rng(seed))


# -- configuration -------------------------------------------------------------------------------


def test_config_rejects_bad_values_naming_each_field() -> None:
    with pytest.raises(ConfigError) as err:
        config(max_ttl_s=-1.0, explore_share=2.0, candidates=0, keep=0)
    text = "\n".join(err.value.problems)
    for name in ("max_ttl_s", "explore_share", "candidates", "keep"):
        assert f"precompute.{name}:" in text


def test_config_from_scenario_reads_rates_values_and_rejects_unknown_settings() -> None:
    scenario = load_scenario(REPO / "scenarios" / "precompute-remote.yaml")
    cfg = PrecomputeConfig.from_scenario(scenario, visit_model="gamma_poisson")
    assert cfg.return_rates_per_h == (6.0, 3.0)
    assert cfg.segment_values == (3.0, 0.6)
    assert cfg.candidates == scenario.world.base_candidates
    assert cfg.visit_model is VisitModel.GAMMA_POISSON
    with pytest.raises(ConfigError, match=r"precompute\.no_such_knob: unknown setting"):
        PrecomputeConfig.from_scenario(scenario, no_such_knob=1)


def test_job_cost_is_a_strong_model_request_and_own_rate_converts_by_the_binding_resource() -> None:
    one = job_cost(COSTS, 400)
    assert one == COSTS.precompute_per_job
    assert one.accelerator_s == pytest.approx(400 * 0.1 / 1000)
    triple = job_cost(COSTS, 1200)
    assert own_rate(30.0, one, triple) == pytest.approx(10.0)
    assert own_rate(30.0, one, one) == pytest.approx(30.0)
    assert own_rate(0.0, one, triple) == 0.0
    assert own_rate(math.nan, one, triple) == 0.0


# -- visits --------------------------------------------------------------------------------------


@given(
    r=st.floats(0.0, 10.0, allow_nan=False),
    h=st.floats(0.0, 1e5, allow_nan=False),
    dh=st.floats(0.0, 1e4, allow_nan=False),
)
def test_visit_probability_is_poisson_and_monotone(r: float, h: float, dh: float) -> None:
    p = float(visit_probability(r / HOUR, h))
    assert p == pytest.approx(1.0 - math.exp(-r * h / HOUR), abs=1e-12)
    assert 0.0 <= p <= 1.0
    assert float(visit_probability(r / HOUR, h + dh)) >= p


def test_gamma_poisson_rate_is_the_posterior_mean_and_grows_with_visits() -> None:
    p = planner(visit_model=VisitModel.GAMMA_POISSON, rate_shape=2.0)
    p.users.observe(1, 1, 0.0)  # one visit
    for t in (10.0, 20.0, 30.0):  # four visits in all
        p.users.observe(2, 1, t)
    p.users.observe(2, 1, 0.0)
    rates = p.rates(now=HOUR)
    r = 2.0 / HOUR
    k = 2.0
    assert rates[p.users.slot(1)] == pytest.approx((k + 1) / (k / r + HOUR))
    assert rates[p.users.slot(2)] == pytest.approx((k + 4) / (k / r + HOUR))
    plain = planner()
    plain.users.observe(2, 1, 0.0)
    assert plain.rates(HOUR)[0] == pytest.approx(r)


# -- uplift and expiry ---------------------------------------------------------------------------


def test_lifetime_is_where_the_stored_value_falls_to_the_live_one() -> None:
    cfg = config()
    up = linear_uplift(cfg, slope_per_h=0.1)  # 1 − 0.1·a/h meets 0.8 at 2 h
    assert up.lifetime(0) == pytest.approx(2 * HOUR, rel=1e-3)
    # Δ(a) = v·(0.2 − 0.1 a/h): F(L) = v·(0.2·L − 0.05·L²/h)
    f = 3.0 * (0.2 * 2 * HOUR - 0.05 * (2 * HOUR) ** 2 / HOUR)
    assert float(up.integral(0, 2 * HOUR)) == pytest.approx(f, rel=1e-3)
    assert float(up.integral(0, 10 * HOUR)) == pytest.approx(f, rel=1e-3)  # flat beyond L


def test_margin_shortens_the_lifetime_and_a_segment_without_uplift_is_never_kept() -> None:
    cfg = config(expiry_margin=0.05)
    assert linear_uplift(cfg).lifetime(1) == pytest.approx(1.5 * HOUR, rel=1e-3)
    flat = UpliftModel.from_tables(
        cfg, [0.9, 0.8], [0.8, 0.8], [0.0, HOUR], [[1.0, 1.0], [1.0, 1.0]]
    )
    assert flat.lifetime(0) == pytest.approx(cfg.max_ttl_s)  # no drift: the cap decides
    assert flat.lifetime(1) == 0.0  # strong no better than live + margin: off


def test_with_measured_rescales_a_segment_but_keeps_its_lifetime() -> None:
    cfg = config()
    up = linear_uplift(cfg)
    half = float(up.uplift(1, 600.0)) / 2
    scaled = up.with_measured(1, half, 600.0)
    assert float(scaled.uplift(1, 600.0)) == pytest.approx(half)
    assert scaled.lifetime(1) == up.lifetime(1)
    assert float(scaled.uplift(0, 600.0)) == float(up.uplift(0, 600.0))
    off = up.with_measured(1, -0.1, 600.0)
    assert float(off.integral(1, HOUR)) == 0.0


def test_from_curves_uses_the_measured_decay_of_the_world() -> None:
    from headroom.world.curves import ValueCurves

    curves = ValueCurves(
        segments=("premium", "casual"),
        n_grid=np.array([400, 1200]),
        mean=np.array([[[0.80, 0.82], [0.60, 0.62]], [[0.90, 0.93], [0.85, 0.90]]]),
        std=np.full((2, 2, 2), 0.1),
        age_grid_s=np.array([0.0, HOUR, 2 * HOUR]),
        precompute_mean=np.array([[0.93, 0.87, 0.81], [0.90, 0.85, 0.80]]),
        precompute_std=np.full((2, 3), 0.1),
        precompute_n=1200,
        samples_per_segment=64,
    )
    cfg = config(candidates=1200)
    up = UpliftModel.from_curves(curves, cfg)
    # premium: 0.93 · ρ(a) = 0.80 with ρ falling 0.06/0.93 per hour → at 13/6 h… capped by the grid
    assert float(up.uplift(0, 0.0)) == pytest.approx(3.0 * (0.93 - 0.80))
    assert float(up.uplift(1, HOUR)) == pytest.approx(0.6 * (0.85 - 0.60))
    # n = 400 candidates: fresh quality 0.90, same relative decay
    up400 = UpliftModel.from_curves(curves, config(candidates=400))
    assert float(up400.uplift(0, HOUR)) == pytest.approx(3.0 * (0.90 * 0.87 / 0.93 - 0.80))


# -- gains and the planner -----------------------------------------------------------------------


def test_gain_of_an_uncovered_user_is_the_expected_value_over_every_visit_in_the_lifetime() -> None:
    p = planner()
    p.users.observe(7, 1, 0.0)
    gain, eligible, lam = p.gains(now=100.0)
    life = p.uplift.lifetime(1)
    expected, _ = integrate.quad(lambda a: float(p.uplift.uplift(1, a)), 0.0, life, limit=200)
    assert eligible[0]
    assert gain[0] == pytest.approx(lam[0] * expected, rel=1e-3)


def test_refreshing_gains_only_what_the_stored_result_lost_and_waits_for_refresh_after() -> None:
    p = planner(refresh_after=0.25)
    life = p.uplift.lifetime(1)
    for user in range(4):
        p.users.observe(user, 1, 0.0)
    now = 10 * HOUR
    ages = [0.1 * life, 0.3 * life, 0.6 * life]
    for user, age in enumerate(ages):
        p.users.set_stored(user, now - age, now - age + life)
    gain, eligible, lam = p.gains(now)
    slots = [p.users.slot(u) for u in range(4)]
    assert not eligible[slots[0]]  # younger than refresh_after · L
    assert eligible[slots[1]]
    assert eligible[slots[2]]
    for user, age in enumerate(ages):
        assert gain[slots[user]] == pytest.approx(lam[0] * float(p.uplift.integral(1, age)))
    assert gain[slots[1]] < gain[slots[2]] < gain[slots[3]]  # user 3 has no result at all


def test_select_takes_the_best_gains_skips_inflight_and_never_picks_a_worthless_segment() -> None:
    cfg = config(segment_values=(3.0, 0.6), return_rates_per_h=(0.0, 2.0))
    p = planner(cfg)
    for user in range(100):
        p.users.observe(user, user % 2, float(user))  # even users premium (never return)
    p.users.set_inflight(1, True)
    picks = p.select(now=200.0, k=10)
    assert len(picks) == 10
    assert all(pick.segment == 1 for pick in picks)
    assert 1 not in {pick.user for pick in picks}
    assert [x.gain for x in picks] == sorted((x.gain for x in picks), reverse=True)
    assert len({pick.user for pick in picks}) == 10
    assert p.select(now=200.0, k=1000)[-1].segment == 1  # only 49 casual users are eligible
    assert len(p.select(now=200.0, k=1000)) == 49


def test_select_prefers_the_segment_whose_visits_are_worth_more() -> None:
    cfg = config(segment_values=(3.0, 0.6), return_rates_per_h=(6.0, 2.0))
    p = planner(cfg)
    for user in range(40):
        p.users.observe(user, user % 2, 0.0)
    picks = p.select(now=10.0, k=20)
    assert {pick.segment for pick in picks} == {0}  # 3.0 × 6/h beats 0.6 × 2/h
    assert picks[0].visit_probability == pytest.approx(
        1 - math.exp(-6.0 * p.uplift.lifetime(0) / HOUR)
    )


def test_exploration_draws_the_given_share_uniformly() -> None:
    p = planner(explore_share=0.5, return_rates_per_h=(6.0, 2.0))
    for user in range(200):
        p.users.observe(user, user % 2, 0.0)
    picks = p.select(now=10.0, k=20)
    assert len(picks) == 20
    explored = [x for x in picks if x.explored]
    assert len(explored) == 10
    assert any(x.segment == 1 for x in explored)  # greedy picks are all premium


def test_the_same_seed_selects_the_same_users_and_a_restored_planner_continues_exactly() -> None:
    def filled(seed: int) -> PrecomputePlanner:
        p = planner(seed=seed)
        for user in range(500):
            p.users.observe(user, 1, float(user))
        return p

    a, b = filled(3), filled(3)
    assert [x.user for x in a.select(600.0, 20)] == [x.user for x in b.select(600.0, 20)]
    snap = a.snapshot()
    first = [x.user for x in a.select(700.0, 20)]
    c = planner(seed=99)
    c.restore(snap)
    assert [x.user for x in c.select(700.0, 20)] == first
    assert [x.user for x in filled(4).select(600.0, 20)] != [
        x.user for x in filled(3).select(600.0, 20)
    ]


def test_user_book_is_bounded_and_evicts_the_least_recently_seen() -> None:
    book = UserBook(max_users=32, initial=4)
    for user in range(32):
        book.observe(user, 0, float(user))
    book.observe(0, 0, 100.0)  # user 0 is recent again
    book.observe(1000, 0, 101.0)  # full: the least recent sixteenth (2 users) makes room
    assert len(book) == 31
    assert book.evicted == 2
    assert 1 not in book
    assert 2 not in book
    assert 0 in book
    assert 1000 in book
    restored = UserBook(max_users=32)
    restored.restore(book.snapshot())
    assert len(restored) == len(book)
    assert restored.slot(1000) == book.slot(1000)


# -- budget --------------------------------------------------------------------------------------


@given(
    rate=st.floats(0.0, 500.0),
    burst=st.floats(0.01, 5.0),
    steps=st.lists(st.tuples(st.floats(0.0, 2.0), st.integers(0, 1000)), max_size=50),
)
def test_token_bucket_never_allows_more_than_rate_times_time_plus_its_depth(
    rate: float, burst: float, steps: list[tuple[float, int]]
) -> None:
    bucket = TokenBucket(rate, burst, now=0.0)
    t = 0.0
    taken = 0
    for dt, want in steps:
        t += dt
        n = min(bucket.available(t), want)
        bucket.take(n)
        taken += n
        assert taken <= rate * t + bucket.depth + 1e-6


# -- capacity ------------------------------------------------------------------------------------

levels = st.builds(
    CapacityLevel,
    resource=st.sampled_from(["cpu", "accelerator"]),
    hardware=st.sampled_from(["any", "gpu-a", "gpu-b", "tpu-x"]),
    pool=st.sampled_from(["opportunistic", "dedicated"]),
    units=st.floats(0.0, 16.0),
    expires_in_s=st.one_of(st.none(), st.floats(1.0, 3600.0)),
    remote=st.booleans(),
    ts=st.floats(0.0, 100.0),
)


@given(capacity=st.lists(levels, max_size=12))
def test_live_work_never_gets_a_remote_pool_and_precompute_only_strong_hardware(
    capacity: list[CapacityLevel],
) -> None:
    live = usable_pools(
        capacity, 100.0, use=CapacityUse.LIVE, hardware=None, min_lifetime_s=0.0, safety_margin=0.1
    )
    assert not any(p.remote for p in live)
    pre = usable_pools(
        capacity,
        100.0,
        use=CapacityUse.ASYNC,
        hardware=STRONG_HW,
        min_lifetime_s=0.0,
        safety_margin=0.1,
    )
    opportunistic = {(c.resource, c.hardware, c.remote) for c in capacity if c.pool != "dedicated"}
    for pool in pre:
        assert (pool.resource, pool.hardware, pool.remote) in opportunistic
        assert pool.resource == "cpu" or pool.hardware in STRONG_HW
        assert pool.units > 0.0
    # remote pools are the asynchronous lever's: the same filter with ASYNC keeps them
    remote_ok = [
        p
        for p in usable_pools(
            capacity,
            100.0,
            use=CapacityUse.ASYNC,
            hardware=None,
            min_lifetime_s=0.0,
            safety_margin=0.1,
        )
        if p.remote
    ]
    for p in remote_ok:
        assert eligible_pool(p, use=CapacityUse.ASYNC, hardware=None, min_lifetime_s=0.0)
        assert not eligible_pool(p, use=CapacityUse.LIVE, hardware=None, min_lifetime_s=0.0)


@settings(max_examples=60)
@given(
    capacity=st.lists(levels, min_size=1, max_size=10),
    reclaims=st.lists(st.tuples(st.integers(0, 9), st.floats(0.0, 8.0)), max_size=6),
    batches=st.lists(st.integers(0, 400), min_size=1, max_size=5),
)
def test_jobs_run_only_on_strong_hardware_within_units_and_reclaims_stop_them_counted(
    capacity: list[CapacityLevel], reclaims: list[tuple[int, float]], batches: list[int]
) -> None:
    cost = job_cost(COSTS, 400)
    book = JobBook(cost, duration_s=1.0)

    def pools(levels_: list[CapacityLevel], now: float) -> list:  # type: ignore[type-arg]
        return usable_pools(
            levels_,
            now,
            use=CapacityUse.ASYNC,
            hardware=STRONG_HW,
            min_lifetime_s=0.0,
            safety_margin=0.1,
        )

    def check() -> None:
        used = book.in_use()
        for key, load in used.items():
            pool = book.pools.get(key)
            assert pool is not None
            assert load <= pool.units + 1e-6
        for job in book.jobs.values():
            assert job.accelerator_pool is not None
            assert job.accelerator_pool[1] in STRONG_HW
            assert job.cpu_pool is not None
            assert job.cpu_pool[0] == "cpu"

    t = 0.0
    book.set_pools(pools(capacity, t), t)
    user = 0
    for i, n in enumerate(batches):
        t += 0.3
        room = book.capacity()
        started = book.start(t, [(user + j, 0) for j in range(n)])
        user += n
        assert len(started) == min(n, room)
        check()
        if i < len(reclaims):
            idx, units = reclaims[i]
            level = capacity[idx % len(capacity)]
            lower = min(units, level.units)
            capacity = [  # newer than every generated level (ts ≤ 100): it wins
                *capacity,
                CapacityLevel(
                    level.resource, level.hardware, level.pool, lower, None, level.remote, 100 + t
                ),
            ]
            book.set_pools(pools(capacity, t), t)
            check()
        book.due(t)
    s = book.stats
    assert s.started == s.completed + s.stopped + len(book.jobs)


def test_a_reclaim_stops_the_newest_jobs_first_and_charges_only_what_they_ran() -> None:
    cost = ResourceCost(cpu_s=0.0, accelerator_s=0.5)  # half a device for one second
    book = JobBook(cost, duration_s=1.0)
    level = CapacityLevel("accelerator", "gpu-b", "opportunistic", 2.0, None, True, 0.0)
    pools = usable_pools(
        [level],
        0.0,
        use=CapacityUse.ASYNC,
        hardware=STRONG_HW,
        min_lifetime_s=0.0,
        safety_margin=0.0,
    )
    book.set_pools(pools, 0.0)
    first = book.start(0.0, [(1, 0), (2, 0)])
    second = book.start(0.5, [(3, 0), (4, 0), (5, 0)])
    assert len(first) == 2
    assert len(second) == 2  # 4 × 0.5 = 2 devices: full
    half = CapacityLevel("accelerator", "gpu-b", "opportunistic", 1.0, None, True, 0.7)
    stopped = book.set_pools(
        usable_pools(
            [half],
            0.7,
            use=CapacityUse.ASYNC,
            hardware=STRONG_HW,
            min_lifetime_s=0.0,
            safety_margin=0.0,
        ),
        0.7,
    )
    assert sorted(j.user for j in stopped) == [3, 4]
    assert book.stats.stopped == 2
    assert book.stats.accelerator_unit_s == pytest.approx(2 * 0.5 * 0.2)
    done = book.due(1.0)
    assert sorted(j.user for j in done) == [1, 2]
    assert book.stats.accelerator_unit_s == pytest.approx(0.2 + 2 * 0.5 * 1.0)


def test_no_job_starts_on_a_pool_that_ends_before_the_job_would() -> None:
    book = JobBook(job_cost(COSTS, 400), duration_s=2.0)
    short = [
        CapacityLevel("accelerator", "gpu-b", "opportunistic", 4.0, 1.0, True, 0.0),
        CapacityLevel("cpu", "any", "opportunistic", 4.0, None, True, 0.0),
    ]
    book.set_pools(
        usable_pools(
            short,
            0.0,
            use=CapacityUse.ASYNC,
            hardware=STRONG_HW,
            min_lifetime_s=0.0,
            safety_margin=0.0,
        ),
        0.0,
    )
    assert book.capacity() == 0
    assert book.start(0.0, [(1, 0)]) == []


def test_job_book_snapshot_restores_jobs_pools_and_counters() -> None:
    book = JobBook(job_cost(COSTS, 400), duration_s=1.0)
    caps = [
        CapacityLevel("accelerator", "gpu-b", "opportunistic", 2.0, None, True, 0.0),
        CapacityLevel("cpu", "any", "opportunistic", 2.0, None, False, 0.0),
    ]
    book.set_pools(
        usable_pools(
            caps,
            0.0,
            use=CapacityUse.ASYNC,
            hardware=STRONG_HW,
            min_lifetime_s=0.0,
            safety_margin=0.0,
        ),
        0.0,
    )
    book.start(0.0, [(u, 1) for u in range(10)])
    restored = JobBook(book.cost, book.duration_s)
    restored.restore(book.snapshot())
    assert restored.jobs == book.jobs
    assert restored.pools == book.pools
    assert restored.stats == book.stats
    assert restored.capacity() == book.capacity()


def test_against_live_keeps_a_result_only_while_it_beats_the_live_alternative() -> None:
    cfg = config()
    up = linear_uplift(cfg)  # Δ(a) = v·(0.2 − 0.1·a/h): premium v = 3, casual v = 0.6
    assert up.against_live([0.0, 0.0]) is up
    live = up.against_live([0.3, 0.0])  # premium: 3·(0.2 − 0.1·a/h) meets 0.3 at 1 h
    assert live.lifetime(0) == pytest.approx(HOUR, rel=1e-3)
    assert live.lifetime(1) == up.lifetime(1)
    assert float(live.uplift(0, 0.0)) == pytest.approx(float(up.uplift(0, 0.0)) - 0.3)
    # F(L) = 3·(0.1·L − 0.05·L²/h) at L = 1 h
    assert float(live.integral(0, 10 * HOUR)) == pytest.approx(3 * 0.05 * HOUR, rel=1e-3)
    # casual: a fresh result adds 0.6·0.2 = 0.12, the live levers 0.13: never precomputed
    off = up.against_live([0.0, 0.13])
    assert off.lifetime(1) == 0.0
    assert float(off.integral(1, 10 * HOUR)) == 0.0
    p = PrecomputePlanner(cfg, off, np.random.default_rng(3))
    for u in range(20):
        p.users.observe(u, u % 2, 0.0)
    picks = p.select(60.0, 20)
    assert picks
    assert {pk.segment for pk in picks} == {0}
    with pytest.raises(ValueError, match="one live alternative per segment"):
        up.against_live([0.1])


def test_rma_live_alternative_is_the_mean_over_value_bins_of_value_times_the_curves_gain() -> None:
    from headroom.controllers.levers import RmaCurve
    from headroom.controllers.precompute import rma_live_alternative

    curve = RmaCurve((0, 400, 800), {"premium": (0.0, 0.04, 0.06), "casual": (0.0, 0.01, 0.02)})
    got = rma_live_alternative(
        curve,
        ("premium", "casual", "other"),
        {"premium": (0, 800)},
        {"premium": (1.0, 5.0), "casual": (0.5, 1.5)},
        mean_extras=400.0,
    )
    # premium: (1·0 + 5·0.06)/2; casual, no levels: every bin at 400 extras, (0.5 + 1.5)·0.01/2
    assert got.tolist() == pytest.approx([0.15, 0.01, 0.0])
