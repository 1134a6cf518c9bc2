"""Reading a recording for the simulator: what ``headroom simulate SCENARIO --replay FILE`` reads.

A recording (JSON lines in the ``kcat -C -J`` envelope, read by :mod:`headroom.streams.recording`)
of ``headroom.capacity`` and ``headroom.requests`` — one or more topics in one file, under any
prefix — replaces the scenario's traffic and opportunistic traces; the scenario still gives the
slo, world, models, segments and the dedicated capacity of each region. docs/replay.md is the
user's guide; this header is the algorithm.

Reading: two streaming passes, never the whole file
---------------------------------------------------
Pass 1 reads every line (one line in memory at a time) and keeps only what is small: capacity
levels (a few per pool and minute), per-region request counts, the earliest and latest ``ts``,
and per segment a histogram of request values. Pass 2 reads the file again and bins request
arrivals into the simulator's steps, which needs the earliest ``ts`` that only pass 1 knows.
Memory is O(run length / step + capacity messages), whatever the number of requests.

Time
----
``t0`` is the earliest ``ts`` (the message's event time, docs/messages.md — not the envelope's Kafka
timestamp) of any capacity level or request used; the run lasts ``span = max ts − t0``; a
message at ``ts`` happens at scenario time ``t = ts − t0``. The scenario's ``duration_s``,
traffic, opportunistic traces and events are not used (preempt/grant/surge are in the
recording; a control outage has no place on the recording's clock).

Arrivals and rate
-----------------
A request at ``t`` arrives in step ``k = ⌊t/step_s⌋`` (the engine's own ``step_of``), so the
simulator's arrival counts per region and step *are* the recording's. Queues see a rate rather
than counts (sim/engine.py): the rate is the recorded count over windows of ``rate_window_s``
(10 s: at 40 rps the Poisson error of a window is 1/√400 = 5 %, at 300 rps 1.8 %, and a surge
shows within one window) placed at the windows' middles, linear in between — exactly what a
scenario's ``traffic.csv`` trace means, so ``scenario from-recording`` writes these points.

Capacity (newest ``ts`` wins, as on Kafka)
------------------------------------------
Each opportunistic ``(region, resource, hardware, remote)`` pool is a piecewise-constant level:
every message sets it at its ``t``, by the rules of the one capacity-level book every server
and controller keeps (:class:`headroom.defences.capacity.CapacityBook`): at the same ``t`` the
lower level wins (then the shorter lifetime; a grant stamped with a reclaim cannot hide it,
whatever the line order); a message whose ``ts`` is older than one already read still lands at
its own ``t`` (it never overrides a newer level). A level announced with ``expires_in_s`` that is
not announced again within that time drops to 0 when it lapses. Before a pool's first message
its level is 0.
Dedicated levels are counted but not used: dedicated capacity comes from the scenario.

Regions
-------
Regions are the recording's, in order of first appearance. A region the scenario does not list
is an error (exit 2) unless ``default_dedicated`` names a scenario region whose dedicated
capacity it then gets (``--default-dedicated REGION``).

Bad recordings
--------------
Nothing stops a run. Each problem is a :class:`ReplayIssue` (line, topic, partition, offset,
reason) of one :class:`IssueKind`, handled as the kind says:

* skipped — a corrupt line; a message that fails the contract (``headroom.streams.messages.decode``,
  tombstones included); a valid message the scenario model cannot hold (a segment the scenario
  does not declare, CPU capacity whose hardware is not ``any``, accelerator capacity of hardware
  ``any``); a duplicate (an offset at or below one already read in that topic-partition: the
  same record recorded twice);
* kept — a clock going backwards (a ``ts`` earlier than one already read for the same region on
  the same topic; used at its own ``ts``); a gap (no request of a region for longer than
  ``max(gap_min_s, gap_arrivals / mean rate)`` — 30 mean inter-arrival times, a silence a
  Poisson stream has a chance of e⁻³⁰ to produce; not filled: the simulator sees no arrivals
  there, as recorded).

:class:`ReplaySummary` counts every kind. Pure apart from reading the file: no wall clock, no
global random state (progress is reported by bytes read, through a callback).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import BinaryIO

import numpy as np
import numpy.typing as npt
import orjson

from headroom.defences.capacity import CapacityBook, CapacityLevel
from headroom.kernel.codec import ValidationError
from headroom.kernel.errors import ConfigError
from headroom.kernel.scenario import VALUE_GRID_ALPHA, VALUE_GRID_MIN, Point
from headroom.kernel.traces import PoolKey
from headroom.streams.messages import Capacity, Request, decode
from headroom.streams.recording import CorruptLine, Envelope, read_recording
from headroom.streams.topics import trailing_kind

__all__ = [
    "VALUE_ALPHA",
    "Handling",
    "IssueKind",
    "PoolRecord",
    "Recording",
    "ReplayConfig",
    "ReplayIssue",
    "ReplaySummary",
    "ValueGrid",
    "read_replay",
]

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]
ProgressFn = Callable[[int, int, int], None]  # (pass 1 or 2, bytes read, file size)

USED_KINDS = ("capacity", "requests")
# Values below V_MIN share one linear bin with the zeros; values above V_MAX are counted in the
# top bin. Request values are ad values in currency units: 1e-9 .. 1e12 covers every real one.
V_MIN = VALUE_GRID_MIN
VALUE_ALPHA = VALUE_GRID_ALPHA  # the value grid's relative bin width (a scenario's value.csv)
V_MAX = 1e12
_FLUSH = 65_536  # buffered values / step indices folded into numpy arrays at a time
_PROGRESS_EVERY = 4096  # lines between progress callbacks


# --------------------------------------------------------------------------------------------
# Configuration and reporting
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ReplayConfig:
    """How a recording is read; every default is explained in the module docstring."""

    step_s: float = 1.0  # must equal the simulator's step (SimConfig.step_s)
    rate_window_s: float = 10.0
    value_alpha: float = VALUE_ALPHA
    gap_min_s: float = 5.0
    gap_arrivals: float = 30.0
    backwards_tolerance_s: float = 0.0
    # A run longer than this is refused: a single message with a wild clock would otherwise
    # stretch the run (and its arrays) over years.
    max_span_s: float = 31 * 86_400.0
    max_reported: int = 20  # issues kept per kind for the report (all are counted)

    def __post_init__(self) -> None:
        problems = []
        for name in ("step_s", "rate_window_s", "gap_min_s", "gap_arrivals", "max_span_s"):
            v = getattr(self, name)
            if not (isinstance(v, int | float) and math.isfinite(v) and v > 0):
                problems.append(f"replay.{name}: must be a finite number > 0, got {v!r}")
        if not (isinstance(self.value_alpha, float) and 0.0 < self.value_alpha < 0.5):
            problems.append(f"replay.value_alpha: must lie in (0, 0.5), got {self.value_alpha!r}")
        tol = self.backwards_tolerance_s
        if not (isinstance(tol, int | float) and math.isfinite(tol) and tol >= 0):
            problems.append(f"replay.backwards_tolerance_s: must be >= 0, got {tol!r}")
        if not (isinstance(self.max_reported, int) and self.max_reported >= 0):
            problems.append(
                f"replay.max_reported: must be an integer >= 0, got {self.max_reported!r}"
            )
        if problems:
            raise ConfigError(problems)


class Handling(Enum):
    SKIPPED = "skipped"
    KEPT = "kept"


class IssueKind(Enum):
    """What can be wrong with a recording, and how each is handled (module docstring)."""

    CORRUPT_LINE = "corrupt line"
    INVALID_MESSAGE = "invalid message"
    NOT_REPLAYABLE = "not replayable"
    DUPLICATE = "duplicate record"
    CLOCK_BACKWARDS = "clock went backwards"
    GAP = "gap"

    @property
    def handling(self) -> Handling:
        if self in (IssueKind.CLOCK_BACKWARDS, IssueKind.GAP):
            return Handling.KEPT
        return Handling.SKIPPED


@dataclass(frozen=True, slots=True)
class ReplayIssue:
    kind: IssueKind
    line: int | None  # None: not tied to one line (a gap reaching the end of the recording)
    topic: str | None
    partition: int | None
    offset: int | None
    reason: str

    @property
    def handling(self) -> Handling:
        return self.kind.handling

    def __str__(self) -> str:
        where = f"line {self.line}" if self.line is not None else "end of recording"
        if self.topic is not None:
            where += f", {self.topic}"
            if self.partition is not None:
                where += f" partition {self.partition}"
            if self.offset is not None:
                where += f" offset {self.offset}"
        return f"{where}: {self.kind.value}: {self.reason} ({self.handling.value})"


@dataclass
class ReplaySummary:
    """What a recording held and what was made of it."""

    path: str
    lines: int = 0
    used: Counter[str] = field(default_factory=Counter)  # messages used, per topic kind
    ignored_topics: Counter[str] = field(default_factory=Counter)  # other topics, per name
    dedicated_levels: int = 0  # dedicated-pool capacity messages (not used: the scenario's)
    counts: Counter[IssueKind] = field(default_factory=Counter)
    issues: list[ReplayIssue] = field(default_factory=list)  # at most max_reported per kind
    requests_per_region: dict[str, int] = field(default_factory=dict)

    @property
    def skipped(self) -> int:
        return sum(n for k, n in self.counts.items() if k.handling is Handling.SKIPPED)

    def reported(self, kind: IssueKind) -> list[ReplayIssue]:
        return [i for i in self.issues if i.kind is kind]

    def lines_of_text(self) -> list[str]:
        """A short human summary (the CLI prints it on stderr)."""
        used = ", ".join(f"{n} {k}" for k, n in sorted(self.used.items())) or "nothing"
        out = [f"{self.path}: {self.lines} line(s); used {used}"]
        if self.ignored_topics:
            other = ", ".join(f"{t} ({n})" for t, n in sorted(self.ignored_topics.items()))
            out.append(f"  other topics, not used: {other}")
        if self.dedicated_levels:
            out.append(
                f"  {self.dedicated_levels} dedicated capacity level(s) not used "
                "(dedicated capacity comes from the scenario)"
            )
        for kind in IssueKind:
            n = self.counts.get(kind, 0)
            if n:
                out.append(f"  {kind.value}: {n} ({kind.handling.value})")
        out.append(f"  skipped: {self.skipped}")
        return out


# --------------------------------------------------------------------------------------------
# The value grid (shared by every segment, so a mixture is linear inside each bin)
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ValueGrid:
    """Bin 0 = [0, V_MIN) uniform; bin i ≥ 1 = [V_MIN·γ^(i−1), V_MIN·γ^i) log-uniform."""

    alpha: float
    edges: FloatArray  # (B + 1,)

    @classmethod
    def make(cls, alpha: float) -> ValueGrid:
        gamma = (1.0 + alpha) / (1.0 - alpha)
        n_log = math.ceil(math.log(V_MAX / V_MIN) / math.log(gamma))
        edges = np.concatenate([[0.0], V_MIN * gamma ** np.arange(n_log + 1)])
        return cls(alpha, edges)

    @property
    def n_bins(self) -> int:
        return int(self.edges.size - 1)

    def index(self, values: FloatArray) -> IntArray:
        v = np.asarray(values, dtype=np.float64)
        with np.errstate(divide="ignore"):
            i = np.floor(np.log(np.maximum(v, V_MIN) / V_MIN) / math.log(self._gamma)) + 1
        i = np.where(v < V_MIN, 0, i)
        return np.asarray(np.clip(i, 0, self.n_bins - 1), dtype=np.int64)

    @property
    def _gamma(self) -> float:
        return (1.0 + self.alpha) / (1.0 - self.alpha)

    def local(self, i: IntArray, v: FloatArray) -> FloatArray:
        """Position of ``v`` inside bin ``i`` in [0, 1] (linear in bin 0, logarithmic above)."""
        lo = self.edges[i]
        hi = self.edges[i + 1]
        with np.errstate(divide="ignore", invalid="ignore"):
            lin = (v - lo) / (hi - lo)
            lg = np.log(np.maximum(v, 1e-300) / np.maximum(lo, 1e-300)) / np.log(hi / lo)
        return np.asarray(np.clip(np.where(i == 0, lin, lg), 0.0, 1.0), dtype=np.float64)

    def at(self, i: IntArray, x: FloatArray) -> FloatArray:
        """The value at local position ``x`` of bin ``i`` (inverse of :meth:`local`)."""
        lo = self.edges[i]
        hi = self.edges[i + 1]
        with np.errstate(divide="ignore", invalid="ignore"):
            lg = lo * np.power(hi / np.maximum(lo, 1e-300), x)
        return np.asarray(np.where(i == 0, lo + x * (hi - lo), lg), dtype=np.float64)

    def power_integral(self, i: IntArray, a: FloatArray, b: FloatArray, j: int) -> FloatArray:
        """∫ vʲ dF over [a, b] inside bin ``i``, per unit of the bin's mass."""
        lo = self.edges[i]
        hi = self.edges[i + 1]
        with np.errstate(divide="ignore", invalid="ignore"):
            lin = (b ** (j + 1) - a ** (j + 1)) / ((j + 1) * (hi - lo))
            lg = (b**j - a**j) / (j * np.log(hi / np.maximum(lo, 1e-300)))
        return np.asarray(np.where(i == 0, lin, lg), dtype=np.float64)


