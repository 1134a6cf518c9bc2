"""aiokafka helpers: where every headroom process gets its producers, consumers and admin calls.

One place decides the client settings the project relies on:

* producers: ``acks="all"`` with idempotence (a retried batch is never written twice, and
  aiokafka never has two batches of one partition in flight, so per-key order survives
  retries), a short ``linger_ms`` so sends batch up (per-send overhead, not encoding, is the
  usual bottleneck — KAFKA.md);
* consumers: auto-commit off (at-least-once: :mod:`headroom.streams.consume` commits after
  processing), ``auto_offset_reset`` from ``--from-beginning``;
* admin: idempotent topic creation from :mod:`headroom.streams.topics`, config and partition
look-ups.

Addresses and prefixes are resolved by :mod:`headroom.kernel.settings` (flag, environment, local
broker), never here; the client security settings (``--kafka-config``) by
:mod:`headroom.streams.security`, installed once per process by :meth:`KafkaTarget.from_args` and
applied to every client made here. Failures to reach the cluster become
:class:`KafkaUnavailable` (exit 1) with the address in the message.
"""

from __future__ import annotations

import argparse
import asyncio
import os
from collections.abc import AsyncIterator, Iterable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType
from aiokafka.errors import KafkaConnectionError

from headroom.kernel.errors import HeadroomError
from headroom.kernel.settings import default_state_dir, resolve_bootstrap, resolve_prefix
from headroom.streams import security
from headroom.streams.security import PLAINTEXT, ClientSecurity
from headroom.streams.topics import (
    Topic,
    default_replication,
    min_insync_replicas,
    resolve_topic,
    topic_name,
)

CLIENT_ID = "headroom"
TOPIC_ALREADY_EXISTS = 36  # Kafka protocol error code
UNKNOWN_TOPIC_OR_PARTITION = 3


class KafkaUnavailable(HeadroomError):
    """The cluster could not be reached or refused a request."""


@dataclass(frozen=True)
class KafkaTarget:
    """A resolved ``--bootstrap``, ``--prefix`` and ``--kafka-config``: which cluster, which
    topic names, which credentials."""

    bootstrap: str
    prefix: str
    security: ClientSecurity = PLAINTEXT

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> KafkaTarget:
        """Resolve the three flags and install the security settings for this process."""
        flag = getattr(args, "bootstrap", None)
        local = flag is None and not os.environ.get("KAFKA_BOOTSTRAP_SERVERS")
        settings = security.resolve(
            getattr(args, "kafka_config", None), default_state_dir() if local else None
        )
        security.install(settings)
        return cls(
            bootstrap=resolve_bootstrap(flag),
            prefix=resolve_prefix(getattr(args, "prefix", None)),
            security=settings,
        )

    def topic(self, kind: str) -> str:
        """The full name of a topic kind (``capacity`` → ``<prefix>capacity``)."""
        return topic_name(kind, self.prefix)

    def resolve(self, text: str) -> tuple[str, str | None]:
        """A command-line topic, with or without the prefix: (full name, kind or None)."""
        return resolve_topic(text, self.prefix)


def make_producer(bootstrap: str, **overrides: Any) -> AIOKafkaProducer:
    """A producer with the project's defaults; ``overrides`` win (any aiokafka keyword)."""
    options: dict[str, Any] = {
        "bootstrap_servers": bootstrap,
        "client_id": CLIENT_ID,
        "acks": "all",
        "enable_idempotence": True,
        "linger_ms": 5,
        "request_timeout_ms": 30_000,
        **security.current().aiokafka_kwargs(),
    }
    options.update(overrides)
    return AIOKafkaProducer(**options)


