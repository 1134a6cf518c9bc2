"""The command line's arguments: every one has help text, every numeric flag is checked like a
scenario field (exit 2, one line naming the flag, no traceback), and ``--seed`` takes exactly the
seeds a scenario file may give."""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from headroom.cli import build_parser, main
from headroom.commands.controller import faust_log_level
from headroom.kernel.errors import ConfigError
from headroom.kernel.flags import (
    COUNT,
    DURATION,
    EPOCH,
    FAST_SPEED,
    FIXED_PORT,
    PORT,
    SEED,
    SHARE,
    SPEED,
    Rule,
)
from headroom.kernel.scenario import MAX_SEED
from headroom.kernel.scenario_load import load_scenario_text
from headroom.kernel.settings import resolve_scenario


def walk(
    parser: argparse.ArgumentParser, path: tuple[str, ...] = ()
) -> Iterator[tuple[tuple[str, ...], argparse.ArgumentParser]]:
    """Every (command path, parser) of the tree, the root included."""
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from walk(sub, (*path, name))


COMMANDS = list(walk(build_parser()))


def test_the_tree_has_every_command() -> None:
    paths = {" ".join(p) for p, _ in COMMANDS}
    for name in (
        "simulate",
        "up",
        "controller",
        "server",
        "client",
        "precompute",
        "feed",
        "replay",
        "record",
        "analyze",
        "bench",
        "topics validate",
        "kafka start",
        "scenario check",
        "scenario from-recording",
    ):
        assert name in paths


def test_every_argument_of_every_command_has_help_text() -> None:
    missing = [
        f"{' '.join(path) or 'headroom'} {'/'.join(a.option_strings) or a.dest}"
        for path, parser in COMMANDS
        for a in parser._actions
        if not (isinstance(a.help, str) and a.help.strip() and a.help != argparse.SUPPRESS)
    ]
    assert missing == []


def numeric_actions() -> list[tuple[tuple[str, ...], argparse.Action]]:
    return [
        (path, a)
        for path, parser in COMMANDS
        for a in parser._actions
        if a.type is not None or getattr(a, "rule", None) is not None
    ]


def test_every_typed_flag_is_a_checked_number() -> None:
    """No flag converts with a bare int/float: each goes through a rule of kernel/flags.py."""
    actions = numeric_actions()
    assert len(actions) >= 25  # the flags of every command, not a handful
    unchecked = [
        f"{' '.join(path)} {'/'.join(a.option_strings)}"
        for path, a in actions
        if not isinstance(getattr(a, "rule", None), Rule)
    ]
    assert unchecked == []


BAD: dict[int, list[str]] = {
    id(SEED): ["-5", "99999999999999999999999", "1.5", "seven"],
    id(PORT): ["-1", "70000", "80.5", "x"],
    id(FIXED_PORT): ["0", "65536", "x"],
    id(DURATION): ["0", "-1", "nan", "inf", "x"],
    id(EPOCH): ["-1", "nan", "inf"],
    id(SPEED): ["0", "-1", "nan", "inf"],
    id(FAST_SPEED): ["-1", "nan", "inf"],
    id(SHARE): ["0", "1.5", "nan"],
    id(COUNT): ["0", "-2", "1.5", "x"],
}
GOOD: dict[int, list[str]] = {
    id(SEED): ["0", "7", str(MAX_SEED)],
    id(PORT): ["0", "8080", "65535"],
    id(FIXED_PORT): ["1", "19092", "65535"],
    id(DURATION): ["0.5", "60", "1e6"],
    id(EPOCH): ["0", "1796000000.5"],
    id(SPEED): ["0.25", "1", "60"],
    id(FAST_SPEED): ["0", "1", "10"],
    id(SHARE): ["0.5", "1"],
    id(COUNT): ["1", "3"],
}


def bad_cases() -> list[Any]:
    cases = []
    for path, action in numeric_actions():
        flag = action.option_strings[0]
        rule = getattr(action, "rule", None)
        assert isinstance(rule, Rule)
        for text in BAD[id(rule)]:
            cases.append(pytest.param(path, flag, text, id=f"{' '.join(path)} {flag} {text}"))
    return cases


def required_args(path: tuple[str, ...]) -> list[str]:
    """Placeholder values for the positional and required arguments of a command (never used:
    a bad flag stops the parse before any command runs)."""
    parser = dict(COMMANDS)[path]
    out: list[str] = []
    for a in parser._actions:
        value = str(next(iter(a.choices))) if a.choices else "x"
        if not a.option_strings and not isinstance(a, argparse._SubParsersAction):
            out.append(value)
        elif a.required and a.option_strings:
            out += [a.option_strings[0], value]
    return out