# --------------------------------------------------------------------------------------------
# What a recording holds, once read
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PoolRecord:
    """One opportunistic pool's level changes (scenario seconds, strictly increasing)."""

    key: PoolKey
    points: tuple[Point, ...]
    expires_in_s: float | None  # the newest announced lifetime (None: never announced)
    messages: int


@dataclass(frozen=True, eq=False)
class Recording:
    """Everything the simulator needs from a recording (see :func:`read_replay`)."""

    path: str
    t0: float  # earliest ts used (epoch seconds) = scenario time 0
    span_s: float
    step_s: float
    rate_window_s: float
    segments: tuple[str, ...]
    regions: tuple[str, ...]  # in order of first appearance
    first_line: Mapping[str, int]  # region -> line of its first message
    arrivals: Mapping[str, IntArray]  # region -> requests per step
    rate_points: Mapping[str, tuple[Point, ...]]  # region -> (t_s, rps) at window middles
    pools: Mapping[str, tuple[PoolRecord, ...]]  # region -> its opportunistic pools
    value_counts: npt.NDArray[np.int64]  # (S, B) recorded values per segment and grid bin
    grid: ValueGrid
    eligible: int  # requests marked eligible
    summary: ReplaySummary
    # (S, 4) per segment, exact: sum of values, then over values > 0: count, Σ ln v, Σ (ln v)²
    value_sums: npt.NDArray[np.float64] = field(default_factory=lambda: np.zeros((0, 4)))

    @property
    def requests(self) -> int:
        return int(sum(int(a.sum()) for a in self.arrivals.values()))

    @property
    def n_steps(self) -> int:
        return max(1, math.ceil(self.span_s / self.step_s - 1e-9))

    @property
    def eligible_share(self) -> float | None:
        n = self.requests
        return self.eligible / n if n else None


