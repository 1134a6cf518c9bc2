"""Reading a scenario's files: the YAML document (safely, refusing duplicate keys and alias
bombs) and its traces, inline or in CSV files beside it, each problem reported at its field path.
"""

from __future__ import annotations

import csv
import io
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from headroom.kernel.checks import describe
from headroom.kernel.scenario import (
    Point,
)
from headroom.kernel.scenario_fields import (
    _Ctx,
    _number,
)

MAX_FILE_BYTES = 64 * 1024 * 1024  # a scenario or CSV trace larger than this is refused
MAX_ALIASES = 10_000  # YAML aliases per document (an alias bomb is refused, not expanded)
MAX_TRACE_POINTS = 2_000_000
MAX_ROW_PROBLEMS = 5  # per CSV file: report this many bad rows, then a count


class _StrictSafeLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` that also refuses duplicate keys and alias bombs (constructs no more)."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._aliases = 0

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            self._aliases += 1
            if self._aliases > MAX_ALIASES:
                event = self.peek_event()  # type: ignore[no-untyped-call]
                raise yaml.composer.ComposerError(
                    None, None, f"more than {MAX_ALIASES} aliases", event.start_mark
                )
        return super().compose_node(parent, index)


def _construct_mapping_no_duplicates(loader: _StrictSafeLoader, node: yaml.MappingNode) -> Any:
    loader.flatten_mapping(node)
    seen: set[Any] = set()
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=False)
        try:
            duplicate = key in seen
            seen.add(key)
        except TypeError:  # an unhashable key: the base constructor reports it
            continue
        if duplicate:
            raise yaml.constructor.ConstructorError(
                "while constructing a mapping",
                node.start_mark,
                f"duplicate key {key!r}",
                key_node.start_mark,
            )
    return loader.construct_mapping(node, deep=False)


_StrictSafeLoader.add_constructor(
    yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG,
    _construct_mapping_no_duplicates,
)


def _parse_yaml(text: str) -> tuple[Any, str | None]:
    """The document, or None and one problem line (with line and column) explaining why not."""
    try:
        loader = _StrictSafeLoader(text)
        try:
            return loader.get_single_data(), None
        finally:
            loader.dispose()
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
        problem = exc.problem or exc.context or "malformed YAML"
        if isinstance(exc, yaml.constructor.ConstructorError) and "constructor for the tag" in (
            exc.problem or ""
        ):
            tag = exc.problem.split("tag", 1)[1].strip().strip("'") if exc.problem else "?"
            problem = f"YAML tag {tag} is not allowed (scenario files are loaded safely)"
        return None, f"{where}not valid scenario YAML: {problem}"
    except yaml.YAMLError as exc:
        return None, f"not valid YAML: {exc}"


def _value_histogram(ctx: _Ctx, path: str, name: str) -> tuple[Point, ...] | None:
    """A recorded value histogram: ``value,requests`` rows, increasing values, whole counts,
    at least one request."""
    points = _csv_trace(ctx, path, name, ("value", "requests"))
    if points is None:
        return None
    for i, (_, n) in enumerate(points):
        if n != math.floor(n):
            ctx.add(path, f"{name} row {i + 1}: requests must be a whole number, got {n:g}")
            return None
    if not any(n > 0 for _, n in points):
        ctx.add(path, f"{name}: holds no request (every count is 0)")
        return None
    return points


def _arrival_counts(ctx: _Ctx, path: str, name: str) -> tuple[Point, ...] | None:
    """Recorded arrivals: ``t_s,requests`` rows, whole seconds in increasing order, whole counts
    (the end of the run is checked with ``duration_s``)."""
    points = _csv_trace(ctx, path, name, ("t_s", "requests"))
    if points is None:
        return None
    for i, (t, v) in enumerate(points):
        if t != math.floor(t) or v != math.floor(v):
            ctx.add(
                path,
                f"{name} row {i + 1}: t_s and requests must be whole numbers (a second and a "
                f"count), got {t:g},{v:g}",
            )
            return None
    return points


def _inline_trace(ctx: _Ctx, path: str, value: Any, what: str) -> tuple[Point, ...] | None:
    if not isinstance(value, list):
        ctx.add(path, f"must be a list of [t_s, {what}] points, got {describe(value)}")
        return None
    if not value:
        ctx.add(path, "must have at least one point")
        return None
    if len(value) > MAX_TRACE_POINTS:
        ctx.add(path, f"has {len(value)} points; the limit is {MAX_TRACE_POINTS}")
        return None
    points: list[Point] = []
    n = len(ctx.problems)
    for i, item in enumerate(value):
        where = f"{path}[{i}]"
        if not isinstance(item, list) or len(item) != 2:
            ctx.add(where, f"must be a [t_s, {what}] pair, got {describe(item)}")
            continue
        t = _number(ctx, f"{where}[0]", item[0], ge=0)
        v = _number(ctx, f"{where}[1]", item[1], ge=0)
        if t is not None and v is not None:
            points.append((t, v))
    if len(ctx.problems) != n:
        return None
    return _check_order(ctx, points, lambda i: f"{path}[{i}][0]")


def _check_order(
    ctx: _Ctx, points: list[Point], where: Callable[[int], str]
) -> tuple[Point, ...] | None:
    for i in range(1, len(points)):
        if points[i][0] <= points[i - 1][0]:
            ctx.add(
                where(i),
                f"t_s {points[i][0]:g} is not after the previous point's {points[i - 1][0]:g} "
                "(trace points must be in strictly increasing time)",
            )
            return None
    return tuple(points)


def _csv_trace(
    ctx: _Ctx, path: str, name: str, columns: tuple[str, str]
) -> tuple[Point, ...] | None:
    text = _csv_text(ctx, path, name)
    if text is None:
        return None
    rows = _csv_records(ctx, path, name, text, columns)
    if rows is None:
        return None
    points: list[Point] = []
    lines: list[int] = []
    bad = 0
    for lineno, row in rows:
        point, reason = _csv_point(row, columns)
        if point is None:
            bad += 1
            if bad <= MAX_ROW_PROBLEMS:
                ctx.add(path, f"{name} line {lineno}: {reason}")
            continue
        points.append(point)
        lines.append(lineno)
    if bad > MAX_ROW_PROBLEMS:
        ctx.add(path, f"{name}: {bad - MAX_ROW_PROBLEMS} more bad rows not listed")
    if bad:
        return None
    return _check_order(ctx, points, lambda i: f"{path}: {name} line {lines[i]}")


def _csv_text(ctx: _Ctx, path: str, name: str) -> str | None:
    """The text of a trace's CSV file (relative to the scenario's folder), within the size
    limit and UTF-8."""
    file = Path(name)
    if not file.is_absolute():
        file = ctx.base_dir / file
    try:
        if not file.exists():
            ctx.add(path, f"{name}: file not found (looked for {file})")
            return None
        if not file.is_file():
            ctx.add(path, f"{name}: not a regular file")
            return None
        if file.stat().st_size > MAX_FILE_BYTES:
            ctx.add(path, f"{name}: larger than {MAX_FILE_BYTES} bytes")
            return None
        raw = file.read_bytes()
    except OSError as exc:
        ctx.add(path, f"{name}: cannot read: {exc.strerror or exc}")
        return None
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        ctx.add(path, f"{name}: not a UTF-8 CSV file (bad byte at offset {exc.start})")
        return None


def _csv_records(
    ctx: _Ctx, path: str, name: str, text: str, columns: tuple[str, str]
) -> list[tuple[int, list[str]]] | None:
    """The data rows of a trace's CSV with their line numbers (blank and ``#`` lines skipped),
    after a header of ``columns``; at least one, at most ``MAX_TRACE_POINTS``."""
    reader = csv.reader(io.StringIO(text))
    rows = [
        (reader.line_num, row)  # the line the record ends on (a quoted cell may span lines)
        for row in reader
        if row and not (len(row) == 1 and not row[0].strip()) and not row[0].startswith("#")
    ]
    if not rows:
        ctx.add(path, f"{name}: empty (expected a header {','.join(columns)} and rows)")
        return None
    header_line, header = rows[0]
    if [c.strip() for c in header] != list(columns):
        ctx.add(
            path,
            f"{name} line {header_line}: header must be {','.join(columns)}, "
            f"got {','.join(header)}",
        )
        return None
    if len(rows) == 1:
        ctx.add(path, f"{name}: has a header but no rows")
        return None
    if len(rows) - 1 > MAX_TRACE_POINTS:
        ctx.add(path, f"{name}: has {len(rows) - 1} rows; the limit is {MAX_TRACE_POINTS}")
        return None
    return rows[1:]


def _csv_point(row: list[str], columns: tuple[str, str]) -> tuple[Point | None, str]:
    """One data row as a point, or None and why it is not one."""
    if len(row) != 2:
        return None, f"expected 2 columns ({','.join(columns)}), got {len(row)}"
    try:
        t, v = float(row[0]), float(row[1])
    except ValueError:
        return None, f"not numbers: {','.join(row)}"
    if not (math.isfinite(t) and math.isfinite(v)):
        return None, f"values must be finite, got {','.join(row)}"
    if t < 0:
        return None, f"{columns[0]} must be >= 0, got {row[0].strip()}"
    if v < 0:
        return None, f"{columns[1]} must be >= 0, got {row[1].strip()}"
    return (t, v), ""
