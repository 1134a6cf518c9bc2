"""Allocator: exact LP, hardware, durability, remote pools, caps, safety margin, fallback."""

from __future__ import annotations

import math
from unittest import mock

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from scipy.optimize import linprog

from headroom.controllers import allocator as allocator_module
from headroom.controllers.allocator import (
    Allocator,
    FallbackReason,
    pools_from_capacity,
    solve_lp,
)
from headroom.controllers.config import AllocatorSettings, ValueSettings
from headroom.controllers.levers import (
    CostModel,
    Lever,
    LeverContext,
    LeverRegistry,
    ResourceCost,
    RmaLever,
    SbmLever,
    Tranche,
    ValueBook,
    ValueEstimate,
)
from headroom.controllers.observe import RegionAggregator
from headroom.controllers.testing import arm_stats, capacity
from headroom.controllers.types import CapacityLevel

COSTS = CostModel(0.1, 0.02, 0.005, 0.1, 400, ("gpu-a", "gpu-b"), ("gpu-b",), 120.0)
CTX = LeverContext(request_rps=300.0, eligible_rps=300.0, rma_extra_candidates=200.0)
LEVERS = LeverRegistry.standard(COSTS, 400, 1200, precompute=True)


def treated_cost(lever: str, n: int, extra: float = 200.0) -> tuple[float, float]:
    """The ``cost`` (CPU ms, accelerator ms) the live levers' signals carry for ``n`` treated
    requests: RMA's ``extra`` candidates each, SBM's strong ranking; precompute's carry none."""
    if lever == "rma":
        return n * extra * COSTS.base_cpu_ms, n * extra * COSTS.base_accelerator_ms
    if lever == "sbm":
        k = n * COSTS.base_candidates
        return k * COSTS.strong_cpu_ms, k * COSTS.strong_accelerator_ms
    return 0.0, 0.0


def book_of(spec: dict[str, tuple[float, int]], seed: int = 0) -> ValueBook:
    """A book where each lever's treatment beats control by ``d`` per request, ``n`` requests
    an arm (``spec[lever] = (d, n)``: fewer requests, a wider interval)."""
    rng = np.random.default_rng(seed)
    book = ValueBook()
    for lever, (d, n) in spec.items():
        book.add(
            {
                ("casual", lever, "treatment"): arm_stats(
                    rng, n, 1.0 + d, 0.5, *treated_cost(lever, n)
                ),
                ("casual", lever, "control"): arm_stats(rng, n, 1.0, 0.5),
            }
        )
    return book


def book_with(uplift: dict[str, float], n: int = 2000, seed: int = 0) -> ValueBook:
    """A book where each lever's treatment beats control by ``uplift[lever]`` per request."""
    return book_of({lever: (d, n) for lever, d in uplift.items()}, seed)


PROVEN = book_with({"rma": 0.1, "sbm": 0.3, "precompute": 0.2})


def allocator(**kw: object) -> Allocator:
    return Allocator(AllocatorSettings(**kw), ValueSettings(), LEVERS)  # type: ignore[arg-type]


def use_of(alloc, lever: str) -> dict[int, float]:
    out: dict[int, float] = {}
    for name, i, units in alloc.pool_use:
        if name == lever:
            out[i] = out.get(i, 0.0) + units
    return out


# -- the LP solver ---------------------------------------------------------------------------


@settings(max_examples=200, deadline=None)
@given(
    shape=st.tuples(st.integers(1, 8), st.integers(1, 8)),
    data=st.data(),
)
def test_simplex_matches_scipy_on_random_nonnegative_programs(shape, data) -> None:
    m, n = shape
    coef = st.floats(0.0, 10.0, allow_nan=False).map(lambda x: 0.0 if x < 1.0 else x)
    a = np.array(
        data.draw(st.lists(st.lists(coef, min_size=n, max_size=n), min_size=m, max_size=m))
    )
    b = np.array(data.draw(st.lists(st.floats(0.0, 100.0), min_size=m, max_size=m)))
    # objective coefficients 0 or at least 0.01 in size: HiGHS treats smaller reduced costs as
    # zero (its dual tolerance), and this test is about the pivots, not about tolerances
    obj_coef = st.floats(-5.0, 5.0).map(lambda x: 0.0 if abs(x) < 0.01 else x)
    c = np.array(data.draw(st.lists(obj_coef, min_size=n, max_size=n)))
    # every variable must be bounded by some row, as in the allocator (demand rows)
    a = np.vstack([a, np.ones((1, n))])
    b = np.append(b, data.draw(st.floats(0.0, 100.0)))
    x, obj = solve_lp(c, a, b)
    ref = linprog(-c, A_ub=a, b_ub=b, bounds=[(0, None)] * n, method="highs")
    assert ref.status == 0
    # HiGHS itself is only feasible to ~1e-7 absolute, hence the absolute tolerance
    assert obj == pytest.approx(-ref.fun, rel=1e-7, abs=1e-6)
    assert np.all(x >= 0.0)
    assert np.all(a @ x <= b + 1e-7 * (1 + np.abs(b)))
    assert float(c @ x) == pytest.approx(obj, rel=1e-7, abs=1e-7)


