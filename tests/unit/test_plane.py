"""ControlPlane: bounds for any input, budgets, epochs, snapshot/restore, bumpless, config."""

from __future__ import annotations

import copy
import dataclasses
import json

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from headroom.controllers.config import ControlConfig, PidSettings
from headroom.controllers.plane import ControlPlane, SnapshotError, strong_replica_units
from headroom.controllers.testing import arm_stats, capacity, observation
from headroom.controllers.types import ArmStats, CapacityLevel, RegionObservation
from headroom.kernel.errors import ConfigError
from headroom.kernel.scenario import (
    Dedicated,
    Models,
    ModelSpec,
    Region,
    Scenario,
    Segment,
    Slo,
    Traffic,
    ValueDist,
    World,
)


def scenario(**world: float) -> Scenario:
    return Scenario(
        name="unit",
        seed=1,
        duration_s=3600.0,
        slo=Slo(200.0, 10.0),
        world=World(
            ads=1000, dim=8, base_candidates=400, max_candidates=1200, holdout=0.02, **world
        ),
        models=Models(
            base=ModelSpec(0.1, 0.02, ("gpu-a", "gpu-b")),
            strong=ModelSpec(0.005, 0.1, ("gpu-b",), load_s=120.0),
        ),
        segments=(
            Segment("premium", 0.15, ValueDist(3.0, 0.8), 0.15, 0.10, return_rate_per_h=2.0),
            Segment("casual", 0.85, ValueDist(0.6, 0.6), 0.5, 0.2, return_rate_per_h=1.0),
        ),
        regions=(Region("us-east", Dedicated(24, 4, "gpu-a"), Traffic(rps=300.0)),),
    )


CFG = ControlConfig.from_scenario(scenario())
CFG_PRE = ControlConfig.from_scenario(scenario(drift_per_h=0.1, users=1000))


def proven(rng: np.random.Generator) -> dict[tuple[str, str, str], ArmStats]:
    out = {}
    for lever, d in (("rma", 0.05), ("sbm", 0.3), ("precompute", 0.1)):
        for seg in ("premium", "casual"):
            # the cost the live levers' servers report: 200 extra candidates, a strong ranking
            cost = {"rma": (2000 * 200 * 0.1, 2000 * 200 * 0.02), "sbm": (4000.0, 80_000.0)}
            out[(seg, lever, "treatment")] = arm_stats(
                rng, 2000, 1.0 + d, 0.5, *cost.get(lever, (0.0, 0.0))
            )
            out[(seg, lever, "control")] = arm_stats(rng, 2000, 1.0, 0.5)
    return out


# -- strategies for hostile but NaN-free observations ---------------------------------------

big = st.floats(min_value=0.0, max_value=1e12, allow_nan=False, allow_infinity=False)
levels = st.builds(
    CapacityLevel,
    resource=st.sampled_from(["cpu", "accelerator"]),
    hardware=st.sampled_from(["any", "gpu-a", "gpu-b"]),
    pool=st.sampled_from(["opportunistic", "dedicated"]),
    units=big,
    expires_in_s=st.one_of(st.none(), big),
    remote=st.booleans(),
    ts=st.floats(0.0, 1e6),
)
stats = st.builds(
    ArmStats,
    n=st.integers(0, 10**6),
    value_sum=st.floats(-1e9, 1e9),
    value_sq_sum=st.floats(0.0, 1e12),
)
values = st.dictionaries(
    st.tuples(
        st.sampled_from(["premium", "casual", "ghost"]),
        st.sampled_from(["rma", "sbm", "precompute", "other"]),
        st.sampled_from(["treatment", "control"]),
    ),
    stats,
    max_size=8,
)


@st.composite
def observations(draw: st.DrawFn, now: float) -> RegionObservation:
    rps = draw(big)
    return RegionObservation(
        region="r",
        now=now,
        window_s=draw(st.floats(0.0, 1e5)),
        p99_ms={"all": draw(st.one_of(st.none(), big)), "sbm": draw(st.one_of(st.none(), big))},
        request_rps=rps,
        eligible_rps=draw(big),
        segment_rps=draw(st.dictionaries(st.sampled_from(["premium", "casual", "x"]), big)),
        capacity=tuple(draw(st.lists(levels, max_size=5))),
        value=draw(values),
        observed_coverage=draw(st.one_of(st.none(), st.floats(0.0, 1.0))),
        value_age_s=draw(st.one_of(st.none(), big)),
    )


