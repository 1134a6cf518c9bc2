"""The log lines of every process: one JSON object per line, whoever else writes to stderr."""

from __future__ import annotations

import io
import json
import sys
import threading
from collections.abc import Iterator

import pytest

from headroom.cli import main
from headroom.kernel import logs
from headroom.kernel.errors import ConfigError


class _Writes(io.StringIO):
    """A stderr that records each write call apart."""

    def __init__(self) -> None:
        super().__init__()
        self.writes: list[str] = []

    def write(self, s: str) -> int:
        self.writes.append(s)
        return super().write(s)


@pytest.fixture
def stderr(monkeypatch: pytest.MonkeyPatch) -> Iterator[_Writes]:
    """structlog configured on a recording stderr; configured back on the real one after."""
    fake = _Writes()
    real = sys.stderr
    monkeypatch.setattr(sys, "stderr", fake)
    logs.configure("json")
    yield fake
    monkeypatch.setattr(sys, "stderr", real)
    logs.configure("json")


def test_a_line_and_its_newline_are_one_write(stderr: _Writes) -> None:
    logs.get_logger("test").info("test.line.written", n=1)
    # another thread's write can only land between two of our lines, never inside one
    assert len(stderr.writes) == 1, stderr.writes
    line = stderr.writes[0]
    assert line.endswith("\n")
    assert line.count("\n") == 1
    doc = json.loads(line)
    assert doc["event"] == "test.line.written"
    assert doc["source"] == "test"
    assert doc["n"] == 1


def test_lines_from_threads_stay_whole_beside_a_stdlib_writer(stderr: _Writes) -> None:
    log = logs.get_logger("test")

    def ours() -> None:
        for i in range(200):
            log.info("test.line.written", i=i)

    def theirs() -> None:  # a library's logging handler on the same stream: one write per line
        for i in range(200):
            stderr.write(f"[library] line {i}\n")

    threads = [threading.Thread(target=ours), threading.Thread(target=theirs)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    lines = stderr.getvalue().splitlines()
    assert len(lines) == 400
    mine = [json.loads(x) for x in lines if x.startswith("{")]
    assert sorted(x["i"] for x in mine) == list(range(200))


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("HEADROOM_LOG_LEVEL", "loud"),
        ("HEADROOM_LOG_LEVEL", "warn"),
        ("HEADROOM_LOG_FORMAT", "xml"),
    ],
)
def test_a_log_variable_no_process_can_use_stops_every_command_at_start_up(
    variable: str,
    value: str,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(variable, value)
    # a command that would otherwise succeed with no broker, file or network
    assert main(["scenario", "schema"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.startswith(f"headroom: {variable}: must be one of ")
    assert captured.err.endswith(f", got {value!r}\n")
    # and a library caller's first configure() refuses it too (the environment is read then)
    monkeypatch.setattr(logs, "_configured", False)
    with pytest.raises(ConfigError, match=variable):
        logs.configure()


@pytest.mark.parametrize("value", ["", "INFO", "Debug", " warning "])
def test_a_log_level_is_read_in_any_case_and_empty_is_the_default(
    value: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HEADROOM_LOG_LEVEL", value)
    assert logs.env_choice("HEADROOM_LOG_LEVEL", logs.LOG_LEVELS, "info") == (
        value.strip().lower() or "info"
    )
    logs.check_environment()
