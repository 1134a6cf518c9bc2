"""The two engines on the same scenario: ``headroom up`` (real Kafka) against ``simulate``.

Two short one-region scenarios (tests/integration/scenarios/agree-*.yaml: two reclaims each, a
control step every SLO window, one of them with the precompute fields) are run through
:func:`headroom.commands.up.run_up` — the streaming stack, real time — and through
:func:`headroom.sim.run.run_simulation` with the ``headroom`` policy, on the same scenario and seed:
the same control clock (the scenario's ``control`` section, steps at scenario time ``k ×
interval_s`` in both), the same requests (the feed plays the simulator's own traffic draw), the
same capacity. Three settings of the simulator's model are given what the streaming run has: the
publish → apply delay of a target (``SimConfig.propagation_s``, 2 s by default for a fleet) is the
delay the stack's clients measured (loopback Kafka: milliseconds); the service-time variability
(``LatencyConfig.service_cv``, 0.25 by default) is the streaming servers' emulation's
(``ServerConfig.service_cv``: exact service times, the host's own variance on top); and its
ground-truth value curves are measured on :data:`CURVE_SAMPLES` users per segment instead of the
default 256 (whose sampling error moves a segment's strong-model uplift by up to ±15 %; the stack
measures every request's value against the world itself). Its control plane still plans RMA's
levels with the curves the streaming controller reads (the default ones,
:func:`headroom.controllers.app.rma_curve`): the RMA curve's concave hull on 256 users differs
from the one on 2,048 (premium: near linear up to 112 extras, against a knee at 75), and a
controller planning with the other curve gave the top premium bins 75 extras where the stack's
gave 112–200 — agree-precompute's first-target worst window, +49…+72 % apart before.

Each engine's figures are computed from its own event log by the same analysis
(:func:`headroom.analysis.metrics.compute_metrics`). The test asserts that the incremental value
(ground truth) agrees within 25 % and the worst window's p99 within 20 % (relative to the
simulator's figure; reported, not asserted, for the scenarios of :data:`KNOWN_P99_GAP`), and writes
both engines' figures, their gaps and a window-by-window table to ``engines-agree-<scenario>.json``
in the run directory (and prints them with ``-s``).
"""

from __future__ import annotations

import dataclasses
import json
import math
import statistics
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from headroom.analysis.events import base_sketch, read_events
from headroom.analysis.metrics import SketchSum
from headroom.commands.up import run_up
from headroom.kernel.scenario import Scenario
from headroom.kernel.scenario_load import load_scenario
from headroom.kernel.traces import ScenarioTraces
from headroom.sim.config import SimConfig
from headroom.sim.run import build_context, run_simulation
from headroom.streams.kafka import KafkaTarget, delete_topics
from headroom.streams.topics import topics
from headroom.workers.server import ServerConfig
from headroom.workers.up import StackConfig
from headroom.world.curves import curves_for
from tests.conftest import run_async

pytestmark = pytest.mark.integration

SCENARIOS = Path(__file__).parent / "scenarios"
INCREMENTAL_TOLERANCE = 0.25  # |up − sim| / sim
P99_TOLERANCE = 0.20
CURVE_SAMPLES = 2048  # users per segment for the simulator's value curves (cached after a run)
# mixed replicas per region in both engines (headroom.defences.replicas: the stack starts them,
# the simulator runs an RMA request's extras on one's quota)
REPLICAS = 2
# the service-time variability the streaming servers emulate (``headroom up`` keeps the default)
SERVER_SERVICE_CV = next(
    float(f.default)  # type: ignore[arg-type]
    for f in dataclasses.fields(ServerConfig)
    if f.name == "service_cv"
)


@dataclass
class Engines:
    scenario: Scenario
    out_dir: Path
    up: dict[str, Any]  # metrics of policy headroom
    sim: dict[str, Any]
    up_events: list[dict[str, Any]]
    sim_events: list[dict[str, Any]]
    propagation_s: float

    def gap(self, key: str) -> float:
        u, s = self.figures("up")[key], self.figures("sim")[key]
        return (u - s) / abs(s) if s else (0.0 if u == 0 else math.inf)

    def figures(self, engine: str) -> dict[str, float]:
        m = self.up if engine == "up" else self.sim
        value = m["value"]
        used = m["capacity"]["used_unit_s"]
        return {
            "incremental": float(value["incremental"]),
            "incremental_rma": float(value["incremental_rma"]),
            "incremental_sbm": float(value["incremental_sbm"]),
            "incremental_precompute": float(value.get("incremental_precompute", 0.0)),
            "worst_window_p99_ms": float(m["slo"]["worst_window_p99_ms"]),
            "violation_fraction": float(m["slo"]["violation_fraction"]),
            "requests": float(m["requests"]["total"]),
            "used_cpu_unit_s": float(used.get("cpu", 0.0)),
            "used_accelerator_unit_s": float(used.get("accelerator", 0.0)),
            "oracle_incremental": float(value["oracle_incremental"]),
        }

    def report(self) -> dict[str, Any]:
        keys = self.figures("sim")
        return {
            "scenario": self.scenario.name,
            "interval_s": self.scenario.control.interval_s,
            "sim_propagation_s": self.propagation_s,
            "up": self.figures("up"),
            "sim": self.figures("sim"),
            "relative_gap": {k: self.gap(k) for k in keys},
            "windows": window_table(self.up_events, self.sim_events),
        }


