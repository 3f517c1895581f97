"""What a worker leaves running when the node stops it: its descendants, killed once it is gone.

A stage may start processes of its own: a helper through ``subprocess``, or a ``fork`` whose
child inherited the worker's SIGTERM handler (a handler that child never runs, so a plain
``kill`` does nothing to it). A worker the node stopped on purpose (a run's end, Ctrl-C,
``stop_worker``, the node's own stop) left them running, reparented: they kept what they held,
GPUs, ports, and the pipes of the command that started the run (``troupe run ... | tail`` never
returned). The supervisor already kills the whole tree of a worker it finds hung
(:func:`~troupe.runtime.supervision.supervisor.kill_tree`); this does the same for a stop.

Once the worker has exited, its descendants are no longer below it, so the tree is taken while
it still lives: when the node signals it (before the SIGTERM, and again before a SIGKILL, the
graceful stop may have started more). After the exit, whatever of that tree still runs is
SIGKILLed with its own descendants, each process as it was taken: psutil checks its start time,
so a pid reused since is never signalled. Not a process group: the workers forked from a
template share the template's.
"""

from __future__ import annotations

import os
from collections import defaultdict
from collections.abc import Iterable
from typing import TYPE_CHECKING

import psutil

from troupe.runtime.library_logging import get_logger
from troupe.runtime.start_limits import in_thread
from troupe.runtime.supervision.supervisor import kill_tree

if TYPE_CHECKING:
    from .worker_handles import WorkerHandle

__all__ = ["descendants_of", "kill_group", "kill_what_is_left", "note_descendants"]

log = get_logger(__name__)

REAP_S = 5.0  # for each killed process to be gone; SIGKILL cannot be refused, so this is rarely waited


async def note_descendants(handles: Iterable[WorkerHandle]) -> None:
    """Add to each of ``handles`` whose worker still runs the processes below it now (one look
    at the process table for all of them, off the event loop: it reads every process's record)."""
    live = {h.pid: h for h in handles if h.pid and h.process is not None and h.returncode is None}
    if not live:
        return
    trees = await in_thread(descendants_of, set(live), what="descendants_of")
    for pid, found in trees.items():
        handle = live[pid]
        known = set(handle.descendants)  # psutil's processes compare by pid and start time
        handle.descendants.extend(p for p in found if p not in known)


def descendants_of(pids: set[int]) -> dict[int, list[psutil.Process]]:
    """The processes below each of ``pids`` now, parents before their children."""
    children: dict[int, list[psutil.Process]] = defaultdict(list)
    for proc in psutil.process_iter(["ppid"]):
        ppid = proc.info["ppid"]
        if ppid:
            children[ppid].append(proc)
    trees: dict[int, list[psutil.Process]] = {}
    for root in pids:
        found: list[psutil.Process] = []
        below = [root]
        while below:
            for child in children.get(below.pop(), ()):
                found.append(child)
                below.append(child.pid)
        trees[root] = found
    return trees


async def kill_what_is_left(handle: WorkerHandle) -> None:
    """After ``handle``'s worker exited: SIGKILL what still runs of the tree it had when the
    node signalled it (nothing if the node never did), and wait for it to be gone."""
    taken, handle.descendants = handle.descendants, []
    if not taken:
        return
    _said(handle, "descendants", *await in_thread(_kill_running, taken, what="kill_descendants"))


def _kill_running(taken: list[psutil.Process]) -> tuple[list[int], list[psutil.Process]]:
    killed: list[int] = []
    survivors: list[psutil.Process] = []
    for proc in taken:  # parents first: a parent's kill_tree takes its children with it
        if _running(proc):
            killed.append(proc.pid)
            survivors.extend(kill_tree(proc, REAP_S))
    return killed, survivors


def _running(proc: psutil.Process) -> bool:
    """The very process taken (not a reused pid) still runs: a zombie is dead already."""
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


async def kill_group(handle: WorkerHandle) -> None:
    """After ``handle``'s worker exited, however it ended (a stop, a crash, SIGKILL): SIGKILL what
    is left of the process group it led (a forked worker sets one up, a spawned one leads its
    session's), and wait for it to be gone, reaping those the node inherited as their
    subreaper. It finds what the tree taken at a stop misses: what a stage started after that
    look, what a worker that died without a stop had started, and what a shell put in the
    background (``helper &``: orphaned at once, no longer below the worker)."""
    pid = handle.pid
    if not pid:
        return
    _said(handle, "group", *await in_thread(_kill_group, pid, what="kill_group"))


def _said(handle: WorkerHandle, what: str, killed: list[int], survivors: list[psutil.Process]) -> None:
    """Log what a kill after ``handle``'s exit took (``worker_{what}_killed``), and what outlived
    it (``worker_{what}_survived``)."""
    if killed:
        log.info(f"worker_{what}_killed", worker=handle.spec.name, pids=killed)
    if survivors:
        log.warning(f"worker_{what}_survived", worker=handle.spec.name, pids=[p.pid for p in survivors])


def _kill_group(pgid: int) -> tuple[list[int], list[psutil.Process]]:
    me = os.getpid()
    if pgid in (me, os.getpgid(0)):  # never this process's own group
        return [], []
    members: list[psutil.Process] = []
    for proc in psutil.process_iter():
        try:
            if proc.pid != me and os.getpgid(proc.pid) == pgid and proc.status() != psutil.STATUS_ZOMBIE:
                members.append(proc)
        except (OSError, psutil.Error):
            continue
    killed: list[int] = []
    for proc in members:
        try:
            proc.kill()  # psutil checks it is the process it listed (its start time)
            killed.append(proc.pid)
        except psutil.Error:
            continue
    _, survivors = psutil.wait_procs(members, timeout=REAP_S)  # waits (reaps) the node's own
    _reap_orphans(members)
    return killed, survivors


def _reap_orphans(members: list[psutil.Process]) -> None:
    """Reap those of ``members`` the node inherited that are zombies still (psutil waited for them
    as another's children, or they died before the listing)."""
    for proc in members:
        try:
            os.waitpid(proc.pid, os.WNOHANG)
        except ChildProcessError:
            continue
