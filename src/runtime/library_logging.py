"""troupe's log lines in a program that set up no logging: through the standard library.

structlog, unconfigured, prints every line to stdout: a library's lines there mix into the
program's own output (its JSON, say). troupe's own processes configure logging themselves
(``logs.configure_logging``); in a program's process, troupe routes structlog through the
standard library instead, whose handlers the program sets (none: warnings and errors reach
stderr through Python's last resort, info is silent), as a run hands logging back when it ends
(``logs.HeldLog``). A program that configures structlog, before or after importing troupe,
keeps its own configuration.
"""

from __future__ import annotations

from typing import Any

import structlog

from .log_json import strict_json

__all__ = ["PROCESSORS", "by_troupe", "route_through_stdlib"]

PROCESSORS: list[Any] = [
    structlog.stdlib.filter_by_level,
    structlog.stdlib.add_log_level,
    structlog.processors.TimeStamper(fmt="iso", utc=True),
    structlog.processors.JSONRenderer(serializer=strict_json),
]
"""The processors troupe configures structlog with for a program (their identity says so)."""


def route_through_stdlib() -> None:
    """Configure structlog to hand every line to the standard library's ``logging``."""
    structlog.configure(
        processors=PROCESSORS,
        logger_factory=structlog.stdlib.LoggerFactory(),
        wrapper_class=structlog.stdlib.BoundLogger,
        cache_logger_on_first_use=False,
    )


def by_troupe() -> bool:
    """Whether structlog is configured as :func:`route_through_stdlib` left it."""
    return structlog.is_configured() and structlog.get_config()["processors"] is PROCESSORS
