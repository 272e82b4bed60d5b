"""Logging of the ``outbox`` command: the one place that configures it (the library only emits)."""

from __future__ import annotations

import logging
import sys
from typing import Any

import structlog

from outbox._core import log as _log


def configure_logging(level: str, fmt: str) -> None:
    """Readable lines on a terminal, JSON lines otherwise; to stderr, filtered by level."""
    renderer: Any
    if fmt == "json" or (fmt == "auto" and not sys.stderr.isatty()):
        renderer = structlog.processors.JSONRenderer()
    else:
        renderer = structlog.dev.ConsoleRenderer(colors=sys.stderr.isatty())
    floor = logging.getLevelNamesMapping()[level.upper()]
    structlog.configure(
        processors=[
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=(wrapper := structlog.make_filtering_bound_logger(floor)),
        # One write per line (print() writes the line and its newline apart): the workers of
        # `outbox work --processes N` share stderr, and a line must not land inside another.
        logger_factory=structlog.WriteLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=False,
    )
    _log.filter_below(floor, wrapper)
