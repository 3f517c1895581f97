"""The worker's status record: what the heartbeat thread reports to the supervisor.

The worker's event loop advances the record around every message, and an actor doing long work
calls :meth:`WorkerStatus.progress` from inside it. The heartbeat thread reads a
:class:`StatusSnapshot` every beat. Progress, as the supervisor sees it, is the sum
``messages_handled + progress_count`` changing between beats while the worker is busy, that is
handling a message or holding messages in its mailboxes (``backlog``).

Why there are no locks: updates sit on the per-message hot path, so they are plain attribute
writes. Under CPython each single attribute store or load is atomic, so a reader never sees a
half-written value. A snapshot may mix fields from just before and just after an update (say,
``state`` already idle while ``current`` still names the last message); the supervisor only
compares the sum of two monotonic counters between beats, so a torn read delays detection by
at most one beat and never fakes progress. Counters have one writer each (the event loop
thread); if actor code calls ``progress()`` from several threads at once, an increment may be
lost, which is harmless because any change counts as progress.
"""

from __future__ import annotations

import enum
import itertools
import os
from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["StatusSnapshot", "WorkerState", "WorkerStatus"]


class WorkerState(enum.StrEnum):
    """What a worker is doing; the string values are the heartbeat's wire values."""

    IDLE = "idle"
    BUSY = "busy"
    STOPPING = "stopping"


# As module names for the per-message begin/end: on Python 3.11 reading a member off its Enum
# class costs about 0.2 us, a global a few ns.
_IDLE, _BUSY = WorkerState.IDLE, WorkerState.BUSY


@dataclass(frozen=True, slots=True)
class StatusSnapshot:
    """One reading of a worker's status, as carried by a heartbeat.

    Attributes:
        worker_id: the node-unique name of the worker process.
        pid: the worker's process id (the supervisor ignores beats from a stale pid).
        state: idle, busy or stopping.
        current: what the worker is handling (``"type"`` or ``"type:task_id"``), or None.
        messages_handled: messages the event loop finished, handled or failed.
        progress_count: ``progress()`` calls' total ``n`` since the worker started.
        progress_note: the last note passed to ``progress()`` for the current message.
        seq: increases by one per snapshot; lets a receiver spot reordered datagrams.
        backlog: messages waiting in the worker's mailboxes, unhandled. The supervisor counts a
            worker with a backlog as busy, so one that stops handling them while its loop and
            beats go on (an actor stuck on an await, messages queued behind it) is hung.
    """

    worker_id: str
    pid: int
    state: WorkerState
    current: str | None
    messages_handled: int
    progress_count: int
    progress_note: str | None
    seq: int
    backlog: int = 0

    @property
    def progress_mark(self) -> int:
        """The value whose change between beats counts as progress."""
        return self.messages_handled + self.progress_count


class WorkerStatus:
    """The live, cheap-to-update status of one worker process.

    Args:
        worker_id: the node-unique name of the worker process.
        pid: the process id to report; defaults to this process's.
    """

    __slots__ = (
        "_backlog",
        "_current",
        "_handled",
        "_note",
        "_progress",
        "_seq",
        "_state",
        "backlog_probe",
        "pid",
        "worker_id",
    )

    def __init__(self, worker_id: str, pid: int | None = None) -> None:
        self.worker_id = worker_id
        self.pid = os.getpid() if pid is None else pid
        self._state = WorkerState.IDLE
        self._current: str | None = None
        self._handled = 0
        self._progress = 0
        self._note: str | None = None
        # Counts the messages waiting (read from the beat thread, so it must only read: lengths
        # of the event loop's queues). None reports no backlog.
        self.backlog_probe: Callable[[], int] | None = None
        self._backlog = 0
        # next() on itertools.count is a single C call, so snapshots taken from several
        # threads still get distinct, increasing seq numbers without a lock.
        self._seq = itertools.count()

    @property
    def state(self) -> WorkerState:
        """The worker's current state."""
        return self._state

    def begin_message(self, message_type: str, task_id: str | None = None) -> None:
        """Mark the worker busy with one message; the event loop calls this before a handler.

        Args:
            message_type: the message type being handled.
            task_id: the task the message belongs to, when there is one.
        """
        # current is written before state so that a torn read shows busy only with a name.
        self._current = message_type if task_id is None else f"{message_type}:{task_id}"
        self._note = None
        self._state = _BUSY

    def end_message(self) -> None:
        """Count one message as handled and mark the worker idle (unless it is stopping)."""
        self._handled += 1
        if self._state is _BUSY:
            self._state = _IDLE
        self._current = None

    def begin(self, actor: str, msg_type: str) -> None:
        """The runtime's handle observer (``Runtime.observer``): ``actor`` begins a message.

        The same as ``begin_message(f"{actor}/{msg_type}")``, a call shorter: this runs for
        every message the worker handles.
        """
        self._current = f"{actor}/{msg_type}"
        self._note = None
        self._state = _BUSY

    end = end_message

    def mark_stopping(self) -> None:
        """Mark the worker as shutting down; a stopping worker is never judged on progress."""
        self._state = WorkerState.STOPPING

    def progress(self, n: int = 1, note: str | None = None) -> None:
        """Report progress from inside long work, so the supervisor does not take it for a hang.

        Args:
            n: how many units of work were done since the last call.
            note: a short human-readable description (e.g. ``"frame 120/400"``).
        """
        self._progress += n
        if note is not None:
            self._note = note

    def snapshot(self) -> StatusSnapshot:
        """Read the status now; safe to call from any thread."""
        probe = self.backlog_probe
        if probe is not None:
            try:
                self._backlog = probe()
            except Exception:  # a queue changed under the read: report the last count
                pass
        return StatusSnapshot(
            worker_id=self.worker_id,
            pid=self.pid,
            state=self._state,
            current=self._current,
            messages_handled=self._handled,
            progress_count=self._progress,
            progress_note=self._note,
            seq=next(self._seq),
            backlog=self._backlog,
        )
