"""``headroom topics create|list|validate``.

* ``create`` makes every registry topic under the prefix that does not exist yet (idempotent:
  running it twice changes nothing the second time), with ``--replication-factor R`` replicas
  (default min(3, brokers)) and ``min.insync.replicas`` = min(2, R), and prints one line per
  topic — ``created`` or ``exists`` — with its partitions, replicas and configs. An existing
  topic that differs from the registry is left alone and the difference logged
  (``topics.topic.drifted``).
* ``list`` prints the registry itself (no broker needed).
* ``validate TOPIC`` consumes the topic until ``--timeout`` seconds pass with no new message,
  checks every message against the contract through the shared consumer loop (so the invalid
  ones are dead-lettered exactly as a worker would), and prints as its last stdout line
  ``{"topic":"<name>","valid":N,"invalid":M}``. It reads without a consumer group: it commits
  nothing and never disturbs the offsets of the real consumers.
"""

from __future__ import annotations

import argparse
import asyncio
import sys

import orjson

from headroom.kernel.errors import ConfigError
from headroom.kernel.logs import get_logger
from headroom.kernel.settings import resolve_prefix
from headroom.streams import kafka
from headroom.streams.consume import ConsumerLoop, LoopConfig, Received, consume, stop_on_signals
from headroom.streams.topics import KINDS, REGISTRY, Topic, topics


def _format_configs(configs: dict[str, str]) -> str:
    return " ".join(f"{k}={v}" for k, v in sorted(configs.items()))


def create(args: argparse.Namespace) -> int:
    target = kafka.KafkaTarget.from_args(args)
    log = get_logger("topics")
    wanted = topics(target.prefix)
    factor = getattr(args, "replication_factor", None)
    report, replicas = asyncio.run(_create(target, wanted, factor))
    for note in report.drift:
        log.warning("topics.topic.drifted", difference=note, hint="left unchanged")
    for t in wanted:
        what = "created" if t.name in report.created else "exists"
        print(
            f"{what:8} {t.name:32} partitions={t.partitions} replicas={replicas.get(t.name)} "
            f"{_format_configs(dict(t.configs))}"
        )
    log.info(
        "topics.created",
        bootstrap=target.bootstrap,
        prefix=target.prefix,
        created=len(report.created),
        existing=len(report.existing),
        **target.security.describe(),
    )
    return 0


async def _create(
    target: kafka.KafkaTarget, wanted: list[Topic], factor: int | None
) -> tuple[kafka.CreateReport, dict[str, int]]:
    report = await kafka.create_topics(target.bootstrap, wanted, replication_factor=factor)
    names = [t.name for t in wanted]
    await kafka.wait_for_topics(target.bootstrap, names)
    async with kafka.admin(target.bootstrap) as client:
        replicas = await kafka.topic_replicas(client, names)
    return report, replicas


def list_topics(args: argparse.Namespace) -> int:
    prefix = resolve_prefix(getattr(args, "prefix", None))
    for spec, t in zip(REGISTRY, topics(prefix), strict=True):
        print(
            f"{t.name:32} partitions={t.partitions} key={spec.key!r} "
            f"{_format_configs(dict(t.configs))}  # {spec.description}"
        )
    return 0


def validate(args: argparse.Namespace) -> int:
    target = kafka.KafkaTarget.from_args(args)
    name, kind = target.resolve(args.topic)
    if kind is None:
        raise ConfigError(
            f"TOPIC: {args.topic!r} is not a headroom topic under prefix {target.prefix!r} "
            f"(kinds: {', '.join(KINDS)})"
        )
    stats = asyncio.run(_validate(target, name, bool(args.from_beginning), float(args.timeout)))
    line = {"topic": name, "valid": stats[0], "invalid": stats[1]}
    sys.stdout.write(orjson.dumps(line).decode() + "\n")
    sys.stdout.flush()
    return 0


async def _validate(
    target: kafka.KafkaTarget, name: str, from_beginning: bool, idle_s: float
) -> tuple[int, int]:
    async with kafka.admin(target.bootstrap) as client:
        if name not in await kafka.topic_partitions(client, [name]):
            raise ConfigError(
                f"TOPIC: {name!r} does not exist on {target.bootstrap} "
                "(create the topics with `headroom topics create`)"
            )
    await kafka.wait_for_topics(target.bootstrap, [name], timeout_s=10.0)
    loops: list[ConsumerLoop] = []

    def handle(_record: Received) -> None:
        """Decoding already validated the message: nothing more to do with a valid one."""

    def request_stop() -> None:
        for loop in loops:
            loop.stop()

    async with stop_on_signals(request_stop):
        stats = await consume(
            target.bootstrap,
            [name],
            handle,
            prefix=target.prefix,
            group_id=None,
            from_beginning=from_beginning,
            config=LoopConfig(idle_timeout_s=idle_s),
            on_loop=loops.append,
            component="validate",
        )
    return stats.processed, stats.invalid
