"""Reading and writing the structured event log (docs/events.md): JSON lines, one object a line.

:func:`window_event` builds the fields of a ``window`` line, the per-window aggregate both engines
write (the simulator's regions, the streaming client): one builder, so the fields and their
meaning are the same whichever engine wrote them (docs/events.md documents them once).

:class:`EventWriter` is what the simulator and the workers use to write a log: orjson, one object
and a newline per :meth:`EventWriter.write`, buffered, numpy scalars and arrays accepted. With
``compress=True`` the same lines go through gzip (the simulator does so for long runs,
docs/analysis.md, *Event log size*); the file keeps its name, ``events.jsonl``.

:class:`EventLog` streams a log back from disk, one ``dict`` at a time, so a log far larger than
memory can be analysed. It never stops at a bad line: a line that is not JSON, or JSON that is not
an object, or an object without a string ``kind``, is counted in :attr:`EventLog.stats` with its
line number and the reason, and skipped. Kinds this version does not know are passed through
(they are counted in ``stats.unknown_kinds``) so that new event kinds never break old analyzers.
A corrupt line is attributed to a policy where it still names one (``"policy":"NAME"`` is readable
in its bytes, e.g. a line cut short after its common fields): ``stats.corrupt_by_policy``.
A gzip-compressed log (recognised by its first two bytes, whatever its name) is read the same way;
one cut short or damaged yields its lines up to the break, which is counted as one corrupt line.
"""

from __future__ import annotations

import gzip
import re
import zlib
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import IO, Any

import orjson

from headroom.kernel.errors import ConfigError, HeadroomError
from headroom.kernel.vocab import LEVERS, LIVE_LEVERS

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
        "fault.injected",
        "fault.recovered",
        "process.restarted",
        "stack.audit",
        "value.counted",
        "capacity.silence.ended",
    }
)

# How many corrupt lines are kept with their line number and reason (all are counted).
MAX_REPORTED_PROBLEMS = 20

_ORJSON_OPTIONS = orjson.OPT_APPEND_NEWLINE | orjson.OPT_SERIALIZE_NUMPY

# The policy a corrupt line names, where its bytes still hold the whole ``"policy":"NAME"`` pair.
_POLICY_FIELD = re.compile(rb'"policy"\s*:\s*"((?:[^"\\]|\\.){1,200})"')

GZIP_MAGIC = b"\x1f\x8b"  # the first two bytes of a gzip stream (RFC 1952)
# zlib's default level: on window lines ~6x smaller, where level 1 gives ~4.7x and 9 ~6.7x at three
# times the time (measured on a diurnal-3region log)
GZIP_LEVEL = 6
# what reading a gzip stream raises where it is cut short or damaged
_DAMAGED = (EOFError, zlib.error, gzip.BadGzipFile)


def encode_event(event: Mapping[str, Any]) -> bytes:
    """One event as the log's line (JSON, newline-terminated; numpy values as numbers)."""
    try:
        return orjson.dumps(event, option=_ORJSON_OPTIONS)
    except TypeError as exc:
        kind = event.get("kind", "?") if isinstance(event, Mapping) else "?"
        raise HeadroomError(f"cannot encode a {kind!r} event: {exc}") from exc