@st.composite
def histories(draw: st.DrawFn, min_size: int = 1, max_size: int = 6) -> list[RegionObservation]:
    n = draw(st.integers(min_size, max_size))
    return [draw(observations(60.0 * (i + 1))) for i in range(n)]


def check_bounds(cfg: ControlConfig, obs: RegionObservation, t, plane: ControlPlane) -> None:
    assert cfg.base_candidates <= t.rma_candidates <= cfg.max_candidates
    assert t.rma_base == cfg.base_candidates
    assert t.rma_max == cfg.max_candidates
    assert 0.0 <= t.sbm_coverage <= cfg.coverage.max_coverage
    assert all(0.0 <= p <= 1.0 for p in t.sbm_segments.values())
    assert set(cfg.segment_names) <= set(t.sbm_segments)
    assert t.budget_cpu >= 0.0
    assert t.budget_accelerator >= 0.0
    assert t.precompute_jobs_per_s >= 0.0
    assert t.ttl_s == cfg.ttl_s
    json.dumps(plane.decision(obs.region).event_fields())  # the event is serialisable
    # budgets: RMA's extra work and SBM's intended share fit what the allocator granted
    rps = obs.request_rps
    elig = min(obs.eligible_rps, rps)
    rma_cpu = sum(s.cpu for s in t.allocation if s.lever == "rma")
    rma_acc = sum(s.accelerator for s in t.allocation if s.lever == "rma")
    extra = t.rma_candidates - t.rma_base
    assert extra * rps * cfg.costs.rma_per_candidate.cpu_s <= rma_cpu * (1 + 1e-9) + 1e-12
    assert extra * rps * cfg.costs.rma_per_candidate.accelerator_s <= rma_acc * (1 + 1e-9) + 1e-12
    sbm_acc = sum(s.accelerator for s in t.allocation if s.lever == "sbm")
    raised = strong_replica_units(sbm_acc, obs.capacity, cfg.costs.strong_hardware)
    if raised > sbm_acc:  # a strong replica holds a whole device of the largest strong pool
        sbm_cpu = sum(s.cpu for s in t.allocation if s.lever == "sbm")
        assert t.sbm_coverage * elig * cfg.costs.sbm_per_request.cpu_s <= (
            sbm_cpu * raised / sbm_acc * (1 + 1e-9) + 1e-12
        )
        sbm_acc = raised
    assert t.sbm_coverage * elig * cfg.costs.sbm_per_request.accelerator_s <= (
        sbm_acc * (1 + 1e-9) + 1e-12
    )
    safe_acc = sum(
        c.units for c in obs.capacity if c.resource == "accelerator" and c.pool == "opportunistic"
    )
    assert t.budget_accelerator <= safe_acc * (1 + 1e-9) + 1e-12


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(history=histories(max_size=6), precompute=st.booleans())
def test_every_target_is_within_bounds_and_budgets_for_any_finite_input(
    history, precompute
) -> None:
    cfg = CFG_PRE if precompute else CFG
    plane = ControlPlane(cfg, np.random.default_rng(0))
    epochs = []
    for obs in history:
        t = plane.step(obs)
        check_bounds(cfg, obs, t, plane)
        epochs.append(t.epoch)
    assert epochs == sorted(set(epochs))  # strictly increasing


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    before=histories(min_size=0, max_size=5), after=histories(max_size=3), seed=st.integers(0, 99)
)
def test_snapshot_then_restore_gives_identical_next_outputs(before, after, seed) -> None:
    a = ControlPlane(CFG_PRE, np.random.default_rng(seed))
    for obs in before:
        a.step(obs)
    snap = json.loads(json.dumps(a.snapshot()))  # through JSON, as a table would store it
    b = ControlPlane(CFG_PRE, np.random.Generator(np.random.PCG64()))
    b.restore(snap)  # every region's stream with it
    for obs in after:
        ta, tb = a.step(obs), b.step(obs)
        assert ta == tb


