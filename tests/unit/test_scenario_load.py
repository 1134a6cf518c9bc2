"""Scenario files: safe loading, every problem with its field path, CSV traces, schema agreement."""

from __future__ import annotations

import math
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from headroom.cli import main
from headroom.kernel.errors import ConfigError
from headroom.kernel.scenario import Control, Scenario
from headroom.kernel.scenario_load import (
    KEYS,
    ScenarioError,
    control_with_flags,
    load_scenario,
    load_scenario_text,
)
from headroom.kernel.scenario_schema import SCHEMA

REPO = Path(__file__).resolve().parents[2]
SCENARIOS = sorted((REPO / "scenarios").glob("*.yaml"))
BENCH_VARIANTS = sorted((REPO / "bench" / "scenarios").glob("*.yaml"))

MINIMAL: dict[str, Any] = {
    "name": "t",
    "seed": 1,
    "duration_s": 3600,
    "slo": {"p99_ms": 200, "window_s": 10},
    "world": {
        "ads": 2000,
        "dim": 16,
        "base_candidates": 100,
        "max_candidates": 300,
        "holdout": 0.02,
    },
    "models": {
        "base": {
            "cpu_ms_per_candidate": 0.1,
            "accelerator_ms_per_candidate": 0.02,
            "hardware": ["gpu-a", "gpu-b"],
        },
        "strong": {
            "cpu_ms_per_candidate": 0.005,
            "accelerator_ms_per_candidate": 0.1,
            "hardware": ["gpu-b"],
            "load_s": 120,
        },
    },
    "segments": [
        {
            "name": "premium",
            "share": 0.3,
            "value": {"mean": 3.0, "sigma": 0.8},
            "base_error": 0.15,
            "strong_error": 0.1,
        },
        {
            "name": "casual",
            "share": 0.7,
            "value": {"mean": 0.6, "sigma": 0.6},
            "base_error": 0.5,
            "strong_error": 0.2,
        },
    ],
    "regions": [
        {
            "name": "us-east",
            "dedicated": {"cpu": 24, "accelerator": 4, "hardware": "gpu-a"},
            "traffic": {"rps": 300, "daily_amplitude": 0.4, "peak_s": 50400},
            "opportunistic": [
                {"resource": "cpu", "hardware": "any", "trace": [[0, 8], [1200, 16]]},
                {
                    "resource": "accelerator",
                    "hardware": "gpu-b",
                    "trace": [[0, 2]],
                    "expires_in_s": 900,
                },
            ],
        },
        {
            "name": "eu-west",
            "dedicated": {"cpu": 20, "accelerator": 4, "hardware": "gpu-a"},
            "traffic": {"rps": 200},
        },
    ],
    "events": [
        {
            "at_s": 1800,
            "kind": "preempt",
            "region": "us-east",
            "resource": "accelerator",
            "hardware": "gpu-b",
            "units": 0,
        },
        {
            "at_s": 2000,
            "kind": "grant",
            "region": "us-east",
            "resource": "accelerator",
            "hardware": "gpu-b",
            "units": 2,
        },
        {"at_s": 2700, "kind": "surge", "region": "eu-west", "factor": 1.6, "duration_s": 300},
        {"at_s": 3000, "kind": "control_outage", "duration_s": 400},
    ],
    "control": {"interval_s": 30, "ttl_s": 120},
}


def doc(**changes: Any) -> dict[str, Any]:
    """A deep copy of MINIMAL with dotted-path changes; a value of DELETE removes the key."""
    out: dict[str, Any] = yaml.safe_load(yaml.safe_dump(MINIMAL))
    for dotted, value in changes.items():
        set_path(out, dotted.replace("__", "."), value)
    return out


DELETE = object()


def set_path(root: Any, dotted: str, value: Any) -> None:
    parts = [int(p) if p.isdigit() else p for p in dotted.split(".")]
    target = root
    for p in parts[:-1]:
        target = target[p]
    if value is DELETE:
        del target[parts[-1]]
    else:
        target[parts[-1]] = value


def problems_of(document: Any, base_dir: Path | None = None) -> list[str]:
    text = document if isinstance(document, str) else yaml.safe_dump(document)
    with pytest.raises(ScenarioError) as info:
        load_scenario_text(text, base_dir)
    assert isinstance(info.value, ConfigError)
    return info.value.problems


def problems_or_none(text: str) -> list[str] | None:
    """None when the text is a valid scenario, else its problems."""
    try:
        load_scenario_text(text)
    except ScenarioError as exc:
        return exc.problems
    return None


def only_problem(document: Any, base_dir: Path | None = None) -> str:
    problems = problems_of(document, base_dir)
    assert len(problems) == 1, problems
    return problems[0]


# ------------------------------------------------------------------------------------------------
# Valid files


@pytest.mark.parametrize("path", SCENARIOS + BENCH_VARIANTS, ids=lambda p: p.name)
def test_every_reference_scenario_loads(path: Path) -> None:
    # the benchmarks' robustness variants (bench/scenarios/) load as well
    scenario = load_scenario(path)
    assert isinstance(scenario, Scenario)
    assert scenario.source == str(path)
    assert math.isclose(sum(s.share for s in scenario.segments), 1.0, abs_tol=1e-6)


def test_minimal_document_becomes_typed_frozen_dataclasses() -> None:
    s = load_scenario_text(yaml.safe_dump(MINIMAL))
    assert s.world.max_candidates == 300
    assert s.models.strong.hardware == ("gpu-b",)
    assert s.regions[0].opportunistic[0].trace == ((0.0, 8.0), (1200.0, 16.0))
    assert s.regions[0].opportunistic[1].expires_in_s == 900
    assert s.regions[1].opportunistic == ()
    assert s.regions[1].traffic.period_s == 86400.0  # default
    assert [e.kind for e in s.events] == ["preempt", "grant", "surge", "control_outage"]
    assert s.events[3].region is None
    assert not s.precompute_enabled
    with pytest.raises(AttributeError):
        s.seed = 3  # type: ignore[misc]


