"""The soak benchmark (BENCHMARKS.md): ``headroom bench --only soak_rss_growth_pct``.

The stack of ``headroom up`` runs a one-region scenario with a reclaim and a grant every minute for
:data:`SOAK_S` seconds (20 minutes; ``HEADROOM_SOAK_S`` shortens it, ``--quick`` runs 3 minutes)
against the broker of ``--bootstrap`` (or ``KAFKA_BOOTSTRAP_SERVERS``, or the local broker).
Every :data:`SAMPLE_S` seconds each process of the stack (controller, servers, client, feed) is
sampled: resident memory (``VmRSS`` of ``/proc/PID/status``) and open file descriptors
(``/proc/PID/fd``). The first :data:`WARMUP_SHARE` of the run is warm-up (imports, caches,
sketches and books filling up); growth is measured from the mean of the samples just after it to
the mean of the last samples of the run.

``value``: the largest RSS growth of any process, percent (goal ≤ 10); ``fd_growth``: the largest
growth of open descriptors (goal 0); ``processes``: the figures of each. Not run in CI (a
benchmark; 20 minutes of wall time). Linux only (``/proc``).
"""

from __future__ import annotations

import asyncio
import os
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from headroom.bench.runner import BenchContext, BenchResult

SOAK_S = 1200.0
QUICK_S = 180.0
SAMPLE_S = 10.0
WARMUP_SHARE = 0.25
WINDOW_SAMPLES = 3  # samples averaged at each end
GOAL_PCT = 10.0

_SCENARIO = """\
# the soak of `headroom bench --only soak_rss_growth_pct`: a reclaim and a grant every minute
name: soak
seed: 3
duration_s: {duration}
slo: {{p99_ms: 250, window_s: 5}}
control: {{interval_s: 5}}
world: {{ads: 5000, dim: 32, base_candidates: 100, max_candidates: 300, holdout: 0.1}}
models:
  base:
    {{cpu_ms_per_candidate: 0.1, accelerator_ms_per_candidate: 0.02, hardware: [gpu-a, gpu-b]}}
  strong:
    {{cpu_ms_per_candidate: 0.02, accelerator_ms_per_candidate: 0.4, hardware: [gpu-b], load_s: 5}}
segments:
  - {{name: premium, share: 0.2, value: {{mean: 3.0, sigma: 0.8}},
     base_error: 0.15, strong_error: 0.10}}
  - {{name: casual, share: 0.8, value: {{mean: 0.6, sigma: 0.6}},
     base_error: 0.50, strong_error: 0.20}}
regions:
  - name: soak
    dedicated: {{cpu: 4, accelerator: 1, hardware: gpu-a}}
    traffic: {{rps: 20, noise: 0.05}}
    opportunistic:
      - {{resource: cpu,         hardware: any,   trace: {cpu_trace}}}
      - {{resource: accelerator, hardware: gpu-b, trace: {acc_trace}}}
"""


def _scenario_text(duration_s: float) -> str:
    cpu: list[list[float]] = []
    acc: list[list[float]] = []
    t = 0.0
    while t < duration_s:
        # every minute: the CPU pool drops to a quarter at 30 s and comes back at 60 s; the
        # accelerators are preempted at 40 s and granted back at 50 s
        cpu += [[t, 2.0], [t + 30.0, 0.5]]
        acc += [[t, 2.0], [t + 40.0, 0.0], [t + 50.0, 2.0]]
        t += 60.0
    return _SCENARIO.format(duration=int(duration_s), cpu_trace=cpu, acc_trace=acc)


def _sample(pid: int) -> tuple[float, int] | None:
    """(RSS in KiB, open descriptors) of a process, None when it is gone."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
        fds = len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return None
    for line in status.splitlines():
        if line.startswith("VmRSS:"):
            return float(line.split()[1]), fds
    return None


def soak_rss_growth_pct(ctx: BenchContext) -> BenchResult:
    return asyncio.run(_soak(ctx))


async def _soak(ctx: BenchContext) -> BenchResult:
    from headroom.bench.bench_stack import _broker, _no_broker

    bootstrap = await _broker(ctx)
    if bootstrap is None:
        return _no_broker(ctx, "%", GOAL_PCT)
    from headroom.analysis.events import EventLog
    from headroom.analysis.metrics import compute_metrics
    from headroom.kernel.scenario_load import load_scenario
    from headroom.streams.kafka import KafkaTarget, delete_topics
    from headroom.streams.topics import topics
    from headroom.workers.up import Stack, StackConfig, run_stack

    duration = float(os.environ.get("HEADROOM_SOAK_S") or (QUICK_S if ctx.quick else SOAK_S))
    samples: dict[str, list[tuple[float, float, int]]] = {}

    async def sample(stack: Stack) -> None:
        t = stack.scenario_time()
        for name, proc in stack.procs.items():
            if proc.pid is not None and proc.running:
                got = _sample(proc.pid)
                if got is not None:
                    samples.setdefault(name, []).append((t, got[0], got[1]))

    prefix = f"soak{uuid.uuid4().hex[:8]}."
    with tempfile.TemporaryDirectory(prefix="headroom-soak-") as tmp:
        path = Path(tmp) / "soak.yaml"
        path.write_text(_scenario_text(duration))
        scenario = load_scenario(path)
        config = StackConfig(
            scenario_path=path, out_dir=Path(tmp) / "run", kafka=KafkaTarget(bootstrap, prefix)
        )
        times = [SAMPLE_S * k for k in range(1, int(duration // SAMPLE_S))]
        began = time.monotonic()
        try:
            stack = await run_stack(config, scenario, actions=[(t, sample) for t in times])
            metrics = compute_metrics(EventLog(stack.events_path))
        finally:
            await delete_topics(bootstrap, [t.name for t in topics(prefix)])
        wall_s = time.monotonic() - began
    warm = duration * WARMUP_SHARE
    per: dict[str, Any] = {}
    for name, rows in sorted(samples.items()):
        after = [r for r in rows if r[0] >= warm]
        if len(after) < 2 * WINDOW_SAMPLES:
            continue
        first, last = after[:WINDOW_SAMPLES], after[-WINDOW_SAMPLES:]
        rss0 = sum(r[1] for r in first) / len(first)
        rss1 = sum(r[1] for r in last) / len(last)
        per[name] = {
            "rss_kib_after_warmup": round(rss0),
            "rss_kib_end": round(rss1),
            "rss_growth_pct": round(100.0 * (rss1 - rss0) / rss0, 2),
            "fds_after_warmup": first[0][2],
            "fds_end": last[-1][2],
            "fd_growth": last[-1][2] - first[0][2],
        }
    if not per:
        return BenchResult(value=None, unit="%", goal=GOAL_PCT, skipped="no samples")
    m = metrics["policies"]["headroom"]
    return BenchResult(
        value=max(p["rss_growth_pct"] for p in per.values()),
        unit="%",
        goal=GOAL_PCT,
        extra={
            "fd_growth": max(p["fd_growth"] for p in per.values()),
            "duration_s": duration,
            "warmup_s": warm,
            "wall_s": round(wall_s, 1),
            "reclaims": m["reclaims"]["count"],
            "release_ms_p99": m["reclaims"]["release_ms_p99"],
            "requests": m["requests"]["total"],
            "processes": per,
        },
    )


BENCHMARKS = {"soak_rss_growth_pct": soak_rss_growth_pct}
