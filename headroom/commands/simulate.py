"""``headroom simulate SCENARIO [--policy P]… [--seed N] [--interval S] [--ttl S] [--replay FILE]
[--out DIR] …``.

The command-line shell around :func:`headroom.sim.run.run_simulation`: it loads and validates the
scenario (a bad one exits 2 with one line per problem, from the loader), puts ``--interval`` and
``--ttl`` in place of its ``control`` section (the control plane's clock), with ``--replay``
derives the run from a recording (:mod:`headroom.commands.sim_replay`, docs/replay.md), chooses the
output directory (default ``runs/<scenario>-<UTC time>/``), shows a progress bar on stderr, prints
the summary (verdict, table, failed checks), the checks' result and, as its last line, the path of
the report (``metrics.json`` with ``--no-plots``). This shell is the one place of the simulator
that reads the wall clock: for the default directory name, the progress bar and
``run.finished.wall_s``.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

from headroom.kernel.errors import ConfigError

if TYPE_CHECKING:
    from headroom.kernel.scenario import Scenario

__all__ = ["Progress", "default_out_dir", "simulate"]


def default_out_dir(scenario_name: str, now: float | None = None) -> Path:
    """``runs/<scenario>-<UTC time>/`` (seconds resolution, sortable)."""
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(now))
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in scenario_name) or "scenario"
    return Path("runs") / f"{safe}-{stamp}"


class Progress:
    """A one-line progress bar on a terminal stream, redrawn at most ~10 times a second."""

    WIDTH = 30

    def __init__(self, stream: TextIO, policies: list[str], enabled: bool = True) -> None:
        self.stream = stream
        self.policies = policies
        self.enabled = enabled
        self._last = 0.0

    def __call__(self, policy: str, done: int, total: int) -> None:
        if not self.enabled:
            return
        now = time.monotonic()
        if done < total and now - self._last < 0.1:
            return
        self._last = now
        k = self.policies.index(policy) if policy in self.policies else 0
        frac = (k + done / max(total, 1)) / max(len(self.policies), 1)
        filled = int(frac * self.WIDTH)
        bar = "#" * filled + "-" * (self.WIDTH - filled)
        self.stream.write(f"\r[{bar}] {100 * frac:5.1f}%  {policy:<12} ")
        if done >= total and k == len(self.policies) - 1:
            self.stream.write("\n")
        self.stream.flush()


def simulate(args: argparse.Namespace) -> int:
    from headroom.kernel.scenario_load import control_with_flags, load_scenario
    from headroom.kernel.settings import resolve_scenario
    from headroom.sim.policies import parse_policies

    policies = parse_policies(args.policy)
    scenario = load_scenario(resolve_scenario(args.scenario))
    # --interval / --ttl in place of the scenario's control section (every central policy)
    control = control_with_flags(
        scenario.control,
        getattr(args, "interval", None),
        getattr(args, "ttl", None),
        window_s=scenario.slo.window_s,
    )
    scenario = dataclasses.replace(scenario, control=control)
    replayed = None
    if getattr(args, "replay", None):  # a recording drives the run (sim/replay.py)
        from headroom.commands.sim_replay import replay_for_simulate

        scenario, replayed = replay_for_simulate(args, scenario)
    out_dir = Path(args.out) if args.out else default_out_dir(scenario.name)
    if out_dir.exists() and not out_dir.is_dir():
        raise ConfigError(f"--out: {out_dir} exists and is not a directory")

    from headroom.sim.run import build_context, run_simulation

    seed = args.seed
    print(
        f"simulate: {scenario.name} ({scenario.duration_s:g} s, {len(scenario.regions)} "
        f"region(s)), seed {seed if seed is not None else scenario.seed}, policies "
        f"{', '.join(policies)}, control every {control.interval_s:g} s (targets live "
        f"{control.target_ttl_s:g} s)",
        file=sys.stderr,
    )
    jobs = getattr(args, "jobs", None)
    _warn_if_long(scenario, policies, jobs)
    ctx = replayed if replayed is not None else build_context(scenario, seed=seed)
    _print_costs(scenario, seed)
    progress = Progress(sys.stderr, policies, enabled=not args.no_progress)
    result = run_simulation(
        scenario,
        policies,
        out_dir,
        context=ctx,
        plots=not args.no_plots,
        progress=progress,
        clock=time.perf_counter,
        jobs=jobs,
    )
    from headroom.analysis.table import closing_lines, format_table

    print(format_table(result.metrics))
    paths: list[tuple[str, object]] = [
        ("events", result.events_path),
        ("metrics", result.metrics_path),
    ]
    if result.report_path is not None:
        paths.append(("report", result.report_path))
    print("\n".join(closing_lines(result.metrics, paths)))
    return 0


# a run expected to take longer than this says so at start, with its estimate
LONG_RUN_S = 60.0


def _warn_if_long(scenario: Scenario, policies: list[str], jobs: int | None = None) -> None:
    """Say at start how long a run expected to take over :data:`LONG_RUN_S` will take, and how
    large its event log will be (:func:`headroom.sim.runtime.estimate_run`)."""
    from headroom.sim.runtime import estimate_run

    est = estimate_run(scenario, policies, jobs=jobs)
    if est.wall_s > LONG_RUN_S:
        print(
            f"simulate: this run is expected to take {est.describe()} ({len(policies)} "
            f"policies x {len(scenario.regions)} region(s) x {scenario.duration_s:g} simulated s, "
            "at the speed measured on a 2-core machine); fewer --policy flags or a shorter "
            "scenario run faster",
            file=sys.stderr,
            flush=True,
        )


def _print_costs(scenario: object, seed: int | None) -> None:
    """The real per-candidate compute of the ranking world beside the scenario's declared cost."""
    try:
        from headroom.world.curves import measure_cost

        m = measure_cost(scenario, seed=seed, repeats=5)  # type: ignore[arg-type]
    except Exception as exc:  # the run does not depend on it: say so and go on
        print(f"simulate: could not measure the world's compute cost: {exc}", file=sys.stderr)
        return
    models = scenario.models  # type: ignore[attr-defined]
    print(
        "simulate: accelerator ms per candidate, declared (measured on this machine): "
        f"base {models.base.accelerator_ms_per_candidate:g} ({m.base_ms_per_candidate:.4f}), "
        f"strong {models.strong.accelerator_ms_per_candidate:g} "
        f"({m.strong_ms_per_candidate:.4f}); retrieval "
        f"{m.retrieval_ms_per_candidate:.4f} ms per candidate",
        file=sys.stderr,
    )
