"""The socket file of an ``ipc://PATH`` endpoint: whether a live process listens there, and
the file's removal once its process stops listening, and how long its path may be.

ZeroMQ binds an ipc endpoint by unlinking whatever file is at its path first: a second process
bound to the path of a running one took its socket without a word (the first ran on,
unreachable), and the file stayed after its process stopped. A real ``AF_UNIX`` connect tells a
live listener (refused, as a taken TCP port is) from a stale file nobody listens on (ZeroMQ's
unlink is then right), from no file, and from a path this user may not reach.
"""

from __future__ import annotations

import errno
import os
import socket
import stat
from dataclasses import dataclass
from urllib.parse import urlsplit

import zmq

__all__ = [
    "IN_USE",
    "IPC_PATH_MAX",
    "BoundSocketFile",
    "bind_refusal",
    "connect_errno",
    "ipc_path",
    "path_length_problem",
    "unreachable_why",
]

IN_USE = os.strerror(errno.EADDRINUSE)
""":func:`bind_refusal`'s reason where a live process listens: what a taken TCP port says."""


IPC_PATH_MAX: int = getattr(zmq, "IPC_PATH_MAX_LEN", 0) or 107
"""The longest socket path ZeroMQ binds or connects to: ``sockaddr_un.sun_path`` less its end
(107 bytes on Linux). A longer one failed the bind with "is another node already running
there?" and a ``ctl`` connect with "Input/output error"."""


def path_length_problem(path: str) -> str | None:
    """Why no socket can be bound or reached at ``path`` for its length (as given: ZeroMQ does
    not make it absolute), or None."""
    size = len(os.fsencode(path))
    if size <= IPC_PATH_MAX:
        return None
    return f"the socket path is {size} bytes; Unix sockets allow at most {IPC_PATH_MAX}: use a shorter path"


def ipc_path(endpoint: str) -> str | None:
    """The file path of an ``ipc://PATH`` endpoint; None for any other scheme."""
    if not endpoint.startswith("ipc://"):
        return None
    parts = urlsplit(endpoint)
    return parts.netloc + parts.path


def connect_errno(path: str, timeout: float = 0.5) -> int:
    """0 when a process accepts connections at the socket file ``path``; else the connect's
    errno: ENOENT (no file), ECONNREFUSED (a file nobody listens on: its process ended),
    EACCES (this user may not reach it), ENOTSOCK (a file that is no socket)..."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        probe.settimeout(timeout)
        try:
            probe.connect(path)
        except TimeoutError:  # a backlog full: somebody listens, and is busy
            return 0
        except OSError as exc:
            return exc.errno or errno.EIO
    return 0


def bind_refusal(path: str) -> str | None:
    """Why no process may bind the socket file ``path`` now (ZeroMQ's bind unlinks what is
    there): a live process listens on it, or it is a file that is no socket; None when it may
    (no file, or a stale socket file nobody listens on, which the bind replaces)."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return None  # none there, or not reachable: the bind says why
    if not stat.S_ISSOCK(mode):
        return f"{path} is a file, not a socket (binding there would delete it)"
    if connect_errno(path) == 0:
        return IN_USE
    return None


def unreachable_why(path: str, what: str, timeout: float = 0.5) -> str | None:
    """Why nothing answers at the socket file ``path``, one clause naming it (``what``: who
    would listen there, ``node``, ``master``); None when a process listens there."""
    code = connect_errno(path, timeout)
    if code == 0:
        return None
    if code == errno.ENOENT:
        return f"no {what} listens at {path} (no such socket file)"
    if code == errno.ECONNREFUSED:
        return f"no {what} listens at {path} (a stale socket file: its process ended)"
    if code in (errno.EACCES, errno.EPERM):
        return (
            f"not allowed to reach {path} (permission denied: another user's socket, or in a "
            "folder closed to you)"
        )
    return f"no {what} listens at {path} ({os.strerror(code)})"


@dataclass(frozen=True)
class BoundSocketFile:
    """The socket file a process bound at an ipc endpoint, as it was when bound: removed at
    close only if it is still that file (not one another process bound there since) and only by
    the process that bound it (a forked child closing its copy leaves it)."""

    path: str
    device: int
    inode: int
    pid: int

    @classmethod
    def of(cls, endpoint: str) -> BoundSocketFile | None:
        """The socket file just bound at ``endpoint``; None for tcp, inproc, or no file."""
        path = ipc_path(endpoint)
        if not path:
            return None
        try:
            st = os.stat(path)
        except OSError:
            return None
        return cls(path, st.st_dev, st.st_ino, os.getpid())

    def remove(self) -> None:
        """Unlink the file, if it is still the one bound here by this process."""
        if os.getpid() != self.pid:
            return
        try:
            st = os.stat(self.path)
            if (st.st_dev, st.st_ino) == (self.device, self.inode):
                os.unlink(self.path)
        except OSError:  # gone already, or its folder closed since: nothing to clean
            pass
