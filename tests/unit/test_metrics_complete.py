"""Completeness of a policy's run, null capture ratios, and the run-wide figures of the metrics
(``complete``, ``latency``, ``capacity.captured_share``, ``reclaims.releases``), and what
``headroom analyze`` does with an incomplete log."""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from headroom.analysis.events import EventLog
from headroom.analysis.metrics import (
    Coverage,
    capture_ratio,
    compute_metrics,
    incomplete_policies,
)
from headroom.analysis.table import format_table
from headroom.analysis.testing import LogBuilder
from headroom.cli import main

FAST = [50.0] * 100


def finished_log(policies: tuple[str, ...] = ("p",), *, windows: int = 6) -> LogBuilder:
    """A log whose policies ran ``windows`` windows of 10 s, every one present, and finished."""
    log = LogBuilder(duration_s=10.0 * windows)
    log.run_started(None)
    for p in policies:
        log.oracle(p, 40.0)
        for k in range(windows):
            log.window(
                p, "r1", 10.0 * k, latencies_ms=FAST, value_total=110.0, value_baseline=100.0
            )
        log.run_finished(p)
    return log


# --- completeness ---------------------------------------------------------------------------------


def test_a_finished_run_with_every_window_is_complete() -> None:
    doc = compute_metrics(finished_log(("static", "headroom")).events)
    for m in doc["policies"].values():
        assert m["complete"] is True
        assert m["duration_s"] == 60.0
        assert m["completeness"] == {
            "run_finished": True,
            "planned_s": 60.0,
            "covered_s": 60.0,
            "missing_windows": 0,
            "corrupt_lines": 0,
            "problems": [],
        }
        assert m["value"]["capture_ratio"] == pytest.approx(60.0 / 40.0)
    assert doc["log"] == {"corrupt_lines": 0, "corrupt_by_policy": {}, "corrupt_unattributed": 0}
    assert incomplete_policies(doc) == {}


def test_a_run_without_run_finished_is_incomplete() -> None:
    log = finished_log()
    log.events = [e for e in log.events if e["kind"] != "run.finished"]
    m = compute_metrics(log.events)["policies"]["p"]
    assert m["complete"] is False
    assert m["completeness"]["run_finished"] is False
    assert m["completeness"]["problems"] == ["no run.finished line"]
    assert m["duration_s"] == 60.0  # every window is there: the covered span is the whole run
    # the bound is over the whole run: a ratio is not shown for a run that may have stopped short
    assert m["value"]["capture_ratio"] is None


def test_a_null_policy_run_finished_finishes_every_policy() -> None:
    log = finished_log(("a", "b"))
    log.events = [e for e in log.events if e["kind"] != "run.finished"]
    log.run_finished(None)
    doc = compute_metrics(log.events)
    assert [m["complete"] for m in doc["policies"].values()] == [True, True]


def test_a_gap_in_the_window_sequence_makes_the_run_incomplete() -> None:
    log = finished_log(windows=10)
    log.events = [
        e for e in log.events if not (e["kind"] == "window" and e["t_start"] in (30.0, 40.0))
    ]
    m = compute_metrics(log.events)["policies"]["p"]
    assert m["complete"] is False
    assert m["completeness"]["missing_windows"] == 2
    assert m["completeness"]["covered_s"] == 80.0
    assert m["duration_s"] == 80.0
    assert m["completeness"]["problems"] == [
        "windows cover 80 of 100 s (2 window(s) missing: r1 2)"
    ]


def test_windows_that_stop_short_of_the_duration_make_the_run_incomplete() -> None:
    log = finished_log(windows=10)
    log.events = [e for e in log.events if not (e["kind"] == "window" and e["t_start"] >= 40.0)]
    m = compute_metrics(log.events)["policies"]["p"]
    assert (m["complete"], m["duration_s"], m["completeness"]["missing_windows"]) == (
        False,
        40.0,
        6,
    )


def test_the_covered_span_is_what_every_region_covers() -> None:
    log = LogBuilder(duration_s=60.0, regions=("r1", "r2"))
    log.run_started("p")
    for k in range(6):
        log.window("p", "r1", 10.0 * k, latencies_ms=FAST)
    for k in range(3):  # r2 stops after 30 s
        log.window("p", "r2", 10.0 * k, latencies_ms=FAST)
    log.run_finished("p")
    m = compute_metrics(log.events)["policies"]["p"]
    assert m["complete"] is False
    assert m["duration_s"] == 30.0
    assert "r2 3" in m["completeness"]["problems"][0]


