"""A task actor that records every start of a task, for tests that a task is not run again.

:class:`CountedSleepTask` is :class:`~troupe.actors.demo.tasks.SleepTask` (its ``wait_for``
gate file included) that first appends one line to ``<outputs>/starts/<task id>`` each time a
copy of the task starts, across processes: a task run twice has two lines. Worker processes
load it as ``support.counted_starts:CountedSleepTask`` (``tests/`` on their PYTHONPATH).
"""

from __future__ import annotations

import os
from pathlib import Path

from troupe.actors.demo.tasks import SleepTask
from troupe.runtime.tasks.task_actor import LeasedTask

__all__ = ["CountedSleepTask", "starts"]


class CountedSleepTask(SleepTask):
    """A SleepTask that records each start of a task (see the module docstring)."""

    async def run_task(self, task: LeasedTask) -> str | None:
        """Record the start, then sleep, wait for the gate and commit as SleepTask does."""
        folder = self.commit_log.parent / "starts"
        folder.mkdir(exist_ok=True)
        fd = os.open(folder / task.task_id, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, f"{task.lease_id} {os.getpid()}\n".encode())  # one short local append
        finally:
            os.close(fd)
        return await super().run_task(task)


def starts(outputs: Path) -> dict[str, int]:
    """How many times each task started, by task id."""
    folder = outputs / "starts"
    if not folder.is_dir():
        return {}
    return {f.name: len(f.read_text().splitlines()) for f in folder.iterdir()}
