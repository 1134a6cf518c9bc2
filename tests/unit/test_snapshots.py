"""Every stateful core follows one snapshot convention (headroom.kernel.jsonstate.Snapshotting):
built from its configuration, ``snapshot()`` to plain JSON, ``restore(state)`` in place."""

from __future__ import annotations

import inspect
import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest

from headroom.controllers.config import ControlConfig, CoverageSettings, PidSettings
from headroom.controllers.coverage import CoverageController
from headroom.controllers.levers import CapacityUse, ValueBook
from headroom.controllers.pid import PidController, RmaController
from headroom.controllers.plane import ControlPlane
from headroom.controllers.precompute import (
    PrecomputeConfig,
    PrecomputePlanner,
    UpliftModel,
    UserBook,
)
from headroom.controllers.precompute_jobs import JobBook, TokenBucket, usable_pools
from headroom.controllers.precompute_value import CalibrationSettings, UpliftCalibrator
from headroom.controllers.testing import arm_stats, capacity, observation
from headroom.defences.client_shedding import ClientShedder
from headroom.defences.histogram import DecayedLogHistogram, ValueRanker
from headroom.defences.peers import (
    AimdLimit,
    EnvoyGradientConfig,
    EnvoyGradientLimit,
    Gradient2Limit,
)
from headroom.defences.shedding import OptionalCapacity, OptionalWork, ServerShedder
from headroom.kernel.jsonstate import Snapshotting
from headroom.kernel.scenario_load import load_scenario
from headroom.streams.messages import Cost, Precompute
from headroom.workers.precompute_store import PrecomputeStore
from tests.signals import value_signal

REPO = Path(__file__).resolve().parents[2]
SCENARIO = load_scenario(REPO / "scenarios" / "precompute-remote.yaml")
CONTROL = ControlConfig.from_scenario(SCENARIO)
PRECOMPUTE = PrecomputeConfig.from_scenario(SCENARIO)
COSTS = CONTROL.costs
HOUR = 3600.0
AGES = [0.0, 4 * HOUR, 8 * HOUR]
UPLIFT = UpliftModel.from_tables(
    PRECOMPUTE, [1.0, 1.0], [0.8, 0.8], AGES, [[1.0 - 0.1 * a / HOUR for a in AGES]] * 2
)
SEGMENTS = PRECOMPUTE.segment_names


@dataclass(frozen=True)
class Case:
    """``make()`` builds one object from its configuration; ``drive(obj, rng)`` gives it state."""

    make: Callable[[], Any]
    drive: Callable[[Any, np.random.Generator], None]


def _pid(obj: PidController, rng: np.random.Generator) -> None:
    for i in range(int(rng.integers(3, 10))):
        y = float(rng.uniform(0.5, 1.5))
        obj.update(1.0 - y, y, float(i), 1.0)


def _rma(obj: RmaController, rng: np.random.Generator) -> None:
    for i in range(int(rng.integers(3, 10))):
        obj.step(float(rng.uniform(50.0, 300.0)), 60.0 * i, 1.0, 300.0, 4.0, 2.0)


def _coverage(obj: CoverageController, rng: np.random.Generator) -> None:
    for _ in range(int(rng.integers(3, 10))):
        r = obj.step(float(rng.uniform(50.0, 300.0)), None, 300.0, 4.0, 2.0, 1.0)
        obj.settle(r.command, r.command * float(rng.uniform(0.8, 1.0)), r.intended)


def _book(obj: ValueBook, rng: np.random.Generator) -> None:
    for seg in ("premium", "casual#2"):
        for arm, mean in (("treatment", 1.1), ("control", 1.0)):
            obj.add({(seg, "rma", arm): arm_stats(rng, 200, mean, 0.3, cpu_ms=50.0)})
    obj.add_units("rma", 100.0, float(rng.uniform(1.0, 50.0)))
    obj.decay(0.8)


