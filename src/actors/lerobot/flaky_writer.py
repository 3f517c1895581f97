"""Stage actors with injected faults, for end-to-end tests of the pipeline's failure handling.

Replicas run in their own worker processes, so a test cannot monkeypatch them: the fault is
built into the actor and chosen through its constructor arguments (the stage's ``kwargs``).
"""

from __future__ import annotations

import errno
import os
from pathlib import Path
from typing import Any

from troupe.actors.datagen.lifecycle import LeRobotWriter
from troupe.runtime.tasks.output_store import OutputStore, Staged

from .episode import EpisodeConfig
from .writer import AsyncWriter

__all__ = ["PARTIAL_FILE", "FlakyLeRobotWriter", "FlakyOutputStore"]

PARTIAL_FILE = "partial-write.bin"
"""The half-written file a failing commit leaves in its staging directory."""


class _FailingStaged(Staged):
    """A staging area whose disk fills up just before the commit."""

    def commit(self) -> bool:
        # Half a file is on disk when the write fails, as with a real full disk; the store
        # must drop it with the rest of the staging directory.
        (self.path / PARTIAL_FILE).write_bytes(b"\0" * 1024)
        raise OSError(errno.ENOSPC, "No space left on device (injected by FlakyOutputStore)")


class FlakyOutputStore(OutputStore):
    """An OutputStore whose next commit of a task fails with ENOSPC once it is armed.

    Args:
        root: directory of the store.
    """

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        # Armed on the actor's event loop, disarmed on a writer thread: a set's add and
        # discard are atomic, and each task id is armed at most once.
        self.armed: set[str] = set()

    def stage(self, task_id: str) -> Staged:
        """Open a staging area; for an armed task, one whose commit fails (and disarm it)."""
        staged = super().stage(task_id)
        if task_id not in self.armed:
            return staged
        self.armed.discard(task_id)
        return _FailingStaged(self, staged.task_id, staged.path)


class FlakyLeRobotWriter(LeRobotWriter):
    """A LeRobotWriter whose disk write fails on the first attempt at every ``fail_every``-th seed.

    "First attempt" is decided by a marker file created exclusively under ``fault_dir``, so it
    holds across replicas and worker restarts: a retry on any replica succeeds.

    Args:
        store: directory of the OutputStore the episodes are committed to.
        fault_dir: directory for the markers of the faults already injected.
        fail_every: fail seeds divisible by this (0: never).
        max_pending: episodes queued to the writer threads before ``process`` waits.
        threads: writer threads.
    """

    def __init__(
        self, store: str, fault_dir: str, fail_every: int = 3, max_pending: int = 2, threads: int = 1
    ) -> None:
        super().__init__(store, max_pending=max_pending, threads=threads)
        self.writer.close(timeout=0)  # nothing was submitted to it; replaced by a flaky one
        self.flaky_store = FlakyOutputStore(Path(store))
        self.store = self.flaky_store
        self.writer = AsyncWriter(
            self.store, max_pending=max_pending, threads=threads, config=EpisodeConfig()
        )
        self.fault_dir = Path(fault_dir)
        self.fault_dir.mkdir(parents=True, exist_ok=True)
        self.fail_every = fail_every

    def _first_attempt(self, task_id: str) -> bool:
        try:
            fd = os.open(self.fault_dir / task_id, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            return False
        os.close(fd)
        return True

    async def process(self, item: dict[str, Any]) -> dict[str, Any]:
        """Arm a fault for this item's commit on its first attempt, then write as usual."""
        seed = int(item["seed"])
        if self.fail_every and seed % self.fail_every == 0 and self._first_attempt(item["task_id"]):
            self.flaky_store.armed.add(item["task_id"])
        return await super().process(item)
