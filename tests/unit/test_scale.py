"""Scaling out: the key and partition rules, the controllers' ownership and epoch rules."""

from __future__ import annotations

import os
from collections import Counter

import pytest
from aiokafka.partitioner import murmur2 as aiokafka_murmur2
from hypothesis import given
from hypothesis import strategies as st

from headroom.controllers.app import (
    MAX_SESSION_TIMEOUT_S,
    MIN_SESSION_TIMEOUT_S,
    Controller,
    ControllerSettings,
    group_timeouts,
    owned_regions,
)
from headroom.controllers.config import ControlConfig
from headroom.controllers.testing import observation
from headroom.controllers.types import CapacityLevel
from headroom.kernel.codec import dumps, loads
from headroom.kernel.errors import ConfigError
from headroom.kernel.scenario_load import load_scenario
from headroom.kernel.settings import default_scenario_path
from headroom.streams.topics import (
    key_region,
    keyed_partition,
    murmur2,
    partition_for,
    region_partition,
    request_key,
    request_shard,
    spec_for,
)


@given(st.binary(max_size=64))
def test_murmur2_is_kafkas(data: bytes) -> None:
    assert murmur2(data) == aiokafka_murmur2(data)


def test_partition_for_is_the_default_partitioners() -> None:
    from aiokafka.partitioner import DefaultPartitioner

    part = DefaultPartitioner()
    for _ in range(200):
        key = os.urandom(1 + _ % 17)
        for n in (1, 3, 4, 12):
            assert partition_for(key, n) == part(key, list(range(n)), list(range(n)))
    assert region_partition("us-east", 4) == partition_for(b"us-east", 4)
    with pytest.raises(ConfigError):
        partition_for(b"x", 0)


def test_request_shard_is_stable_and_spreads_users_evenly() -> None:
    assert request_shard(918273, 4) == request_shard(918273, 4)
    assert [request_shard(u, 1) for u in range(50)] == [0] * 50
    counts = Counter(request_shard(u, 4) for u in range(40_000))
    assert set(counts) == {0, 1, 2, 3}
    assert all(9_000 < c < 11_000 for c in counts.values()), counts
    # sequential ids do not map to sequential shards (users of a segment may be a range)
    assert [request_shard(u, 4) for u in range(8)] != [u % 4 for u in range(8)]
    with pytest.raises(ConfigError):
        request_shard(1, 0)


def test_request_key_and_key_region() -> None:
    assert request_key("us-east", 3) == b"us-east/3"
    assert key_region(b"us-east/3") == "us-east"
    assert key_region(b"us-east") == "us-east"
    assert key_region("eu/west") == "eu/west"  # a tail that is no shard number stays
    assert key_region(None) is None
    assert spec_for("requests").key == "region/shard"


def test_group_timeouts_follow_the_interval_within_kafkas_bounds() -> None:
    assert group_timeouts(1.0)[0] == MIN_SESSION_TIMEOUT_S
    assert group_timeouts(15.0)[0] == 7.5
    assert group_timeouts(60.0)[0] == MAX_SESSION_TIMEOUT_S
    for interval in (1.0, 5.0, 15.0, 60.0, 600.0):
        session, heartbeat, rebalance = group_timeouts(interval)
        assert heartbeat * 3 <= session  # several heartbeats per session
        assert rebalance >= session


def test_owned_regions_are_those_of_the_partitions_held() -> None:
    regions = {"us-east", "eu-west", "ap-south", "it-east"}
    parts = {r: region_partition(r, 4) for r in regions}
    held = {parts["us-east"]}
    mine = owned_regions(regions, held, 4)
    assert "us-east" in mine
    assert all(parts[r] in held for r in mine)
    assert owned_regions(regions, set(range(4)), 4) == regions
    assert owned_regions(regions, set(), 4) == set()
    # two workers holding complementary partitions split the regions with no overlap
    other = set(range(4)) - held
    assert mine | owned_regions(regions, other, 4) == regions
    assert not mine & owned_regions(regions, other, 4)


def _controller() -> Controller:
    sc = load_scenario(default_scenario_path())
    settings = ControllerSettings(bootstrap="x:1", prefix="t.", scenario=sc)
    return Controller(settings, ControlConfig.from_scenario(sc))


