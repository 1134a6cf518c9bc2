"""Peer concurrency limits (Netflix AIMD and Gradient2, Envoy gradient), fed samples directly."""

from __future__ import annotations

import math

import numpy as np
import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from headroom.defences.peers import (
    AimdConfig,
    AimdLimit,
    ConcurrencyLimit,
    EnvoyGradientConfig,
    EnvoyGradientLimit,
    Gradient2Config,
    Gradient2Limit,
    OptionalBudget,
    make_limit,
)
from headroom.kernel.errors import ConfigError

# One sample: (seconds since the previous sample, rtt ms, inflight, dropped). Any finite values.
sample = st.tuples(
    st.floats(0.0, 5.0),
    st.floats(0.0, 1e6, allow_subnormal=True),
    st.integers(0, 10_000),
    st.booleans(),
)


def feed(limit: ConcurrencyLimit, samples: list[tuple[float, float, int, bool]]) -> list[int]:
    t = 0.0
    out = []
    for dt, rtt, inflight, dropped in samples:
        t += dt
        out.append(limit.on_sample(t, rtt, inflight, dropped))
    return out


def steady(limit: ConcurrencyLimit, t: float, n: int, rtt_ms: float, dt: float = 0.001) -> float:
    """n samples at the given RTT, always with the limit fully used (not app-limited)."""
    for _ in range(n):
        t += dt
        limit.on_sample(t, rtt_ms, limit.limit, False)
    return t


# -- bounds ---------------------------------------------------------------------------------


@settings(max_examples=150, deadline=None)
@given(st.lists(sample, max_size=300), st.integers(1, 50), st.integers(0, 300))
def test_aimd_stays_within_min_and_max(samples: list, low: int, span: int) -> None:  # type: ignore[type-arg]
    cfg = AimdConfig(initial_limit=low, min_limit=low, max_limit=low + span)
    limit = AimdLimit(cfg)
    for value in feed(limit, samples):
        assert cfg.min_limit <= value <= cfg.max_limit


@settings(max_examples=150, deadline=None)
@given(st.lists(sample, max_size=300), st.integers(1, 50), st.integers(0, 300))
def test_gradient2_stays_within_min_and_max(samples: list, low: int, span: int) -> None:  # type: ignore[type-arg]
    cfg = Gradient2Config(initial_limit=low, min_limit=low, max_limit=low + span)
    limit = Gradient2Limit(cfg)
    for value in feed(limit, samples):
        assert cfg.min_limit <= value <= cfg.max_limit


@settings(max_examples=150, deadline=None)
@given(
    st.lists(sample, max_size=300),
    st.integers(1, 20),
    st.integers(0, 500),
    st.integers(1, 20),
    st.integers(0, 2**32),
)
def test_envoy_gradient_stays_within_min_and_max(
    samples: list,  # type: ignore[type-arg]
    low: int,
    span: int,
    count: int,
    seed: int,
) -> None:
    cfg = EnvoyGradientConfig(
        min_concurrency=low,
        max_limit=low + span,
        min_rtt_request_count=count,
        min_rtt_calc_interval_s=2.0,
        sample_interval_s=0.05,
    )
    limit = EnvoyGradientLimit(cfg, np.random.default_rng(seed))
    for value in feed(limit, samples):
        assert cfg.min_concurrency <= value <= cfg.max_limit


# -- direction ------------------------------------------------------------------------------


@settings(max_examples=100, deadline=None)
@given(st.integers(20, 200), st.floats(0.0, 4999.0))
def test_aimd_backs_off_multiplicatively_on_a_drop(start: int, rtt: float) -> None:
    limit = AimdLimit(AimdConfig(initial_limit=start, min_limit=1, max_limit=200))
    assert limit.on_sample(0.0, rtt, start, dropped=True) == int(start * 0.9)


def test_aimd_treats_a_timeout_as_a_drop_and_grows_by_one_only_when_used() -> None:
    limit = AimdLimit(AimdConfig(initial_limit=100, min_limit=1, max_limit=200, timeout_ms=500))
    assert limit.on_sample(0.0, 600.0, 100, False) == 90
    assert limit.on_sample(0.0, 10.0, 45, False) == 91  # 45 × 2 ≥ 90
    assert limit.on_sample(0.0, 10.0, 10, False) == 91  # app-limited: no evidence to grow
    assert limit.on_sample(0.0, math.nan, 91, False) == 81  # a non-finite RTT counts as a drop


