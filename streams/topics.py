"""The registry of headroom's Kafka topics (docs/messages.md): names, partitions, keys, configs.

A topic's *kind* is its name without the prefix (``headroom.capacity`` → ``capacity``); the
kind selects the message type (:data:`headroom.streams.messages.TYPES`). The prefix is configurable
(``--prefix``, ``$HEADROOM_TOPIC_PREFIX``; default ``headroom.``) so several deployments, or
every integration test, can share one cluster.

Retention follows the contract's table:

* **compacted**, key = region (``capacity``, ``targets``) or ``region/user`` (``precompute``):
  the newest value per key is the state; older ones may be cleaned away. ``segment.ms`` of one
  hour lets the cleaner reach a segment within the hour instead of the 7-day default.
* **time-based**: ``latency`` short (6 h — controllers only need the last minutes),
  ``requests`` 1 day (enough to record a day of traffic), ``value`` and ``events`` 7 days (the
  analysis horizon), ``deadletter`` long (30 days: operators must have time to look).

Partitions: every region-keyed topic has the same count (default 4), so a Faust agent that
joins two of them stays co-partitioned; ``deadletter`` has one partition (low volume, one
total order for operators).

Scaling out (docs/streaming.md, *Scaling out*):

* a region-keyed record lands on partition :func:`partition_for` of its key — Kafka's default
  partitioner (murmur2 of the key bytes), computed here so a controller knows which regions the
  partitions it was assigned hold (:func:`region_partition`);
* ``requests`` is keyed ``region/shard`` (:func:`request_key`): the shard is a stable hash of
  the user id modulo the topic's partition count (:func:`request_shard`), and the feed writes a
  request to partition ``shard``. A region's traffic is thus spread over every partition, the
  region's client group splits the partitions between its members, and one user always goes to
  the same shard. :func:`key_region` reads the region back from either form of key.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from headroom.kernel.errors import ConfigError
from headroom.kernel.settings import DEFAULT_PREFIX

DEFAULT_PARTITIONS = 4
HOUR_MS = 3_600_000
DAY_MS = 24 * HOUR_MS

# Kafka's broker-side limit is max.message.bytes (default 1 MiB + 12 bytes of overhead); the
# contract rejects messages over 1 MiB anyway, and dead letters are clipped to fit.
_COMPACTED = {"cleanup.policy": "compact", "segment.ms": str(HOUR_MS)}


@dataclass(frozen=True)
class TopicSpec:
    """One topic kind: how it is keyed, partitioned and retained."""

    kind: str
    key: str  # what the record key holds
    description: str
    configs: Mapping[str, str] = field(default_factory=dict)
    partitions: int | None = None  # None: the registry's default count

    @property
    def compacted(self) -> bool:
        return "compact" in self.configs.get("cleanup.policy", "")


@dataclass(frozen=True)
class Topic:
    """A registry entry bound to a prefix and a partition count: what ``topics create`` makes."""

    name: str
    spec: TopicSpec
    partitions: int
    # None: the cluster's default, min(3, brokers) (:func:`default_replication`)
    replication_factor: int | None = None

    @property
    def kind(self) -> str:
        return self.spec.kind

    @property
    def configs(self) -> Mapping[str, str]:
        return self.spec.configs


def _spec(
    kind: str, key: str, description: str, configs: dict[str, str], partitions: int | None = None
) -> TopicSpec:
    return TopicSpec(kind, key, description, MappingProxyType(dict(configs)), partitions)


REGISTRY: tuple[TopicSpec, ...] = (
    _spec("capacity", "region", "capacity levels from the capacity feed", _COMPACTED),
    _spec(
        "latency",
        "region",
        "latency samples and sketches from ranking servers",
        {"cleanup.policy": "delete", "retention.ms": str(6 * HOUR_MS)},
    ),
    _spec(
        "requests",
        "region/shard",
        "request traffic from the traffic feed or a replay",
        {"cleanup.policy": "delete", "retention.ms": str(DAY_MS)},
    ),
    _spec("targets", "region", "targets from the controllers", _COMPACTED),
    _spec(
        "value",
        "region",
        "value signals (treatment and control sums) from clients",
        {"cleanup.policy": "delete", "retention.ms": str(7 * DAY_MS)},
    ),
    _spec(
        "events",
        "region",
        "decisions worth analysing, from every component",
        {"cleanup.policy": "delete", "retention.ms": str(7 * DAY_MS)},
    ),
    _spec(
        "deadletter",
        "the bad message's own key",
        "messages that failed validation, with reason and original bytes",
        # A dead letter is at most 1 MiB; 2 MiB leaves room for the batch around it.
        {
            "cleanup.policy": "delete",
            "retention.ms": str(30 * DAY_MS),
            "max.message.bytes": str(2 * 1024 * 1024),
        },
        partitions=1,
    ),
    _spec(
        "precompute",
        "region/user",
        "precomputed rankings (a null value deletes one)",
        _COMPACTED,
    ),
)
KINDS: tuple[str, ...] = tuple(spec.kind for spec in REGISTRY)
_BY_KIND: Mapping[str, TopicSpec] = MappingProxyType({spec.kind: spec for spec in REGISTRY})


def spec_for(kind: str) -> TopicSpec:
    try:
        return _BY_KIND[kind]
    except KeyError:
        raise ConfigError(f"topic: unknown kind {kind!r} (known: {', '.join(KINDS)})") from None


def topic_name(kind: str, prefix: str = DEFAULT_PREFIX) -> str:
    """The full name of a kind under a prefix (``capacity`` → ``headroom.capacity``)."""
    spec_for(kind)
    return f"{prefix}{kind}"


def kind_of(name: str, prefix: str = DEFAULT_PREFIX) -> str | None:
    """The kind of a full topic name under ``prefix``, or None when it is not one of ours."""
    if not name.startswith(prefix):
        return None
    rest = name[len(prefix) :]
    return rest if rest in _BY_KIND else None


def resolve_topic(text: str, prefix: str = DEFAULT_PREFIX) -> tuple[str, str | None]:
    """A topic given on the command line, "with or without the prefix": (full name, kind).

    ``capacity`` → ``(headroom.capacity, capacity)``; ``headroom.capacity`` → same; any other
    name is taken as it is, with kind None (record and replay accept foreign topics too).
    """
    if text in _BY_KIND:
        return f"{prefix}{text}", text
    return text, kind_of(text, prefix)


def trailing_kind(name: str) -> str | None:
    """The kind a topic name ends with, whatever its prefix (``prod.capacity`` → ``capacity``).

    Replay uses it to move a recording made under one prefix to another.
    """
    for kind in KINDS:
        if name == kind or (name.endswith(kind) and len(name) > len(kind)):
            return kind
    return None


def topics(prefix: str = DEFAULT_PREFIX, partitions: int = DEFAULT_PARTITIONS) -> list[Topic]:
    """Every registry topic under ``prefix``, region-keyed ones with ``partitions`` partitions."""
    if partitions < 1:
        raise ConfigError(f"partitions: {partitions} must be >= 1")
    return [Topic(f"{prefix}{spec.kind}", spec, spec.partitions or partitions) for spec in REGISTRY]


def default_replication(brokers: int) -> int:
    """The replication factor of headroom's topics on a cluster of ``brokers``: min(3, brokers)
    (three copies survive one broker down with a second one still to spare)."""
    return max(1, min(3, brokers))


def min_insync_replicas(replication_factor: int) -> int:
    """``min.insync.replicas`` for a topic of that replication factor: min(2, R). With
    ``acks=all`` a write then reaches two brokers before it counts, and one broker may be down
    without stopping producers."""
    return max(1, min(2, replication_factor))


# -- keys and partitions (scaling out) --------------------------------------------------------

SHARD_SEP = "/"


def murmur2(data: bytes) -> int:
    """Kafka's murmur2 hash of ``data`` (the Java client's and aiokafka's default partitioner)."""
    length = len(data)
    seed = 0x9747B28C
    m = 0x5BD1E995
    r = 24
    h = (seed ^ length) & 0xFFFFFFFF
    n4 = length // 4
    for i in range(n4):
        i4 = i * 4
        k = data[i4] | (data[i4 + 1] << 8) | (data[i4 + 2] << 16) | (data[i4 + 3] << 24)
        k = (k * m) & 0xFFFFFFFF
        k ^= k >> r
        k = (k * m) & 0xFFFFFFFF
        h = (h * m) & 0xFFFFFFFF
        h ^= k
    extra = length % 4
    if extra >= 3:
        h ^= data[(length & ~3) + 2] << 16
    if extra >= 2:
        h ^= data[(length & ~3) + 1] << 8
    if extra >= 1:
        h ^= data[length & ~3]
        h = (h * m) & 0xFFFFFFFF
    h ^= h >> 13
    h = (h * m) & 0xFFFFFFFF
    h ^= h >> 15
    return h


