"""``headroom bench``: run the benchmarks of BENCHMARKS.md and print one JSON document.

Each ``bench/bench_*.py`` module exposes ``BENCHMARKS``: a mapping from benchmark name to a
function ``fn(ctx: BenchContext) -> BenchResult``. The runner discovers the modules, runs the
selected benchmarks one after another (never in parallel: these machines have two cores), and
writes ``{"machine": {...}, "benchmarks": {NAME: {...}}}``.

A benchmark that needs a broker and finds none reports ``{"skipped": "<reason>"}`` instead of a
value; it never fails the run.
"""

from __future__ import annotations

import argparse
import importlib
import os
import pkgutil
import platform
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import orjson

from headroom.kernel.errors import ConfigError


@dataclass
class BenchContext:
    quick: bool = False  # fewer iterations: a smoke run, not a measurement
    bootstrap: str | None = None  # a reachable broker, or None
    prefix: str = "headroom."
    command: str = "headroom bench"


@dataclass
class BenchResult:
    value: float | None
    unit: str
    goal: float | None = None
    baseline: float | None = None
    ratio: float | None = None
    skipped: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def to_json(self, command: str) -> dict[str, Any]:
        out: dict[str, Any] = {"value": self.value, "unit": self.unit, "command": command}
        if self.goal is not None:
            out["goal"] = self.goal
        if self.baseline is not None:
            out["baseline"] = self.baseline
        if self.ratio is not None:
            out["ratio"] = self.ratio
        if self.skipped is not None:
            out["skipped"] = self.skipped
        out.update(self.extra)
        return out


BenchFn = Callable[[BenchContext], BenchResult]


def discover() -> dict[str, BenchFn]:
    import headroom.bench as bench

    found: dict[str, BenchFn] = {}
    for info in sorted(pkgutil.iter_modules(bench.__path__), key=lambda i: i.name):
        if not info.name.startswith("bench_"):
            continue
        module = importlib.import_module(f"headroom.bench.{info.name}")
        for name, fn in getattr(module, "BENCHMARKS", {}).items():
            if name in found:
                raise RuntimeError(f"benchmark {name!r} is declared twice")
            found[name] = fn
    return found


def machine() -> dict[str, Any]:
    return {
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


def _reachable_bootstrap(args: argparse.Namespace) -> str | None:
    """The broker's address, with the ``--kafka-config`` settings installed for every client."""
    from headroom.kernel.settings import default_state_dir, resolve_bootstrap
    from headroom.streams import security

    flag = getattr(args, "bootstrap", None)
    local = flag is None and not os.environ.get("KAFKA_BOOTSTRAP_SERVERS")
    security.install(
        security.resolve(
            getattr(args, "kafka_config", None), default_state_dir() if local else None
        )
    )
    try:
        return resolve_bootstrap(flag)
    except ConfigError:
        return None


def bench(args: argparse.Namespace) -> int:
    from headroom.kernel.settings import resolve_prefix

    available = discover()
    names: list[str] = []
    for item in args.only or []:
        names.extend(n for n in item.split(",") if n)
    unknown = [n for n in names if n not in available]
    if unknown:
        raise ConfigError(
            [
                f"--only: unknown benchmark {n!r} (known: {', '.join(sorted(available))})"
                for n in unknown
            ]
        )
    selected = names or sorted(available)
    ctx = BenchContext(
        quick=bool(args.quick),
        bootstrap=_reachable_bootstrap(args),
        prefix=resolve_prefix(args.prefix),
    )
    results: dict[str, Any] = {}
    for name in selected:
        command = f"headroom bench --only {name}"
        print(f"bench: {name} ...", file=sys.stderr, flush=True)
        try:
            result = available[name](ctx)
        except Exception as exc:  # a broken benchmark is reported, the others still run
            result = BenchResult(
                value=None, unit="", skipped=f"failed: {type(exc).__name__}: {exc}"
            )
        results[name] = result.to_json(command)
    doc = {"machine": machine(), "benchmarks": results}
    text = orjson.dumps(doc, option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS).decode()
    print(text)
    if args.out:
        with open(args.out, "w") as fh:
            fh.write(text + "\n")
    return 0