def make_consumer(
    bootstrap: str,
    *topics: str,
    group_id: str | None = None,
    from_beginning: bool = False,
    **overrides: Any,
) -> AIOKafkaConsumer:
    """A consumer that never auto-commits. ``group_id=None``: no group, all partitions, no
    commits (a read-only tool such as ``record``); with a group, the caller commits."""
    options: dict[str, Any] = {
        "bootstrap_servers": bootstrap,
        "client_id": CLIENT_ID,
        "group_id": group_id,
        "enable_auto_commit": False,
        "auto_offset_reset": "earliest" if from_beginning else "latest",
        # The test broker allows 1 s session timeouts (group.min.session.timeout.ms=1000);
        # 10 s is aiokafka's default and safe on a busy 2-core machine.
        "session_timeout_ms": 10_000,
        "heartbeat_interval_ms": 1_000,
        "metadata_max_age_ms": 30_000,
        **security.current().aiokafka_kwargs(),
    }
    options.update(overrides)
    return AIOKafkaConsumer(*topics, **options)


@asynccontextmanager
async def admin(
    bootstrap: str, request_timeout_s: float = 30.0
) -> AsyncIterator[AIOKafkaAdminClient]:
    """A started admin client, closed on exit; :class:`KafkaUnavailable` if unreachable."""
    client = AIOKafkaAdminClient(
        bootstrap_servers=bootstrap,
        client_id=CLIENT_ID,
        request_timeout_ms=int(request_timeout_s * 1000),
        **security.current().aiokafka_kwargs(),
    )
    try:
        await client.start()
    except (KafkaConnectionError, OSError) as exc:
        await client.close()
        raise KafkaUnavailable(f"cannot reach Kafka at {bootstrap}: {exc}") from None
    try:
        yield client
    finally:
        await client.close()


@asynccontextmanager
async def started(
    client: AIOKafkaProducer | AIOKafkaConsumer, bootstrap: str
) -> AsyncIterator[None]:
    """Start a producer or consumer, stop it on exit; :class:`KafkaUnavailable` if unreachable."""
    try:
        await client.start()
    except (KafkaConnectionError, OSError) as exc:
        await client.stop()
        raise KafkaUnavailable(f"cannot reach Kafka at {bootstrap}: {exc}") from None
    try:
        yield
    finally:
        await client.stop()


@dataclass(frozen=True)
class CreateReport:
    """What ``create_topics`` did: names created now, names that already existed, and every
    way an existing topic differs from the registry (partition count, cleanup policy)."""

    created: tuple[str, ...]
    existing: tuple[str, ...]
    drift: tuple[str, ...] = ()


async def topic_partitions(
    client: AIOKafkaAdminClient, names: Iterable[str] | None = None
) -> dict[str, int]:
    """Partition count of each existing topic (all topics when ``names`` is None)."""
    described = await client.describe_topics(list(names) if names is not None else None)
    return {
        t["topic"]: len(t["partitions"])
        for t in described
        if t["error_code"] == 0 and not t.get("is_internal", False)
    }


async def topic_configs(
    client: AIOKafkaAdminClient, names: Iterable[str]
) -> dict[str, dict[str, str]]:
    """The effective configs of existing topics (defaults included), by name."""
    resources = [ConfigResource(ConfigResourceType.TOPIC, name) for name in names]
    if not resources:
        return {}
    out: dict[str, dict[str, str]] = {}
    for response in await client.describe_configs(resources):
        for res in response.to_object()["resources"]:
            if res["error_code"] != 0:
                continue
            out[res["resource_name"]] = {
                e["config_names"]: e["config_value"] for e in res["config_entries"]
            }
    return out


async def broker_count(client: AIOKafkaAdminClient) -> int:
    """How many brokers the cluster has (its metadata's broker list)."""
    described = await client.describe_cluster()
    return len(described["brokers"])