def test_the_snapshot_keeps_what_the_last_split_gave_each_lever() -> None:
    # the allocator prices devices the strong model must first load below the ones it holds:
    # a restored plane knows what it held (an older snapshot without it prices all as loaded)
    cap = capacity(cpu=8.0, accelerator=2.0, expires_in_s=900.0)
    a = ControlPlane(CFG, np.random.default_rng(0))
    a.step(observation(60.0, capacity=cap, value=proven(np.random.default_rng(7)), value_age_s=5.0))
    snap = json.loads(json.dumps(a.snapshot()))
    held = snap["regions"]["us-east"]["held"]
    assert any(lever == "sbm" and resource == "accelerator" for lever, resource, *_ in held)
    b = ControlPlane(CFG, np.random.default_rng(1))
    b.restore(snap)
    assert json.loads(json.dumps(b.snapshot()))["regions"]["us-east"]["held"] == held
    del snap["regions"]["us-east"]["held"]
    b.restore(snap)
    assert b.snapshot()["regions"]["us-east"]["held"] is None


def test_a_region_first_seen_after_a_restore_draws_as_without_the_restore() -> None:
    # the snapshot keeps the root new regions' streams derive from: a region that steps for
    # the first time after a restore gets the targets it would have got on the original plane
    cap = capacity(cpu=8.0, accelerator=2.0, expires_in_s=900.0)
    values = proven(np.random.default_rng(7))
    differ = 0
    for seed in range(8):
        a = ControlPlane(CFG, np.random.default_rng(seed))
        a.step(observation(60.0, capacity=cap, value=values, value_age_s=5.0))
        snap = json.loads(json.dumps(a.snapshot()))
        b = ControlPlane(CFG, np.random.default_rng(1000 + seed))
        b.restore(snap)
        for i in range(3):
            obs = observation(120.0 + 60.0 * i, capacity=cap, value=values, value_age_s=5.0)
            obs = dataclasses.replace(obs, region="new")
            ta, tb = a.step(obs), b.step(obs)
            assert ta == tb
            fresh = ControlPlane(CFG, np.random.default_rng(1000 + seed))
            differ += fresh.step(obs).sbm_segments != ta.sbm_segments
    assert differ > 0  # another root would have drawn otherwise: the root is what was kept


def test_a_regions_targets_do_not_depend_on_the_other_regions() -> None:
    # the router draws from the region's own stream: stepping another region in between (in a
    # streaming controller, in whatever order the messages come) changes nothing of this one's
    cap = capacity(cpu=8.0, accelerator=2.0, expires_in_s=900.0)

    def run(seed: int, interleave: bool) -> list[dict[str, float]]:
        plane = ControlPlane(CFG, np.random.default_rng(seed))
        values = np.random.default_rng(7)
        out = []
        for i in range(6):
            now = 60.0 * (i + 1)
            obs = observation(now, capacity=cap, value=proven(values), value_age_s=5.0)
            if interleave:
                plane.step(dataclasses.replace(obs, region="elsewhere", now=now - 1.0))
            out.append(dict(plane.step(obs).sbm_segments))
        return out

    alone = run(0, interleave=False)
    assert run(0, interleave=True) == alone
    assert run(1, interleave=False) != alone  # the draws do shape the routing


def test_nan_and_overflowing_inputs_still_give_bounded_targets() -> None:
    nan = float("nan")
    plane = ControlPlane(CFG_PRE, np.random.default_rng(0))
    huge = ArmStats(10**6, 1e308, 1e308)
    for i in range(3):
        obs = RegionObservation(
            region="r",
            now=nan if i == 1 else 60.0 * (i + 1),
            window_s=nan,
            p99_ms={"all": nan, "sbm": nan},
            request_rps=nan,
            eligible_rps=nan,
            segment_rps={"casual": nan},
            capacity=(
                CapacityLevel("cpu", "any", "opportunistic", nan, nan, False, nan),
                CapacityLevel("accelerator", "gpu-b", "opportunistic", 4.0, nan, False, 0.0),
            ),
            value={("casual", "sbm", "treatment"): huge, ("casual", "sbm", "control"): huge},
            observed_coverage=nan,
            value_age_s=nan,
        )
        t = plane.step(obs)
        assert CFG_PRE.base_candidates <= t.rma_candidates <= CFG_PRE.max_candidates
        assert 0.0 <= t.sbm_coverage <= 1.0
        assert all(0.0 <= p <= 1.0 for p in t.sbm_segments.values())
        assert all(np.isfinite([t.budget_cpu, t.budget_accelerator, t.precompute_jobs_per_s]))
        json.dumps(plane.decision("r").event_fields(), allow_nan=False)


