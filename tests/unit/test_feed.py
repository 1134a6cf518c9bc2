"""The feed's schedule (pure): capacity levels and their reasons, seeded requests per second."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from headroom.kernel.errors import ConfigError
from headroom.kernel.scenario_load import load_scenario
from headroom.kernel.schedule import ELIGIBLE_SHARE, FeedSchedule
from headroom.streams import messages
from headroom.workers.feed import FeedConfig

SCENARIO = Path(__file__).parents[1] / "integration" / "scenarios" / "stack-short.yaml"
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def schedule() -> FeedSchedule:
    return FeedSchedule(load_scenario(SCENARIO))


def test_capacity_updates_are_levels_with_the_reason_of_each_change(
    schedule: FeedSchedule,
) -> None:
    ups = [(u.t, u.resource, u.units, u.before, u.reason) for u in schedule.capacity_updates()]
    assert ups == [
        (0.0, "cpu", 3.0, 0.0, "grant"),
        (0.0, "accelerator", 2.0, 0.0, "grant"),
        (60.0, "accelerator", 0.0, 2.0, "preempt"),
        (75.0, "accelerator", 2.0, 0.0, "grant"),
        (85.0, "cpu", 1.5, 3.0, "reclaim"),
    ]
    reclaims = [u for u in schedule.capacity_updates() if u.is_reclaim]
    assert [u.t for u in reclaims] == [60.0, 85.0]


def test_requests_are_seeded_per_second_and_in_arrival_order(schedule: FeedSchedule) -> None:
    a = schedule.requests(7)
    b = FeedSchedule(load_scenario(SCENARIO)).requests(7)
    assert a == b
    times = [t for t, _r, _f in a]
    assert times == sorted(times)
    assert all(7.0 <= t < 8.0 for t in times)
    assert len(a) == int(schedule.traces.regions[0].arrivals[7])
    other_seed = FeedSchedule(load_scenario(SCENARIO), seed=12).requests(7)
    assert other_seed != a


def test_requests_follow_the_scenario_mix_and_are_valid_messages(schedule: FeedSchedule) -> None:
    rows = [r for s in range(60) for r in schedule.requests(s)]
    # ~40 rps for a minute
    assert 2000 < len(rows) < 2800
    segments = [f["segment"] for _t, _r, f in rows]
    assert 0.16 < segments.count("premium") / len(rows) < 0.24
    casual = np.array([f["value"] for _t, _r, f in rows if f["segment"] == "casual"])
    assert 0.5 < casual.mean() < 0.7  # log-normal with mean 0.6
    ids = [f["id"] for _t, _r, f in rows]
    assert len(set(ids)) == len(ids)
    assert all(f["eligible"] for _t, _r, f in rows) == (ELIGIBLE_SHARE == 1.0)
    for t, region, fields in rows[:50]:
        msg = messages.Request(ts=1796000000.0 + t, region=region, **fields)
        assert messages.decode("requests", messages.encode(msg)) == msg


def test_levels_in_force_and_offered_unit_seconds(schedule: FeedSchedule) -> None:
    assert schedule.levels_at(0, 10.0) == {"cpu": 3.0, "accelerator": 2.0}
    assert schedule.levels_at(0, 65.0) == {"cpu": 3.0, "accelerator": 0.0}
    assert schedule.levels_at(0, 100.0) == {"cpu": 1.5, "accelerator": 2.0}
    offered = schedule.traces.offered_unit_s(0, 55.0, 65.0)
    assert offered == {"cpu": 30.0, "accelerator": 10.0}


def test_feed_config_names_bad_flags() -> None:
    with pytest.raises(ConfigError, match="--speed") as info:
        FeedConfig(t0=1.0, speed=0.0, duration_s=-1.0)
    assert any("--duration" in p for p in info.value.problems)


def test_users_belong_to_one_segment_and_return_at_its_rate() -> None:
    from headroom.kernel.schedule import users_by_segment

    scenario = load_scenario(ROOT / "scenarios" / "precompute-remote.yaml")
    feed = FeedSchedule(scenario)
    users, offset = users_by_segment(scenario)
    seen: dict[int, str] = {}
    per_segment: dict[str, int] = {}
    for second in range(600):
        for _, _, body in feed.requests(second):
            s = scenario.segments.index(scenario.segment(body["segment"]))
            assert offset[s] <= body["user"] < offset[s] + users[s]
            assert seen.setdefault(body["user"], body["segment"]) == body["segment"]
            per_segment[body["segment"]] = per_segment.get(body["segment"], 0) + 1
    # visits per user per hour = the segment's return rate (600 s of ~100 rps: within 10 %)
    for s, seg in enumerate(scenario.segments):
        rate = per_segment[seg.name] / users[s] * 3600.0 / 600.0
        assert rate == pytest.approx(seg.return_rate_per_h, rel=0.1)
    # without the precompute fields every request gets a fresh 31-bit id
    quick = FeedSchedule(load_scenario(ROOT / "scenarios" / "quickstart.yaml"))
    ids = [body["user"] for _, _, body in quick.requests(0)]
    assert len(set(ids)) == len(ids)
    assert all(0 <= u < 2**31 for u in ids)