async def create_topics(
    bootstrap: str,
    wanted: Iterable[Topic],
    timeout_s: float = 30.0,
    *,
    replication_factor: int | None = None,
) -> CreateReport:
    """Create the missing topics of ``wanted``; leave existing ones alone (idempotent).

    Replication: ``replication_factor``, else each topic's own, else min(3, brokers), with
    ``min.insync.replicas`` = min(2, R) (:mod:`headroom.streams.topics`). An existing topic is
    never altered (it may hold data, and an operator may have tuned it); its differences from
    the registry are reported in ``drift`` instead.
    """
    wanted = list(wanted)
    async with admin(bootstrap, timeout_s) as client:
        existing = await topic_partitions(client, [t.name for t in wanted])
        missing = [t for t in wanted if t.name not in existing]
        created: list[str] = []
        raced: list[str] = []
        if missing:
            brokers = await broker_count(client)
            new_topics = []
            for t in missing:
                factor = replication_factor or t.replication_factor or default_replication(brokers)
                if factor > brokers:
                    raise KafkaUnavailable(
                        f"{t.name}: replication factor {factor} needs {factor} brokers; "
                        f"the cluster at {bootstrap} has {brokers}"
                    )
                configs = {"min.insync.replicas": str(min_insync_replicas(factor))}
                configs.update(t.configs)
                new_topics.append(NewTopic(t.name, t.partitions, factor, topic_configs=configs))
            response = await client.create_topics(new_topics, timeout_ms=int(timeout_s * 1000))
            failures = []
            for name, code, message in _topic_errors(response):
                if code == 0:
                    created.append(name)
                elif code == TOPIC_ALREADY_EXISTS:
                    raced.append(name)  # created concurrently by someone else: fine
                else:
                    failures.append(f"{name}: error {code}: {message}")
            if failures:
                raise KafkaUnavailable("could not create topics: " + "; ".join(failures))
        present = [t for t in wanted if t.name in existing]
        drift = await _drift(client, present, existing)
    return CreateReport(
        created=tuple(created),
        existing=tuple(sorted([*existing, *raced])),
        drift=drift,
    )


async def topic_replicas(client: AIOKafkaAdminClient, names: Iterable[str]) -> dict[str, int]:
    """The smallest replica count over the partitions of each existing topic, by name."""
    described = await client.describe_topics(list(names))
    return {
        t["topic"]: min(len(p["replicas"]) for p in t["partitions"])
        for t in described
        if t["error_code"] == 0 and t["partitions"]
    }


def _topic_errors(response: Any) -> list[tuple[str, int, str | None]]:
    obj = response.to_object()
    return [(e["topic"], e["error_code"], e.get("error_message")) for e in obj["topic_errors"]]


async def _drift(
    client: AIOKafkaAdminClient, present: list[Topic], partitions: Mapping[str, int]
) -> tuple[str, ...]:
    if not present:
        return ()
    configs = await topic_configs(client, [t.name for t in present])
    notes = []
    for t in present:
        if partitions.get(t.name) != t.partitions:
            notes.append(
                f"{t.name}: {partitions.get(t.name)} partitions (registry: {t.partitions})"
            )
        have = configs.get(t.name, {})
        for key, value in t.configs.items():
            if have.get(key) != value:
                notes.append(f"{t.name}: {key}={have.get(key)} (registry: {value})")
    return tuple(notes)


async def delete_topics(bootstrap: str, names: Iterable[str], timeout_s: float = 30.0) -> None:
    """Delete topics (missing ones are ignored); for tests and benchmarks that clean up."""
    names = list(names)
    if not names:
        return
    async with admin(bootstrap, timeout_s) as client:
        existing = await topic_partitions(client, names)
        doomed = [n for n in names if n in existing]
        if doomed:
            await client.delete_topics(doomed, timeout_ms=int(timeout_s * 1000))


async def wait_for_topics(
    bootstrap: str, names: Iterable[str], timeout_s: float = 30.0
) -> dict[str, int]:
    """Return once every named topic has a leader for each partition (just-created topics
    take a moment), with each topic's partition count; :class:`KafkaUnavailable` after
    ``timeout_s``."""
    names = list(names)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    async with admin(bootstrap, timeout_s) as client:
        while True:
            described = await client.describe_topics(names)
            ready = {
                t["topic"]
                for t in described
                if t["error_code"] == 0
                and t["partitions"]
                and all(p["leader"] >= 0 for p in t["partitions"])
            }
            if ready >= set(names):
                return {t["topic"]: len(t["partitions"]) for t in described if t["topic"] in ready}
            if loop.time() > deadline:
                missing = sorted(set(names) - ready)
                raise KafkaUnavailable(f"topics not ready after {timeout_s} s: {missing}")
            await asyncio.sleep(0.1)