def test_first_steps_fall_back_until_value_signals_arrive_then_follow_them() -> None:
    plane = ControlPlane(CFG, np.random.default_rng(0))
    cap = capacity(cpu=8.0, accelerator=2.0, expires_in_s=900.0)
    t = plane.step(observation(60.0, capacity=cap))
    assert t.fallback == "no_value"
    # the fallback share, plus the whole device an SBM never measured holds to be measured
    sbm = sum(s.accelerator for s in t.allocation if s.lever == "sbm")
    assert sbm >= 0.9 - 1e-9
    assert 0.0 < t.budget_accelerator - 0.9 <= CFG.allocator.fallback_share * 2.0 + 1e-9
    rng = np.random.default_rng(1)
    t = plane.step(observation(120.0, capacity=cap, value=proven(rng), value_age_s=5.0))
    assert t.fallback is None
    assert t.budget_accelerator > 0.5 * 2.0
    assert t.sbm_coverage > 0.0
    # signals stop: after value_stale_s the allocator falls back again and says so
    t = plane.step(observation(600.0, capacity=cap, value_age_s=480.0))
    assert t.fallback == "stale_value"
    events = dict(plane.decision("us-east").allocator_events())
    assert events["allocator.fallback"] == {"reason": "stale_value"}


def test_rma_rises_with_low_latency_and_falls_toward_base_with_high_latency() -> None:
    plane = ControlPlane(CFG, np.random.default_rng(0))
    cap = capacity(cpu=16.0, accelerator=4.0, hardware="gpu-a")  # only RMA can use gpu-a
    rng = np.random.default_rng(1)
    got = []
    for i in range(8):
        got.append(
            plane.step(
                observation(
                    60.0 * (i + 1), p99_ms=80.0, capacity=cap, value=proven(rng), value_age_s=5.0
                )
            ).rma_candidates
        )
    assert got[-1] > got[0] >= CFG.base_candidates
    falling = []
    for i in range(8, 14):
        falling.append(
            plane.step(
                observation(
                    60.0 * (i + 1), p99_ms=400.0, capacity=cap, value=proven(rng), value_age_s=5.0
                )
            ).rma_candidates
        )
    assert falling == sorted(falling, reverse=True)
    assert falling[-1] == CFG.base_candidates


def test_a_reclaim_cuts_rma_and_sbm_at_the_next_step() -> None:
    plane = ControlPlane(CFG, np.random.default_rng(0))
    rng = np.random.default_rng(1)
    for i in range(10):
        t = plane.step(
            observation(
                60.0 * (i + 1),
                p99_ms=80.0,
                capacity=capacity(16.0, 4.0),
                value=proven(rng),
                value_age_s=5.0,
            )
        )
    assert t.rma_candidates > CFG.base_candidates
    assert t.sbm_coverage > 0.0
    t = plane.step(observation(660.0, p99_ms=80.0, capacity=(), value=proven(rng), value_age_s=5.0))
    assert t.rma_candidates == CFG.base_candidates
    assert t.sbm_coverage == 0.0
    assert all(p == 0.0 for p in t.sbm_segments.values())
    assert t.reason == "no_budget"


def test_after_an_outage_longer_than_ttl_optional_work_is_back_in_one_step() -> None:
    plane = ControlPlane(CFG, np.random.default_rng(0))
    rng = np.random.default_rng(1)
    cap = capacity(64.0, 16.0, hardware="gpu-a")
    for i in range(25):
        t = plane.step(
            observation(
                60.0 * (i + 1), p99_ms=60.0, capacity=cap, value=proven(rng), value_age_s=5.0
            )
        )
    assert t.rma_candidates == CFG.max_candidates
    silent_until = 60.0 * 25 + CFG.ttl_s + 60.0
    t = plane.step(
        observation(silent_until, p99_ms=60.0, capacity=cap, value=proven(rng), value_age_s=5.0)
    )
    # the clients ran the baseline during the outage; the loop resumes from what it last
    # issued (capacity unchanged, latency low), not from the baseline by the rate limit
    step = CFG.pid.max_step_up * (CFG.max_candidates - CFG.base_candidates)
    assert t.rma_candidates > CFG.base_candidates + step + 1
    assert t.rma_candidates == CFG.max_candidates