def test_events_are_sorted_by_time_keeping_file_order_for_ties() -> None:
    d = doc()
    d["events"] = [
        {"at_s": 900, "kind": "control_outage", "duration_s": 10},
        {"at_s": 100, "kind": "surge", "region": "us-east", "factor": 2, "duration_s": 5},
        {"at_s": 100, "kind": "surge", "region": "eu-west", "factor": 2, "duration_s": 5},
    ]
    s = load_scenario_text(yaml.safe_dump(d))
    assert [(e.at_s, e.region) for e in s.events] == [
        (100, "us-east"),
        (100, "eu-west"),
        (900, None),
    ]


def test_precompute_fields_are_accepted() -> None:
    d = doc(world__drift_per_h=0.1, world__users=200000)
    d["segments"][0]["return_rate_per_h"] = 2.0
    d["regions"][0]["opportunistic"].append(
        {"resource": "accelerator", "hardware": "gpu-b", "trace": [[0, 6]], "remote": True}
    )
    d["events"].append(
        {
            "at_s": 100,
            "kind": "preempt",
            "region": "us-east",
            "resource": "accelerator",
            "hardware": "gpu-b",
            "units": 1,
            "remote": True,
        }
    )
    s = load_scenario_text(yaml.safe_dump(d))
    assert s.precompute_enabled
    assert s.world.drift_per_h == 0.1
    assert s.world.users == 200000
    assert s.segments[0].return_rate_per_h == 2.0
    assert s.regions[0].opportunistic[2].remote
    assert [e.remote for e in s.events if e.at_s == 100] == [True]


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        ({"world__drift_per_h": -0.1}, "world.drift_per_h: must be >= 0"),
        ({"world__drift_per_h": 1.0}, "world.drift_per_h: must be < 1"),
        ({"world__users": 0}, "world.users: must be >= 1"),
        ({"world__users": 2.5}, "world.users: must be an integer"),
        ({"segments__0__return_rate_per_h": -1}, "segments[0].return_rate_per_h: must be >= 0"),
        (
            {"regions__0__opportunistic__0__remote": "yes please"},
            "regions[0].opportunistic[0].remote: must be true or false",
        ),
    ],
)
def test_precompute_fields_are_validated(change: dict[str, Any], expected: str) -> None:
    assert only_problem(doc(**change)).startswith(expected)


# ------------------------------------------------------------------------------------------------
# One bad field, one line naming it


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        ({"regions__1__traffic__rps": 0}, "regions[1].traffic.rps: must be > 0, got 0"),
        ({"regions__1__traffic__rps": -3}, "regions[1].traffic.rps: must be > 0"),
        (
            {"regions__1__traffic__rps": True},
            "regions[1].traffic.rps: must be a number, got a bool",
        ),
        (
            {"regions__1__traffic__rps": "300"},
            "regions[1].traffic.rps: must be a number, got a str",
        ),
        ({"seed": True}, "seed: must be an integer, got a bool"),
        ({"seed": 1.5}, "seed: must be an integer"),
        ({"seed": -1}, "seed: must be >= 0"),
        ({"duration_s": float("inf")}, "duration_s: must be a finite number"),
        ({"slo__p99_ms": float("nan")}, "slo.p99_ms: must be a finite number"),
        ({"slo__window_s": 0}, "slo.window_s: must be > 0"),
        ({"name": "has space"}, "name: must be 1-64 characters"),
        ({"world__holdout": 0}, "world.holdout: must be > 0"),
        ({"world__holdout": 1}, "world.holdout: must be < 1"),
        ({"world__holdout": 1.5}, "world.holdout: must be < 1"),
        ({"world__base_candidates": 400}, "world.max_candidates: must be >= world.base_candidates"),
        ({"world__max_candidates": 5000}, "world.max_candidates: must be <= world.ads"),
        ({"world__ads": 0}, "world.ads: must be >= 1"),
        (
            {"models__strong__hardware": "gpu-b"},
            "models.strong.hardware: must be a list of accelerator type names",
        ),
        ({"models__strong__hardware": ["gpu-b", 3]}, "models.strong.hardware[1]: must be a string"),
        ({"models__strong__hardware": []}, "models.strong.hardware: must name at least one"),
        (
            {"models__strong__hardware": ["gpu-b", "gpu-b"]},
            "models.strong.hardware[1]: duplicate accelerator type",
        ),
        (
            {"models__base__cpu_ms_per_candidate": -0.1},
            "models.base.cpu_ms_per_candidate: must be >= 0",
        ),
        ({"models__base__load_s": None}, "models.base.load_s: must be a number, got null"),
        ({"segments__0__share": 0.4}, "segments: shares must sum to 1"),
        ({"segments__0__value__mean": 0}, "segments[0].value.mean: must be > 0"),
        ({"segments__1__base_error": -0.5}, "segments[1].base_error: must be >= 0"),
        (
            {"segments__1__name": "premium"},
            "segments[1].name: duplicate segment name 'premium' (also segments[0])",
        ),
        (
            {"regions__1__name": "us-east", "events__2__region": "us-east"},
            "regions[1].name: duplicate region name 'us-east' (also regions[0])",
        ),
        ({"regions__0__dedicated__cpu": -24}, "regions[0].dedicated.cpu: must be > 0"),
        (
            {"regions__0__dedicated__hardware": "gpu-z"},
            "regions[0].dedicated.hardware: 'gpu-z' is not in models.base.hardware",
        ),
        (
            {"regions__0__traffic__daily_amplitude": 1.5},
            "regions[0].traffic.daily_amplitude: must be <= 1",
        ),
        (
            {"regions__0__opportunistic__0__trace": [[0, -8]]},
            "regions[0].opportunistic[0].trace[0][1]: must be >= 0",
        ),
        (
            {"regions__0__opportunistic__0__trace": [[0, 8], [600, float("nan")]]},
            "regions[0].opportunistic[0].trace[1][1]: must be a finite number",
        ),
        (
            {"regions__0__opportunistic__0__trace": [[0, 8], [1200, 16], [600, 4]]},
            "regions[0].opportunistic[0].trace[2][0]: t_s 600 is not after the previous point's "
            "1200",
        ),
        (
            {"regions__0__opportunistic__0__trace": [[0, 8], [0, 4]]},
            "regions[0].opportunistic[0].trace[1][0]: t_s 0 is not after",
        ),
        (
            {"regions__0__opportunistic__0__trace": []},
            "regions[0].opportunistic[0].trace: must have at least one point",
        ),
        (
            {"regions__0__opportunistic__0__trace": [[0, 8, 9]]},
            "regions[0].opportunistic[0].trace[0]: must be a [t_s, units] pair",
        ),
        (
            {"regions__0__opportunistic__0__resource": "gpu"},
            "regions[0].opportunistic[0].resource: unknown value 'gpu'; must be one of cpu, "
            "accelerator",
        ),
        (
            {"regions__0__opportunistic__0__hardware": "gpu-b"},
            "regions[0].opportunistic[0].hardware: must be 'any' for cpu capacity",
        ),
        (
            {"regions__0__opportunistic__1__hardware": "any"},
            "regions[0].opportunistic[1].hardware: must name the accelerator type",
        ),
        (
            {"regions__0__opportunistic__1__expires_in_s": 0},
            "regions[0].opportunistic[1].expires_in_s: must be > 0",
        ),
        (
            {"events__2__kind": "earthquake"},
            "events[2].kind: unknown value 'earthquake'; must be one of preempt, grant, surge, "
            "control_outage",
        ),
        ({"events__2__region": "mars"}, "events[2].region: unknown region 'mars'"),
        ({"events__0__resource": "disk"}, "events[0].resource: unknown value 'disk'"),
        ({"events__0__units": -1}, "events[0].units: must be >= 0"),
        ({"events__2__factor": 0}, "events[2].factor: must be > 0"),
        ({"events__3__duration_s": 0}, "events[3].duration_s: must be > 0"),
        ({"events__3__at_s": 7200}, "events[3].at_s: 7200 is after the end of the run"),
        ({"events__2__duration_s": DELETE}, "events[2].duration_s: required for a surge event"),
        ({"events__0__units": DELETE}, "events[0].units: required for a preempt event"),
        ({"events__3__units": 4}, "events[3].units: not allowed for a control_outage event"),
        (
            {"events__0__hardware": "gpu-a"},
            "events[0]: region 'us-east' has no opportunistic accelerator/gpu-a pool to preempt",
        ),
        (
            {"events__1__remote": True},
            "events[1]: region 'us-east' has no opportunistic accelerator/gpu-b (remote) pool",
        ),
    ],
)
def test_one_bad_field_gives_one_line_naming_its_path(
    change: dict[str, Any], expected: str
) -> None:
    problem = only_problem(doc(**change))
    assert problem.startswith(expected), problem