def _plane(obj: ControlPlane, rng: np.random.Generator) -> None:
    for i in range(int(rng.integers(2, 5))):
        value = {
            ("casual", "rma", "treatment"): arm_stats(rng, 500, 1.1, 0.3),
            ("casual", "rma", "control"): arm_stats(rng, 500, 1.0, 0.3),
        }
        obj.step(
            observation(
                60.0 * (i + 1),
                region=SCENARIO.regions[0].name,
                p99_ms=float(rng.uniform(50.0, 250.0)),
                capacity=capacity(4.0, 2.0) + capacity(8.0, 4.0, remote=True),
                value=value,
                value_age_s=5.0,
            )
        )


def _users(obj: UserBook, rng: np.random.Generator) -> None:
    for t, user in enumerate(rng.integers(0, 100, size=60).tolist()):
        obj.observe(int(user), int(user) % 2, float(t))
    obj.set_stored(3, 1.0, 2.0)


def _planner(obj: PrecomputePlanner, rng: np.random.Generator) -> None:
    _users(obj.users, rng)
    obj.select(100.0, 5)


def _bucket(obj: TokenBucket, rng: np.random.Generator) -> None:
    obj.set_rate(float(rng.uniform(1.0, 10.0)), 1.0)
    obj.available(float(rng.uniform(2.0, 5.0)))
    obj.take(1)


def _jobs(obj: JobBook, rng: np.random.Generator) -> None:
    levels = capacity(2.0, float(rng.uniform(1.0, 3.0)), remote=True)
    pools = usable_pools(
        levels,
        0.0,
        use=CapacityUse.ASYNC,
        hardware=None,
        min_lifetime_s=0.0,
        safety_margin=0.0,
    )
    obj.set_pools(pools, 0.0)
    obj.start(0.0, [(u, 1) for u in range(int(rng.integers(1, 6)))])


def _calibrator(obj: UpliftCalibrator, rng: np.random.Generator) -> None:
    region = obj.region
    for arm, mean in (("treatment", 1.05), ("control", 1.0)):
        n = int(rng.integers(100, 500))
        obj.add_signal(value_signal("casual", arm, n, mean, 0.05, region=region), 10.0)
    obj.observe_staleness(1, float(rng.uniform(0.0, 3600.0)), 10.0)
    obj.add_signal(value_signal("casual", "control", 5, 1.0, region=region, lever="rma"), 10.0)


def _store(obj: PrecomputeStore, rng: np.random.Generator) -> None:
    for user in range(int(rng.integers(2, 8))):
        obj.put(
            Precompute(
                ts=float(user),
                region="r1",
                user=user,
                segment="casual",
                model="strong",
                expires_at=100.0 + user,
                ranking=(1, 2, 3),
                cost=Cost(cpu_ms=42.0, accelerator_ms=40.0),
            ),
            now=float(user),
        )
    obj.visit("r1", 1, now=10.0)
    obj.take_window()
    obj.visit("r1", 0, now=11.0)


def _hist(obj: DecayedLogHistogram | ValueRanker, rng: np.random.Generator) -> None:
    values = rng.lognormal(0.0, 1.0, size=50)
    if isinstance(obj, ValueRanker):
        obj.observe_many(values)
    else:
        obj.add_many(values)


def _server(obj: ServerShedder, rng: np.random.Generator) -> None:
    t = 0.0
    for _ in range(200):
        t += 0.001
        obj.observe(t, float(rng.uniform(0.0, 40.0)))
        obj.decide(t, OptionalWork(float(rng.uniform(0.0, 5.0)), 100, 10.0, 2.0))
    obj.on_capacity(OptionalCapacity(1.0, 0.5), t)


def _client(obj: ClientShedder, rng: np.random.Generator) -> None:
    t = 0.0
    for _ in range(30):
        t += float(rng.uniform(0.0, 0.5))
        obj.on_response(t, bool(rng.random() < 0.4))
        obj.apply(t, float(rng.random()), 10, True)


def _limit(obj: AimdLimit | Gradient2Limit | EnvoyGradientLimit, rng: np.random.Generator) -> None:
    t = 0.0
    for _ in range(80):
        t += float(rng.uniform(0.0, 0.1))
        obj.on_sample(t, float(rng.uniform(1.0, 50.0)), int(rng.integers(0, 40)), False)