def window_table(
    up_events: list[dict[str, Any]], sim_events: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    """Per SLO window (``t_start``), each engine's requests, p99 of all requests and of the
    baseline-only ones (ms; the window's sources' sketches merged), incremental value by lever,
    optional unit-seconds used and the targets in force: where the engines part. A worst-window
    gap with the baseline-only p99s alike lies in the optional paths' latency."""

    def per_window(events: list[dict[str, Any]]) -> dict[float, dict[str, float]]:
        out: dict[float, dict[str, float]] = {}
        sketches: dict[float, tuple[SketchSum, SketchSum]] = {}
        for e in events:
            if e["kind"] != "window":
                continue
            t = float(e["t_start"])
            w = out.setdefault(t, {})
            every, base = sketches.setdefault(t, (SketchSum(), SketchSum()))
            every.add(e.get("sketch"))
            base.add(base_sketch(e))
            w["requests"] = w.get("requests", 0.0) + float(e.get("requests", 0))
            for lever, v in (e.get("inc") or {}).items():
                w[f"inc_{lever}"] = w.get(f"inc_{lever}", 0.0) + float(v)
            for res, v in (e.get("used_unit_s") or {}).items():
                w[f"used_{res}"] = w.get(f"used_{res}", 0.0) + float(v)
            targets = e.get("targets")
            if targets:
                w["rma_candidates"] = float(targets.get("rma_candidates", 0))
                w["sbm_coverage"] = float(targets.get("sbm_coverage", 0.0))
        for t, (every, base) in sketches.items():
            for key, merged in (("p99_ms", every), ("p99_base_ms", base)):
                q = merged.quantile(0.99)
                if q is not None:
                    out[t][key] = q
        return out

    a, b = per_window(up_events), per_window(sim_events)
    return [
        {"t_start": t, "up": a.get(t, {}), "sim": b.get(t, {})} for t in sorted(set(a) | set(b))
    ]


def _propagation_s(events: list[dict[str, Any]]) -> float:
    """The median publish → apply delay of the targets the stack's clients applied."""
    delays = [
        float(e["delay_ms"]) / 1000.0
        for e in events
        if e["kind"] == "target.applied" and e.get("delay_ms") is not None
    ]
    assert delays, "no target was applied in the streaming run"
    return max(0.0, statistics.median(delays))


def _run(kafka_bootstrap: str, out_dir: Path, name: str) -> Engines:
    path = SCENARIOS / f"{name}.yaml"
    scenario = load_scenario(path)
    prefix = f"t{uuid.uuid4().hex[:12]}."
    kafka = KafkaTarget(kafka_bootstrap, prefix)
    config = StackConfig(
        scenario_path=path, out_dir=out_dir / "up", kafka=kafka, dedicated_replicas=REPLICAS
    )
    try:
        result = run_async(run_up(config, scenario))
    finally:
        run_async(delete_topics(kafka_bootstrap, [t.name for t in topics(prefix)]))
    up_events = read_events(result.events_path)
    propagation = _propagation_s(up_events)
    base = SimConfig()
    sim_config = base.with_overrides(
        propagation_s=propagation,
        mixed_replicas=REPLICAS,
        latency=dataclasses.replace(base.latency, service_cv=SERVER_SERVICE_CV),
    )
    curves = curves_for(scenario, samples_per_segment=CURVE_SAMPLES)
    # the controller's RMA curve is the streaming controller's (module docstring)
    ctx = build_context(
        scenario, config=sim_config, curves=curves, control_curves=curves_for(scenario)
    )
    sim = run_simulation(scenario, ["headroom"], out_dir / "sim", context=ctx, plots=False)
    engines = Engines(
        scenario=scenario,
        out_dir=out_dir,
        up=dict(result.metrics["policies"]["headroom"]),
        sim=dict(sim.metrics["policies"]["headroom"]),
        up_events=up_events,
        sim_events=read_events(sim.events_path),
        propagation_s=propagation,
    )
    report = engines.report()
    (out_dir / f"engines-agree-{name}.json").write_text(json.dumps(report, indent=2))
    print(
        f"\nup vs simulate on {name}:",
        json.dumps({k: report[k] for k in ("up", "sim", "relative_gap")}, indent=2),
    )
    return engines


@pytest.fixture(scope="module", params=["agree-live", "agree-precompute"])
def engines(
    request: pytest.FixtureRequest,
    kafka_bootstrap: str,
    tmp_path_factory: pytest.TempPathFactory,
) -> Engines:
    name = str(request.param)
    return _run(kafka_bootstrap, tmp_path_factory.mktemp(name), name)


def test_both_engines_play_the_same_requests_on_the_same_control_clock(engines: Engines) -> None:
    up, sim = engines.figures("up"), engines.figures("sim")
    assert up["requests"] == sim["requests"] > 0
    # both control planes stepped at scenario time k × interval_s, and between ticks only at
    # the instants the capacity changed (controllers/react.py: a material change, a quarter
    # interval from a tick; these scenarios change it on ticks, so neither engine has cause to)
    interval = engines.scenario.control.interval_s
    scenario = engines.scenario
    changes = sorted(
        {
            ch.t
            for rt in ScenarioTraces(scenario, np.random.default_rng(0)).regions
            for ch in rt.changes
        }
    )
    for events in (engines.up_events, engines.sim_events):
        started = next(e for e in events if e["kind"] == "run.started" and e.get("t0"))
        t0, speed = float(started["t0"]), float(started.get("speed", 1.0))
        steps = [(e["ts"] - t0) * speed / interval for e in events if e["kind"] == "target.issued"]
        ticks = {round(k) for k in steps if abs(k - round(k)) < 0.1}
        extra = [k for k in steps if abs(k - round(k)) >= 0.1]
        assert len(ticks) >= scenario.duration_s / interval - 3, sorted(ticks)
        assert all(any(abs(k * interval - c) < 0.1 * interval for c in changes) for k in extra), (
            extra,
            changes,
        )
        assert round(min(steps)) == 1


def test_incremental_value_agrees_within_25_percent(engines: Engines) -> None:
    up, sim = engines.figures("up"), engines.figures("sim")
    assert sim["incremental"] > 0.0
    assert up["incremental"] > 0.0
    gap = engines.gap("incremental")
    assert abs(gap) <= INCREMENTAL_TOLERANCE, (
        f"{engines.scenario.name}: up {up['incremental']:.1f} vs simulate "
        f"{sim['incremental']:.1f} ({gap:+.0%})"
    )


# Scenarios whose worst-window p99 is reported but not asserted (docs/streaming.md, Known limits).
# agree-precompute: its p99 of all requests in a window (~180 requests) is the second-slowest
# request, so it is set by whether two or three requests ran RMA's top levels. With the precompute
# hits alike window by window in both engines, the stack routed 5 premium requests to RMA in the
# window from 40 s (130 ms) where the simulator routed 7 casual ones at lower levels (55 ms).
KNOWN_P99_GAP: set[str] = {"agree-precompute"}


def test_worst_window_p99_agrees_within_20_percent(
    engines: Engines, request: pytest.FixtureRequest
) -> None:
    if engines.scenario.name in KNOWN_P99_GAP:
        request.applymarker(
            pytest.mark.xfail(
                reason="known worst-window p99 gap (docs/streaming.md, Known limits)", strict=False
            )
        )
    up, sim = engines.figures("up"), engines.figures("sim")
    gap = engines.gap("worst_window_p99_ms")
    assert abs(gap) <= P99_TOLERANCE, (
        f"{engines.scenario.name}: up {up['worst_window_p99_ms']:.1f} ms vs simulate "
        f"{sim['worst_window_p99_ms']:.1f} ms ({gap:+.0%}); per window, p99 of all / of the "
        f"baseline-only requests (up vs simulate): {_p99_rows(engines)}"
    )


def _p99_rows(engines: Engines) -> str:
    rows = []
    for w in window_table(engines.up_events, engines.sim_events):
        up, sim = (
            f"{d.get('p99_ms', math.nan):.0f}/{d.get('p99_base_ms', math.nan):.0f}"
            for d in (w["up"], w["sim"])
        )
        rows.append(f"{w['t_start']:g}s {up} vs {sim}")
    return "; ".join(rows)
