"""A real feed, recorded from a real broker (with ``headroom record``, then with ``kcat -C -J``),
replayed through the simulator (``headroom simulate --replay``): the arrivals and capacity levels
the simulator saw are the recording's.

The expectation is computed here from the raw lines, independently of sim/replay.py: each
request counts in step ``⌊(ts − t0)/1 s⌋`` of its region; each pool's level at ``t`` is the
``units`` of its newest message (greatest ``ts``, the lowest ``units`` on a tie) with
``ts ≤ t0 + t``.
"""

from __future__ import annotations

import itertools
import math
import subprocess
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

import numpy as np
import orjson
import pytest

from headroom.analysis.events import EventLog
from headroom.kernel.scenario_load import load_scenario
from headroom.sim.replay import ReplayContext, replay_context
from headroom.streams.kafka import KafkaTarget

pytestmark = pytest.mark.integration

Run = Callable[..., subprocess.CompletedProcess[str]]
REPO = Path(__file__).resolve().parents[2]
SCENARIO = REPO / "tests" / "integration" / "scenarios" / "stack-short.yaml"
# 70 scenario seconds (the preemption at 60 s included) at 10× real time: 7 s of feed
DURATION_S = 70
SPEED = 10


def feed(run_headroom: Run, target: KafkaTarget) -> None:
    res = run_headroom(
        "feed",
        str(SCENARIO),
        "--speed",
        str(SPEED),
        "--duration",
        str(DURATION_S),
        "--bootstrap",
        target.bootstrap,
        "--prefix",
        target.prefix,
        timeout=120,
    )
    assert res.returncode == 0, res.stderr[-3000:]


class Expected:
    """What the recording holds, read straight from its lines."""

    def __init__(self, path: Path) -> None:
        self.requests: list[tuple[float, str]] = []
        self.capacity: dict[tuple[str, str, str, bool], list[tuple[float, int, float]]] = (
            defaultdict(list)
        )
        self.published: int | None = None
        for i, raw in enumerate(path.read_bytes().splitlines()):
            if not raw.strip():
                continue
            env = orjson.loads(raw)
            msg = orjson.loads(env["payload"])
            if env["topic"].endswith("requests"):
                self.requests.append((msg["ts"], msg["region"]))
            elif env["topic"].endswith("capacity") and msg["pool"] == "opportunistic":
                key = (msg["region"], msg["resource"], msg["hardware"], msg.get("remote", False))
                self.capacity[key].append((msg["ts"], i, msg["units"]))
            elif env["topic"].endswith("events") and msg.get("kind") == "run.finished":
                self.published = msg["published"]["requests"]
        stamps = [ts for ts, _ in self.requests] + [
            ts for pts in self.capacity.values() for ts, _, _ in pts
        ]
        self.t0 = min(stamps)
        self.span = max(stamps) - self.t0
        self.n_steps = max(1, math.ceil(self.span - 1e-9))

    def arrivals(self, region: str) -> list[int]:
        counts = [0] * self.n_steps
        for ts, r in self.requests:
            if r == region:
                counts[min(self.n_steps - 1, int(ts - self.t0 + 1e-9))] += 1
        return counts

    def level(self, key: tuple[str, str, str, bool], t: float) -> float:
        known = [p for p in self.capacity[key] if p[0] <= self.t0 + t]
        if not known:
            return 0.0
        newest = max(ts for ts, _, _ in known)
        return min(units for ts, _, units in known if ts == newest)


def check_replay(path: Path, tmp: Path, run_headroom: Run) -> None:
    base = load_scenario(SCENARIO)
    exp = Expected(path)
    assert exp.requests, "the recording holds no request"
    if exp.published is not None:
        assert len(exp.requests) == exp.published  # the recording is the whole feed
    scenario, ctx = replay_context(base, path)
    assert isinstance(ctx, ReplayContext)
    rec = ctx.recording
    assert rec.summary.skipped == 0, [str(i) for i in rec.summary.issues]
    assert rec.t0 == exp.t0
    assert [r.name for r in scenario.regions] == ["it-east"]
    # arrivals: the simulator's traces, per step
    (rt,) = ctx.traces.regions
    assert rt.arrivals.tolist() == exp.arrivals("it-east")
    # capacity: every pool, at every message and between them
    seen = {(p.key.resource, p.key.hardware, p.key.remote): p for p in rt.pools}
    assert set(seen) == {k[1:] for k in exp.capacity}
    for key, pts in exp.capacity.items():
        times = sorted({ts - exp.t0 for ts, _, _ in pts})
        probes = times + [(a + b) / 2 for a, b in itertools.pairwise(times)]
        probes.append(exp.span)
        for t in probes:
            assert seen[key[1:]].level_at(t) == exp.level(key, t), (key, t)
    # and what `headroom simulate --replay` reported, window by window
    out = tmp / "run"
    res = run_headroom(
        "simulate",
        str(SCENARIO),
        "--replay",
        str(path),
        "--policy",
        "static,oracle",
        "--no-plots",
        "--no-progress",
        "--out",
        str(out),
        timeout=300,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    assert "replay:   skipped: 0" in res.stderr
    window = base.slo.window_s
    per_step = np.array(exp.arrivals("it-east"))
    k = round(window)
    expected = [
        int(per_step[w * k : (w + 1) * k].sum()) for w in range(math.ceil(exp.span / window))
    ]
    for policy in ("static", "oracle"):
        windows = [
            e
            for e in EventLog(out / "events.jsonl")
            if e.get("kind") == "window" and e.get("policy") == policy
        ]
        assert [w["requests"] for w in windows] == expected
    metrics = orjson.loads((out / "metrics.json").read_bytes())
    assert metrics["policies"]["static"]["requests"]["total"] == len(exp.requests)


def test_a_headroom_recording_of_a_feed_replays_into_the_simulator(
    kafka_target: KafkaTarget, run_headroom: Run, tmp_path: Path
) -> None:
    feed(run_headroom, kafka_target)
    path = tmp_path / "feed.jsonl"
    res = run_headroom(
        "record",
        "--topic",
        "capacity",
        "--topic",
        "requests",
        "--topic",
        "events",
        "--out",
        str(path),
        "--from-beginning",
        "--timeout",
        "3",
        "--bootstrap",
        kafka_target.bootstrap,
        "--prefix",
        kafka_target.prefix,
        timeout=120,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    exp = Expected(path)
    assert exp.published is not None  # the feed's run.finished was recorded too
    check_replay(path, tmp_path, run_headroom)
    # the events topic rides along and is ignored
    _, ctx = replay_context(load_scenario(SCENARIO), path)
    assert ctx.recording.summary.ignored_topics[kafka_target.topic("events")] > 0


def test_a_kcat_recording_of_a_feed_replays_into_the_simulator(
    kafka_target: KafkaTarget, run_headroom: Run, tmp_path: Path
) -> None:
    feed(run_headroom, kafka_target)
    path = tmp_path / "kcat.jsonl"
    chunks: list[bytes] = []
    for kind in ("capacity", "requests"):  # one kcat run per topic, one file
        chunks.append(
            subprocess.run(
                [
                    "kcat", "-C", "-J", "-e", "-q", "-o", "beginning",
                    "-b", kafka_target.bootstrap, "-t", kafka_target.topic(kind),
                ],
                capture_output=True,
                check=True,
                timeout=60,
            ).stdout
        )  # fmt: skip
    path.write_bytes(b"".join(chunks))
    check_replay(path, tmp_path, run_headroom)
