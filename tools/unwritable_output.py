"""A command whose output cannot be written (``> run.log`` on a full disk, an I/O error) says
so in one line on stderr and exits 1; ``troupe run`` goes on to its end first.

A write to stdout that failed with ENOSPC or EIO came out as a traceback of whatever printed
(rich's console, click's echo, the task group of an async command): ``troupe run``'s first line
("node up ...") cancelled the run before any item, and ``--json`` lost its report after the run
had written its data. A closed pipe is not this (``closed_output``: exit 141, quietly).

stdout and stderr are wrapped (:func:`guard_streams`, and the run's own stdout,
``own_stdout``) so that such an error is known for what it is. By default it ends the command
(:func:`unwritable_code`). A command whose work matters more than its screen
(:func:`drop_unwritable_output`: ``troupe run``, whose product is the dataset) keeps going: the
stream that failed is pointed at /dev/null from then on, and the line comes at the end.
"""

from __future__ import annotations

import os
import sys
from typing import Any

__all__ = [
    "UNWRITABLE",
    "drop_unwritable_output",
    "guard_streams",
    "guarded",
    "say_unwritten",
    "silence",
    "unwritable_code",
    "unwritten",
]

UNWRITABLE = 1
_MARK = "troupe_unwritable_output"


class _State:
    dropping = False  # drop_unwritable_output: go on without the output
    then = ""  # what the line adds, for that command
    lost: OSError | None = None  # the first write that failed and was dropped


def guard_streams() -> None:
    """Wrap ``sys.stdout`` and ``sys.stderr`` (once) so that their write errors are told apart."""
    sys.stdout = guarded(sys.stdout)
    sys.stderr = guarded(sys.stderr)


def guarded(stream: Any) -> Any:
    """``stream``, its failed writes and flushes marked as an unwritable output (or dropped)."""
    if stream is None or isinstance(stream, _Guarded):
        return stream
    return _Guarded(stream)


def drop_unwritable_output(then: str) -> None:
    """From now on an output that cannot be written is dropped and the command goes on; it ends
    with the line (``then`` added: what became of the work) and exit 1."""
    _State.dropping, _State.then = True, then


def unwritten() -> OSError | None:
    """The first write that failed and was dropped; None if every one went out."""
    return _State.lost


def unwritable_code(exc: BaseException) -> int | None:
    """For an ``exc`` (or a group of only such) raised by a failed write of stdout or stderr:
    the line said, and ``UNWRITABLE``; None for anything else."""
    failed = _failed_write(exc)
    if failed is None:
        return None
    silence(getattr(failed, _MARK))  # what is buffered for it would fail again at Python's exit
    say_unwritten(failed)
    return UNWRITABLE


def _failed_write(exc: BaseException) -> OSError | None:
    """``exc`` if a failed write raised it; in a group, the first such where every one is."""
    if isinstance(exc, BaseExceptionGroup):
        failed = [_failed_write(e) for e in exc.exceptions]
        return failed[0] if None not in failed else None
    return exc if isinstance(exc, OSError) and getattr(exc, _MARK, None) is not None else None


def say_unwritten(exc: OSError) -> None:
    """The command's line, on stderr if stderr still takes one."""
    line = f"error: cannot write the output ({exc.strerror or exc}){_State.then}\n"
    try:
        sys.__stderr__.write(line)  # type: ignore[union-attr]
        sys.__stderr__.flush()  # type: ignore[union-attr]
    except (OSError, ValueError, AttributeError):  # stderr is the stream that fails: nothing to say
        silence(sys.__stderr__)


class _Guarded:
    """A text stream's proxy: what it does not define, the stream does."""

    def __init__(self, stream: Any) -> None:
        self._stream = stream

    def write(self, text: str) -> int:
        try:
            return int(self._stream.write(text))
        except BrokenPipeError:  # a reader gone: closed_output's
            raise
        except OSError as exc:
            self._failed(exc)
            return len(text)

    def flush(self) -> None:
        try:
            self._stream.flush()
        except BrokenPipeError:
            raise
        except OSError as exc:
            self._failed(exc)

    def _failed(self, exc: OSError) -> None:
        if not _State.dropping:
            setattr(exc, _MARK, self._stream)
            raise exc
        if _State.lost is None:
            _State.lost = exc
        silence(self._stream)  # the rest goes nowhere, at no cost (and no second error)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


def silence(stream: Any) -> None:
    """Point ``stream``'s descriptor at /dev/null (what is buffered for it goes there too)."""
    try:
        fd = stream.fileno()
    except (AttributeError, OSError, ValueError):
        return
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, fd)
    except OSError:
        pass
    finally:
        os.close(devnull)
