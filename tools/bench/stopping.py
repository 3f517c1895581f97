"""Ctrl-C and SIGTERM for ``troupe bench``: a benchmark stopped midway prints no figures, kills
what it started and exits 128 + the signal (130, 143).

A benchmark is synchronous code around several event loops, threads and child processes. Left
to Python, a SIGINT became a cancellation that one of those loops absorbed (asyncio cancels its
main task on Ctrl-C, and a task group cancelled that way returns normally), and the benchmark
went on to its next phase with half its figures, to end in a KeyError's traceback. Here the
first signal raises KeyboardInterrupt wherever the main thread is (a handler of our own, which
asyncio leaves in place); the command unwinds (its temporary directories removed, its children
waited for where its code does so), SIGKILLs whatever processes of its own remain, says so in
one line and exits at once, without the interpreter's wind-down. A second signal ends it at
once too.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import shutil
import signal
import sys
import tempfile
from collections.abc import Callable, Iterator
from typing import Any, ParamSpec, TypeVar

from rich.console import Console

from troupe.cli.stop_signals import STOP_SIGNALS, exit_status, kill_descendants

__all__ = ["bench_folder", "deaf_to_ctrl_c", "stops_cleanly"]

P = ParamSpec("P")
T = TypeVar("T")

_err = Console(stderr=True)


def stops_cleanly(command: Callable[P, T]) -> Callable[P, T]:
    """Wrap a ``troupe bench`` command (see the module)."""

    @functools.wraps(command)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> T:
        received: list[int] = []

        def on_signal(signum: int, _frame: Any) -> None:
            if received:  # the second: no more waiting
                kill_descendants(wait_s=0.5)
                os._exit(exit_status(received[0]))
            received.append(signum)
            raise KeyboardInterrupt

        previous = {s: signal.signal(s, on_signal) for s in STOP_SIGNALS}
        try:
            try:
                return command(*args, **kwargs)
            except BaseException as exc:
                # Also what the stop broke on its way out: a task group's exception group
                # around the KeyboardInterrupt, a wait cut short.
                if not received and not isinstance(exc, KeyboardInterrupt):
                    raise
                signum = received[0] if received else signal.SIGINT
            killed = kill_descendants()
            for folder in _folders:  # its children wrote there as it was removed: gone now
                shutil.rmtree(folder, ignore_errors=True)
            left = f"; {killed} process{'' if killed == 1 else 'es'} it started killed" if killed else ""
            name = signal.Signals(signum).name
            _err.print(f"stopped ({name}): the benchmark prints no figures{left}", highlight=False)
            # Not through the interpreter's wind-down: it joins the worker threads the stop
            # left mid-call, and one collecting a ZeroMQ context whose sockets were never
            # closed blocks in its term() for good.
            logging.shutdown()
            for stream in (sys.stdout, sys.stderr):
                with contextlib.suppress(OSError, ValueError):
                    stream.flush()
            os._exit(exit_status(signum))
        finally:
            for signum_, handler in previous.items():
                signal.signal(signum_, handler)

    return wrapper


def deaf_to_ctrl_c(target: Callable[..., Any], *args: Any) -> Any:
    """Run ``target(*args)`` in a benchmark's child process (multiprocessing's ``target``) with
    Ctrl-C ignored from here on: the terminal sends it to the whole group, and a child printed
    its traceback over the benchmark's one line (the benchmark kills its children itself). Not
    set in the parent around the child's start: a Ctrl-C that came then went to another of the
    benchmark's threads, found it ignored, and the benchmark ran on to its end."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    return target(*args)


_folders: list[str] = []  # the temporary folders of the benchmark running in this process


@contextlib.contextmanager
def bench_folder(prefix: str) -> Iterator[str]:
    """A temporary folder for a benchmark's files, removed as it ends, also when it is stopped:
    a child still writing in it as the stop removed it left the folder behind."""
    with tempfile.TemporaryDirectory(prefix=prefix, ignore_cleanup_errors=True) as folder:
        _folders.append(folder)
        yield folder  # stopped: it stays listed, for the stop to remove once the children are gone
        _folders.remove(folder)
