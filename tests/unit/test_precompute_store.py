"""The precompute store and the client cache's pure part.

Properties: a result past its expiry is never served, whatever the order of puts, visits,
expiries and deletions; every result ends exactly once and is counted by how it ended (so every
expired-unused result is counted); the store never holds more than its bound.
"""

from __future__ import annotations

import statistics

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from headroom.streams.messages import Cost, Precompute, precompute_key
from headroom.workers.precompute_lookup import PrecomputeCache, parse_precompute_key
from headroom.workers.precompute_store import (
    STALENESS_SAMPLES,
    PrecomputeStore,
    PutOutcome,
    VisitOutcome,
    quantile_samples,
)

REGION = "us-east"


def result(
    user: int, ts: float, expires_at: float, region: str = REGION, top: int = 1
) -> Precompute:
    return Precompute(
        ts=ts,
        region=region,
        user=user,
        segment="casual",
        model="strong",
        expires_at=expires_at,
        ranking=(top, top + 1, top + 2),
        cost=Cost(cpu_ms=42.0, accelerator_ms=40.0),
    )


# -- the rules one at a time ---------------------------------------------------------------------


def test_put_outcomes_newest_wins_redeliveries_and_late_results_change_nothing() -> None:
    store = PrecomputeStore()
    first = result(1, ts=10.0, expires_at=100.0)
    assert store.put(first, now=10.0) is PutOutcome.STORED
    assert store.put(first, now=11.0) is PutOutcome.DUPLICATE
    assert store.put(result(1, ts=5.0, expires_at=200.0), now=11.0) is PutOutcome.STALE
    newer = result(1, ts=20.0, expires_at=120.0, top=7)
    assert store.put(newer, now=20.0) is PutOutcome.REPLACED
    assert store.lookup(REGION, 1, now=21.0) == newer
    assert store.put(result(2, ts=0.0, expires_at=5.0), now=20.0) is PutOutcome.LATE
    c = store.counts
    assert (c.jobs, c.superseded_unused, c.late) == (2, 1, 1)
    assert len(store) == 1


def test_a_result_is_served_until_its_expiry_and_never_after_even_before_expire_runs() -> None:
    store = PrecomputeStore()
    store.put(result(1, ts=0.0, expires_at=50.0), now=0.0)
    hit = store.visit(REGION, 1, now=50.0)
    assert hit.outcome is VisitOutcome.HIT
    assert hit.staleness_s == 50.0
    assert store.lookup(REGION, 1, now=50.000001) is None
    assert store.visit(REGION, 1, now=51.0).outcome is VisitOutcome.MISS
    c = store.counts
    assert (c.visits, c.hits, c.used, c.expired_used, c.expired_unused) == (2, 1, 1, 1, 0)


def test_expire_returns_the_unused_apart_and_counts_them() -> None:
    store = PrecomputeStore()
    for user in range(6):
        store.put(result(user, ts=0.0, expires_at=10.0 + user), now=0.0)
    store.visit(REGION, 0, now=1.0)
    store.visit(REGION, 3, now=1.0)
    gone = store.expire(now=13.5)  # users 0..3 expired
    assert sorted(r.user for r in gone.unused) == [1, 2]
    assert sorted(r.user for r in gone.used) == [0, 3]
    assert store.counts.expired_unused == 2
    assert len(store) == 2
    assert store.next_expiry() == 14.0


def test_holdout_visits_see_the_result_but_do_not_serve_it() -> None:
    store = PrecomputeStore()
    store.put(result(1, ts=0.0, expires_at=100.0), now=0.0)
    held = store.visit(REGION, 1, now=5.0, hold_out=True)
    assert held.outcome is VisitOutcome.HELD_OUT
    assert held.result is not None
    assert store.served(REGION, 1) == 0
    assert store.visit(REGION, 2, now=5.0, hold_out=True).outcome is VisitOutcome.MISS
    c = store.counts
    assert (c.visits, c.hits, c.held_out, c.used) == (2, 0, 1, 0)


