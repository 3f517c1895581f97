"""The worker's side of supervision: its status record, fed by the event loop, and its beats.

:class:`WorkerHealth` ties a :class:`~.status.WorkerStatus` to a worker's runtime:

- the runtime's handle observer marks the record busy around every message (``cell.py`` calls
  ``observer.begin(actor, msg_type)`` and ``observer.end()``);
- ``Actor.progress()`` reaches the record through ``runtime.progress_hooks``;
- a :class:`~.heartbeat.HeartbeatSender` *thread* sends the record to the node's supervisor
  every beat, so a loop stuck in a C call that holds the GIL stops beating while a loop busy in
  pure Python (which yields the GIL every switch interval) keeps beating.

The record also reports the worker's *backlog* (messages waiting in its actors' mailboxes and
read off its sockets but not yet handed on): the supervisor counts a worker with a backlog as
busy, so messages that wait while nothing is handled end in a ``no_progress`` kill even when the
loop and its beats go on.

Progress, as the supervisor judges it, is messages finished plus ``progress()`` calls. An
async handler that awaits for longer than its kind's ``progress_timeout_s`` (a long ask
downstream) must call ``self.progress()`` while it waits, or run under a kind whose progress
timeout is longer or disabled.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from troupe.runtime.core.control_payloads import ControlPayload
from troupe.runtime.library_logging import get_logger

from .heartbeat import HeartbeatSender
from .status import WorkerStatus

if TYPE_CHECKING:
    from troupe.runtime.core.runtime import Runtime

__all__ = ["WorkerHealth"]

log = get_logger(__name__)


class WorkerHealth:
    """Installs the status record and the heartbeat thread into one worker's runtime.

    Also answers the control message ``heartbeat_to`` ``{"addr": [host, port]}``, which the node
    sends when a restarted supervisor listens on a new port.

    Args:
        runtime: the worker's runtime.
        worker_id: the worker's node-unique name.
        supervisor_addr: the supervisor's UDP ``(host, port)``; None sends no beats (a node
            with supervision disabled).
        interval_s: seconds between beats.
    """

    def __init__(
        self,
        runtime: Runtime,
        worker_id: str,
        supervisor_addr: tuple[str, int] | None,
        interval_s: float,
    ) -> None:
        self.status = WorkerStatus(worker_id)
        self._interval_s = interval_s
        self._sender: HeartbeatSender | None = None
        runtime.observer = self.status  # it keeps the status record current
        runtime.progress_hooks.append(self.status.progress)
        runtime.register_control("heartbeat_to", self._heartbeat_to)
        self.status.backlog_probe = _backlog_probe(runtime)
        if supervisor_addr is not None:
            self._start_sender(supervisor_addr)

    @property
    def beats_sent(self) -> int:
        """Beats sent by the current sender (0 when none runs)."""
        return 0 if self._sender is None else self._sender.beats_sent

    def stopping(self) -> None:
        """The worker begins a graceful stop: it is no longer judged on progress."""
        self.status.mark_stopping()

    def close(self) -> None:
        """Stop the heartbeat thread; the worker is about to exit."""
        if self._sender is not None:
            self._sender.stop()
            self._sender = None

    def _start_sender(self, addr: tuple[str, int]) -> None:
        self._sender = HeartbeatSender(self.status, (str(addr[0]), int(addr[1])), self._interval_s)
        self._sender.start()
        log.info("heartbeat_started", supervisor=f"{addr[0]}:{addr[1]}", interval_s=self._interval_s)

    async def _heartbeat_to(self, payload: Any) -> bool:
        addr = ControlPayload("heartbeat_to", payload).host_port("addr")
        self.close()
        self._start_sender(addr)
        return True


def _backlog_probe(runtime: Runtime) -> Callable[[], int]:
    """The count of waiting messages, for the beat thread: it only reads lengths (one C call
    each under the GIL) of the loop's queues, and copies the actor table before walking it."""
    cells = runtime.cells
    waiting = getattr(runtime.transport, "waiting", None)

    def probe() -> int:
        n = sum(len(cell.mailbox) for cell in list(cells.values()))
        return n + waiting() if waiting is not None else n

    return probe
