"""``headroom controller``: run the Faust controller app as a worker process.

The control interval and target lifetime are the scenario's ``control`` section unless
``--interval`` / ``--ttl`` are given (scenario seconds; with ``--speed X`` the app steps every
``interval / X`` wall seconds), and the steps fall at ``--t0 + k × interval`` (k = 1, 2, …), the
instants at which the simulator steps (``--t0``: ``$HEADROOM_T0``, else 0).

Creates the topics first (idempotent), so Faust never auto-declares a region-keyed topic with
another partition count (that would break co-partitioning, see docs/kafka.md), then runs a Faust
worker until SIGINT/SIGTERM.
"""

from __future__ import annotations

import argparse
import asyncio
import os
from pathlib import Path

from headroom.commands.server import resolve_t0
from headroom.kernel.logs import LOG_LEVELS, configure, env_choice, get_logger
from headroom.kernel.scenario_load import control_with_flags, load_scenario
from headroom.kernel.settings import resolve_scenario
from headroom.streams.kafka import KafkaTarget


async def _prepare_topics(bootstrap: str, prefix: str) -> tuple[int, int]:
    """Create missing topics; return the partition count of the region-keyed ones, which the
    app's tables must share (co-partitioning), and the replication factor for the app's own
    changelog topics (the capacity topic's)."""
    from headroom.streams import kafka
    from headroom.streams.topics import default_replication, topic_name, topics

    await kafka.create_topics(bootstrap, topics(prefix))
    name = topic_name("capacity", prefix)
    async with kafka.admin(bootstrap) as client:
        counts = await kafka.topic_partitions(client, [name])
        replicas = await kafka.topic_replicas(client, [name])
        brokers = await kafka.broker_count(client)
    return counts.get(name, 4), replicas.get(name, default_replication(brokers))


def faust_log_level() -> str:
    """The level of Faust's own log lines (its recovery, rebalances; plain text beside the
    JSON lines): ``$HEADROOM_FAUST_LOG_LEVEL``, else warning (docs/logging.md)."""
    return env_choice("HEADROOM_FAUST_LOG_LEVEL", LOG_LEVELS, "warning").upper()


def controller(args: argparse.Namespace) -> int:
    configure()
    faust_level = faust_log_level()
    import faust

    from headroom.controllers.app import ControllerSettings, create_app

    scenario = load_scenario(resolve_scenario(args.scenario))
    # the scenario's control interval and target lifetime (scenario seconds) unless --interval /
    # --ttl say otherwise; the app runs on the wall clock: / speed
    # (the controller hears latency every second: unlike the simulator it needs no whole SLO
    # window per step, so --interval may be shorter than slo.window_s here)
    control = control_with_flags(scenario.control, args.interval, args.ttl)
    speed = float(getattr(args, "speed", 1.0) or 1.0)
    target = KafkaTarget.from_args(args)
    bootstrap, prefix = target.bootstrap, target.prefix
    partitions, replication = asyncio.run(_prepare_topics(bootstrap, prefix))
    data_dir = Path(os.environ.get("HEADROOM_CONTROLLER_DIR", ".headroom")) / f"{prefix}controller"
    settings = ControllerSettings(
        bootstrap=bootstrap,
        prefix=prefix,
        scenario=scenario,
        interval_s=control.interval_s / speed,
        ttl_s=control.target_ttl_s / speed,
        t0=resolve_t0(getattr(args, "t0", None)),
        data_dir=data_dir,
        seed=scenario.seed,
        partitions=partitions,
        security=target.security,
        replication_factor=replication,
    )
    data_dir.mkdir(parents=True, exist_ok=True)
    app, _ctl = create_app(settings)
    from headroom.workers.metrics import announce_metrics, watch_controller

    watch_controller(_ctl, control.interval_s / speed)
    announce_metrics(args.metrics_port)
    get_logger("controller").info(
        "controller.started",
        bootstrap=bootstrap,
        prefix=prefix,
        interval_s=settings.interval_s,
        ttl_s=settings.ttl_s,
        t0=settings.t0,
        **target.security.describe(),
    )
    worker = faust.Worker(app, loglevel=faust_level, quiet=True, redirect_stdouts=False)
    worker.execute_from_commandline()
    return 0
