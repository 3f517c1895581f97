"""Ctrl-C, SIGTERM and SIGHUP for ``troupe bench``: a benchmark stopped midway prints no figures,
kills what it started and exits 128 + the signal (130, 143, 129).

A benchmark is synchronous code around several event loops, threads and child processes. Left
to Python, a SIGINT became a cancellation that one of those loops absorbed (asyncio cancels its
main task on Ctrl-C, and a task group cancelled that way returns normally), and the benchmark
went on to its next phase with half its figures, to end in a KeyError's traceback. Here the
first signal raises KeyboardInterrupt wherever the main thread is (a handler of our own, which
asyncio leaves in place); the command unwinds (its temporary directories removed, its children
waited for where its code does so), SIGKILLs whatever processes of its own remain, says so in
one line and exits at once, without the interpreter's wind-down. A second signal ends it at
once too, the same way (the line said, the folders removed), without waiting for the unwind.
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
from multiprocessing import resource_tracker
from typing import Any, NoReturn, ParamSpec, TypeVar

from rich.console import Console

from troupe.cli.stop_signals import exit_status, heeded_signals, kill_descendants, say_if_heard

from .bench_children import die_with_bench

__all__ = ["bench_folder", "deaf_to_ctrl_c", "start_deaf", "stops_cleanly"]

P = ParamSpec("P")
T = TypeVar("T")

_err = Console(stderr=True)


def stops_cleanly(command: Callable[P, T]) -> Callable[P, T]:
    """Wrap a ``troupe bench`` command (see the module)."""

    @functools.wraps(command)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> T:
        received: list[int] = []

        def on_signal(signum: int, _frame: Any) -> None:
            if received:  # the second: no more waiting for the unwind, but the same end
                _end(received[0], kill_wait_s=0.5)
            received.append(signum)
            raise KeyboardInterrupt

        previous = {s: signal.signal(s, on_signal) for s in heeded_signals()}
        try:
            try:
                return command(*args, **kwargs)
            except BaseException as exc:
                # Also what the stop broke on its way out: a task group's exception group
                # around the KeyboardInterrupt, a wait cut short.
                if not received and not isinstance(exc, KeyboardInterrupt):
                    raise
                signum = received[0] if received else signal.SIGINT
            _end(signum)
        finally:
            for signum_, handler in previous.items():
                signal.signal(signum_, handler)

    return wrapper


def _end(signum: int, kill_wait_s: float = 2.0) -> NoReturn:
    """End a stopped benchmark: kill what it started, remove its folders, say so, exit.

    The same end for the first signal (once the command has unwound) and for a second one
    (wherever the unwind was, with a shorter wait for the killed): a second Ctrl-C skipped the
    line and left the benchmark's folders in /tmp.
    """
    killed = kill_descendants(wait_s=kill_wait_s)
    for folder in list(_folders):  # its children wrote there as it was removed: gone now
        shutil.rmtree(folder, ignore_errors=True)
    left = f"; {killed} process{'' if killed == 1 else 'es'} it started killed" if killed else ""
    name = signal.Signals(signum).name
    # A terminal gone (SIGHUP) hears nothing: the line is dropped, the stop goes on.
    say_if_heard(_err, f"stopped ({name}): the benchmark prints no figures{left}")
    # Not through the interpreter's wind-down: it joins the worker threads the stop left
    # mid-call, and one collecting a ZeroMQ context whose sockets were never closed blocks
    # in its term() for good.
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):
            stream.flush()
    os._exit(exit_status(signum))


def deaf_to_ctrl_c(target: Callable[..., Any], *args: Any) -> Any:
    """Run ``target(*args)`` in a benchmark's child process (multiprocessing's ``target``, the
    process started with :func:`start_deaf`) with Ctrl-C ignored: the terminal sends it to the
    whole group, and a child printed its traceback over the benchmark's one line (the benchmark
    kills its children itself). A Ctrl-C that came while the child's interpreter started waited,
    blocked, and is dropped here, ignored, as it is unblocked. The child dies with the
    benchmark (``bench_children.die_with_bench``): a benchmark killed outright kills nothing."""
    die_with_bench()
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    return target(*args)


def start_deaf(process: Any) -> None:
    """``process.start()`` (a multiprocessing process whose target is :func:`deaf_to_ctrl_c`)
    with SIGINT blocked in this thread only: the child inherits the mask, so a Ctrl-C during its
    interpreter's start and imports waits for ``deaf_to_ctrl_c`` instead of printing their
    traceback. The benchmark itself still takes that Ctrl-C: on another of its threads, or
    here once the mask is restored (ignoring it in the benchmark instead lost it).

    multiprocessing's resource tracker is started first: starting it unblocks SIGINT in the
    thread that starts it, which would be this one, between the mask and the child."""
    resource_tracker.ensure_running()
    old = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        process.start()
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


_folders: list[str] = []  # the temporary folders of the benchmark running in this process


@contextlib.contextmanager
def bench_folder(prefix: str) -> Iterator[str]:
    """A temporary folder for a benchmark's files, removed as it ends, also when it is stopped:
    a child still writing in it as the stop removed it left the folder behind."""
    with tempfile.TemporaryDirectory(prefix=prefix, ignore_cleanup_errors=True) as folder:
        _folders.append(folder)
        yield folder  # stopped: it stays listed, for the stop to remove once the children are gone
        _folders.remove(folder)