class EventWriter:
    """Write events as JSON lines: ``with EventWriter(path) as w: w.write({...})``.

    ``append=True`` adds to an existing log instead of replacing it. The parent directory is
    created if needed. Writing after :meth:`close` raises :class:`HeadroomError`.
    ``compress=True`` writes the lines gzip-compressed (deterministic bytes: no time stamp or name
    in the header); appending then adds a gzip member, which readers take as one stream.
    """

    def __init__(
        self,
        path: str | Path,
        *,
        append: bool = False,
        buffer_bytes: int = 1 << 20,
        compress: bool = False,
    ):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        mode = "ab" if append else "wb"
        self._raw: IO[bytes] | None = None
        self._file: IO[bytes] | gzip.GzipFile | None = None
        if not compress:
            self._file = open(self.path, mode, buffering=buffer_bytes)  # noqa: SIM115
        else:
            self._raw = open(self.path, mode, buffering=buffer_bytes)  # noqa: SIM115
            self._file = gzip.GzipFile(
                filename="", mode="wb", fileobj=self._raw, compresslevel=GZIP_LEVEL, mtime=0
            )
        self.compressed = compress
        self.count = 0

    def write(self, event: Mapping[str, Any]) -> None:
        """Append one event (a mapping with at least ``kind``) as one line."""
        if self._file is None:
            raise HeadroomError(f"event log {self.path}: write after close")
        try:
            line = encode_event(event)
        except HeadroomError as exc:
            raise HeadroomError(f"event log {self.path}: {exc}") from exc
        self._file.write(line)
        self.count += 1

    def flush(self) -> None:
        if self._file is not None:
            self._file.flush()

    def close(self) -> None:
        if self._file is not None:
            self._file.close()  # a GzipFile writes its trailer, leaving the raw file open
            self._file = None
        if self._raw is not None:
            self._raw.close()
            self._raw = None

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
    # corrupt lines per policy, where the line still names one (the rest are unattributed)
    corrupt_by_policy: Counter[str] = field(default_factory=Counter)

    @property
    def corrupt_unattributed(self) -> int:
        """Corrupt lines that name no readable policy."""
        return self.corrupt - sum(self.corrupt_by_policy.values())

    def summary(self) -> str:
        """One line for a terminal: how many lines, how many skipped or unknown."""
        text = f"{self.events} events from {self.lines} lines"
        if self.corrupt:
            text += f"; {self.corrupt} corrupt line(s) skipped"
            notes = [f"{p}: {n}" for p, n in sorted(self.corrupt_by_policy.items())]
            if self.problems:
                first_line, reason = self.problems[0]
                notes.append(f"first: line {first_line}: {reason}")
            if notes:
                text += f" ({'; '.join(notes)})"
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
            lines: Iterator[bytes] | IO[bytes] = handle
            if handle.peek(2)[:2] == GZIP_MAGIC:
                lines = self._gzip_lines(handle)
            for number, line in enumerate(lines, start=1):
                if not line.strip():
                    continue
                stats.lines += 1
                try:
                    event = loads(line)
                except orjson.JSONDecodeError as exc:
                    self._corrupt(number, f"not JSON ({exc.msg})", _named_policy(line))
                    continue
                if not isinstance(event, dict):
                    self._corrupt(number, f"a JSON {type(event).__name__}, not an object")
                    continue
                kind = event.get("kind")
                if not isinstance(kind, str):
                    policy = event.get("policy")
                    self._corrupt(
                        number,
                        "no string 'kind' field",
                        policy if isinstance(policy, str) else None,
                    )
                    continue
                stats.events += 1
                stats.kinds[kind] += 1
                if kind not in known:
                    stats.unknown_kinds[kind] += 1
                yield event
        finally:
            handle.close()

    def _gzip_lines(self, handle: IO[bytes]) -> Iterator[bytes]:
        """The lines of a gzip-compressed log; where the stream is cut short or damaged, what was
        read so far, and the break counted as one corrupt line."""
        number = 0
        try:
            with gzip.GzipFile(fileobj=handle, mode="rb") as stream:
                for line in stream:
                    number += 1
                    yield line
        except _DAMAGED as exc:
            self.stats.lines += 1
            self._corrupt(number + 1, f"compressed log cut short or damaged ({exc})")

    def _corrupt(self, number: int, reason: str, policy: str | None = None) -> None:
        self.stats.corrupt += 1
        if policy is not None:
            self.stats.corrupt_by_policy[policy] += 1
        if len(self.stats.problems) < MAX_REPORTED_PROBLEMS:
            self.stats.problems.append((number, reason))


def _named_policy(line: bytes) -> str | None:
    """The policy a line that is not JSON names, if its bytes hold a whole ``"policy":"…"``."""
    match = _POLICY_FIELD.search(line)
    if match is None:
        return None
    try:
        name = orjson.loads(b'"' + match.group(1) + b'"')
    except orjson.JSONDecodeError:
        return None
    return name if isinstance(name, str) else None


def read_events(path: str | Path) -> list[dict[str, Any]]:
    """Every event of a (small) log in a list: for tests and tools; analysis streams instead."""
    return list(EventLog(path))


# ------------------------------------------------------------------------------------------------
# The window line
# ------------------------------------------------------------------------------------------------

# every lever a window's ground truth is split by (``inc``), and the live-path levers that always
# have an ``eligible_treated`` count
WINDOW_LEVERS = LEVERS

Sums = Mapping[str, Any]  # {n, value_sum, value_sq_sum}


