"""Where headroom's missing value goes: a decomposition of the gap to the oracle policy.

``python -m headroom.bench.value_gap SCENARIO [--seed N] [--policy P]`` runs ``P`` (default
``headroom``) and the ``oracle`` policy side by side through
:func:`headroom.sim.run.run_simulation` (exactly what ``headroom simulate`` does) and splits the
difference of their incremental value, window by window, two ways:

* **by lever** — RMA, SBM, precompute and the change in the baseline's own time-outs (``lost``:
  ``value_lost`` of the window lines), from the window lines' ``inc`` fields;
* **by phase** — each window of a region falls in the first phase that applies:

  - ``outage``: the fail-safe's span of a ``control_outage`` — from the moment the policy's last
    targets before the outage expire (their issue plus the target lifetime; never before the
    outage starts) until the policy issues targets again after it ends (or one control interval
    plus a target lifetime after the end, if it issues none). Both policies run the baseline in
    it but for the regain; the windows before the old targets expire run them as usual and fall
    in the phases below;
  - ``start-up``: before the policy's first targets that differ from the baseline in that region
    (the levers are not proven yet);
  - ``after capacity change``: from a ``preempt`` or ``grant`` event of the region (or any region
    for a ``control_outage``) to ``load_s`` of the strong model plus two control intervals later;
  - ``learning``: the targets in force (the policy's last ``target.issued`` of the region before
    the window) name a live lever in ``explored``: the allocator had not proven it, so it held
    only its exploration share (docs/controllers.md, *Guardrails*);
  - ``steady``: every other window.

It also prints the gap between the feasible bound and the oracle policy (what the engine's real
queues cost a clairvoyant plan), so the columns add up to ``feasible_bound − policy``. A window
is compared only when both policies wrote it. No figure here is tuned: it reads the event log.
"""

from __future__ import annotations

import argparse
import tempfile
from bisect import bisect_left, bisect_right
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from headroom.analysis.events import EventLog
from headroom.kernel.scenario import Scenario
from headroom.kernel.scenario_load import load_scenario
from headroom.kernel.vocab import LIVE_LEVERS

LEVERS = ("rma", "sbm", "precompute", "lost")
PHASES = ("start-up", "after capacity change", "outage", "learning", "steady")


def _spans(
    scenario: Scenario, region: str, issued: Sequence[tuple[float, bool]]
) -> dict[str, list[tuple[float, float]]]:
    """The ``outage`` and ``after capacity change`` spans of ``region``, for a policy that
    issued its targets there at the (sorted) times of ``issued``."""
    interval = scenario.control.interval_s
    load = scenario.models.strong.load_s
    out: dict[str, list[tuple[float, float]]] = {
        "outage": _outage_spans(scenario, issued),
        "after capacity change": [],
    }
    for e in scenario.events:
        if e.kind in ("preempt", "grant") and (e.region in (None, region)):
            out["after capacity change"].append((e.at_s, e.at_s + load + 2 * interval))
    return out


@dataclass
class _Log:
    """What the decomposition reads from an event log."""

    # (policy, region, window start) -> incremental value by lever, with ``lost``
    wins: dict[tuple[str, str, float], dict[str, float]] = field(default_factory=dict)
    # per region, the start of the policy's first window with targets other than the baseline
    first_target: dict[str, float] = field(default_factory=dict)
    # per region, (scenario time issued, a live lever unproven) of the policy's targets
    issued: dict[str, list[tuple[float, bool]]] = field(default_factory=lambda: defaultdict(list))
    bounds: dict[str, float] = field(default_factory=dict)


def _read(events: Path, policy: str, n0: int) -> _Log:
    log = _Log()
    t_zero: float | None = None
    for e in EventLog(events):  # plain or gzip-compressed
        kind = e.get("kind")
        pol = e.get("policy")
        if kind == "oracle.bound" and pol == "oracle":
            for k in ("feasible_bound", "oracle_incremental"):
                if isinstance(e.get(k), int | float):
                    log.bounds[k] = float(e[k])
        elif kind == "run.started" and isinstance(e.get("t0"), int | float):
            t_zero = float(e["t0"])
        elif kind == "target.issued" and pol == policy and t_zero is not None:
            unproven = any(lv in LIVE_LEVERS for lv in e.get("explored") or ())
            log.issued[str(e.get("region"))].append((float(e["ts"]) - t_zero, unproven))
        elif kind == "window" and pol in (policy, "oracle"):
            region = str(e["region"])
            t0 = float(e["t_start"])
            inc = {k: float(v or 0.0) for k, v in (e.get("inc") or {}).items()}
            inc["lost"] = float(e.get("value_lost") or 0.0)
            log.wins[(pol, region, t0)] = inc
            tg = e.get("targets") or {}
            changed = tg.get("rma_candidates", n0) != n0 or (tg.get("sbm_coverage") or 0.0) > 0
            if pol == policy and region not in log.first_target and changed:
                log.first_target[region] = t0
    for decisions in log.issued.values():
        decisions.sort()
    return log


