"""``headroom precompute --region R``: run one precompute worker until SIGINT/SIGTERM.

Loads the scenario (``--scenario``, default quickstart; it must have the precompute fields:
``world.drift_per_h``, ``world.users`` and ``segments[].return_rate_per_h``, else exit 2),
creates the topics if missing (idempotent), measures or loads the world's value curves (cached in
``$HEADROOM_CACHE_DIR``), then runs :class:`headroom.workers.precompute.PrecomputeWorker`. Prints
``precompute worker ready (region R)`` on stdout once it has read the capacity and targets topics
and joined its requests group, and ``metrics on http://…/metrics`` with ``--metrics-port``.
Structured logs (JSON lines) go to stderr. SIGINT/SIGTERM drain: running jobs finish and are
published, the last window is written, then the worker stops (exit 0).
"""

from __future__ import annotations

import argparse
import asyncio
import os

from headroom.commands.server import run_announced
from headroom.kernel.errors import ConfigError
from headroom.kernel.logs import configure
from headroom.kernel.scenario_load import load_scenario
from headroom.kernel.settings import resolve_scenario
from headroom.streams.kafka import KafkaTarget


def _t0(flag: float | None) -> float:
    """``--t0``, else ``$HEADROOM_T0``, else 0 (scenario time = wall-clock time)."""
    if flag is not None:
        return float(flag)
    env = os.environ.get("HEADROOM_T0")
    if not env:
        return 0.0
    try:
        return float(env)
    except ValueError:
        raise ConfigError(f"HEADROOM_T0: must be a number, got {env!r}") from None


def precompute(args: argparse.Namespace) -> int:
    configure()
    from headroom.streams.kafka import create_topics
    from headroom.streams.topics import topics
    from headroom.workers.metrics import announce_metrics, process_metrics
    from headroom.workers.precompute import PrecomputeMetrics, PrecomputeWorker, WorkerSettings

    scenario = load_scenario(resolve_scenario(args.scenario))
    if not scenario.precompute_enabled:  # bad input (exit 2), before any broker call
        raise ConfigError(
            f"--scenario: {scenario.name!r} has no precompute fields "
            "(world.drift_per_h, world.users and segments[].return_rate_per_h)"
        )
    settings = WorkerSettings(
        region=args.region,
        t0=_t0(getattr(args, "t0", None)),
        speed=float(getattr(args, "speed", 1.0) or 1.0),
        seed=scenario.seed,
    )
    kafka = KafkaTarget.from_args(args)
    worker_metrics = PrecomputeMetrics.make(process_metrics().registry)

    async def run() -> None:
        await create_topics(kafka.bootstrap, topics(kafka.prefix))
        worker = PrecomputeWorker(settings, scenario, kafka, metrics=worker_metrics)
        worker.watch_loop = process_metrics().watch
        await run_announced(worker, lambda: f"precompute worker ready (region {settings.region})")

    announce_metrics(args.metrics_port)
    asyncio.run(run())
    return 0
