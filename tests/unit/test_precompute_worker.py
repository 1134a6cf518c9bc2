"""The precompute worker's rounds without a broker: a manual clock drives ``step``.

A small world (2,000 ads) keeps the real strong-model ranking quick. The worker is built with
``kafka=None``: it keeps its store and its events in memory, so the same code paths as on Kafka
are checked: jobs start within the budget and the capacity, results are the real strong-model
ranking of the world, they expire and are deleted, a reclaim stops running jobs at once and
counts them as wasted, an expired target stops new jobs.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from headroom.controllers.precompute import PrecomputeConfig
from headroom.kernel.scenario_load import load_scenario
from headroom.streams import messages
from headroom.workers.precompute import PrecomputeWorker, WorkerSettings, rank_batch, target_budget
from headroom.world.ranking import RankingWorld
from tests.signals import value_signal

REGION = "r1"
SCENARIO = """
name: precompute-unit
seed: 5
duration_s: 600
slo: {p99_ms: 200, window_s: 10}
world: {ads: 2000, dim: 16, base_candidates: 50, max_candidates: 100, holdout: 0.02,
        drift_per_h: 0.5, users: 1000}
models:
  base: {cpu_ms_per_candidate: 0.1, accelerator_ms_per_candidate: 0.02, hardware: [gpu-a, gpu-b]}
  strong: {cpu_ms_per_candidate: 0.005, accelerator_ms_per_candidate: 0.1, hardware: [gpu-b]}
segments:
  - {name: premium, share: 0.3, value: {mean: 3.0, sigma: 0.5}, base_error: 0.3, strong_error: 0.1,
     return_rate_per_h: 6.0}
  - {name: casual,  share: 0.7, value: {mean: 0.6, sigma: 0.5}, base_error: 0.5, strong_error: 0.2,
     return_rate_per_h: 3.0}
regions:
  - name: r1
    dedicated: {cpu: 8, accelerator: 2, hardware: gpu-a}
    traffic: {rps: 10}
