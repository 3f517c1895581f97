"""troupe's loggers: structlog's in a process troupe owns, the standard library's in a program's.

Every module of troupe takes its logger from :func:`get_logger`. In a process troupe owns (the
``troupe`` command, a node, its workers, supervisor and template, a master: each calls
:func:`own_this_process` first, and ``logs.configure_logging`` does too) that logger is structlog's,
as ``structlog.get_logger`` gives it, and troupe configures structlog: through the standard
library (:func:`route_through_stdlib`) until ``configure_logging`` gives the process its file and
its console.

A program's process (one that imports troupe as a library) keeps its logging as it set it up:
troupe calls neither ``structlog.configure`` (it cost a program on structlog's defaults its info
lines, and turned its warnings into JSON on stderr, ap 7) nor anything on the root logger or its
handlers. troupe's lines go to the standard library's logger of their module, under ``troupe``,
each rendered as one JSON object (:data:`PROCESSORS`), at the program's levels and to its
handlers; none set up: warnings reach stderr through Python's last resort, info is silent, and
nothing goes onto the program's stdout. A run inside the program (``logs.run_log``) takes troupe's
lines for its file as well (:func:`hand_lines_to`), whatever the program's levels.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Callable, MutableMapping
from typing import Any

import structlog

from .log_json import strict_json

__all__ = [
    "PROCESSORS",
    "LineTaker",
    "by_troupe",
    "get_logger",
    "hand_lines_to",
    "level_of",
    "own_this_process",
    "route_through_stdlib",
    "troupe_owns_this_process",
]

PROCESSORS: list[Any] = [
    structlog.stdlib.filter_by_level,
    structlog.stdlib.add_log_level,
    structlog.processors.TimeStamper(fmt="iso", utc=True),
    structlog.processors.JSONRenderer(serializer=strict_json),
]
"""How troupe renders its lines for the standard library: configured so in a process troupe owns
(their identity says so), and its loggers' own in a program's."""

LineTaker = Callable[[logging.Logger, str, MutableMapping[str, Any]], None]
"""Who takes troupe's lines in a program's process besides its logging (a run's file): the
module's standard-library logger, the method called (``info``) and the line's fields."""

_LEVELS = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warning": logging.WARNING,
    "warn": logging.WARNING,
    "error": logging.ERROR,
    "exception": logging.ERROR,
    "critical": logging.CRITICAL,
    "fatal": logging.CRITICAL,
}
# The modules whose frames stand between a line's call site and the standard library's logger.
_OURS = (structlog.__name__, __name__)

_owned = False
_taker: LineTaker | None = None


def level_of(method_name: str) -> int:
    """The standard library's level of a logger method (``exception``: ERROR)."""
    return _LEVELS.get(method_name, logging.INFO)


def own_this_process(owned: bool = True) -> None:
    """This process is troupe's own: its modules log through structlog, which troupe configures
    (through the standard library until ``configure_logging``, if nothing configured it yet).
    ``owned=False``: a program's process, as at its start (a test plays one)."""
    global _owned
    _owned = owned
    if owned and not structlog.is_configured():
        route_through_stdlib()


def troupe_owns_this_process() -> bool:
    """Whether :func:`own_this_process` said so."""
    return _owned


def route_through_stdlib() -> None:
    """Configure structlog to hand every line to the standard library's ``logging`` (only in a
    process troupe owns)."""
    structlog.configure(
        processors=PROCESSORS,
        logger_factory=structlog.stdlib.LoggerFactory(),
        wrapper_class=structlog.stdlib.BoundLogger,
        cache_logger_on_first_use=False,
    )


def by_troupe() -> bool:
    """Whether structlog is configured as :func:`route_through_stdlib` left it."""
    return structlog.is_configured() and structlog.get_config()["processors"] is PROCESSORS


def hand_lines_to(taker: LineTaker | None) -> LineTaker | None:
    """In a program's process, hand every line of troupe's loggers to ``taker`` as well, before
    the program's levels decide on it (None: to nobody); return whom they went to before."""
    global _taker
    before, _taker = _taker, taker
    return before


def get_logger(name: str) -> Any:
    """The logger of troupe's module ``name``: structlog's where troupe owns the process, the
    standard library's under ``name`` in a program's (decided at each call: a process becomes
    troupe's own after its modules are imported)."""
    return _TroupeLogger(name)


class _TroupeLogger:
    """A module's logger, either of the two :func:`get_logger` says, looked up at each use."""

    __slots__ = ("_name", "_own", "_program")

    def __init__(self, name: str) -> None:
        self._name = name
        self._own = structlog.get_logger(name)
        self._program: Any = None

    def __getattr__(self, attr: str) -> Any:
        if attr.startswith("__"):  # copy and pickle look for hooks on an instance not yet set up
            raise AttributeError(attr)
        if _owned:
            return getattr(self._own, attr)
        if self._program is None:
            stdlib = logging.getLogger(self._name)
            self._program = structlog.stdlib.BoundLogger(stdlib, [_to_the_taker, *_FOR_A_PROGRAM], {})
        return getattr(self._program, attr)

    def __repr__(self) -> str:
        return f"<troupe logger {self._name}>"


def _to_the_taker(logger: logging.Logger, method_name: str, event: MutableMapping[str, Any]) -> Any:
    taker = _taker
    if taker is not None:
        taker(logger, method_name, event)
    return event


def _from_the_call_site(_: Any, __: str, line: str) -> tuple[tuple[str], dict[str, Any]]:
    """The rendered line, and ``stacklevel`` for the standard library to name the module and
    line that logged it (``%(filename)s``) rather than structlog's frame that calls it: without
    ``structlog.stdlib.LoggerFactory``, which sets the logger class of every logger made after
    it, the program's own too."""
    here = inspect.currentframe()
    if here is None or here.f_back is None:  # an interpreter without frames: structlog's line
        return (line,), {}
    frame, depth = here.f_back, 1  # structlog's, which runs the processors
    while frame.f_back is not None and frame.f_globals.get("__name__", "").startswith(_OURS):
        frame, depth = frame.f_back, depth + 1
    # The logger is called two frames above the processors (by structlog's _proxy_to_logger,
    # which calls _process_event): that frame is stacklevel 1.
    return (line,), {"stacklevel": max(1, depth - 1)}


_FOR_A_PROGRAM: list[Any] = [*PROCESSORS, _from_the_call_site]