CASES: dict[str, Case] = {
    "PidController": Case(lambda: PidController(PidSettings()), _pid),
    "RmaController": Case(lambda: RmaController(PidSettings(), 170.0, 400, 1200, COSTS), _rma),
    "CoverageController": Case(
        lambda: CoverageController(CoverageSettings(), 170.0, COSTS), _coverage
    ),
    "ValueBook": Case(ValueBook, _book),
    "ControlPlane": Case(lambda: ControlPlane(CONTROL, np.random.default_rng(0)), _plane),
    "UserBook": Case(lambda: UserBook(64, initial=4), _users),
    "PrecomputePlanner": Case(
        lambda: PrecomputePlanner(PRECOMPUTE, UPLIFT, np.random.default_rng(0)), _planner
    ),
    "TokenBucket": Case(lambda: TokenBucket(2.0, 5.0), _bucket),
    "JobBook": Case(lambda: JobBook(COSTS.precompute_per_job, 2.0), _jobs),
    "UpliftCalibrator": Case(
        lambda: UpliftCalibrator("r1", SEGMENTS, 10.0, PRECOMPUTE.max_ttl_s, CalibrationSettings()),
        _calibrator,
    ),
    "PrecomputeStore": Case(lambda: PrecomputeStore(max_results=100), _store),
    "DecayedLogHistogram": Case(DecayedLogHistogram, _hist),
    "ValueRanker": Case(ValueRanker, _hist),
    "ServerShedder": Case(lambda: ServerShedder(capacity=OptionalCapacity(3.0, 1.5)), _server),
    "ClientShedder": Case(ClientShedder, _client),
    "AimdLimit": Case(AimdLimit, _limit),
    "Gradient2Limit": Case(Gradient2Limit, _limit),
    "EnvoyGradientLimit": Case(
        lambda: EnvoyGradientLimit(EnvoyGradientConfig(), np.random.default_rng(0)), _limit
    ),
}


def assert_plain_json(obj: Any, path: str = "$") -> None:
    """Only what JSON holds as is: str keys, no NaN or infinity, no numpy or tuples."""
    if isinstance(obj, dict):
        for k, v in obj.items():
            assert type(k) is str, f"{path}: key {k!r} is not a str"
            assert_plain_json(v, f"{path}.{k}")
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            assert_plain_json(v, f"{path}[{i}]")
    elif isinstance(obj, float):
        assert math.isfinite(obj), f"{path}: {obj!r} is not finite"
    elif isinstance(obj, int) and not isinstance(obj, bool):
        assert -(2**63) <= obj < 2**63, f"{path}: {obj} needs encode_big_ints"
    else:
        assert obj is None or type(obj) in (str, bool), f"{path}: {type(obj).__name__}"


@pytest.mark.parametrize("name", sorted(CASES))
def test_each_core_is_snapshotting_and_restores_in_place_through_orjson(name: str) -> None:
    case = CASES[name]
    a = case.make()
    assert type(a).__name__ == name
    assert isinstance(a, Snapshotting)
    # restore is an instance method: objects are built from their configuration, never a snapshot
    assert inspect.isfunction(inspect.getattr_static(type(a), "restore"))
    case.drive(a, np.random.default_rng(1))
    snap = a.snapshot()
    assert type(snap) is dict
    assert_plain_json(snap)
    json.dumps(snap, allow_nan=False)
    stored = orjson.loads(orjson.dumps(snap))
    assert stored == snap
    b = case.make()
    case.drive(b, np.random.default_rng(2))  # a different state, replaced by the restore
    assert b.snapshot() != snap
    assert b.restore(stored) is None
    assert b.snapshot() == snap
    fresh = case.make()
    fresh.restore(orjson.loads(orjson.dumps(snap)))
    assert fresh.snapshot() == snap


def test_an_object_without_restore_in_place_is_not_snapshotting() -> None:
    class OnlySnapshot:
        def snapshot(self) -> dict[str, Any]:
            return {}

    assert not isinstance(OnlySnapshot(), Snapshotting)
    assert not isinstance([], Snapshotting)
