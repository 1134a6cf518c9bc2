"""``headroom feed SCENARIO [--speed X] [--t0 EPOCH]``: publish a scenario's capacity and traffic.

Waits for ``--t0`` (default: ``$HEADROOM_T0``, else now), plays the scenario (or ``--duration``
scenario seconds of it) and exits 0 once everything was sent and acknowledged; SIGINT/SIGTERM stop
it early (exit 0). The topics are created first if missing (idempotent).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import time

from headroom.kernel.logs import configure
from headroom.kernel.scenario_load import load_scenario
from headroom.kernel.settings import resolve_scenario
from headroom.streams.kafka import KafkaTarget, create_topics
from headroom.streams.topics import topics


def feed(args: argparse.Namespace) -> int:
    configure()
    from headroom.workers.feed import FeedConfig, TrafficFeed

    scenario = load_scenario(resolve_scenario(args.scenario))
    kafka = KafkaTarget.from_args(args)
    t0 = args.t0
    if t0 is None:
        env = os.environ.get("HEADROOM_T0")
        t0 = float(env) if env else time.time()
    config = FeedConfig(
        t0=float(t0),
        speed=float(args.speed or 1.0),
        seed=args.seed,
        duration_s=args.duration,
        resume_from=getattr(args, "resume_from", None),
    )

    async def run() -> None:
        await create_topics(kafka.bootstrap, topics(kafka.prefix))
        service = TrafficFeed(config, scenario, kafka)
        await service.run_until_stopped()

    asyncio.run(run())
    return 0
