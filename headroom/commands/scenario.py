"""``headroom scenario schema`` and ``headroom scenario check FILE`` (README.md, *Commands*).

``check`` exits 0 and prints one summary line when the file is valid; otherwise it exits 2 and
prints one line per problem on stderr, ``headroom: FILE: <field path>: <reason>``.
``schema`` prints the JSON Schema (draft 2020-12) of scenario files on stdout.
"""

from __future__ import annotations

import argparse
import json
import sys

from headroom.kernel.scenario import Region, Scenario
from headroom.kernel.scenario_load import load_scenario
from headroom.kernel.settings import resolve_scenario


def scenario_schema(args: argparse.Namespace) -> int:
    from headroom.kernel.scenario_schema import SCHEMA

    json.dump(SCHEMA, sys.stdout, indent=2, ensure_ascii=False)
    sys.stdout.write("\n")
    return 0


def scenario_check(args: argparse.Namespace) -> int:
    # a file, else a shipped scenario's name; ScenarioError/ConfigError -> exit 2, a line a problem
    scenario = load_scenario(resolve_scenario(args.file))
    print(summary(scenario, args.file))
    return 0


def summary(scenario: Scenario, path: str) -> str:
    """The one-line OK summary of a valid scenario."""
    pools = sum(len(r.opportunistic) for r in scenario.regions)
    hours = scenario.duration_s / 3600
    parts = [
        f"{path}: OK",
        f"scenario {scenario.name!r}",
        f"seed {scenario.seed}",
        f"{hours:g} h",
        f"{len(scenario.regions)} region{'s' if len(scenario.regions) != 1 else ''}",
        f"{len(scenario.segments)} segment{'s' if len(scenario.segments) != 1 else ''}",
        f"{pools} opportunistic pool{'s' if pools != 1 else ''}",
        f"{len(scenario.events)} event{'s' if len(scenario.events) != 1 else ''}",
        "precompute " + ("on" if scenario.precompute_enabled else "off"),
    ]
    util = baseline_peak_utilisation(scenario)
    cpu = max(u[0] for u in util.values())
    acc = max(u[1] for u in util.values())
    parts.append(f"baseline at peak: CPU {cpu:.0%}, accelerator {acc:.0%} of dedicated")
    return ", ".join(parts)


def peak_rps(scenario: Scenario, region: Region) -> float:
    """The region's peak request rate before events: rps·(1 + a) for a synthetic rate (the cycle
    peaks once per period), else the trace's maximum."""
    traffic = region.traffic
    if traffic.trace is not None:
        return max(v for _, v in traffic.trace)
    assert traffic.rps is not None
    return traffic.rps * (1.0 + traffic.daily_amplitude)


def baseline_peak_utilisation(scenario: Scenario) -> dict[str, tuple[float, float]]:
    """Per region, (CPU, accelerator) share of dedicated capacity the baseline uses at peak:
    peak rps × base_candidates × the base model's ms per candidate / (1000 × dedicated units).
    docs/scenarios.md asks reference scenarios to sit at 60-85%."""
    n = scenario.world.base_candidates
    base = scenario.models.base
    out: dict[str, tuple[float, float]] = {}
    for region in scenario.regions:
        rps = peak_rps(scenario, region)
        cpu = rps * n * base.cpu_ms_per_candidate / 1000.0 / region.dedicated.cpu
        acc = rps * n * base.accelerator_ms_per_candidate / 1000.0 / region.dedicated.accelerator
        out[region.name] = (cpu, acc)
    return out
