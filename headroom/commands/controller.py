"""``headroom controller``: run the Faust controller app as a worker process.

Creates the topics first (idempotent), so Faust never auto-declares a region-keyed topic with
another partition count (that would break co-partitioning, see docs/kafka.md), then runs a Faust
worker until SIGINT/SIGTERM.
"""

from __future__ import annotations

import argparse
import asyncio
import os
from pathlib import Path

from headroom.kernel.logs import configure, get_logger
from headroom.kernel.scenario_load import load_scenario
from headroom.kernel.settings import resolve_bootstrap, resolve_prefix, resolve_scenario


async def _prepare_topics(bootstrap: str, prefix: str) -> int:
    """Create missing topics; return the partition count of the region-keyed ones, which the
    app's tables must share (co-partitioning)."""
    from headroom.streams import kafka
    from headroom.streams.topics import topic_name, topics

    await kafka.create_topics(bootstrap, topics(prefix))
    async with kafka.admin(bootstrap) as client:
        counts = await kafka.topic_partitions(client, [topic_name("capacity", prefix)])
    return counts.get(topic_name("capacity", prefix), 4)


def controller(args: argparse.Namespace) -> int:
    configure()
    import faust

    from headroom.controllers.app import ControllerSettings, create_app

    scenario = load_scenario(resolve_scenario(args.scenario))
    bootstrap = resolve_bootstrap(args.bootstrap)
    prefix = resolve_prefix(args.prefix)
    partitions = asyncio.run(_prepare_topics(bootstrap, prefix))
    data_dir = Path(os.environ.get("HEADROOM_CONTROLLER_DIR", ".headroom")) / f"{prefix}controller"
    settings = ControllerSettings(
        bootstrap=bootstrap,
        prefix=prefix,
        scenario=scenario,
        interval_s=float(args.interval),
        ttl_s=None if args.ttl is None else float(args.ttl),
        data_dir=data_dir,
        seed=scenario.seed,
        partitions=partitions,
    )
    data_dir.mkdir(parents=True, exist_ok=True)
    app, _ctl = create_app(settings)
    if args.metrics_port is not None:
        from headroom.workers.metrics import serve_metrics

        port = serve_metrics(args.metrics_port)
        print(f"metrics on http://127.0.0.1:{port}/metrics", flush=True)
    get_logger("controller").info(
        "controller.started", bootstrap=bootstrap, prefix=prefix, interval_s=settings.interval_s
    )
    worker = faust.Worker(app, loglevel="WARNING", quiet=True, redirect_stdouts=False)
    worker.execute_from_commandline()
    return 0