def _program(data: st.DataObject, m: int, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A random allocator-like program: sparse non-negative rows, limits that are often 0 or
    tiny (what the LPs of a region look like once a lever's demand is met or a pool is spent)
    and a demand row bounding every variable."""
    coef = st.floats(0.0, 10.0, allow_nan=False).map(lambda x: 0.0 if x < 5.0 else x)
    a = np.array(
        data.draw(st.lists(st.lists(coef, min_size=n, max_size=n), min_size=m, max_size=m))
    )
    limit = st.one_of(st.just(0.0), st.just(1e-16), st.floats(0.0, 100.0))
    b = np.array(data.draw(st.lists(limit, min_size=m + 1, max_size=m + 1)))
    c = np.array(data.draw(st.lists(st.floats(-1.0, 5.0), min_size=n, max_size=n)))
    return c, np.vstack([a, np.ones((1, n))]), b


@settings(max_examples=150, deadline=None)
@given(shape=st.tuples(st.integers(1, 30), st.integers(1, 30)), data=st.data())
def test_simplex_shortcuts_change_no_pivot(shape, data) -> None:
    """The origin returned without a tableau, and a tableau updated whole or only where the
    pivot row and column are non-zero: the simplex's own result, to the last bit."""
    c, a, b = _program(data, *shape)
    got = solve_lp(c, a, b)
    with mock.patch.object(allocator_module, "_held_at_zero", return_value=False):
        with mock.patch.object(allocator_module, "_WHOLE_TABLEAU", 0):
            sparse = solve_lp(c, a, b)
        with mock.patch.object(allocator_module, "_WHOLE_TABLEAU", 10**9):
            whole = solve_lp(c, a, b)
    for x, obj in (sparse, whole):
        assert np.array_equal(x, got[0])
        assert obj == got[1]


def test_simplex_does_not_mistake_tiny_values_for_zero() -> None:
    # an LCB of 1e-7 per candidate times 1e-4 core-seconds per candidate: 1e-11 per unit,
    # far below the pivot tolerance unless the objective is scaled first
    a = np.array([[1.0, 1.0], [1.0, 0.0], [0.0, 1.0]])
    b = np.array([1.0, 10.0, 10.0])
    x, obj = solve_lp([1e-11, 2e-11], a, b)
    assert x == pytest.approx([0.0, 1.0])
    assert obj == pytest.approx(2e-11)


def test_simplex_finds_an_interior_split_a_greedy_would_miss() -> None:
    # two levers each using both resources: the optimum uses both, any priority order does not
    a = np.array([[1.0, 2.0], [2.0, 1.0], [1.0, 0.0], [0.0, 1.0]])
    b = np.array([10.0, 10.0, 100.0, 100.0])
    x, obj = solve_lp([3.0, 3.0], a, b)
    assert obj == pytest.approx(20.0)
    assert x == pytest.approx([10 / 3, 10 / 3])


# -- the rules -------------------------------------------------------------------------------

levels = st.builds(
    CapacityLevel,
    resource=st.sampled_from(["cpu", "accelerator"]),
    hardware=st.sampled_from(["any", "gpu-a", "gpu-b", "gpu-c"]),
    pool=st.sampled_from(["opportunistic", "opportunistic", "dedicated"]),
    units=st.floats(0.0, 64.0, allow_nan=False),
    expires_in_s=st.one_of(st.none(), st.floats(0.0, 7200.0)),
    remote=st.booleans(),
    ts=st.just(0.0),
)
uplifts = st.fixed_dictionaries(
    {
        "rma": st.floats(-0.2, 0.5),
        "sbm": st.floats(-0.2, 0.5),
        "precompute": st.floats(-0.2, 0.5),
    }
)


@settings(max_examples=250, deadline=None)
@given(
    cap=st.lists(levels, max_size=6),
    up=uplifts,
    n=st.integers(0, 3000),
    rps=st.floats(0.0, 1e5),
    age=st.one_of(st.none(), st.floats(0.0, 1000.0)),
    max_share=st.floats(0.1, 1.0),
)
@example(  # found by hypothesis: a subnormal request rate demands nothing
    cap=[
        CapacityLevel("cpu", "any", "opportunistic", 1.0, None, remote=True, ts=0.0),
        CapacityLevel("accelerator", "gpu-b", "opportunistic", 1.0, None, remote=True, ts=0.0),
    ],
    up={"rma": 0.0, "sbm": 0.0, "precompute": 0.0},
    n=0,
    rps=5e-324,
    age=None,
    max_share=1.0,
)
@example(  # found by hypothesis: the strong model's one hold of a pool below a device is the
    # whole pool (0.9 units after the margin), above its cap of half of it
    cap=[
        *[CapacityLevel("cpu", "any", "opportunistic", 1.0, None, remote=False, ts=0.0)] * 5,
        CapacityLevel("accelerator", "gpu-b", "opportunistic", 1.0, None, remote=False, ts=0.0),
    ],
    up={"rma": 0.0, "sbm": 0.5, "precompute": 0.0},
    n=30,
    rps=1.0,
    age=0.0,
    max_share=0.5,
)
def test_every_allocation_respects_hardware_durability_remote_caps_and_pools(
    cap, up, n, rps, age, max_share
) -> None:
    alloc_ = allocator(max_share=max_share)
    ctx = LeverContext(rps, rps * 0.9, 100.0, 0.0)
    a = alloc_.allocate(cap, 0.0, ctx, book_with(up, n=n), age)
    per_pool = check_pool_rules(alloc_, a)
    for name, rate in a.rates.items():
        assert rate <= LEVERS[name].demand(ctx) * (1 + 1e-7) + 1e-9
    check_precompute_not_left_short(alloc_, a, ctx, per_pool)
    if a.fallback is None:
        check_share_caps(alloc_, a, ctx, max_share)


def check_pool_rules(alloc_: Allocator, a) -> dict[int, float]:
    """Every pool use is of an eligible pool (hardware, durability, never remote for the live
    levers) and no pool gives more than its safe units; returns the units used per pool."""
    pools = a.pools
    per_pool: dict[int, float] = {}
    for name, i, units in a.pool_use:
        p = pools[i]
        lever = LEVERS[name]
        assert units >= 0.0
        assert alloc_.eligible(lever, p), (name, p)
        if name in ("sbm", "precompute") and p.resource == "accelerator":
            assert p.hardware in COSTS.strong_hardware
        if name == "sbm":
            assert p.lifetime_s >= COSTS.strong_load_s
        if name in ("rma", "sbm"):
            assert not p.remote
        per_pool[i] = per_pool.get(i, 0.0) + units
    for i, used in per_pool.items():
        assert used <= pools[i].announced * (1 - alloc_.settings.safety_margin) * (1 + 1e-7) + 1e-9
    return per_pool


def check_precompute_not_left_short(
    alloc_: Allocator, a, ctx: LeverContext, per_pool: dict[int, float]
) -> None:
    """Precompute being measured is never left short while a remote pair it may use is idle."""
    pre = LEVERS["precompute"]
    # a demand of a subnormal rate (rps 5e-324) is nothing: an absolute tolerance as well
    short = a.rates.get("precompute", 0.0) < pre.demand(ctx) * (1 - 1e-6) - 1e-9
    if not ("precompute" in a.explored and short):
        return
    settings_ = alloc_.settings

    def idle(p, i) -> bool:
        return (
            p.remote
            and p.units >= settings_.min_pool_units
            and alloc_.eligible(pre, p)
            and p.units - per_pool.get(i, 0.0) > 1e-6 * max(p.units, 1.0)
        )

    pools = a.pools
    idle_cpu = [i for i, p in enumerate(pools) if p.resource == "cpu" and idle(p, i)]
    idle_acc = [i for i, p in enumerate(pools) if p.resource != "cpu" and idle(p, i)]
    assert not (idle_cpu and idle_acc), (idle_cpu, idle_acc, a)


def check_share_caps(alloc_: Allocator, a, ctx: LeverContext, max_share: float) -> None:
    """Without a fallback, a proven lever takes at most ``max_share`` of a pool that another
    runnable lever could also use — or, where that is less, the one hold its replicas need
    there (:meth:`Allocator.need`: a strong replica's whole device, or the whole pool when it
    is smaller): the whole-device rule is physical, the cap is not."""
    pools = a.pools
    usable = [p.units >= alloc_.settings.min_pool_units for p in pools]

    def uses(lv, p) -> bool:
        cost = lv.unit_cost()
        need = cost.cpu_s if p.resource == "cpu" else cost.accelerator_s
        return need > 0 and alloc_.eligible(lv, p)

    def runnable(lv) -> bool:  # has a usable pool of every resource it needs
        cost = lv.unit_cost()
        return lv.demand(ctx) > 0 and all(
            any(usable[i] and p.resource == res and uses(lv, p) for i, p in enumerate(pools))
            for res, need in (("cpu", cost.cpu_s), ("accelerator", cost.accelerator_s))
            if need > 0
        )

    contested = {
        i
        for i, p in enumerate(pools)
        if sum(1 for lv in LEVERS if runnable(lv) and uses(lv, p)) >= 2
    }
    for name in a.rates:
        if name in a.explored:
            continue
        for i, used in use_of(a, name).items():
            if i in contested:
                room = max(max_share * pools[i].units, alloc_.need(LEVERS[name], pools[i]))
                assert used <= room * (1 + 1e-7) + 1e-9, (name, used, room)


def test_rma_runs_only_where_cpu_and_accelerator_budget_both_exist() -> None:
    a = allocator().allocate(capacity(cpu=8.0), 0.0, CTX, PROVEN, 10.0)
    assert a.rates == {}  # CPU alone serves no lever here: all need an accelerator
    a = allocator().allocate(capacity(accelerator=4.0), 0.0, CTX, PROVEN, 10.0)
    assert a.budget("rma") == (0.0, 0.0)


def test_a_cpu_starved_region_gives_its_accelerators_to_sbm() -> None:
    # SBM needs 2 ms of CPU per request (400 × 0.005 ms), RMA 0.1 ms per extra candidate
    levers = LeverRegistry.standard(COSTS, 400, 1200)
    alloc_ = Allocator(AllocatorSettings(), ValueSettings(), levers)
    a = alloc_.allocate(capacity(cpu=0.5, accelerator=4.0), 0.0, CTX, PROVEN, 10.0)
    _sbm_cpu, sbm_acc = a.budget("sbm")
    assert sbm_acc > 0.8 * a.safe_accelerator
    assert a.budget("rma")[1] < 0.1 * a.safe_accelerator


def test_sbm_only_on_hardware_the_strong_model_supports() -> None:
    a = allocator().allocate(
        capacity(cpu=8.0, accelerator=4.0, hardware="gpu-a"), 0.0, CTX, PROVEN, 10.0
    )
    assert a.budget("sbm") == (0.0, 0.0)
    assert a.budget("precompute") == (0.0, 0.0)
    assert a.budget("rma")[1] > 0.0  # the base model runs on gpu-a


def test_capacity_expiring_before_the_strong_model_loads_never_goes_to_sbm() -> None:
    short = capacity(cpu=8.0, accelerator=4.0, expires_in_s=60.0)  # load_s is 120
    a = allocator().allocate(short, 0.0, CTX, PROVEN, 10.0)
    assert a.budget("sbm") == (0.0, 0.0)
    assert a.budget("precompute")[1] > 0.0  # a job fits in a short window
    # an announcement 100 s old with 200 s to go has 100 s left: still too short
    aged = capacity(cpu=8.0, accelerator=4.0, expires_in_s=200.0, ts=1000.0)
    a = allocator().allocate(aged, 1100.0, CTX, PROVEN, 10.0)
    assert a.budget("sbm") == (0.0, 0.0)
    a = allocator().allocate(aged, 1050.0, CTX, PROVEN, 10.0)
    assert a.budget("sbm")[1] > 0.0


def test_pools_take_the_books_levels_in_force_and_lifetimes_once() -> None:
    # the newest level per pool, ties to the lower one, in any order
    key = ("accelerator", "gpu-b", "opportunistic")
    older = CapacityLevel(*key, 8.0, None, False, 5.0)  # type: ignore[arg-type]
    newer = CapacityLevel(*key, 2.0, 300.0, False, 10.0)  # type: ignore[arg-type]
    tie = CapacityLevel(*key, 3.0, 300.0, False, 10.0)  # type: ignore[arg-type]
    for order in ([older, newer, tie], [tie, newer, older]):
        (pool,) = pools_from_capacity(order, 110.0, 0.0)
        assert (pool.announced, pool.lifetime_s) == (2.0, 200.0)
    # an observation carries the lifetime left; the allocator must not age it a second time
    agg = RegionAggregator()
    agg.add_capacity("r", newer)
    (pool,) = pools_from_capacity(agg.observe("r", 110.0).capacity, 110.0, 0.0)
    assert pool.lifetime_s == 200.0
    # and once it lapsed the pool is empty, whoever passes it on
    (pool,) = pools_from_capacity([newer], 310.0, 0.0)
    assert (pool.units, pool.lifetime_s) == (0.0, 0.0)
    (pool,) = pools_from_capacity(agg.capacity("r", 310.0), 310.0, 0.0)
    assert (pool.units, pool.lifetime_s) == (0.0, 0.0)


def test_remote_capacity_goes_only_to_asynchronous_levers() -> None:
    remote = capacity(cpu=8.0, accelerator=4.0, remote=True)
    a = allocator().allocate(remote, 0.0, CTX, PROVEN, 10.0)
    assert set(a.rates) == {"precompute"}


def test_safety_margin_is_held_back_from_announced_capacity() -> None:
    a = allocator(safety_margin=0.2).allocate(
        capacity(cpu=100.0, accelerator=4.0), 0.0, CTX, PROVEN, 10.0
    )
    assert a.total_accelerator <= 4.0 * 0.8 + 1e-9
    assert a.total_accelerator == pytest.approx(3.2)  # all of it is worth using


def test_per_lever_cap_binds_and_is_reported() -> None:
    levers = LeverRegistry.standard(COSTS, 400, 1200)
    book = book_with({"rma": 0.01, "sbm": 5.0})
    alloc_ = Allocator(AllocatorSettings(max_share=0.6), ValueSettings(), levers)
    a = alloc_.allocate(capacity(cpu=100.0, accelerator=4.0), 0.0, CTX, book, 10.0)
    assert a.budget("sbm")[1] == pytest.approx(0.6 * 4.0 * 0.9)
    assert "sbm" in a.cap_bound
    # a per-lever override
    alloc_ = Allocator(
        AllocatorSettings(max_share=0.6, lever_caps=(("sbm", 0.3),)), ValueSettings(), levers
    )
    a = alloc_.allocate(capacity(cpu=100.0, accelerator=4.0), 0.0, CTX, book, 10.0)
    assert a.budget("sbm")[1] == pytest.approx(0.3 * 4.0 * 0.9)


def test_cap_does_not_waste_a_pool_no_other_lever_can_use() -> None:
    # gpu-b capacity that expires in 60 s: SBM cannot load; precompute is the only user
    a = allocator(max_share=0.5).allocate(
        capacity(cpu=100.0, accelerator=4.0, expires_in_s=60.0, remote=True), 0.0, CTX, PROVEN, 10.0
    )
    assert a.budget("precompute")[1] == pytest.approx(4.0 * 0.9)
    assert a.cap_bound == ()


def test_higher_lcb_per_resource_unit_wins_the_contested_pool() -> None:
    levers = LeverRegistry.standard(COSTS, 400, 1200)
    alloc_ = Allocator(AllocatorSettings(max_share=1.0), ValueSettings(), levers)
    cap = capacity(cpu=0.5, accelerator=2.0)  # little CPU: RMA is CPU-bound anyway
    sbm_rich = alloc_.allocate(cap, 0.0, CTX, book_with({"rma": 0.001, "sbm": 1.0}), 10.0)
    rma_rich = alloc_.allocate(cap, 0.0, CTX, book_with({"rma": 5.0, "sbm": 0.01}), 10.0)
    assert sbm_rich.budget("sbm")[1] > rma_rich.budget("sbm")[1]
    assert rma_rich.budget("rma")[0] > sbm_rich.budget("rma")[0]


class _AccLever(Lever):
    """Accelerator-only toy lever: ``cost`` device-seconds per unit of work."""

    def __init__(self, name: str, cost: float) -> None:
        self.name = name
        self.cost = cost

    def unit_cost(self) -> ResourceCost:
        return ResourceCost(0.0, self.cost)

    def demand(self, ctx: LeverContext) -> float:
        return 1e9


def test_the_pool_goes_to_the_best_value_per_device_second_not_per_unit() -> None:
    # cheap: 1.0 per unit at 0.01 device-s (100 per device-s); dear: 5.0 per unit at 0.1 (50)
    levers = LeverRegistry([_AccLever("cheap", 0.01), _AccLever("dear", 0.1)])
    rng = np.random.default_rng(0)
    book = ValueBook()
    for name, uplift in (("cheap", 1.0), ("dear", 5.0)):
        book.add(
            {
                ("s", name, "treatment"): arm_stats(rng, 5000, 1.0 + uplift, 0.1),
                ("s", name, "control"): arm_stats(rng, 5000, 1.0, 0.1),
            }
        )
    alloc_ = Allocator(AllocatorSettings(max_share=1.0), ValueSettings(), levers)
    a = alloc_.allocate(capacity(accelerator=2.0), 0.0, CTX, book, 10.0)
    assert a.budget("cheap")[1] == pytest.approx(1.8)
    assert a.budget("dear") == (0.0, 0.0)
    shares = {s.lever: s.value_per_unit_lcb for s in a.shares}
    assert shares["cheap"] == pytest.approx(100.0, rel=0.01)


@pytest.mark.parametrize(
    ("book", "age", "reason"),
    [
        (ValueBook(), None, FallbackReason.NO_VALUE),
        (PROVEN, None, FallbackReason.NO_VALUE),
        (PROVEN, 10_000.0, FallbackReason.STALE_VALUE),
        (PROVEN, math.inf, FallbackReason.STALE_VALUE),
        (
            book_with({"rma": 0.001, "sbm": 0.001, "precompute": 0.001}, n=40),
            10.0,
            FallbackReason.UNCERTAIN_VALUE,
        ),
    ],
)
def test_falls_back_conservatively_and_says_why(book, age, reason) -> None:
    a = allocator(fallback_share=0.25).allocate(
        capacity(cpu=8.0, accelerator=4.0), 0.0, CTX, book, age
    )
    assert a.fallback is reason
    assert a.total_cpu <= 0.25 * 8.0 * 0.9 + 1e-9
    # a strong replica needs a whole device: an SBM being explored (unknown or unproven) holds
    # one to be measured (else it could never end the fallback); a proven one is dropped
    sbm = use_of(a, "sbm").get(0, 0.0)  # pool 0: the accelerators
    est = a.estimates["sbm"]
    held = 0.0 if est.known and est.lcb > 0.0 else 0.9  # a lever being explored holds one
    assert sbm == 0.0 if held == 0.0 else sbm >= held - 1e-9
    assert a.total_accelerator - held <= 0.25 * 4.0 * 0.9 + 1e-9
    assert a.total_accelerator > 0.0


def test_capacity_below_the_safety_margin_allocates_nothing_and_says_so() -> None:
    a = allocator(min_pool_units=0.5).allocate(
        capacity(cpu=0.3, accelerator=0.3), 0.0, CTX, PROVEN, 10.0
    )
    assert a.fallback is FallbackReason.BELOW_SAFETY_MARGIN
    assert a.rates == {}
    a = allocator().allocate((), 0.0, CTX, PROVEN, 10.0)
    assert a.fallback is None
    assert a.rates == {}


def test_confidently_harmful_levers_get_nothing() -> None:
    book = book_with({"rma": -0.3, "sbm": -0.3, "precompute": -0.3})
    a = allocator().allocate(capacity(cpu=8.0, accelerator=4.0), 0.0, CTX, book, 10.0)
    assert a.fallback is None
    assert a.rates == {}


def test_unproven_lever_keeps_an_exploration_share() -> None:
    book = book_with({"rma": 0.5, "sbm": 0.5})  # precompute has no data yet
    a = allocator(explore_share=0.05).allocate(
        capacity(cpu=8.0, accelerator=4.0), 0.0, CTX, book, 10.0
    )
    assert a.explored == ("precompute",)
    assert 0.0 < a.budget("precompute")[1] <= 0.05 * 4.0 * 0.9 + 1e-9


def test_remote_capacity_no_proven_lever_can_use_is_all_explored() -> None:
    # precompute is unproven; the live levers are proven but may not touch remote pools, so
    # those cost nobody anything: precompute is measured on all of them, and on the live
    # pools it keeps only its exploration share
    book = book_with({"rma": 0.5, "sbm": 0.5})
    live = capacity(cpu=8.0, accelerator=4.0)
    remote = capacity(cpu=8.0, accelerator=4.0, remote=True)
    a = allocator(explore_share=0.05).allocate([*live, *remote], 0.0, CTX, book, 10.0)
    assert a.explored == ("precompute",)
    devices = {i: u for i, u in use_of(a, "precompute").items() if a.pools[i].resource != "cpu"}
    on_remote = sum(u for i, u in devices.items() if a.pools[i].remote)
    on_live = sum(u for i, u in devices.items() if not a.pools[i].remote)
    assert on_remote == pytest.approx(4.0 * 0.9)  # the remote devices: all of them
    assert on_live <= 0.05 * 4.0 * 0.9 + 1e-9
    # in a fallback too: the remote pools go whole to the levers being measured
    a = allocator(fallback_share=0.25).allocate(remote, 0.0, CTX, ValueBook(), None)
    assert a.fallback is FallbackReason.NO_VALUE
    assert a.budget("precompute")[1] == pytest.approx(4.0 * 0.9)
    # a lever proven harmful gets none of it
    harmful = book_with({"precompute": -0.3})
    assert allocator().allocate(remote, 0.0, CTX, harmful, 10.0).rates == {}


# -- whole devices and usable shares ---------------------------------------------------------

LIVE = LeverRegistry.standard(COSTS, 400, 1200, strong_wait_budget_ms=34.0)


def live_allocator(**kw: object) -> Allocator:
    return Allocator(AllocatorSettings(**kw), ValueSettings(), LIVE)  # type: ignore[arg-type]


def test_sbm_holds_a_whole_device_or_none_of_it_never_a_split_the_replicas_round_away() -> None:
    # SBM worth far more per device-second than RMA: the one device goes to SBM whole
    book = book_with({"rma": 0.001, "sbm": 0.5})
    a = live_allocator().allocate(capacity(cpu=8.0, accelerator=1.0), 0.0, CTX, book, 10.0)
    assert use_of(a, "sbm")[0] == pytest.approx(0.9)  # the whole device (after the margin)
    assert use_of(a, "rma").get(0, 0.0) == 0.0  # nothing left: a split would be rounded away
    # RMA worth far more (SBM proven, but small): SBM gets nothing of it, not a sliver that
    # would take the device
    book = book_with({"rma": 5.0, "sbm": 0.05})
    a = live_allocator().allocate(capacity(cpu=8.0, accelerator=1.0), 0.0, CTX, book, 10.0)
    assert a.estimates["sbm"].lcb > 0.0
    assert use_of(a, "sbm").get(0, 0.0) == 0.0
    assert use_of(a, "rma")[0] > 0.5
    # an SBM not proven either way is being explored: it holds the device to be measured
    book = book_with({"rma": 5.0, "sbm": 0.001})
    a = live_allocator().allocate(capacity(cpu=8.0, accelerator=1.0), 0.0, CTX, book, 10.0)
    assert a.estimates["sbm"].lcb <= 0.0 < a.estimates["sbm"].ucb
    assert use_of(a, "sbm")[0] == pytest.approx(0.9)


def test_proven_levers_share_a_device_by_their_means_not_their_lcbs() -> None:
    # RMA just proven on 200 requests an arm (a wide interval), the strong model on 20,000:
    # per device-second RMA's LCB is below the strong model's, its mean far above it. The
    # device goes to the lever worth more, not to the one measured more precisely.
    book = book_of({"rma": (0.03, 200), "sbm": (0.05, 20000)})
    a = live_allocator().allocate(capacity(cpu=8.0, accelerator=1.0), 0.0, CTX, book, 10.0)
    rma, sbm = a.estimates["rma"], a.estimates["sbm"]
    acc_s = {n: LIVE[n].unit_cost().accelerator_s for n in ("rma", "sbm")}
    assert 0.0 < rma.lcb / acc_s["rma"] < sbm.lcb / acc_s["sbm"]
    assert rma.mean / acc_s["rma"] > 10.0 * sbm.mean / acc_s["sbm"]
    assert use_of(a, "rma")[0] == pytest.approx(0.9)
    assert use_of(a, "sbm").get(0, 0.0) == 0.0


@pytest.mark.parametrize("seed", [0, 1])
def test_a_proven_lever_does_not_shut_out_a_measured_one_worth_more_at_its_mean(
    seed: int,
) -> None:
    # RMA measured but not proven (200 requests an arm), its mean per device-second far above
    # the proven strong model's: pinning the strong model to the one device would leave RMA no
    # samples again, so RMA keeps being measured there and the strong model is dropped
    book = book_of({"rma": (0.02, 200), "sbm": (0.05, 20000)}, seed)
    a = live_allocator().allocate(capacity(cpu=8.0, accelerator=1.0), 0.0, CTX, book, 10.0)
    rma = a.estimates["rma"]
    assert rma.known
    assert rma.lcb <= 0.0 < rma.mean
    assert a.estimates["sbm"].lcb > 0.0
    assert use_of(a, "rma")[0] > 0.0
    assert use_of(a, "sbm").get(0, 0.0) == 0.0


@pytest.mark.parametrize("uplift", [0.0005, -0.01])
def test_a_measured_lever_worth_nothing_at_its_mean_is_shut_out(uplift: float) -> None:
    # the same, but RMA's mean is at or below 0: the strong model holds the device whole
    book = book_of({"rma": (uplift, 400), "sbm": (0.05, 20000)})
    a = live_allocator().allocate(capacity(cpu=8.0, accelerator=1.0), 0.0, CTX, book, 10.0)
    assert a.estimates["rma"].known
    assert a.estimates["rma"].mean <= 0.0
    assert use_of(a, "sbm")[0] == pytest.approx(0.9)
    assert use_of(a, "rma").get(0, 0.0) == 0.0


def test_sbm_on_a_larger_pool_holds_at_least_one_device_and_the_rest_is_split() -> None:
    book = book_with({"rma": 0.05, "sbm": 0.5})
    a = live_allocator().allocate(capacity(cpu=16.0, accelerator=3.0), 0.0, CTX, book, 10.0)
    sbm = use_of(a, "sbm").get(0, 0.0)
    assert sbm == 0.0 or sbm >= 0.9 - 1e-9
    assert sbm + use_of(a, "rma").get(0, 0.0) <= 2.7 + 1e-9


def _split(held: dict | None, expires_in_s: float | None, uplift: dict[str, float]):
    book = book_with(uplift)
    cap = capacity(cpu=16.0, accelerator=3.0, expires_in_s=expires_in_s)
    return live_allocator().allocate(cap, 0.0, CTX, book, 10.0, held)


@pytest.mark.parametrize("expires_in_s", [130.0, 300.0])
def test_the_units_a_lever_holds_loaded_are_priced_in_full(expires_in_s: float) -> None:
    # told it already holds what the split gives it, the strong model is given the same: only
    # units beyond the held ones are priced below a loaded one
    uplift = {"rma": 0.05, "sbm": 0.5}
    fresh = _split(None, expires_in_s, uplift)
    again = _split(fresh.held(), expires_in_s, uplift)
    assert use_of(fresh, "sbm")[0] > 0.9 + 1e-6  # beyond its first device: the case at hand
    assert again.held() == pytest.approx(fresh.held())
    for lever, budget in fresh.budgets.items():
        assert again.budget(lever) == pytest.approx(budget)


def test_devices_the_strong_model_must_first_load_are_priced_by_what_is_left_of_the_pool() -> None:
    # the pool lives 130 s and the model loads for 120: a device the strong model does not hold
    # yet is worth 1 − 120/130 of a loaded one, so holding none it gives way to RMA, which can
    # use a device at once; on a pool of unknown lifetime nothing changes
    uplift = {"rma": 0.05, "sbm": 0.5}
    priced = _split(None, 130.0, uplift)
    new = _split({}, 130.0, uplift)
    assert use_of(new, "sbm").get(0, 0.0) < use_of(priced, "sbm")[0] - 0.1
    assert use_of(new, "rma")[0] > use_of(priced, "rma").get(0, 0.0) + 0.1
    for held in ({}, {("sbm", "accelerator", "gpu-b", False): 5.0}):
        assert _split(held, None, uplift).held() == pytest.approx(_split(None, None, uplift).held())


def test_held_units_are_keyed_by_the_kind_of_pool() -> None:
    a = _split(None, 300.0, {"rma": 0.05, "sbm": 0.5})
    held = a.held()
    assert set(held) <= {
        (lever, p.resource, p.hardware, p.remote) for p in a.pools for lever in ("rma", "sbm")
    }
    assert sum(held.values()) == pytest.approx(sum(u for _, _, u in a.pool_use))


def test_the_rest_of_a_pool_sbm_is_pinned_to_is_priced_at_the_chord_of_its_usable_units() -> None:
    # a queue of more devices runs busier at the same wait: pinned to its first device, SBM
    # uses u(1) of it; each unit it adds of the rest lets it use u(2)·2 − u(1)·1 per device
    # more — more than the average u(2) a unit of an unpinned share is priced at
    a = live_allocator()
    sbm = LIVE["sbm"]
    margin = a.settings.safety_margin
    pools = pools_from_capacity(capacity(cpu=8.0, accelerator=2.0), 0.0, margin)
    acc = next(i for i, p in enumerate(pools) if p.resource == "accelerator")
    u1, u2 = (sbm.usable_share("accelerator", d) for d in (1.0, 2.0))
    chord = (u2 * 2.0 - u1 * 1.0) / (2.0 - 1.0)
    assert u1 < u2 < chord

    def used_per_held(pinned: list[tuple[str, int]]) -> dict[str | None, float]:
        slots = a._slots(pools, [True] * len(pools), pinned)
        out = {}
        for v in a._variables(sbm, pools, slots):
            if v.acc_pool is not None:
                # a variable is one used device-second; v.acc the held units it takes
                out[slots[v.acc_pool].owner] = 1.0 / v.acc
        return out

    assert used_per_held([]) == {None: pytest.approx(min(u2 / (1 - margin), 1.0))}
    pinned = used_per_held([("sbm", acc)])
    assert pinned["sbm"] == pytest.approx(min(u1 / (1 - margin), 1.0))
    assert pinned[None] == pytest.approx(min(chord / (1 - margin), 1.0))


def test_a_levers_cap_is_a_share_of_the_whole_pool_whoever_is_pinned_to_part_of_it() -> None:
    # RMA worth far more per device-second than the strong model: unpinned, its cap (0.9 of a
    # contested pool) binds at 0.9 × 1.8 usable devices. With the strong model pinned to one
    # device, RMA's share of the pool is what it takes of the rest, and the rest (0.9 device)
    # is below its cap of the pool: it takes all of it — not 0.9 of the rest, which left the
    # last tenth to the strong model and read as a binding cap
    a = live_allocator()
    pools = pools_from_capacity(capacity(cpu=40.0, accelerator=2.0), 0.0, a.settings.safety_margin)
    acc = next(i for i, p in enumerate(pools) if p.resource == "accelerator")
    book = book_with({"rma": 5.0, "sbm": 0.5})
    est = {lv.name: lv.estimate(book, CTX, a.value.lcb_z, a.value.min_samples) for lv in LIVE}
    demand = {lv.name: lv.demand(CTX) for lv in LIVE if lv.demand(CTX) > 0.0}
    units = pools[acc].units
    free = a._run(pools, [True] * len(pools), demand, est, 10.0, [], set())
    assert free.acc.pool_use[("rma", acc)] == pytest.approx(0.9 * units)
    assert free.cap_bound == ["rma"]
    pinned = a._run(pools, [True] * len(pools), demand, est, 10.0, [("sbm", acc)], set())
    held = pinned.acc.pool_use[("sbm", acc)]
    assert held == pytest.approx(0.9)  # its one device, after the safety margin
    assert pinned.acc.pool_use[("rma", acc)] == pytest.approx(units - held)
    assert pinned.acc.pool_use[("rma", acc)] <= 0.9 * units
    assert pinned.cap_bound == []


def test_a_proven_sbm_holding_its_device_is_pinned_and_its_work_is_all_in_its_strata() -> None:
    # both levers proven, nothing measured: the strong model holds its device, and every
    # request it serves, the pinned device's included, is in a stratum the LP chose for it
    # (what the router is given: controllers/router.py, the allocator's shares)
    book = segment_book(SPLIT_UPLIFT)
    a = Allocator(AllocatorSettings(explore_share=0.0), ValueSettings(), LIVE)
    for devices in (2.0, 3.0, 4.0):
        alloc = a.allocate(capacity(cpu=40.0, accelerator=devices), 0.0, SEG_CTX, book, 10.0)
        assert alloc.fallback is None
        assert alloc.explored == ()
        assert alloc.budget("sbm")[1] >= 0.9 - 1e-9
        in_strata = sum(r for lv, _, r in alloc.tranche_rates if lv == "sbm")
        assert in_strata == pytest.approx(alloc.rates["sbm"], rel=1e-6), devices


def test_an_unknown_lever_keeps_its_exploration_share_against_a_whole_device() -> None:
    # RMA never did work (no data): it must be explored, so SBM cannot take the one device
    book = book_with({"sbm": 0.5})
    a = live_allocator().allocate(capacity(cpu=8.0, accelerator=1.0), 0.0, CTX, book, 10.0)
    assert not a.estimates["rma"].known
    assert "rma" in a.explored
    assert use_of(a, "rma")[0] > 0.0
    assert use_of(a, "sbm").get(0, 0.0) == 0.0
    # on two devices both fit: SBM holds one, RMA explores on the other
    a = live_allocator().allocate(capacity(cpu=8.0, accelerator=2.0), 0.0, CTX, book, 10.0)
    assert use_of(a, "rma")[0] > 0.0
    assert use_of(a, "sbm")[0] >= 0.9 - 1e-9


def test_an_unknown_sbm_holds_a_whole_device_so_it_can_be_measured() -> None:
    book = book_with({"rma": 0.05})
    a = live_allocator().allocate(capacity(cpu=8.0, accelerator=2.0), 0.0, CTX, book, 10.0)
    assert not a.estimates["sbm"].known
    assert use_of(a, "sbm")[0] >= 0.9 - 1e-9
    assert use_of(a, "rma")[0] > 0.0


def test_sbm_is_charged_the_devices_it_holds_not_only_the_ones_it_keeps_busy() -> None:
    # a slice: half a device runs a strong replica at ~29 % (defences/admission.py), so
    # SBM's work there pays for about 3.5 announced units per used one
    book = book_with({"sbm": 0.5, "rma": 0.001})
    a = live_allocator(max_share=1.0).allocate(
        capacity(cpu=8.0, accelerator=0.5), 0.0, CTX, book, 10.0
    )
    sbm = LIVE["sbm"]
    held = a.budget("sbm")[1]
    used = a.rates["sbm"] * sbm.unit_cost().accelerator_s
    assert held == pytest.approx(0.45)  # the whole slice, after the 10 % safety margin
    # the replicas hold the announced half device and keep it busy at the admissible share of
    # it: the margin is taken once (the budget's units are announced × 0.9), not again on top
    u = sbm.usable_share("accelerator", 0.5)
    assert used == pytest.approx(0.5 * u, rel=1e-6)
    assert 0.2 < u < sbm.usable_share("accelerator", 2.0) < 1


@pytest.mark.parametrize("margin", [0.0, 0.1, 0.3])
def test_the_safety_margin_is_taken_once_for_sbm_as_a_ceiling_on_how_busy_it_runs(
    margin: float,
) -> None:
    # the strong replicas admit work up to the admissible share of the devices they hold, and
    # the margin bounds how busy a pool is planned: SBM's work on a pool of announced devices
    # is min(admissible share, 1 − margin) of them — neither the product of the two (the
    # margin taken twice) nor the admissible share beyond 1 − margin (the margin lost)
    book = book_with({"sbm": 0.5, "rma": 0.001})
    sbm = LIVE["sbm"]
    for devices in (1.0, 2.0, 4.0):
        a = live_allocator(max_share=1.0, safety_margin=margin).allocate(
            capacity(cpu=64.0, accelerator=devices), 0.0, CTX, book, 10.0
        )
        used = a.rates["sbm"] * sbm.unit_cost().accelerator_s
        busy = min(sbm.usable_share("accelerator", devices), 1.0 - margin)
        held = a.budget("sbm")[1] / (1.0 - margin)  # announced devices behind the budget
        assert held >= 0.9 * devices  # the unproven RMA explores on the rest
        assert used == pytest.approx(held * busy, rel=1e-6), devices


@pytest.mark.parametrize(("cpu", "acc"), [(8.0, 0.5), (1.0, 4.0)])
def test_sbm_holds_cpu_for_the_devices_it_holds_not_for_the_share_it_keeps_busy(
    cpu: float, acc: float
) -> None:
    # one strong request passes through both stages: the devices run at their admissible
    # utilisation, so CPU sized to that work alone would run its own quota 100 % busy (and the
    # servers admit CPU work below 100 %: diurnal-3region's CPU-starved eu-west shed strong
    # requests). SBM's CPU is held in the cost ratio to the devices it holds.
    book = book_with({"sbm": 0.5, "rma": 0.001})
    a = live_allocator(max_share=1.0).allocate(
        capacity(cpu=cpu, accelerator=acc), 0.0, CTX, book, 10.0
    )
    cost = LIVE["sbm"].unit_cost()
    held_cpu, held_acc = a.budget("sbm")
    assert held_acc > 0.0
    assert held_cpu == pytest.approx(held_acc * cost.cpu_s / cost.accelerator_s, rel=1e-6)


@settings(max_examples=150, deadline=None)
@given(
    cpu=st.floats(0.0, 6.0),
    acc=st.floats(0.0, 4.0),
    uplift=st.fixed_dictionaries(
        {},
        optional={
            "rma": st.floats(-0.05, 0.5),
            "sbm": st.floats(-0.5, 1.0),
            "precompute": st.floats(-0.5, 1.0),
        },
    ),
    n=st.sampled_from([50, 2000]),
    age=st.sampled_from([None, 10.0, 1e5]),
)
# an LP that left SBM what the tableau's rounding left of the device (1.2e-17): no work
@example(cpu=1.0, acc=0.09375, uplift={"rma": 0.5, "precompute": 1.0, "sbm": 1.0}, n=2000, age=10.0)
def test_no_sub_device_sbm_share_and_unknown_levers_keep_a_share(cpu, acc, uplift, n, age) -> None:
    reg = LeverRegistry.standard(COSTS, 400, 1200, precompute=True, strong_wait_budget_ms=34.0)
    a = Allocator(AllocatorSettings(), ValueSettings(), reg).allocate(
        capacity(cpu=cpu, accelerator=acc), 0.0, CTX, book_with(uplift, n=n), age
    )
    acc_pool = next((i for i, p in enumerate(a.pools) if p.resource == "accelerator"), None)
    cpu_pool = next((i for i, p in enumerate(a.pools) if p.resource == "cpu"), None)
    if acc_pool is None:
        return
    pool = a.pools[acc_pool]
    need = min(1.0, pool.announced) * 0.9
    sbm = use_of(a, "sbm").get(acc_pool, 0.0)
    assert sbm == 0.0 or sbm >= need * (1.0 - 1e-6)
    assert sum(u for _, i, u in a.pool_use if i == acc_pool) <= pool.units * (1 + 1e-9) + 1e-12
    usable = pool.units >= 0.01 and cpu_pool is not None and a.pools[cpu_pool].units >= 0.01
    for name in ("rma", "precompute"):
        if usable and not a.estimates[name].known:
            assert use_of(a, name).get(acc_pool, 0.0) > 0.0, name


# -- tranches: a lever's value per segment -------------------------------------------------------


def segment_book(uplift: dict[tuple[str, str], float], n: int = 4000, seed: int = 1) -> ValueBook:
    """Each (lever, segment)'s treatment beats its control by ``uplift`` per request, RMA's
    treated requests getting the whole span (800 extras) as value-ranked spend gives them."""
    rng = np.random.default_rng(seed)
    book = ValueBook()
    for (lever, seg), d in uplift.items():
        book.add(
            {
                (seg, lever, "treatment"): arm_stats(
                    rng, n, 1.0 + d, 0.2, *treated_cost(lever, n, extra=800.0)
                ),
                (seg, lever, "control"): arm_stats(rng, n, 1.0, 0.2),
            }
        )
    return book


SEG_CTX = LeverContext(
    request_rps=200.0,
    eligible_rps=200.0,
    rma_extra_candidates=800.0,
    segment_rps={"premium": 30.0, "casual": 170.0},
)


# RMA worth most on premium, the strong model on casual (per device-second: below)
SPLIT_UPLIFT = {
    ("rma", "premium"): 0.2,
    ("rma", "casual"): 0.004,
    ("sbm", "premium"): 0.005,
    ("sbm", "casual"): 0.1,
}


def test_contested_accelerator_follows_each_segments_own_value() -> None:
    # per device-second: RMA premium 0.2/0.016 = 12.5, SBM casual 0.1/0.04 = 2.5, RMA casual
    # 0.004/0.016 = 0.25, SBM premium 0.005/0.04 = 0.125. Pooled, RMA (mostly casual requests
    # by count) would still look better than SBM per device and take the whole pool; by
    # segment, RMA serves premium and the strong model the casual requests
    book = segment_book(SPLIT_UPLIFT)
    levers = LeverRegistry.standard(COSTS, 400, 1200)
    a = Allocator(AllocatorSettings(explore_share=0.0), ValueSettings(), levers)
    cap = capacity(cpu=40.0, accelerator=3.0)
    alloc = a.allocate(cap, 0.0, SEG_CTX, book, 10.0)
    rates = {(lv, seg): r for lv, seg, r in alloc.tranche_rates}
    assert alloc.fallback is None
    # RMA's premium tranche is filled first: every premium request gets the span
    assert rates[("rma", "premium")] == pytest.approx(30.0 * 800, rel=1e-6)
    # the strong model gets the rest of the accelerator for casual requests, none for premium
    assert rates.get(("sbm", "casual"), 0.0) > 10.0
    assert rates.get(("sbm", "premium"), 0.0) == 0.0
    assert alloc.budget("sbm")[1] > 1.0
    # no segment treats more requests than it has (RMA's span and the strong model exclude
    # each other on a request)
    for seg, rps in SEG_CTX.segment_rps.items():
        treated = rates.get(("rma", seg), 0.0) / 800 + rates.get(("sbm", seg), 0.0)
        assert treated <= rps * (1 + 1e-6)


def test_a_segment_without_its_own_estimate_is_valued_at_the_pooled_one() -> None:
    book = segment_book({("rma", "casual"): 0.01, ("sbm", "casual"): 0.1})
    levers = LeverRegistry.standard(COSTS, 400, 1200)
    a = Allocator(AllocatorSettings(explore_share=0.0), ValueSettings(), levers)
    alloc = a.allocate(capacity(cpu=40.0, accelerator=3.0), 0.0, SEG_CTX, book, 10.0)
    assert set(alloc.unmeasured["sbm"]) == {"premium"}
    sbm = levers["sbm"]
    tr = {t.segment: t for t in sbm.tranches(book, SEG_CTX, 1.645, 30.0)}
    assert not tr["premium"].own
    assert tr["casual"].own
    assert tr["premium"].estimate == sbm.estimate(book, SEG_CTX, 1.645, 30.0)


def test_without_segment_rates_a_lever_is_one_tranche() -> None:
    book = segment_book({("rma", "casual"): 0.01, ("sbm", "casual"): 0.1})
    lever = LeverRegistry.standard(COSTS, 400, 1200)["rma"]
    ctx = LeverContext(request_rps=200.0, eligible_rps=200.0, rma_extra_candidates=800.0)
    (t,) = lever.tranches(book, ctx, 1.645, 30.0)
    assert t.segment is None
    assert t.demand == lever.demand(ctx)


def test_live_capacity_the_proven_levers_leave_idle_goes_to_the_levers_being_measured() -> None:
    # SBM is proven but has little to do (few eligible requests); RMA has no data yet. With
    # explore_idle the live units SBM leaves idle are RMA's to measure on; without, RMA keeps
    # its exploration share alone
    book = book_with({"sbm": 0.3})
    ctx = LeverContext(request_rps=300.0, eligible_rps=2.0, rma_extra_candidates=200.0)
    cap = capacity(cpu=8.0, accelerator=4.0)
    on = allocator(explore_share=0.05).allocate(cap, 0.0, ctx, book, 10.0)
    off = allocator(explore_share=0.05, explore_idle=False).allocate(cap, 0.0, ctx, book, 10.0)
    assert on.fallback is None
    assert "rma" in on.explored
    assert off.budget("rma")[0] <= 0.05 * 8.0 * 0.9 + 1e-9
    assert on.budget("rma")[0] > 2.0 * off.budget("rma")[0]
    # what SBM gets is the same either way: idle capacity is handed out after the LP
    assert on.budget("sbm") == pytest.approx(off.budget("sbm"))
    # never more than the pools hold, after the safety margin
    cpu = sum(on.budget(n)[0] for n in ("rma", "sbm", "precompute"))
    assert cpu <= 8.0 * 0.9 + 1e-9
    # and nothing of it in a fallback: fallback_share alone
    fb = allocator(fallback_share=0.25).allocate(cap, 0.0, ctx, ValueBook(), None)
    assert fb.fallback is FallbackReason.NO_VALUE
    assert fb.budget("rma")[0] <= 0.25 * 8.0 * 0.9 + 1e-9


FIXED_VALUE = ValueEstimate(1.0, 0.1, 0.8, 1.2, 1000.0, 1000.0, True)


def _fixed(cls: type[Lever], tranches: list[Tranche], est: ValueEstimate = FIXED_VALUE) -> Lever:
    """``cls`` (RMA or SBM on COSTS) whose value (proven, unless ``est`` says otherwise) and
    tranches are fixed."""

    class Fixed(cls):  # type: ignore[misc, valid-type]
        def estimate(self, *args: object, **kw: object) -> ValueEstimate:
            return est

        def tranches(self, *args: object, **kw: object) -> list[Tranche]:
            return tranches

    if cls is RmaLever:
        return Fixed(COSTS, 400, 1200)
    return Fixed(COSTS)


def test_an_rma_band_and_the_strong_model_share_their_stratums_requests() -> None:
    # one RMA band on casual#7 (a piece of 100 extras: a candidate/s of it treats 1/100 of a
    # request/s) and SBM's tranche of that stratum (10 requests/s); value enough for both to
    # want far more than the stratum's 10 requests/s, capacity to spare
    hi = ValueEstimate(50.0, 1.0, 48.0, 52.0, 1000.0, 1000.0, True)
    band = Tranche("rma-band-0", 100_000.0, hi, 0.0, True, (("casual#7", 0.01),))
    stratum = Tranche("casual#7", 1000.0, hi, 10.0, True)
    levers = LeverRegistry([_fixed(RmaLever, [band]), _fixed(SbmLever, [stratum])])
    a = Allocator(AllocatorSettings(explore_share=0.0), ValueSettings(), levers)
    ctx = LeverContext(1000.0, 1000.0, 800.0, segment_rps={"casual": 80.0})
    alloc = a.allocate(capacity(cpu=400.0, accelerator=40.0), 0.0, ctx, ValueBook(), 10.0)
    rates = {(lv, seg): r for lv, seg, r in alloc.tranche_rates}
    rma, sbm = rates.get(("rma", "rma-band-0"), 0.0), rates.get(("sbm", "casual#7"), 0.0)
    assert rma > 0.0 or sbm > 0.0
    assert rma * 0.01 + sbm <= 10.0 * (1 + 1e-6)
    # without the stratum's row the band alone would take ten times the stratum's requests
    only_rma = LeverRegistry([_fixed(RmaLever, [band])])
    alone = Allocator(AllocatorSettings(explore_share=0.0), ValueSettings(), only_rma)
    solo = alone.allocate(capacity(cpu=400.0, accelerator=40.0), 0.0, ctx, ValueBook(), 10.0)
    assert {(lv, s): r for lv, s, r in solo.tranche_rates}[("rma", "rma-band-0")] > 1000.0


@pytest.mark.parametrize("explore_share", [0.05, 0.1])
def test_a_lever_just_proven_keeps_what_it_held_unproven(explore_share: float) -> None:
    # the strong model, worth far more, takes every request of the one stratum; RMA's value is
    # a hair either side of 0. Proven, its band is worth nothing against the strong model's
    # (the stratum's request row), yet it must not lose what it held while being measured:
    # its exploration share and the capacity the LP left idle (no cliff where its LCB
    # crosses 0, which would make the latency around a proof depend on its window)
    hi = ValueEstimate(50.0, 1.0, 48.0, 52.0, 1000.0, 1000.0, True)
    stratum = Tranche("casual#7", 1000.0, hi, 10.0, True)
    ctx = LeverContext(10.0, 10.0, 800.0, segment_rps={"casual": 10.0})
    cap = capacity(cpu=4.0, accelerator=8.0)  # RMA's exploration share is a fraction of its 0.8
    budgets, sbm = {}, {}
    for lcb in (-1e-6, 1e-6):
        rma = ValueEstimate(1e-5, 1e-5, lcb, 1e-4, 1000.0, 1000.0, True)
        band = Tranche("rma-band-0", 100_000.0, rma, 0.0, True, (("casual#7", 0.01),))
        levers = LeverRegistry([_fixed(RmaLever, [band], rma), _fixed(SbmLever, [stratum])])
        a = Allocator(AllocatorSettings(explore_share=explore_share), ValueSettings(), levers)
        alloc = a.allocate(cap, 0.0, ctx, ValueBook(), 10.0)
        assert alloc.fallback is None
        assert ("rma" in alloc.explored) == (lcb < 0.0)
        budgets[lcb > 0.0] = alloc.budget("rma")
        sbm[lcb > 0.0] = alloc.budget("sbm")
    assert sbm[True] == pytest.approx(sbm[False])
    # the strong model keeps what it had either way
    assert budgets[False][0] > 0.0
    assert budgets[True][0] >= 0.99 * budgets[False][0]
    assert budgets[True][1] >= 0.99 * budgets[False][1]