def test_gradient2_grows_at_steady_rtt_and_shrinks_when_rtt_rises_over_its_long_average() -> None:
    limit = Gradient2Limit(Gradient2Config(initial_limit=20, min_limit=5, max_limit=300))
    t = steady(limit, 0.0, 400, 10.0)
    grown = limit.limit
    assert grown > 100
    previous = grown
    for _ in range(40):  # RTT quadruples: gradient < 1, limit falls step after step
        t += 0.001
        value = limit.on_sample(t, 40.0, limit.limit, False)
        assert value <= previous
        previous = value
    assert previous < grown * 0.5


def test_gradient2_does_not_move_when_app_limited() -> None:
    limit = Gradient2Limit()
    for i in range(100):
        assert limit.on_sample(i * 0.01, 50.0 + i, 1, False) == 20


def test_gradient2_ignores_unusable_rtts() -> None:
    limit = Gradient2Limit()
    before = limit.snapshot()
    for rtt in (0.0, -1.0, math.inf, math.nan):
        limit.on_sample(0.0, rtt, 100, False)
    assert limit.snapshot() == before


def envoy(seed: int = 0, **overrides: float) -> EnvoyGradientLimit:
    cfg = EnvoyGradientConfig(**overrides)  # type: ignore[arg-type]
    return EnvoyGradientLimit(cfg, np.random.default_rng(seed), now=0.0)


def test_envoy_starts_pinned_at_min_concurrency_while_measuring_min_rtt() -> None:
    limit = envoy()
    assert limit.in_min_rtt_window
    assert limit.limit == 3
    t = 0.0
    for i in range(49):
        t += 0.01
        assert limit.on_sample(t, 10.0 + i % 3, 3, False) == 3
    t += 0.01
    limit.on_sample(t, 11.0, 3, False)
    assert not limit.in_min_rtt_window
    assert limit.min_rtt_ms == pytest.approx(11.0)  # p50 of the 50 samples


def test_envoy_grows_near_min_rtt_and_shrinks_when_sample_rtt_rises() -> None:
    limit = envoy()
    t = steady(limit, 0.0, 50, 10.0, dt=0.001)  # minRTT = 10 ms
    t = steady(limit, t, 2000, 10.0, dt=0.001)  # 20 windows at minRTT: gradient 1.25 + sqrt
    grown = limit.limit
    assert grown > 100
    t = steady(limit, t, 500, 40.0, dt=0.001)  # sampleRTT 4× minRTT: gradient clamps to 0.5
    assert limit.sample_rtt_ms == pytest.approx(40.0)
    assert limit.limit < grown / 4


def test_envoy_gradient_formula_for_one_window() -> None:
    limit = envoy(fixed_min_rtt_ms=10.0, sample_interval_s=0.1)
    assert not limit.in_min_rtt_window
    limit.on_sample(0.05, 20.0, 3, False)
    limit.on_sample(0.08, 20.0, 3, False)
    # The next sample closes the window: gradient = 10 × 1.25 / 20 = 0.625, limit 3 → 1.875
    # → 1.875 + sqrt(1.875) = 3.24 → 3 (and never below min_concurrency).
    assert limit.on_sample(0.11, 5.0, 3, False) == 3
    limit = envoy(fixed_min_rtt_ms=10.0, sample_interval_s=0.1, min_concurrency=1)
    limit._limit = 100  # a known starting point
    limit.on_sample(0.05, 12.5, 100, False)
    assert limit.on_sample(0.10, 1.0, 100, False) == int(100 + math.sqrt(100))  # gradient 1


