"""The processes a benchmark starts die with it, however the benchmark ends.

A benchmark stopped by a signal kills what it started itself (stopping.py). One killed outright
(SIGKILL: the OOM killer, the end of a lost ssh session) runs no code at all, and a node or a
master it had started ran on for good, listening on its port, the master busy. So every process
a benchmark starts gets a parent-death signal (Linux ``PR_SET_PDEATHSIG``): SIGTERM, for a node
or a master to stop as on any SIGTERM, taking its own children with it (they die with their
parent: ``troupe.runtime.node.child.die_with_parent``).

The kernel sends that signal when the *thread* that started the child ends, not the process. A
child started from a worker thread (``anyio.to_thread``'s end after about 10 s idle) would be
stopped in the middle of a measurement: :func:`start` and :func:`run` refuse any thread but the
main one, which lives as long as the benchmark. :func:`die_with_bench` is for a multiprocessing
child, which lives within the call that started it, so that thread outlives it whichever it is.
"""

from __future__ import annotations

import ctypes
import multiprocessing as mp
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Sequence
from typing import Any

__all__ = ["die_with_bench", "run", "start"]

_PR_SET_PDEATHSIG = 1


def start(args: Sequence[str], **popen_kwargs: Any) -> subprocess.Popen[Any]:
    """``subprocess.Popen(args, **popen_kwargs)``, the child SIGTERMed when this process dies.

    Raises:
        RuntimeError: called from a thread other than the main one (see the module).
    """
    return subprocess.Popen(args, preexec_fn=_tie_to("start"), **popen_kwargs)


def run(args: Sequence[str], **run_kwargs: Any) -> subprocess.CompletedProcess[Any]:
    """``subprocess.run(args, **run_kwargs)``, the child SIGTERMed when this process dies.

    Raises:
        RuntimeError: called from a thread other than the main one (see the module).
    """
    return subprocess.run(args, preexec_fn=_tie_to("run"), **run_kwargs)


def die_with_bench() -> None:
    """Called first in a multiprocessing child of a benchmark: SIGTERM it when the benchmark
    process (its parent thread) ends; exit at once if that has already happened."""
    parent = mp.parent_process()
    _set_parent_death_signal(_prctl())
    if parent is not None and os.getppid() != parent.pid:  # it died before the guard was in place
        sys.exit(1)


def _tie_to(caller: str) -> Callable[[], None] | None:
    """The ``preexec_fn`` that ties a child to this process (None off Linux)."""
    if threading.current_thread() is not threading.main_thread():
        raise RuntimeError(
            f"bench_children.{caller} called from thread {threading.current_thread().name!r}: "
            "the child would be SIGTERMed when that thread ends; start it from the main thread"
        )
    if not sys.platform.startswith("linux"):
        return None
    parent = os.getpid()
    prctl = _prctl()  # looked up here: the child, between fork and exec, only calls it

    def in_child() -> None:
        _set_parent_death_signal(prctl)
        if os.getppid() != parent:  # the benchmark died before the guard was in place
            os._exit(1)

    return in_child


def _prctl() -> Any:
    return ctypes.CDLL(None, use_errno=True).prctl if sys.platform.startswith("linux") else None


def _set_parent_death_signal(prctl: Any) -> None:
    if prctl is not None:
        prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