def test_the_bound_evicts_the_result_closest_to_its_expiry() -> None:
    store = PrecomputeStore(max_results=3)
    for user, exp in [(1, 30.0), (2, 10.0), (3, 20.0)]:
        store.put(result(user, ts=0.0, expires_at=exp), now=0.0)
    store.visit(REGION, 2, now=1.0)
    store.put(result(4, ts=1.0, expires_at=40.0), now=1.0)
    assert (REGION, 2) not in store
    assert len(store) == 3
    assert store.counts.evicted_used == 1


def test_tombstone_remove_counts_a_deletion_once() -> None:
    store = PrecomputeStore()
    store.put(result(1, ts=0.0, expires_at=10.0), now=0.0)
    assert store.remove(REGION, 1)
    assert not store.remove(REGION, 1)
    assert store.counts.deleted_unused == 1
    assert store.expire(now=100.0).all == ()  # its heap item is skipped, not counted again


def test_windows_report_increments_and_at_most_32_staleness_samples_at_quantiles() -> None:
    store = PrecomputeStore()
    store.put(result(1, ts=0.0, expires_at=1e9), now=0.0)
    for i in range(1000):
        store.visit(REGION, 1, now=float(i))
    w1 = store.take_window()
    assert (w1.counts.visits, w1.counts.hits, w1.counts.used, w1.counts.jobs) == (1000, 1000, 1, 1)
    assert len(w1.staleness_s) == STALENESS_SAMPLES
    assert statistics.median(w1.staleness_s) == pytest.approx(499.5, abs=32)
    store.visit(REGION, 1, now=2000.0)
    w2 = store.take_window()
    assert (w2.counts.visits, w2.counts.used, w2.counts.jobs) == (1, 0, 0)
    assert w2.staleness_s == (2000.0,)
    fields = w2.client_fields()
    assert set(fields) == {"used", "expired_unused", "visits", "hits", "staleness_s"}


def test_quantile_samples_keep_small_lists_and_spread_large_ones() -> None:
    assert quantile_samples([1.0, 2.0], 32) == (1.0, 2.0)
    values = [float(i) for i in range(100)]
    picked = quantile_samples(values, 4)
    assert picked == (12.0, 37.0, 62.0, 87.0)


def test_snapshot_restore_keeps_results_served_counts_and_counters() -> None:
    store = PrecomputeStore(max_results=10)
    for user in range(5):
        store.put(result(user, ts=float(user), expires_at=100.0 + user), now=float(user))
    store.visit(REGION, 2, now=10.0)
    store.expire(now=0.0)
    restored = PrecomputeStore(max_results=10)
    restored.restore(store.snapshot())
    assert restored.counts == store.counts
    assert restored.served(REGION, 2) == 1
    assert [r.user for r in restored.expire(now=102.5).unused] == [0, 1]
    assert restored.counts.expired_unused == 2


# -- the properties ------------------------------------------------------------------------------

ops = st.lists(
    st.one_of(
        st.tuples(st.just("put"), st.integers(0, 7), st.floats(0.0, 30.0), st.floats(0.0, 60.0)),
        st.tuples(st.just("visit"), st.integers(0, 7), st.booleans()),
        st.tuples(st.just("lookup"), st.integers(0, 7)),
        st.tuples(st.just("expire")),
        st.tuples(st.just("remove"), st.integers(0, 7)),
        st.tuples(st.just("advance"), st.floats(0.0, 20.0)),
    ),
    max_size=80,
)