def test_envoy_ignores_samples_sent_before_the_min_rtt_window_and_dropped_requests() -> None:
    limit = envoy(min_rtt_request_count=3)
    limit.on_sample(0.5, 900.0, 3, False, sent_at=-1.0)  # admitted before the window opened
    limit.on_sample(0.5, 900.0, 3, True)  # dropped: no latency sample
    for t in (0.6, 0.7, 0.8):
        limit.on_sample(t, 10.0, 3, False)
    assert limit.min_rtt_ms == pytest.approx(10.0)


def test_envoy_min_rtt_windows_recur_with_jitter_from_the_injected_generator() -> None:
    def window_starts(seed: int) -> list[float]:
        limit = envoy(seed, min_rtt_calc_interval_s=1.0, jitter=0.5, min_rtt_request_count=5)
        starts, was_in, t = [], True, 0.0
        for _ in range(20_000):
            t += 0.001
            limit.on_sample(t, 10.0, limit.limit, False)
            if limit.in_min_rtt_window and not was_in:
                starts.append(round(t, 3))
            was_in = limit.in_min_rtt_window
        return starts

    a, b, c = window_starts(1), window_starts(1), window_starts(2)
    assert a == b
    assert a != c
    gaps = np.diff(a)
    assert len(gaps) >= 10
    # Each window lasts 5 samples (5 ms); the next starts 1.0–1.5 s after it ends.
    assert (gaps >= 1.0).all()
    assert (gaps <= 1.5 + 0.01).all()
    assert gaps.std() > 0.05  # jittered, not periodic


def test_envoy_remeasures_min_rtt_after_five_windows_at_min_concurrency() -> None:
    limit = envoy(min_rtt_request_count=5, sample_interval_s=0.1, min_rtt_calc_interval_s=600.0)
    t = steady(limit, 1.0, 5, 10.0)  # sent after the window opened at 0, so they count
    assert limit.min_rtt_ms == pytest.approx(10.0)
    entered_at = None
    for _ in range(200):  # latency far above minRTT: the limit sits at min_concurrency
        t += 0.02
        limit.on_sample(t, 100.0, limit.limit, False)
        if limit.in_min_rtt_window:
            entered_at = t
            break
    assert entered_at is not None
    assert entered_at < 3.0  # long before the 600 s interval


def test_envoy_counts_the_windows_after_a_remeasure_from_zero() -> None:
    """Envoy applies the deferred limit before it clears it, so the windows pinned at the floor
    after a remeasure count from 0: the next remeasure comes after ``min_concurrency_retrigger``
    windows at the floor, not one fewer."""
    retrigger = 5
    limit = envoy(
        min_rtt_request_count=5,
        sample_interval_s=0.1,
        min_rtt_calc_interval_s=600.0,
        jitter=0.0,
        min_concurrency_retrigger=retrigger,
    )
    t = steady(limit, 1.0, 5, 10.0)
    while not limit.in_min_rtt_window:  # far above minRTT: pinned, then a forced remeasure
        t += 0.02
        limit.on_sample(t, 100.0, limit.limit, False)
    while limit.in_min_rtt_window:  # remeasured while pinned: the floor is restored
        t += 0.02
        limit.on_sample(t, 100.0, limit.limit, False, sent_at=t)
    assert limit.limit == 3
    assert limit.snapshot()["consecutive_min"] == 0
    windows_at_floor = 0
    last = 0
    while not limit.in_min_rtt_window:
        t += 0.02
        limit.on_sample(t, 1000.0, limit.limit, False, sent_at=t)
        count = int(limit.snapshot()["consecutive_min"])
        if count > last:
            windows_at_floor += 1
        last = count
        assert t < 10.0
    assert windows_at_floor == retrigger


# -- snapshots ------------------------------------------------------------------------------


def _limits(seed: int) -> list[ConcurrencyLimit]:
    return [
        AimdLimit(AimdConfig(initial_limit=5, min_limit=1, max_limit=100)),
        Gradient2Limit(Gradient2Config(initial_limit=5, min_limit=1, max_limit=100)),
        EnvoyGradientLimit(
            EnvoyGradientConfig(
                min_rtt_request_count=5, min_rtt_calc_interval_s=0.5, sample_interval_s=0.05
            ),
            np.random.default_rng(seed),
        ),
    ]


