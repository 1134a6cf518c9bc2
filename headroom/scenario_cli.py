"""``headroom scenario schema`` and ``headroom scenario check FILE`` (CONTRACT §4).

``check`` exits 0 and prints one summary line when the file is valid; otherwise it exits 2 and
prints one line per problem on stderr, ``headroom: FILE: <field path>: <reason>``.
``schema`` prints the JSON Schema (draft 2020-12) of scenario files on stdout.
"""

from __future__ import annotations

import argparse
import json
import sys

from headroom.scenario import Scenario
from headroom.scenario_load import load_scenario


def scenario_schema(args: argparse.Namespace) -> int:
    from headroom.scenario_schema import SCHEMA

    json.dump(SCHEMA, sys.stdout, indent=2, ensure_ascii=False)
    sys.stdout.write("\n")
    return 0


def scenario_check(args: argparse.Namespace) -> int:
    scenario = load_scenario(args.file)  # ScenarioError -> exit 2, one line per problem
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
    return ", ".join(parts)