# --------------------------------------------------------------------------------------------
# Reading
# --------------------------------------------------------------------------------------------


class _Lines:
    """A binary stream that counts the lines started and the bytes read, for the reader."""

    def __init__(self, raw: BinaryIO) -> None:
        self.raw = raw
        self.line = 0
        self.bytes = 0
        self._at_start = True

    def readline(self, size: int = -1) -> bytes:
        data = self.raw.readline(size)
        if data:
            if self._at_start:
                self.line += 1
            self._at_start = data.endswith(b"\n")
            self.bytes += len(data)
        return data


@dataclass(slots=True)
class _Item:
    line: int
    env: Envelope
    kind: str
    msg: Capacity | Request


class _Reader:
    """Both passes of :func:`read_replay` (one classification, so they agree line by line)."""

    def __init__(
        self, path: Path, segments: Sequence[str], cfg: ReplayConfig, progress: ProgressFn | None
    ) -> None:
        self.path = path
        self.cfg = cfg
        self.progress = progress
        self.segments = tuple(segments)
        self.seg_index = {s: i for i, s in enumerate(self.segments)}
        self.grid = ValueGrid.make(cfg.value_alpha)
        self.summary = ReplaySummary(path=str(path))
        # one bit per line skipped in pass 1, so that pass 2 skips the same lines without
        # validating every message again (bounded: 1 bit a line, only up to the last one)
        self._skipped = bytearray()
        self._kinds: dict[str, str | None] = {}
        try:
            self.size = path.stat().st_size
        except OSError as exc:
            raise ConfigError(f"--replay: {path}: cannot read: {exc.strerror or exc}") from None

    # -- shared -----------------------------------------------------------------------------

    def _issue(
        self,
        kind: IssueKind,
        line: int | None,
        env: Envelope | None,
        reason: str,
    ) -> None:
        s = self.summary
        s.counts[kind] += 1
        if line is not None and kind.handling is Handling.SKIPPED:
            byte = line >> 3
            if byte >= len(self._skipped):
                self._skipped.extend(bytes(byte + 1 - len(self._skipped) + 4096))
            self._skipped[byte] |= 1 << (line & 7)
        if s.counts[kind] <= self.cfg.max_reported:
            s.issues.append(
                ReplayIssue(
                    kind,
                    line,
                    env.topic if env else None,
                    env.partition if env else None,
                    env.offset if env else None,
                    reason,
                )
            )

    def _kind(self, topic: str) -> str | None:
        kind = self._kinds.get(topic, "")
        if kind == "":
            kind = self._kinds[topic] = trailing_kind(topic)
        return kind

    def _envelopes(self, pass_no: int) -> Iterator[tuple[int, Envelope | CorruptLine]]:
        """Every line's record (or corruption) with its line number; progress by bytes."""
        try:
            f = self.path.open("rb")
        except OSError as exc:
            raise ConfigError(
                f"--replay: {self.path}: cannot read: {exc.strerror or exc}"
            ) from None
        with f:
            lines = _Lines(f)
            # read_recording only calls readline, which _Lines provides
            for n, item in enumerate(read_recording(lines), start=1):  # type: ignore[arg-type]
                if self.progress is not None and n % _PROGRESS_EVERY == 0:
                    self.progress(pass_no, lines.bytes, self.size)
                yield (item.lineno if isinstance(item, CorruptLine) else lines.line), item
            if pass_no == 1:
                self.summary.lines = lines.line
            if self.progress is not None:
                self.progress(pass_no, lines.bytes, self.size)

    def _items(self) -> Iterator[_Item]:
        """Pass 1: the usable capacity and request messages; every problem reported."""
        last_offset: dict[tuple[str, int], int] = {}
        for line, item in self._envelopes(1):
            if isinstance(item, CorruptLine):
                self._issue(IssueKind.CORRUPT_LINE, line, None, item.reason)
                continue
            kind = self._kind(item.topic)
            if kind not in USED_KINDS:
                self.summary.ignored_topics[item.topic] += 1
                continue
            src = (item.topic, item.partition)
            last = last_offset.get(src)
            if last is not None and item.offset <= last:
                self._issue(
                    IssueKind.DUPLICATE,
                    line,
                    item,
                    f"offset {item.offset} is at or below offset {last} already read "
                    "from this partition (the same record recorded twice?)",
                )
                continue
            last_offset[src] = item.offset
            try:
                msg = decode(kind, item.payload)
            except ValidationError as exc:
                self._issue(IssueKind.INVALID_MESSAGE, line, item, str(exc))
                continue
            assert isinstance(msg, Capacity | Request)
            problem = self._not_replayable(msg)
            if problem is not None:
                self._issue(IssueKind.NOT_REPLAYABLE, line, item, problem)
                continue
            yield _Item(line, item, kind, msg)

    def _requests_again(self) -> Iterator[tuple[int, Envelope, float, str]]:
        """Pass 2: ``(line, envelope, ts, region)`` of every request pass 1 used.

        Pass 1 validated them, so only ``ts`` and ``region`` are read (a line pass 1 skipped
        is skipped by its bit; lines appended since pass 1 are not read)."""
        skipped = self._skipped
        n_skipped = len(skipped) * 8
        end = self.summary.lines
        for line, item in self._envelopes(2):
            if line > end:
                break
            if isinstance(item, CorruptLine) or self._kind(item.topic) != "requests":
                continue
            if line < n_skipped and skipped[line >> 3] & (1 << (line & 7)):
                continue
            try:
                obj = orjson.loads(item.payload or b"")
                ts = float(obj["ts"])
                region = obj["region"]
            except (orjson.JSONDecodeError, KeyError, TypeError, ValueError):
                continue  # the file changed since pass 1
            if region in self.req_count:
                yield line, item, ts, region

    def _not_replayable(self, msg: Capacity | Request) -> str | None:
        if isinstance(msg, Request):
            if msg.segment not in self.seg_index:
                return (
                    f"segment {msg.segment!r} is not one of the scenario's segments "
                    f"({', '.join(self.segments)})"
                )
            return None
        if msg.pool != "opportunistic":
            return None
        if msg.resource == "cpu" and msg.hardware != "any":
            return f"cpu capacity must have hardware 'any' in a scenario, got {msg.hardware!r}"
        if msg.resource == "accelerator" and msg.hardware == "any":
            return "accelerator capacity must name its hardware type, got 'any'"
        return None

    # -- pass 1 -----------------------------------------------------------------------------

    def pass1(self) -> None:
        cfg = self.cfg
        self.t_min = math.inf
        self.t_max = -math.inf
        self.t_min_line = self.t_max_line = 0
        self.regions: dict[str, int] = {}  # name -> first line
        self.req_count: Counter[str] = Counter()
        self.eligible = 0
        # pool key -> [(ts, line, units, expires_in_s)]
        self.points: dict[tuple[str, PoolKey], list[tuple[float, int, float, float | None]]] = {}
        self.value_counts = np.zeros((len(self.segments), self.grid.n_bins), dtype=np.int64)
        self.value_sums = np.zeros((len(self.segments), 4))
        buffers: list[list[float]] = [[] for _ in self.segments]
        newest: dict[tuple[str, str], float] = {}
        for it in self._items():
            msg = it.msg
            ts = msg.ts
            if isinstance(msg, Capacity) and msg.pool != "opportunistic":
                self.summary.dedicated_levels += 1
                continue
            self.summary.used[it.kind] += 1
            self.regions.setdefault(msg.region, it.line)
            key = (it.kind, msg.region)
            prev = newest.get(key)
            if prev is not None and ts < prev - cfg.backwards_tolerance_s:
                self._issue(
                    IssueKind.CLOCK_BACKWARDS,
                    it.line,
                    it.env,
                    f"ts {ts:.3f} is {prev - ts:.3f} s before a {it.kind} message of region "
                    f"{msg.region!r} already read; used at its own ts",
                )
            newest[key] = ts if prev is None else max(prev, ts)
            if ts < self.t_min:
                self.t_min, self.t_min_line = ts, it.line
            if ts > self.t_max:
                self.t_max, self.t_max_line = ts, it.line
            if isinstance(msg, Request):
                self.req_count[msg.region] += 1
                self.eligible += msg.eligible
                buf = buffers[self.seg_index[msg.segment]]
                buf.append(msg.value)
                if len(buf) >= _FLUSH:
                    self._fold_values(buffers)
            else:
                pool = PoolKey(msg.resource, msg.hardware, msg.remote)
                self.points.setdefault((msg.region, pool), []).append(
                    (ts, it.line, msg.units, msg.expires_in_s)
                )
        self._fold_values(buffers)

    def _fold_values(self, buffers: list[list[float]]) -> None:
        for s, buf in enumerate(buffers):
            if buf:
                v = np.asarray(buf)
                idx = self.grid.index(v)
                self.value_counts[s] += np.bincount(idx, minlength=self.grid.n_bins)
                lv = np.log(v[v > 0.0])
                self.value_sums[s] += (math.fsum(v), lv.size, math.fsum(lv), math.fsum(lv * lv))
                buf.clear()

    # -- pass 2 -----------------------------------------------------------------------------

    def pass2(self, t0: float, span: float) -> tuple[dict[str, IntArray], dict[str, IntArray]]:
        cfg = self.cfg
        step = cfg.step_s
        n_steps = max(1, math.ceil(span / step - 1e-9))
        w = cfg.rate_window_s
        n_win = max(1, math.ceil(span / w - 1e-9))
        names = list(self.regions)
        r_index = {r: i for i, r in enumerate(names)}
        steps = np.zeros((len(names), n_steps), dtype=np.int64)
        wins = np.zeros((len(names), n_win), dtype=np.int64)
        buf_r: list[int] = []
        buf_t: list[float] = []
        threshold = {
            r: max(cfg.gap_min_s, cfg.gap_arrivals * span / n) for r, n in self.req_count.items()
        }
        last = dict.fromkeys(self.req_count, 0.0)

        def flush() -> None:
            if not buf_r:
                return
            ri = np.asarray(buf_r, dtype=np.int64)
            t = np.asarray(buf_t, dtype=np.float64)
            k = np.clip((t / step + 1e-9).astype(np.int64), 0, n_steps - 1)
            np.add.at(steps, (ri, k), 1)
            b = np.clip((t / w + 1e-9).astype(np.int64), 0, n_win - 1)
            np.add.at(wins, (ri, b), 1)
            buf_r.clear()
            buf_t.clear()

        for line, env, ts, region in self._requests_again():
            t = ts - t0
            prev = last[region]
            if t > prev + threshold[region]:
                self._gap(region, prev, t, threshold[region], line, env)
            if t > prev:
                last[region] = t
            buf_r.append(r_index[region])
            buf_t.append(t)
            if len(buf_r) >= _FLUSH:
                flush()
        flush()
        for region, prev in last.items():
            if span - prev > threshold[region]:
                self._gap(region, prev, span, threshold[region], None, None)
        return (
            {r: steps[i] for i, r in enumerate(names)},
            {r: wins[i] for i, r in enumerate(names)},
        )

    def _gap(
        self,
        region: str,
        a: float,
        b: float,
        threshold: float,
        line: int | None,
        env: Envelope | None,
    ) -> None:
        self._issue(
            IssueKind.GAP,
            line,
            env,
            f"no request of region {region!r} for {b - a:.3f} s (t = {a:.3f} .. {b:.3f} s; "
            f"threshold {threshold:.3f} s); not filled: the simulator sees no arrivals there",
        )


