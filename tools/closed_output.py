"""A command whose output's reader went away (``troupe run | head -1``) ends quietly with 141.

A shell reports 141 (128 + SIGPIPE) for a command that a closed pipe stopped, which is what
``head``'s writers are when they are coreutils; scripts under ``set -o pipefail`` expect it
there. A Python program ignores SIGPIPE and gets ``BrokenPipeError`` instead, which rich (its
consoles exit 1) and click (its echo: exit 1) each turned into a silent failure, and which,
raised in an async command's task group, came out as a traceback of the group. SIGPIPE itself
stays ignored: a node's sockets and pipes to its children must get errors, not kill it.

An output that cannot be written for another reason (a full disk) ends the command with one
line and exit 1 (``unwritable_output``); ``run_app`` applies both.
"""

from __future__ import annotations

import sys
from collections.abc import Callable

from rich.console import Console

from troupe.cli.unwritable_output import (
    UNWRITABLE,
    guard_streams,
    say_unwritten,
    silence,
    unwritable_code,
    unwritten,
)

__all__ = ["OUTPUT_CLOSED", "closed_output_code", "install", "run_app"]

OUTPUT_CLOSED = 141  # 128 + SIGPIPE


def run_app(app: Callable[[], object]) -> None:
    """Run the command line ``app``; a closed output ends it with ``OUTPUT_CLOSED``, quietly, an
    unwritable one with a line and ``UNWRITABLE`` (the console script's entry and ``python -m
    troupe.cli.main`` both run it so)."""
    install()
    guard_streams()
    try:
        app()
    except BaseException as exc:  # SystemExit too: click and rich end a closed pipe with 1
        code = closed_output_code(exc)
        if code is None:
            code = unwritable_code(exc)
        if code is None and isinstance(exc, SystemExit):
            code = _ended_without_output(exc)
        if code is None:
            raise
        sys.exit(code)
    if unwritten() is not None:
        sys.exit(_ended_without_output(SystemExit(0)))


def _ended_without_output(end: SystemExit) -> int | None:
    """For a command that went on without its output (``drop_unwritable_output``) and ended:
    the line said, and its own status (``UNWRITABLE`` for 0); None where nothing was lost."""
    lost = unwritten()
    if lost is None:
        return None
    say_unwritten(lost)
    return end.code if isinstance(end.code, int) and end.code else UNWRITABLE


def install() -> None:
    """Make every rich console of this process end the command with ``OUTPUT_CLOSED`` when
    its stream's reader has gone (their ``on_broken_pipe``)."""
    Console.on_broken_pipe = _on_broken_pipe  # type: ignore[method-assign]


def _on_broken_pipe(self: Console) -> None:
    self.quiet = True
    # What is still buffered for the closed stream would fail again as Python flushes it at
    # exit, and say so on stderr: it goes to /dev/null. The other stream still speaks.
    silence(sys.__stderr__ if self.stderr else sys.__stdout__)
    raise SystemExit(OUTPUT_CLOSED)


def closed_output_code(exc: BaseException) -> int | None:
    """``OUTPUT_CLOSED`` when ``exc`` (or every exception in a group of them) is how a closed
    output ended the command; None otherwise."""
    if isinstance(exc, BaseExceptionGroup):
        codes = {closed_output_code(e) for e in exc.exceptions}
        return OUTPUT_CLOSED if codes == {OUTPUT_CLOSED} else None
    if isinstance(exc, BrokenPipeError):
        silence(sys.__stdout__)
        return OUTPUT_CLOSED
    if isinstance(exc, SystemExit):
        if exc.code == OUTPUT_CLOSED:
            return OUTPUT_CLOSED
        # click's own handling of a closed pipe (typer.echo; typer carries its own click):
        # exit 1, with its streams wrapped to hush their flush at exit
        if exc.code == 1 and type(sys.stdout).__name__ == "PacifyFlushWrapper":
            silence(sys.__stdout__)
            return OUTPUT_CLOSED
    return None
