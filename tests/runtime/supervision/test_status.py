"""The worker status record: cheap updates, coherent snapshots."""

from __future__ import annotations

import dataclasses
import os
import threading

import pytest

from troupe.runtime.supervision.status import StatusSnapshot, WorkerState, WorkerStatus


def test_new_status_is_idle_with_zero_counters() -> None:
    """A fresh record reports idle, this process's pid, and zero counters."""
    snap = WorkerStatus("w1").snapshot()
    assert snap == StatusSnapshot("w1", os.getpid(), WorkerState.IDLE, None, 0, 0, None, 0)


def test_message_cycle_sets_busy_then_idle_and_counts() -> None:
    """begin_message marks busy with the current message; end_message counts it and idles."""
    status = WorkerStatus("w1", pid=42)
    status.begin_message("render", task_id="t7")
    busy = status.snapshot()
    assert (busy.state, busy.current, busy.pid) == (WorkerState.BUSY, "render:t7", 42)
    status.end_message()
    idle = status.snapshot()
    assert (idle.state, idle.current, idle.messages_handled) == (WorkerState.IDLE, None, 1)
    status.begin_message("ping")
    assert status.snapshot().current == "ping"


def test_progress_advances_the_mark_and_keeps_the_last_note() -> None:
    """progress(n, note) adds n to the progress mark and the note lasts until the next message."""
    status = WorkerStatus("w1")
    status.begin_message("plan")
    status.progress()
    status.progress(3, note="frame 4/10")
    status.progress()
    snap = status.snapshot()
    assert (snap.progress_count, snap.progress_mark, snap.progress_note) == (5, 5, "frame 4/10")
    status.end_message()
    status.begin_message("plan")
    snap = status.snapshot()
    assert (snap.progress_mark, snap.progress_note) == (6, None)


def test_stopping_survives_the_end_of_the_last_message() -> None:
    """A worker marked stopping stays stopping when its in-flight message ends."""
    status = WorkerStatus("w1")
    status.begin_message("x")
    status.mark_stopping()
    status.end_message()
    assert status.state is WorkerState.STOPPING


def test_snapshots_from_many_threads_get_distinct_increasing_seqs() -> None:
    """Concurrent snapshot() calls never share a seq number."""
    status = WorkerStatus("w1")
    seqs: list[list[int]] = [[] for _ in range(4)]

    def take(out: list[int]) -> None:
        for _ in range(2000):
            out.append(status.snapshot().seq)

    threads = [threading.Thread(target=take, args=(out,)) for out in seqs]
    for t in threads:
        t.start()
    for t in threads:
        t.join(5)
    every = [s for out in seqs for s in out]
    assert len(set(every)) == len(every) == 8000
    assert all(out == sorted(out) for out in seqs)


def test_snapshot_is_frozen() -> None:
    """A snapshot cannot be altered after it was taken."""
    snap = WorkerStatus("w1").snapshot()
    with pytest.raises(dataclasses.FrozenInstanceError):
        snap.seq = 5  # type: ignore[misc]