def test_a_region_the_run_names_but_the_log_never_shows_is_missing() -> None:
    log = LogBuilder(duration_s=20.0, regions=("r1", "r2"))
    log.run_started("p")
    for k in range(2):
        log.window("p", "r1", 10.0 * k, latencies_ms=FAST)
    log.run_finished("p")
    m = compute_metrics(log.events)["policies"]["p"]
    assert (m["complete"], m["duration_s"], m["completeness"]["missing_windows"]) == (False, 0.0, 2)


def test_windows_out_of_order_and_from_several_sources_still_cover_the_run() -> None:
    log = LogBuilder(duration_s=100.0)
    log.run_started("p")
    starts = [10.0 * k for k in range(10)]
    random.Random(4).shuffle(starts)
    for t in starts:
        log.window("p", "r1", t, latencies_ms=FAST)
        log.window("p", "r1", t, latencies_ms=FAST, source="client-2")
    log.run_finished("p")
    assert compute_metrics(log.events)["policies"]["p"]["complete"] is True


def test_a_last_window_longer_than_the_run_still_counts() -> None:
    # the streaming feed writes its last, partial window with a full window's t_end
    log = LogBuilder(duration_s=95.0)
    log.run_started("p")
    for k in range(10):
        log.window("p", "r1", 10.0 * k, latencies_ms=FAST)
    log.run_finished("p")
    m = compute_metrics(log.events)["policies"]["p"]
    assert (m["complete"], m["duration_s"]) == (True, 95.0)


@settings(max_examples=200, deadline=None)
@given(
    present=st.lists(st.booleans(), min_size=1, max_size=40),
    seed=st.integers(0, 2**16),
)
def test_coverage_is_the_union_of_the_spans_in_any_order(present: list[bool], seed: int) -> None:
    spans = [(10.0 * k, 10.0 * (k + 1)) for k, keep in enumerate(present) if keep]
    order = list(spans) * 2  # duplicates (two sources of one window) change nothing
    random.Random(seed).shuffle(order)
    cov = Coverage()
    for a, b in order:
        cov.add(a, b)
    covered = cov.within(0.0, 10.0 * len(present))
    assert sum(b - a for a, b in covered) == pytest.approx(10.0 * len(spans))
    # disjoint, sorted, and no two touch (touching spans are merged)
    assert all(covered[i][1] < covered[i + 1][0] for i in range(len(covered) - 1))
    gaps = sum(1 for i in range(1, len(present)) if present[i] and not present[i - 1])
    assert len(covered) == gaps + (1 if present[0] else 0)


# --- corrupt lines --------------------------------------------------------------------------------


def test_corrupt_lines_are_counted_per_policy_and_make_it_incomplete(tmp_path: Path) -> None:
    path = finished_log(("a", "b")).write(tmp_path / "events.jsonl")
    lines = path.read_bytes().splitlines(keepends=True)
    window_b = next(i for i, ln in enumerate(lines) if b'"policy":"b"' in ln and b"window" in ln)
    lines[window_b] = lines[window_b][:120] + b"\n"  # cut short: still names its policy
    lines.append(b"garbage\n")  # names no policy
    path.write_bytes(b"".join(lines))
    log = EventLog(path)
    doc = compute_metrics(log)
    assert log.stats.corrupt == 2
    assert log.stats.corrupt_by_policy == {"b": 1}
    assert doc["log"] == {
        "corrupt_lines": 2,
        "corrupt_by_policy": {"b": 1},
        "corrupt_unattributed": 1,
    }
    assert doc["policies"]["a"]["complete"] is True
    b = doc["policies"]["b"]
    assert b["complete"] is False
    assert b["completeness"]["corrupt_lines"] == 1
    assert "1 corrupt line(s)" in b["completeness"]["problems"]
    assert "b: 1" in log.stats.summary()
    assert set(incomplete_policies(doc)) == {"b"}


