"""Command-line shells around :mod:`headroom.sim.replay`.

``headroom scenario from-recording FILE --base SCENARIO --out NEW.yaml [--default-dedicated R]``
writes the scenario a recording implies: the base's ``slo``, ``world``, ``models`` and
``segments``, the recording's regions (dedicated capacity from the base, or from the base region
``R`` for a region the base does not list), its traffic as one CSV per region (``t_s,rps``) and
its opportunistic capacity as one CSV per region, resource, hardware and pool (``t_s,units``),
every CSV beside ``NEW.yaml``; ``duration_s`` is the recording's span. The file is loaded back
and compared with what was meant before the command reports success, so what it writes always
passes ``headroom scenario check``. Last stdout line: ``{"out":…,"regions":…,"requests":N,…}``.

:func:`replay_for_simulate` is what ``headroom simulate SCENARIO --replay FILE`` calls: it reads
the recording (progress bar on stderr), prints what was skipped, and returns the derived
scenario and the shared context for :func:`headroom.sim.run.run_simulation`.

Both print every problem of the recording on stderr (line, topic, partition, offset, reason;
at most :attr:`ReplayConfig.max_reported` per kind, then a count) and a summary; neither fails
because of them (exit 0): the summary says what was skipped.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any, TextIO

import orjson
import yaml

from headroom.kernel.errors import ConfigError, HeadroomError
from headroom.kernel.scenario import Control, Scenario, Segment
from headroom.kernel.traces import PoolKey
from headroom.sim.replay import (
    ReplayContext,
    derived_scenario,
    replay_context,
    scenario_regions_text,
)
from headroom.sim.replay_read import IssueKind, Recording, ReplayConfig, read_replay

__all__ = [
    "ReadProgress",
    "csv_names",
    "replay_for_simulate",
    "scenario_from_recording",
    "scenario_yaml",
    "write_derived",
]


class ReadProgress:
    """A one-line bar on a terminal stream: the share of the file read, per pass.

    Redrawn when the shown share moves by 0.5 % (no clock needed: reading drives it)."""

    WIDTH = 30

    def __init__(self, stream: TextIO, label: str, enabled: bool = True) -> None:
        self.stream = stream
        self.label = label
        self.enabled = enabled
        self._shown: tuple[int, int] | None = None

    def __call__(self, pass_no: int, done: int, total: int) -> None:
        if not self.enabled:
            return
        frac = done / total if total > 0 else 1.0
        key = (pass_no, int(frac * 200))
        if key == self._shown:
            return
        self._shown = key
        filled = int(frac * self.WIDTH)
        bar = "#" * filled + "-" * (self.WIDTH - filled)
        self.stream.write(f"\r[{bar}] {100 * frac:5.1f}%  {self.label} (pass {pass_no}/2) ")
        if pass_no == 2 and done >= total:
            self.stream.write("\n")
        self.stream.flush()


def report(recording: Recording, stream: TextIO, *, max_reported: int) -> None:
    """Every reported problem, then the summary, one line each, prefixed ``replay:``."""
    s = recording.summary
    for issue in s.issues:
        stream.write(f"replay: {issue}\n")
    for kind in IssueKind:
        more = s.counts.get(kind, 0) - min(s.counts.get(kind, 0), max_reported)
        if more > 0:
            stream.write(f"replay: ... and {more} more {kind.value}(s) not listed\n")
    for line in s.lines_of_text():
        stream.write(f"replay: {line}\n")
    stream.write(
        f"replay: t0 {recording.t0:.3f} (epoch s), span {recording.span_s:.3f} s, "
        f"{len(recording.regions)} region(s)\n"
    )
    for line in scenario_regions_text(recording):
        stream.write(f"replay: {line}\n")
    stream.flush()


# --------------------------------------------------------------------------------------------
# simulate --replay
# --------------------------------------------------------------------------------------------


def replay_for_simulate(args: argparse.Namespace, base: Scenario) -> tuple[Scenario, ReplayContext]:
    """The derived scenario and context of ``simulate BASE --replay FILE`` (``args.replay``,
    ``args.seed``, ``args.no_progress`` and, when present, ``args.default_dedicated``)."""
    path = Path(args.replay)
    cfg = ReplayConfig()
    progress = ReadProgress(
        sys.stderr, f"reading {path.name}", enabled=not getattr(args, "no_progress", False)
    )
    scenario, ctx = replay_context(
        base,
        path,
        seed=args.seed,
        replay_config=cfg,
        default_dedicated=getattr(args, "default_dedicated", None),
        progress=progress,
    )
    report(ctx.recording, sys.stderr, max_reported=cfg.max_reported)
    return scenario, ctx


# --------------------------------------------------------------------------------------------
# scenario from-recording
# --------------------------------------------------------------------------------------------


def csv_names(
    stem: str, recording: Recording
) -> tuple[dict[str, str], dict[str, str], dict[str, str], dict[tuple[str, PoolKey], str]]:
    """File names (beside the scenario) of every region's traffic, arrivals and pool CSV and of
    every segment's value histogram."""
    traffic = {r: f"{stem}.{r}.traffic.csv" for r in recording.regions}
    arrivals = {r: f"{stem}.{r}.arrivals.csv" for r in recording.regions}
    values = {s: f"{stem}.{s}.values.csv" for s in recording.segments}
    pools = {
        (r, p.key): f"{stem}.{r}.{p.key.resource}.{p.key.hardware}."
        f"{'remote' if p.key.remote else 'opportunistic'}.csv"
        for r in recording.regions
        for p in recording.pools[r]
    }
    return traffic, arrivals, values, pools


