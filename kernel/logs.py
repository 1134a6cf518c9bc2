"""structlog, configured once for every process.

JSON lines for machines (the default when stderr is not a terminal, or
``HEADROOM_LOG_FORMAT=json``), a readable console renderer on a terminal
(``HEADROOM_LOG_FORMAT=console``). Level from
``HEADROOM_LOG_LEVEL`` (default ``info``). A value of either not in :data:`LOG_FORMATS` /
:data:`LOG_LEVELS` is a :class:`~headroom.kernel.errors.ConfigError` naming the variable (the
command line's exit 2), never a silent default.

Event naming convention (docs/logging.md): ``<component>.<object>.<past-tense verb>``, lower case,
dots between parts, e.g. ``broker.started``, ``consumer.message.deadlettered``,
``controller.target.issued``, ``server.shedding.started``. Fields are data (numbers stay numbers),
never interpolated into the event name.
"""

from __future__ import annotations

import logging
import os
import sys
from typing import Any

import structlog

from headroom.kernel.errors import ConfigError

LOG_FORMATS = ("json", "console")
LOG_LEVELS = ("debug", "info", "warning", "error", "critical")

_configured = False


def env_choice(variable: str, choices: tuple[str, ...], default: str) -> str:
    """``$variable`` in lower case, ``default`` when unset or empty; a value not among
    ``choices`` is a :class:`ConfigError` naming the variable and what it may be."""
    value = (os.environ.get(variable) or default).strip().lower()
    if value not in choices:
        raise ConfigError(f"{variable}: must be one of {', '.join(choices)}, got {value!r}")
    return value


def check_environment() -> None:
    """Raise :class:`ConfigError` now for a log variable no :func:`configure` could use (the
    command line calls it before any work, so a typo stops the command at start-up)."""
    env_choice("HEADROOM_LOG_FORMAT", LOG_FORMATS, "json")
    env_choice("HEADROOM_LOG_LEVEL", LOG_LEVELS, "info")


def configure(fmt: str | None = None, level: str | None = None) -> None:
    """Configure structlog once; later calls are no-ops unless ``fmt`` is given explicitly.
    ``fmt`` / ``level``: else the environment's (:func:`env_choice`: a bad value raises)."""
    global _configured
    if _configured and fmt is None:
        return
    default = "console" if sys.stderr.isatty() else "json"
    fmt = fmt or env_choice("HEADROOM_LOG_FORMAT", LOG_FORMATS, default)
    level_name = level or env_choice("HEADROOM_LOG_LEVEL", LOG_LEVELS, "info")
    level_no = logging.getLevelName(level_name.upper())
    if not isinstance(level_no, int):
        raise ConfigError(f"log level: must be one of {', '.join(LOG_LEVELS)}, got {level!r}")
    renderer: Any
    if fmt == "console":
        renderer = structlog.dev.ConsoleRenderer(colors=sys.stderr.isatty())
    else:
        renderer = structlog.processors.JSONRenderer()
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.StackInfoRenderer(),
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(level_no),
        # one write per line (the line and its newline together): the stdlib handlers of the
        # libraries under us (Faust, aiokafka) write to the same stderr from other threads, and
        # print() writes the newline apart, so their lines could land inside ours
        logger_factory=structlog.WriteLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=True,
    )
    _configured = True


def get_logger(component: str) -> Any:
    """A bound logger for one component (``source`` field set)."""
    configure()
    return structlog.get_logger().bind(source=component)
