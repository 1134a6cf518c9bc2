"""The scenario argument of every command: a file, else the name of a shipped scenario
(:func:`headroom.kernel.settings.resolve_scenario`)."""

from __future__ import annotations

from pathlib import Path

import pytest

from headroom.cli import main
from headroom.kernel.errors import ConfigError
from headroom.kernel.scenario_load import load_scenario
from headroom.kernel.settings import (
    SCENARIOS_DIR,
    default_scenario_path,
    resolve_scenario,
    shipped_scenarios,
)

REPO = Path(__file__).resolve().parents[2]
SHIPPED = sorted(p.stem for p in (REPO / "scenarios").glob("*.yaml"))


@pytest.fixture
def elsewhere(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty working directory outside the checkout."""
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    return work


def test_the_shipped_names_are_the_scenarios_folder() -> None:
    assert SHIPPED  # the checkout ships scenarios at all
    assert shipped_scenarios() == SHIPPED
    assert "quickstart" in SHIPPED


@pytest.mark.usefixtures("elsewhere")
@pytest.mark.parametrize("name", SHIPPED)
def test_a_shipped_name_resolves_from_any_directory(name: str) -> None:
    for arg in (name, f"{name}.yaml"):
        path = resolve_scenario(arg)
        assert path == SCENARIOS_DIR / f"{name}.yaml"
        assert path.is_file()


@pytest.mark.usefixtures("elsewhere")
def test_csv_traces_of_a_shipped_scenario_resolve_beside_it() -> None:
    uses_csv = [
        name for name in SHIPPED if "csv:" in (REPO / "scenarios" / f"{name}.yaml").read_text()
    ]
    assert uses_csv  # worldcup98 plays traces
    for name in uses_csv:
        scenario = load_scenario(resolve_scenario(name))
        traced = [r for r in scenario.regions if r.traffic.csv is not None]
        assert traced
        for region in traced:
            assert region.traffic.trace  # read from scenarios/traces/ inside the package
            assert (SCENARIOS_DIR / str(region.traffic.csv)).is_file()


def test_an_existing_file_wins_over_a_shipped_name(elsewhere: Path) -> None:
    own = elsewhere / "quickstart.yaml"
    own.write_text("name: mine\n")
    assert resolve_scenario("quickstart.yaml") == Path("quickstart.yaml")
    assert resolve_scenario(str(own)) == own
    # without the suffix there is no such file here: the shipped one
    assert resolve_scenario("quickstart") == SCENARIOS_DIR / "quickstart.yaml"


def test_none_is_the_quickstart() -> None:
    assert resolve_scenario(None) == default_scenario_path()
    assert default_scenario_path() == SCENARIOS_DIR / "quickstart.yaml"


@pytest.mark.usefixtures("elsewhere")
@pytest.mark.parametrize(
    "arg",
    [
        "nope",
        "nope.yaml",
        "scenarios/quickstart.yaml",  # a path that does not exist here is not a name
        "traces/worldcup98-us-east-rps.csv",  # nothing below the shipped folder by path
        "../scenarios/quickstart",
        ".hidden",
        "",
    ],
)
def test_anything_else_is_a_config_error_listing_the_shipped_names(arg: str) -> None:
    with pytest.raises(ConfigError) as info:
        resolve_scenario(arg)
    (problem,) = info.value.problems
    assert problem.startswith(f"{arg}: no such file")
    for name in SHIPPED:
        assert name in problem


def test_a_directory_is_not_a_scenario(elsewhere: Path) -> None:
    (elsewhere / "quickstart").mkdir()  # a folder of that name does not hide the shipped file
    assert resolve_scenario("quickstart") == SCENARIOS_DIR / "quickstart.yaml"
    with pytest.raises(ConfigError, match="not a regular file"):
        resolve_scenario(str(elsewhere))


@pytest.mark.usefixtures("elsewhere")
def test_commands_take_shipped_names(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["scenario", "check", "quickstart"]) == 0
    assert capsys.readouterr().out.startswith("quickstart: OK, scenario 'quickstart'")
    assert main(["scenario", "check", "worldcup98.yaml"]) == 0
    capsys.readouterr()
    assert main(["simulate", "no-such-scenario", "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "no-such-scenario: no such file, nor the name of a shipped scenario" in err
    assert "quickstart" in err
    assert "Traceback" not in err


def test_help_lists_the_shipped_names(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["simulate", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert ", ".join(SHIPPED) in out.replace("- ", "-")