def read_replay(
    path: str | Path,
    segments: Sequence[str],
    *,
    config: ReplayConfig | None = None,
    progress: ProgressFn | None = None,
) -> Recording:
    """Read a recording for the simulator, in two streaming passes (module docstring).

    ``segments``: the scenario's segment names (a request of another segment is skipped).
    Raises :class:`ConfigError` when the file cannot be read or holds nothing usable.
    """
    cfg = config or ReplayConfig()
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"--replay: {p}: no such file")
    reader = _Reader(p, segments, cfg, progress)
    reader.pass1()
    summary = reader.summary
    if not reader.regions:
        seen = ", ".join(sorted(summary.ignored_topics)) or "none"
        raise ConfigError(
            f"--replay: {p}: no usable headroom.capacity or headroom.requests message "
            f"({summary.lines} line(s); other topics: {seen}; skipped: {summary.skipped})"
        )
    t0 = reader.t_min
    span = reader.t_max - t0
    if not span > 0.0:
        raise ConfigError(
            f"--replay: {p}: every usable message has the same ts ({t0}): the recording spans "
            "no time"
        )
    if span > cfg.max_span_s:
        raise ConfigError(
            f"--replay: {p}: spans {span:.0f} s (earliest ts {reader.t_min} at line "
            f"{reader.t_min_line}, latest {reader.t_max} at line {reader.t_max_line}), over the "
            f"{cfg.max_span_s:.0f} s limit: a message with a wrong clock?"
        )
    arrivals, windows = reader.pass2(t0, span)
    summary.requests_per_region = {r: int(a.sum()) for r, a in arrivals.items()}
    rate_points = {r: _rate_points(wins, span, cfg.rate_window_s) for r, wins in windows.items()}
    pools: dict[str, list[PoolRecord]] = {r: [] for r in reader.regions}
    for (region, key), pts in sorted(
        reader.points.items(), key=lambda kv: (kv[0][0], kv[0][1].resource, kv[0][1].hardware,
                                               kv[0][1].remote)
    ):  # fmt: skip
        pools[region].append(_pool_record(key, pts, t0, span))
    return Recording(
        path=str(p),
        t0=t0,
        span_s=span,
        step_s=cfg.step_s,
        rate_window_s=cfg.rate_window_s,
        segments=tuple(segments),
        regions=tuple(reader.regions),
        first_line=dict(reader.regions),
        arrivals=arrivals,
        rate_points=rate_points,
        pools={r: tuple(v) for r, v in pools.items()},
        value_counts=reader.value_counts,
        grid=reader.grid,
        eligible=reader.eligible,
        summary=summary,
        value_sums=reader.value_sums,
    )