def test_after_an_outage_the_budget_still_cuts_at_once() -> None:
    plane = ControlPlane(CFG, np.random.default_rng(0))
    rng = np.random.default_rng(1)
    cap = capacity(64.0, 16.0, hardware="gpu-a")
    for i in range(25):
        plane.step(
            observation(
                60.0 * (i + 1), p99_ms=60.0, capacity=cap, value=proven(rng), value_age_s=5.0
            )
        )
    silent_until = 60.0 * 25 + CFG.ttl_s + 60.0
    t = plane.step(
        observation(silent_until, p99_ms=60.0, capacity=(), value=proven(rng), value_age_s=5.0)
    )
    assert t.rma_candidates == CFG.base_candidates
    assert t.sbm_coverage == 0.0


def test_handover_continues_from_the_value_in_force() -> None:
    plane = ControlPlane(CFG, np.random.default_rng(0))
    plane.handover("us-east", 1000)
    t = plane.step(
        observation(
            60.0,
            p99_ms=CFG.setpoint_ms,
            capacity=capacity(64.0, 16.0),
            value=proven(np.random.default_rng(1)),
            value_age_s=5.0,
        )
    )
    assert abs(t.rma_candidates - 1000) <= CFG.pid.max_step_down * 800 + 1


def test_epochs_outrank_a_restart_without_state() -> None:
    a = ControlPlane(CFG, np.random.default_rng(0))
    last = [a.step(observation(1_796_000_000.0 + 60 * i)).epoch for i in range(5)][-1]
    b = ControlPlane(CFG, np.random.default_rng(0))  # restarted, snapshot lost
    assert b.step(observation(1_796_000_000.0 + 60 * 6)).epoch > last


def test_precompute_rate_is_published_when_the_scenario_enables_it() -> None:
    plane = ControlPlane(CFG_PRE, np.random.default_rng(0))
    remote = capacity(cpu=4.0, accelerator=4.0, remote=True)
    t = plane.step(
        observation(60.0, capacity=remote, value=proven(np.random.default_rng(1)), value_age_s=5.0)
    )
    assert t.precompute_jobs_per_s > 0.0
    assert {s.lever for s in t.allocation} == {"precompute"}  # nothing live on a remote pool
    assert (
        ControlPlane(CFG, np.random.default_rng(0))
        .step(observation(60.0, capacity=remote))
        .precompute_jobs_per_s
        == 0.0
    )


def test_restore_rejects_a_foreign_snapshot() -> None:
    plane = ControlPlane(CFG, np.random.default_rng(0))
    for version in (99, 0, None, "2", True, 2.0):
        with pytest.raises(SnapshotError, match="version"):
            plane.restore({"version": version})
    good = ControlPlane(CFG, np.random.default_rng(0))
    good.step(observation(60.0))
    region = good.snapshot()["regions"]["us-east"]
    for broken in ({"epoch": 1}, {**region, "rma": 5}, {**region, "book": {"rows": [[1]]}}, 7):
        with pytest.raises(SnapshotError, match="malformed"):
            plane.restore({"version": 2, "regions": {"r": broken}})
    with pytest.raises(SnapshotError, match="malformed"):
        plane.restore({"version": 2, "regions": [1, 2]})


def test_a_refused_snapshot_leaves_the_plane_as_it_was() -> None:
    plane = ControlPlane(CFG, np.random.default_rng(0))
    plane.step(observation(60.0))
    before = plane.snapshot()
    bad = copy.deepcopy(before)
    bad["regions"]["s"] = {"epoch": 1}  # a second region without its loops
    with pytest.raises(SnapshotError, match="malformed"):
        plane.restore(bad)
    assert plane.snapshot() == before
    assert plane.decision("us-east") is not None


def test_restore_reads_version_1_snapshots_and_replaces_every_region() -> None:
    a = ControlPlane(CFG, np.random.default_rng(0))
    for i in range(3):
        a.step(observation(60.0 * (i + 1), value=proven(np.random.default_rng(i))))
    snap = json.loads(json.dumps(a.snapshot()))
    old = copy.deepcopy(snap)  # what version 1 stored: the value book as a bare list of rows
    old["version"] = 1
    for region in old["regions"].values():
        region["book"] = region["book"]["rows"]
    b = ControlPlane(CFG, np.random.default_rng(5))
    b.step(observation(30.0, region="elsewhere"))
    b.restore(old)
    assert b.regions == a.regions
    assert b.decision("elsewhere") is None
    assert b.snapshot() == snap


