"""Fixtures shared by every test layer.

* ``kafka_bootstrap`` (session): the address of a real Kafka broker. ``$KAFKA_BOOTSTRAP_SERVERS``
  when set (``make test`` starts one broker for the whole run); otherwise the broker is started
  here, once per session, in a temporary state directory on a free port, and stopped at the end.
  It is started only when a test asks for it, so unit tests never pay for it. A broker that
  cannot be had is a test *failure*, never a skip (README.md, *Tests*).
* ``topic_prefix`` (per test): a unique prefix (``t<hex>.``) with every registry topic created
  under it (2 partitions each, the dead-letter topic 1), so tests never see each other's
  messages; the topics are deleted afterwards.
* ``kafka_target``: the two together, as :class:`headroom.streams.kafka.KafkaTarget`.
* ``run_headroom``: run the ``headroom`` command line in a subprocess (JSON logs on stderr).

Admin calls run their own event loop in a worker thread, so these synchronous fixtures work
the same under plain and asyncio tests.

The tests that compare the two engines' figures (test_engines_agree.py) run after every other
test of the session, so that the real-time stacks compared with the simulator have the host to
themselves as far as the suite goes.

``--lane NAME`` keeps one part of the suite (the others are deselected); ``make test``
(tools/run-tests.sh ``--whole-suite``) runs the parts as pytest processes side by side:

* ``compute`` (under ``nice``): tests/unit, tests/simulation and the integration modules that need
  no broker and no real time, only CPU (``OFFLINE``: the wheel build, the report in Chromium);
* ``stacks`` and ``kafka``: the rest of tests/integration, which mostly waits on real time, in two
  processes — the modules of ``STACKS`` (long ``headroom up`` runs) and all the others;
* ``last``: the modules of ``RUN_LAST``, started once those two have ended.

Each integration module runs whole in one lane (its module fixtures run once); every test has
its own topic prefix, so the lanes share the one broker of the run.

Hypothesis runs without its per-example deadline and too-slow health check: ``make test`` runs the
unit tests niced beside the integration tests, so an example's wall time says nothing about the
code.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import uuid
from collections.abc import Callable, Coroutine, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

import pytest
from hypothesis import HealthCheck, settings

from headroom.kernel.errors import HeadroomError
from headroom.streams import broker
from headroom.streams.kafka import KafkaTarget, create_topics, delete_topics, wait_for_topics
from headroom.streams.topics import topics

settings.register_profile(
    "shared-host", deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.load_profile("shared-host")

T = TypeVar("T")
RUN_LAST = ("test_engines_agree.py",)
# integration modules that compute and need neither a broker nor real time
OFFLINE = ("test_report_browser.py", "test_wheel.py")
# The long `headroom up` runs, in a lane of their own beside the other Kafka tests (`kafka`); the
# two lanes took ~10 minutes each on the 2-core development machine. Three lanes (these split in
# two) made stacks miss SLO windows and controllers their start-up there, under other work; and
# the three-broker stack, when it ran in `kafka`, failed baseline requests in its first window
# while another stack of this lane started its five processes on the same two cores.
STACKS = {
    "stacks": (
        "test_stack_faults.py",
        "test_stack_replicated.py",
        "test_stack_scale.py",
        "test_stack_secure.py",
        "test_stack_signals.py",
        "test_stack_up.py",
    ),
}
LANES = ("compute", *STACKS, "kafka", "last")
TEST_PARTITIONS = 2
REPO = Path(__file__).resolve().parent.parent


def run_async(coro: Coroutine[Any, Any, T]) -> T:
    """Run a coroutine to completion in a fresh event loop on a worker thread."""
    with ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(asyncio.run, coro).result()


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--lane",
        choices=LANES,
        default=None,
        help="run one part of the suite only (tests/conftest.py; make test runs them side by side)",
    )


def lane_of(path: Path) -> str:
    """The lane of the test module at ``path`` (see the module docstring)."""
    if path.name in RUN_LAST:
        return "last"
    if path.parent.name != "integration" or path.name in OFFLINE:
        return "compute"
    for lane, modules in STACKS.items():
        if path.name in modules:
            return lane
    return "kafka"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Keep the lane asked for (``--lane``), and move the modules of ``RUN_LAST`` to the end,
    each keeping its own order."""
    lane = config.getoption("lane")
    if lane is not None:
        dropped = [item for item in items if lane_of(item.path) != lane]
        if dropped:
            config.hook.pytest_deselected(items=dropped)
            items[:] = [item for item in items if lane_of(item.path) == lane]
    items.sort(key=lambda item: item.path.name in RUN_LAST)