def _region_record(ctl: Controller, region: str) -> dict[str, object]:
    """What the controller writes to the ``state`` table for ``region``."""
    snap = ctl.plane.snapshot()
    record: dict[str, object] = loads(dumps({**snap, "regions": {region: snap["regions"][region]}}))
    return record


def test_epochs_never_go_back_across_a_hand_over() -> None:
    """The new owner continues from the changelogged epoch (``previous + 1``); a step whose
    snapshot was lost is still outranked, since an epoch is at least ``floor(now)``."""
    a, b = _controller(), _controller()
    region = "us-east"
    t = 1_796_000_000.0
    epochs = []
    for k in range(3):
        a.owned.add(region)
        epochs.append(a.plane.step(observation(t + 15.0 * k, region=region)).epoch)
    record = _region_record(a, region)
    # a steps once more and dies before that step's snapshot is written
    epochs.append(a.plane.step(observation(t + 45.0, region=region)).epoch)
    b.adopt(region, record)
    assert region in b.owned
    epochs.append(b.plane.step(observation(t + 60.0, region=region)).epoch)
    assert epochs == sorted(set(epochs)), epochs  # strictly increasing over the hand-over
    # with the snapshot of the last step the new owner continues exactly at previous + 1,
    # even when its clock is behind the old owner's
    fresh = _controller()
    fresh.adopt(region, _region_record(b, region))
    behind = fresh.plane.step(observation(t + 30.0, region=region)).epoch
    assert behind == epochs[-1] + 1


def test_adopt_keeps_the_other_regions_and_release_drops_the_lost_ones() -> None:
    a = _controller()
    t = 1_796_000_000.0
    for region in ("us-east", "eu-west"):
        a.owned.add(region)
        a.plane.step(observation(t, region=region))
    before = a.plane.snapshot()["regions"]["eu-west"]
    donor = _controller()
    donor.plane.step(observation(t, region="ap-south"))
    donor.plane.step(observation(t + 15.0, region="ap-south"))
    a.adopt("ap-south", _region_record(donor, "ap-south"))
    regions = a.plane.snapshot()["regions"]
    assert set(regions) == {"us-east", "eu-west", "ap-south"}
    assert regions["eu-west"] == before
    assert regions["ap-south"]["epoch"] == donor.plane.snapshot()["regions"]["ap-south"]["epoch"]
    a.adopt("it-east", None)  # nothing in the table: starts afresh
    assert "it-east" in a.owned
    # the value books of the producers on the lost partitions go with the region
    a.value_seen = {"p.1": [3, 4, 0], "p.2": [1, 2, 0]}
    a.value_partition = {"p.1": 1, "p.2": 2}
    a.release({"us-east"}, {1})
    assert "us-east" not in a.plane.snapshot()["regions"]
    assert "us-east" not in a.owned
    assert set(a.value_seen) == {"p.2"}
    assert set(a.value_partition) == {"p.2"}


def test_a_replayed_request_goes_to_its_shards_partition() -> None:
    assert keyed_partition("requests", b"us-east/3", 4) == 3
    assert keyed_partition("requests", b"us-east/5", 4) == 1  # a topic with fewer partitions
    assert keyed_partition("requests", b"us-east", 4) is None  # a region key: murmur2
    assert keyed_partition("capacity", b"us-east/3", 4) is None
    assert keyed_partition(None, b"us-east/3", 4) is None
    assert keyed_partition("requests", None, 4) is None


def test_a_requests_key_names_its_region_and_shard() -> None:
    from headroom.streams import messages

    req = messages.Request(
        ts=1.0, id="q-1", region="us-east", segment="casual", value=0.5, eligible=True, user=918273
    )
    shard = req.shard(4)
    assert shard == request_shard(918273, 4)
    assert req.shard_key(4) == f"us-east/{shard}".encode()
    assert key_region(req.shard_key(4)) == "us-east"
    assert keyed_partition("requests", req.shard_key(4), 4) == shard


# -- a kill or pause of one of several processes: the event's ``index`` ------------------------

