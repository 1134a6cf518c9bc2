"""The answer first: the verdict, the consistency checks and the closing lines of the summary, and
the plot helpers that keep plots readable (one style per policy, a robust value scale)."""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from headroom.analysis.checks import checks_notice, consistency_checks, failed, run_checks
from headroom.analysis.metrics import compute_metrics
from headroom.analysis.plots import _POLICY_STYLES, _robust_limits, policy_style
from headroom.analysis.report import write_report
from headroom.analysis.table import MISSING, closing_lines, featured_policy, format_table, verdict
from headroom.analysis.testing import synthetic_run
from headroom.sim.policies import POLICIES


def policy(
    *,
    incremental: float,
    rma: float,
    sbm: float,
    lost: float = 0.0,
    baseline: float = 100_000.0,
    estimate: float = 0.0,
    ci: tuple[float, float] = (0.0, 0.0),
    base_p99: float = 37.0,
    cpu: float = 0.0,
    accelerator: float = 0.0,
    releases: int = 0,
    release_p99: float = 0.0,
    violations: float = 0.0,
) -> dict[str, Any]:
    """One policy's metrics with every field the summary reads (the release-2 ones included)."""
    return {
        "policy": "x",
        "duration_s": 3600.0,
        "complete": True,
        "slo": {
            "p99_ms": 200.0,
            "window_s": 10.0,
            "violation_fraction": violations,
            "worst_window_p99_ms": 120.0,
            "late_window_lines": 0,
            "bad_sketches": 0,
        },
        "requests": {"total": 1000, "errors": 0, "timeouts": 0},
        "value": {
            "total": baseline + incremental,
            "baseline": baseline,
            "incremental": incremental,
            "incremental_rma": rma,
            "incremental_sbm": sbm,
            "incremental_precompute": 0.0,
            "incremental_lost": lost,
            "oracle_incremental": 30_000.0,
            "capture_ratio": incremental / 30_000.0,
            "feasible_bound": 25_000.0,
            "capture_feasible": incremental / 25_000.0,
            "estimated_incremental": estimate,
            "estimated_ci95": list(ci),
            "estimated_by_lever": {
                "rma": {"estimate": rma, "ci95": [rma - 1000.0, rma + 1000.0]},
                "sbm": {"estimate": sbm, "ci95": [sbm - 1000.0, sbm + 1000.0]},
            },
            "estimate_unusable_segments": [],
        },
        "latency": {"all_p99_ms": base_p99 + 10.0, "baseline_only_p99_ms": base_p99},
        "capacity": {
            "offered_unit_s": {"cpu": 100.0, "accelerator": 10.0},
            "used_unit_s": {"cpu": 100.0 * cpu, "accelerator": 10.0 * accelerator},
            "captured_share": {"cpu": cpu, "accelerator": accelerator},
        },
        "reclaims": {
            "count": releases,
            "releases": releases,
            "release_ms_p50": release_p99 / 2,
            "release_ms_p99": release_p99,
            "release_ms_max": release_p99,
        },
        "shedding": {"server_activations": 0, "client_activations": 0},
    }


def document() -> dict[str, Any]:
    return {
        "scenario": "quick",
        "seed": 7,
        "policies": {
            "static": policy(incremental=0.0, rma=0.0, sbm=0.0, base_p99=37.0),
            "greedy": policy(
                incremental=-2_000.0, rma=1_000.0, sbm=-1_000.0, lost=-2_000.0, violations=0.5
            ),
            "headroom": policy(
                incremental=13_830.0,
                rma=11_680.0,
                sbm=2_150.0,
                estimate=14_940.0,
                ci=(3_620.0, 26_270.0),
                base_p99=55.0,
                cpu=0.28,
                accelerator=0.40,
                releases=13,
                release_p99=1.44,
                violations=0.001,
            ),
        },
    }


# --- the checks ----------------------------------------------------------------------------------


def test_every_check_runs_on_every_policy_and_passes_on_a_consistent_document() -> None:
    checks = run_checks(document())
    names = {c.name for c in checks}
    assert names == {
        "complete",
        "levers add up",
        "under the oracle bound",
        "holdout covers truth",
        "every segment estimated",
        "window lines sound",
    }
    assert {c.policy for c in checks} == {"static", "greedy", "headroom"}
    assert failed(checks) == []
    assert checks_notice(checks) == f"checks: all {len(checks)} passed"


def test_lost_value_counts_in_the_lever_sum() -> None:
    doc = document()
    # greedy: 1000 - 1000 - 2000 = -2000: adds up only with the lost part
    assert not any(c.name == "levers add up" for c in failed(run_checks(doc)))
    del doc["policies"]["greedy"]["value"]["incremental_lost"]
    bad = failed(run_checks(doc))
    assert [(c.policy, c.name) for c in bad] == [("greedy", "levers add up")]
    assert "differs from the sum over levers" in bad[0].detail