@pytest.mark.parametrize(
    ("where", "key", "path"),
    [
        ("", "sede", "sede"),
        ("world", "adds", "world.adds"),
        ("regions.0.traffic", "rsp", "regions[0].traffic.rsp"),
        ("regions.0.opportunistic.1", "expiry", "regions[0].opportunistic[1].expiry"),
        ("events.2", "multiplier", "events[2].multiplier"),
        ("segments.0.value", "median", "segments[0].value.median"),
        ("models.base", "gpu", "models.base.gpu"),
    ],
)
def test_unknown_fields_are_rejected_by_name(where: str, key: str, path: str) -> None:
    d = doc()
    target: Any = d
    for part in filter(None, where.split(".")):
        target = target[int(part) if part.isdigit() else part]
    target[key] = 1
    assert only_problem(d).startswith(f"{path}: unknown field")


def test_unknown_field_suggests_the_close_known_name() -> None:
    d = doc()
    d["regions"][0]["traffic"]["rsp"] = 3
    assert "did you mean 'rps'" in " ".join(problems_of(d))


@pytest.mark.parametrize(
    ("missing", "path"),
    [
        ("seed", "seed"),
        ("slo", "slo"),
        ("world.holdout", "world.holdout"),
        ("models.strong.hardware", "models.strong.hardware"),
        ("segments.1.strong_error", "segments[1].strong_error"),
        ("regions.0.dedicated", "regions[0].dedicated"),
        ("regions.1.dedicated.hardware", "regions[1].dedicated.hardware"),
        ("regions.0.opportunistic.0.resource", "regions[0].opportunistic[0].resource"),
        ("events.0.at_s", "events[0].at_s"),
    ],
)
def test_missing_required_fields_are_named(missing: str, path: str) -> None:
    d = doc()
    set_path(d, missing, DELETE)
    assert f"{path}: required field is missing" in problems_of(d)


def test_traffic_needs_exactly_one_source() -> None:
    d = doc()
    d["regions"][1]["traffic"] = {"noise": 0.1}
    assert only_problem(d).startswith("regions[1].traffic: needs exactly one of rps")
    d["regions"][1]["traffic"] = {"rps": 10, "trace": [[0, 10]]}
    assert only_problem(d).endswith("got rps, trace")


def test_daily_cycle_fields_do_not_apply_to_a_trace() -> None:
    d = doc()
    d["regions"][1]["traffic"] = {"trace": [[0, 10], [60, 20]], "daily_amplitude": 0.3}
    assert only_problem(d).startswith(
        "regions[1].traffic.daily_amplitude: applies only to a synthetic rate"
    )