INDEXED = [
    {"at_s": 10, "kind": "kill", "process": "controller", "index": 1, "restart_after_s": 2},
    {"at_s": 20, "kind": "pause", "process": "client", "region": "us-east", "index": 2,
     "duration_s": 3},
    {"at_s": 30, "kind": "kill", "process": "server", "region": "us-east", "pool": "dedicated",
     "index": 1, "restart_after_s": 2},
    {"at_s": 40, "kind": "kill", "process": "controller", "restart_after_s": 2},
    {"at_s": 50, "kind": "kill", "process": "client", "region": "us-east", "index": 0,
     "restart_after_s": 2},
]  # fmt: skip


def test_an_index_picks_one_of_several_processes() -> None:
    from headroom.kernel.scenario_schema import SCHEMA
    from headroom.workers.faults import fault_targets
    from tests.unit.test_faults import doc, load
    from tests.unit.test_scenario_load import schema_problems

    sc = load(doc(INDEXED))
    assert [e.index for e in sc.events] == [1, 2, 1, None, 0]
    assert schema_problems(SCHEMA, doc(INDEXED)) == []
    names = ["controller", "controller-1", "client-us-east", "client-us-east-1", "client-us-east-2",
             "server-us-east-dedicated-0", "server-us-east-dedicated-1"]  # fmt: skip
    assert [fault_targets(e, names) for e in sc.events] == [
        ["controller-1"], ["client-us-east-2"], ["server-us-east-dedicated-1"], ["controller"],
        ["client-us-east"],
    ]  # fmt: skip
    # an index the stack does not run names nothing (up refuses the scenario before it starts)
    assert fault_targets(sc.events[0], ["controller"]) == []


@pytest.mark.parametrize(
    ("event", "expected"),
    [
        ({"at_s": 1, "kind": "kill", "process": "feed", "index": 1, "restart_after_s": 1},
         "events[0].index: the feed runs once"),
        ({"at_s": 1, "kind": "kill", "process": "controller", "index": -1, "restart_after_s": 1},
         "events[0].index: must be"),
        ({"at_s": 1, "kind": "broker_restart", "down_s": 1, "index": 1},
         "events[0].index: not allowed for a broker_restart event"),
    ],
)  # fmt: skip
def test_a_bad_index_is_named(event: dict[str, object], expected: str) -> None:
    from headroom.kernel.scenario_schema import SCHEMA
    from tests.unit.test_faults import doc, problems
    from tests.unit.test_scenario_load import schema_problems

    got = problems(doc([event]))
    assert any(p.startswith(expected) for p in got), got
    if "not allowed" in expected or "must be" in expected:
        assert schema_problems(SCHEMA, doc([event]))


def test_the_capacity_agent_steps_between_ticks_only_for_an_owned_region_it_heard() -> None:
    """``Controller.reacts``: the plane's rule (controllers/react.py), for a region this worker
    owns, after its tables were adopted, with latency heard since its last step."""
    ctl = _controller()
    region, t0 = "us-east", 1_796_000_000.0
    gpu = CapacityLevel("accelerator", "gpu-b", "opportunistic", 2.0, ts=t0 + 80.0)
    ctl.plane.step(observation(t0 + 60.0, region=region))  # the tick at k = 1
    ctl.aggregator.observe(region, t0 + 60.0)
    before = ctl.aggregator.capacity(region, t0 + 80.0)
    ctl.aggregator.add_capacity(region, gpu)
    now = t0 + 80.0
    assert not ctl.reacts(region, before, now, t0=t0)  # not restored yet
    ctl.restored = True
    assert not ctl.reacts(region, before, now, t0=t0)  # not owned
    ctl.owned.add(region)
    assert not ctl.reacts(region, before, now, t0=t0)  # no latency since the last step
    ctl.aggregator.add_latency(region, t0 + 70.0, "base", 100, None, (50.0,))
    assert ctl.reacts(region, before, now, t0=t0)
    assert not ctl.reacts(region, before, t0 + 110.0, t0=t0)  # 10 s before the next tick
    assert not ctl.reacts(region, ctl.aggregator.capacity(region, now), now, t0=t0)  # no change
