"""`headroom topics create|validate` on a real broker, checked with kcat and the admin API."""

from __future__ import annotations

import base64
import subprocess
import uuid
from collections.abc import Callable
from typing import Any

import orjson
import pytest

from headroom.streams import messages
from headroom.streams.kafka import admin, topic_configs, topic_partitions, wait_for_topics
from headroom.streams.topics import KINDS

from ..conftest import run_async

pytestmark = pytest.mark.integration

Run = Callable[..., subprocess.CompletedProcess[str]]

GOOD_CAPACITY = {
    "v": 1,
    "ts": 1796000000.0,
    "region": "us-east",
    "resource": "accelerator",
    "hardware": "gpu-b",
    "pool": "opportunistic",
    "units": 4.0,
    "expires_in_s": 1800.0,
    "reason": "grant",
    "id": "c-0001",
}


def kcat_produce(bootstrap: str, topic: str, key: str, lines: list[bytes]) -> None:
    subprocess.run(
        ["kcat", "-P", "-b", bootstrap, "-t", topic, "-k", key],
        input=b"\n".join(lines) + b"\n",
        check=True,
        timeout=30,
    )


def kcat_consume(bootstrap: str, topic: str) -> list[dict[str, Any]]:
    out = subprocess.run(
        ["kcat", "-C", "-J", "-e", "-q", "-b", bootstrap, "-t", topic, "-o", "beginning"],
        capture_output=True,
        check=True,
        timeout=30,
    ).stdout
    return [orjson.loads(line) for line in out.splitlines() if line.strip()]


async def _describe(bootstrap: str, names: list[str]) -> tuple[dict[str, int], dict[str, Any]]:
    async with admin(bootstrap) as client:
        return await topic_partitions(client, names), await topic_configs(client, names)


def test_create_is_idempotent_and_sets_the_registry_configs(
    kafka_bootstrap: str, run_headroom: Run
) -> None:
    prefix = f"c{uuid.uuid4().hex[:10]}."
    first = run_headroom("topics", "create", "--bootstrap", kafka_bootstrap, "--prefix", prefix)
    assert first.returncode == 0, first.stderr
    assert [line.split()[0] for line in first.stdout.splitlines()] == ["created"] * len(KINDS)

    second = run_headroom("topics", "create", "--bootstrap", kafka_bootstrap, "--prefix", prefix)
    assert second.returncode == 0, second.stderr
    assert [line.split()[0] for line in second.stdout.splitlines()] == ["exists"] * len(KINDS)
    assert "drifted" not in second.stderr  # nothing differs from the registry

    names = [f"{prefix}{k}" for k in KINDS]
    partitions, configs = run_async(_describe(kafka_bootstrap, names))
    for kind in KINDS:
        policy = configs[f"{prefix}{kind}"]["cleanup.policy"]
        expected = "compact" if kind in {"capacity", "targets", "precompute"} else "delete"
        assert policy == expected, kind
    assert partitions[f"{prefix}deadletter"] == 1
    assert run_async(wait_for_topics(kafka_bootstrap, names)) == partitions
    assert {partitions[f"{prefix}{k}"] for k in KINDS if k != "deadletter"} == {4}

    listed = subprocess.run(
        ["kcat", "-L", "-b", kafka_bootstrap],
        capture_output=True,
        text=True,
        check=True,
        timeout=30,
    ).stdout
    for name in names:
        assert f'topic "{name}"' in listed


def test_validate_counts_valid_and_invalid_and_deadletters_the_invalid(
    kafka_bootstrap: str, topic_prefix: str, run_headroom: Run
) -> None:
    topic = f"{topic_prefix}capacity"
    good2 = orjson.dumps({**GOOD_CAPACITY, "id": "c-0002", "units": 2.0})
    bad_units = orjson.dumps({**GOOD_CAPACITY, "units": -1.0})
    lines = [orjson.dumps(GOOD_CAPACITY), b"{not json", good2, bad_units]
    kcat_produce(kafka_bootstrap, topic, "us-east", lines)

    done = run_headroom(
        "topics",
        "validate",
        "capacity",
        "--from-beginning",
        "--timeout",
        "1",
        "--bootstrap",
        kafka_bootstrap,
        "--prefix",
        topic_prefix,
    )
    assert done.returncode == 0, done.stderr
    last = done.stdout.strip().splitlines()[-1]
    assert last == f'{{"topic":"{topic}","valid":2,"invalid":2}}'

    letters = [
        messages.decode("deadletter", rec["payload"].encode())
        for rec in kcat_consume(kafka_bootstrap, f"{topic_prefix}deadletter")
    ]
    assert len(letters) == 2
    originals = {base64.b64decode(dl.payload_b64) for dl in letters}  # type: ignore[union-attr]
    assert originals == {b"{not json", bad_units}
    errors = sorted(dl.error for dl in letters)  # type: ignore[union-attr]
    assert errors[0].startswith("$: not valid UTF-8 JSON")
    assert errors[1].startswith("units: ")


def test_validate_rejects_a_topic_that_is_not_headrooms_with_exit_2(
    kafka_bootstrap: str, run_headroom: Run
) -> None:
    done = run_headroom("topics", "validate", "nonsense", "--bootstrap", kafka_bootstrap)
    assert done.returncode == 2
    assert "TOPIC: 'nonsense' is not a headroom topic" in done.stderr
    assert "Traceback" not in done.stderr


def test_replication_defaults_to_the_cluster_size_and_cannot_exceed_it(
    kafka_bootstrap: str, run_headroom: Run
) -> None:
    prefix = f"c{uuid.uuid4().hex[:10]}."
    made = run_headroom("topics", "create", "--bootstrap", kafka_bootstrap, "--prefix", prefix)
    assert made.returncode == 0, made.stderr
    assert all("replicas=1" in line for line in made.stdout.splitlines())  # one broker
    _partitions, configs = run_async(_describe(kafka_bootstrap, [f"{prefix}capacity"]))
    assert configs[f"{prefix}capacity"]["min.insync.replicas"] == "1"
    other = f"c{uuid.uuid4().hex[:10]}."
    refused = run_headroom(
        "topics", "create", "--bootstrap", kafka_bootstrap, "--prefix", other,
        "--replication-factor", "2",
    )  # fmt: skip
    assert refused.returncode == 1
    assert "replication factor 2 needs 2 brokers" in refused.stderr
