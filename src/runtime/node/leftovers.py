"""What a node leaves behind if it dies hard, and how its successor clears it away.

A node's children die with it by themselves (``child.die_with_parent``: a parent-death SIGKILL
and a watchdog on the parent pid). This is the last line: the node records every child it
starts in ``<log_dir>/<node>.<node pid>.pids`` (JSON, rewritten atomically), and a node that
starts under the same name and log directory reaps what a dead predecessor recorded.

A recorded process is killed only if its pid *and* its start still match the record, so a pid
reused by an unrelated process is never touched; and a file whose owner node is still alive
(another node of the same name sharing the log directory) is left alone. The start is the
process's start tick since boot (``process_start.py``), which no clock step moves; a record an
older troupe wrote holds a start time (``create_time``) and is judged by it, as it was.

A log directory may be shared with other users of the host (a lab's project folder, a temp
folder): only a record this process's own user wrote is acted on. Another user's is left alone
(their node's leftovers are not ours to kill, and a record they forged would have this node
SIGKILL any process of ours), and a process this node may not signal is said, never fatal.

The record is written as the node starts, children or none, so that it also says the name and
log directory are in use: a second node of the same name there (``live_namesake``) would write
into the same ``<name>.jsonl``. Written as the node serves, it comes too late for two nodes
started in the same instant: ``troupe node start`` holds the name by a lock first
(``name_lock.py``), and reads the records after it for a node of an older troupe.

A stop at once (a second Ctrl-C: SIGKILL of every process below, no clean stop) removes this
process's records too (``close_records``), as a clean stop does: what they named is dead, and
under a name no later node takes they piled up.
"""

from __future__ import annotations

import contextlib
import glob
import json
import os
import re
import signal
import threading
import time
import weakref
from pathlib import Path
from typing import Any

import psutil

from troupe.runtime.file_owner import is_another_users, user_name
from troupe.runtime.library_logging import get_logger
from troupe.runtime.process_start import start_ticks

__all__ = ["ChildRecord", "close_records", "keys_file", "live_namesake", "pids_file", "reap_predecessors"]

log = get_logger(__name__)

# An older troupe's records hold psutil's start time (the boot time plus the start tick): the
# same process reads the same value while the clock is not stepped; a pid reused later starts
# at least a tick (10 ms) later.
_SAME_START_S = 0.005
_REAP_WAIT_S = 5.0
_CLOSE_WAIT_S = 1.0  # a stop at once is no longer than this for a log folder that hangs
_open_records: weakref.WeakSet[ChildRecord] = weakref.WeakSet()  # this process's nodes'


def pids_file(log_dir: Path, node: str, node_pid: int) -> Path:
    """The file where the node ``node`` running as ``node_pid`` records its children."""
    return log_dir / f"{node}.{node_pid}.pids"


def keys_file(log_dir: Path, node: str, node_pid: int) -> Path:
    """The file where the node ``node`` running as ``node_pid`` hands its keys to its children
    (``security/snapshot.py``); a successor removes a dead one's with its record."""
    return log_dir / f"{node}.{node_pid}.keys"


def _alive(pid: int, record: dict[str, Any]) -> bool:
    """Whether the process ``record`` names (its ``pid`` and start) still runs."""
    if "start_ticks" in record:
        return start_ticks(pid) == int(record["start_ticks"])
    try:  # an older troupe's record: its start time
        proc = psutil.Process(pid)
        return proc.status() != psutil.STATUS_ZOMBIE and (
            abs(proc.create_time() - float(record["create_time"])) < _SAME_START_S
        )
    except psutil.Error:
        return False


class ChildRecord:
    """The node's record of the processes it started, kept on disk for a successor.

    Args:
        log_dir: the node's log directory (the record lives beside its log).
        node: the node's name.
    """

    def __init__(self, log_dir: Path, node: str) -> None:
        self.path = pids_file(log_dir, node, os.getpid())
        self._node = node
        self._owner = {"pid": os.getpid(), "start_ticks": start_ticks(os.getpid()) or 0}
        self._children: dict[int, dict[str, Any]] = {}
        _open_records.add(self)

    def claim(self) -> None:
        """Write the record as the node starts, before any child: the name and log directory
        are in use from then on (``live_namesake``)."""
        self._write()

    def add(self, pid: int, role: str) -> None:
        """Record the child ``pid`` (``role``: ``worker NAME`` or ``supervisor``) just started.

        Children that have exited since are dropped from the record at the same time.
        """
        started = start_ticks(pid)
        if started is not None:
            self._children[pid] = {"pid": pid, "start_ticks": started, "role": role}
        self._children = {p: c for p, c in self._children.items() if _alive(p, c)}
        self._write()

    def close(self) -> None:
        """At a clean stop: remove the record, unless a child outlived the stop."""
        self._children = {p: c for p, c in self._children.items() if _alive(p, c)}
        if self._children:
            self._write()
            return
        self.path.unlink(missing_ok=True)
        _open_records.discard(self)

    def _write(self) -> None:
        data = {"node": self._node, "owner": self._owner, "children": list(self._children.values())}
        tmp = self.path.with_suffix(".pids.tmp")
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            _write_new(tmp, json.dumps(data))
            os.replace(tmp, self.path)
        except OSError as exc:  # the node runs on; only the hard-death cleanup is weaker
            log.warning("child_record_not_written", path=str(self.path), error=str(exc))
            with contextlib.suppress(OSError):
                tmp.unlink(missing_ok=True)  # half written (a full disk): it was left behind


