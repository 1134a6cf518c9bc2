"""The ``fault.injected`` / ``fault.recovered`` lines of a simulated run.

The simulator models a scenario's faults by their effect (:mod:`headroom.kernel.faults`); these
lines put them in the event log in the same shape ``headroom up`` writes them
(docs/events.md), so :mod:`headroom.analysis.metrics` builds the same ``faults`` section for both
engines. A fault's recovery time is when its component would first be healthy again:

* controller kill, pause or stall, broker restart — the first control step at or after the
  fault's end (steps fall at scenario time ``k × interval_s``): ``healthy: target.issued``;
* a client, a capacity silence — at the fault's end (the next request is planned with the
  target in force; the controllers see the newest levels at their next step): ``recovery_s`` 0;
* faults the simulator does not model (servers, precompute workers, the feed) — ``recovery_s``
  0 and ``modelled: false``.
"""

from __future__ import annotations

import math
from typing import Any

from headroom.kernel import faults as fault_model
from headroom.kernel.scenario import Scenario

__all__ = ["fault_lines"]


def fault_lines(
    scenario: Scenario, interval_s: float, t0: float, policy: str
) -> list[tuple[float, dict[str, Any]]]:
    """``(t, line)`` for every fault of ``scenario``, ordered by ``t`` (scenario seconds)."""
    out: list[tuple[float, dict[str, Any]]] = []
    faults = [e for e in scenario.events if e.is_fault]
    for i, e in enumerate(faults):
        end = e.at_s + e.fault_span_s
        process = e.process or ("broker" if e.kind == "broker_restart" else "feed")
        modelled = fault_model.modelled(e)
        if modelled and (process in ("controller", "broker")):
            recovered_at = math.ceil(end / interval_s - 1e-9) * interval_s
            healthy = "target.issued"
        else:
            recovered_at = end
            healthy = "modelled" if modelled else "not_modelled"
        common: dict[str, Any] = {
            "v": 1,
            "source": "sim",
            "policy": policy,
            "region": e.region,
            "fault_id": f"f{i}",
            "fault": e.kind,
            "process": process,
            "at_s": e.at_s,
            "span_s": e.fault_span_s,
            "modelled": modelled,
        }
        if e.pool is not None:
            common["pool"] = e.pool
        out.append((e.at_s, {**common, "ts": t0 + e.at_s, "kind": "fault.injected", "t": e.at_s}))
        recovered = recovered_at <= scenario.duration_s
        line = {
            **common,
            "ts": t0 + min(recovered_at, scenario.duration_s),
            "kind": "fault.recovered",
            "t": min(recovered_at, scenario.duration_s),
            "end_t": end,
            "recovered": recovered,
        }
        if recovered:
            line.update(recovery_s=recovered_at - end, healthy=healthy)
        else:
            line["problem"] = "the run ended first"
        out.append((line["t"], line))
    out.sort(key=lambda item: item[0])
    return out
