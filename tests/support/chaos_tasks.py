"""A task actor for supervision tests: long pure-Python work, with or without progress reports.

:class:`CrunchTask` runs the task kind ``crunch``. It loads its parameters lazily from the
content store (``refs["params"]``, a JSON object ``{"seconds": 2.5, "quiet_attempts": 1}``),
then computes in pure Python on the worker's event loop for ``seconds``: it holds the GIL in
slices (so the heartbeat thread keeps beating) and never awaits. Each round it calls
``self.progress()``, except on the task's first ``quiet_attempts`` attempts, which look like a
livelock to the supervisor (beats, no progress). Then it commits a small JSON output under the
task id, exactly once, and logs the commit as :class:`~troupe.actors.demo.tasks.SleepTask`
does (``<outputs>/commit-log/<node>-<worker>-<pid>.log``, one ``<task id> <node> <worker>``
line per commit), so a test can count commits across processes.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from typing import Any

from troupe.actors.demo.tasks import SleepTask
from troupe.runtime.tasks.task_actor import LeasedTask

__all__ = ["CrunchTask"]

_ROUNDS_PER_REPORT = 20


class CrunchTask(SleepTask):
    """Crunches numbers for a while, reporting progress unless told to stay quiet.

    Args:
        outputs: root of the output store (shared by every worker of the test).
        content: root of the content store the task parameters come from.
        durable: fsync outputs (off for fast tests).
    """

    task_kinds = ("crunch",)

    def __init__(self, outputs: str, content: str | None = None, durable: bool = True) -> None:
        super().__init__(outputs, content, durable=durable)

    async def run_task(self, task: LeasedTask) -> str | None:
        """Crunch, then write ``result.json`` aside and commit it; see the module docstring."""
        ref = f"out://{task.task_id}"
        if self.outputs.is_committed(task.task_id):
            return ref  # an earlier copy committed it and its report was lost
        params = self._params(task)
        quiet = task.attempt <= int(params.get("quiet_attempts", 0))
        rounds = _crunch(float(params.get("seconds", 1.0)), None if quiet else self.progress)
        where = self.address
        result: dict[str, Any] = {
            "task_id": task.task_id,
            "node": where.node,
            "worker": where.process,
            "pid": os.getpid(),
            "attempt": task.attempt,
            "rounds": rounds,
            "quiet": quiet,
        }
        with self.outputs.stage(task.task_id) as staged:
            (staged.path / "result.json").write_text(json.dumps(result), encoding="utf-8")
            committed = staged.commit()
        if committed:
            log_file = self.commit_log / f"{where.node}-{where.process}-{os.getpid()}.log"
            with open(log_file, "a", encoding="utf-8") as f:
                f.write(f"{task.task_id} {where.node} {where.process}\n")
        return ref


def _crunch(seconds: float, progress: Callable[[int, str | None], None] | None) -> int:
    end = time.monotonic() + seconds
    rounds = 0
    while time.monotonic() < end:
        sum(range(2_000))  # pure Python: yields the GIL every switch interval, never blocks in C
        rounds += 1
        if progress is not None and rounds % _ROUNDS_PER_REPORT == 0:
            progress(_ROUNDS_PER_REPORT, f"round {rounds}")
    return rounds
