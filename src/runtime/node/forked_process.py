"""A child of the node that the node did not spawn itself: a worker or supervisor forked from the
template and reparented to the node (the node is a child subreaper), or a template a command
started ahead. asyncio never saw it start, so it is waited for with a pidfd (a thread on kernels
without them), and reaped only while awaited: whoever holds one awaits it until it exits.
"""

from __future__ import annotations

import contextlib
import os
import signal

import anyio
from anyio.abc import ByteReceiveStream, ByteSendStream, Process

from troupe.runtime.library_logging import get_logger

__all__ = ["UNKNOWN_EXIT", "ForkedProcess", "pid_alive"]

log = get_logger(__name__)


class _PipeReader(ByteReceiveStream):
    """The read end of a worker's stderr pipe, as a byte stream."""

    def __init__(self, fd: int) -> None:
        os.set_blocking(fd, False)
        self._fd = fd

    async def receive(self, max_bytes: int = 65536) -> bytes:
        while True:
            if self._fd < 0:
                raise anyio.ClosedResourceError
            try:
                data = os.read(self._fd, max_bytes)
            except BlockingIOError:
                await anyio.wait_readable(self._fd)
                continue
            if not data:
                raise anyio.EndOfStream
            return data

    async def aclose(self) -> None:
        fd, self._fd = self._fd, -1
        if fd >= 0:
            with contextlib.suppress(OSError):
                os.close(fd)


class ForkedProcess(Process):
    """A child this process did not spawn through asyncio, as a Process: waited for with a pidfd.
    Its stderr is the read end of its pipe (a worker's), or None where it writes to the node's
    own (the supervisor, a template)."""

    def __init__(self, pid: int, stderr_fd: int | None) -> None:
        self._pid = pid
        self._returncode: int | None = None
        self._stderr = _PipeReader(stderr_fd) if stderr_fd is not None else None
        self._reaped = anyio.Event()
        self._waiting = False

    async def wait(self) -> int:
        if self._waiting:
            await self._reaped.wait()
        else:
            self._waiting = True
            try:
                self._returncode = await _reap(self._pid)
            finally:
                self._waiting = False
            self._reaped.set()
        assert self._returncode is not None
        return self._returncode

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def send_signal(self, signal: int) -> None:
        if self._returncode is None:  # reaped: its pid may be someone else's now
            os.kill(self._pid, signal)

    @property
    def pid(self) -> int:
        return self._pid

    @property
    def returncode(self) -> int | None:
        return self._returncode

    @property
    def stdin(self) -> ByteSendStream | None:
        return None

    @property
    def stdout(self) -> ByteReceiveStream | None:
        return None

    @property
    def stderr(self) -> ByteReceiveStream | None:
        return self._stderr

    async def aclose(self) -> None:
        if self._stderr is not None:
            await self._stderr.aclose()
        if self._returncode is None:
            await self.wait()


async def _reap(pid: int) -> int:
    """Wait for our child ``pid`` to exit and reap it; its exit status as asyncio gives it.

    A pid that is not (or no longer) our child, whose status someone else took, is waited for
    until it is gone, and then ends with ``UNKNOWN_EXIT`` and a warning: a node's stop failed
    on it with ``ChildProcessError``, once, in a run that raced another for its ports.
    """
    try:
        pidfd = os.pidfd_open(pid)
    except (AttributeError, OSError):  # no pidfds (an old kernel), or gone: a thread waits instead
        try:
            _, status = await anyio.to_thread.run_sync(os.waitpid, pid, 0, abandon_on_cancel=True)
        except ChildProcessError:
            return await _reaped_elsewhere(pid, None)
        return os.waitstatus_to_exitcode(status)
    try:
        while True:
            try:
                done, status = os.waitpid(pid, os.WNOHANG)  # noqa: ASYNC222  # WNOHANG: never blocks
            except ChildProcessError:
                return await _reaped_elsewhere(pid, pidfd)
            if done:
                return os.waitstatus_to_exitcode(status)
            await anyio.wait_readable(pidfd)
    finally:
        os.close(pidfd)


UNKNOWN_EXIT = 255
"""The exit status of a process whose status someone else took (it is gone, how is unknown)."""
_GONE_POLL_S = 0.05


async def _reaped_elsewhere(pid: int, pidfd: int | None) -> int:
    """``pid`` is not our child: wait until it has exited (its pidfd, which works for any
    process, or a poll), then say so."""
    if pidfd is not None:
        await anyio.wait_readable(pidfd)
    else:
        while pid_alive(pid):
            await anyio.sleep(_GONE_POLL_S)
    log.warning("child_reaped_elsewhere", child_pid=pid, returncode=UNKNOWN_EXIT)
    return UNKNOWN_EXIT


def pid_alive(pid: int) -> bool:
    """Whether a process ``pid`` exists (a zombie does) and is not another user's (a reused pid)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another's now (its pid reused): ours is gone
        return False
    return True
