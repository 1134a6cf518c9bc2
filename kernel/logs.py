"""structlog, configured once for every process.

JSON lines for machines (the default when stderr is not a terminal, or
``HEADROOM_LOG_FORMAT=json``), a readable console renderer on a terminal
(``HEADROOM_LOG_FORMAT=console``). Level from
``HEADROOM_LOG_LEVEL`` (default ``info``).

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

_configured = False


def configure(fmt: str | None = None, level: str | None = None) -> None:
    """Configure structlog once; later calls are no-ops unless ``fmt`` is given explicitly."""
    global _configured
    if _configured and fmt is None:
        return
    default = "console" if sys.stderr.isatty() else "json"
    fmt = fmt or os.environ.get("HEADROOM_LOG_FORMAT") or default
    level_name = (level or os.environ.get("HEADROOM_LOG_LEVEL") or "info").upper()
    level_no = logging.getLevelName(level_name)
    if not isinstance(level_no, int):
        level_no = logging.INFO
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
