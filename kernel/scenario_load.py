"""Load a scenario file (docs/scenarios.md) safely and validate it into
:mod:`headroom.kernel.scenario`.

Rules, in the order they are applied:

1. **Safe YAML only.** The text is parsed by PyYAML's ``SafeLoader`` (the loader behind
   ``yaml.safe_load``), extended in two ways that only *reject* more: a key repeated in one mapping
   is a problem (plain ``safe_load`` silently keeps the last one), and a document with more than
   :data:`MAX_ALIASES` aliases is refused (alias bombs). A tag such as ``!!python/object`` has no
   constructor in the safe loader, so it is reported as a problem and never executed.
2. **Every problem, not the first.** The whole document is walked and every problem is collected;
   the result is one :class:`ScenarioError` (a :class:`~headroom.kernel.errors.ConfigError`) whose
   ``problems`` are one line each, ``<field path>: <reason>``, e.g.
   ``regions[1].traffic.rps: must be > 0``. Commands print them and exit 2; no traceback.
3. **Unknown keys are rejected** ("unknown field"), with the closest known name when there is one,
   so a typo never turns into a silently ignored setting.
4. **Numbers are numbers**: a YAML bool (``true``) is not a number, and NaN and infinity are
   refused everywhere. Integers must be written as integers.
5. **Traces** — inline ``trace: [[t_s, value], …]`` or ``csv: FILE`` (columns ``t_s,rps`` for
   traffic, ``t_s,units`` for capacity; a relative path resolves against the scenario file's
   folder) — become tuples of ``(t_s, value)`` points, strictly increasing in time, with finite,
   non-negative values.
6. **Cross-field rules**: unique region and segment names; segment shares sum to 1 (±1e-6);
   ``slo.window_s <= control.interval_s <= control.ttl_s`` (a step shorter than an SLO window sees
   no new window; a target that expires before the next one arrives would make every client fall
   back between two steps);
   ``world.base_candidates <= world.max_candidates <= world.ads``; every event names a declared
   region and, for ``preempt``/``grant``, a declared opportunistic pool of that region; the
   dedicated accelerator type is one the base model runs on (the baseline must run there).

Events are returned sorted by ``at_s`` (a stable sort: events at the same instant keep file order).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, get_args

from headroom.kernel.checks import NAME_PATTERN, describe, one_line
from headroom.kernel.errors import ConfigError
from headroom.kernel.scenario import (
    FAULT_PROCESSES,
    MAX_SEED,
    Control,
    Dedicated,
    EventKind,
    Models,
    ModelSpec,
    Opportunistic,
    Point,
    Region,
    Scenario,
    ScenarioEvent,
    Segment,
    Slo,
    Traffic,
    ValueDist,
    World,
)
from headroom.kernel.scenario_fields import (
    KEYS,
    _Ctx,
    _enum,
    _integer,
    _list,
    _mapping,
    _number,
    _opt_bool,
    _opt_int,
    _opt_number,
    _req_int,
    _req_number,
    _string,
)
from headroom.kernel.scenario_files import (
    MAX_FILE_BYTES,
    _arrival_counts,
    _csv_trace,
    _inline_trace,
    _parse_yaml,
    _value_histogram,
)
from headroom.kernel.vocab import RESOURCES

__all__ = [
    "EVENT_KINDS",
    "KEYS",
    "MAX_BROKER_INDEX",
    "MAX_FILE_BYTES",
    "MAX_PROCESS_INDEX",
    "NAME_PATTERN",
    "RESOURCES",
    "SERVER_POOLS",
    "ScenarioError",
    "control_with_flags",
    "load_scenario",
    "load_scenario_text",
]

EVENT_KINDS: tuple[str, ...] = get_args(EventKind)  # the model's literal, in its order
SERVER_POOLS = ("dedicated", "opportunistic")
# the processes of a region (a kill or pause of one names its region); the others are run-wide
REGION_PROCESSES = ("server", "client", "precompute")
MAX_BROKER_INDEX = 63
MAX_PROCESS_INDEX = 63  # kill, pause, stall: index of a controller, client or server replica
INDEXED_PROCESSES = ("controller", "client", "server")  # several of a kind can run
SHARE_TOLERANCE = 1e-6  # docs/scenarios.md: "shares sum to 1"; float rounding of 0.1 + 0.2 + 0.7
MAX_ERROR = 10.0  # model error is relative to the utility spread; 10 spreads is pure noise


# The optional event fields each kind needs (required) or accepts (optional); others are refused.
EVENT_FIELDS: dict[str, tuple[frozenset[str], frozenset[str]]] = {
    "preempt": (frozenset({"region", "resource", "hardware", "units"}), frozenset({"remote"})),
    "grant": (frozenset({"region", "resource", "hardware", "units"}), frozenset({"remote"})),
    "surge": (frozenset({"region", "factor", "duration_s"}), frozenset()),
    "control_outage": (frozenset({"duration_s"}), frozenset({"region"})),
    # fault events: a region's process names its region (and a server its pool), checked in
    # _fault_fields
    "kill": (frozenset({"process", "restart_after_s"}), frozenset({"region", "pool", "index"})),
    "pause": (frozenset({"process", "duration_s"}), frozenset({"region", "pool", "index"})),
    # the controller's consumer stops fetching (checked in _fault_fields: a controller only)
    "stall": (frozenset({"process", "duration_s"}), frozenset({"index"})),
    "broker_restart": (frozenset({"down_s"}), frozenset({"broker"})),
    "capacity_silence": (frozenset({"duration_s"}), frozenset({"region"})),
}


class ScenarioError(ConfigError):
    """A scenario that failed validation.

    ``problems`` are the printable lines (prefixed with the file when there is one);
    ``field_problems`` the same lines without the file prefix, for tests and tools.
    """

    def __init__(self, field_problems: Iterable[str], source: str | None = None) -> None:
        self.field_problems: list[str] = [one_line(p) for p in field_problems]
        self.source = source
        prefix = f"{one_line(source)}: " if source else ""
        super().__init__([prefix + p for p in self.field_problems])


# ------------------------------------------------------------------------------------------------
# Public entry points


def load_scenario(path: str | Path) -> Scenario:
    """Read, parse and validate a scenario file; raise :class:`ScenarioError` with every problem."""
    p = Path(path)
    label = str(path)
    try:
        if not p.exists():
            raise ScenarioError(["no such file"], label)
        if not p.is_file():
            raise ScenarioError(["not a regular file"], label)
        size = p.stat().st_size
        if size > MAX_FILE_BYTES:
            raise ScenarioError([f"file is {size} bytes; the limit is {MAX_FILE_BYTES}"], label)
        raw = p.read_bytes()
    except OSError as exc:
        raise ScenarioError([f"cannot read: {exc.strerror or exc}"], label) from None
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise ScenarioError(
            [f"not a YAML text file (not UTF-8 at byte {exc.start})"], label
        ) from None
    return _load(text, p.resolve().parent, label)


def load_scenario_text(
    text: str, base_dir: str | Path | None = None, *, source: str | None = None
) -> Scenario:
    """Validate scenario YAML given as text; relative CSV paths resolve against ``base_dir``
    (default: the current directory). ``source`` labels the problems (default: none)."""
    base = Path(base_dir) if base_dir is not None else Path.cwd()
    return _load(text, base, source)


# ------------------------------------------------------------------------------------------------
# The walk


def _load(text: str, base_dir: Path, source: str | None) -> Scenario:
    if not text.strip():
        raise ScenarioError(["file is empty (expected a YAML mapping of scenario fields)"], source)
    doc, problem = _parse_yaml(text)
    if problem is not None:
        raise ScenarioError([problem], source)
    if doc is None:
        raise ScenarioError(["file is empty (expected a YAML mapping of scenario fields)"], source)
    if not isinstance(doc, dict):
        raise ScenarioError(
            [f"the top level must be a mapping of scenario fields, got {describe(doc)}"], source
        )
    ctx = _Ctx(base_dir)
    scenario = _scenario(ctx, doc, source)
    if ctx.problems or scenario is None:
        raise ScenarioError(ctx.problems or ["invalid scenario"], source)
    return scenario


def _scenario(ctx: _Ctx, doc: dict[Any, Any], source: str | None) -> Scenario | None:
    before = len(ctx.problems)
    m = _mapping(ctx, "", doc, "scenario")
    if m is None:
        return None
    name = _string(ctx, "name", m.get("name"), pattern=True) if "name" in m else None
    seed = _integer(ctx, "seed", m.get("seed"), ge=0, le=MAX_SEED) if "seed" in m else None
    duration = _number(ctx, "duration_s", m["duration_s"], gt=0) if "duration_s" in m else None
    slo = _slo(ctx, m["slo"]) if "slo" in m else None
    world = _world(ctx, m["world"]) if "world" in m else None
    models = _models(ctx, m["models"]) if "models" in m else None
    segments = _segments(ctx, m["segments"]) if "segments" in m else None
    regions = _regions(ctx, m["regions"], models) if "regions" in m else None
    events: tuple[ScenarioEvent, ...] = ()
    if "events" in m and m["events"] is not None:
        names = set(_raw_names(m.get("regions")))
        events = _events(ctx, m["events"], names, regions, duration) or ()
    control = _control(ctx, m["control"], slo) if m.get("control") is not None else Control()
    eligible = (
        _number(ctx, "eligible_share", m["eligible_share"], ge=0, le=1)
        if "eligible_share" in m
        else None
    )
    if regions is not None and duration is not None:
        for i, r in enumerate(regions):
            late = [t for t, _ in r.traffic.arrivals or () if t >= duration]
            if late:
                ctx.add(
                    f"regions[{i}].traffic.arrivals",
                    f"{r.traffic.arrivals_csv}: second {late[0]:g} is at or after the end of the "
                    f"run (duration_s {duration:g})",
                )
    if slo is not None and control.interval_s < slo.window_s and m.get("control") is None:
        ctx.add(
            "control.interval_s",
            f"the default ({control.interval_s:g}) is shorter than slo.window_s "
            f"({slo.window_s:g}); give a control interval of at least one SLO window",
        )
    if len(ctx.problems) != before:
        return None
    assert name is not None
    assert seed is not None
    assert duration is not None
    assert slo is not None
    assert world is not None
    assert models is not None
    assert segments is not None
    assert regions is not None
    return Scenario(
        name=name,
        seed=seed,
        duration_s=duration,
        slo=slo,
        world=world,
        models=models,
        segments=segments,
        regions=regions,
        events=tuple(sorted(events, key=lambda e: e.at_s)),
        control=control,
        source=source,
        eligible_share=eligible,
    )


def _control(ctx: _Ctx, value: Any, slo: Slo | None) -> Control:
    m = _mapping(ctx, "control", value, "control")
    if m is None:
        return Control()
    interval = _opt_number(ctx, "control", m, "interval_s", gt=0, nullable=False)
    ttl = _opt_number(ctx, "control", m, "ttl_s", gt=0, nullable=False)
    out = Control() if interval is None else Control(interval_s=interval)
    if slo is not None and out.interval_s < slo.window_s:
        ctx.add(
            "control.interval_s",
            f"must be >= slo.window_s ({slo.window_s:g}): the control plane judges p99 per SLO "
            f"window, and a step shorter than one sees no new window, got {out.interval_s:g}",
        )
        return out
    if ttl is not None and ttl < out.interval_s:
        ctx.add(
            "control.ttl_s",
            f"must be >= control.interval_s ({out.interval_s:g}): a target must live until the "
            f"next one arrives, got {ttl:g}",
        )
        return out
    return out.with_overrides(ttl_s=ttl)


def control_with_flags(
    control: Control,
    interval_s: float | None = None,
    ttl_s: float | None = None,
    *,
    window_s: float | None = None,
) -> Control:
    """The scenario's ``control`` settings with ``--interval`` / ``--ttl`` in place of the file's
    (None: not given), ``window_s`` the scenario's SLO window (the shortest interval). Raises
    :class:`ConfigError` naming the flag at fault."""
    problems: list[str] = []
    for flag, v in (("--interval", interval_s), ("--ttl", ttl_s)):
        if v is not None and not (
            isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v) and v > 0
        ):
            problems.append(f"{flag}: must be a finite number > 0, got {v!r}")
    if problems:
        raise ConfigError(problems)
    out = control.with_overrides(interval_s, ttl_s)
    if interval_s is not None and window_s is not None and interval_s < window_s:
        raise ConfigError(
            f"--interval: must be >= the scenario's slo.window_s ({window_s:g} s): a control step "
            f"shorter than an SLO window sees no new window, got {interval_s:g}"
        )
    if out.target_ttl_s < out.interval_s:
        if ttl_s is not None:
            raise ConfigError(
                f"--ttl: must be >= the control interval ({out.interval_s:g} s), got {ttl_s:g}"
            )
        raise ConfigError(
            f"--interval: must be <= the scenario's control.ttl_s ({out.target_ttl_s:g} s), "
            f"got {out.interval_s:g} (give --ttl as well)"
        )
    return out


def _slo(ctx: _Ctx, value: Any) -> Slo | None:
    n = len(ctx.problems)
    m = _mapping(ctx, "slo", value, "slo")
    if m is None:
        return None
    p99 = _req_number(ctx, "slo", m, "p99_ms", gt=0)
    window = _req_number(ctx, "slo", m, "window_s", gt=0)
    if len(ctx.problems) != n or p99 is None or window is None:
        return None
    return Slo(p99_ms=p99, window_s=window)


def _world(ctx: _Ctx, value: Any) -> World | None:
    n = len(ctx.problems)
    m = _mapping(ctx, "world", value, "world")
    if m is None:
        return None
    ads = _req_int(ctx, "world", m, "ads", ge=1, le=10_000_000)
    dim = _req_int(ctx, "world", m, "dim", ge=1, le=4096)
    base = _req_int(ctx, "world", m, "base_candidates", ge=1)
    top = _req_int(ctx, "world", m, "max_candidates", ge=1)
    holdout = _req_number(ctx, "world", m, "holdout", gt=0, lt=1)
    drift = _opt_number(ctx, "world", m, "drift_per_h", ge=0, lt=1)
    users = _opt_int(ctx, "world", m, "users", ge=1, le=2**31)
    if ads is not None and dim is not None and ads * dim > 200_000_000:
        ctx.add("world", f"ads × dim = {ads * dim} embedding values; the limit is 200,000,000")
    if base is not None and top is not None and base > top:
        ctx.add("world.max_candidates", f"must be >= world.base_candidates ({base}), got {top}")
    if top is not None and ads is not None and top > ads:
        ctx.add("world.max_candidates", f"must be <= world.ads ({ads}), got {top}")
    if len(ctx.problems) != n:
        return None
    assert ads is not None
    assert dim is not None
    assert base is not None
    assert top is not None
    assert holdout is not None
    return World(
        ads=ads,
        dim=dim,
        base_candidates=base,
        max_candidates=top,
        holdout=holdout,
        drift_per_h=drift,
        users=users,
    )


def _models(ctx: _Ctx, value: Any) -> Models | None:
    m = _mapping(ctx, "models", value, "models")
    if m is None:
        return None
    base = _model(ctx, "models.base", m["base"]) if "base" in m else None
    strong = _model(ctx, "models.strong", m["strong"]) if "strong" in m else None
    if base is None or strong is None:
        return None
    return Models(base=base, strong=strong)


def _model(ctx: _Ctx, path: str, value: Any) -> ModelSpec | None:
    n = len(ctx.problems)
    m = _mapping(ctx, path, value, "model")
    if m is None:
        return None
    cpu = _req_number(ctx, path, m, "cpu_ms_per_candidate", ge=0)
    acc = _req_number(ctx, path, m, "accelerator_ms_per_candidate", ge=0)
    load_s = _opt_number(ctx, path, m, "load_s", ge=0, nullable=False)
    hardware: tuple[str, ...] | None = None
    if "hardware" in m:
        hardware = _hardware_list(ctx, f"{path}.hardware", m["hardware"])
    if cpu is not None and acc is not None and cpu == 0 and acc == 0:
        ctx.add(
            path,
            "a model must cost something: cpu_ms_per_candidate and "
            "accelerator_ms_per_candidate are both 0",
        )
    if len(ctx.problems) != n or cpu is None or acc is None or hardware is None:
        return None
    return ModelSpec(
        cpu_ms_per_candidate=cpu,
        accelerator_ms_per_candidate=acc,
        hardware=hardware,
        load_s=0.0 if load_s is None else load_s,
    )


def _hardware_list(ctx: _Ctx, path: str, value: Any) -> tuple[str, ...] | None:
    if not isinstance(value, list):
        ctx.add(path, f"must be a list of accelerator type names, got {describe(value)}")
        return None
    if not value:
        ctx.add(path, "must name at least one accelerator type")
        return None
    out: list[str] = []
    ok = True
    for i, item in enumerate(value):
        s = _string(ctx, f"{path}[{i}]", item, pattern=True)
        if s is None:
            ok = False
        elif s == "any":
            ctx.add(f"{path}[{i}]", "'any' names CPU capacity; list accelerator types")
            ok = False
        elif s in out:
            ctx.add(f"{path}[{i}]", f"duplicate accelerator type {s!r}")
            ok = False
        else:
            out.append(s)
    return tuple(out) if ok else None


def _segments(ctx: _Ctx, value: Any) -> tuple[Segment, ...] | None:
    items = _list(ctx, "segments", value, nonempty=True)
    if items is None:
        return None
    n = len(ctx.problems)
    out: list[Segment] = []
    for i, item in enumerate(items):
        seg = _segment(ctx, f"segments[{i}]", item)
        if seg is not None:
            out.append(seg)
    _duplicates(ctx, "segments", "segment", items)
    if len(ctx.problems) == n:
        total = math.fsum(s.share for s in out)
        if abs(total - 1.0) > SHARE_TOLERANCE:
            ctx.add("segments", f"shares must sum to 1 (±{SHARE_TOLERANCE:g}), got {total:.9g}")
    return tuple(out) if len(ctx.problems) == n else None


def _segment(ctx: _Ctx, path: str, value: Any) -> Segment | None:
    n = len(ctx.problems)
    m = _mapping(ctx, path, value, "segment")
    if m is None:
        return None
    name = _string(ctx, f"{path}.name", m["name"], pattern=True) if "name" in m else None
    share = _req_number(ctx, path, m, "share", gt=0, le=1)
    dist = _value_dist(ctx, f"{path}.value", m["value"]) if "value" in m else None
    base_error = _req_number(ctx, path, m, "base_error", ge=0, le=MAX_ERROR)
    strong_error = _req_number(ctx, path, m, "strong_error", ge=0, le=MAX_ERROR)
    rate = _opt_number(ctx, path, m, "return_rate_per_h", ge=0, le=3600)
    if len(ctx.problems) != n:
        return None
    assert name is not None
    assert share is not None
    assert dist is not None
    assert base_error is not None
    assert strong_error is not None
    return Segment(
        name=name,
        share=share,
        value=dist,
        base_error=base_error,
        strong_error=strong_error,
        return_rate_per_h=rate,
    )


def _value_dist(ctx: _Ctx, path: str, value: Any) -> ValueDist | None:
    m = _mapping(ctx, path, value, "value")
    if m is None:
        return None
    mean = _req_number(ctx, path, m, "mean", gt=0)
    sigma = _req_number(ctx, path, m, "sigma", ge=0, le=5)
    csv_name: str | None = None
    histogram: tuple[Point, ...] | None = None
    if "csv" in m:
        csv_name = _string(ctx, f"{path}.csv", m["csv"])
        if csv_name is None:
            return None
        histogram = _value_histogram(ctx, f"{path}.csv", csv_name)
        if histogram is None:
            return None
    if mean is None or sigma is None:
        return None
    return ValueDist(mean=mean, sigma=sigma, csv=csv_name, histogram=histogram)


def _regions(ctx: _Ctx, value: Any, models: Models | None) -> tuple[Region, ...] | None:
    items = _list(ctx, "regions", value, nonempty=True)
    if items is None:
        return None
    n = len(ctx.problems)
    out: list[Region] = []
    for i, item in enumerate(items):
        region = _region(ctx, f"regions[{i}]", item, models)
        if region is not None:
            out.append(region)
    _duplicates(ctx, "regions", "region", items)
    return tuple(out) if len(ctx.problems) == n else None


def _raw_names(items: Any) -> dict[str, int]:
    """Name -> first index, from the raw list (so cross-checks work even when an item is bad)."""
    names: dict[str, int] = {}
    if isinstance(items, list):
        for i, item in enumerate(items):
            if isinstance(item, dict) and isinstance(item.get("name"), str):
                names.setdefault(item["name"], i)
    return names


def _duplicates(ctx: _Ctx, path: str, what: str, items: list[Any]) -> None:
    first = _raw_names(items)
    for i, item in enumerate(items):
        name = item.get("name") if isinstance(item, dict) else None
        if isinstance(name, str) and first[name] != i:
            ctx.add(
                f"{path}[{i}].name",
                f"duplicate {what} name {name!r} (also {path}[{first[name]}])",
            )


def _region(ctx: _Ctx, path: str, value: Any, models: Models | None) -> Region | None:
    n = len(ctx.problems)
    m = _mapping(ctx, path, value, "region")
    if m is None:
        return None
    name = _string(ctx, f"{path}.name", m["name"], pattern=True) if "name" in m else None
    dedicated = (
        _dedicated(ctx, f"{path}.dedicated", m["dedicated"], models) if ("dedicated" in m) else None
    )
    traffic = _traffic(ctx, f"{path}.traffic", m["traffic"]) if "traffic" in m else None
    pools: list[Opportunistic] = []
    if "opportunistic" in m and m["opportunistic"] is not None:
        items = _list(ctx, f"{path}.opportunistic", m["opportunistic"], nonempty=False)
        seen: dict[tuple[str, str, bool], int] = {}
        for j, item in enumerate(items or []):
            ppath = f"{path}.opportunistic[{j}]"
            pool = _opportunistic(ctx, ppath, item)
            if pool is None:
                continue
            key = (pool.resource, pool.hardware, pool.remote)
            if key in seen:
                ctx.add(
                    ppath,
                    f"duplicate pool {pool.resource}/{pool.hardware}"
                    f"{' (remote)' if pool.remote else ''} "
                    f"(also {path}.opportunistic[{seen[key]}]); merge their traces",
                )
                continue
            seen[key] = j
            pools.append(pool)
    if len(ctx.problems) != n:
        return None
    assert name is not None
    assert dedicated is not None
    assert traffic is not None
    return Region(name=name, dedicated=dedicated, traffic=traffic, opportunistic=tuple(pools))


def _dedicated(ctx: _Ctx, path: str, value: Any, models: Models | None) -> Dedicated | None:
    n = len(ctx.problems)
    m = _mapping(ctx, path, value, "dedicated")
    if m is None:
        return None
    cpu = _req_number(ctx, path, m, "cpu", gt=0)
    acc = _req_number(ctx, path, m, "accelerator", gt=0)
    hw = _string(ctx, f"{path}.hardware", m["hardware"], pattern=True) if "hardware" in m else None
    if hw == "any":
        ctx.add(f"{path}.hardware", "must name the accelerator type of the dedicated replicas")
    elif hw is not None and models is not None and hw not in models.base.hardware:
        ctx.add(
            f"{path}.hardware",
            f"{hw!r} is not in models.base.hardware {list(models.base.hardware)}: the baseline "
            "could not run on the dedicated replicas",
        )
    if len(ctx.problems) != n:
        return None
    assert cpu is not None
    assert acc is not None
    assert hw is not None
    return Dedicated(cpu=cpu, accelerator=acc, hardware=hw)


def _traffic(ctx: _Ctx, path: str, value: Any) -> Traffic | None:
    n = len(ctx.problems)
    m = _mapping(ctx, path, value, "traffic")
    if m is None:
        return None
    given = [k for k in ("rps", "csv", "trace") if k in m]
    if len(given) != 1:
        ctx.add(
            path,
            "needs exactly one of rps (synthetic rate), csv (trace file) or trace (inline points)"
            + (f", got {', '.join(given)}" if given else ""),
        )
        return None
    synthetic = given[0] == "rps"
    if not synthetic:
        for k in ("daily_amplitude", "peak_s", "period_s"):
            if k in m:
                ctx.add(f"{path}.{k}", f"applies only to a synthetic rate (rps), not to {given[0]}")
    rps = _req_number(ctx, path, m, "rps", gt=0) if synthetic else None
    amplitude = _opt_number(ctx, path, m, "daily_amplitude", ge=0, le=1, nullable=False)
    peak = _opt_number(ctx, path, m, "peak_s", nullable=False)
    period = _opt_number(ctx, path, m, "period_s", gt=0, nullable=False)
    noise = _opt_number(ctx, path, m, "noise", ge=0, le=1, nullable=False)
    csv_name: str | None = None
    trace: tuple[Point, ...] | None = None
    if given[0] == "csv":
        csv_name = _string(ctx, f"{path}.csv", m["csv"])
        if csv_name is not None:
            trace = _csv_trace(ctx, f"{path}.csv", csv_name, ("t_s", "rps"))
    elif given[0] == "trace":
        trace = _inline_trace(ctx, f"{path}.trace", m["trace"], "rps")
    if trace is not None and all(v == 0 for _, v in trace):
        where = f"{path}.csv" if csv_name else f"{path}.trace"
        ctx.add(where, "every rate is 0: the region would receive no traffic")
    arrivals_csv: str | None = None
    arrivals: tuple[Point, ...] | None = None
    if "arrivals" in m:
        arrivals_csv = _string(ctx, f"{path}.arrivals", m["arrivals"])
        if arrivals_csv is not None:
            arrivals = _arrival_counts(ctx, f"{path}.arrivals", arrivals_csv)
    if len(ctx.problems) != n:
        return None
    return Traffic(
        rps=rps,
        daily_amplitude=0.0 if amplitude is None else amplitude,
        peak_s=0.0 if peak is None else peak,
        period_s=86400.0 if period is None else period,
        noise=0.0 if noise is None else noise,
        csv=csv_name,
        trace=trace,
        arrivals_csv=arrivals_csv,
        arrivals=arrivals,
    )


def _opportunistic(ctx: _Ctx, path: str, value: Any) -> Opportunistic | None:
    n = len(ctx.problems)
    m = _mapping(ctx, path, value, "opportunistic")
    if m is None:
        return None
    resource = _enum(ctx, f"{path}.resource", m["resource"], RESOURCES) if "resource" in m else None
    hw = _string(ctx, f"{path}.hardware", m["hardware"], pattern=True) if "hardware" in m else None
    if resource == "cpu" and hw is not None and hw != "any":
        ctx.add(f"{path}.hardware", f"must be 'any' for cpu capacity, got {hw!r}")
    if resource == "accelerator" and hw == "any":
        ctx.add(f"{path}.hardware", "must name the accelerator type (e.g. gpu-b), not 'any'")
    expires = _opt_number(ctx, path, m, "expires_in_s", gt=0)
    remote = _opt_bool(ctx, path, m, "remote")
    given = [k for k in ("trace", "csv") if k in m]
    trace: tuple[Point, ...] | None = None
    csv_name: str | None = None
    if len(given) != 1:
        ctx.add(
            path,
            "needs exactly one of trace (inline points) or csv (trace file)"
            + (", got both" if len(given) == 2 else ""),
        )
    elif given[0] == "trace":
        trace = _inline_trace(ctx, f"{path}.trace", m["trace"], "units")
    else:
        csv_name = _string(ctx, f"{path}.csv", m["csv"])
        if csv_name is not None:
            trace = _csv_trace(ctx, f"{path}.csv", csv_name, ("t_s", "units"))
    if len(ctx.problems) != n:
        return None
    assert resource is not None
    assert hw is not None
    assert trace is not None
    return Opportunistic(
        resource=resource,  # type: ignore[arg-type]  # checked against RESOURCES
        hardware=hw,
        trace=trace,
        expires_in_s=expires,
        remote=bool(remote),
        csv=csv_name,
    )


def _events(
    ctx: _Ctx,
    value: Any,
    names: set[str],
    regions: tuple[Region, ...] | None,
    duration: float | None,
) -> tuple[ScenarioEvent, ...] | None:
    """``names``: every region name in the file (checked even when a region itself is invalid);
    ``regions``: the validated regions, or None when any was invalid (pools are then unchecked)."""
    items = _list(ctx, "events", value, nonempty=False)
    if items is None:
        return None
    out: list[ScenarioEvent] = []
    by_name = {r.name: r for r in regions} if regions is not None else None
    for i, item in enumerate(items):
        event = _event(ctx, f"events[{i}]", item, names, by_name, duration)
        if event is not None:
            out.append(event)
    return tuple(out)


def _event(
    ctx: _Ctx,
    path: str,
    value: Any,
    names: set[str],
    regions: Mapping[str, Region] | None,
    duration: float | None,
) -> ScenarioEvent | None:
    n = len(ctx.problems)
    m = _mapping(ctx, path, value, "event")
    if m is None:
        return None
    at_s = _req_number(ctx, path, m, "at_s", ge=0)
    if at_s is not None and duration is not None and at_s > duration:
        ctx.add(f"{path}.at_s", f"{at_s:g} is after the end of the run (duration_s {duration:g})")
    kind = _enum(ctx, f"{path}.kind", m["kind"], EVENT_KINDS) if "kind" in m else None
    if kind is None:
        return None
    _event_keys(ctx, path, m, kind)
    region = _event_region(ctx, path, m, names)
    resource = hardware = None
    units = factor = duration_s = None
    if "resource" in m and m["resource"] is not None:
        resource = _enum(ctx, f"{path}.resource", m["resource"], RESOURCES)
    if "hardware" in m and m["hardware"] is not None:
        hardware = _string(ctx, f"{path}.hardware", m["hardware"], pattern=True)
    if "units" in m and m["units"] is not None:
        units = _number(ctx, f"{path}.units", m["units"], ge=0)
    if "factor" in m and m["factor"] is not None:
        factor = _number(ctx, f"{path}.factor", m["factor"], gt=0)
    if "duration_s" in m and m["duration_s"] is not None:
        duration_s = _number(ctx, f"{path}.duration_s", m["duration_s"], gt=0)
    remote = _opt_bool(ctx, path, m, "remote") if "remote" in m else None
    process, pool, restart_after_s, down_s, broker = _fault_fields(ctx, path, m, kind)
    index = _fault_index(ctx, path, m, process)
    if (
        kind in ("preempt", "grant")
        and len(ctx.problems) == n
        and regions is not None
        and region is not None
        and region in regions
    ):
        _event_pool(ctx, path, kind, regions[region], resource, hardware, remote)
    if len(ctx.problems) != n:
        return None
    assert at_s is not None
    return ScenarioEvent(
        at_s=at_s,
        kind=kind,  # type: ignore[arg-type]  # checked against EVENT_KINDS
        region=region,
        resource=resource,  # type: ignore[arg-type]  # checked against RESOURCES
        hardware=hardware,
        units=units,
        factor=factor,
        duration_s=duration_s,
        remote=bool(remote),
        process=process,  # type: ignore[arg-type]  # checked against FAULT_PROCESSES
        pool=pool,
        restart_after_s=restart_after_s,
        down_s=down_s,
        broker=broker,
        index=index,
    )


def _fault_index(ctx: _Ctx, path: str, m: Mapping[str, Any], process: str | None) -> int | None:
    """``index`` of a kill, pause or stall: which of several controllers, clients of the region or
    replicas of the server pool (0-based); only those processes can run several times."""
    index = _opt_int(ctx, path, m, "index", ge=0, le=MAX_PROCESS_INDEX)
    if index is not None and process is not None and process not in INDEXED_PROCESSES:
        ctx.add(f"{path}.index", f"the {process} runs once: no index")
    return index


def _fault_fields(
    ctx: _Ctx, path: str, m: Mapping[str, Any], kind: str
) -> tuple[str | None, str | None, float | None, float | None, int | None]:
    """The fields of a fault event (docs/scenarios.md, *Fault events*): ``process`` (a kill or
    pause), ``pool`` (a server's), ``restart_after_s``, ``down_s`` and ``broker``. A region's
    process (server, client, precompute) names its region; the controller and the feed are
    run-wide and take none; a server names its pool, no other process does."""
    process = pool = None
    restart_after_s = down_s = None
    broker = None
    if m.get("process") is not None:
        process = _enum(ctx, f"{path}.process", m["process"], FAULT_PROCESSES)
    if m.get("pool") is not None:
        pool = _enum(ctx, f"{path}.pool", m["pool"], SERVER_POOLS)
    if m.get("restart_after_s") is not None:
        restart_after_s = _number(ctx, f"{path}.restart_after_s", m["restart_after_s"], gt=0)
    if m.get("down_s") is not None:
        down_s = _number(ctx, f"{path}.down_s", m["down_s"], gt=0)
    broker = _opt_int(ctx, path, m, "broker", ge=0, le=MAX_BROKER_INDEX)
    if kind == "stall" and process is not None and process != "controller":
        ctx.add(f"{path}.process", f"a stall is of the controller's consumer, not the {process}")
    if kind in ("kill", "pause") and process is not None:
        if process in REGION_PROCESSES and m.get("region") is None:
            ctx.add(f"{path}.region", f"required for a {kind} of a {process}")
        elif process not in REGION_PROCESSES and m.get("region") is not None:
            ctx.add(f"{path}.region", f"not allowed for a {kind} of the {process} (run-wide)")
        if process == "server" and m.get("pool") is None:
            ctx.add(
                f"{path}.pool", f"required for a {kind} of a server (dedicated or opportunistic)"
            )
        elif process != "server" and m.get("pool") is not None:
            ctx.add(f"{path}.pool", f"only a server has a pool, not the {process}")
    return process, pool, restart_after_s, down_s, broker


def _event_keys(ctx: _Ctx, path: str, m: Mapping[str, Any], kind: str) -> None:
    """The fields a ``kind`` event requires are there; the event fields it does not take are
    not."""
    required, optional = EVENT_FIELDS[kind]
    for key in sorted(required):
        if key not in m or (m[key] is None and key != "region"):
            ctx.add(f"{path}.{key}", f"required for a {kind} event")
    if "region" in required and "region" in m and m["region"] is None:
        ctx.add(f"{path}.region", f"required for a {kind} event")
    for key in sorted(set(m) - required - optional - {"at_s", "kind"}):
        if isinstance(key, str) and key in KEYS["event"][1]:
            ctx.add(f"{path}.{key}", f"not allowed for a {kind} event")


def _event_region(ctx: _Ctx, path: str, m: Mapping[str, Any], names: set[str]) -> str | None:
    """The event's region, if it names one: a region of the file."""
    if m.get("region") is None:
        return None
    region = _string(ctx, f"{path}.region", m["region"], pattern=True)
    if region is not None and region not in names:
        known = ", ".join(sorted(names)) or "none"
        ctx.add(f"{path}.region", f"unknown region {region!r} (regions: {known})")
    return region


def _event_pool(
    ctx: _Ctx,
    path: str,
    kind: str,
    region: Region,
    resource: str | None,
    hardware: str | None,
    remote: bool | None,
) -> None:
    """A preempt or grant event acts on an opportunistic pool the region declares."""
    pools = region.opportunistic
    if not any(
        p.resource == resource and p.hardware == hardware and p.remote == bool(remote)
        for p in pools
    ):
        have = ", ".join(
            f"{p.resource}/{p.hardware}{' (remote)' if p.remote else ''}" for p in pools
        )
        ctx.add(
            path,
            f"region {region.name!r} has no opportunistic {resource}/{hardware}"
            f"{' (remote)' if remote else ''} pool to {kind} (it has: {have or 'none'}); "
            "declare the pool (a trace of [[0, 0]] if it starts empty)",
        )
