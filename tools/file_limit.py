"""The command's open-files limit: the soft one raised to the hard one, and too low a hard one
refused in one line.

A shell's soft limit is often far below its hard one (1,024 against 512K under systemd; 64 where
a user lowered it), and nothing raised it: ``troupe run`` under ``ulimit -Sn 64`` printed thirty
lines of replicas that could not start for want of descriptors, then a traceback of the
supervisor's launch; under 32, only libzmq's ``Too many open files (src/epoll.cpp:38)`` and an
abort. The command now raises its soft limit to the hard one, as any process may (at most
:data:`ENOUGH`: ZeroMQ opens no more sockets than 65,535), before it starts anything: the node,
its template, workers and supervisor inherit the limit. A command that starts processes refuses
to start where the hard limit leaves fewer than :data:`FILES_NEEDED`.
"""

from __future__ import annotations

import resource

__all__ = ["ENOUGH", "FILES_NEEDED", "raise_file_limit", "too_few_files"]

ENOUGH = 65536
# A one-host run of a small pipeline opens about 100 (its node, master, template, supervisor,
# a worker per replica: sockets, pipes, log files); twice that leaves room for a few stages.
FILES_NEEDED = 256
_SUGGESTED = 1024


def raise_file_limit() -> int | None:
    """Raise this process's soft RLIMIT_NOFILE to its hard one (at most :data:`ENOUGH`, and never
    lower it); the soft limit now, None where it is unlimited."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return None
    wanted = ENOUGH if hard == resource.RLIM_INFINITY else min(hard, ENOUGH)
    if soft < wanted:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
        except (ValueError, OSError):  # a kernel cap below the hard limit (fs.nr_open): keep it
            return soft
        soft = wanted
    return soft


def too_few_files(limit: int | None, command: str) -> str | None:
    """The error line for ``troupe COMMAND`` where ``limit`` (the raised soft limit) is below
    :data:`FILES_NEEDED`; None where it is enough."""
    if limit is None or limit >= FILES_NEEDED:
        return None
    return (
        f"this shell allows {limit} open files (its hard limit, ulimit -Hn); troupe {command} needs "
        f"about {FILES_NEEDED}: raise it with ulimit -n {_SUGGESTED} (above the hard limit: as root, "
        "or in /etc/security/limits.conf)"
    )