# -- configuration ---------------------------------------------------------------------------


def test_config_from_scenario_takes_slo_world_models_and_segments() -> None:
    cfg = ControlConfig.from_scenario(scenario(), interval_s=10.0)
    assert cfg.setpoint_ms == pytest.approx(170.0)
    assert (cfg.base_candidates, cfg.max_candidates) == (400, 1200)
    assert cfg.segment_names == ("premium", "casual")
    assert cfg.costs.strong_load_s == 120.0
    assert cfg.ttl_s == 30.0
    assert cfg.allocator.value_stale_s == 30.0
    assert not cfg.precompute_enabled
    assert CFG_PRE.precompute_enabled


def test_config_overrides_merge_groups_field_by_field() -> None:
    cfg = ControlConfig.from_scenario(
        scenario(), pid={"kp": 0.5}, allocator={"lever_caps": {"sbm": 0.4}}
    )
    assert cfg.pid.kp == 0.5
    assert cfg.pid.ki == PidSettings().ki
    assert cfg.allocator.cap("sbm") == 0.4
    assert cfg.allocator.cap("rma") == cfg.allocator.max_share
    assert ControlConfig.from_scenario(scenario(), pid=PidSettings(kp=0.1)).pid.kp == 0.1


def test_config_errors_name_every_bad_field() -> None:
    with pytest.raises(ConfigError) as err:
        ControlConfig.from_scenario(
            scenario(),
            setpoint_margin=1.5,
            pid={"kp": -1.0, "max_step_up": 0.0},
            coverage={"max_coverage": 2.0},
            allocator={"lever_caps": {"sbm": 1.5}},
        )
    text = "\n".join(err.value.problems)
    for path in (
        "control.setpoint_margin",
        "control.pid.kp",
        "control.pid.max_step_up",
        "control.coverage.max_coverage",
        "control.allocator.lever_caps[0]",
    ):
        assert path in text


def test_config_rejects_unknown_settings() -> None:
    with pytest.raises(ConfigError, match=r"control\.pid\.gain: unknown setting"):
        ControlConfig.from_scenario(scenario(), pid={"gain": 1.0})
    with pytest.raises(ConfigError, match=r"control\.speed: unknown setting"):
        ControlConfig.from_scenario(scenario(), speed=2)
    with pytest.raises(ConfigError, match=r"control\.ttl_s"):
        ControlConfig.from_scenario(scenario(), interval_s=60.0, ttl_s=30.0)


def plane_with_sbm_budget(cfg: ControlConfig, cpu: float, accelerator: float) -> ControlPlane:
    """A control plane whose allocator always gives SBM ``cpu`` cores and ``accelerator``
    devices (the allocator's units, after the safety margin) and nothing else."""
    from headroom.controllers.allocator import Allocation
    from headroom.controllers.types import LeverShare

    class Fixed:
        def allocate(self, *args: object, **kwargs: object) -> Allocation:
            return Allocation(
                shares=(LeverShare("sbm", cpu, accelerator, "gpu-b"),),
                rates={},
                budgets={"sbm": (cpu, accelerator)},
                estimates={},
                fallback=None,
                cap_bound=(),
                explored=(),
                safe_cpu=cpu,
                safe_accelerator=accelerator,
            )

    plane = ControlPlane(cfg, np.random.default_rng(0))
    plane.allocator = Fixed()  # type: ignore[assignment]
    return plane


def test_coverage_is_sized_to_the_whole_device_a_small_sbm_share_gets() -> None:
    def coverage(share_acc: float, pool_units: float) -> float:
        plane = plane_with_sbm_budget(CFG, 1.0, share_acc)
        cap = capacity(cpu=8.0, accelerator=pool_units, expires_in_s=900.0)
        return plane.step(observation(60.0, capacity=cap)).sbm_coverage

    small = coverage(0.3, 2.0)
    one = coverage(0.9, 2.0)  # one announced device: its units after the 10 % safety margin
    assert small == pytest.approx(one)  # a 0.3 share is served by the replica's whole device
    assert coverage(0.3, 0.5) < small  # a pool of half a device holds no more than that
    assert coverage(1.5, 2.0) > one  # above one device, the share decides again