@dataclass(frozen=True, slots=True)
class WindowTraffic:
    """What the requests that ended in one SLO window did, as a ``window`` line reports them
    (docs/events.md, *Per-window aggregates*: every field's meaning is there).

    ``arms`` and ``itt`` are ``{SEG: {ARM or LEVER: {n, value_sum, value_sq_sum}}}``;
    ``segments`` ``{SEG: {requests, sbm, inc}}``; ``targets`` the targets in force at the end of
    the window, ``{rma_candidates, sbm_coverage}``."""

    requests: int
    errors: int
    timeouts: int
    sketch: Mapping[str, Any]
    sketch_base: Mapping[str, Any]
    value_total: float
    value_baseline: float
    inc: Mapping[str, float]
    # ground-truth value lost by requests that failed or timed out against what the baseline
    # would have delivered for them (≤ 0 as a rule): inc's levers + value_lost add up to
    # value_total − value_baseline
    value_lost: float
    arms: Mapping[str, Mapping[str, Sums]]
    # the estimator's sums per (segment, value bin) stratum (``"premium#3"``) and arm, with the
    # value signal's sums: {n, value_sum, value_sq_sum, signal_sum, signal_sq_sum,
    # signal_value_sum, failed, failed_signal_sum, failed_signal_sq_sum}; {} where the writer has
    # no value bins
    strata: Mapping[str, Mapping[str, Mapping[str, Any]]]
    itt: Mapping[str, Mapping[str, Sums]]
    eligible_treated: Mapping[str, float]
    segments: Mapping[str, Mapping[str, Any]]
    targets: Mapping[str, Any]


def base_sketch(window: Mapping[str, Any]) -> Any:
    """The latency sketch of a ``window`` line's requests that ran with no optional work: its
    ``sketch_base``, or its ``sketch`` where the writer left ``sketch_base`` out because the
    two were the same (docs/events.md); None for a line without requests."""
    base = window.get("sketch_base")
    return window.get("sketch") if base is None else base


# A sketch is written packed where its keys span at most this many times as many slots as it has
# bins (a run of neighbouring keys, a window's latencies as a rule); a few far-apart keys stay
# ``bins``, which is shorter then.
PACK_SPAN_PER_BIN = 3


def pack_sketch(d: Mapping[str, Any]) -> dict[str, Any]:
    """A docs/messages.md sketch (``alpha``, ``bins``, ``zeros``) as a ``window`` line writes it
    (docs/events.md, *Latency sketches in the log*): the counts of the keys from ``offset`` up,
    one slot per key, ``{"alpha", "offset", "counts", "zeros"}``. Lossless, and a third smaller
    once compressed than the same bins keyed by their text. A sketch whose keys are too far apart
    (:data:`PACK_SPAN_PER_BIN`) or that is not in the contract's form is returned as given."""
    bins = d.get("bins")
    if not isinstance(bins, dict):
        return dict(d)
    try:
        keys = [int(k) for k in bins]
    except (TypeError, ValueError):
        return dict(d)
    if not keys:
        return {"alpha": d.get("alpha"), "offset": 0, "counts": [], "zeros": d.get("zeros", 0)}
    lo, hi = min(keys), max(keys)
    if hi - lo + 1 > PACK_SPAN_PER_BIN * len(keys) or len(set(keys)) != len(keys):
        return dict(d)
    counts = [0] * (hi - lo + 1)
    for key, count in zip(keys, bins.values(), strict=True):
        counts[key - lo] = count
    return {"alpha": d.get("alpha"), "offset": lo, "counts": counts, "zeros": d.get("zeros", 0)}


def unpack_sketch(d: Any) -> Any:
    """The docs/messages.md form of a sketch a ``window`` line holds: a packed sketch
    (:func:`pack_sketch`) unpacked, any other value as given (so a log written before sketches
    were packed reads the same). Raises ``ValidationError`` naming ``offset`` or ``counts[i]``
    where a packed sketch is malformed."""
    if not isinstance(d, Mapping) or "counts" not in d:
        return d
    from headroom.kernel.codec import ValidationError

    offset, counts = d.get("offset"), d["counts"]
    if type(offset) is not int:
        raise ValidationError("offset", "must be an integer (the key of counts[0])")
    if not isinstance(counts, list):
        raise ValidationError("counts", "must be a list of counts")
    for i, c in enumerate(counts):
        if type(c) is not int or c < 0:
            raise ValidationError(f"counts[{i}]", f"must be a non-negative integer, got {c!r}")
    out = {k: v for k, v in d.items() if k not in ("offset", "counts")}
    out["bins"] = {str(offset + i): c for i, c in enumerate(counts) if c}
    return out


def _sums(d: Sums) -> dict[str, Any]:
    return {
        "n": int(d["n"]),
        "value_sum": float(d["value_sum"]),
        "value_sq_sum": float(d["value_sq_sum"]),
    }


_SIGNAL_SUMS = ("signal_sum", "signal_sq_sum", "signal_value_sum")
_FAILED_SUMS = ("failed_signal_sum", "failed_signal_sq_sum")


def _strata_sums(d: Mapping[str, Any]) -> dict[str, Any]:
    out = _sums(d)
    for k in _SIGNAL_SUMS:
        out[k] = float(d.get(k, 0.0))
    out["failed"] = int(d.get("failed", 0))
    for k in _FAILED_SUMS:
        out[k] = float(d.get(k, 0.0))
    return out