def test_opportunistic_needs_exactly_one_trace_source() -> None:
    d = doc()
    del d["regions"][0]["opportunistic"][0]["trace"]
    assert only_problem(d).startswith("regions[0].opportunistic[0]: needs exactly one of")


def test_duplicate_pools_in_a_region_are_rejected() -> None:
    d = doc()
    d["regions"][0]["opportunistic"].append(
        {"resource": "cpu", "hardware": "any", "trace": [[0, 1]]}
    )
    assert only_problem(d).startswith("regions[0].opportunistic[2]: duplicate pool cpu/any")


def test_every_problem_is_reported_not_just_the_first() -> None:
    d = doc(seed="x", world__holdout=2, regions__1__traffic__rps=-1, events__2__region="nowhere")
    d["segments"][0]["colour"] = "red"
    problems = problems_of(d)
    paths = [p.split(":")[0] for p in problems]
    assert paths == [
        "seed",
        "world.holdout",
        "segments[0].colour",
        "regions[1].traffic.rps",
        "events[2].region",
    ]


def test_an_event_in_an_invalid_region_still_gets_its_region_checked() -> None:
    d = doc(regions__0__traffic__rps=-1, events__2__region="nowhere")
    problems = problems_of(d)
    assert any(p.startswith("events[2].region: unknown region 'nowhere'") for p in problems)


# ------------------------------------------------------------------------------------------------
# Whole-file problems


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("", "file is empty"),
        ("   \n\n", "file is empty"),
        ("# only a comment\n", "file is empty"),
        ("just a string", "the top level must be a mapping of scenario fields, got a string"),
        ("- 1\n- 2\n", "the top level must be a mapping of scenario fields, got a list"),
        ("42", "the top level must be a mapping of scenario fields, got an integer"),
        ("name: [unclosed\n", "line 2, column 1: not valid scenario YAML"),
        ("a: 1\n  b: 2\n", "not valid scenario YAML"),
        ("\tname: x\n", "not valid scenario YAML"),
    ],
)
def test_whole_file_problems_are_one_line(text: str, expected: str) -> None:
    problem = only_problem(text)
    assert expected in problem, problem


def test_python_tags_are_rejected_and_never_executed(tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    text = f"name: !!python/object/apply:os.system ['touch {marker}']\n"
    problem = only_problem(text)
    assert "YAML tag" in problem
    assert "python/object/apply:os.system" in problem
    assert "not allowed" in problem
    assert not marker.exists()


def test_custom_tags_are_rejected() -> None:
    assert "YAML tag !secret is not allowed" in only_problem("seed: !secret 3\n")


def test_duplicate_keys_are_rejected_rather_than_silently_overwritten() -> None:
    text = yaml.safe_dump(MINIMAL) + "seed: 99\n"
    problem = only_problem(text)
    assert "duplicate key 'seed'" in problem


def test_alias_bombs_are_refused() -> None:
    text = "a: &a [1, 2]\nb: [" + ", ".join(["*a"] * 10_001) + "]\n"
    problem = only_problem(text)
    assert "more than" in problem
    assert "aliases" in problem


def test_non_yaml_binary_file_is_one_problem(tmp_path: Path) -> None:
    f = tmp_path / "image.yaml"
    f.write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00\xff\xfe")
    with pytest.raises(ScenarioError) as info:
        load_scenario(f)
    assert info.value.problems == [f"{f}: not a YAML text file (not UTF-8 at byte 0)"]


def test_missing_file_and_directory(tmp_path: Path) -> None:
    with pytest.raises(ScenarioError) as info:
        load_scenario(tmp_path / "nope.yaml")
    assert info.value.problems == [f"{tmp_path / 'nope.yaml'}: no such file"]
    with pytest.raises(ScenarioError) as info:
        load_scenario(tmp_path)
    assert info.value.problems == [f"{tmp_path}: not a regular file"]


def test_problems_from_a_file_are_prefixed_with_its_path(tmp_path: Path) -> None:
    f = tmp_path / "s.yaml"
    f.write_text(yaml.safe_dump(doc(seed=-1)))
    with pytest.raises(ScenarioError) as info:
        load_scenario(f)
    assert info.value.problems == [f"{f}: seed: must be >= 0, got -1"]
    assert info.value.field_problems == ["seed: must be >= 0, got -1"]


# ------------------------------------------------------------------------------------------------
# CSV traces


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def csv_doc(traffic_csv: str | None = None, cpu_csv: str | None = None) -> dict[str, Any]:
    d = doc()
    if traffic_csv is not None:
        d["regions"][1]["traffic"] = {"csv": traffic_csv}
    if cpu_csv is not None:
        d["regions"][0]["opportunistic"][0] = {"resource": "cpu", "hardware": "any", "csv": cpu_csv}
    return d


def test_csv_traces_resolve_relative_to_the_scenario_file(tmp_path: Path) -> None:
    write(tmp_path / "traces" / "rps.csv", "t_s,rps\n0,100\n60,150.5\n\n120,90\n")
    write(tmp_path / "traces" / "cpu.csv", "# from a recording\nt_s,units\n0,4\n600,0\n")
    scenario_file = write(
        tmp_path / "s.yaml", yaml.safe_dump(csv_doc("traces/rps.csv", "traces/cpu.csv"))
    )
    s = load_scenario(scenario_file)
    assert s.regions[1].traffic.trace == ((0.0, 100.0), (60.0, 150.5), (120.0, 90.0))
    assert s.regions[1].traffic.csv == "traces/rps.csv"
    assert s.regions[1].traffic.rps is None
    assert s.regions[0].opportunistic[0].trace == ((0.0, 4.0), (600.0, 0.0))


def test_csv_absolute_path_is_used_as_is(tmp_path: Path) -> None:
    f = write(tmp_path / "elsewhere" / "rps.csv", "t_s,rps\n0,5\n")
    s = load_scenario_text(yaml.safe_dump(csv_doc(str(f))), base_dir=tmp_path / "other")
    assert s.regions[1].traffic.trace == ((0.0, 5.0),)


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        (None, "regions[1].traffic.csv: rps.csv: file not found"),
        ("", "regions[1].traffic.csv: rps.csv: empty"),
        ("t_s,rps\n", "regions[1].traffic.csv: rps.csv: has a header but no rows"),
        ("time,rate\n0,1\n", "regions[1].traffic.csv: rps.csv line 1: header must be t_s,rps"),
        ("t_s,rps\n0,1\n60\n", "regions[1].traffic.csv: rps.csv line 3: expected 2 columns"),
        ("t_s,rps\n0,1\n60,abc\n", "regions[1].traffic.csv: rps.csv line 3: not numbers"),
        ("t_s,rps\n0,1\n60,nan\n", "regions[1].traffic.csv: rps.csv line 3: values must be finite"),
        ("t_s,rps\n0,1\n60,inf\n", "regions[1].traffic.csv: rps.csv line 3: values must be finite"),
        ("t_s,rps\n0,1\n60,-2\n", "regions[1].traffic.csv: rps.csv line 3: rps must be >= 0"),
        ("t_s,rps\n-5,1\n", "regions[1].traffic.csv: rps.csv line 2: t_s must be >= 0"),
        (
            "t_s,rps\n0,1\n60,2\n30,2\n",
            "regions[1].traffic.csv: rps.csv line 4: t_s 30 is not after the previous point's 60",
        ),
        ("t_s,rps\n0,0\n60,0\n", "regions[1].traffic.csv: every rate is 0"),
    ],
)
def test_bad_csv_traces_name_the_field_the_file_and_the_line(
    tmp_path: Path, content: str | None, expected: str
) -> None:
    if content is not None:
        write(tmp_path / "rps.csv", content)
    problem = only_problem(csv_doc("rps.csv"), tmp_path)
    assert problem.startswith(expected), problem


