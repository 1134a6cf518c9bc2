"""tools/trace_to_csv.py on tiny hand-made traces: what it writes is what scenarios load."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def tool() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "trace_to_csv", REPO / "tools" / "trace_to_csv.py"
    )
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["trace_to_csv"] = module
    spec.loader.exec_module(module)
    return module


def rows(path: Path) -> list[list[str]]:
    return [line.split(",") for line in path.read_text().splitlines()]


def test_worldcup_window_is_scaled_to_its_peak_and_sums_duplicate_minutes(
    tool: ModuleType, tmp_path: Path
) -> None:
    src = tmp_path / "wc.csv"
    src.write_text(
        "period,count\n"
        "1998-06-18 00:00:00,10\n"
        "1998-06-18 00:01:00,30\n"
        "1998-06-18 00:01:00,10\n"  # a duplicate minute: summed
        "1998-06-18 00:02:00,20\n"
        "1998-06-18 00:03:00,999\n"  # outside the window
    )
    out = tmp_path / "rps.csv"
    tool.main(
        [
            "worldcup",
            "--source",
            str(src),
            "--start",
            "1998-06-18 00:00",
            "--hours",
            "0.05",
            "--peak-rps",
            "80",
            "--out",
            str(out),
        ]
    )
    assert rows(out) == [["t_s", "rps"], ["0", "20"], ["60", "80"], ["120", "40"]]


def test_google_pool_follows_the_burst_machines(tool: ModuleType, tmp_path: Path) -> None:
    src = tmp_path / "g.csv"
    # Machines 1-4 exist; 1 and 2 are removed together at 100 s (the burst) and 1 returns at
    # 400 s; 3 is removed alone at 1000 s (another burst); 4 never moves.
    src.write_text(
        "#time_us,machine,type,platform,cpu,mem\n"
        "0,1,0,p,0.5,0.5\n0,2,0,p,0.5,0.5\n0,3,0,p,0.5,0.5\n0,4,0,p,0.5,0.5\n"
        "100000000,1,1,p,,\n100000000,2,1,p,,\n400000000,1,0,p,0.5,0.5\n"
        "1000000000,3,1,p,,\n"
    )
    out = tmp_path / "cpu.csv"
    tool.main(
        [
            "google-pool",
            "--source",
            str(src),
            "--start-h",
            "0",
            "--hours",
            "1",
            "--burst-rank",
            "1",
            "--units",
            "8",
            "--out",
            str(out),
        ]
    )
    assert rows(out) == [["t_s", "units"], ["0", "8"], ["100", "0"], ["400", "4"]]


def test_bad_arguments_exit_2(tool: ModuleType, tmp_path: Path) -> None:
    with pytest.raises(SystemExit) as info:
        tool.main(
            [
                "worldcup",
                "--start",
                "yesterday",
                "--peak-rps",
                "1",
                "--out",
                "x",
                "--source",
                str(tmp_path / "none.csv"),
            ]
        )
    assert info.value.code == 2
    with pytest.raises(SystemExit) as info:
        tool.main(["google-pool", "--start-h", "0", "--units", "-1", "--out", "x"])
    assert info.value.code == 2


def test_the_committed_traces_load_as_the_worldcup98_scenario() -> None:
    from headroom.kernel.scenario_load import load_scenario

    s = load_scenario(REPO / "scenarios" / "worldcup98.yaml")
    eu = s.region("eu-west")
    assert eu.traffic.trace is not None
    assert len(eu.traffic.trace) == 1440
    assert max(v for _, v in eu.traffic.trace) == pytest.approx(450)
    assert {p.hardware for p in s.region("us-east").opportunistic} == {"any", "G2", "T4"}
    assert min(v for _, v in eu.opportunistic[0].trace) == 0  # the real 2:03 storm empties it