@settings(max_examples=60, deadline=None)
@given(
    st.lists(sample, max_size=150),
    st.lists(sample, min_size=1, max_size=150),
    st.integers(0, 2**32),
)
def test_snapshot_then_restore_gives_identical_next_limits(
    before: list,  # type: ignore[type-arg]
    after: list,  # type: ignore[type-arg]
    seed: int,
) -> None:
    for original, fresh in zip(_limits(seed), _limits(seed + 1), strict=True):
        feed(original, before)
        fresh.restore(orjson.loads(orjson.dumps(original.snapshot())))
        t0 = sum(s[0] for s in before)
        shifted = [(dt, r, i, d) for dt, r, i, d in after]
        shifted[0] = (shifted[0][0] + t0, *shifted[0][1:])
        assert feed(original, shifted) == feed(fresh, shifted)


# -- the optional-work adapter --------------------------------------------------------------


class FixedLimit:
    """A limit that never moves (Netflix's FixedLimit): tests the adapter without an algorithm."""

    def __init__(self, value: int) -> None:
        self.value = value

    @property
    def limit(self) -> int:
        return self.value

    def on_sample(self, now: float, rtt_ms: float, inflight: int, dropped: bool) -> int:
        return self.value

    def snapshot(self) -> dict[str, int]:
        return {"value": self.value}

    def restore(self, state: object) -> None:
        pass


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 1000), st.floats(0.0, 2000.0), st.floats(0.0, 2000.0))
def test_optional_budget_is_what_the_limit_leaves_after_the_baseline(
    value: int, baseline: float, demand: float
) -> None:
    budget = OptionalBudget(FixedLimit(value)).budget(baseline, demand)
    assert budget.slots == max(0.0, value - baseline)
    assert 0.0 <= budget.multiplier <= 1.0
    if demand > 0:
        assert budget.multiplier * demand <= budget.slots + 1e-9
        if budget.multiplier < 1.0:  # every slot is used when demand exceeds them
            assert budget.multiplier * demand == pytest.approx(budget.slots)
    if baseline >= value:
        assert budget.slots == 0.0  # the baseline keeps running; optional work gets nothing


def test_optional_budget_follows_the_algorithm() -> None:
    adapter = OptionalBudget(AimdLimit(AimdConfig(initial_limit=50, min_limit=1, max_limit=100)))
    assert adapter.budget(40, 20).multiplier == 0.5
    adapter.on_sample(0.0, 10.0, 50, dropped=True)  # limit 45
    assert adapter.limit == 45
    assert adapter.budget(40, 20).multiplier == 0.25
    with pytest.raises(ValueError, match="optional_demand"):
        adapter.budget(1, math.nan)


# -- construction ---------------------------------------------------------------------------


def test_make_limit_builds_each_peer_policy_with_published_defaults() -> None:
    aimd = make_limit("aimd")
    assert isinstance(aimd, AimdLimit)
    assert aimd.limit == 20
    assert isinstance(make_limit("gradient"), Gradient2Limit)
    envoy_limit = make_limit("envoy-gradient", np.random.default_rng(0))
    assert isinstance(envoy_limit, EnvoyGradientLimit)
    assert envoy_limit.limit == 3
    with pytest.raises(ConfigError, match="random generator"):
        make_limit("envoy-gradient")
    with pytest.raises(ConfigError, match="unknown peer policy"):
        make_limit("vegas")


def test_bad_configs_name_the_field() -> None:
    with pytest.raises(ConfigError, match=r"peers\.aimd\.backoff_ratio"):
        AimdConfig(backoff_ratio=0.3)
    with pytest.raises(ConfigError, match=r"peers\.aimd\.initial_limit"):
        AimdConfig(initial_limit=500)
    with pytest.raises(ConfigError, match=r"peers\.gradient2\.rtt_tolerance"):
        Gradient2Config(rtt_tolerance=0.5)
    with pytest.raises(ConfigError) as err:
        EnvoyGradientConfig(jitter=2.0, min_concurrency=0, sample_interval_s=0.0)
    text = "\n".join(err.value.problems)
    for field in ("jitter", "min_concurrency", "sample_interval_s"):
        assert f"peers.envoy_gradient.{field}" in text