def _outage_spans(
    scenario: Scenario, issued: Sequence[tuple[float, bool]]
) -> list[tuple[float, float]]:
    """Per ``control_outage``, the span of its fail-safe for a policy that issued targets at
    the (sorted) times of ``issued`` (the module docstring's ``outage`` phase)."""
    ttl = scenario.control.target_ttl_s
    times = [t for t, _ in issued]
    out = []
    for e in scenario.events:
        if e.kind != "control_outage":
            continue
        end = e.at_s + (e.duration_s or 0.0)
        i = bisect_right(times, e.at_s)
        start = e.at_s if i == 0 else max(e.at_s, times[i - 1] + ttl)
        j = bisect_left(times, end)
        cap = end + ttl + scenario.control.interval_s
        out.append((start, min(times[j], cap) if j < len(times) else cap))
    return out


def _phase(spans: dict[str, list[tuple[float, float]]], log: _Log, region: str, t0: float) -> str:
    if any(a <= t0 < b for a, b in spans["outage"]):
        return "outage"
    if t0 < log.first_target.get(region, float("inf")):
        return "start-up"
    if any(a <= t0 < b for a, b in spans["after capacity change"]):
        return "after capacity change"
    if _in_force(log.issued.get(region, []), t0):
        return "learning"
    return "steady"


def decompose(
    scenario: Scenario, events: Path, policy: str, n0: int
) -> tuple[dict[str, dict[str, float]], dict[str, float]]:
    """(gap per phase and lever, totals): oracle − ``policy``, from the event log."""
    log = _read(events, policy, n0)
    gap: dict[str, dict[str, float]] = {p: dict.fromkeys(LEVERS, 0.0) for p in PHASES}
    totals: dict[str, float] = defaultdict(float)
    span_cache: dict[str, dict[str, list[tuple[float, float]]]] = {}
    for (pol, region, t0), inc in log.wins.items():
        other = log.wins.get(("oracle", region, t0))
        if pol != policy or other is None:
            continue
        spans = span_cache.get(region)
        if spans is None:
            spans = span_cache[region] = _spans(scenario, region, log.issued.get(region, []))
        phase = _phase(spans, log, region, t0)
        for lever in LEVERS:
            d = other.get(lever, 0.0) - inc.get(lever, 0.0)
            gap[phase][lever] += d
            totals[lever] += d
        totals["policy"] += sum(inc.get(k, 0.0) for k in LEVERS)
        totals["oracle"] += sum(other.get(k, 0.0) for k in LEVERS)
    totals.update(log.bounds)
    return gap, dict(totals)


def _in_force(issued: list[tuple[float, bool]], t0: float) -> bool:
    """Whether the last targets issued at or before ``t0`` left a live lever unproven."""
    i = bisect_right(issued, (t0, True))
    return i > 0 and issued[i - 1][1]


def report(label: str, gap: dict[str, dict[str, float]], totals: dict[str, float]) -> str:
    fb = totals.get("feasible_bound")
    lines = [
        f"### {label}",
        "",
        f"policy {totals.get('policy', 0):,.0f}; oracle policy {totals.get('oracle', 0):,.0f}; "
        f"feasible bound {fb:,.0f}"
        if fb
        else f"policy {totals.get('policy', 0):,.0f}",
        "",
        "| phase | " + " | ".join(LEVERS) + " | total | share of bound |",
        "|---|" + "---:|" * (len(LEVERS) + 2),
    ]
    for phase in PHASES:
        row = gap[phase]
        tot = sum(row.values())
        share = f"{tot / fb:.3f}" if fb else "–"
        cells = " | ".join(f"{row[lv]:,.0f}" for lv in LEVERS)
        lines.append(f"| {phase} | {cells} | {tot:,.0f} | {share} |")
    if fb:
        eng = fb - totals.get("oracle", 0.0)
        lines.append(f"| engine (bound − oracle policy) | | | | | {eng:,.0f} | {eng / fb:.3f} |")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    from headroom.sim.run import run_simulation

    ap = argparse.ArgumentParser(prog="python -m headroom.bench.value_gap")
    ap.add_argument("scenario", nargs="+", help="scenario files")
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--policy", default="headroom")
    ap.add_argument("--out", help="keep the runs under this directory")
    args = ap.parse_args(argv)
    for path in args.scenario:
        scenario = load_scenario(Path(path))
        with tempfile.TemporaryDirectory() as tmp:
            out = Path(args.out) / scenario.name if args.out else Path(tmp)
            run_simulation(
                scenario, [args.policy, "oracle"], out, seed=args.seed, plots=False,
                compress_events=True,
            )  # fmt: skip
            gap, totals = decompose(
                scenario, out / "events.jsonl", args.policy, scenario.world.base_candidates
            )
        print(report(f"{scenario.name} ({args.policy} vs oracle)", gap, totals))
        print()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