def test_a_policy_only_corrupt_lines_name_is_reported_incomplete(tmp_path: Path) -> None:
    path = finished_log(("a",)).write(tmp_path / "events.jsonl")
    with path.open("ab") as f:
        f.write(b'{"v":1,"kind":"window","policy":"ghost","t_sta\n')
    doc = compute_metrics(EventLog(path))
    assert list(doc["policies"]) == ["a"]
    assert incomplete_policies(doc) == {"ghost": ["1 corrupt line(s) and no readable line"]}


# --- null capture ratios --------------------------------------------------------------------------


def test_capture_ratio_is_null_where_the_bound_is_too_small_to_divide_by() -> None:
    baseline = 5e5
    floor = 1e-6 * baseline
    assert capture_ratio(2.0, floor, baseline) is None
    assert capture_ratio(-7e3, 1e-10, baseline) is None  # the −1.4e16 of a bound ~0
    assert capture_ratio(2.0, -3.0, baseline) is None
    assert capture_ratio(2.0, 0.0, 0.0) is None
    assert capture_ratio(2.0, 4.0 * floor, baseline) == pytest.approx(0.5 / floor)
    assert capture_ratio(1.0, 2e-9, 0.0) == pytest.approx(5e8)  # the absolute floor: 1e-9
    # scale-free: the same run in other units of value gives the same answer
    for scale in (1e-6, 1.0, 1e6):
        r = capture_ratio(3.0 * scale, 2.0 * floor * scale, baseline * scale)
        assert r == pytest.approx(1.5 / floor)
        assert capture_ratio(3.0 * scale, 0.5 * floor * scale, baseline * scale) is None


def test_a_bound_of_zero_gives_a_null_capture_and_the_table_prints_a_dash() -> None:
    log = finished_log(("static", "headroom"))
    for e in log.events:
        if e["kind"] == "oracle.bound":
            e["oracle_incremental"] = 1e-12 if e["policy"] == "headroom" else 40.0
    doc = compute_metrics(log.events)
    assert doc["policies"]["headroom"]["value"]["capture_ratio"] is None
    assert doc["policies"]["static"]["value"]["capture_ratio"] == pytest.approx(1.5)
    text = format_table(doc)
    rows = {
        ln.split()[0]: ln for ln in text.splitlines() if ln.startswith(("static ", "headroom "))
    }
    assert " – " in rows["headroom"]
    assert "1.500" in rows["static"]
    orjson.dumps(doc)  # null is valid JSON


# --- run-wide latency, captured share, releases ------------------------------------------------


def test_run_wide_p99s_come_from_the_merged_sketches_of_every_window() -> None:
    rng = np.random.default_rng(11)
    log = LogBuilder(duration_s=40.0)
    log.run_started("p")
    every: list[float] = []
    base: list[float] = []
    for k in range(4):
        b = list(rng.lognormal(3.5, 0.3, 300))
        treated = list(rng.lognormal(4.5 + 0.2 * k, 0.3, 100))
        every += b + treated
        base += b
        log.window("p", "r1", 10.0 * k, latencies_ms=b + treated, base_latencies_ms=b)
    log.run_finished("p")
    lat = compute_metrics(log.events)["policies"]["p"]["latency"]
    # the sketch's lower sample quantile, within its 1 % relative accuracy
    want_all = float(np.quantile(every, 0.99, method="lower"))
    want_base = float(np.quantile(base, 0.99, method="lower"))
    assert lat["all_p99_ms"] == pytest.approx(want_all, rel=0.0101)
    assert lat["baseline_only_p99_ms"] == pytest.approx(want_base, rel=0.0101)
    assert (lat["all_count"], lat["baseline_only_count"]) == (1600, 1200)
    # not the mean of the windows' p99s
    per_window = [np.quantile(every[400 * k : 400 * (k + 1)], 0.99) for k in range(4)]
    assert abs(lat["all_p99_ms"] - float(np.mean(per_window))) > 0.02 * want_all


def test_latency_is_null_without_samples() -> None:
    log = LogBuilder(duration_s=10.0)
    log.run_started("p")
    log.window("p", "r1", 0.0, latencies_ms=[10.0] * 5, base_latencies_ms=[])
    log.run_finished("p")
    lat = compute_metrics(log.events)["policies"]["p"]["latency"]
    assert lat["baseline_only_p99_ms"] is None
    assert lat["baseline_only_count"] == 0
    assert lat["all_p99_ms"] == pytest.approx(10.0, rel=0.01)


