"""Structured logging: JSON lines to one file per node, readable lines on the console.

Every line carries who logged it: the node, the process and its pid; lines logged inside an
actor's handler, in code it calls, in a thread it starts with ``anyio.to_thread`` and in a task
that an actor runs (``TaskActor.run_task``) also carry the actor, and the message id and trace
id of the message in hand. The actor comes from ``structlog.contextvars`` (``actor``, bound per
actor task and per task run) or else the current actor cell.

Who logged always wins: an event field with the name of one of those fields (``pid=`` of a
worker logged by its node, ``node=`` of a peer logged by the master) is kept under
``event_<name>`` instead, so ``pid`` is always the logging process's own. Call sites should
name such fields for what they are (``worker_pid``) in the first place.

Every process of a node appends to the same file, ``<logs>/<node>.jsonl``: each record is one
``write`` on a file opened with O_APPEND, which Linux does not interleave for lines this short.
Every process rotates that file by size before a line that would take it past, under one lock,
and follows the rotations the others make (:mod:`troupe.runtime.log_files`); the node also
publishes each line on its log stream (:mod:`troupe.runtime.log_publisher`), as a master
started on its own does its own file's.
``configure_logging`` is called only by entry points (the CLI, the worker main): in a program's
process troupe configures no logging (:mod:`troupe.runtime.library_logging`), and a run there
writes troupe's lines to its file beside the program's logging (:class:`ProgramRunLog`).

Every line is strict JSON (:mod:`troupe.runtime.log_json`: a float that is not finite is
written as a string).
"""

from __future__ import annotations

import contextlib
import logging
import logging.handlers
import os
import sys
import threading
from collections.abc import Iterator, MutableMapping
from pathlib import Path
from typing import Any, Protocol

import structlog

from .library_logging import (
    by_troupe,
    hand_lines_to,
    level_of,
    own_this_process,
    route_through_stdlib,
    troupe_owns_this_process,
)
from .log_files import ReopeningFileHandler
from .log_json import strict_json

__all__ = [
    "LOG_LEVELS",
    "HeldLog",
    "ProgramRunLog",
    "RunLog",
    "check_log_level",
    "configure_logging",
    "identify",
    "log_file",
    "run_log",
]

LOG_LEVELS = ("debug", "info", "warning", "error")

_TROUPE = "troupe"  # the standard library's logger above every module's of troupe

# ``log.exception``'s ``exception`` field: structlog's frames, without their local variables
# (``dict_tracebacks`` keeps them: an item's payload, a runtime's repr, in every such line).
_EXCEPTION_FRAMES = structlog.processors.ExceptionRenderer(
    structlog.tracebacks.ExceptionDictTransformer(show_locals=False)
)


def check_log_level(level: str) -> str:
    """``level`` as given, if it is one of ``LOG_LEVELS`` (any case).

    Raises:
        ValueError: it is not; the message lists the levels.
    """
    if not isinstance(level, str) or level.lower() not in LOG_LEVELS:
        raise ValueError(f"unknown log level {level!r}: use debug, info, warning or error")
    return level


def log_file(log_dir: Path, node: str) -> Path:
    """Return the JSON-lines file of ``node`` under ``log_dir``."""
    return log_dir / f"{node}.jsonl"


def _bound_actor() -> str | None:
    """The actor whose code is running, if any: the bound ``actor``, else the current cell's."""
    from troupe.runtime.core.cell import (
        Cell,  # late: logs must be importable before the runtime
    )

    bound = structlog.contextvars.get_contextvars().get("actor")
    if bound is not None:
        return str(bound)
    cell = Cell.current.get()
    return None if cell is None else cell.name


def identify(event: dict[str, Any], who: dict[str, Any]) -> dict[str, Any]:
    """Stamp ``who`` logged (node, process, pid, and actor when known) on ``event``.

    An event field that has one of those names and another value moves to ``event_<name>``.
    """
    for key, value in who.items():
        if value is None:
            continue
        if key in event and event[key] != value:
            event[f"event_{key}"] = event.pop(key)
        event[key] = value
    return event


def _add_message_context(_: Any, __: str, event: dict[str, Any]) -> dict[str, Any]:
    from troupe.runtime.core.cell import (
        Cell,  # late: logs must be importable before the runtime
    )

    cell = Cell.current.get()
    msg = None if cell is None else cell.handling
    if msg is not None:
        event.setdefault("msg_id", msg.msg_id)
        if msg.trace:
            event.setdefault("trace", msg.trace)
    return event


