"""Which process, on which host: an identity another process can check without asking it.

A ``troupe run`` on a cluster listens on its own host's loopback, so a rerun that finds an
earlier run of its job registered with the master cannot always ping it: it waited for the
master's verdict (no beat from the run for ``OWNER_SILENT_S``, 20 s and more) even when the
earlier run had been killed a moment before on the very same host. The run's registration now
carries this identity, and a rerun on the same host reads at once whether that process still
runs.

``<boot id>:<pid namespace>:<pid>:<start time>``: the kernel's boot id and the pid namespace
name one space of pids (the hosts of a network-namespace cluster on one machine share it, so
their pids are as checkable as this host's own); the start time, in clock ticks since boot,
tells a pid that was reused from the process that had it. Linux only: elsewhere the identity is
empty, and nothing is ever judged gone by it.
"""

from __future__ import annotations

import os
from functools import cache

from .file_owner import login_name
from .process_start import start_ticks

__all__ = ["gone_here", "process_identity", "user_name"]


def process_identity(pid: int | None = None) -> str:
    """The identity of process ``pid`` (default: this one); "" where it cannot be told."""
    pid = os.getpid() if pid is None else pid
    space, started = _pid_space(), start_ticks(pid)
    return f"{space}:{pid}:{started}" if space and started is not None else ""


def gone_here(identity: object) -> bool:
    """Whether ``identity`` names a process of this host's pid space that no longer runs (its
    pid is free, or another process has it now). False where that cannot be told: an identity
    of another host, an empty or malformed one (an older troupe's, a peer's text), a process
    that runs."""
    if not isinstance(identity, str):
        return False
    parts = identity.split(":")
    if len(parts) != 4 or not parts[2].isdigit() or not parts[3].isdigit():
        return False
    space = f"{parts[0]}:{parts[1]}"
    if not space or space != _pid_space():
        return False
    return start_ticks(int(parts[2])) != int(parts[3])


@cache
def _pid_space() -> str:
    """``<boot id>:<pid namespace inode>``, or "" where either cannot be read."""
    try:
        with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as f:
            boot = f.read().strip()
        namespace = os.stat("/proc/self/ns/pid").st_ino
    except (OSError, ValueError):
        return ""
    return f"{boot}:{namespace}" if boot and ":" not in boot else ""


@cache
def user_name() -> str:
    """The name of the user this process runs as (its uid where the user database has none):
    what tells one user's node from another's on a shared host, where both are called ``local``."""
    uid = os.getuid()
    return login_name(uid) or str(uid)
