"""Prometheus metrics of every worker, declared in one place (``--metrics-port N``).

Each worker process serves ``/metrics`` when asked (``0`` = a free port, printed at start-up), on
``$HEADROOM_METRICS_HOST`` (default ``127.0.0.1``; a container sets ``0.0.0.0`` so that Prometheus
and the kubelet's probes reach it). The metric families are declared here once, in a registry per
process, so the names and labels are the same whichever worker exports them:

| metric | type | labels | set by |
|---|---|---|---|
| ``headroom_requests_total`` | counter | region, path, outcome | server, client |
| ``headroom_request_latency_seconds`` | histogram | region, path | server, client |
| ``headroom_slo_p99_seconds`` | gauge | region | server, client |
| ``headroom_shed_total`` | counter | region, side (server/client), lever | server, client |
| ``headroom_released_total`` | counter | region, lever (rma: candidates, sbm: requests) | server |
| ``headroom_release_latency_seconds`` | histogram | region, pool (reclaimed) | server |
| ``headroom_target_candidates`` | gauge | region | client |
| ``headroom_target_sbm_coverage`` | gauge | region | client |
| ``headroom_target_expired`` | gauge (1: baseline, the target expired) | region | client |
| ``headroom_target_held_scale`` | gauge (a held target's SBM factor; 1: none) | region | client |
| ``headroom_optional_multiplier`` | gauge | region, server | client |
| ``headroom_capacity_units`` | gauge | region, resource, hardware, pool | server |
| ``headroom_value_total`` | counter (sum of values) | region, lever, arm | client |
| ``headroom_value_requests_total`` | counter | region, lever, arm | client |
| ``headroom_messages_deadlettered_total`` | counter | topic | every consumer loop |
| ``headroom_consumer_lag_messages`` | gauge | topic | every consumer loop |
| ``headroom_controller_last_tick_timestamp_seconds`` | gauge | region | controller |
| ``headroom_controller_target_epoch`` | gauge | region | controller |
| ``headroom_controller_interval_seconds`` | gauge | | controller |

``headroom_value_*`` add up the value signals a client publishes (``arm`` treatment/control):
the holdout estimate of a lever's value per request is ``value/requests`` of its treatment arm
minus that of its control arm. Dead letters and consumer lag are read from the consumer loops a
worker registers (:meth:`Metrics.watch`) at scrape time; lag is the last known high-water mark
minus the consumer's fetch position, summed over the partitions it is assigned. The controller's
series come from :func:`watch_controller` (its dead letters with ``topic="any"``: the Faust app
counts them over all its inputs).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 1.0, 2.0, 5.0)
# a release is a few milliseconds when healthy; the goal is 50 ms
_RELEASE_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0)

METRICS_HOST_ENV = "HEADROOM_METRICS_HOST"


class _LoopCollector(Collector):
    """Dead letters and consumer lag of the consumer loops a worker registered."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._loops: list[tuple[Any, Any]] = []

    def watch(self, loop: Any, consumer: Any) -> None:
        with self._lock:
            self._loops.append((loop, consumer))

    def collect(self) -> Iterator[CounterMetricFamily | GaugeMetricFamily]:
        dead = CounterMetricFamily(
            "headroom_messages_deadlettered",
            "Messages sent to the dead-letter topic, by the topic they were read from",
            labels=["topic"],
        )
        lag = GaugeMetricFamily(
            "headroom_consumer_lag_messages",
            "Messages behind the high-water mark, summed over the assigned partitions",
            labels=["topic"],
        )
        with self._lock:
            loops = list(self._loops)
        dead_by_topic: dict[str, float] = {}
        lag_by_topic: dict[str, float] = {}
        for loop, consumer in loops:
            for topic, counts in dict(loop.stats.by_topic).items():
                n = counts.get("deadlettered", 0)
                dead_by_topic[topic] = dead_by_topic.get(topic, 0.0) + n
            for topic, n in consumer_lag(consumer).items():
                lag_by_topic[topic] = lag_by_topic.get(topic, 0.0) + n
        for topic, n in sorted(dead_by_topic.items()):
            dead.add_metric([topic], n)
        for topic, n in sorted(lag_by_topic.items()):
            lag.add_metric([topic], n)
        yield dead
        yield lag


def consumer_lag(consumer: Any) -> dict[str, int]:
    """Per topic, the high-water mark minus the fetch position over the partitions ``consumer``
    is assigned (partitions it has not fetched from yet are left out). Read without awaiting,
    from the scrape thread: aiokafka keeps both numbers in its assignment state."""
    out: dict[str, int] = {}
    try:
        assignment = consumer._subscription.subscription.assignment
        partitions = list(consumer.assignment())
    except Exception:  # not started, being rebalanced, or closed: nothing to report
        return out
    for tp in partitions:
        try:
            state = assignment.state_value(tp)
            high = state.highwater
            position = state.position if state.has_valid_position else None
        except Exception:
            continue
        if high is None or position is None:
            continue
        out[tp.topic] = out.get(tp.topic, 0) + max(0, int(high) - int(position))
    return out