def configure_logging(
    node: str,
    process: str,
    log_dir: Path | None = None,
    console: bool = True,
    level: str = "info",
    rotate_at_bytes: int | None = None,
    keep: int = 5,
) -> Path | None:
    """Configure structlog for this process.

    Args:
        node: node name stamped on every line.
        process: process name stamped on every line.
        log_dir: where the node's JSON-lines file goes; None writes no file.
        console: also print readable lines to stderr.
        level: the lowest level written (debug, info, warning, error).
        rotate_at_bytes: this process rotates the file before a line that would take it past
            this size (every process of a node does, under one lock: ``log_files``); None
            only follows the rotations others make.
        keep: rotated files kept when this process rotates.

    Returns:
        The log file path, or None.
    """
    numeric = logging.getLevelName(check_log_level(level).upper())
    own_this_process()
    shared = _stamped(node, process)
    structlog.configure(
        processors=[*shared, structlog.stdlib.ProcessorFormatter.wrap_for_formatter],
        logger_factory=structlog.stdlib.LoggerFactory(),
        wrapper_class=structlog.make_filtering_bound_logger(numeric),
        cache_logger_on_first_use=True,
    )
    root = logging.getLogger()
    for handler in list(root.handlers):
        root.removeHandler(handler)
        handler.close()  # an earlier configuration's file
    root.setLevel(numeric)
    path = None
    if log_dir is not None:
        path = log_file(log_dir, node)
        root.addHandler(_file_handler(log_dir, node, process, shared, rotate_at_bytes, keep))
    if console:
        console_handler = logging.StreamHandler(sys.stderr)
        console_handler.setFormatter(
            structlog.stdlib.ProcessorFormatter(
                processors=[
                    structlog.stdlib.ProcessorFormatter.remove_processors_meta,
                    structlog.dev.ConsoleRenderer(colors=sys.stderr.isatty()),
                ],
                foreign_pre_chain=shared,
            )
        )
        root.addHandler(console_handler)
    return path


def _stamped(node: str, process: str) -> list[Any]:
    """The processors that stamp who logged a line and when (node, process, pid, actor; the
    message in hand, the level, the time), before it is rendered."""
    pid = os.getpid()

    def add_who(_: Any, __: str, event: dict[str, Any]) -> dict[str, Any]:
        # Before merge_contextvars: what is in ``event`` here came from the call site only.
        return identify(event, {"node": node, "process": process, "pid": pid, "actor": _bound_actor()})

    return [
        add_who,
        structlog.contextvars.merge_contextvars,
        _add_message_context,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]


def _file_handler(
    log_dir: Path,
    node: str,
    process: str,
    shared: list[Any],
    rotate_at_bytes: int | None = None,
    keep: int = 5,
) -> ReopeningFileHandler:
    """The handler that writes the JSON lines of ``node``'s file under ``log_dir`` (made now)."""
    log_dir.mkdir(parents=True, exist_ok=True)
    handler = ReopeningFileHandler(log_file(log_dir, node), rotate_at_bytes, keep, who=f"process {process}")
    handler.setFormatter(
        structlog.stdlib.ProcessorFormatter(
            processors=[
                structlog.stdlib.ProcessorFormatter.remove_processors_meta,
                _EXCEPTION_FRAMES,
                structlog.processors.JSONRenderer(serializer=strict_json),
            ],
            foreign_pre_chain=shared,
        )
    )
    return handler


def _configured_by_troupe() -> bool:
    """Whether ``configure_logging`` configured this process (its file, its console): a run
    leaves that alone. troupe's routing through the standard library until then is not it."""
    return structlog.is_configured() and not by_troupe()


class RunLog(Protocol):
    """Where a run sends its log lines (:func:`run_log`)."""

    def write_to(self, log_dir: Path) -> None:
        """Log to ``log_dir`` (made now) from here on, the lines held until now first."""

    def hand_back(self) -> None:
        """The run is over: nothing more of its lines goes to its file."""


@contextlib.contextmanager
def run_log(node: str, process: str) -> Iterator[RunLog | None]:
    """The logging of a run (``run_pipeline``, ``run_training``): its lines held, then written
    to its file (:meth:`RunLog.write_to`), and as the run ends, however it ends, the file
    closed (:meth:`RunLog.hand_back`): the program's own lines, and a later run's, went to the
    first run's file.

    In a program's process, troupe's lines only (:class:`ProgramRunLog`); in a process troupe
    owns (``troupe run``), the process's (:class:`HeldLog`), or None where ``configure_logging``
    gave it its file already."""
    held: RunLog
    if not troupe_owns_this_process():
        held = ProgramRunLog(node, process)
    elif _configured_by_troupe():
        yield None
        return
    else:
        held = HeldLog(node, process)
    try:
        yield held
    finally:
        held.hand_back()