def partition_for(key: bytes, partitions: int) -> int:
    """The partition Kafka's default partitioner gives a record with ``key``."""
    if partitions < 1:
        raise ConfigError(f"partitions: {partitions} must be >= 1")
    return (murmur2(key) & 0x7FFFFFFF) % partitions


def region_partition(region: str, partitions: int) -> int:
    """The partition of ``region`` on every region-keyed topic (and the controller's tables)."""
    return partition_for(region.encode(), partitions)


def request_shard(user: int, partitions: int) -> int:
    """The shard (= partition) of a request of ``user`` on ``requests`` with ``partitions``
    partitions: a stable integer hash (splitmix64's finaliser) of the user id, modulo the count.
    Stable across processes and releases: one user's requests always share a shard."""
    if partitions < 1:
        raise ConfigError(f"partitions: {partitions} must be >= 1")
    z = (int(user) + 0x9E3779B97F4A7C15) & 0xFFFFFFFFFFFFFFFF
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & 0xFFFFFFFFFFFFFFFF
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & 0xFFFFFFFFFFFFFFFF
    z ^= z >> 31
    return z % partitions


def request_key(region: str, shard: int) -> bytes:
    """The key of a request on ``requests``: ``region/shard``."""
    return f"{region}{SHARD_SEP}{int(shard)}".encode()


def key_region(key: bytes | str | None) -> str | None:
    """The region a record key names: ``region`` or ``region/shard`` (None: no key)."""
    if key is None:
        return None
    text = key.decode(errors="replace") if isinstance(key, bytes) else key
    head, sep, tail = text.rpartition(SHARD_SEP)
    return head if sep and tail.isdigit() else text


def keyed_partition(kind: str | None, key: bytes | None, partitions: int) -> int | None:
    """The partition a record of ``kind`` with ``key`` must go to when not the default
    partitioner's: a ``requests`` record keyed ``region/shard`` goes to partition ``shard``
    (modulo ``partitions``, for a topic with fewer partitions than the one it came from); None:
    the producer's partitioner decides (murmur2 of the key)."""
    if kind != "requests" or key is None or partitions < 1:
        return None
    _head, sep, tail = key.decode(errors="replace").rpartition(SHARD_SEP)
    return int(tail) % partitions if sep and tail.isdigit() else None