def test_each_check_fails_on_its_own_defect() -> None:
    doc = document()
    h = doc["policies"]["headroom"]
    h["complete"] = False
    h["value"]["incremental"] = 40_000.0  # past the oracle bound, outside the interval
    h["value"]["estimate_unusable_segments"] = ["premium"]
    h["slo"]["late_window_lines"] = 2
    bad = {c.name for c in failed(run_checks(doc)) if c.policy == "headroom"}
    assert bad == {
        "complete",
        "levers add up",
        "under the oracle bound",
        "holdout covers truth",
        "every segment estimated",
        "window lines sound",
    }
    v = verdict(doc)
    assert v is not None
    assert v.lines()[0].startswith("verdict — headroom (incomplete run): ")
    sentences = consistency_checks(doc)
    assert any(s.startswith("headroom: incomplete run") for s in sentences)
    assert (
        checks_notice(run_checks(doc), "above")
        == f"checks: 6 of {len(run_checks(doc))} failed — see above"
    )


def test_a_check_whose_fields_are_missing_is_left_out_not_passed() -> None:
    doc = document()
    for m in doc["policies"].values():
        del m["complete"]
        del m["value"]["estimate_unusable_segments"]
    names = {c.name for c in run_checks(doc)}
    assert "complete" not in names
    assert "every segment estimated" not in names
    assert run_checks({"policies": {}}) == []
    assert checks_notice([]).startswith("checks: none could be run")


# --- the verdict ---------------------------------------------------------------------------------


def test_the_verdict_gives_the_figures_people_ask_for_against_static() -> None:
    v = verdict(document())
    assert v is not None
    first, second = v.lines()
    assert first.startswith("verdict — headroom: +13.83k value (+13.83% over baseline 100.00k)")
    assert "holdout estimate +14.94k [3.62k, 26.27k]" in first
    assert "used 28.0% of idle CPU, 40.0% of idle accelerator" in first
    assert "baseline-only p99 55.0 ms (static 37.0 ms)" in second
    assert "release p99 1.44 ms over 13 releases" in second
    assert "SLO violations 0.10% of windows (static 0.00%)" in second
    assert second.endswith(f"checks: all {len(run_checks(document()))} passed")


def test_the_verdict_says_no_releases_rather_than_a_p99_of_zero() -> None:
    doc = document()
    doc["policies"]["headroom"]["reclaims"].update(releases=0, release_ms_p99=0.0)
    v = verdict(doc)
    assert v is not None
    assert v.release == "no releases"
    assert "0.00" not in v.release


def test_missing_fields_print_a_dash_never_a_zero() -> None:
    doc = document()
    h = doc["policies"]["headroom"]
    del h["latency"]
    del h["capacity"]["captured_share"]
    del h["reclaims"]["releases"]
    h["value"]["capture_ratio"] = None
    v = verdict(doc)
    assert v is not None
    assert v.capacity == f"used {MISSING} of idle CPU, {MISSING} of idle accelerator"
    assert v.latency == f"baseline-only p99 {MISSING} (static 37.0 ms)"
    assert MISSING in v.release
    text = format_table(doc)
    row = next(line for line in text.splitlines() if line.startswith("headroom "))
    assert f" {MISSING} " in row  # the null capture ratio
    assert not re.search(r"\b0\.000\b", row)


def test_the_verdict_features_headroom_else_the_first_policy_that_is_not_static() -> None:
    doc = document()
    assert featured_policy(doc) == "headroom"
    del doc["policies"]["headroom"]
    assert featured_policy(doc) == "greedy"
    assert (
        featured_policy({"policies": {"static": policy(incremental=0, rma=0, sbm=0)}}) == "static"
    )
    assert featured_policy({"policies": {}}) is None
    assert verdict({"policies": {}}) is None


def test_the_summary_opens_with_the_verdict_and_lists_failed_checks() -> None:
    doc = document()
    doc["policies"]["greedy"]["value"]["incremental"] = 5.0
    text = format_table(doc)
    lines = text.splitlines()
    assert lines[0].startswith("verdict — headroom:")
    assert "checks: 1 of" in lines[1]
    assert "FAILED" in lines[1]
    assert "failed checks (1 of" in text
    assert "  ✗ greedy (levers add up): incremental value 5 differs" in text
    row = next(line for line in lines if line.startswith("greedy "))
    assert "-2.00k" in row  # the lost column


def test_closing_lines_keep_the_path_last_with_the_checks_just_before() -> None:
    doc = document()
    lines = closing_lines(doc, [("events", "e.jsonl"), ("metrics", "m.json"), ("report", "r.html")])
    assert lines[0] == "events: e.jsonl"
    assert lines[-1] == "report: r.html"
    assert lines[-2].startswith("checks: all")
    doc["policies"]["static"]["value"]["estimated_incremental"] = 5_000.0
    doc["policies"]["static"]["value"]["estimated_ci95"] = [1_000.0, 9_000.0]
    lines = closing_lines(doc, [("metrics", "m.json")])
    assert lines[-1] == "metrics: m.json"
    assert re.fullmatch(r"checks: 1 of \d+ failed — see above", lines[-2])


