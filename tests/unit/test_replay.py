"""Recordings into the simulator (sim/replay.py), on small hand-made recordings: arrivals per
step, newest-ts-wins capacity, lapses, bad lines reported and skipped, regions, the recorded
population, the derived scenario and its files, the engine context."""

from __future__ import annotations

import math
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from headroom.cli import main
from headroom.commands.sim_replay import write_derived
from headroom.kernel.errors import ConfigError
from headroom.kernel.scenario import VALUE_BIN_RATIO, Scenario
from headroom.kernel.scenario_load import load_scenario, load_scenario_text
from headroom.kernel.traces import PoolKey
from headroom.sim.config import SimConfig
from headroom.sim.replay import (
    ABSENT_SHARE,
    RecordedPopulation,
    ReplayContext,
    derived_scenario,
    write_feed_recording,
)
from headroom.sim.replay_read import IssueKind, Recording, ReplayConfig, ValueGrid, read_replay
from headroom.streams.recording import Envelope, encode_envelope

T0 = 1_796_000_000.0

BASE = """
name: base
seed: 3
duration_s: 3600
slo: {p99_ms: 200, window_s: 10}
world: {ads: 2000, dim: 8, base_candidates: 50, max_candidates: 150, holdout: 0.1}
models:
  base:   {cpu_ms_per_candidate: 0.1, accelerator_ms_per_candidate: 0.02, hardware: [gpu-a, gpu-b]}
  strong: {cpu_ms_per_candidate: 0.005, accelerator_ms_per_candidate: 0.1, hardware: [gpu-b]}
segments:
  - {name: premium, share: 0.25, value: {mean: 3.0, sigma: 0.8}, base_error: 0.15,
     strong_error: 0.10}
  - {name: casual, share: 0.75, value: {mean: 0.6, sigma: 0.6}, base_error: 0.5,
     strong_error: 0.2}
regions:
  - name: us-east
    dedicated: {cpu: 24, accelerator: 4, hardware: gpu-a}
    traffic: {rps: 100}
    opportunistic:
      - {resource: cpu, hardware: any, trace: [[0, 8]]}
  - name: eu-west
    dedicated: {cpu: 12, accelerator: 2, hardware: gpu-b}
    traffic: {rps: 50}
"""


@pytest.fixture
def base() -> Scenario:
    return load_scenario_text(BASE)


SEGMENTS = ("premium", "casual")


class Rec:
    """A recording written line by line; ``lines`` gives each message's line number."""

    def __init__(self, prefix: str = "headroom.") -> None:
        self.prefix = prefix
        self.rows: list[bytes] = []
        self.offsets: dict[str, int] = {}
        self.n = 0

    def raw(self, line: bytes) -> int:
        self.rows.append(line)
        return len(self.rows)

    def put(
        self, kind: str, payload: dict[str, Any] | bytes | None, offset: int | None = None
    ) -> int:
        topic = f"{self.prefix}{kind}"
        if offset is None:
            offset = self.offsets.get(topic, 0)
        self.offsets[topic] = max(self.offsets.get(topic, 0), offset + 1)
        data = payload if isinstance(payload, bytes | None) else orjson.dumps(payload)
        env = Envelope(topic=topic, partition=0, offset=offset, key=b"r", payload=data, ts=0)
        return self.raw(encode_envelope(env))

    def req(
        self,
        t: float,
        region: str = "us-east",
        segment: str = "casual",
        value: float = 1.0,
        eligible: bool = True,
        **extra: Any,
    ) -> int:
        self.n += 1
        msg = {
            "v": 1,
            "ts": T0 + t,
            "id": f"q-{self.n}",
            "region": region,
            "segment": segment,
            "value": value,
            "eligible": eligible,
            "user": 7,
        }
        msg.update(extra)
        return self.put("requests", msg)

    def cap(
        self,
        t: float,
        units: float,
        region: str = "us-east",
        resource: str = "accelerator",
        hardware: str = "gpu-b",
        pool: str = "opportunistic",
        expires_in_s: float | None = None,
        remote: bool = False,
    ) -> int:
        self.n += 1
        msg: dict[str, Any] = {
            "v": 1,
            "ts": T0 + t,
            "region": region,
            "resource": resource,
            "hardware": hardware,
            "pool": pool,
            "units": units,
            "expires_in_s": expires_in_s,
            "reason": "update",
            "id": f"c-{self.n}",
        }
        if remote:
            msg["remote"] = True
        return self.put("capacity", msg)

    def write(self, path: Path) -> Path:
        path.write_bytes(b"\n".join(self.rows) + b"\n")
        return path


