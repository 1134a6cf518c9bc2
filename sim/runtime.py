"""What a simulation run will cost before it starts: wall time and event-log size.

``headroom simulate`` prints the estimate when the run is expected to take more than a minute,
and :func:`headroom.sim.run.run_simulation` compresses the event log of a run whose plain log
would exceed :data:`COMPRESS_ABOVE_BYTES` (docs/analysis.md, *Event log size*).

**Wall time** = Σ over the policies of ``simulated seconds × regions × cost(policy)``, divided
by the cores the regions' processes run on (:mod:`headroom.sim.fanout`), + the
analysis of the log afterwards (``window lines × ANALYSIS_S_PER_LINE``) + a fixed start-up
(:data:`START_S`: the world's value curves, the run's context and the oracle's bound). The engine's
work is per SLO window and region (a fixed number of latency samples, one fluid-model pass), so
the cost scales with simulated time × regions, not with the request rate; the policies differ by
how often they act (AIMD and gradient adjust a client-side limit from the health of every step).

Basis of the figures: measured on the development machine (2 cores, shared with other jobs: load
2–7 during the runs) with ``headroom simulate scenarios/diurnal-3region.yaml --no-plots``
(86,400 s × 3 regions, every policy), twice: 15 min 31 s and 12 min 46 s in all. The cost of a
policy is the mean of its two ``run.finished.wall_s``, divided by 259,200 region-seconds; one
policy's two figures differ by up to 3× with the machine's load. ``headroom simulate quickstart``
(3,600 s, 1 region, a lighter load) took 9 s (estimate: 31 s). An idle or faster machine finishes
sooner; the estimate is meant to be right within a factor of about two, enough to warn before a
ten-minute run.

**Log size** = window lines (SLO windows × regions × policies) × :data:`BYTES_PER_WINDOW_LINE`
(plain JSON with packed sketches, measured on the first three hours of diurnal-3region with its
nine policies and scaled to the day: 419 MB for 233,280 window lines, about 90 % of it window
lines), divided by :data:`GZIP_RATIO` when compressed.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from headroom.kernel.scenario import Scenario
from headroom.sim.fanout import default_jobs, usable_cores

__all__ = [
    "BYTES_PER_WINDOW_LINE",
    "COMPRESS_ABOVE_BYTES",
    "RunEstimate",
    "estimate_run",
]

# wall seconds per simulated second and region, per policy (module docstring: basis)
COST_S_PER_REGION_S: dict[str, float] = {
    "static": 1.64e-4,  # 43 s and 43 s for the day (two runs)
    "greedy": 1.85e-4,  # 34 s, 62 s
    "central-only": 1.70e-4,  # 22 s, 65 s
    "aimd": 8.5e-4,  # 249 s, 191 s
    "gradient": 9.8e-4,  # 298 s, 209 s
    "headroom": 4.4e-4,  # 155 s, 75 s
    "oracle": 3.6e-4,  # 90 s, 97 s
}
DEFAULT_COST = max(COST_S_PER_REGION_S.values())  # a policy not measured: the slowest
# metrics from the log, per window line: `analyze` read the day's 181,440 lines in 10 s
ANALYSIS_S_PER_LINE = 0.6e-4
START_S = 20.0  # the value curves (cached after the first run of a world), context, oracle bound
# plain JSON with packed sketches: 1,800 B a line over the first 3 h of diurnal-3region's nine
# policies, the other kinds included (419 MB for the day's 233,280 window lines)
BYTES_PER_WINDOW_LINE = 1_800
GZIP_RATIO = 5.8  # zlib level 6 on that log: 419 MB -> 71.9 MB
# a plain log larger than this is written gzip-compressed: every run of a simulated day is, a
# one-hour run of every policy (quickstart: ~6 MB) stays plain text
COMPRESS_ABOVE_BYTES = 32 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class RunEstimate:
    """What a run is expected to cost."""

    wall_s: float  # wall-clock seconds, simulation and analysis
    window_lines: int
    plain_bytes: int  # the event log as plain JSON lines
    compress: bool  # whether run_simulation compresses the log (plain_bytes above the limit)

    @property
    def log_bytes(self) -> int:
        """The event log as written (compressed when :attr:`compress`)."""
        return round(self.plain_bytes / GZIP_RATIO) if self.compress else self.plain_bytes

    def describe(self) -> str:
        """``about 12 min, event log ~75 MB (gzip)`` for a terminal."""
        minutes = self.wall_s / 60.0
        took = f"{minutes:.0f} min" if minutes >= 2 else f"{self.wall_s:.0f} s"
        size = f"~{self.log_bytes / 1e6:.0f} MB" + (" (gzip)" if self.compress else "")
        return f"about {took}, event log {size}"


def estimate_run(
    scenario: Scenario,
    policies: Sequence[str],
    *,
    duration_s: float | None = None,
    jobs: int | None = None,
) -> RunEstimate:
    """The expected cost of simulating ``policies`` on ``scenario`` (``duration_s``: the simulated
    span when it is not the scenario's, e.g. a replayed recording's; ``jobs``: the processes
    simulating the regions, None for :func:`headroom.sim.fanout.default_jobs`). The regions' work
    is spread over as many cores as there are processes and regions, at most the usable cores."""
    span = float(scenario.duration_s if duration_s is None else duration_s)
    regions = len(scenario.regions)
    windows = max(1, math.ceil(span / scenario.slo.window_s - 1e-9))
    lines = windows * regions * len(policies)
    sim_s = sum(COST_S_PER_REGION_S.get(p, DEFAULT_COST) for p in policies) * span * regions
    procs = default_jobs(regions) if jobs is None else jobs
    sim_s /= max(1, min(procs, regions, usable_cores()))
    wall = START_S + sim_s + lines * ANALYSIS_S_PER_LINE
    plain = lines * BYTES_PER_WINDOW_LINE
    return RunEstimate(
        wall_s=wall, window_lines=lines, plain_bytes=plain, compress=plain > COMPRESS_ABOVE_BYTES
    )
