"""The topic registry against docs/messages.md and the message types."""

from __future__ import annotations

import pytest

from headroom.kernel.errors import ConfigError
from headroom.streams import messages, topics


def test_the_registry_covers_every_message_kind_once() -> None:
    assert topics.KINDS == messages.TOPIC_KINDS


def test_capacity_targets_and_precompute_are_compacted_the_rest_time_based() -> None:
    compacted = {spec.kind for spec in topics.REGISTRY if spec.compacted}
    assert compacted == {"capacity", "targets", "precompute"}
    for spec in topics.REGISTRY:
        if not spec.compacted:
            assert spec.configs["cleanup.policy"] == "delete"
            assert int(spec.configs["retention.ms"]) > 0


def test_deadletter_keeps_the_longest_and_latency_the_shortest() -> None:
    retention = {s.kind: int(s.configs["retention.ms"]) for s in topics.REGISTRY if not s.compacted}
    assert max(retention, key=retention.__getitem__) == "deadletter"
    assert min(retention, key=retention.__getitem__) == "latency"


def test_region_keyed_topics_share_one_partition_count() -> None:
    made = topics.topics("p.", partitions=3)
    counts = {t.kind: t.partitions for t in made}
    assert counts.pop("deadletter") == 1
    assert set(counts.values()) == {3}
    assert [t.name for t in made] == [f"p.{k}" for k in topics.KINDS]


def test_names_resolve_with_or_without_the_prefix() -> None:
    assert topics.resolve_topic("capacity", "x.") == ("x.capacity", "capacity")
    assert topics.resolve_topic("x.capacity", "x.") == ("x.capacity", "capacity")
    assert topics.resolve_topic("other.capacity", "x.") == ("other.capacity", None)
    assert topics.kind_of("x.nope", "x.") is None
    assert topics.trailing_kind("prod.targets") == "targets"
    assert topics.trailing_kind("unrelated") is None


def test_unknown_kinds_and_partition_counts_are_config_errors() -> None:
    with pytest.raises(ConfigError, match="unknown kind"):
        topics.topic_name("nope")
    with pytest.raises(ConfigError, match="partitions"):
        topics.topics("x.", partitions=0)
