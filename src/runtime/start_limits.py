"""A process or thread that could not be started, said as the limit that most likely refused it.

Under a process limit (``ulimit -u``, a cgroup's ``pids.max``: threads count as processes) a
fork fails with EAGAIN and a thread start with ``RuntimeError: can't start new thread``; under a
memory limit (``ulimit -v``, a cgroup's memory limit) the same, or ENOMEM. Python's words name no
limit, and a program that lets them out of a task group prints a hundred lines of traceback
instead (a node whose worker restart could not fork died whole, its healthy workers with it).
:func:`start_failure` gives the one line to say instead (:func:`limit_reached` only where the
error can be nothing else, for a command's last words); :func:`in_thread` runs a blocking call
in a thread, or on the caller's loop where no thread can be started now (a master serves on).
"""

from __future__ import annotations

import errno
import os
import resource
from collections.abc import Callable
from typing import TypeVar

import anyio

from troupe.runtime.library_logging import get_logger

__all__ = [
    "in_thread",
    "limit_line",
    "limit_reached",
    "remote_limit_reached",
    "start_failure",
    "thread_refused",
]

log = get_logger(__name__)

T = TypeVar("T")

_PROCESS_LIMIT = "a process limit: ulimit -u, cgroup pids.max"
_MEMORY_LIMIT = "a memory limit: ulimit -v, cgroup memory.max or memory.limit_in_bytes"
_HINTS = {
    errno.EAGAIN: _PROCESS_LIMIT,
    errno.ENOMEM: _MEMORY_LIMIT,
    errno.EMFILE: "the open-files limit: ulimit -n",
    errno.ENFILE: "the system's open-files limit: fs.file-max",
}


def thread_refused(exc: BaseException) -> bool:
    """Whether ``exc`` is Python's refusal to start a thread (``can't start new thread``)."""
    return isinstance(exc, RuntimeError) and str(exc).startswith("can't start new thread")


def start_failure(exc: BaseException) -> str | None:
    """One line for ``exc`` where it is a failed process or thread start (an OSError, or a
    thread refused): what failed and the limit likely behind it; None for any other error."""
    if thread_refused(exc):
        return f"could not start a thread (can't start new thread): {_thread_limits()}"
    if not isinstance(exc, OSError):
        return None
    why = (exc.strerror or os.strerror(exc.errno)) if exc.errno else str(exc)
    hint = _HINTS.get(exc.errno or 0)
    return f"could not start a process: {why}" + (f" ({hint})" if hint else "")


def limit_reached(exc: BaseException) -> str | None:
    """One line for ``exc`` where it says a process or memory limit refused a start (a thread
    refused, EAGAIN, ENOMEM): what a command that ends on it prints; None for any other error
    (an OSError of a file or a socket is no failed start)."""
    if thread_refused(exc) or (isinstance(exc, OSError) and exc.errno in (errno.EAGAIN, errno.ENOMEM)):
        return start_failure(exc)
    return None


def limit_line(exc: BaseException) -> str | None:
    """A child's last line on stderr for ``exc`` (alone in its exception groups, if any) where
    a limit refused a start: the exception's type first, as its node reads a child's last
    error (``BlockingIOError: could not start a process: ...``); None for any other error."""
    leaves = _leaves(exc)
    said = limit_reached(leaves[0]) if len(leaves) == 1 else None
    return None if said is None else f"{type(leaves[0]).__name__}: {said}"


def remote_limit_reached(remote_type: str, message: str) -> str | None:
    """:func:`limit_reached` for an error raised in another process (``RemoteError``'s type and
    message): a hook that could not start a thread says the limit too."""
    if remote_type == "builtins.RuntimeError" and message.startswith("can't start new thread"):
        return limit_reached(RuntimeError(message))
    for code in (errno.EAGAIN, errno.ENOMEM):
        if remote_type.startswith("builtins.") and message.startswith(f"[Errno {code}]"):
            return limit_reached(OSError(code, os.strerror(code)))
    return None


def _leaves(exc: BaseException) -> list[BaseException]:
    if isinstance(exc, BaseExceptionGroup):
        return [leaf for e in exc.exceptions for leaf in _leaves(e)]
    return [exc]


def _thread_limits() -> str:
    """The limits a refused thread start may have hit, a set address-space limit first: a
    thread's stack is reserved from it, and Python says the same words for either."""
    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    if soft != resource.RLIM_INFINITY:
        return f"the address-space limit (ulimit -v, {soft // 2**20} MiB here), or {_PROCESS_LIMIT}"
    return f"{_PROCESS_LIMIT}; or {_MEMORY_LIMIT}"


async def in_thread(fn: Callable[..., T], *args: object, what: str) -> T:
    """``fn(*args)`` in a worker thread; on this loop, blocking it meanwhile, where no thread
    can be started now (logged as ``thread_refused``, ``what`` saying which call): a process
    limit reached for a moment costs a stall, not the process."""
    try:
        return await anyio.to_thread.run_sync(fn, *args)
    except RuntimeError as exc:
        if not thread_refused(exc):
            raise
        log.warning(
            "thread_refused", call=what, error=start_failure(exc), hint="ran on the event loop instead"
        )
    return fn(*args)