def read(path: Path, **cfg: Any) -> Recording:
    return read_replay(path, SEGMENTS, config=ReplayConfig(**cfg))


def levels(rec: Recording, region: str, key: PoolKey) -> tuple[tuple[float, float], ...]:
    for p in rec.pools[region]:
        if p.key == key:
            return p.points
    raise KeyError(key)


GPU_B = PoolKey("accelerator", "gpu-b")
CPU = PoolKey("cpu", "any")


# --------------------------------------------------------------------------------------------
# Time and arrivals
# --------------------------------------------------------------------------------------------


def test_arrivals_per_step_are_the_recorded_requests(tmp_path: Path) -> None:
    r = Rec()
    r.cap(0.0, 2.0)
    for t in (0.1, 0.2, 0.99, 1.0, 3.5, 3.6, 3.7, 4.25):
        r.req(t)
    rec = read(r.write(tmp_path / "r.jsonl"))
    assert rec.t0 == T0
    assert rec.span_s == pytest.approx(4.25)
    assert rec.n_steps == 5
    assert rec.arrivals["us-east"].tolist() == [3, 1, 0, 3, 1]
    assert rec.requests == 8
    assert rec.summary.used == {"capacity": 1, "requests": 8}
    assert rec.summary.skipped == 0


def test_time_starts_at_the_earliest_ts_whatever_the_line_order(tmp_path: Path) -> None:
    r = Rec()
    r.req(5.0)
    r.req(6.5)
    r.cap(2.0, 1.0)  # later in the file, earlier in time: t0
    rec = read(r.write(tmp_path / "r.jsonl"))
    assert rec.t0 == T0 + 2.0
    assert rec.span_s == pytest.approx(4.5)
    assert rec.arrivals["us-east"].tolist() == [0, 0, 0, 1, 1]


def test_the_rate_trace_is_the_recorded_count_per_window_at_its_middle(tmp_path: Path) -> None:
    r = Rec()
    for i in range(200):  # 20 rps over 10 s, then 5 rps over 5 s
        r.req(i * 0.05)
    for i in range(25):
        r.req(10.0 + i * 0.2)
    rec = read(r.write(tmp_path / "r.jsonl"), rate_window_s=10.0)
    assert rec.span_s == pytest.approx(14.8)
    pts = rec.rate_points["us-east"]
    assert pts[0] == pytest.approx((5.0, 20.0))
    assert pts[1][0] == pytest.approx(12.4)  # the last window is 4.8 s long
    assert pts[1][1] == pytest.approx(25 / 4.8)


# --------------------------------------------------------------------------------------------
# Capacity
# --------------------------------------------------------------------------------------------


def test_capacity_newest_ts_wins_whatever_the_file_order(tmp_path: Path) -> None:
    r = Rec()
    r.cap(0.0, 2.0)
    r.cap(10.0, 0.0)
    r.cap(5.0, 4.0)  # older than the line before: lands at t = 5, never overrides t = 10
    r.cap(10.0, 1.0)  # same ts as a line before: the lower level wins (the capacity book's rule)
    r.cap(20.0, 1.0)
    r.cap(20.0, 1.0)  # same level again: not a change
    r.req(20.0)
    rec = read(r.write(tmp_path / "r.jsonl"))
    assert levels(rec, "us-east", GPU_B) == ((0.0, 2.0), (5.0, 4.0), (10.0, 0.0), (20.0, 1.0))


def test_capacity_at_one_instant_is_decided_as_the_capacity_book_decides(tmp_path: Path) -> None:
    # a grant and a reclaim stamped at the same instant, in either line order: the reclaim holds,
    # as on every server and controller (headroom.defences.capacity.CapacityBook)
    for order in ((3.0, 0.0), (0.0, 3.0)):
        r = Rec()
        r.cap(0.0, 2.0)
        for units in order:
            r.cap(10.0, units)
        r.req(20.0)
        rec = read(r.write(tmp_path / "r.jsonl"))
        assert levels(rec, "us-east", GPU_B) == ((0.0, 2.0), (10.0, 0.0))


