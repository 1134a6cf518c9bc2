"""Google SRE client-side adaptive throttling (defences/peers.py, ``SreThrottle``)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from headroom.defences.peers import SreThrottle
from headroom.kernel.errors import ConfigError


def test_nothing_is_rejected_while_every_attempt_is_accepted() -> None:
    t = SreThrottle()
    for s in range(300):
        t.record(float(s), 50.0, 50.0)
        assert t.reject_probability(float(s)) == 0.0


def test_the_books_formula_with_k_2() -> None:
    t = SreThrottle(k=2.0)
    t.record(0.0, 100.0, 0.0)
    assert t.reject_probability(0.0) == pytest.approx(100.0 / 101.0)
    t.record(1.0, 100.0, 60.0)  # 200 requests, 60 accepts: (200 - 120) / 201
    assert t.reject_probability(1.0) == pytest.approx(80.0 / 201.0)
    t.record(2.0, 100.0, 90.0)  # half of all 300 accepted: no throttling at K = 2
    assert t.reject_probability(2.0) == 0.0


def test_old_attempts_leave_the_window() -> None:
    t = SreThrottle(window_s=120.0)
    t.record(0.0, 1000.0, 0.0)
    assert t.reject_probability(60.0) > 0.9
    assert t.reject_probability(121.0) == 0.0  # the failing bucket is two minutes old


def test_bad_input_is_refused() -> None:
    with pytest.raises(ConfigError):
        SreThrottle(k=0.5)
    with pytest.raises(ConfigError):
        SreThrottle(window_s=0.0)
    t = SreThrottle()
    with pytest.raises(ValueError, match="accepts"):
        t.record(0.0, 1.0, 2.0)  # more accepts than attempts
    with pytest.raises(ValueError, match="accepts"):
        t.record(0.0, -1.0, 0.0)


@given(
    st.lists(st.tuples(st.floats(0.0, 1e4), st.floats(0.0, 1.0)), min_size=1, max_size=40),
    st.floats(1.0, 4.0),
)
def test_probability_is_a_probability_and_matches_the_window_sums(
    steps: list[tuple[float, float]], k: float
) -> None:
    t = SreThrottle(k=k, window_s=1e9)
    req = acc = 0.0
    for i, (n, share) in enumerate(steps):
        t.record(float(i), n, n * share)
        req += n
        acc += n * share
    p = t.reject_probability(float(len(steps)))
    assert 0.0 <= p < 1.0
    assert p == pytest.approx(max(0.0, (req - k * acc) / (req + 1.0)), abs=1e-9)
