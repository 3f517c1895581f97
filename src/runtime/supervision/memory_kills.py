"""A worker killed by a SIGKILL that no part of troupe sent: most often the kernel's OOM killer.

The node knows every SIGKILL of its own making (the supervisor's report, a chaos kill, a start
timeout, its stop): an exit "killed by SIGKILL" without one of those reasons came from outside,
and a worker that held a lot of memory was, most likely, killed by the OOM killer. It said only
"killed by SIGKILL", the words of any kill, in ``ctl status``, the dead letters and the log.
:class:`MemorySamples` keeps each worker's resident memory, sampled every second, and the OOM
kill count of the node's memory cgroup where it can be read (cgroup v2 ``memory.events``, v1
``memory.oom_control``: ``oom_kill N``); :meth:`MemorySamples.unexplained_kill` says what they
tell of such an exit.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from pathlib import Path

import psutil

from troupe.runtime.node.worker_handles import WorkerHandle

__all__ = ["SAMPLE_EVERY_S", "MemorySamples", "oom_kills"]

SAMPLE_EVERY_S = 1.0
_OOM_KILL = re.compile(r"^oom_kill (\d+)$", re.MULTILINE)


def oom_kills(
    proc_cgroup: Path = Path("/proc/self/cgroup"), root: Path = Path("/sys/fs/cgroup")
) -> int | None:
    """The OOM kill count of this process's memory cgroup (v2, or v1's memory controller);
    None where there is none to read (no cgroup file, a path hidden by a namespace, an old
    kernel that does not count)."""
    try:
        lines = proc_cgroup.read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if controllers == "":  # v2's unified hierarchy
            found = _count(root / path.lstrip("/") / "memory.events")
        elif "memory" in controllers.split(","):
            found = _count(root / "memory" / path.lstrip("/") / "memory.oom_control")
        else:
            continue
        if found is not None:
            return found
    return None


def _count(path: Path) -> int | None:
    try:
        match = _OOM_KILL.search(path.read_text())
    except OSError:
        return None
    return int(match.group(1)) if match else None


def _size(n: int) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n // 1024} KiB"


class MemorySamples:
    """The last sampled resident memory of each worker, and the cgroup's OOM kills seen.

    Args:
        read_oom_kills: reads the OOM kill count of the node's memory cgroup, None where it
            cannot be read (:func:`oom_kills`; a test's fake).
    """

    def __init__(self, read_oom_kills: Callable[[], int | None] = oom_kills) -> None:
        self._read = read_oom_kills
        self.rss: dict[str, int] = {}  # worker name -> bytes at its last sample
        self._oom_seen = self._read()

    def sample(self, handles: Iterable[WorkerHandle]) -> None:
        """Read the resident memory of every running worker of ``handles``."""
        for handle in handles:
            if handle.pid and handle.process is not None and handle.returncode is None:
                try:
                    self.rss[handle.spec.name] = psutil.Process(handle.pid).memory_info().rss
                except psutil.Error:  # exited since: its last sample stands
                    pass

    def unexplained_kill(self, worker: str) -> str:
        """What to add to the exit reason of ``worker``, SIGKILLed by nobody in troupe."""
        now = self._read()
        ran = now is not None and self._oom_seen is not None and now > self._oom_seen
        if now is not None:
            self._oom_seen = now
        rss = self.rss.pop(worker, None)
        held = "" if rss is None else f"rss was {_size(rss)} at its last sample"
        if ran:
            said = "not by troupe: the OOM killer of the node's memory cgroup ran (its oom_kill count rose)"
            return f"{said}; {held}" if held else said
        return (
            f"not by troupe; {held}: the kernel's OOM killer?"
            if held
            else "not by troupe: the kernel's OOM killer?"
        )