def test_a_level_lapses_when_its_lifetime_passes_unannounced(tmp_path: Path) -> None:
    r = Rec()
    r.cap(0.0, 3.0, expires_in_s=10.0)
    r.cap(8.0, 3.0, expires_in_s=10.0)  # announced again in time: still 3 until t = 18
    r.cap(0.0, 6.0, resource="cpu", hardware="any")  # no lifetime: holds
    r.req(30.0)
    rec = read(r.write(tmp_path / "r.jsonl"))
    assert levels(rec, "us-east", GPU_B) == ((0.0, 3.0), (18.0, 0.0))
    assert levels(rec, "us-east", CPU) == ((0.0, 6.0),)
    pool = next(p for p in rec.pools["us-east"] if p.key == GPU_B)
    assert pool.expires_in_s == 10.0
    assert pool.messages == 2


def test_remote_pools_stay_apart_and_dedicated_levels_are_counted_not_used(
    tmp_path: Path,
) -> None:
    r = Rec()
    r.cap(0.0, 2.0)
    r.cap(0.0, 5.0, remote=True)
    r.cap(0.0, 99.0, pool="dedicated", hardware="gpu-a")
    r.req(3.0)
    rec = read(r.write(tmp_path / "r.jsonl"))
    keys = [p.key for p in rec.pools["us-east"]]
    assert keys == [GPU_B, PoolKey("accelerator", "gpu-b", True)]
    assert rec.summary.dedicated_levels == 1
    assert rec.summary.used["capacity"] == 2


# --------------------------------------------------------------------------------------------
# Bad recordings
# --------------------------------------------------------------------------------------------


def test_every_bad_line_is_reported_with_its_place_and_skipped(tmp_path: Path) -> None:
    r = Rec()
    r.cap(0.0, 2.0)
    good = [r.req(1.0)]
    corrupt = r.raw(b'{"topic": "headroom.requests", "partition": 0, "offs')
    invalid = r.req(2.0, value=-1.0)
    tombstone = r.put("requests", None)
    unknown = r.req(2.5, segment="vip")
    bad_hw = r.cap(3.0, 4.0, resource="cpu", hardware="x86")
    dup = r.put("requests", orjson.dumps({"v": 1}), offset=0)  # offset 0 was read already
    good.append(r.req(4.0))
    rec = read(r.write(tmp_path / "r.jsonl"))
    s = rec.summary
    assert s.counts == {
        IssueKind.CORRUPT_LINE: 1,
        IssueKind.INVALID_MESSAGE: 2,
        IssueKind.NOT_REPLAYABLE: 2,
        IssueKind.DUPLICATE: 1,
    }
    assert s.skipped == 6
    by_line = {i.line: i for i in s.issues}
    assert set(by_line) == {corrupt, invalid, tombstone, unknown, bad_hw, dup}
    assert by_line[corrupt].topic is None
    assert "value" in by_line[invalid].reason
    assert by_line[invalid].topic == "headroom.requests"
    assert by_line[invalid].offset == 1  # the second record of the requests topic
    assert "tombstone" in by_line[tombstone].reason
    assert "'vip'" in by_line[unknown].reason
    assert "hardware 'any'" in by_line[bad_hw].reason
    assert by_line[dup].offset == 0
    assert str(by_line[dup]).startswith(f"line {dup}, headroom.requests partition 0 offset 0: ")
    assert str(by_line[dup]).endswith("(skipped)")
    # the run goes on: only the good requests arrive
    assert rec.requests == len(good)
    assert s.lines == len(r.rows)


def test_a_clock_going_backwards_is_reported_and_the_message_kept_at_its_ts(
    tmp_path: Path,
) -> None:
    r = Rec()
    r.req(0.0)
    r.req(5.0)
    back = r.req(2.0)
    r.req(3.0, region="eu-west")  # another region: its own clock
    rec = read(r.write(tmp_path / "r.jsonl"))
    (issue,) = rec.summary.issues
    assert issue.kind is IssueKind.CLOCK_BACKWARDS
    assert issue.line == back
    assert "3.000 s before" in issue.reason
    assert rec.summary.skipped == 0
    assert rec.arrivals["us-east"].tolist() == [1, 0, 1, 0, 1]  # the last ts closes the run
    assert rec.arrivals["us-east"].sum() + rec.arrivals["eu-west"].sum() == 4


