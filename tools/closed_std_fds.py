"""A command started with stdin, stdout or stderr closed (``>&-``, a daemon wrapper, cron) runs
as if that stream were ``/dev/null``.

Python starts such a process with ``sys.stdout`` (say) set to None, and the descriptor number
free: the next file the process opens takes it. uvloop's loop opens its signal pipe and eventfd
first, got descriptors 0 to 2, and libuv aborted the process as it closed them (an assertion
that they are above stderr: ``troupe ctl status >&-`` died of SIGABRT, exit 134, and a node so
started at its stop); ``troupe run`` found a ZeroMQ socket on its descriptor 1, which every
process it starts inherits as its stdout; and the stop path's flush met ``None`` and ended a
clean SIGTERM stop with two tracebacks and exit 1 instead of 143. Each closed descriptor is
opened on ``/dev/null`` before anything else runs, and its ``sys`` stream with it: what the
command writes there is dropped, as Python drops it for a closed stream.
"""

from __future__ import annotations

import io
import os
import sys

__all__ = ["open_closed_std_fds"]

_STREAMS = ((0, "stdin", os.O_RDONLY), (1, "stdout", os.O_WRONLY), (2, "stderr", os.O_WRONLY))


def open_closed_std_fds() -> list[int]:
    """Open each closed descriptor of 0, 1 and 2 on ``/dev/null``; return those it opened."""
    opened = []
    for fd, name, flags in _STREAMS:
        try:
            os.fstat(fd)
            continue
        except OSError:
            pass
        try:
            got = os.open(os.devnull, flags)
        except OSError:  # no /dev/null (a bare chroot): nothing better to do than before
            continue
        if got != fd:  # the lowest free number is ``fd`` itself, unless another thread took it
            os.dup2(got, fd)
            os.close(got)
        opened.append(fd)
        if getattr(sys, name) is None:
            raw = io.FileIO(fd, "r" if fd == 0 else "w", closefd=False)
            stream = io.TextIOWrapper(raw, encoding="utf-8", errors="replace", line_buffering=fd != 0)
            setattr(sys, name, stream)
    return opened
