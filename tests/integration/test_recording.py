"""Record and replay on a real broker, interoperating with kcat both ways."""

from __future__ import annotations

import subprocess
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import pytest

from headroom.streams.kafka import KafkaTarget
from headroom.streams.recording import ENVELOPE_FIELDS

pytestmark = pytest.mark.integration

Run = Callable[..., subprocess.CompletedProcess[str]]
KEYS = ["us-east", "eu-west", "ap-south", "us-west", "sa-east"]


def kcat_produce(bootstrap: str, topic: str, records: list[tuple[str, bytes]]) -> None:
    """One kcat run per key, in order (kcat -P takes one -k per run)."""
    by_key: dict[str, list[bytes]] = defaultdict(list)
    for key, value in records:
        by_key[key].append(value)
    for key, values in by_key.items():
        subprocess.run(
            [
                "kcat",
                "-P",
                "-b",
                bootstrap,
                "-t",
                topic,
                "-k",
                key,
                "-X",
                "topic.partitioner=murmur2_random",
            ],
            input=b"\n".join(values) + b"\n",
            check=True,
            timeout=30,
        )


def kcat_record(bootstrap: str, topic: str) -> bytes:
    return subprocess.run(
        ["kcat", "-C", "-J", "-e", "-q", "-b", bootstrap, "-t", topic, "-o", "beginning"],
        capture_output=True,
        check=True,
        timeout=30,
    ).stdout


def lines(raw: bytes) -> list[dict[str, Any]]:
    return [orjson.loads(line) for line in raw.splitlines() if line.strip()]


def per_key(envelopes: list[dict[str, Any]]) -> dict[str, list[str]]:
    out: dict[str, list[str]] = defaultdict(list)
    for env in sorted(envelopes, key=lambda e: (e["partition"], e["offset"])):
        out[env["key"]].append(env["payload"])
    return dict(out)


def _records(n: int) -> list[tuple[str, bytes]]:
    return [
        (KEYS[i % len(KEYS)], f'{{"seq":{i},"key":"{KEYS[i % len(KEYS)]}"}}'.encode())
        for i in range(n)
    ]


def test_a_kcat_recording_replays_with_the_same_keys_and_per_key_order(
    kafka_target: KafkaTarget, run_headroom: Run, tmp_path: Path
) -> None:
    source = kafka_target.topic("events")
    kcat_produce(kafka_target.bootstrap, source, _records(60))
    recording = tmp_path / "events.jsonl"
    recording.write_bytes(kcat_record(kafka_target.bootstrap, source))
    original = lines(recording.read_bytes())
    assert len(original) == 60
    assert {p["partition"] for p in original} == {0, 1}  # the keys spread over both partitions

    target = kafka_target.topic("requests")  # a fresh, empty topic of the same prefix
    done = run_headroom(
        "replay",
        str(recording),
        "--speed",
        "0",
        "--topic-map",
        f"{source}={target}",
        "--bootstrap",
        kafka_target.bootstrap,
    )
    assert done.returncode == 0, done.stderr
    summary = orjson.loads(done.stdout.strip().splitlines()[-1])
    assert summary == {"file": str(recording), "replayed": 60, "corrupt": 0}

    replayed = lines(kcat_record(kafka_target.bootstrap, target))
    assert per_key(replayed) == per_key(original)
    # Same key, same partition: a murmur2 partitioner on both sides.
    assert {(e["key"], e["partition"]) for e in replayed} == {
        (e["key"], e["partition"]) for e in original
    }


def test_a_headroom_recording_carries_kcats_envelope_fields(
    kafka_target: KafkaTarget, run_headroom: Run, tmp_path: Path
) -> None:
    topic = kafka_target.topic("value")
    kcat_produce(kafka_target.bootstrap, topic, _records(10))
    out = tmp_path / "value.jsonl"
    done = run_headroom(
        "record",
        "--topic",
        "value",
        "--out",
        str(out),
        "--from-beginning",
        "--timeout",
        "1",
        "--bootstrap",
        kafka_target.bootstrap,
        "--prefix",
        kafka_target.prefix,
    )
    assert done.returncode == 0, done.stderr
    assert orjson.loads(done.stdout.strip().splitlines()[-1]) == {"out": str(out), "records": 10}

    ours = lines(out.read_bytes())
    theirs = lines(kcat_record(kafka_target.bootstrap, topic))
    assert [list(e) for e in ours] == [list(e) for e in theirs]  # same fields, same order
    assert list(ours[0]) == [f for f in ENVELOPE_FIELDS if f != "headers"]

    def comparable(e: dict[str, Any]) -> tuple[Any, ...]:
        return (
            e["topic"],
            e["partition"],
            e["offset"],
            e["tstype"],
            e["ts"],
            e["key"],
            e["payload"],
        )

    assert sorted(map(comparable, ours)) == sorted(map(comparable, theirs))


def test_replay_reports_a_corrupt_line_and_replays_the_rest(
    kafka_target: KafkaTarget, run_headroom: Run, tmp_path: Path
) -> None:
    topic = kafka_target.topic("events")
    kcat_produce(kafka_target.bootstrap, topic, _records(4))
    good = kcat_record(kafka_target.bootstrap, topic).splitlines()
    recording = tmp_path / "damaged.jsonl"
    recording.write_bytes(b"\n".join([good[0], b'{"topic": "x", oops', *good[1:]]) + b"\n")
    target = kafka_target.topic("requests")

    done = run_headroom(
        "replay",
        str(recording),
        "--speed",
        "0",
        "--topic-map",
        f"{topic}={target}",
        "--bootstrap",
        kafka_target.bootstrap,
    )
    assert done.returncode == 1
    assert f"{recording}:2: corrupt line: not valid JSON" in done.stderr
    assert orjson.loads(done.stdout.strip().splitlines()[-1])["replayed"] == 4
    assert len(lines(kcat_record(kafka_target.bootstrap, target))) == 4


def test_replay_to_another_prefix_and_non_utf8_bytes_survive_the_round_trip(
    kafka_target: KafkaTarget, run_headroom: Run, tmp_path: Path
) -> None:
    # A recording "made in production" under another prefix, with bytes that are not UTF-8.
    topic = kafka_target.topic("latency")
    kcat_produce(kafka_target.bootstrap, topic, [("us-east", b"\xff\xfe raw \x80")])
    raw = kcat_record(kafka_target.bootstrap, topic)
    moved = raw.replace(topic.encode(), b"prod.latency")
    recording = tmp_path / "prod.jsonl"
    recording.write_bytes(moved)

    done = run_headroom(
        "replay",
        str(recording),
        "--speed",
        "1000",
        "--prefix",
        kafka_target.prefix,
        "--bootstrap",
        kafka_target.bootstrap,
    )
    assert done.returncode == 0, done.stderr
    # prod.latency moved to <prefix>latency: the original record and its replayed twin.
    again = [line for line in kcat_record(kafka_target.bootstrap, topic).splitlines() if line]
    assert len(again) == 2
    assert all(b'"payload":"\xff\xfe raw \x80"' in line for line in again)