def test_a_gap_is_reported_and_not_filled(tmp_path: Path) -> None:
    r = Rec()
    for i in range(100):
        r.req(i * 0.1)  # 10 rps for 10 s
    after = r.req(40.0)  # 30 s of silence
    for i in range(1, 50):
        r.req(40.0 + i * 0.1)
    rec = read(r.write(tmp_path / "r.jsonl"), gap_min_s=5.0)
    gaps = rec.summary.reported(IssueKind.GAP)
    assert len(gaps) == 1
    assert gaps[0].line == after
    assert "for 30.100 s" in gaps[0].reason
    assert rec.arrivals["us-east"][11:40].sum() == 0
    assert rec.summary.skipped == 0


def test_silence_at_the_end_of_the_run_is_a_gap_too(tmp_path: Path) -> None:
    r = Rec()
    for i in range(50):
        r.req(i * 0.1)
    r.cap(60.0, 1.0)  # capacity goes on, requests stopped at 4.9 s
    rec = read(r.write(tmp_path / "r.jsonl"))
    (gap,) = rec.summary.reported(IssueKind.GAP)
    assert gap.line is None
    assert str(gap).startswith("end of recording: gap: no request of region 'us-east'")


def test_issues_past_the_report_limit_are_counted(tmp_path: Path) -> None:
    r = Rec()
    r.req(0.0)
    for _ in range(30):
        r.raw(b"not json")
    r.req(1.0)
    rec = read(r.write(tmp_path / "r.jsonl"), max_reported=5)
    assert rec.summary.counts[IssueKind.CORRUPT_LINE] == 30
    assert len(rec.summary.issues) == 5


def test_other_topics_are_ignored_and_any_prefix_is_read(tmp_path: Path) -> None:
    r = Rec(prefix="prod.")
    r.req(0.0)
    r.req(1.0)
    r.put("latency", {"v": 1})
    rec = read(r.write(tmp_path / "r.jsonl"))
    assert rec.requests == 2
    assert rec.summary.ignored_topics == {"prod.latency": 1}
    assert rec.summary.skipped == 0


def test_a_recording_with_nothing_usable_is_a_config_error(tmp_path: Path) -> None:
    r = Rec()
    r.put("latency", {"v": 1})
    r.raw(b"garbage")
    with pytest.raises(ConfigError, match=r"no usable .*other topics: headroom\.latency"):
        read(r.write(tmp_path / "a.jsonl"))
    one = Rec()
    one.req(1.0)
    with pytest.raises(ConfigError, match="spans no time"):
        read(one.write(tmp_path / "b.jsonl"))
    wild = Rec()
    wild.req(0.0)
    wild.req(10 * 365 * 86_400.0)
    with pytest.raises(ConfigError, match=r"over the .* limit"):
        read(wild.write(tmp_path / "c.jsonl"))
    with pytest.raises(ConfigError, match="no such file"):
        read(tmp_path / "missing.jsonl")


def test_replay_config_names_the_bad_field() -> None:
    with pytest.raises(ConfigError) as err:
        ReplayConfig(step_s=0.0, value_alpha=0.7)
    assert any(p.startswith("replay.step_s:") for p in err.value.problems)
    assert any(p.startswith("replay.value_alpha:") for p in err.value.problems)


def test_progress_is_reported_by_bytes_for_both_passes(tmp_path: Path) -> None:
    r = Rec()
    for i in range(10_000):
        r.req(i * 0.01)
    path = r.write(tmp_path / "r.jsonl")
    seen: list[tuple[int, int, int]] = []
    read_replay(path, SEGMENTS, progress=lambda *a: seen.append(a))
    size = path.stat().st_size
    for p in (1, 2):
        done = [d for q, d, total in seen if q == p and total == size]
        assert done == sorted(done)
        assert done[-1] == size
        assert len(done) >= 3


# --------------------------------------------------------------------------------------------
# Regions and the derived scenario
# --------------------------------------------------------------------------------------------


def test_a_region_missing_from_the_scenario_is_an_error_naming_it(
    tmp_path: Path, base: Scenario
) -> None:
    r = Rec()
    r.req(0.0)
    line = r.req(1.0, region="ap-south")
    rec = read(r.write(tmp_path / "r.jsonl"))
    with pytest.raises(ConfigError) as err:
        derived_scenario(base, rec)
    (problem,) = err.value.problems
    assert f"region 'ap-south' of the recording (first at line {line})" in problem
    assert "--default-dedicated" in problem
    got = derived_scenario(base, rec, default_dedicated="eu-west")
    assert [r.name for r in got.regions] == ["us-east", "ap-south"]
    assert got.regions[1].dedicated == base.region("eu-west").dedicated
    assert got.regions[0].dedicated == base.region("us-east").dedicated
    with pytest.raises(ConfigError, match="--default-dedicated: 'mars'"):
        derived_scenario(base, rec, default_dedicated="mars")