def test_the_coverage_loop_holds_the_strong_tail_its_share_allows_not_its_p99() -> None:
    # the strong path's p99 twice the SLO, its tail at the quantile its share of the requests
    # allows (types.strong_tail_quantile) well inside it: the loop keeps the budget's coverage
    cap = capacity(cpu=8.0, accelerator=2.0, expires_in_s=900.0)

    def coverage(tail: float | None) -> tuple[float, str | None]:
        plane = plane_with_sbm_budget(CFG, 1.0, 1.8)
        for t in (60.0, 120.0):
            obs = observation(t, capacity=cap, p99_sbm_ms=400.0)
            targets = plane.step(dataclasses.replace(obs, sbm_tail_ms=tail))
        decision = plane.decision("us-east")
        assert decision is not None
        return targets.sbm_coverage, decision.coverage.limit.value

    held, held_by = coverage(150.0)
    cut, cut_by = coverage(None)  # no tail measured: the loop reads the path's p99
    assert held_by != "latency"
    assert cut_by == "latency"
    assert cut < held


@pytest.mark.parametrize("margin", [0.0, 0.1, 0.25])
def test_coverage_is_sized_at_the_devices_the_strong_replicas_hold_the_margin_taken_once(
    margin: float,
) -> None:
    # the allocator's budget counts a pool's devices after the safety margin; the strong
    # replicas hold the announced devices behind it and admit up to the admissible share of
    # them. Coverage is sized to that share of the held devices, never above 1 − margin of them:
    # not to the admissible share of the devices after the margin (the margin taken twice)
    from dataclasses import replace

    from headroom.controllers.coverage import strong_admissible

    cfg = replace(CFG, allocator=replace(CFG.allocator, safety_margin=margin))
    announced = 4.0
    budget = announced * (1.0 - margin)  # SBM gets the whole pool
    plane = plane_with_sbm_budget(cfg, 8.0, budget)
    cap = capacity(cpu=10.0, accelerator=announced, expires_in_s=900.0)
    got = plane.step(observation(60.0, capacity=cap, request_rps=600.0)).sbm_coverage
    busy = min(strong_admissible(cfg.coverage, cfg.setpoint_ms, cfg.costs, announced), 1 - margin)
    acc_s = cfg.costs.sbm_per_request.accelerator_s
    assert got == pytest.approx(announced * busy / (600.0 * acc_s), rel=1e-9)
    assert got * 600.0 * acc_s <= budget * (1 + 1e-9)  # within the budget all the same


def test_rma_is_sized_by_the_requests_that_run_live() -> None:
    """A precompute hit runs nothing of its plan live, so the RMA budget pays for more extra
    candidates per request that does: the loop's cap divides the budget by the live rate (the
    request rate minus the window's hits, from the precompute treatment sums), and the per-bin
    levels spread it over the live requests of each segment."""
    cap = capacity(cpu=1.0, accelerator=0.5, hardware="gpu-a")  # RMA's budget binds
    seg_rps = {"premium": 45.0, "casual": 255.0}

    def step(hits_per_s: float) -> int:
        plane = ControlPlane(CFG_PRE, np.random.default_rng(0))
        rng = np.random.default_rng(1)
        for i in range(4):
            value = {k: v for k, v in proven(rng).items() if k[1] != "precompute"}
            if hits_per_s > 0.0:
                value[("casual", "precompute", "treatment")] = arm_stats(
                    rng, round(hits_per_s * 60.0), 1.1, 0.5
                )
            plane.step(
                observation(
                    60.0 * (i + 1),
                    capacity=cap,
                    segment_rps=seg_rps,
                    value=value,
                    value_age_s=5.0,
                )
            )
        d = plane.decision("us-east")
        assert d is not None
        return d.rma.budget_cap

    cap_none = step(0.0)
    cap_hits = step(200.0)  # 200 of the 255 casual requests a second are hits
    assert cap_hits - CFG_PRE.base_candidates == pytest.approx(
        (cap_none - CFG_PRE.base_candidates) * 300.0 / 100.0, abs=2
    )