"""


class Clock:
    def __init__(self, t: float = 1_000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


@pytest.fixture(scope="module")
def world_and_curves(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    path = Path(tmp_path_factory.mktemp("scenario")) / "s.yaml"
    path.write_text(SCENARIO)
    scenario = load_scenario(path)
    world = RankingWorld.from_scenario(scenario)
    curves = world.measure_curves(samples_per_segment=32, grid_points=3)
    return scenario, world, curves


def capacity(
    units: float,
    hardware: str = "gpu-b",
    resource: str = "accelerator",
    ts: float = 0.0,
    remote: bool = True,
    expires_in_s: float | None = None,
) -> messages.Capacity:
    return messages.Capacity(
        ts=ts,
        region=REGION,
        resource=resource,  # type: ignore[arg-type]
        hardware=hardware,
        pool="opportunistic",
        units=units,
        reason="grant",
        id=f"{resource}-{hardware}-{ts}",
        remote=remote,
        expires_in_s=expires_in_s,
    )


def request(user: int, segment: str, ts: float) -> messages.Request:
    return messages.Request(
        ts=ts,
        id=f"q{user}-{ts}",
        region=REGION,
        segment=segment,
        value=1.0,
        eligible=True,
        user=user,
    )


def make_worker(world_and_curves, clock: Clock, **overrides: object) -> PrecomputeWorker:  # type: ignore[no-untyped-def]
    scenario, world, curves = world_and_curves
    cfg = PrecomputeConfig.from_scenario(
        scenario,
        **{"default_jobs_per_s": 100.0, "job_duration_s": 1.0, "max_ttl_s": 60.0, **overrides},
    )
    worker = PrecomputeWorker(
        WorkerSettings(region=REGION),
        scenario,
        None,
        config=cfg,
        world=world,
        curves=curves,
        clock=clock,
    )
    worker.prepare()
    return worker


async def test_jobs_run_the_real_strong_ranking_publish_expire_and_report(world_and_curves) -> None:  # type: ignore[no-untyped-def]
    clock = Clock()
    w = make_worker(world_and_curves, clock)
    w.on_capacity(capacity(2.0, ts=clock.t))
    w.on_capacity(capacity(2.0, hardware="any", resource="cpu", ts=clock.t))
    w.on_capacity(capacity(50.0, hardware="gpu-a", ts=clock.t))  # the strong model cannot use it
    for user in range(40):
        w.on_request(request(user, "casual" if user % 2 else "premium", clock.t))
    assert {key[1] for key in w.jobs.pools} == {"gpu-b", "any"}
    await w.step()  # the bucket starts empty
    assert w.stats.jobs_started == 0
    clock.t += 0.5  # 50 tokens at 100 jobs/s: all 40 users
    await w.step()
    assert w.stats.jobs_started == 40
    assert all(
        job.accelerator_pool == ("accelerator", "gpu-b", True) for job in w.jobs.jobs.values()
    )
    clock.t += 1.0
    await w.step()
    assert w.stats.jobs_completed == 40
    assert len(w.store) == 40
    stored = w.store.lookup(REGION, 3, clock.t)
    assert stored is not None
    assert stored.segment == "casual"
    scenario, world, _ = world_and_curves
    t_rank = w.scenario_time(stored.ts)
    expected = rank_batch(world, [3], 1, scenario.world.base_candidates, t_rank, w.config.keep)[0]
    assert stored.ranking == expected
    single = world.rank(3, "casual", scenario.world.base_candidates, "strong", t_rank)
    assert stored.ranking[0] == int(single.ranking[0])
    life = w.planner.uplift.lifetime(1)  # type: ignore[union-attr]
    assert stored.expires_at == pytest.approx(stored.ts + life)
    # nothing more to do: every user is covered and too fresh to refresh
    clock.t += 0.5
    await w.step()
    assert w.stats.jobs_started == 40
    # past every expiry the results are deleted (tombstones on Kafka)
    clock.t += 61.0
    await w.step()
    assert len(w.store) == 0
    assert w.stats.tombstoned == 40
    clock.t += 10.0  # the window of the expiry ends: its lines are written
    await w.step()
    expired = [e for e in w.events if e.kind == "precompute.result.expired"]
    assert sum(e["expired"] for e in expired) == 40
    windows = [e for e in w.events if e.kind == "window"]
    assert sum(e["precompute"]["jobs"] for e in windows) == 40
    used = sum(e["used_unit_s"]["accelerator"] for e in windows)
    assert used == pytest.approx(40 * w.config.job_cost.accelerator_s)
    completed = [e for e in w.events if e.kind == "precompute.job.completed"]
    assert sum(e["jobs"] for e in completed) == 40


async def test_a_reclaim_stops_running_jobs_at_once_and_counts_them_wasted(
    world_and_curves,
) -> None:  # type: ignore[no-untyped-def]
    clock = Clock()
    w = make_worker(world_and_curves, clock)
    w.on_capacity(capacity(2.0, ts=clock.t))
    w.on_capacity(capacity(2.0, hardware="any", resource="cpu", ts=clock.t))
    for user in range(30):
        w.on_request(request(user, "casual", clock.t))
    await w.step()
    clock.t += 0.5
    await w.step()
    running = len(w.jobs.jobs)
    assert running == 30
    clock.t += 0.2
    w.on_capacity(capacity(0.0, ts=clock.t - 0.01))  # the remote gpu-b pool is reclaimed
    assert len(w.jobs.jobs) == 0
    assert w.stats.wasted_partial == 30
    released = [e for e in w.events if e.kind == "optional.released"]
    assert released[-1]["dropped"]["precompute_jobs"] == 30
    assert released[-1]["release_ms"] == pytest.approx(10.0, abs=1e-6)
    clock.t += 2.0
    await w.step()
    assert w.stats.jobs_completed == 0  # a half-done job delivers nothing
    assert len(w.store) == 0
    assert w.stats.jobs_started == 30  # and no capacity left to start new ones
    assert not any(w.planner.users.inflight)  # type: ignore[union-attr]


async def test_a_level_that_lapses_stops_the_jobs_on_it_at_the_next_round(
    world_and_curves,
) -> None:  # type: ignore[no-untyped-def]
    """An opportunistic level lapses ``expires_in_s`` after its ``ts`` (defences/capacity.py)
    and then counts as 0, as in the servers and the controller: jobs on it stop."""
    clock = Clock()
    w = make_worker(world_and_curves, clock, job_duration_s=2.0)
    t0 = clock.t
    w.on_capacity(capacity(2.0, ts=t0, expires_in_s=10.0))
    w.on_capacity(capacity(2.0, hardware="any", resource="cpu", ts=t0))
    for user in range(10):
        w.on_request(request(user, "casual", t0))
    await w.step()
    clock.t += 0.5
    await w.step()
    assert len(w.jobs.jobs) == 10  # they end at t0 + 2.5
    clock.t = t0 + 1.0
    w.on_capacity(capacity(2.0, ts=clock.t, expires_in_s=0.5))  # re-announced: 0.5 s to live
    assert len(w.jobs.jobs) == 10  # a short life left does not stop what runs
    clock.t = t0 + 1.5  # exactly ts + expires_in_s
    await w.step()
    assert len(w.jobs.jobs) == 0
    assert w.stats.wasted_partial == 10
    assert w.stats.jobs_completed == 0


def test_lifetimes_reach_the_core_in_scenario_seconds(world_and_curves) -> None:  # type: ignore[no-untyped-def]
    scenario, world, curves = world_and_curves
    clock = Clock()
    w = PrecomputeWorker(
        WorkerSettings(region=REGION, t0=clock.t - 100.0, speed=4.0),
        scenario,
        None,
        config=PrecomputeConfig.from_scenario(scenario),
        world=world,
        curves=curves,
        clock=clock,
    )
    w.on_capacity(capacity(2.0, ts=clock.t, expires_in_s=3.0))  # 3 wall s = 12 scenario s
    clock.t += 1.0
    (level,) = w.levels(w.scenario_time())
    assert level.ts == pytest.approx(404.0)
    assert level.expires_in_s == pytest.approx(8.0)
    clock.t += 2.0
    (level,) = w.levels(w.scenario_time())
    assert (level.units, level.expires_in_s) == (0.0, 0.0)


async def test_an_expired_target_stops_new_jobs_and_a_target_budget_sets_the_rate(
    world_and_curves,
) -> None:  # type: ignore[no-untyped-def]
    clock = Clock()
    w = make_worker(world_and_curves, clock)
    w.on_capacity(capacity(2.0, ts=clock.t))
    w.on_capacity(capacity(2.0, hardware="any", resource="cpu", ts=clock.t))
    target = messages.Target(
        ts=clock.t,
        region=REGION,
        epoch=3,
        ttl_s=5.0,
        rma=messages.RmaTarget(candidates=50, base=50, max=100),
        sbm=messages.SbmTarget(coverage=0.0, segments={}),
        budget=messages.Budget(cpu=1.0, accelerator=1.0),
        reason="pid",
    )
    w.on_target(target, budget=12.0)
    assert w.current_rate(clock.t) == (pytest.approx(12.0), "target")
    for user in range(30):
        w.on_request(request(user, "casual", clock.t))
    clock.t += 6.0  # the target expired: optional work stops
    await w.step()
    clock.t += 1.0
    await w.step()
    assert w.current_rate(clock.t) == (0.0, "target_expired")
    assert w.stats.jobs_started == 0
    older = messages.Target(
        ts=clock.t,
        region=REGION,
        epoch=2,
        ttl_s=60.0,
        rma=target.rma,
        sbm=target.sbm,
        budget=target.budget,
        reason="pid",
    )
    w.on_target(older, budget=50.0)  # a lower epoch never wins
    assert w.current_rate(clock.t)[1] == "target_expired"


async def test_measured_value_signals_rescale_the_planner_once_per_window(
    world_and_curves,
) -> None:  # type: ignore[no-untyped-def]
    """Precise value signals: premium's uplift measures half the curves' prediction (rescaled),
    casual's is harmful (switched off: no casual user is picked again); other levers' and
    regions' signals change nothing; the model changes at the next window, with an event."""
    clock = Clock()
    w = make_worker(world_and_curves, clock)
    w.on_capacity(capacity(2.0, ts=clock.t))
    w.on_capacity(capacity(2.0, hardware="any", resource="cpu", ts=clock.t))
    users = range(40)  # even: premium, odd: casual
    for user in users:
        w.on_request(request(user, "casual" if user % 2 else "premium", clock.t))
    await w.step()
    clock.t += 0.5
    await w.step()
    clock.t += 1.0
    await w.step()
    assert len(w.store) == 40
    curves = w.planner.uplift  # type: ignore[union-attr]
    clock.t += 5.0  # every user comes back and finds a 6 s old result
    for user in users:
        w.on_request(request(user, "casual" if user % 2 else "premium", clock.t))
    assert w.calibrator.staleness_weight(0) == 20
    before = {c.segment: c for c in w.calibrator.measure(curves)}
    assert before["premium"].staleness_p50_s == pytest.approx(6.0, abs=1.0)
    p_premium = before["premium"].predicted
    p_casual = before["casual"].predicted
    assert p_premium is not None
    assert p_premium > 0.0
    assert p_casual is not None
    assert p_casual > 0.0
    for msg in (
        value_signal(
            "premium", "treatment", 2000, 1.0 + 0.5 * p_premium, ts=clock.t, region=REGION
        ),
        value_signal("premium", "control", 500, 1.0, ts=clock.t, region=REGION),
        value_signal("casual", "treatment", 2000, 1.0 - p_casual, ts=clock.t, region=REGION),
        value_signal("casual", "control", 500, 1.0, ts=clock.t, region=REGION),
        value_signal("casual", "treatment", 2000, 9.0, ts=clock.t, region=REGION, lever="rma"),
        value_signal("casual", "treatment", 2000, 9.0, ts=clock.t, region="elsewhere"),
    ):
        w.on_value(msg)
    assert (w.stats.value_signals, w.stats.value_ignored) == (4, 2)
    await w.step()  # same window: the model is rebuilt only at the next one
    assert w.planner.uplift is curves  # type: ignore[union-attr]
    assert not [e for e in w.events if e.kind == "precompute.uplift.rescaled"]
    clock.t += 10.0
    await w.step()
    rescaled = {e["segment"]: e for e in w.events if e.kind == "precompute.uplift.rescaled"}
    assert set(rescaled) == {"premium", "casual"}
    assert rescaled["premium"]["status"] == "measured"
    assert rescaled["premium"]["scale"] == pytest.approx(0.5, rel=0.01)
    assert rescaled["premium"]["previous_scale"] == 1.0
    assert rescaled["casual"]["status"] == "off"
    assert rescaled["casual"]["scale"] == 0.0
    # one window boundary passed since the signals: discounted once (half-life 1800 s)
    assert rescaled["casual"]["n_treatment"] == pytest.approx(2000 * 0.5 ** (10 / 1800), abs=0.1)
    model = w.planner.uplift  # type: ignore[union-attr]
    assert np.allclose(model.delta[0], w.calibration[0].scale * curves.delta[0])
    assert not np.any(model.delta[1])
    assert np.array_equal(model.lifetimes_s, curves.lifetimes_s)
    clock.t += 10.0  # a window without news: nothing new to report
    await w.step()
    assert w.stats.rescaled == 2
    clock.t += 61.0  # every result has expired: only premium users are worth a job now
    await w.step()
    clock.t += 0.5
    await w.step()
    assert w.jobs.jobs
    assert {job.segment for job in w.jobs.jobs.values()} == {0}