@pytest.mark.parametrize(("path", "flag", "text"), bad_cases())
def test_a_bad_number_exits_2_with_one_line_naming_the_flag(
    path: tuple[str, ...], flag: str, text: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main([*path, *required_args(path), f"{flag}={text}"])
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert code == 2
    assert len(lines) == 1, lines
    assert lines[0].startswith(f"headroom: {flag}: must be "), lines
    assert "Traceback" not in captured.err
    assert captured.out == ""


@pytest.mark.parametrize(
    ("rule", "texts"),
    [(r, GOOD[id(r)]) for r in (SEED, PORT, FIXED_PORT, DURATION)]
    + [(r, GOOD[id(r)]) for r in (EPOCH, SPEED, FAST_SPEED, SHARE)],
)
def test_good_numbers_pass(rule: Rule, texts: list[str]) -> None:
    for text in texts:
        value = rule.parse("--x", text)
        assert value == (int(text) if rule.integer else float(text))


def test_simulate_with_a_negative_seed_exits_2_in_one_line(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    code = main(["simulate", "quickstart", "--seed", "-5", "--out", str(tmp_path)])
    err = capsys.readouterr().err
    assert code == 2
    assert err == "headroom: --seed: must be >= 0, got -5\n"
    assert list(tmp_path.iterdir()) == []  # refused before any work


@pytest.mark.parametrize("seed", [-1, 0, 1, 2**32, MAX_SEED, MAX_SEED + 1, 10**23])
def test_a_seed_is_valid_as_a_flag_exactly_when_valid_in_a_scenario(seed: int) -> None:
    doc = yaml.safe_load(resolve_scenario("quickstart").read_text())
    doc["seed"] = seed
    problems: list[str] = []
    try:
        load_scenario_text(yaml.safe_dump(doc))
    except ConfigError as exc:
        problems = exc.problems
    assert all(p.startswith("seed:") for p in problems), problems
    in_file = not problems
    try:
        SEED.parse("--seed", str(seed))
        as_flag = True
    except ConfigError:
        as_flag = False
    assert in_file == as_flag == (0 <= seed <= MAX_SEED)


# --- long runs say so at start -----------------------------------------------------------------


def test_a_run_of_a_simulated_day_announces_its_time_and_log_size(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from headroom.commands.simulate import LONG_RUN_S, _warn_if_long
    from headroom.kernel.scenario_load import load_scenario
    from headroom.sim.policies import POLICIES
    from headroom.sim.runtime import estimate_run

    day = load_scenario(resolve_scenario("diurnal-3region"))
    est = estimate_run(day, list(POLICIES))
    assert est.wall_s > 10 * LONG_RUN_S
    assert est.compress
    assert est.window_lines == 8640 * 3 * len(POLICIES)
    _warn_if_long(day, list(POLICIES))
    err = capsys.readouterr().err
    assert err.startswith("simulate: this run is expected to take about ")
    assert "min" in err
    assert "(gzip)" in err
    assert f"{len(POLICIES)} policies x 3 region(s) x 86400 simulated s" in err

    hour = load_scenario(resolve_scenario("quickstart"))
    assert estimate_run(hour, list(POLICIES)).wall_s < LONG_RUN_S
    _warn_if_long(hour, list(POLICIES))
    assert capsys.readouterr().err == ""  # a short run says nothing


def test_simulate_policy_help_names_every_policy() -> None:
    from headroom.sim.policies import POLICIES

    simulate = dict(COMMANDS)[("simulate",)]
    (policy,) = [a for a in simulate._actions if "--policy" in a.option_strings]
    assert all(name in str(policy.help) for name in POLICIES)


def test_a_bad_faust_log_level_stops_the_controller_before_any_work(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # refused before the scenario is read or Kafka is asked for anything (nothing listens on
    # the port given)
    monkeypatch.setenv("HEADROOM_FAUST_LOG_LEVEL", "loud")
    code = main(["controller", "--bootstrap", "127.0.0.1:9", "--prefix", "x."])
    err = capsys.readouterr().err
    assert code == 2
    assert err == (
        "headroom: HEADROOM_FAUST_LOG_LEVEL: must be one of debug, info, warning, error, "
        "critical, got 'loud'\n"
    )


@pytest.mark.parametrize("level", ["", "info", "WARNING", "debug"])
def test_a_faust_log_level_is_read_in_any_case(level: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HEADROOM_FAUST_LOG_LEVEL", level)
    assert faust_log_level() == (level.upper() or "WARNING")
