"""A gzip-compressed event log (what the simulator writes for long runs) reads like a plain one."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from headroom.analysis.events import GZIP_MAGIC, EventLog, EventWriter, read_events


def events(n: int) -> list[dict[str, Any]]:
    return [
        {
            "v": 1,
            "ts": float(i),
            "kind": "window",
            "source": "sim",
            "policy": "headroom",
            "region": "r1",
            "t_start": 10.0 * i,
            "t_end": 10.0 * (i + 1),
            "requests": 1000 + i,
            "sketch": {"alpha": 0.01, "bins": {str(100 + i % 50): 3, "170": 9}, "zeros": 0},
        }
        for i in range(n)
    ]


def write(path: Path, evs: list[dict[str, Any]], *, compress: bool) -> Path:
    with EventWriter(path, compress=compress) as w:
        for e in evs:
            w.write(e)
    return path


def test_a_compressed_log_keeps_its_name_and_reads_back_the_same_events(tmp_path: Path) -> None:
    evs = events(2000)
    plain = write(tmp_path / "a" / "events.jsonl", evs, compress=False)
    packed = write(tmp_path / "b" / "events.jsonl", evs, compress=True)
    assert packed.read_bytes()[:2] == GZIP_MAGIC
    assert plain.read_bytes()[:2] != GZIP_MAGIC
    assert packed.stat().st_size * 4 < plain.stat().st_size
    assert read_events(packed) == read_events(plain) == evs
    log = EventLog(packed)
    assert sum(1 for _ in log) == len(evs)
    assert (log.stats.lines, log.stats.corrupt) == (len(evs), 0)


def test_compressed_bytes_are_deterministic(tmp_path: Path) -> None:
    evs = events(300)
    a = write(tmp_path / "a.jsonl", evs, compress=True).read_bytes()
    b = write(tmp_path / "b.jsonl", evs, compress=True).read_bytes()
    assert a == b  # no time stamp or file name in the gzip header


def test_a_compressed_log_cut_short_yields_its_start_and_one_corrupt_line(
    tmp_path: Path,
) -> None:
    evs = events(5000)
    whole = write(tmp_path / "events.jsonl", evs, compress=True).read_bytes()
    cut = tmp_path / "cut.jsonl"
    cut.write_bytes(whole[: len(whole) // 2])
    log = EventLog(cut)
    got = list(log)
    assert 0 < len(got) < len(evs)
    assert got == evs[: len(got)]  # the lines before the break, intact
    assert log.stats.corrupt == 1
    assert "cut short" in log.stats.summary()


def test_appending_to_a_compressed_log_adds_a_member_read_as_one_stream(tmp_path: Path) -> None:
    evs = events(100)
    path = write(tmp_path / "events.jsonl", evs[:60], compress=True)
    with EventWriter(path, compress=True, append=True) as w:
        for e in evs[60:]:
            w.write(e)
    assert read_events(path) == evs