def start_private_broker(
    tmp_path_factory: pytest.TempPathFactory, name: str, **options: Any
) -> tuple[broker.BrokerConfig, broker.StartResult]:
    """Start a broker of the test's own on a free port, in a new state directory ``name``.

    A free port is only free when it is picked: another socket of the busy host can take it
    before the broker binds it, and the broker then exits with "Address already in use". That
    start is tried again on another port, in a new state directory (three attempts); any other
    failure is raised at once. The caller stops the broker (``broker.stop(config.state_dir)``).
    """
    attempts = 3
    for attempt in range(1, attempts + 1):
        state_dir = tmp_path_factory.mktemp(name)
        config = broker.BrokerConfig(state_dir=state_dir, port=broker.free_port(), **options)
        try:
            return config, broker.start(config)
        except HeadroomError as exc:
            if attempt == attempts or "Address already in use" not in str(exc):
                raise
            broker.stop(state_dir)
    raise AssertionError("unreachable")


def terminate(proc: subprocess.Popen[Any] | None) -> None:
    """Stop a child process the test started: SIGTERM, then SIGKILL after 20 s."""
    if proc is None or proc.poll() is not None:
        return
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=10)


@pytest.fixture(scope="session")
def kafka_bootstrap(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    given = os.environ.get("KAFKA_BOOTSTRAP_SERVERS")
    if given:
        if not run_async(broker.probe_async(given, timeout_s=10.0)):
            pytest.fail(
                f"KAFKA_BOOTSTRAP_SERVERS={given} does not answer a Kafka metadata request",
                pytrace=False,
            )
        yield given
        return
    try:
        cfg, started = start_private_broker(tmp_path_factory, "kafka-state", start_timeout_s=180.0)
    except HeadroomError as exc:
        pytest.fail(f"could not start the test Kafka broker: {exc}", pytrace=False)
    try:
        yield started.bootstrap
    finally:
        broker.stop(cfg.state_dir)


@pytest.fixture
def topic_prefix(kafka_bootstrap: str) -> Iterator[str]:
    prefix = f"t{uuid.uuid4().hex[:12]}."
    wanted = topics(prefix, partitions=TEST_PARTITIONS)
    run_async(create_topics(kafka_bootstrap, wanted))
    run_async(wait_for_topics(kafka_bootstrap, [t.name for t in wanted]))
    yield prefix
    # Deleting is only tidiness (a shared broker keeps fewer topics); never a test failure.
    with contextlib.suppress(HeadroomError):
        run_async(delete_topics(kafka_bootstrap, [t.name for t in wanted]))


@pytest.fixture
def kafka_target(kafka_bootstrap: str, topic_prefix: str) -> KafkaTarget:
    return KafkaTarget(bootstrap=kafka_bootstrap, prefix=topic_prefix)


@pytest.fixture
def run_headroom() -> Callable[..., subprocess.CompletedProcess[str]]:
    """``run_headroom("topics", "create", ..., timeout=60)`` → CompletedProcess (text)."""

    def run(*args: str, timeout: float = 120.0, **kwargs: Any) -> subprocess.CompletedProcess[str]:
        env = {**os.environ, "HEADROOM_LOG_FORMAT": "json"}
        env.update(kwargs.pop("env", {}))
        return subprocess.run(
            [sys.executable, "-m", "headroom.cli", *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            cwd=REPO,
            env=env,
            check=False,
            **kwargs,
        )

    return run
