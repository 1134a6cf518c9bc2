"""The report and the ``headroom analyze`` command, on small synthetic logs."""

from __future__ import annotations

import base64
import re
from pathlib import Path

import numpy as np
import orjson
import pytest

from headroom.analysis.checks import consistency_checks
from headroom.analysis.events import EventLog, base_sketch, read_events
from headroom.analysis.metrics import SketchSum, compute_metrics
from headroom.analysis.plots import _carry_forward
from headroom.analysis.report import write_report
from headroom.analysis.report_data import collect
from headroom.analysis.testing import LogBuilder, arm, synthetic_run
from headroom.cli import main
from headroom.kernel.sketch import LatencySketch

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
PLOTS = (
    "summary",
    "p99_over_time",
    "latency_cdf",
    "targets_vs_capacity",
    "value_over_time",
    "release_times",
    "segment_exposure",
    "allocator",
)
# drawn only when some window line carries precompute sums (the module's run_log does)
PRECOMPUTE_PLOT = "precompute"


@pytest.fixture(scope="module")
def run_log(tmp_path_factory: pytest.TempPathFactory) -> Path:
    log = synthetic_run(
        policies=("static", "headroom"),
        regions=("r1",),
        duration_s=600.0,
        requests_per_window=60,
        precompute=True,
    )
    path = log.write(tmp_path_factory.mktemp("run") / "events.jsonl")
    with path.open("ab") as f:
        f.write(b"this line is not json\n")
    return path


@pytest.fixture(scope="module")
def analyzed(run_log: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, int, str]:
    out = tmp_path_factory.mktemp("out")
    # capsys is function-scoped: capture by redirecting through a file instead
    import contextlib
    import io

    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        code = main(["analyze", str(run_log), "--out", str(out)])
    return out, code, buf.getvalue()


def test_analyze_writes_metrics_equal_to_compute_metrics_of_the_same_log(
    run_log: Path, analyzed: tuple[Path, int, str]
) -> None:
    out, code, _ = analyzed
    assert code == 0
    written = orjson.loads((out / "metrics.json").read_bytes())
    assert written == compute_metrics(EventLog(run_log))
    assert set(written["policies"]) == {"static", "headroom"}
    assert "precompute" in written["policies"]["headroom"]


def test_analyze_prints_the_table_and_the_report_path_last(
    analyzed: tuple[Path, int, str],
) -> None:
    out, _, stdout = analyzed
    lines = stdout.strip().splitlines()
    assert lines[-1] == f"report: {out / 'report.html'}"
    assert any(line.startswith("headroom ") for line in lines)
    assert any(line.startswith("static ") for line in lines)


def test_report_is_self_contained_with_every_plot_inlined(analyzed: tuple[Path, int, str]) -> None:
    out, _, _ = analyzed
    page = (out / "report.html").read_text(encoding="utf-8")
    images = re.findall(r"src='data:image/png;base64,([A-Za-z0-9+/=]+)'", page)
    assert len(images) == len(PLOTS) + 1
    for encoded in images:
        assert base64.b64decode(encoded).startswith(PNG_MAGIC)
    for name in (*PLOTS, PRECOMPUTE_PLOT):
        assert (out / "plots" / f"{name}.png").read_bytes().startswith(PNG_MAGIC)
        assert f"id='{name}'" in page
    # nothing loaded from elsewhere: no external scripts, stylesheets or images (links within
    # the page are fine)
    assert not re.search(r"""(src|href)=['"](?!data:|#)""", page)
    assert "<script" not in page


def test_report_explains_each_plot_and_shows_the_tables(analyzed: tuple[Path, int, str]) -> None:
    out, _, _ = analyzed
    page = (out / "report.html").read_text(encoding="utf-8")
    assert page.count("<p class='caption'>") >= len(PLOTS)
    assert "Side by side" in page
    assert "<td>headroom</td>" in page
    assert "Precompute" in page
    assert "Per region" in page


def test_report_lists_corrupt_lines_and_keeps_unknown_kinds_verbatim(
    run_log: Path, analyzed: tuple[Path, int, str]
) -> None:
    out, _, _ = analyzed
    page = (out / "report.html").read_text(encoding="utf-8")
    n_lines = len(run_log.read_bytes().splitlines())
    assert f"<td>{n_lines}</td><td>not JSON" in page
    assert "future.kind" in page
    assert "kinds unknown to this analyzer are kept" in page


def test_analyze_without_plots_writes_only_metrics(
    run_log: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["analyze", str(run_log), "--out", str(tmp_path), "--no-plots"]) == 0
    assert (tmp_path / "metrics.json").exists()
    assert not (tmp_path / "report.html").exists()
    captured = capsys.readouterr()
    assert captured.out.strip().splitlines()[-1] == f"metrics: {tmp_path / 'metrics.json'}"
    assert "1 corrupt line(s) skipped" in captured.err