def test_the_derived_scenario_is_the_base_with_the_recordings_regions(
    tmp_path: Path, base: Scenario
) -> None:
    r = Rec()
    r.cap(0.0, 2.0, region="eu-west")
    r.req(0.5, region="eu-west")
    r.req(9.0, region="eu-west")
    rec = read(r.write(tmp_path / "r.jsonl"))
    got = derived_scenario(base, rec)
    assert (got.slo, got.world, got.models) == (base.slo, base.world, base.models)
    # the world's segments (names, model errors) are the base's; mix and values the recording's:
    # both requests are casual with value 1.0; premium, never recorded, keeps its base value
    assert [(s.name, s.base_error, s.strong_error) for s in got.segments] == [
        (s.name, s.base_error, s.strong_error) for s in base.segments
    ]
    premium, casual = got.segments
    assert (premium.share, premium.value) == (ABSENT_SHARE, base.segments[0].value)
    assert (casual.share, casual.value.mean, casual.value.sigma) == (1.0, 1.0, 0.0)
    # the histogram: both requests in the 0.5 % bin of 1.0, written at its log middle
    ((v, n),) = casual.value.histogram or ()
    assert n == 2.0
    assert v / math.sqrt(VALUE_BIN_RATIO) <= 1.0 < v * math.sqrt(VALUE_BIN_RATIO)
    assert got.duration_s == rec.span_s == 9.0
    assert got.events == ()
    (region,) = got.regions
    assert region.name == "eu-west"
    assert region.traffic.trace == rec.rate_points["eu-west"]
    assert region.traffic.arrivals is not None  # one row a second, the last second included
    assert [(int(t), int(n)) for t, n in region.traffic.arrivals] == [
        (t, 1 if t in (0, 8) else 0) for t in range(9)
    ]
    assert region.opportunistic[0].trace == ((0.0, 2.0),)


def test_from_recording_files_load_back_as_the_derived_scenario(
    tmp_path: Path, base: Scenario
) -> None:
    r = Rec()
    r.cap(0.0, 2.0, expires_in_s=30.0)
    r.cap(0.0, 3.0, resource="cpu", hardware="any")
    r.cap(0.0, 1.0, remote=True)
    r.cap(12.0, 0.5)
    for i in range(300):
        r.req(i * 0.1 + 0.013, segment=SEGMENTS[i % 2], value=0.1 * (i % 17))
        r.req(i * 0.1 + 0.05, region="eu-west")
    rec = read(r.write(tmp_path / "r.jsonl"))
    out = tmp_path / "out" / "day-1.yaml"
    written = write_derived(base, rec, out)
    assert load_scenario(out) == written
    expected = derived_scenario(base, rec, name="day-1")
    assert [(x.name, x.traffic.trace, x.traffic.arrivals) for x in written.regions] == [
        (x.name, x.traffic.trace, x.traffic.arrivals) for x in expected.regions
    ]
    assert [
        (x.share, x.value.mean, x.value.sigma, x.value.histogram) for x in written.segments
    ] == [(x.share, x.value.mean, x.value.sigma, x.value.histogram) for x in expected.segments]
    assert [o.trace for x in written.regions for o in x.opportunistic] == [
        o.trace for x in expected.regions for o in x.opportunistic
    ]
    names = sorted(p.name for p in out.parent.iterdir())
    assert names == [
        "day-1.casual.values.csv",
        "day-1.eu-west.arrivals.csv",
        "day-1.eu-west.traffic.csv",
        "day-1.premium.values.csv",
        "day-1.us-east.accelerator.gpu-b.opportunistic.csv",
        "day-1.us-east.accelerator.gpu-b.remote.csv",
        "day-1.us-east.arrivals.csv",
        "day-1.us-east.cpu.any.opportunistic.csv",
        "day-1.us-east.traffic.csv",
        "day-1.yaml",
    ]
    assert (out.parent / "day-1.us-east.accelerator.gpu-b.opportunistic.csv").read_text() == (
        "t_s,units\n0.0,2.0\n12.0,0.5\n"
    )
    arrivals = (out.parent / "day-1.us-east.arrivals.csv").read_text().splitlines()
    assert arrivals[:3] == ["t_s,requests", "0,10", "1,10"]
    assert len(arrivals) == 1 + rec.n_steps


