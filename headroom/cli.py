"""The one console entry point, ``headroom``.

Every command of README.md, *Commands* is declared here, with its flags, in one table-like place;
the work itself lives in the module each command names (imported lazily, so ``headroom --help``
stays fast and a command never pays for another's imports).

Exit codes (README.md, *Commands*): 0 success; 2 bad input (usage, scenario, config) with one line
per problem and no traceback; 1 any other failure, with a message saying what failed.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Callable, Sequence

from headroom.kernel.errors import ConfigError, HeadroomError
from headroom.kernel.flags import (
    COUNT,
    DURATION,
    EPOCH,
    FAST_SPEED,
    FIXED_PORT,
    PORT,
    SEED,
    SHARE,
    SPEED,
    number,
)
from headroom.kernel.logs import check_environment

EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_BAD_INPUT = 2


def _add_kafka_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--kafka-config",
        metavar="FILE",
        default=None,
        help="Kafka client properties (security.protocol, sasl.mechanism, sasl.username, "
        "sasl.password, ssl.ca.location, …; the file kcat -F reads) (default: "
        "$HEADROOM_KAFKA_CONFIG, else the local broker's client.properties when it has one, "
        "else PLAINTEXT)",
    )
    p.add_argument(
        "--bootstrap",
        metavar="HOST:PORT",
        default=None,
        help="Kafka bootstrap servers (default: $KAFKA_BOOTSTRAP_SERVERS, else the local broker "
        "that `headroom kafka start` runs)",
    )
    p.add_argument(
        "--prefix",
        metavar="P",
        default=None,
        help="topic name prefix (default: $HEADROOM_TOPIC_PREFIX, else 'headroom.')",
    )


def _scenario_help() -> str:
    """Every scenario argument: a path to a file, else the name of a scenario shipped with the
    package (:func:`headroom.kernel.settings.resolve_scenario`)."""
    from headroom.kernel.settings import shipped_scenarios

    return "a scenario YAML file, or the name of one shipped with the package: " + ", ".join(
        shipped_scenarios()
    )


def _add_scenario_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--scenario",
        metavar="FILE",
        default=None,
        help="scenario whose slo, world, models and segments configure this component: a file, "
        "or the name of a shipped scenario (default: quickstart)",
    )


def _add_metrics_flag(p: argparse.ArgumentParser) -> None:
    number(
        p,
        "--metrics-port",
        PORT,
        metavar="N",
        default=None,
        help="serve Prometheus metrics on this port (0 = a free port, printed at start-up; "
        "default: no endpoint)",
    )


def _state_dir_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--state-dir",
        metavar="DIR",
        default=None,
        help="where the broker keeps its pid, data and log (default: $HEADROOM_KAFKA_STATE_DIR, "
        "else ~/.local/state/headroom/kafka)",
    )


def _add_run_clock_flags(p: argparse.ArgumentParser) -> None:
    number(
        p,
        "--t0",
        EPOCH,
        default=None,
        metavar="EPOCH",
        help="wall-clock time of scenario time 0, the same for feed, servers and clients so "
        "their SLO windows line up (default: $HEADROOM_T0, else 0)",
    )
    number(
        p,
        "--speed",
        SPEED,
        default=1.0,
        metavar="X",
        help="scenario seconds per wall second, as given to the feed, > 0 (default 1)",
    )


def _add_server_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--host", default="127.0.0.1", metavar="HOST", help="address to listen on (127.0.0.1)"
    )
    p.add_argument(
        "--replica",
        default=None,
        metavar="NAME",
        help="replica name in latency messages and events (default: region-pool-host-pid)",
    )
    number(
        p,
        "--share",
        SHARE,
        default=1.0,
        metavar="F",
        help="share of the region's pool capacity this replica holds, in (0, 1] (default 1)",
    )
    _add_run_clock_flags(p)


def _add_client_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--server",
        action="append",
        default=[],
        metavar="POOL=HOST:PORT",
        help="a ranking server of the region (repeatable), e.g. dedicated=127.0.0.1:7001",
    )
    p.add_argument(
        "--group",
        default=None,
        metavar="ID",
        help="consumer group on the requests topic (default: <prefix>client-<region>)",
    )
    p.add_argument(
        "--instance",
        default=None,
        metavar="ID",
        help="static group membership id: a client restarted with the same id gets its "
        "partitions back at once (default: dynamic membership)",
    )
    number(
        p,
        "--seed",
        SEED,
        default=None,
        metavar="N",
        help="seed of the holdout and routing draws, an integer in [0, 2**63 - 1] (default: the "
        "scenario's)",
    )
    _add_run_clock_flags(p)


def _add_default_dedicated_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--default-dedicated",
        metavar="REGION",
        default=None,
        help="a recorded region the scenario does not list gets the dedicated capacity of this "
        "scenario region (default: such a region is an error)",
    )


def _add_feed_flags(p: argparse.ArgumentParser) -> None:
    number(
        p,
        "--t0",
        EPOCH,
        default=None,
        metavar="EPOCH",
        help="wall-clock time of scenario time 0; the feed waits for it (default: $HEADROOM_T0, "
        "else now)",
    )
    _add_seed_flag(p)
    number(
        p,
        "--duration",
        DURATION,
        default=None,
        metavar="S",
        help="stop after S scenario seconds (default: the scenario's duration_s)",
    )
    number(
        p,
        "--resume-from",
        DURATION,
        default=None,
        metavar="S",
        help="a feed restarted after a crash: skip run.started, announce the levels in force at "
        "once, and publish the requests from a little before scenario time S again (the clients "
        "drop the ones already served by their id)",
    )


def _add_up_flags(p: argparse.ArgumentParser) -> None:
    number(
        p,
        "--speed",
        SPEED,
        default=1.0,
        metavar="X",
        help="run the scenario X times faster than real time, > 0 (default 1)",
    )
    _add_control_flags(p)
    number(
        p,
        "--controllers",
        COUNT,
        default=1,
        metavar="N",
        help="controller processes, sharing the regions by Kafka's group assignment (default 1)",
    )
    number(
        p,
        "--clients-per-region",
        COUNT,
        default=1,
        metavar="M",
        help="client processes per region, sharing the region's requests partitions (default 1)",
    )
    p.add_argument("--no-plots", action="store_true", help="skip PNG plots and report.html")
    p.add_argument(
        "--broker-state-dir",
        default=None,
        metavar="DIR",
        help="state directory of the local broker (`headroom kafka start --state-dir`) that a "
        "broker_restart fault event restarts (default: the local broker's default)",
    )


def _add_control_flags(p: argparse.ArgumentParser) -> None:
    number(
        p,
        "--interval",
        DURATION,
        default=None,
        metavar="S",
        help="control interval, seconds of scenario time (default: the scenario's "
        "control.interval_s, else 60)",
    )
    number(
        p,
        "--ttl",
        DURATION,
        default=None,
        metavar="S",
        help="lifetime of each target, seconds; clients fall back to the baseline when it passes "
        "(default: the scenario's control.ttl_s, else 3 control intervals)",
    )


def _add_seed_flag(p: argparse.ArgumentParser) -> None:
    number(
        p,
        "--seed",
        SEED,
        metavar="N",
        default=None,
        help="override the scenario's seed: an integer in [0, 2**63 - 1], as in a scenario file",
    )


SUBCOMMAND_HELP = "what to do (SUBCOMMAND --help)"

# (command path, module, function) — the function takes the parsed args and returns an exit code.
Handler = tuple[str, str]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="headroom",
        description="headroom: spend idle, reclaimable inference capacity on optional ranking "
        "work, and give it back within milliseconds.",
    )
    parser.add_argument("--version", action="version", version=f"headroom {_version()}")
    sub = parser.add_subparsers(
        dest="command", metavar="COMMAND", required=True, help="what to do (COMMAND --help)"
    )

    def cmd(
        parent: argparse._SubParsersAction[argparse.ArgumentParser],
        name: str,
        help_text: str,
        handler: Handler | None,
    ) -> argparse.ArgumentParser:
        p = parent.add_parser(name, help=help_text, description=help_text)
        if handler is not None:
            p.set_defaults(_handler=handler)
        return p

    # --- simulate -----------------------------------------------------------------------------
    p = cmd(
        sub,
        "simulate",
        "virtual-time run of a scenario, policies side by side (no broker needed)",
        ("headroom.commands.simulate", "simulate"),
    )
    p.add_argument("scenario", metavar="SCENARIO", help=_scenario_help())
    p.add_argument(
        "--policy",
        action="append",
        metavar="P",
        default=None,
        help="policy to run (repeatable or comma-separated): static, greedy, central-only, aimd, "
        "gradient, envoy, sre-throttle, headroom, oracle (default: all side by side)",
    )
    _add_seed_flag(p)
    p.add_argument(
        "--replay",
        metavar="FILE",
        default=None,
        help="a recording whose capacity levels and request arrivals drive the run",
    )
    _add_default_dedicated_flag(p)
    p.add_argument(
        "--out",
        metavar="DIR",
        default=None,
        help="output directory (default: runs/<scenario>-<time>/)",
    )
    _add_control_flags(p)
    number(
        p,
        "--jobs",
        COUNT,
        default=None,
        metavar="N",
        help="processes that simulate a policy's regions side by side, the log the same as in "
        "one (default: one per region, at most two per core; 1: all in this process)",
    )
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--no-plots", action="store_true", help="skip PNG plots and report.html")

    # --- scenario -----------------------------------------------------------------------------
    p = cmd(sub, "scenario", "scenario files: schema, validation, conversion", None)
    ssub = p.add_subparsers(
        dest="scenario_command", metavar="SUBCOMMAND", required=True, help=SUBCOMMAND_HELP
    )
    cmd(
        ssub,
        "schema",
        "print the JSON Schema of scenario files",
        ("headroom.commands.scenario", "scenario_schema"),
    )
    q = cmd(
        ssub,
        "check",
        "validate a scenario file (exit 0 if valid, else 2 with one line per problem)",
        ("headroom.commands.scenario", "scenario_check"),
    )
    q.add_argument("file", metavar="FILE", help=_scenario_help())
    q = cmd(
        ssub,
        "from-recording",
        "turn a recording of capacity and requests into a scenario with CSV traces",
        ("headroom.commands.sim_replay", "scenario_from_recording"),
    )
    q.add_argument("file", metavar="FILE", help="recording (JSON lines, kcat -C -J envelope)")
    q.add_argument(
        "--base",
        metavar="SCENARIO",
        required=True,
        help="scenario giving slo, world, models, segments: a file, or the name of a shipped "
        "scenario",
    )
    q.add_argument("--out", metavar="NEW.yaml", required=True, help="scenario file to write")
    _add_default_dedicated_flag(q)

    # --- kafka --------------------------------------------------------------------------------
    p = cmd(sub, "kafka", "the local Apache Kafka broker for development and tests", None)
    ksub = p.add_subparsers(
        dest="kafka_command", metavar="SUBCOMMAND", required=True, help=SUBCOMMAND_HELP
    )
    q = cmd(
        ksub,
        "start",
        "assemble (first time) and start a KRaft broker (or a cluster of N) on loopback; "
        "prints the bootstrap address last",
        ("headroom.commands.kafka", "start"),
    )
    number(
        q,
        "--port",
        FIXED_PORT,
        metavar="N",
        default=None,
        help="client port of the (first) broker (default 19092; the other brokers of a cluster "
        "take free ports)",
    )
    number(
        q,
        "--brokers",
        COUNT,
        metavar="N",
        default=1,
        help="a local cluster of N brokers (the first min(N, 3) are also KRaft controllers) "
        "(default 1)",
    )
    q.add_argument(
        "--security",
        choices=("plaintext", "sasl_ssl"),
        default="plaintext",
        help="sasl_ssl: TLS with a generated CA and broker certificate, a SCRAM-SHA-512 user, "
        "and STATE_DIR/client.properties for clients (kcat -F reads it) (default plaintext)",
    )
    number(
        q,
        "--controller-port",
        FIXED_PORT,
        metavar="N",
        default=None,
        help="KRaft controller port of the first broker (default: the client port + 1 when free, "
        "else any free port); only with --brokers 1",
    )
    _state_dir_flag(q)
    number(
        q,
        "--timeout",
        DURATION,
        default=120.0,
        metavar="S",
        help="give up after S seconds (default 120)",
    )
    q = cmd(
        ksub,
        "status",
        "print the bootstrap address; exit 0 while the broker runs",
        ("headroom.commands.kafka", "status"),
    )
    _state_dir_flag(q)
    q = cmd(
        ksub,
        "stop",
        "stop the broker that `kafka start` started (only that one)",
        ("headroom.commands.kafka", "stop"),
    )
    _state_dir_flag(q)

    # --- topics -------------------------------------------------------------------------------
    p = cmd(sub, "topics", "headroom's Kafka topics", None)
    tsub = p.add_subparsers(
        dest="topics_command", metavar="SUBCOMMAND", required=True, help=SUBCOMMAND_HELP
    )
    q = cmd(
        tsub,
        "create",
        "create every topic with its partitions, retention and replication (idempotent)",
        ("headroom.commands.topics", "create"),
    )
    number(
        q,
        "--replication-factor",
        COUNT,
        metavar="R",
        default=None,
        help="replicas of each new topic (default min(3, brokers)); min.insync.replicas is "
        "min(2, R)",
    )
    _add_kafka_flags(q)
    q = cmd(
        tsub,
        "list",
        "print the topic registry (names, partitions, configs)",
        ("headroom.commands.topics", "list_topics"),
    )
    q.add_argument(
        "--prefix", metavar="P", default=None, help="topic name prefix (default 'headroom.')"
    )
    q = cmd(
        tsub,
        "validate",
        "check every message of a topic against the contract, dead-letter the bad ones; last "
        'line {"topic":…,"valid":N,"invalid":M}',
        ("headroom.commands.topics", "validate"),
    )
    q.add_argument(
        "topic", metavar="TOPIC", help="topic name, with or without the prefix (e.g. capacity)"
    )
    q.add_argument("--from-beginning", action="store_true", help="start at the earliest offset")
    number(
        q,
        "--timeout",
        DURATION,
        default=5.0,
        metavar="S",
        help="stop after S seconds with no new message (default 5)",
    )
    _add_kafka_flags(q)

    # --- controller, workers ------------------------------------------------------------------
    p = cmd(
        sub,
        "controller",
        "run the Faust controller app (allocator, RMA PID, SBM coverage, router)",
        ("headroom.commands.controller", "controller"),
    )
    _add_control_flags(p)
    _add_run_clock_flags(p)
    _add_scenario_flag(p)
    _add_kafka_flags(p)
    _add_metrics_flag(p)

    p = cmd(sub, "server", "run one ranking-server worker", ("headroom.commands.server", "server"))
    p.add_argument(
        "--region", required=True, metavar="R", help="region (of the scenario) this server is in"
    )
    p.add_argument(
        "--pool",
        required=True,
        metavar="P",
        choices=["dedicated", "opportunistic"],
        help="capacity pool this server's share is taken from: dedicated or opportunistic",
    )
    number(
        p,
        "--port",
        PORT,
        default=0,
        metavar="N",
        help="port clients connect to (0 = a free port, printed at start-up)",
    )
    _add_server_flags(p)
    _add_scenario_flag(p)
    _add_kafka_flags(p)
    _add_metrics_flag(p)

    p = cmd(sub, "client", "run one client worker", ("headroom.commands.client", "client"))
    p.add_argument(
        "--region",
        required=True,
        metavar="R",
        help="region (of the scenario) whose requests this client consumes and ranks",
    )
    _add_client_flags(p)
    number(
        p,
        "--interval",
        DURATION,
        default=None,
        metavar="S",
        help="the control interval targets are issued at, seconds of scenario time; a target "
        "older than 1.5 intervals is held at the strong model's planned request rate "
        "(default: the scenario's control.interval_s, else 60)",
    )
    _add_scenario_flag(p)
    _add_kafka_flags(p)
    _add_metrics_flag(p)

    p = cmd(
        sub,
        "precompute",
        "run one precompute worker",
        ("headroom.commands.precompute", "precompute"),
    )
    p.add_argument(
        "--region",
        required=True,
        metavar="R",
        help="region whose capacity, targets and requests this worker serves",
    )
    _add_run_clock_flags(p)
    _add_scenario_flag(p)
    _add_kafka_flags(p)
    _add_metrics_flag(p)

    p = cmd(
        sub,
        "feed",
        "publish a scenario's capacity levels and request traffic",
        ("headroom.commands.feed", "feed"),
    )
    p.add_argument("scenario", metavar="SCENARIO", help=_scenario_help())
    number(
        p,
        "--speed",
        SPEED,
        default=1.0,
        metavar="X",
        help="X times faster than real time, > 0 (default 1)",
    )
    _add_kafka_flags(p)
    _add_feed_flags(p)

    p = cmd(
        sub,
        "up",
        "run the whole streaming stack locally against Kafka",
        ("headroom.commands.up", "up"),
    )
    p.add_argument("scenario", metavar="SCENARIO", help=_scenario_help())
    p.add_argument(
        "--out",
        metavar="DIR",
        default=None,
        help="output directory for events.jsonl, metrics.json, plots and report.html "
        "(default: runs/<scenario>-up-<time>/)",
    )
    _add_up_flags(p)
    _add_kafka_flags(p)

    # --- record / replay ----------------------------------------------------------------------
    p = cmd(
        sub,
        "record",
        "record topics to a JSON-lines file (kcat -C -J envelope)",
        ("headroom.commands.record", "record"),
    )
    p.add_argument(
        "--topic",
        action="append",
        required=True,
        metavar="T",
        help="topic to record (repeatable; with or without the prefix)",
    )
    p.add_argument(
        "--out",
        required=True,
        metavar="FILE",
        help="recording to write (JSON lines, kcat -C -J envelope; replaced if it exists)",
    )
    p.add_argument("--from-beginning", action="store_true", help="start at the earliest offset")
    number(
        p,
        "--timeout",
        DURATION,
        default=None,
        metavar="S",
        help="stop after S seconds with no new message (default: until interrupted)",
    )
    _add_kafka_flags(p)

    p = cmd(
        sub,
        "replay",
        "replay a recording into Kafka, keeping keys, per-key order and timing",
        ("headroom.commands.record", "replay"),
    )
    p.add_argument(
        "file", metavar="FILE", help="recording to replay (JSON lines, kcat -C -J envelope)"
    )
    number(
        p,
        "--speed",
        FAST_SPEED,
        default=1.0,
        metavar="X",
        help="X times faster than recorded, >= 0 (0 = as fast as possible; default 1)",
    )
    p.add_argument(
        "--topic-map",
        action="append",
        default=[],
        metavar="OLD=NEW",
        help="rename a topic on replay (repeatable)",
    )
    _add_kafka_flags(p)

    # --- analysis, bench ----------------------------------------------------------------------
    p = cmd(
        sub,
        "analyze",
        "rebuild metrics.json, plots and report from an event log",
        ("headroom.commands.analyze", "analyze"),
    )
    p.add_argument(
        "events",
        metavar="EVENTS.jsonl",
        help="event log (JSON lines, docs/events.md) written by simulate, up or the workers",
    )
    p.add_argument(
        "--out", metavar="DIR", default=None, help="output directory (default: beside the log)"
    )
    p.add_argument("--no-plots", action="store_true", help="skip PNG plots and report.html")
    p.add_argument(
        "--partial",
        action="store_true",
        help="analyse a log with incomplete policies (no run.finished, missing windows, corrupt "
        "lines) instead of exiting 1: they are written with complete: false",
    )

    p = cmd(
        sub,
        "bench",
        "run the performance benchmarks and print JSON",
        ("headroom.bench.runner", "bench"),
    )
    p.add_argument(
        "--only",
        action="append",
        default=None,
        metavar="NAME",
        help="run only this benchmark (repeatable)",
    )
    p.add_argument("--out", metavar="FILE", default=None, help="also write the JSON here")
    p.add_argument("--quick", action="store_true", help="fewer iterations (for smoke tests)")
    _add_kafka_flags(p)

    return parser


def _version() -> str:
    try:
        from importlib.metadata import version

        return version("headroom")
    except Exception:  # pragma: no cover - running from a source tree without install
        return "0+unknown"


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    try:
        # a bad numeric flag raises ConfigError here (headroom.kernel.flags.py): exit 2
        args = parser.parse_args(argv)
        # a log variable no process could use stops every command here, before any work
        check_environment()
        module_name, func_name = args._handler
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name != module_name:
                raise
            print(
                f"headroom: {args.command} is not implemented in this version yet", file=sys.stderr
            )
            return EXIT_FAILURE
        func: Callable[[argparse.Namespace], int] = getattr(module, func_name)
        return int(func(args) or 0)
    except ConfigError as exc:
        for problem in exc.problems:
            print(f"headroom: {problem}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except HeadroomError as exc:
        print(f"headroom: {exc}", file=sys.stderr)
        return EXIT_FAILURE
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # e.g. `headroom scenario schema | head`
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_OK


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