def _segment_yaml(s: Segment) -> dict[str, Any]:
    value: dict[str, Any] = {"mean": s.value.mean, "sigma": s.value.sigma}
    if s.value.csv:
        value["csv"] = s.value.csv
    seg: dict[str, Any] = {
        "name": s.name,
        "share": s.share,
        "value": value,
        "base_error": s.base_error,
        "strong_error": s.strong_error,
    }
    if s.return_rate_per_h is not None:
        seg["return_rate_per_h"] = s.return_rate_per_h
    return seg


def scenario_yaml(scenario: Scenario, header: str = "") -> str:
    """The scenario as YAML (docs/scenarios.md field names); traces by their ``csv`` names."""
    w = scenario.world
    world: dict[str, Any] = {
        "ads": w.ads,
        "dim": w.dim,
        "base_candidates": w.base_candidates,
        "max_candidates": w.max_candidates,
        "holdout": w.holdout,
    }
    if w.drift_per_h is not None:
        world["drift_per_h"] = w.drift_per_h
    if w.users is not None:
        world["users"] = w.users

    def model(m: Any) -> dict[str, Any]:
        return {
            "cpu_ms_per_candidate": m.cpu_ms_per_candidate,
            "accelerator_ms_per_candidate": m.accelerator_ms_per_candidate,
            "hardware": list(m.hardware),
            "load_s": m.load_s,
        }

    segments = [_segment_yaml(s) for s in scenario.segments]
    regions = []
    for r in scenario.regions:
        if r.traffic.csv is None:
            raise ValueError(f"region {r.name}: traffic has no csv name")
        pools = []
        for o in r.opportunistic:
            if o.csv is None:
                raise ValueError(f"region {r.name}: pool {o.resource}/{o.hardware} has no csv")
            pool: dict[str, Any] = {"resource": o.resource, "hardware": o.hardware, "csv": o.csv}
            if o.expires_in_s is not None:
                pool["expires_in_s"] = o.expires_in_s
            if o.remote:
                pool["remote"] = True
            pools.append(pool)
        traffic: dict[str, Any] = {"csv": r.traffic.csv}
        traffic.update({"arrivals": r.traffic.arrivals_csv} if r.traffic.arrivals_csv else {})
        region: dict[str, Any] = {
            "name": r.name,
            "dedicated": {
                "cpu": r.dedicated.cpu,
                "accelerator": r.dedicated.accelerator,
                "hardware": r.dedicated.hardware,
            },
            "traffic": traffic,
        }
        if pools:
            region["opportunistic"] = pools
        regions.append(region)
    doc = {
        "name": scenario.name,
        "seed": scenario.seed,
        "duration_s": scenario.duration_s,
        "slo": {"p99_ms": scenario.slo.p99_ms, "window_s": scenario.slo.window_s},
        "world": world,
        "models": {"base": model(scenario.models.base), "strong": model(scenario.models.strong)},
        "segments": segments,
        "regions": regions,
    }
    if scenario.eligible_share is not None:
        doc["eligible_share"] = scenario.eligible_share
    if scenario.control != Control():
        control: dict[str, Any] = {"interval_s": scenario.control.interval_s}
        if scenario.control.ttl_s is not None:
            control["ttl_s"] = scenario.control.ttl_s
        doc["control"] = control
    body = yaml.safe_dump(doc, sort_keys=False, allow_unicode=True, width=100)
    return header + body


def _csv(path: Path, columns: str, points: tuple[tuple[float, float], ...]) -> None:
    # repr() of a float reads back as the same float: the loaded trace equals the recorded one
    lines = [columns] + [f"{t!r},{v!r}" for t, v in points]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


