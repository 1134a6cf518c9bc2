"""Prometheus metrics of every worker, declared in one place (``--metrics-port N``).

Each worker process serves ``/metrics`` on loopback when asked (``0`` = a free port, printed at
start-up). The metric families are declared here once, in a registry per process, so the names
and labels are the same whichever worker exports them:

| metric | type | labels |
|---|---|---|
| ``headroom_requests_total`` | counter | region, path, outcome (ok/error/timeout) |
| ``headroom_request_latency_seconds`` | histogram | region, path |
| ``headroom_shed_total`` | counter | region, side (server/client), lever |
| ``headroom_target_candidates`` | gauge | region |
| ``headroom_target_sbm_coverage`` | gauge | region |
| ``headroom_optional_multiplier`` | gauge | region, server |
| ``headroom_capacity_units`` | gauge | region, resource, hardware, pool |
| ``headroom_messages_deadlettered_total`` | counter | topic |
"""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 1.0, 2.0, 5.0)


@dataclass(frozen=True)
class Metrics:
    registry: CollectorRegistry
    requests: Counter
    latency: Histogram
    shed: Counter
    target_candidates: Gauge
    target_coverage: Gauge
    multiplier: Gauge
    capacity: Gauge
    deadlettered: Counter


def make_metrics(registry: CollectorRegistry | None = None) -> Metrics:
    reg = registry or CollectorRegistry()
    return Metrics(
        registry=reg,
        requests=Counter(
            "headroom_requests", "Requests served", ["region", "path", "outcome"], registry=reg
        ),
        latency=Histogram(
            "headroom_request_latency_seconds",
            "Request latency by path",
            ["region", "path"],
            buckets=_LATENCY_BUCKETS,
            registry=reg,
        ),
        shed=Counter(
            "headroom_shed", "Optional work shed", ["region", "side", "lever"], registry=reg
        ),
        target_candidates=Gauge(
            "headroom_target_candidates", "RMA candidate target in force", ["region"], registry=reg
        ),
        target_coverage=Gauge(
            "headroom_target_sbm_coverage", "SBM coverage target in force", ["region"], registry=reg
        ),
        multiplier=Gauge(
            "headroom_optional_multiplier",
            "Client-side optional-work multiplier per server",
            ["region", "server"],
            registry=reg,
        ),
        capacity=Gauge(
            "headroom_capacity_units",
            "Capacity level announced",
            ["region", "resource", "hardware", "pool"],
            registry=reg,
        ),
        deadlettered=Counter(
            "headroom_messages_deadlettered",
            "Messages sent to the dead-letter topic",
            ["topic"],
            registry=reg,
        ),
    )


_default: Metrics | None = None


def process_metrics() -> Metrics:
    """The metrics of this process (created on first use; one registry per process)."""
    global _default
    if _default is None:
        _default = make_metrics()
    return _default


def serve_metrics(port: int, registry: CollectorRegistry | None = None) -> int:
    """Serve ``/metrics`` on 127.0.0.1; returns the bound port (a free one when ``port`` is 0)."""
    reg = registry or process_metrics().registry
    server, _thread = start_http_server(port, addr="127.0.0.1", registry=reg)
    return int(server.server_port)


def announce_metrics(port: int | None) -> None:
    """Serve ``/metrics`` when a ``--metrics-port`` was given and print where (a worker command's
    first line on stdout, which ``headroom up`` reads to find its scrape targets)."""
    if port is None:
        return
    bound = serve_metrics(port)
    print(f"metrics on http://127.0.0.1:{bound}/metrics", flush=True)
