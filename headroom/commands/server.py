"""``headroom server --region R --pool P``: run one ranking replica until SIGINT/SIGTERM.

Prints ``listening on HOST:PORT`` on stdout once it accepts connections (``--port 0`` picks a
free port: this line says which), and ``metrics on http://…/metrics`` when ``--metrics-port`` is
given. Logs are structlog JSON lines on stderr.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
from collections.abc import Callable
from typing import Any, Protocol

from headroom.kernel.logs import configure
from headroom.kernel.scenario_load import load_scenario
from headroom.kernel.settings import resolve_scenario
from headroom.streams.kafka import KafkaTarget


class ReadyService(Protocol):
    """A worker service that says when it is ready (server, client, precompute worker)."""

    ready: asyncio.Event

    async def run_until_stopped(self) -> Any: ...


def default_replica(region: str, pool: str) -> str:
    return f"{region}-{pool[:3]}-{socket.gethostname()}-{os.getpid()}"


def resolve_t0(flag: float | None) -> float:
    """``--t0``, else ``$HEADROOM_T0``, else 0 (windows aligned to the Unix epoch)."""
    if flag is not None:
        return float(flag)
    env = os.environ.get("HEADROOM_T0")
    return float(env) if env else 0.0


def server(args: argparse.Namespace) -> int:
    configure()
    from headroom.workers.metrics import announce_metrics, process_metrics
    from headroom.workers.server import RankingServer, ServerConfig

    scenario = load_scenario(resolve_scenario(args.scenario))
    config = ServerConfig(
        region=args.region,
        pool=args.pool,
        replica=args.replica or default_replica(args.region, args.pool),
        share=float(getattr(args, "share", 1.0)),
        host=getattr(args, "host", "127.0.0.1"),
        port=int(args.port),
        t0=resolve_t0(getattr(args, "t0", None)),
        speed=float(getattr(args, "speed", 1.0) or 1.0),
    )
    kafka = KafkaTarget.from_args(args)
    metrics = process_metrics()
    announce_metrics(args.metrics_port)

    async def run() -> None:
        service = RankingServer(config, scenario, kafka, metrics=metrics)
        await run_announced(service, lambda: f"listening on {config.host}:{service.port}")

    asyncio.run(run())
    return 0


async def run_announced(service: ReadyService, ready_line: Callable[[], str]) -> Any:
    """Run a worker service until it stops, printing ``ready_line()`` once it is ready (the line
    a supervisor such as ``headroom up`` waits for)."""

    async def announce() -> None:
        await service.ready.wait()
        print(ready_line(), flush=True)

    task = asyncio.ensure_future(announce())
    try:
        return await service.run_until_stopped()
    finally:
        task.cancel()