def test_non_utf8_csv_is_one_problem(tmp_path: Path) -> None:
    (tmp_path / "cpu.csv").write_bytes(b"t_s,units\n0,\xff\xfe\n")
    problem = only_problem(csv_doc(cpu_csv="cpu.csv"), tmp_path)
    assert problem.startswith("regions[0].opportunistic[0].csv: cpu.csv: not a UTF-8 CSV file")


def test_csv_directory_is_not_a_file(tmp_path: Path) -> None:
    (tmp_path / "cpu.csv").mkdir()
    problem = only_problem(csv_doc(cpu_csv="cpu.csv"), tmp_path)
    assert problem == "regions[0].opportunistic[0].csv: cpu.csv: not a regular file"


def test_control_characters_in_keys_and_cells_stay_on_one_line(tmp_path: Path) -> None:
    write(tmp_path / "cpu.csv", 't_s,units\n0,"4\n5"\n')
    d = csv_doc(cpu_csv="cpu.csv")
    d["slo"]["p99\nms"] = 1
    problems = problems_of(d, tmp_path)
    assert len(problems) == 2
    assert all("\n" not in p for p in problems)
    assert problems[0].startswith("slo.p99\\nms: unknown field")
    assert problems[1].startswith("regions[0].opportunistic[0].csv: cpu.csv line 3: not numbers")


def test_many_bad_csv_rows_are_summarised(tmp_path: Path) -> None:
    write(tmp_path / "cpu.csv", "t_s,units\n" + "".join(f"{i},x\n" for i in range(20)))
    problems = problems_of(csv_doc(cpu_csv="cpu.csv"), tmp_path)
    assert len(problems) == 6
    assert problems[-1] == "regions[0].opportunistic[0].csv: cpu.csv: 15 more bad rows not listed"


@settings(max_examples=40, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.floats(min_value=0, max_value=1e6, allow_nan=False),
            st.floats(min_value=0, max_value=1e4, allow_nan=False),
        ),
        min_size=1,
        max_size=30,
        unique_by=lambda p: p[0],
    )
)
def test_inline_and_csv_traces_give_the_same_points(points: list[tuple[float, float]]) -> None:
    import tempfile

    points = sorted(points)
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp)
        write(base / "cpu.csv", "t_s,units\n" + "".join(f"{t!r},{v!r}\n" for t, v in points))
        from_csv = load_scenario_text(yaml.safe_dump(csv_doc(cpu_csv="cpu.csv")), base)
    d = doc()
    d["regions"][0]["opportunistic"][0]["trace"] = [list(p) for p in points]
    inline = load_scenario_text(yaml.safe_dump(d))
    assert from_csv.regions[0].opportunistic[0].trace == inline.regions[0].opportunistic[0].trace
    assert inline.regions[0].opportunistic[0].trace == tuple(points)


