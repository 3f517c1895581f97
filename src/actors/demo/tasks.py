"""A small task actor for demos and end-to-end tests of task dispatch.

:class:`SleepTask` runs two task kinds:

- ``sleep``: loads its parameters lazily from the content store (``refs["params"]``, a JSON
  object ``{"min_ms": 5, "max_ms": 50}``; defaults without it), sleeps a duration drawn from
  the task's seed in that range (times ``slowdown``, to play a slower host), then writes
  ``result.json`` aside and commits it under the task id, exactly once; with ``"wait_for":
  PATH`` in its parameters it waits for that file to exist before it commits (a test's gate);
- ``fail``: always raises, to show retries and dead letters.

:class:`NapTask` does the same under the kind ``nap`` only: a node hosting it and a node hosting
:class:`SleepTask` run different task kinds, as planner and renderer nodes do.

Every commit this actor makes is also appended, as one line ``<task id> <node> <worker>``, to
``<outputs>/commit-log/<node>-<worker>.log``, so a test can count commits across processes: a
task committed twice would show up twice. One file per worker, whatever its restarts (each line
one ``O_APPEND`` write, so incarnations never interleave): a file per process had grown the
folder by one file per kill under chaos, for good.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, ClassVar

import anyio

from troupe.runtime.tasks.content_store import ContentStore
from troupe.runtime.tasks.output_store import OutputStore
from troupe.runtime.tasks.task_actor import LeasedTask, TaskActor

__all__ = ["NapTask", "SleepTask"]


class SleepTask(TaskActor):
    """Sleeps for a seeded duration, then commits a small JSON output.

    Args:
        outputs: root of the output store (shared by every worker of the test).
        content: root of the content store the task parameters come from.
        slowdown: multiplies every sleep (3.0 plays a host three times slower).
        durable: fsync outputs (off for fast tests).
    """

    task_kinds: ClassVar[tuple[str, ...]] = ("sleep", "fail")
    slots = 1

    def __init__(
        self, outputs: str, content: str | None = None, slowdown: float = 1.0, durable: bool = True
    ) -> None:
        self.outputs = OutputStore(Path(outputs), durable=durable)
        self.content = ContentStore(content, durable=durable) if content else None
        self.slowdown = float(slowdown)
        self.commit_log = Path(outputs) / "commit-log"
        self.commit_log.mkdir(parents=True, exist_ok=True)

    async def run_task(self, task: LeasedTask) -> str | None:
        """Sleep, write ``result.json`` aside, commit it; see the module docstring."""
        if task.kind == "fail":
            raise ValueError(f"task {task.task_id} fails on purpose (attempt {task.attempt})")
        ref = f"out://{task.task_id}"
        if self.outputs.is_committed(task.task_id):
            return ref  # an earlier copy committed it and its report was lost
        params = self._params(task)
        low, high = int(params.get("min_ms", 5)), int(params.get("max_ms", 50))
        ms = low + (task.seed * 7919) % (max(high - low, 0) + 1)
        await anyio.sleep(ms / 1000.0 * self.slowdown)
        gate = params.get("wait_for")
        while gate is not None and not os.path.exists(str(gate)):  # noqa: ASYNC240 - a stat, polled
            await anyio.sleep(0.02)  # cancellable: a cancelled copy stops here
        where = self.address
        result: dict[str, Any] = {
            "task_id": task.task_id,
            "seed": task.seed,
            "node": where.node,
            "worker": where.process,
            "pid": os.getpid(),
            "attempt": task.attempt,
            "lease_id": task.lease_id,
            "backup": task.backup,
            "ms": ms,
        }
        with self.outputs.stage(task.task_id) as staged:
            (staged.path / "result.json").write_text(json.dumps(result), encoding="utf-8")
            committed = staged.commit()
        if committed:
            line = f"{task.task_id} {where.node} {where.process}\n".encode()
            log_file = self.commit_log / f"{where.node}-{where.process}.log"
            fd = os.open(log_file, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            try:
                os.write(fd, line)  # one short local append
            finally:
                os.close(fd)
        return ref

    def _params(self, task: LeasedTask) -> dict[str, Any]:
        ref = task.refs.get("params")
        if ref is None or self.content is None:
            return {}
        params = json.loads(self.content.get(ref))
        if not isinstance(params, dict):
            raise ValueError(f"task {task.task_id}: params {ref} must be a JSON object")
        return params


class NapTask(SleepTask):
    """:class:`SleepTask` for tasks of kind ``nap`` (and no other kind)."""

    task_kinds = ("nap",)
