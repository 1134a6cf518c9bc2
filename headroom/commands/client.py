"""``headroom client --region R --server POOL=HOST:PORT …``: run one client until SIGINT/SIGTERM.

Prints ``ready`` on stdout once it owns its partitions of ``headroom.requests`` and knows where to
read them from (what ``headroom up`` waits for before starting the feed), and
``metrics on http://…/metrics`` when ``--metrics-port`` is given. On SIGTERM it drains: no new
requests, the ones in flight finish, the last (partial) windows are published and their offsets
committed.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket

from headroom.commands.server import resolve_t0, run_announced
from headroom.kernel.logs import configure
from headroom.kernel.scenario_load import load_scenario
from headroom.kernel.settings import resolve_scenario
from headroom.streams.kafka import KafkaTarget


def client(args: argparse.Namespace) -> int:
    configure()
    from headroom.workers.client import ClientConfig, RankingClient, ServerAddress, in_flight_limit
    from headroom.workers.metrics import announce_metrics, process_metrics

    scenario = load_scenario(resolve_scenario(args.scenario))
    kafka = KafkaTarget.from_args(args)
    servers = tuple(ServerAddress.parse(text) for text in args.server)
    config = ClientConfig(
        region=args.region,
        servers=servers,
        group=args.group or f"{kafka.prefix}client-{args.region}",
        instance=getattr(args, "instance", None),
        name=f"client-{socket.gethostname()}-{os.getpid()}",
        t0=resolve_t0(args.t0),
        speed=float(args.speed or 1.0),
        seed=scenario.seed if args.seed is None else int(args.seed),
        max_in_flight=in_flight_limit(scenario, args.region),
        control_interval_s=args.interval,
    )
    metrics = process_metrics()
    announce_metrics(args.metrics_port)

    async def run() -> None:
        service = RankingClient(config, scenario, kafka, metrics=metrics)
        await run_announced(service, lambda: "ready")

    asyncio.run(run())
    return 0