def test_target_budget_reads_the_optional_field_and_rejects_a_malformed_one() -> None:
    assert target_budget({"precompute": {"jobs_per_s": 7}}) == 7.0
    assert target_budget({"rma": {}}) is None
    with pytest.raises(messages.ValidationError, match=r"precompute\.jobs_per_s"):
        target_budget({"precompute": {"jobs_per_s": -1}})
    with pytest.raises(messages.ValidationError, match="precompute"):
        target_budget({"precompute": 3})


def test_a_scenario_without_precompute_fields_is_refused(world_and_curves) -> None:  # type: ignore[no-untyped-def]
    from headroom.kernel.errors import ConfigError
    from headroom.kernel.settings import default_scenario_path

    quick = load_scenario(default_scenario_path())
    with pytest.raises(ConfigError, match="no precompute fields"):
        PrecomputeWorker(WorkerSettings(region=REGION), quick, None)
    with pytest.raises(ConfigError, match="--region"):
        WorkerSettings(region="no spaces allowed")


def _signals(segment: str, mean: float, ts: float) -> list[messages.ValueSignal]:
    """One window of RMA's value signals of ``segment``, every value bin's requests with mean
    value signal ``mean × (bin + 1)``, as a client publishes them (signal sums included)."""
    xs = [mean * (k + 1) for k in range(8)]
    return [
        value_signal(
            segment, "treatment", 50, x, 0.0, region=REGION, ts=ts, lever="rma", stratum=k, signal=x
        )
        for k, x in enumerate(xs)
    ]