def _counts_csv(path: Path, points: tuple[tuple[float, float], ...]) -> None:
    lines = ["t_s,requests"] + [f"{int(t)},{int(n)}" for t, n in points]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


def write_derived(
    base: Scenario,
    recording: Recording,
    out: Path,
    *,
    default_dedicated: str | None = None,
) -> Scenario:
    """Write ``out`` and its CSVs; return the scenario written (as it loads back)."""
    from headroom.kernel.scenario_load import ScenarioError, load_scenario

    silent = [r for r in recording.regions if not recording.arrivals[r].any()]
    if silent:
        raise ConfigError(
            [
                f"{recording.path}: region {r!r} (first at line {recording.first_line[r]}) has "
                "capacity levels but no request: a scenario region needs traffic; record "
                "headroom.requests as well"
                for r in silent
            ]
        )
    stem = out.stem
    traffic, arrivals, values, pools = csv_names(stem, recording)
    derived = derived_scenario(
        base,
        recording,
        default_dedicated=default_dedicated,
        name=_scenario_name(stem),
        traffic_csv=traffic,
        pool_csv=pools,
        arrivals_csv=arrivals,
        value_csv=values,
    )
    out.parent.mkdir(parents=True, exist_ok=True)
    for seg in derived.segments:
        if seg.value.csv is not None and seg.value.histogram is not None:
            rows = [f"{v!r},{int(n)}" for v, n in seg.value.histogram]
            (out.parent / seg.value.csv).write_text(
                "\n".join(["value,requests", *rows]) + "\n", encoding="utf-8"
            )
    for region in derived.regions:
        assert region.traffic.csv is not None
        assert region.traffic.trace is not None
        _csv(out.parent / region.traffic.csv, "t_s,rps", region.traffic.trace)
        if region.traffic.arrivals_csv is not None and region.traffic.arrivals is not None:
            _counts_csv(out.parent / region.traffic.arrivals_csv, region.traffic.arrivals)
        for o in region.opportunistic:
            assert o.csv is not None
            _csv(out.parent / o.csv, "t_s,units", o.trace)
    header = (
        f"# Derived by `headroom scenario from-recording` from {recording.path}\n"
        f"# (first ts {recording.t0!r} = scenario time 0, span {recording.span_s:.3f} s) with the\n"
        f"# slo, world and models of {base.source or base.name}; segment shares and values,\n"
        "# eligible share, traffic, arrivals per second and capacity from the recording. Traces\n"
        "# beside this file.\n"
    )
    out.write_text(scenario_yaml(derived, header), encoding="utf-8")
    try:
        loaded = load_scenario(out)
    except ScenarioError as exc:
        raise HeadroomError(
            f"scenario from-recording wrote {out}, which does not load (a bug): "
            + "; ".join(exc.problems)
        ) from None
    if loaded != derived:
        raise HeadroomError(f"scenario from-recording: {out} does not read back as written (a bug)")
    return loaded


def _scenario_name(stem: str) -> str:
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in stem)
    return safe[:64] or "recording"


def scenario_from_recording(args: argparse.Namespace) -> int:
    from headroom.kernel.scenario_load import load_scenario
    from headroom.kernel.settings import resolve_scenario

    base = load_scenario(resolve_scenario(args.base))
    out = Path(args.out)
    if out.exists() and out.is_dir():
        raise ConfigError(f"--out: {out} is a directory; give the scenario file to write")
    path = Path(args.file)
    cfg = ReplayConfig()
    progress = ReadProgress(sys.stderr, f"reading {path.name}", enabled=sys.stderr.isatty())
    recording = read_replay(path, [s.name for s in base.segments], config=cfg, progress=progress)
    report(recording, sys.stderr, max_reported=cfg.max_reported)
    written = write_derived(
        base, recording, out, default_dedicated=getattr(args, "default_dedicated", None)
    )
    files = [r.traffic.csv for r in written.regions]
    files += [r.traffic.arrivals_csv for r in written.regions if r.traffic.arrivals_csv]
    files += [s.value.csv for s in written.segments if s.value.csv]
    files += [o.csv for r in written.regions for o in r.opportunistic]
    print(
        orjson.dumps(
            {
                "out": str(out),
                "regions": [r.name for r in written.regions],
                "duration_s": written.duration_s,
                "t0": recording.t0,
                "requests": recording.requests,
                "capacity_levels": sum(
                    len(o.trace) for r in written.regions for o in r.opportunistic
                ),
                "skipped": recording.summary.skipped,
                "csv": files,
            }
        ).decode()
    )
    return 0
