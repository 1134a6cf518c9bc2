"""Reading and writing the structured event log (docs/events.md): JSON lines, one object a line.

:class:`EventWriter` is what the simulator and the workers use to write a log: orjson, one object
and a newline per :meth:`EventWriter.write`, buffered, numpy scalars and arrays accepted.

:class:`EventLog` streams a log back from disk, one ``dict`` at a time, so a log far larger than
memory can be analysed. It never stops at a bad line: a line that is not JSON, or JSON that is not
an object, or an object without a string ``kind``, is counted in :attr:`EventLog.stats` with its
line number and the reason, and skipped. Kinds this version does not know are passed through
(they are counted in ``stats.unknown_kinds``) so that new event kinds never break old analyzers.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import IO, Any

import orjson

from headroom.kernel.errors import ConfigError, HeadroomError

# Every kind docs/events.md defines. Anything else is "unknown": read, counted, otherwise ignored.
KNOWN_KINDS: frozenset[str] = frozenset(
    {
        "run.started",
        "run.finished",
        "oracle.bound",
        "window",
        "target.issued",
        "target.applied",
        "target.expired",
        "capacity.reclaimed",
        "optional.released",
        "shedding.started",
        "shedding.stopped",
        "overload.entered",
        "overload.left",
        "allocator.fallback",
        "allocator.cap_bound",
        "message.deadlettered",
    }
)

# How many corrupt lines are kept with their line number and reason (all are counted).
MAX_REPORTED_PROBLEMS = 20

_ORJSON_OPTIONS = orjson.OPT_APPEND_NEWLINE | orjson.OPT_SERIALIZE_NUMPY


class EventWriter:
    """Write events as JSON lines: ``with EventWriter(path) as w: w.write({...})``.

    ``append=True`` adds to an existing log instead of replacing it. The parent directory is
    created if needed. Writing after :meth:`close` raises :class:`HeadroomError`.
    """

    def __init__(self, path: str | Path, *, append: bool = False, buffer_bytes: int = 1 << 20):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        mode = "ab" if append else "wb"
        self._file: IO[bytes] | None = open(self.path, mode, buffering=buffer_bytes)  # noqa: SIM115
        self.count = 0

    def write(self, event: Mapping[str, Any]) -> None:
        """Append one event (a mapping with at least ``kind``) as one line."""
        if self._file is None:
            raise HeadroomError(f"event log {self.path}: write after close")
        try:
            line = orjson.dumps(event, option=_ORJSON_OPTIONS)
        except TypeError as exc:
            kind = event.get("kind", "?") if isinstance(event, Mapping) else "?"
            raise HeadroomError(
                f"event log {self.path}: cannot encode a {kind!r} event: {exc}"
            ) from exc
        self._file.write(line)
        self.count += 1

    def flush(self) -> None:
        if self._file is not None:
            self._file.flush()

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None

    @property
    def closed(self) -> bool:
        return self._file is None

    def __enter__(self) -> EventWriter:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


@dataclass
class LogStats:
    """What reading a log found besides the events themselves."""

    lines: int = 0  # non-blank lines read
    events: int = 0  # lines yielded as events
    corrupt: int = 0  # lines skipped (not JSON, not an object, no kind)
    # (line number, reason) of the first MAX_REPORTED_PROBLEMS corrupt lines
    problems: list[tuple[int, str]] = field(default_factory=list)
    kinds: Counter[str] = field(default_factory=Counter)
    unknown_kinds: Counter[str] = field(default_factory=Counter)

    def summary(self) -> str:
        """One line for a terminal: how many lines, how many skipped or unknown."""
        text = f"{self.events} events from {self.lines} lines"
        if self.corrupt:
            text += f"; {self.corrupt} corrupt line(s) skipped"
            if self.problems:
                first_line, reason = self.problems[0]
                text += f" (first: line {first_line}: {reason})"
        unknown = sum(self.unknown_kinds.values())
        if unknown:
            names = ", ".join(sorted(self.unknown_kinds))
            text += f"; {unknown} line(s) of unknown kind ({names}) ignored"
        return text


class EventLog:
    """Stream the events of a JSON-lines log: ``for event in EventLog(path): ...``.

    Iterating again re-reads the file (and resets :attr:`stats`). A missing or unreadable file
    raises :class:`ConfigError` (bad input: exit 2) when the log is created.
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        if not self.path.exists():
            raise ConfigError(f"{self.path}: no such event log")
        if not self.path.is_file():
            raise ConfigError(f"{self.path}: not a file")
        self.stats = LogStats()

    def __iter__(self) -> Iterator[dict[str, Any]]:
        stats = self.stats = LogStats()
        loads = orjson.loads
        known = KNOWN_KINDS
        try:
            handle = open(self.path, "rb")  # noqa: SIM115 - closed in the finally below
        except OSError as exc:
            raise ConfigError(f"{self.path}: cannot read the event log: {exc.strerror}") from exc
        try:
            for number, line in enumerate(handle, start=1):
                if not line.strip():
                    continue
                stats.lines += 1
                try:
                    event = loads(line)
                except orjson.JSONDecodeError as exc:
                    self._corrupt(number, f"not JSON ({exc.msg})")
                    continue
                if not isinstance(event, dict):
                    self._corrupt(number, f"a JSON {type(event).__name__}, not an object")
                    continue
                kind = event.get("kind")
                if not isinstance(kind, str):
                    self._corrupt(number, "no string 'kind' field")
                    continue
                stats.events += 1
                stats.kinds[kind] += 1
                if kind not in known:
                    stats.unknown_kinds[kind] += 1
                yield event
        finally:
            handle.close()

    def _corrupt(self, number: int, reason: str) -> None:
        self.stats.corrupt += 1
        if len(self.stats.problems) < MAX_REPORTED_PROBLEMS:
            self.stats.problems.append((number, reason))


def read_events(path: str | Path) -> list[dict[str, Any]]:
    """Every event of a (small) log in a list: for tests and tools; analysis streams instead."""
    return list(EventLog(path))