async def test_the_uplift_is_counted_against_the_live_alternative_of_the_targets_in_force(
    world_and_curves,
) -> None:  # type: ignore[no-untyped-def]
    """A hit runs nothing live, so a stored result is worth what it adds over what live RMA
    would give the visit: the worker prices that from the targets' per-bin levels and the mean
    value signal per bin with the function the simulator's headroom policy asks
    (controllers/precompute.py ``live_alternative``); an expired target (the baseline) gives
    the calibrated uplift back."""
    from headroom.controllers.levers import RmaCurve
    from headroom.controllers.precompute import rma_live_alternative

    scenario, _, curves = world_and_curves
    clock = Clock()
    w = make_worker(world_and_curves, clock)
    assert w.planner is not None
    plain = w.planner.uplift
    lifetimes = [plain.lifetime(i) for i in range(2)]
    assert all(life > 0.0 for life in lifetimes)
    for seg, mean in (("premium", 3.0), ("casual", 0.6)):
        for msg in _signals(seg, mean, clock.t):
            w.on_value(msg)
    levels = {"premium": (50,) * 8, "casual": (0,) * 8}
    w.on_target(
        messages.Target(
            ts=clock.t,
            region=REGION,
            epoch=4,
            ttl_s=30.0,
            rma=messages.RmaTarget(candidates=65, base=50, max=100, levels=levels),
            sbm=messages.SbmTarget(coverage=0.0, segments={}),
            budget=messages.Budget(cpu=1.0, accelerator=1.0),
            reason="pid",
        ),
        budget=None,
    )
    await w.step()
    live = w.live
    assert live is not None
    names = list(w.config.segment_names)
    curve = RmaCurve.from_curves(
        curves, names, scenario.world.base_candidates, scenario.world.max_candidates
    )
    bins = {seg: [m * (k + 1) for k in range(8)] for seg, m in (("premium", 3.0), ("casual", 0.6))}
    expected = rma_live_alternative(curve, names, levels, bins, 15.0)
    assert live.tolist() == pytest.approx(expected.tolist())
    premium, casual = names.index("premium"), names.index("casual")
    assert live[premium] > 0.0
    assert live[casual] == 0.0  # no extras for casual: its results keep their whole uplift
    uplift = w.planner.uplift
    assert uplift.lifetime(premium) < lifetimes[premium]
    assert uplift.lifetime(casual) == pytest.approx(lifetimes[casual])
    # the target expires: the clients run the baseline, the result competes with it alone
    clock.t += 31.0
    await w.step()
    assert w.live is None
    assert w.planner.uplift.lifetime(premium) == pytest.approx(lifetimes[premium])