def test_analyze_writes_beside_the_log_by_default(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    log = LogBuilder(duration_s=10.0)
    log.run_started("static")
    log.window("static", "r1", 0.0, latencies_ms=[10.0] * 5)
    log.run_finished("static")
    path = log.write(tmp_path / "logs" / "events.jsonl")
    assert main(["analyze", str(path), "--no-plots"]) == 0
    assert (tmp_path / "logs" / "metrics.json").exists()
    capsys.readouterr()


def test_analyze_of_a_missing_log_exits_2_with_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = tmp_path / "nope.jsonl"
    assert main(["analyze", str(missing)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"headroom: {missing}: no such event log"]


def test_analyze_of_a_log_that_is_not_an_event_log_exits_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "junk.jsonl"
    path.write_text("hello\nworld\n")
    assert main(["analyze", str(path), "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "2 corrupt line(s) skipped" in err
    assert "holds no events" in err


def test_report_of_a_run_with_no_windows_still_renders(tmp_path: Path) -> None:
    log = LogBuilder()
    log.run_started("static")
    log.run_finished("static")
    path = log.write(tmp_path / "events.jsonl")
    metrics = compute_metrics(read_events(path))
    report = write_report(metrics, path, tmp_path)
    assert report == tmp_path / "report.html"
    assert report.read_text(encoding="utf-8").count("data:image/png;base64,") == len(PLOTS)


def test_pooled_sketches_equal_merging_every_window_sketch() -> None:
    log = synthetic_run(policies=("headroom",), regions=("r1", "r2"), duration_s=120.0)
    metrics = compute_metrics(log.events)
    data = collect(log.events, metrics)
    for which, key in (("all", "sketch"), ("base", "sketch_base")):
        expected = LatencySketch.merged(
            LatencySketch.from_dict(e[key] if key == "sketch" else base_sketch(e))
            for e in log.events
            if e["kind"] == "window"
        )
        assert data.sketches[("headroom", which)].sketch() == expected


def test_sketch_sum_merges_exactly() -> None:
    rng = np.random.default_rng(3)
    parts = [LatencySketch.from_values(rng.lognormal(4, 1, 50)) for _ in range(40)]
    total = SketchSum()
    for p in parts:
        total.add(p.to_dict())
    assert total.sketch() == LatencySketch.merged(parts)


def test_allocations_stay_in_force_until_the_next_target() -> None:
    sums = np.array([0.0, 4.0, 0.0, 0.0, 6.0, 0.0])
    steps = np.array([0, 2, 0, 0, 1, 0])
    assert _carry_forward(sums, steps).tolist() == [0.0, 2.0, 2.0, 2.0, 6.0, 6.0]


def test_report_series_time_of_events_without_t_comes_from_ts_minus_t0() -> None:
    log = LogBuilder(duration_s=100.0, window_s=10.0)
    log.run_started("p")
    log.window("p", "r1", 0.0, latencies_ms=[10.0])
    log.event("shedding.started", "p", "r1", t=55.0, side="server", lever="rma")
    metrics = compute_metrics(log.events)
    data = collect(log.events, metrics)
    assert data.shedding["p"].total("server").tolist() == [0, 0, 0, 0, 0, 1, 0, 0, 0, 0]


def test_event_log_stats_reach_the_report(run_log: Path) -> None:
    log = EventLog(run_log)
    events = list(log)
    assert log.stats.corrupt == 1
    assert len(events) == log.stats.events


def test_checks_flag_a_broken_oracle_a_lever_gap_and_a_missed_interval() -> None:
    log = LogBuilder()
    log.run_started("p")
    log.oracle("p", 5.0)
    arms = {"casual": {"control": arm([1.0, 1.0, 1.0]), "rma": arm([1.0, 1.0])}}
    log.window(
        "p",
        "r1",
        0.0,
        latencies_ms=[10.0],
        value_total=20.0,
        value_baseline=10.0,
        inc={"rma": 4.0},
        arms=arms,
    )
    found = consistency_checks(compute_metrics(log.events))
    assert any("differs from the sum over levers" in f for f in found)
    assert any("exceeds the oracle bound" in f for f in found)
    assert not any("does not cover" in f for f in found)  # an estimate of exactly 0 is silent


def test_checks_are_silent_on_a_consistent_run() -> None:
    log = synthetic_run(policies=("static", "headroom"), regions=("r1",), duration_s=300.0)
    found = consistency_checks(compute_metrics(log.events))
    assert [f for f in found if "holdout" not in f] == []