def _nested(children: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.one_of(
        st.lists(children, max_size=4), st.dictionaries(st.text(max_size=8), children, max_size=4)
    )


@settings(max_examples=60, deadline=None)
@given(
    st.recursive(
        st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
        _nested,
        max_leaves=20,
    )
)
def test_arbitrary_documents_never_raise_anything_but_a_scenario_error(value: Any) -> None:
    problems = problems_or_none(yaml.safe_dump(value))
    assert problems is None or problems
    assert all(isinstance(p, str) and "\n" not in p for p in problems or [])


@settings(max_examples=60, deadline=None)
@given(st.sampled_from(sorted(KEYS)), st.data())
def test_random_corruption_of_a_valid_file_is_reported_never_raised(
    section: str, data: st.DataObject
) -> None:
    d = doc()
    # Replace a random leaf with a random scalar: the loader either accepts or explains.
    leaves: list[str] = []

    def walk(node: Any, path: str) -> None:
        if isinstance(node, dict):
            for k, v in node.items():
                walk(v, f"{path}.{k}" if path else k)
        elif isinstance(node, list):
            for i, v in enumerate(node):
                walk(v, f"{path}.{i}")
        else:
            leaves.append(path)

    walk(d, "")
    target = data.draw(st.sampled_from(leaves))
    value = data.draw(st.none() | st.booleans() | st.integers(-5, 5) | st.floats() | st.text())
    set_path(d, target, value)
    problems = problems_or_none(yaml.safe_dump(d)) or []
    assert all(re.match(r"^[\w\[\].]+: ", p) for p in problems), problems


# ------------------------------------------------------------------------------------------------
# The control section


def test_the_control_section_is_read_and_its_ttl_defaults_to_three_intervals() -> None:
    sc = load_scenario_text(yaml.safe_dump(doc()))
    assert sc.control == Control(interval_s=30.0, ttl_s=120.0)
    assert sc.control.target_ttl_s == 120.0
    sc = load_scenario_text(yaml.safe_dump(doc(control__ttl_s=DELETE)))
    assert sc.control == Control(interval_s=30.0)
    assert sc.control.target_ttl_s == 90.0


@pytest.mark.parametrize("absent", [DELETE, None, {}])
def test_an_absent_control_section_means_a_minute_and_three_minutes(absent: Any) -> None:
    sc = load_scenario_text(yaml.safe_dump(doc(control=absent)))
    assert sc.control == Control()
    assert (sc.control.interval_s, sc.control.target_ttl_s) == (60.0, 180.0)


@pytest.mark.parametrize(
    ("change", "problem"),
    [
        (
            {"control__ttl_s": 20},
            "control.ttl_s: must be >= control.interval_s (30): a target must live until the "
            "next one arrives, got 20",
        ),
        ({"control__interval_s": 0}, "control.interval_s: must be > 0, got 0"),
        ({"control__interval_s": True}, "control.interval_s: must be a number, got a bool (true)"),
        ({"control__interval_s": math.inf}, "control.interval_s: must be a finite number"),
        ({"control__ttl_s": -1}, "control.ttl_s: must be > 0, got -1"),
        ({"control__interval": 5}, "control.interval: unknown field (did you mean 'interval_s'?)"),
        ({"control": 5}, "control: must be a mapping, got an integer (5)"),
        (
            {"control__interval_s": 5},
            "control.interval_s: must be >= slo.window_s (10): the control plane judges p99 per "
            "SLO window, and a step shorter than one sees no new window, got 5",
        ),
        (
            {"control": DELETE, "slo__window_s": 120},
            "control.interval_s: the default (60) is shorter than slo.window_s (120)",
        ),
    ],
)
def test_control_problems_name_the_field(change: dict[str, Any], problem: str) -> None:
    problems = problems_of(doc(**change))
    assert any(p.startswith(problem) for p in problems), problems


def test_control_flags_override_the_file_and_name_the_flag_at_fault() -> None:
    file = Control(interval_s=30.0)
    assert control_with_flags(file) == file
    assert control_with_flags(file, 5.0) == Control(interval_s=5.0)
    assert control_with_flags(file, 5.0).target_ttl_s == 15.0
    assert control_with_flags(file, None, 40.0) == Control(interval_s=30.0, ttl_s=40.0)
    explicit = Control(interval_s=30.0, ttl_s=90.0)
    assert control_with_flags(explicit, 60.0).target_ttl_s == 90.0
    with pytest.raises(ConfigError, match=r"^--interval: must be <= the scenario's control.ttl_s"):
        control_with_flags(explicit, 120.0)
    with pytest.raises(ConfigError, match=r"^--ttl: must be >= the control interval \(30 s\)"):
        control_with_flags(file, None, 10.0)
    with pytest.raises(ConfigError, match=r"^--interval: must be >= the scenario's slo.window_s"):
        control_with_flags(file, 5.0, window_s=10.0)
    assert control_with_flags(file, 10.0, window_s=10.0).interval_s == 10.0
    for bad in (0.0, -1.0, math.nan, math.inf):
        with pytest.raises(ConfigError, match=r"^--interval: must be a finite number > 0"):
            control_with_flags(file, bad)
        with pytest.raises(ConfigError, match=r"^--ttl: must be a finite number > 0"):
            control_with_flags(file, None, bad)


def test_the_control_plane_config_takes_the_scenarios_clock() -> None:
    from headroom.controllers.config import ControlConfig

    sc = load_scenario_text(yaml.safe_dump(doc()))
    cfg = ControlConfig.from_scenario(sc)
    assert (cfg.interval_s, cfg.ttl_s, cfg.allocator.value_stale_s) == (30.0, 120.0, 90.0)
    cfg = ControlConfig.from_scenario(sc, interval_s=10.0, ttl_s=25.0)
    assert (cfg.interval_s, cfg.ttl_s, cfg.allocator.value_stale_s) == (10.0, 25.0, 30.0)
    bare = load_scenario_text(yaml.safe_dump(doc(control=DELETE)))
    cfg = ControlConfig.from_scenario(bare)
    assert (cfg.interval_s, cfg.ttl_s, cfg.allocator.value_stale_s) == (60.0, 180.0, 180.0)
    cfg = ControlConfig.from_scenario(bare, interval_s=4.0)
    assert (cfg.interval_s, cfg.ttl_s) == (4.0, 12.0)


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--interval", "0"], "headroom: --interval: must be > 0, got 0.0"),
        (["--interval", "nan"], "headroom: --interval: must be a finite number, got nan"),
        (["--ttl", "10"], "headroom: --ttl: must be >= the control interval (30 s), got 10"),
        (["--interval", "200"], "headroom: --interval: must be <= the scenario's control.ttl_s"),
        (["--interval", "5"], "headroom: --interval: must be >= the scenario's slo.window_s"),
    ],
)
def test_simulate_refuses_bad_control_flags_with_exit_2(
    flags: list[str], message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    f = tmp_path / "s.yaml"
    f.write_text(yaml.safe_dump(doc()))
    code = main(["simulate", str(f), "--policy", "static", "--out", str(tmp_path / "o"), *flags])
    assert code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err
    assert err[-1].startswith(message), err


# ------------------------------------------------------------------------------------------------
# The schema


def schema_problems(schema: Any, value: Any, path: str = "$") -> list[str]:
    """A small JSON Schema (2020-12) validator for the keywords our schema uses."""
    if schema is True:
        return []
    if schema is False:
        return [f"{path}: not allowed"]
    if "type" in schema:
        types = schema["type"] if isinstance(schema["type"], list) else [schema["type"]]
        if not any(_is_type(value, t) for t in types):
            return [f"{path}: {value!r} is not {types}"]
    out = _scalar_problems(schema, value, path)
    if isinstance(value, dict):
        out += _object_problems(schema, value, path)
    if isinstance(value, list):
        out += _array_problems(schema, value, path)
    return out + _applicator_problems(schema, value, path)


def _scalar_problems(schema: Any, value: Any, path: str) -> list[str]:
    """const, enum, the numeric bounds and the string keywords."""
    out: list[str] = []
    if "const" in schema and value != schema["const"]:
        out.append(f"{path}: not {schema['const']!r}")
    if "enum" in schema and value not in schema["enum"]:
        out.append(f"{path}: {value!r} not in {schema['enum']}")
    if isinstance(value, int | float) and not isinstance(value, bool):
        for key, ok in (
            ("minimum", lambda b: value >= b),
            ("maximum", lambda b: value <= b),
            ("exclusiveMinimum", lambda b: value > b),
            ("exclusiveMaximum", lambda b: value < b),
        ):
            if key in schema and not ok(schema[key]):
                out.append(f"{path}: {value} violates {key} {schema[key]}")
    if isinstance(value, str):
        if "pattern" in schema and not re.search(schema["pattern"], value):
            out.append(f"{path}: does not match {schema['pattern']}")
        if len(value) < schema.get("minLength", 0):
            out.append(f"{path}: too short")
    return out


def _object_problems(schema: Any, value: dict[Any, Any], path: str) -> list[str]:
    """required, properties and additionalProperties: false."""
    out: list[str] = []
    props = schema.get("properties", {})
    for key in schema.get("required", []):
        if key not in value:
            out.append(f"{path}.{key}: required")
    for key, v in value.items():
        if key in props:
            out += schema_problems(props[key], v, f"{path}.{key}")
        elif schema.get("additionalProperties") is False:
            out.append(f"{path}.{key}: additional property")
    return out


def _array_problems(schema: Any, value: list[Any], path: str) -> list[str]:
    """prefixItems, items, minItems and uniqueItems."""
    out: list[str] = []
    prefix = schema.get("prefixItems", [])
    for i, v in enumerate(value):
        sub = prefix[i] if i < len(prefix) else schema.get("items", True)
        out += schema_problems(sub, v, f"{path}[{i}]")
    if len(value) < schema.get("minItems", 0):
        out.append(f"{path}: fewer than {schema['minItems']} items")
    if schema.get("uniqueItems") and len({repr(v) for v in value}) != len(value):
        out.append(f"{path}: items not unique")
    return out


def _applicator_problems(schema: Any, value: Any, path: str) -> list[str]:
    """allOf, anyOf, oneOf, not and if/then/else."""
    out: list[str] = []
    for sub in schema.get("allOf", []):
        out += schema_problems(sub, value, path)
    if "anyOf" in schema and not any(not schema_problems(s, value, path) for s in schema["anyOf"]):
        out.append(f"{path}: matches none of anyOf")
    if "oneOf" in schema:
        matches = sum(not schema_problems(s, value, path) for s in schema["oneOf"])
        if matches != 1:
            out.append(f"{path}: matches {matches} of oneOf")
    if "not" in schema and not schema_problems(schema["not"], value, path):
        out.append(f"{path}: matches a forbidden schema")
    if "if" in schema:
        branch = "then" if not schema_problems(schema["if"], value, path) else "else"
        if branch in schema:
            out += schema_problems(schema[branch], value, path)
    return out


def _is_type(value: Any, t: str) -> bool:
    return {
        "object": isinstance(value, dict),
        "array": isinstance(value, list),
        "string": isinstance(value, str),
        "boolean": isinstance(value, bool),
        "null": value is None,
        "integer": isinstance(value, int) and not isinstance(value, bool),
        "number": isinstance(value, int | float) and not isinstance(value, bool),
    }[t]


def test_schema_declares_draft_2020_12() -> None:
    assert SCHEMA["$schema"] == "https://json-schema.org/draft/2020-12/schema"


@pytest.mark.parametrize("path", SCENARIOS, ids=lambda p: p.name)
def test_every_reference_scenario_validates_against_the_schema(path: Path) -> None:
    assert schema_problems(SCHEMA, yaml.safe_load(path.read_text())) == []


def test_minimal_and_precompute_documents_validate_against_the_schema() -> None:
    assert schema_problems(SCHEMA, doc()) == []
    d = doc(world__drift_per_h=0.1, world__users=10)
    d["regions"][0]["opportunistic"].append(
        {"resource": "accelerator", "hardware": "gpu-b", "trace": [[0, 6]], "remote": True}
    )
    assert schema_problems(SCHEMA, d) == []


@pytest.mark.parametrize(
    "change",
    [
        {"seed": True},
        {"world__holdout": 1},
        {"world__ads": 1.5},
        {"regions__1__traffic__rps": 0},
        {"regions__0__opportunistic__0__resource": "gpu"},
        {"regions__0__opportunistic__0__hardware": "gpu-b"},
        {"events__2__kind": "earthquake"},
        {"events__2__duration_s": DELETE},
        {"events__3__units": 3},
        {"models__strong__hardware": "gpu-b"},
        {"segments__0__share": 0},
        {"name": "has space"},
    ],
)
def test_schema_rejects_what_the_loader_rejects(change: dict[str, Any]) -> None:
    d = doc(**change)
    assert schema_problems(SCHEMA, d)
    assert problems_of(d)


def test_schema_rejects_unknown_fields_like_the_loader() -> None:
    d = doc()
    d["regions"][0]["traffic"]["rsp"] = 1
    assert schema_problems(SCHEMA, d)


SECTION_SCHEMAS: dict[str, Any] = {
    "scenario": SCHEMA,
    "slo": SCHEMA["properties"]["slo"],
    "world": SCHEMA["properties"]["world"],
    "models": SCHEMA["properties"]["models"],
    "model": SCHEMA["properties"]["models"]["properties"]["base"],
    "segment": SCHEMA["properties"]["segments"]["items"],
    "value": SCHEMA["properties"]["segments"]["items"]["properties"]["value"],
    "region": SCHEMA["properties"]["regions"]["items"],
    "dedicated": SCHEMA["properties"]["regions"]["items"]["properties"]["dedicated"],
    "traffic": SCHEMA["properties"]["regions"]["items"]["properties"]["traffic"],
    "opportunistic": SCHEMA["properties"]["regions"]["items"]["properties"]["opportunistic"][
        "items"
    ],
    "event": SCHEMA["properties"]["events"]["items"],
    "control": SCHEMA["properties"]["control"],
}


@pytest.mark.parametrize("section", sorted(KEYS))
def test_schema_and_loader_agree_on_field_names_and_required_fields(section: str) -> None:
    required, optional = KEYS[section]
    schema = SECTION_SCHEMAS[section]
    assert set(schema["properties"]) == required | optional
    assert set(schema["required"]) == required
    assert schema["additionalProperties"] is False


def test_every_schema_field_has_a_description() -> None:
    missing: list[str] = []

    def walk(node: Any, path: str) -> None:
        if isinstance(node, dict):
            for name, sub in node.get("properties", {}).items():
                if "description" not in sub:
                    missing.append(f"{path}.{name}")
                walk(sub, f"{path}.{name}")
            if isinstance(node.get("items"), dict):
                walk(node["items"], f"{path}[]")

    walk(SCHEMA, "$")
    assert missing == []


def test_dataclass_fields_cover_every_loader_key() -> None:
    import dataclasses

    from headroom.kernel import scenario as sc

    classes = {
        "scenario": sc.Scenario,
        "slo": sc.Slo,
        "world": sc.World,
        "models": sc.Models,
        "model": sc.ModelSpec,
        "segment": sc.Segment,
        "value": sc.ValueDist,
        "region": sc.Region,
        "dedicated": sc.Dedicated,
        "traffic": sc.Traffic,
        "opportunistic": sc.Opportunistic,
        "event": sc.ScenarioEvent,
        "control": sc.Control,
    }
    for section, cls in classes.items():
        names = {f.name for f in dataclasses.fields(cls)}
        required, optional = KEYS[section]
        assert required | optional <= names, (section, (required | optional) - names)


# ------------------------------------------------------------------------------------------------
# The commands


def test_scenario_check_prints_one_ok_line(capsys: pytest.CaptureFixture[str]) -> None:
    path = REPO / "scenarios" / "quickstart.yaml"
    assert main(["scenario", "check", str(path)]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    assert len(out) == 1
    assert out[0].startswith(f"{path}: OK, scenario 'quickstart'")


def test_scenario_check_exits_2_with_one_line_per_problem(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    f = tmp_path / "bad.yaml"
    f.write_text(yaml.safe_dump(doc(seed=True, regions__1__traffic__rps=0)))
    assert main(["scenario", "check", str(f)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        f"headroom: {f}: seed: must be an integer, got a bool (true)",
        f"headroom: {f}: regions[1].traffic.rps: must be > 0, got 0",
    ]


def test_scenario_check_on_a_yaml_tag_exits_2_without_traceback(tmp_path: Path) -> None:
    f = tmp_path / "evil.yaml"
    f.write_text("!!python/object/apply:os.system ['echo hacked']\n")
    proc = subprocess.run(
        [sys.executable, "-m", "headroom.cli", "scenario", "check", str(f)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 2
    assert "hacked" not in proc.stdout
    assert "Traceback" not in proc.stderr
    assert "YAML tag" in proc.stderr


def test_scenario_schema_prints_the_schema_as_json(capsys: pytest.CaptureFixture[str]) -> None:
    import json

    assert main(["scenario", "schema"]) == 0
    assert json.loads(capsys.readouterr().out) == SCHEMA


@pytest.mark.parametrize("path", SCENARIOS, ids=lambda p: p.name)
def test_reference_scenarios_run_the_baseline_at_60_to_85_percent_at_peak(path: Path) -> None:
    from headroom.commands.scenario import baseline_peak_utilisation

    for region, (cpu, acc) in baseline_peak_utilisation(load_scenario(path)).items():
        assert 0.60 <= cpu <= 0.85, (region, cpu)
        assert 0.60 <= acc <= 0.85, (region, acc)


def test_peak_utilisation_uses_the_trace_maximum_for_trace_traffic() -> None:
    from headroom.commands.scenario import baseline_peak_utilisation

    d = doc()
    d["regions"][1]["traffic"] = {"trace": [[0, 100], [600, 300], [1200, 50]]}
    util = baseline_peak_utilisation(load_scenario_text(yaml.safe_dump(d)))
    # 300 rps × 100 candidates × 0.1 ms = 3 cores of 20; × 0.02 ms = 0.6 devices of 4.
    assert util["eu-west"] == pytest.approx((0.15, 0.15))
    assert util["us-east"] == pytest.approx((420 * 100 * 0.1 / 1000 / 24, 420 * 2 / 1000 / 4))
