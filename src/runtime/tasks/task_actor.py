"""Actors that run tasks leased from the master.

A :class:`TaskActor` declares the task kinds it runs and how many it runs at once. When its
worker process was started by a node that names a master, the worker's
:class:`~troupe.runtime.tasks.getter.TaskGetter` pulls leases for it and calls :meth:`run_task`
for each, beside the actor's mailbox (messages keep being handled while tasks run)::

    class Render(TaskActor):
        task_kinds = ("render",)
        slots = 1

        def __init__(self, outputs: str, content: str) -> None:
            self.outputs = OutputStore(Path(outputs))
            self.content = ContentStore(content)

        async def run_task(self, task: LeasedTask) -> str | None:
            if self.outputs.is_committed(task.task_id):   # a copy already committed it
                return f"out://{task.task_id}"
            scene = json.loads(self.content.get(task.refs["scene"]))   # lazy context
            with self.outputs.stage(task.task_id) as staged:
                render(scene, task.seed, staged.path)
                staged.commit()                # no-op if another copy won meanwhile
            return f"out://{task.task_id}"

The contract, which makes effects exactly-once:

- write the output aside and commit it with :class:`~troupe.runtime.tasks.output_store.OutputStore` before
  returning; the master records the task done only after ``run_task`` returned, so a done task
  always has its output committed;
- a task may run more than once (a lease that expired, a speculative backup, a master
  restart): the second commit is a no-op, so run_task must be safe to repeat;
- raising fails the attempt: the error text and traceback go to the master, which retries the
  task with backoff and dead-letters it after the job's ``max_attempts``;
- the task may be cancelled at any ``await`` (another copy won, the job was cancelled, the
  lease was lost): clean up in ``finally`` blocks, never swallow the cancellation;
- long CPU work should call ``self.progress()`` now and then, so supervision sees progress.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

from troupe.runtime.core.actor import Actor
from troupe.runtime.errors import BadFrame

__all__ = ["LeasedTask", "TaskActor"]

RESULT_REF_MOST_BYTES = 4096
"""The most a result reference may have, in bytes of UTF-8: room for any path the OS opens
(PATH_MAX) or URL, while the data itself goes to the output store; the master keeps a task's
reference in its journal and in memory, and replies with many of them at once."""


@dataclass(frozen=True, slots=True)
class LeasedTask:
    """One copy of a task, as the worker received it under a lease.

    Attributes:
        task_id: the task's id; outputs are committed under it.
        job_id: the job it belongs to.
        kind: which kind of handler runs it.
        seed: the task's random seed.
        refs: content-store references to load the context from.
        attempt: 1 for the first attempt, 2 after one lost attempt, and so on.
        lease_id: the lease this copy runs under (unique per copy).
        backup: this copy is a speculative backup of a slow one.
        ttl: seconds the lease lasted when it was granted (the getter renews every ttl/3).
    """

    task_id: str
    job_id: str
    kind: str
    seed: int
    refs: Mapping[str, str] = field(default_factory=dict)
    attempt: int = 1
    lease_id: int = 0
    backup: bool = False
    ttl: float = 60.0

    @classmethod
    def from_wire(cls, data: Any) -> LeasedTask:
        """Build from a lease as the master sends it (see :mod:`troupe.runtime.tasks.master.master`).

        Raises:
            BadFrame: the lease is not a map with the expected fields and types.
        """
        try:
            refs = data.get("refs") or {}
            task = cls(
                str(data["task_id"]),
                str(data["job_id"]),
                str(data["kind"]),
                int(data["seed"]),
                {str(k): str(v) for k, v in refs.items()},
                int(data["attempt"]),
                int(data["lease_id"]),
                bool(data["backup"]),
                float(data["ttl"]),
            )
        except (AttributeError, KeyError, TypeError, ValueError) as exc:
            raise BadFrame(f"malformed lease from the master ({exc!r}): {data!r}") from None
        return task


class TaskActor(Actor):
    """Base class of actors that run tasks leased from the master.

    Class attributes:
        task_kinds: the task kinds this actor runs; empty means every kind.
        slots: how many tasks it runs at once.
        gpus: GPUs it offers to tasks (tasks needing more GPUs are never leased to it).
    """

    task_kinds: ClassVar[tuple[str, ...]] = ()
    slots: ClassVar[int] = 1
    gpus: ClassVar[int] = 0

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        run_task = cls.__dict__.get("run_task")
        # A plain def is refused as the class is made, so the node's class check says so
        # before anything starts; awaited, its result failed every task with "object str can't
        # be used in 'await' expression". (Stages take plain methods; a task keeps one way.)
        if inspect.isfunction(run_task) and not inspect.iscoroutinefunction(inspect.unwrap(run_task)):
            raise TypeError(
                f"{cls.__name__}.run_task must be `async def`: the worker awaits it beside the "
                "actor's mailbox (blocking work may go through `await anyio.to_thread.run_sync`)"
            )

    @classmethod
    def runs(cls, kind: str) -> bool:
        """Return whether this actor runs tasks of ``kind``."""
        return not cls.task_kinds or kind in cls.task_kinds

    async def run_task(self, task: LeasedTask) -> str | None:
        """Run one task to the end and return a reference to its committed output.

        Args:
            task: the leased copy of the task.

        Returns:
            A reference to the committed output (kept in the master's journal), or None;
            anything but a str or None fails the attempt with a ``TypeError``, and a str that
            is not valid UTF-8 (a lone surrogate) or longer than ``RESULT_REF_MOST_BYTES``
            (4096 bytes) with a ``ValueError``: it is where the output is, not the output.

        Raises:
            Exception: any error fails this attempt; its text and traceback are reported.
        """
        raise NotImplementedError(f"{type(self).__qualname__} must define run_task()")