def close_records() -> None:
    """At a stop at once, once every process below this one was SIGKILLed: close the records
    of the nodes of this process (removed, unless a child outlived the kill), as a clean stop
    does. In a thread waited on for at most ``_CLOSE_WAIT_S``: the stop ends the process next,
    and neither a log folder that hangs (a lost NFS server) nor a lock the interrupted main
    thread holds (a log line's) may keep it from that."""

    def close_all() -> None:
        for record in list(_open_records):
            with contextlib.suppress(Exception):  # one that cannot be written: the next, still
                record.close()

    closer = threading.Thread(target=close_all, name="close-child-records", daemon=True)
    try:
        closer.start()
    except RuntimeError:  # no thread to be had (a pids limit): the records stay for a successor
        return
    closer.join(_CLOSE_WAIT_S)


def live_namesake(log_dir: Path, node: str) -> int | None:
    """The pid of a live node (another process, of this user) whose record says it runs as
    ``node`` with its log in ``log_dir``, or None: a second one would write into its log."""
    pattern = re.compile(rf"{re.escape(node)}\.(\d+)\.pids")
    for path in sorted(log_dir.glob(f"{glob.escape(node)}.*.pids")):
        if not pattern.fullmatch(path.name):
            continue
        try:
            st, text = _read_record(path)
            data = json.loads(text)
            owner = data["owner"]
            pid = int(owner["pid"])
            if is_another_users(st) or data.get("node") != node or pid == os.getpid():
                continue
            if _alive(pid, owner):
                return pid
        except (OSError, ValueError, KeyError, TypeError):
            continue  # unreadable: the start's reap says so
    return None


def _write_new(path: Path, text: str) -> None:
    """Write ``path`` anew, not following a symbolic link there: in a log folder another user may
    write, theirs would have this node overwrite any file of its user's."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o666)
    with os.fdopen(fd, "w", encoding="utf-8") as file:
        file.write(text)


def reap_predecessors(log_dir: Path, node: str) -> list[int]:
    """SIGKILL what dead predecessors of ``node`` recorded under ``log_dir``, wait, forget them.

    Returns:
        The pids that were killed.
    """
    pattern = re.compile(rf"{re.escape(node)}\.(\d+)\.pids")
    killed: list[int] = []
    for path in sorted(log_dir.glob(f"{glob.escape(node)}.*.pids")):
        if not pattern.fullmatch(path.name):
            continue
        try:
            st, text = _read_record(path)
            if is_another_users(st):
                log.warning("child_record_of_other_user", path=str(path), owner=user_name(st.st_uid))
                continue
            data = json.loads(text)
            owner = data["owner"]
            children = [(int(c["pid"]), dict(c), str(c.get("role", ""))) for c in data["children"]]
            owner_alive = _alive(int(owner["pid"]), owner)
            mine = [(pid, c, role) for pid, c, role in children if _alive(pid, c)]
        except (OSError, ValueError, KeyError, TypeError) as exc:
            log.warning("child_record_unreadable", path=str(path), error=str(exc))
            continue
        if data.get("node") != node or (owner_alive and int(owner["pid"]) != os.getpid()):
            continue  # a live node of this name shares the directory: its children are its own
        signalled: list[tuple[int, dict[str, Any]]] = []
        for pid, child, role in mine:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                continue
            except PermissionError:  # another user's process now (root's, a setuid one's)
                log.warning("leftover_not_ours", leftover_pid=pid, role=role, path=str(path))
                continue
            killed.append(pid)
            signalled.append((pid, child))
            log.warning("leftover_reaped", leftover_pid=pid, role=role, predecessor_pid=owner["pid"])
        _wait_gone(signalled)
        with contextlib.suppress(OSError):  # a directory this user may not write: tried again next start
            path.with_suffix(".keys").unlink(missing_ok=True)  # keys_file: the dead node's secrets
            path.unlink(missing_ok=True)
    return killed


def _read_record(path: Path) -> tuple[os.stat_result, str]:
    """The record's owner and text, from the file itself: a symbolic link is not followed (it
    could name any file of ours), and the owner is that of the file read, not of a path swapped
    meanwhile."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    with os.fdopen(fd, encoding="utf-8") as file:
        return os.fstat(fd), file.read()


def _wait_gone(procs: list[tuple[int, dict[str, Any]]]) -> None:
    """Wait (bounded) until every process is gone; a zombie counts as gone (it is dead)."""
    deadline = time.monotonic() + _REAP_WAIT_S
    while procs and time.monotonic() < deadline:
        procs = [(pid, c) for pid, c in procs if _alive(pid, c)]
        if procs:
            time.sleep(0.01)
    for pid, _ in procs:
        log.error("leftover_survived_sigkill", leftover_pid=pid)