def _groups(by_seg: Mapping[str, Mapping[str, Sums]]) -> dict[str, dict[str, dict[str, Any]]]:
    """Per segment and group, the sums, leaving out empty groups and then empty segments."""
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for seg, groups in by_seg.items():
        present = {name: _sums(d) for name, d in groups.items() if int(d["n"]) > 0}
        if present:
            out[seg] = present
    return out


def _units(d: Mapping[str, Any]) -> dict[str, float]:
    """Capacity in units (cores, devices) or unit-seconds, to a millionth of a unit: finer
    digits mean nothing and cost the event log bytes on every window."""
    return {str(k): round(float(v), 6) for k, v in d.items()}


def window_event(
    t_start: float,
    t_end: float,
    traffic: WindowTraffic | None = None,
    *,
    offered_unit_s: Mapping[str, float] | None = None,
    used_unit_s: Mapping[str, float] | None = None,
    demand_unit_s: Mapping[str, float] | None = None,
    capacity: Mapping[str, float] | None = None,
    quotas: Mapping[str, float] | None = None,
    precompute: Mapping[str, Any] | None = None,
    offsets: Mapping[int, Sequence[int]] | None = None,
    **source: Any,
) -> dict[str, Any]:
    """The fields of one ``window`` line (without the common ones: ``v``, ``ts``, ``kind``,
    ``source``, ``policy``, ``region``), in the order docs/events.md lists them.

    ``traffic``: the requests of the window (None: a line of a source that served none, whose
    counts are then 0 and which carries only its own groups). Each other group is written when
    given: ``offered_unit_s``, ``used_unit_s``, ``demand_unit_s``, ``capacity``, ``quotas``
    (``{resource or quota: units}``), ``precompute`` (as given), ``offsets`` (``{partition:
    [first, last]}``, written with string keys in partition order). ``source`` adds the
    writer's own identification (e.g. ``client=NAME``) at the end.

    Normalised so both engines write alike: counts are ints, sums floats; ``inc`` has every
    lever of :data:`WINDOW_LEVERS` (0.0 when absent); ``eligible_treated`` every live lever
    (0 when absent) plus any other given, as whole numbers; empty arms and segments are left
    out of ``arms`` and ``itt``."""
    out: dict[str, Any] = {"t_start": float(t_start), "t_end": float(t_end)}
    if traffic is None:
        out.update(requests=0, errors=0, timeouts=0)
    else:
        tr = traffic
        treated = {lever: 0.0 for lever in LIVE_LEVERS}
        treated.update(tr.eligible_treated)
        out.update(
            requests=int(tr.requests),
            errors=int(tr.errors),
            timeouts=int(tr.timeouts),
            sketch=pack_sketch(tr.sketch),
        )
        base = pack_sketch(tr.sketch_base)
        if base != out["sketch"]:
            # left out where every request of the window ran without optional work (static's
            # windows, a night without capacity): readers take ``sketch`` then (base_sketch)
            out["sketch_base"] = base
        out.update(
            value_total=float(tr.value_total),
            value_baseline=float(tr.value_baseline),
            inc={lever: float(tr.inc.get(lever, 0.0)) for lever in WINDOW_LEVERS},
            value_lost=float(tr.value_lost),
            arms=_groups(tr.arms),
            strata={
                key: {name: _strata_sums(d) for name, d in by.items() if int(d["n"]) > 0}
                for key, by in tr.strata.items()
                if any(int(d["n"]) > 0 for d in by.values())
            },
            itt=_groups(tr.itt),
            eligible_treated={k: round(float(v)) for k, v in treated.items()},
            segments={
                seg: {
                    "requests": int(d["requests"]),
                    "sbm": round(float(d["sbm"])),
                    "inc": float(d["inc"]),
                }
                for seg, d in tr.segments.items()
            },
        )
    for key, units in (
        ("offered_unit_s", offered_unit_s),
        ("used_unit_s", used_unit_s),
        ("demand_unit_s", demand_unit_s),
    ):
        if units is not None:
            out[key] = _units(units)
    if traffic is not None:
        out["targets"] = {
            "rma_candidates": int(traffic.targets["rma_candidates"]),
            "sbm_coverage": float(traffic.targets["sbm_coverage"]),
        }
    if capacity is not None:
        out["capacity"] = _units(capacity)
    if quotas is not None:
        out["quotas"] = _units(quotas)
    if precompute is not None:
        out["precompute"] = dict(precompute)
    if offsets is not None:
        out["offsets"] = {str(p): [int(x) for x in span] for p, span in sorted(offsets.items())}
    out.update(source)
    return out
