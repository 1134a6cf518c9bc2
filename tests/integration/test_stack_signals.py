"""``headroom up`` stops everything it started when it is interrupted (SIGTERM, like Ctrl-C)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import REPO

pytestmark = pytest.mark.integration

SCENARIO = Path(__file__).parent / "scenarios" / "stack-short.yaml"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie is gone for our purpose; it is up's child and reaped by up, so check /proc
    try:
        state = Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0]
    except OSError:
        return False
    return state != "Z"


def test_up_interrupted_stops_every_process_it_started(
    kafka_bootstrap: str, topic_prefix: str, tmp_path: Path
) -> None:
    env = {**os.environ, "HEADROOM_LOG_FORMAT": "json"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "headroom.cli", "up", str(SCENARIO), "--out", str(tmp_path),
         "--bootstrap", kafka_bootstrap, "--prefix", topic_prefix, "--no-plots"],
        cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert proc.stderr is not None
    pids: list[int] = []
    deadline = time.monotonic() + 120
    started = False
    while time.monotonic() < deadline:
        line = proc.stderr.readline()
        if not line:
            break
        try:
            event = json.loads(line)
        except json.JSONDecodeError:
            continue
        if event.get("event") == "up.process.started":
            pids.append(int(event["pid"]))
        if event.get("event") == "up.stack.started":
            started = True
            break
    assert started, "the stack did not start"
    assert len(pids) == 6  # controller, 2 dedicated + 1 strong replica, client, feed
    assert all(_alive(pid) for pid in pids)
    proc.send_signal(signal.SIGTERM)
    _out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err[-2000:]
    assert "every process it started was stopped" in err
    assert not [pid for pid in pids if _alive(pid)]