# --- the report ----------------------------------------------------------------------------------


def test_report_opens_with_the_verdict_and_lists_every_check(tmp_path: Path) -> None:
    log = synthetic_run(policies=("static", "headroom"), regions=("r1",), duration_s=300.0)
    path = log.write(tmp_path / "events.jsonl")
    metrics = compute_metrics(log.events)
    page = write_report(metrics, path, tmp_path).read_text(encoding="utf-8")
    assert page.index("id='verdict'") < page.index("Side by side")
    checks = run_checks(metrics)
    assert page.count("<td>passed</td>") + page.count("<td>FAILED</td>") == len(checks)
    assert "id='checks'" in page


def test_report_tolerates_a_document_with_null_and_missing_fields(tmp_path: Path) -> None:
    log = synthetic_run(policies=("static", "headroom"), regions=("r1",), duration_s=300.0)
    path = log.write(tmp_path / "events.jsonl")
    metrics = copy.deepcopy(compute_metrics(log.events))
    for m in metrics["policies"].values():
        m["value"]["capture_ratio"] = None
        m["reclaims"].pop("releases", None)
    page = write_report(metrics, path, tmp_path).read_text(encoding="utf-8")
    assert f"<td>{MISSING}</td>" in page


# --- the plots -----------------------------------------------------------------------------------


def test_every_policy_has_its_own_colour_and_line_style() -> None:
    styles = [policy_style(p, POLICIES) for p in POLICIES]
    assert set(POLICIES) <= set(_POLICY_STYLES)
    assert len({s.colour for s in styles}) == len(POLICIES)
    assert len({str(s.ls) for s in styles}) == len(POLICIES)
    assert len({s.hatch for s in styles}) == len(POLICIES)
    every = [*_POLICY_STYLES.values()]  # envoy and sre-throttle too
    assert len({(s.colour, str(s.ls), s.hatch) for s in every}) == len(every)
    extra = [policy_style(p, ["a", "b"]) for p in ("a", "b")]
    assert extra[0] != extra[1]


def test_one_spike_does_not_set_the_value_scale() -> None:
    top = np.full(200, 50.0)
    bottom = np.zeros(200)
    bottom[100] = -1500.0
    low, high = _robust_limits([(top, bottom)])
    assert low > -100.0
    assert high >= 50.0
    assert _robust_limits([(np.zeros(3), np.zeros(3))]) == (-1.0, 1.0)


@pytest.mark.parametrize("n", [0, 1, 5])
def test_the_release_strip_draws_any_number_of_releases(tmp_path: Path, n: int) -> None:
    from headroom.analysis.plots import plot_release
    from headroom.analysis.report_data import collect

    log = synthetic_run(policies=("static", "headroom"), regions=("r1",), duration_s=300.0)
    data = collect(log.events)
    data.release_ms.clear()
    data.release_ms["headroom"] = [0.0, 1.5, 3000.0, -2.0, 7.0][:n]
    plot_release(data, tmp_path / "r.png")
    assert (tmp_path / "r.png").stat().st_size > 0


def test_the_summary_chart_draws_lost_value_as_its_own_segment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from headroom.analysis import plots
    from headroom.analysis.report_data import collect

    log = synthetic_run(policies=("static", "headroom"), regions=("r1",), duration_s=300.0)
    metrics = copy.deepcopy(compute_metrics(log.events))
    metrics["policies"]["headroom"]["value"]["incremental_lost"] = -123.0
    drawn: list[Any] = []
    real_save = plots._save

    def keep(fig: Any, path: Path) -> None:
        drawn.append(fig)
        real_save(fig, path)

    monkeypatch.setattr(plots, "_save", keep)
    plots.plot_summary(metrics, collect(log.events), tmp_path / "s.png")
    ax = drawn[0].axes[0]
    assert "lost (failed or timed out)" in ax.get_legend_handles_labels()[1]
    lost_bars = [c for c in ax.containers if c.get_label() == "lost (failed or timed out)"]
    assert [round(b.get_height()) for b in lost_bars[0]] == [-123]


def test_value_over_time_carries_the_lost_value_of_window_lines() -> None:
    from headroom.analysis.report_data import collect

    log = synthetic_run(policies=("static", "headroom"), regions=("r1",), duration_s=300.0)
    windows = [e for e in log.events if e["kind"] == "window" and e["policy"] == "headroom"]
    windows[0]["value_lost"] = -7.0
    windows[1]["value_lost"] = -5.0
    data = collect(log.events)
    assert data.value["headroom"].total("lost").sum() == pytest.approx(-12.0)
    assert "lost" not in data.value["static"].sums
