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

__all__ = ["ForkedProcess"]


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
    """Wait for our child ``pid`` to exit and reap it; its exit status as asyncio gives it."""
    try:
        pidfd = os.pidfd_open(pid)
    except (AttributeError, OSError):  # no pidfds (an old kernel): a thread waits instead
        _, status = await anyio.to_thread.run_sync(os.waitpid, pid, 0, abandon_on_cancel=True)
        return os.waitstatus_to_exitcode(status)
    try:
        while True:
            done, status = os.waitpid(pid, os.WNOHANG)  # noqa: ASYNC222  # WNOHANG: never blocks
            if done:
                return os.waitstatus_to_exitcode(status)
            await anyio.wait_readable(pidfd)
    finally:
        os.close(pidfd)