class _HeldProducer:
    """Holds the first send until ``release`` is set; records every send it completes."""

    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.sent: list[bytes] = []

    async def send(
        self, topic: str, value: bytes, key: bytes | None = None
    ) -> asyncio.Future[None]:
        await self.release.wait()
        self.sent.append(value)
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        done.set_result(None)
        return done


async def test_a_round_stopped_in_the_middle_of_a_send_loses_no_event(world_and_curves) -> None:  # type: ignore[no-untyped-def]
    # the stop cancels the worker's round while the producer holds an event; the stop's own
    # send (on_stop) must still find every event not yet handed over
    worker = make_worker(world_and_curves, Clock())
    producer = _HeldProducer()
    worker._producer = producer  # type: ignore[assignment]
    worker.kafka = SimpleNamespace(topic=lambda kind: f"t.{kind}")  # type: ignore[assignment]
    for k in range(3):
        worker._event("precompute.uplift.rescaled", {"k": k})
    round_ = asyncio.create_task(worker._send_outbox())
    await asyncio.sleep(0.01)
    round_.cancel()
    with pytest.raises(asyncio.CancelledError):
        await round_
    producer.release.set()
    await worker._send_outbox()
    kinds = [messages.decode("events", v).to_dict()["k"] for v in producer.sent]
    assert kinds == [0, 1, 2]