class _ControllerCollector(Collector):
    """The controller's ticks, read from the Faust app's shared state at scrape time."""

    def __init__(self, controller: Any, interval_s: float) -> None:
        self._ctl = controller
        self._interval_s = interval_s

    def collect(self) -> Iterator[CounterMetricFamily | GaugeMetricFamily]:
        tick = GaugeMetricFamily(
            "headroom_controller_last_tick_timestamp_seconds",
            "Wall time of the newest target the controller issued for a region",
            labels=["region"],
        )
        epoch = GaugeMetricFamily(
            "headroom_controller_target_epoch",
            "Epoch of the newest target the controller issued for a region",
            labels=["region"],
        )
        interval = GaugeMetricFamily(
            "headroom_controller_interval_seconds", "Control interval (wall seconds)"
        )
        interval.add_metric([], self._interval_s)
        dead = CounterMetricFamily(
            "headroom_messages_deadlettered",
            "Messages sent to the dead-letter topic, by the topic they were read from",
            labels=["topic"],
        )
        dead.add_metric(["any"], float(getattr(self._ctl, "deadlettered", 0)))
        plane = self._ctl.plane
        for region in tuple(plane.regions):
            decision = plane.decision(region)
            if decision is None:
                continue
            tick.add_metric([region], float(decision.targets.ts))
            epoch.add_metric([region], float(decision.targets.epoch))
        yield tick
        yield epoch
        yield interval
        yield dead


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
    slo: Gauge
    released: Counter
    release_latency: Histogram
    target_expired: Gauge
    target_held: Gauge
    value: Counter
    value_requests: Counter
    loops: _LoopCollector = field(repr=False)

    def watch(self, loop: Any, consumer: Any) -> None:
        """Export the dead letters of ``loop`` (a consumer loop) and the lag of ``consumer``."""
        self.loops.watch(loop, consumer)


def make_metrics(registry: CollectorRegistry | None = None) -> Metrics:
    reg = registry or CollectorRegistry()
    loops = _LoopCollector()
    reg.register(loops)
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
        slo=Gauge(
            "headroom_slo_p99_seconds", "The p99 latency objective", ["region"], registry=reg
        ),
        released=Counter(
            "headroom_released",
            "Optional work released after a capacity reclaim (rma: candidates, sbm: requests)",
            ["region", "lever"],
            registry=reg,
        ),
        release_latency=Histogram(
            "headroom_release_latency_seconds",
            "From a reclaim seen by a server to its optional work fitting the remaining capacity",
            ["region", "pool"],
            buckets=_RELEASE_BUCKETS,
            registry=reg,
        ),
        target_expired=Gauge(
            "headroom_target_expired",
            "1 while the newest target expired and the baseline is in force",
            ["region"],
            registry=reg,
        ),
        target_held=Gauge(
            "headroom_target_held_scale",
            "Factor on the SBM shares of a target held past its interval (1: not held)",
            ["region"],
            registry=reg,
        ),
        value=Counter(
            "headroom_value",
            "Sum of the request values of the value signals published",
            ["region", "lever", "arm"],
            registry=reg,
        ),
        value_requests=Counter(
            "headroom_value_requests",
            "Requests counted in the value signals published",
            ["region", "lever", "arm"],
            registry=reg,
        ),
        loops=loops,
    )


_default: Metrics | None = None


def process_metrics() -> Metrics:
    """The metrics of this process (created on first use; one registry per process)."""
    global _default
    if _default is None:
        _default = make_metrics()
    return _default


def watch_controller(controller: Any, interval_s: float, metrics: Metrics | None = None) -> None:
    """Export the controller's ticks and dead letters (``controller``: the Faust app's shared
    state, :class:`headroom.controllers.app.Controller`)."""
    (metrics or process_metrics()).registry.register(_ControllerCollector(controller, interval_s))


def metrics_host() -> str:
    """The address ``/metrics`` binds: ``$HEADROOM_METRICS_HOST``, else loopback."""
    return os.environ.get(METRICS_HOST_ENV, "").strip() or "127.0.0.1"


def serve_metrics(port: int, registry: CollectorRegistry | None = None) -> int:
    """Serve ``/metrics`` on :func:`metrics_host`; returns the bound port (a free one when
    ``port`` is 0)."""
    reg = registry or process_metrics().registry
    server, _thread = start_http_server(port, addr=metrics_host(), registry=reg)
    return int(server.server_port)


def announce_metrics(port: int | None) -> None:
    """Serve ``/metrics`` when a ``--metrics-port`` was given and print where (a worker command's
    first line on stdout, which ``headroom up`` reads to find its scrape targets)."""
    if port is None:
        return
    bound = serve_metrics(port)
    print(f"metrics on http://127.0.0.1:{bound}/metrics", flush=True)
