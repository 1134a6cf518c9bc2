"""``headroom kafka start|status|stop``: the command-line face of :mod:`headroom.streams.broker`.

Output contract (README.md, *Commands*): ``start`` prints the bootstrap address (a comma-separated
list for ``--brokers N``) as its last stdout line, also when the broker was already running (and
it starts any node of the cluster that is not running: a killed broker comes back this way);
with ``--security sasl_ssl`` it logs where ``client.properties`` is; ``status`` prints the
address and exits 0 while the broker runs and answers, 1 otherwise; ``stop`` ends only the
broker ``start`` started from the same state directory and exits 0 whether or not one was
running. Everything else (progress, what happened) goes to stderr as structured log events.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from headroom.kernel.errors import ConfigError
from headroom.kernel.logs import get_logger
from headroom.kernel.settings import DEFAULT_BROKER_PORT, resolve_state_dir
from headroom.streams import broker

EXIT_OK = 0
EXIT_NOT_RUNNING = 1


def _state_dir(args: argparse.Namespace) -> Path:
    return resolve_state_dir(getattr(args, "state_dir", None)).expanduser().resolve()


def _env_int(name: str) -> int | None:
    text = os.environ.get(name)
    if not text:
        return None
    try:
        return int(text)
    except ValueError:
        raise ConfigError(f"{name}: {text!r} is not an integer") from None


def config_from_args(args: argparse.Namespace) -> broker.BrokerConfig:
    port = args.port if args.port is not None else _env_int("HEADROOM_KAFKA_PORT")
    controller_port = getattr(args, "controller_port", None)
    if controller_port is None:
        controller_port = _env_int("HEADROOM_KAFKA_CONTROLLER_PORT")
    return broker.BrokerConfig(
        state_dir=_state_dir(args),
        port=port if port is not None else DEFAULT_BROKER_PORT,
        controller_port=controller_port,
        start_timeout_s=float(getattr(args, "timeout", 120.0)),
        brokers=int(getattr(args, "brokers", 1) or 1),
        security=str(getattr(args, "security", None) or "plaintext"),
    )


def start(args: argparse.Namespace) -> int:
    log = get_logger("broker")
    cfg = config_from_args(args)

    def progress(event: str, **fields: object) -> None:
        log.info(event, state_dir=str(cfg.state_dir), **fields)

    result = broker.start(cfg, on_progress=progress)
    if result.already_running:
        log.info(
            "broker.start.skipped",
            reason="already running",
            pid=result.pid,
            bootstrap=result.bootstrap,
            state_dir=str(cfg.state_dir),
        )
        wanted = f"{broker.HOST}:{cfg.port}"
        if args.port is not None and wanted != result.bootstrap.split(",")[0]:
            log.warning(
                "broker.port.ignored",
                requested=wanted,
                running=result.bootstrap,
                hint="stop it first to change the port",
            )
    else:
        log.info(
            "broker.started",
            pid=result.pid,
            bootstrap=result.bootstrap,
            state_dir=str(cfg.state_dir),
            elapsed_s=round(result.elapsed_s, 3),
            libs_resolved=result.libs_resolved,
            resolve_s=round(result.resolve_s, 3),
            formatted=result.formatted,
            log=str(broker.BrokerPaths(cfg.state_dir).server_log),
        )
    client_file = broker.BrokerPaths(cfg.state_dir).client_properties
    if client_file.is_file():
        # the path only: the file holds the password
        log.info("broker.client.config", kafka_config=str(client_file), user=broker.CLIENT_USER)
    print(result.bootstrap, flush=True)
    return EXIT_OK


def status(args: argparse.Namespace) -> int:
    log = get_logger("broker")
    state_dir = _state_dir(args)
    found = broker.status(state_dir)
    fields = {
        "state": found.state.value,
        "pid": found.pid,
        "state_dir": str(state_dir),
        "nodes": found.nodes,
        "nodes_running": found.nodes_running,
    }
    if found.state is broker.BrokerState.RUNNING:
        log.info("broker.status.checked", bootstrap=found.bootstrap, **fields)
        print(found.bootstrap, flush=True)
        return EXIT_OK
    if found.state is broker.BrokerState.UNRESPONSIVE:
        log.error("broker.status.checked", bootstrap=found.bootstrap, problem="no answer", **fields)
    else:
        log.info("broker.status.checked", **fields)
    return EXIT_NOT_RUNNING


def stop(args: argparse.Namespace) -> int:
    log = get_logger("broker")
    state_dir = _state_dir(args)
    result = broker.stop(state_dir)
    if result.was_running:
        log.info("broker.stopped", pid=result.pid, killed=result.killed, state_dir=str(state_dir))
    elif result.stale_pid_removed:
        log.info(
            "broker.pidfile.removed",
            pid=result.pid,
            reason="process is gone or is not this broker; nothing signalled",
            state_dir=str(state_dir),
        )
    else:
        log.info("broker.stop.skipped", reason="not running", state_dir=str(state_dir))
    return EXIT_OK