def test_captured_share_is_used_over_offered_and_null_where_nothing_was_offered() -> None:
    log = LogBuilder(duration_s=20.0)
    log.run_started("p")
    log.window("p", "r1", 0.0, latencies_ms=FAST, offered={"cpu": 30.0}, used={"cpu": 6.0})
    log.window("p", "r1", 10.0, latencies_ms=FAST, offered={"cpu": 10.0}, used={"cpu": 4.0})
    log.run_finished("p")
    m = compute_metrics(log.events)["policies"]["p"]
    assert m["capacity"]["captured_share"] == {"cpu": 0.25, "accelerator": None}


def test_releases_count_the_release_times_the_percentiles_are_over() -> None:
    log = finished_log(("with", "without"))
    for ms in (3.0, 9.0, 4.0):
        log.event("optional.released", "with", "r1", release_ms=ms)
    log.event("capacity.reclaimed", "without", "r1", resource="cpu", hardware="any")
    doc = compute_metrics(log.events)
    assert doc["policies"]["with"]["reclaims"]["releases"] == 3
    assert doc["policies"]["with"]["reclaims"]["release_ms_p99"] == 9.0
    assert doc["policies"]["without"]["reclaims"]["count"] == 1
    assert doc["policies"]["without"]["reclaims"]["releases"] == 0


# --- headroom analyze on an incomplete log ------------------------------------------------------


def _truncated(tmp_path: Path) -> Path:
    """Two policies one after the other, the log cut in the middle of the second one's windows
    (mid-line), as an interrupted run leaves it."""
    path = finished_log(("static", "aimd"), windows=20).write(tmp_path / "run" / "events.jsonl")
    data = path.read_bytes()
    cut = data.index(b'"policy":"aimd","region":"r1","t_start":100.0')
    path.write_bytes(data[: cut + 30])
    return path


def test_analyze_of_a_truncated_log_exits_1_naming_the_incomplete_policy(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _truncated(tmp_path)
    assert main(["analyze", str(path), "--no-plots"]) == 1
    err = capsys.readouterr().err
    assert "policy aimd is incomplete: no run.finished line; windows cover 100 of 200 s" in err
    assert "policy static" not in err
    assert "--partial" in err
    assert not (path.parent / "metrics.json").exists()


def test_analyze_partial_writes_the_incomplete_policy_with_complete_false(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _truncated(tmp_path)
    out = tmp_path / "out"
    assert main(["analyze", str(path), "--out", str(out), "--partial"]) == 0
    captured = capsys.readouterr()
    assert "policy aimd is incomplete" in captured.err
    assert "aimd (incomplete)" in captured.out
    doc = orjson.loads((out / "metrics.json").read_bytes())
    static, aimd = doc["policies"]["static"], doc["policies"]["aimd"]
    assert (static["complete"], static["duration_s"]) == (True, 200.0)
    assert (aimd["complete"], aimd["duration_s"]) == (False, 100.0)
    assert aimd["value"]["capture_ratio"] is None
    assert doc["log"]["corrupt_by_policy"] == {"aimd": 1}
    assert (out / "report.html").exists()


def test_analyze_of_a_complete_log_says_complete_everywhere(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = finished_log(("static", "aimd")).write(tmp_path / "events.jsonl")
    assert main(["analyze", str(path), "--no-plots"]) == 0
    assert "incomplete" not in capsys.readouterr().err
    doc = orjson.loads((tmp_path / "metrics.json").read_bytes())
    assert all(m["complete"] is True for m in doc["policies"].values())


def test_the_report_checks_name_an_incomplete_run() -> None:
    from headroom.analysis.report import consistency_checks

    log = finished_log(("static", "aimd"))
    log.events = [e for e in log.events if e["kind"] != "run.finished" or e["policy"] != "aimd"]
    found = consistency_checks(compute_metrics(log.events))
    assert [f for f in found if "incomplete" in f] == [
        "aimd: incomplete run (no run.finished line): its figures cover less than the run"
    ]