class ProgramRunLog:
    """A run's log lines in a program's process: troupe's lines, held in memory until the
    directory of their file may be made, then written to it, beside the program's logging.

    The program's logging stays as it set it up: its handlers get troupe's lines at its levels,
    and its own lines never reach the run's file. troupe's loggers hand this every line at info
    and above (``library_logging.hand_lines_to``), whatever the program's levels; meanwhile a
    handler of the ``troupe`` logger that writes nothing keeps Python's last resort from putting
    troupe's warnings on the terminal of a program that set up no logging (they are in the file).

    Args:
        node: node name stamped on every line.
        process: process name stamped on every line.
    """

    def __init__(self, node: str, process: str) -> None:
        self.node, self.process = node, process
        self._stamps = _stamped(node, process)
        self._lock = threading.Lock()  # lines come from the run's threads too
        self._held: list[logging.LogRecord] = []
        self._file: logging.Handler | None = None
        self._quiet = logging.NullHandler()
        logging.getLogger(_TROUPE).addHandler(self._quiet)
        self._before = hand_lines_to(self._take)

    def _take(self, logger: logging.Logger, method_name: str, event: MutableMapping[str, Any]) -> None:
        level = level_of(method_name)
        if level < logging.INFO:
            return
        line = dict(event)  # the program's handlers get theirs as it was
        if line.get("exc_info") is True:  # held lines are written later, outside the except
            caught = sys.exc_info()
            line["exc_info"] = caught if caught[1] is not None else False
        for stamp in self._stamps:
            line = stamp(logger, method_name, line)
        record = logger.makeRecord(
            logger.name, level, "", 0, line, (), None, extra={"_logger": logger, "_name": method_name}
        )
        with self._lock:
            if self._file is None:
                self._held.append(record)
                return
            file = self._file
        file.handle(record)

    def write_to(self, log_dir: Path) -> None:
        """Log to ``log_dir`` (made now) from here on, the held lines first."""
        file = _file_handler(log_dir, self.node, self.process, self._stamps)
        with self._lock:
            for record in self._held:
                file.handle(record)
            self._held, self._file = [], file

    def hand_back(self) -> None:
        """The run is over: troupe's lines go to the program's logging alone again."""
        hand_lines_to(self._before)
        logging.getLogger(_TROUPE).removeHandler(self._quiet)
        with self._lock:
            file, self._file, self._held = self._file, None, []
        if file is not None:
            file.close()


class HeldLog:
    """The log lines of a process troupe owns (``troupe run``), held in memory until the
    directory of their file may be made.

    A run checks its config before it makes anything in ``out``, the log directory included,
    and logs meanwhile. :meth:`write_to` configures logging with the file and writes what was
    held into it first; :meth:`drop` forgets the lines (the check failed: nothing was made);
    :meth:`hand_back` gives the process its logging back.

    Args:
        node: node name stamped on every line.
        process: process name stamped on every line.
    """

    def __init__(self, node: str, process: str) -> None:
        self.node, self.process = node, process
        root = logging.getLogger()
        # The process's handlers: set aside, not closed, for later.
        self._program: tuple[list[logging.Handler], int] = (list(root.handlers), root.level)
        for handler in self._program[0]:
            root.removeHandler(handler)
        configure_logging(node, process, None, console=False)
        # No target: it never writes, whatever it holds (a check's few dozen lines).
        self._held: logging.handlers.MemoryHandler | None = logging.handlers.MemoryHandler(
            capacity=1 << 30, flushLevel=logging.CRITICAL + 1
        )
        logging.getLogger().addHandler(self._held)

    def write_to(self, log_dir: Path) -> None:
        """Log to ``log_dir`` (made now) from here on, the held lines first."""
        held, self._held = self._held, None
        configure_logging(self.node, self.process, log_dir, console=False)
        root = logging.getLogger()
        for record in held.buffer if held is not None else ():
            root.handle(record)

    def drop(self) -> None:
        """Forget the held lines (a no-op once written)."""
        held, self._held = self._held, None
        if held is not None:
            logging.getLogger().removeHandler(held)

    def hand_back(self) -> None:
        """The run is over: the process's root handlers and level back as they were, and
        structlog through the standard library, which they decide (none: warnings on stderr,
        Python's last resort), rather than into the run's file."""
        self.drop()
        root = logging.getLogger()
        for handler in list(root.handlers):
            root.removeHandler(handler)
            handler.close()  # the run's file
        handlers, level = self._program
        for handler in handlers:
            root.addHandler(handler)
        root.setLevel(level)
        route_through_stdlib()