def test_from_recording_refuses_a_region_without_requests(tmp_path: Path, base: Scenario) -> None:
    r = Rec()
    r.cap(0.0, 2.0, region="eu-west")
    r.req(0.0)
    r.req(5.0)
    rec = read(r.write(tmp_path / "r.jsonl"))
    with pytest.raises(ConfigError, match=r"'eu-west' .* no request"):
        write_derived(base, rec, tmp_path / "x.yaml")


def test_the_command_exits_2_naming_a_missing_region_and_0_with_a_default(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "base.yaml").write_text(BASE)
    r = Rec()
    r.req(0.0, region="ap-south")
    r.req(3.0, region="ap-south")
    r.raw(b"{broken")
    path = r.write(tmp_path / "r.jsonl")
    args = ["scenario", "from-recording", str(path), "--base", str(tmp_path / "base.yaml")]
    assert main([*args, "--out", str(tmp_path / "n.yaml")]) == 2
    assert "region 'ap-south'" in capsys.readouterr().err
    out = tmp_path / "n.yaml"
    assert main([*args, "--out", str(out), "--default-dedicated", "us-east"]) == 0
    captured = capsys.readouterr()
    last = orjson.loads(captured.out.strip().splitlines()[-1])
    assert last["regions"] == ["ap-south"]
    assert last["requests"] == 2
    assert last["skipped"] == 1
    assert "replay: line 3: corrupt line:" in captured.err
    assert main(["scenario", "check", str(out)]) == 0


# --------------------------------------------------------------------------------------------
# The recorded population
# --------------------------------------------------------------------------------------------


def population(values: dict[str, Iterable[float]], bins: int = 8) -> RecordedPopulation:
    base = load_scenario_text(BASE)
    grid = ValueGrid.make(0.005)
    counts = np.zeros((2, grid.n_bins), dtype=np.int64)
    for s, name in enumerate(SEGMENTS):
        v = np.asarray(list(values.get(name, [])), dtype=np.float64)
        if v.size:
            counts[s] = np.bincount(grid.index(v), minlength=grid.n_bins)
    return RecordedPopulation.from_counts(base.segments, counts, grid, bins)


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.floats(0.0, 1e4), min_size=1, max_size=300),
    st.lists(st.floats(1e-3, 50.0), min_size=1, max_size=300),
    st.integers(1, 12),
)
def test_cells_hold_the_recorded_mix_and_moments(
    premium: list[float], casual: list[float], bins: int
) -> None:
    pop = population({"premium": premium, "casual": casual}, bins)
    n = len(premium) + len(casual)
    assert pop.seg_share.tolist() == pytest.approx([len(premium) / n, len(casual) / n])
    assert pop.share.sum() == pytest.approx(1.0)
    for s, vals in enumerate((premium, casual)):
        cells = slice(s * bins, (s + 1) * bins)
        v = np.asarray(vals)
        # every value moves by at most its bin's relative width (alpha), or below 1e-9
        for j in (1, 2):
            got = float(pop.v_moments[j - 1, cells].mean())
            want = float((v**j).mean())
            assert got == pytest.approx(want, rel=0.011 * j, abs=1e-8)
        m1, m2 = pop.v_moments[0, cells], pop.v_moments[1, cells]
        assert (m2 >= m1 * m1 * (1 - 1e-9) - 1e-12).all()
        assert (np.diff(pop.v_mean[cells]) >= -1e-9 * (1 + pop.v_mean[cells][1:])).all()


@settings(max_examples=40, deadline=None)
@given(
    st.lists(st.floats(1e-3, 1e3), min_size=2, max_size=200),
    st.lists(st.floats(1e-3, 1e3), min_size=2, max_size=200),
    st.floats(0.01, 0.99),
)
def test_keep_top_keeps_exactly_the_share_asked_for_highest_values_first(
    premium: list[float], casual: list[float], share: float
) -> None:
    pop = population({"premium": premium, "casual": casual})
    keep = pop.keep_top(share)
    assert float((keep * pop.share).sum()) == pytest.approx(round(share, 4), abs=1e-6)
    v = pop.value_quantile(1.0 - share)
    assert pop.value_cdf(v) == pytest.approx(1.0 - share, abs=1e-9)
    # within a segment, a higher cell is kept at least as much as a lower one
    for s in range(2):
        k = keep[s * pop.bins : (s + 1) * pop.bins]
        assert (np.diff(k) >= -1e-12).all()


