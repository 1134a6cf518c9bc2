"""What the simulator makes of the scenario's fault events (docs/scenarios.md, *Fault events*).

Pure: spans of scenario time, per region, derived from the event list once. The simulator has no
processes or broker to break, so it models each fault by its effect on the control and data plane:

* ``kill`` / ``pause`` / ``stall`` of the **controller** and a ``broker_restart`` — a control
  outage over the fault's span (the kill until the restart, the pause, the stall, the broker's
  down time): no targets are issued, so the clients fall back to the baseline when their targets
  expire (as a ``control_outage``). (A stalled streaming controller goes on issuing targets from
  its last books until its liveness check ends it and it is restarted; the simulator has no
  stale books to model);
* ``kill`` / ``pause`` of a region's **client** — the region's requests get no optional work over
  the span (served baseline-only: on the real stack they wait in Kafka and are served, with the
  target in force, once the client is back; the simulator serves them on time, without the levers);
* ``capacity_silence`` — the controllers see the capacity levels as they were when the silence
  began, until it ends (the servers, which own the capacity, still see every change);
* ``kill`` / ``pause`` of a **server**, a **precompute** worker or the **feed** — not modelled (a
  lost replica's requests are retried on the others, a feed restarted resends what it lost; the
  simulator's fluid fleet has no replica or feed process to lose). Their ``fault.injected`` and
  ``fault.recovered`` lines are still written, with a recovery time of 0.
"""

from __future__ import annotations

from headroom.kernel.scenario import Scenario, ScenarioEvent

__all__ = ["baseline_only_spans", "capacity_silences", "control_outages", "modelled"]

Span = tuple[float, float]


def _span(e: ScenarioEvent) -> Span:
    return (e.at_s, e.at_s + e.fault_span_s)


def control_outages(scenario: Scenario, region: str) -> tuple[Span, ...]:
    """Spans when the region's controllers are silent: ``control_outage`` events, and the
    controller's kills and pauses and the broker's restarts."""
    out = []
    for e in scenario.events:
        if e.kind == "control_outage" and (e.region is None or e.region == region):
            out.append((e.at_s, e.at_s + (e.duration_s or 0.0)))
        elif (e.kind in ("kill", "pause", "stall") and e.process == "controller") or (
            e.kind == "broker_restart"
        ):
            out.append(_span(e))
    return tuple(out)


def baseline_only_spans(scenario: Scenario, region: str) -> tuple[Span, ...]:
    """Spans when the region's requests get no optional work: its client killed or paused."""
    return tuple(
        _span(e)
        for e in scenario.events
        if e.kind in ("kill", "pause") and e.process == "client" and e.region == region
    )


def capacity_silences(scenario: Scenario, region: str) -> tuple[Span, ...]:
    """Spans when the controllers hear no capacity level of the region."""
    return tuple(
        _span(e)
        for e in scenario.events
        if e.kind == "capacity_silence" and (e.region is None or e.region == region)
    )


def modelled(e: ScenarioEvent) -> bool:
    """Whether the simulator models this fault (see the module docstring)."""
    if e.kind in ("broker_restart", "capacity_silence"):
        return True
    if e.kind == "stall":
        return e.process == "controller"
    return e.kind in ("kill", "pause") and e.process in ("controller", "client")