def _rate_points(counts: IntArray, span: float, w: float) -> tuple[Point, ...]:
    """(t_s, rps) at the middle of every rate window (the last may be shorter)."""
    starts = np.arange(counts.size) * w
    ends = np.minimum(starts + w, span)
    width = ends - starts
    if counts.size > 1 and width[-1] < 1e-6 * w:
        # a sliver of a last window: its requests belong to the one before
        counts = np.concatenate([counts[:-2], [counts[-2] + counts[-1]]])
        ends = np.concatenate([ends[:-2], [span]])
        starts = starts[:-1]
        width = ends - starts
    mids = starts + 0.5 * width
    rates = counts / width
    return tuple((float(t), float(r)) for t, r in zip(mids, rates, strict=True))


def _pool_record(
    key: PoolKey, pts: list[tuple[float, int, float, float | None]], t0: float, span: float
) -> PoolRecord:
    """The pool's level over time, as the one capacity-level book
    (:class:`headroom.defences.capacity.CapacityBook`) has it after each message: newest ts
    wins (at equal ts the lower level, then the shorter lifetime), an unrenewed lifetime lapses
    to 0 at ``ts + expires_in_s``."""
    pts = sorted(pts, key=lambda p: (p[0], p[1]))
    book = CapacityBook()
    book_key = (key.resource, key.hardware, "opportunistic", key.remote)
    changes: list[tuple[float, float]] = []
    for i, (ts, _line, units, expires) in enumerate(pts):
        t = ts - t0
        book.apply(
            CapacityLevel(
                resource=key.resource,  # type: ignore[arg-type]  # checked when read
                hardware=key.hardware,
                pool="opportunistic",
                units=units,
                expires_in_s=expires,
                remote=key.remote,
                ts=t,
            )
        )
        nxt = pts[i + 1][0] - t0 if i + 1 < len(pts) else math.inf
        if nxt == t:
            continue  # the book decides between the levels of one instant
        changes.append((t, book.units(book_key, t)))
        lapse = book.next_lapse(t)
        if lapse is not None and lapse < nxt and lapse <= span:
            changes.append((lapse, book.units(book_key, lapse)))
    dedup: list[Point] = []
    for t, level in changes:
        if not dedup or dedup[-1][1] != level:
            dedup.append((t, level))
    expires_seen = [p[3] for p in pts if p[3] is not None]
    return PoolRecord(
        key=key,
        points=tuple(dedup),
        expires_in_s=expires_seen[-1] if expires_seen else None,
        messages=len(pts),
    )