@settings(max_examples=40, deadline=None)
@given(st.lists(st.floats(1e-2, 1e3), min_size=1, max_size=200), st.integers(0, 2**32 - 1))
def test_sampled_values_fall_in_their_cells(casual: list[float], seed: int) -> None:
    pop = population({"casual": casual})
    rng = np.random.default_rng(seed)
    cells = rng.integers(0, pop.n_cells, 500)
    v = pop.sample_values(cells, rng.random(500))
    lo, hi = pop.v_lo[cells], pop.v_hi[cells]
    assert ((v >= lo * (1 - 1e-9)) & (v <= hi * (1 + 1e-9))).all()


def test_a_segment_without_recorded_requests_has_no_share_and_the_scenarios_values() -> None:
    pop = population({"casual": [1.0, 2.0, 3.0]})
    assert pop.seg_share.tolist() == [0.0, 1.0]
    assert pop.recorded.tolist() == [0, 3]
    premium = pop.v_mean[: pop.bins]
    assert premium.mean() == pytest.approx(3.0, rel=0.05)  # the base's log-normal mean


# --------------------------------------------------------------------------------------------
# Into the engine
# --------------------------------------------------------------------------------------------


class FlatCurves:
    """Quality grows slowly with candidates; the strong model is better (enough for the engine)."""

    def mean_quality(self, segment_idx: Any, model: Any, n: Any) -> Any:
        s = np.asarray(segment_idx, dtype=np.float64)
        return 0.5 + 0.1 * np.asarray(model) + 0.0005 * np.asarray(n) + 0.0 * s

    def std_quality(self, segment_idx: Any, model: Any, n: Any) -> Any:
        return np.full(np.shape(segment_idx), 0.2)


def test_the_engine_context_carries_the_recorded_arrivals_levels_and_requests(
    tmp_path: Path, base: Scenario
) -> None:
    r = Rec()
    r.cap(0.0, 2.0)
    r.cap(7.5, 0.0)
    rng = np.random.default_rng(1)
    for t in np.sort(rng.uniform(0, 30, 900)):
        r.req(float(t), segment="premium" if rng.random() < 0.5 else "casual",
              value=float(rng.lognormal()), eligible=bool(rng.random() < 0.4))  # fmt: skip
    rec = read(r.write(tmp_path / "r.jsonl"))
    scenario = derived_scenario(base, rec)
    ctx = ReplayContext(scenario, rec, FlatCurves(), seed=5)
    (rt,) = ctx.traces.regions
    assert rt.arrivals.tolist() == rec.arrivals["us-east"].tolist()
    assert ctx.traces.n_steps == rec.n_steps == 30
    (pool,) = rt.pools
    assert pool.key == GPU_B
    assert [pool.level_at(t) for t in (0.0, 7.4, 7.5, 29.0)] == [2.0, 2.0, 0.0, 0.0]
    assert ctx.pop is not None
    assert isinstance(ctx.pop, RecordedPopulation)
    assert ctx.eligible == pytest.approx(rec.eligible / 900)
    assert ctx.t0 == rec.t0
    assert ctx.duration_s == rec.span_s
    with pytest.raises(ConfigError, match=r"sim\.step_s"):
        ReplayContext(scenario, rec, FlatCurves(), config=SimConfig(step_s=0.5))


def test_a_feed_recording_holds_the_feeds_schedule(tmp_path: Path, base: Scenario) -> None:
    from headroom.workers.feed import FeedSchedule

    path = tmp_path / "feed.jsonl"
    with path.open("wb") as f:
        written = write_feed_recording(base, f, duration_s=25.0, refresh_s=10.0)
    schedule = FeedSchedule(base)
    expected = sum(len([q for q in schedule.requests(s) if q[0] < 25.0]) for s in range(25))
    assert written["requests"] == expected
    # levels at 0 for the one pool, then re-announced at 10 and 20 s
    assert written["capacity"] == 3
    rec = read(path)
    assert rec.requests == expected
    assert rec.summary.skipped == 0
    assert math.isclose(rec.t0, T0)
    assert levels(rec, "us-east", CPU) == ((0.0, 8.0),)