@settings(max_examples=300)
@given(ops=ops, bound=st.integers(1, 8))
def test_never_serves_past_expiry_and_every_result_ends_counted_once(
    ops: list[tuple], bound: int
) -> None:
    store = PrecomputeStore(max_results=bound)
    now = 0.0
    stored_at: dict[int, Precompute] = {}  # the reference: what should be live, by user
    served: set[tuple[int, float]] = set()
    ended_unused_expired = 0
    for op in ops:
        kind = op[0]
        if kind == "advance":
            now += op[1]
        elif kind == "put":
            _, user, age, life = op
            r = result(user, ts=max(now - age, 0.0), expires_at=max(now - age, 0.0) + life)
            outcome = store.put(r, now)
            if outcome in (PutOutcome.STORED, PutOutcome.REPLACED):
                stored_at[user] = r
        elif kind == "visit":
            _, user, hold = op
            before = store.counts.expired_unused
            v = store.visit(REGION, user, now, hold_out=hold)
            ended_unused_expired += store.counts.expired_unused - before
            if v.result is not None:
                assert v.result.expires_at >= now  # never a result past its expiry
                if v.outcome is VisitOutcome.HIT:
                    served.add((user, v.result.ts))
        elif kind == "lookup":
            r = store.lookup(REGION, op[1], now)
            assert r is None or r.expires_at >= now
        elif kind == "expire":
            gone = store.expire(now)
            ended_unused_expired += len(gone.unused)
            for r in gone.all:
                assert r.expires_at < now
                assert ((r.user, r.ts) in served) == (r in gone.used)
        elif kind == "remove":
            store.remove(REGION, op[1])
        assert len(store) <= bound
        c = store.counts
        assert c.jobs == len(store) + c.ended()
        assert c.hits + c.held_out <= c.visits
        assert c.used <= c.jobs
    assert store.counts.expired_unused == ended_unused_expired
    # at the end of time everything left expires: jobs = used-or-not, all accounted for
    store.expire(1e12)
    c = store.counts
    assert len(store) == 0
    unused_total = c.expired_unused + c.superseded_unused + c.evicted_unused + c.deleted_unused
    assert c.jobs == c.used + unused_total


# -- the cache's pure part -----------------------------------------------------------------------


def test_cache_applies_its_region_deletes_on_tombstones_and_ignores_other_regions() -> None:
    cache = PrecomputeCache(REGION)
    r = result(5, ts=0.0, expires_at=100.0)
    assert cache.apply(r.key(), r, now=1.0)
    other = result(5, ts=0.0, expires_at=100.0, region="eu-west")
    assert not cache.apply(other.key(), other, now=1.0)
    assert cache.lookup(5, now=2.0) == r
    assert cache.visit(5, now=2.0).outcome is VisitOutcome.HIT
    assert not cache.apply(precompute_key("eu-west", 5), None, now=3.0)
    assert cache.apply(precompute_key(REGION, 5), None, now=3.0)
    assert cache.lookup(5, now=3.0) is None
    assert (cache.counts.tombstones, cache.counts.foreign) == (1, 2)
    window = cache.take_window()
    assert (window["hits"], window["used"], window["visits"]) == (1, 1, 1)


def test_cache_rejects_a_record_whose_key_does_not_match_its_body() -> None:
    cache = PrecomputeCache(REGION)
    r = result(5, ts=0.0, expires_at=100.0)
    with pytest.raises(ValueError, match="does not match"):
        cache.apply(precompute_key(REGION, 6), r, now=1.0)
    with pytest.raises(ValueError, match="region/user"):
        cache.apply(b"garbage", None, now=1.0)


def test_cache_reports_staleness_in_scenario_seconds() -> None:
    cache = PrecomputeCache(REGION, speed=10.0)
    r = result(5, ts=0.0, expires_at=100.0)
    cache.apply(r.key(), r, now=0.0)
    cache.visit(5, now=3.0)
    assert cache.take_window()["staleness_s"] == [30.0]


def test_parse_precompute_key() -> None:
    assert parse_precompute_key(b"us-east/918273") == ("us-east", 918273)
    assert parse_precompute_key(b"a/b/7") == ("a/b", 7)
    assert parse_precompute_key(b"us-east/") is None
    assert parse_precompute_key(b"\xff/1") is None
    assert parse_precompute_key(None) is None


def test_a_result_ranked_for_another_segment_is_not_served() -> None:
    store = PrecomputeStore()
    store.put(result(1, ts=0.0, expires_at=100.0), now=0.0)  # ranked for "casual"
    assert store.visit(REGION, 1, now=1.0, segment="premium").outcome is VisitOutcome.MISS
    assert store.visit(REGION, 1, now=1.0, segment="casual").outcome is VisitOutcome.HIT
    c = store.counts
    assert (c.visits, c.hits, c.segment_mismatch) == (2, 1, 1)
