"""What runs a leased task in a worker: the runner a getter calls, and the one over task actors.

A :data:`Runner` runs one leased task to the end and returns its result reference; a runner that
does not run the task's kind raises :class:`KindNotRun` and the getter declines the lease (no
attempt counted). :class:`ActorRunner` is the runner of a worker process: it runs each lease on
the hosted task actor for its kind, within that actor's slots. Tests and the ``scale`` benchmark
give the getter runners of their own, hence the split from the getter itself.

In a worker process a task runs as a message would, for supervision and fault injection: the
worker's status record shows it busy with ``ACTOR/KIND`` (the progress timeout judges it, so
long work must call ``progress()``), and the runtime's before-handle hooks run first with the
task kind as the message type, so an injected fault (``troupe ctl chaos``) reaches task code.
A task that a ``drop`` fault loses (:class:`TaskDropped`) is neither run nor reported, like a
lost message: its lease expires at the master, which leases it again.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import structlog

from troupe.runtime.core.cell import DROP
from troupe.runtime.core.config_messages import short_repr
from troupe.runtime.core.runtime import Runtime
from troupe.runtime.errors import TaskError

from .task_actor import RESULT_REF_MOST_BYTES, LeasedTask, TaskActor

__all__ = ["ActorRunner", "KindNotRun", "Runner", "TaskDropped"]

Runner = Callable[[LeasedTask], Awaitable[str | None]]
"""Runs one leased task to the end and returns its result reference."""


class KindNotRun(TaskError):
    """A runner does not run the leased task's kind: the copy is declined, not failed."""


class TaskDropped(Exception):
    """A before-handle hook (an injected ``drop`` fault) lost this task: the getter neither runs
    nor reports it; never raised out of the getter."""


class ActorRunner:
    """Runs a lease on the hosted task actor for its kind, within that actor's slots.

    Around each task it marks the worker busy and runs the before-handle hooks (see the module
    docstring). The status record has one current item: the worker shows idle only once its
    last running task ends (a message ending meanwhile may show it idle early, which delays a
    no-progress kill but never fakes one).
    """

    def __init__(self, actors: list[TaskActor]) -> None:
        self._actors = [(a, anyio.Semaphore(type(a).slots)) for a in actors]
        self._busy = 0

    async def __call__(self, task: LeasedTask) -> str | None:
        able = [(a, s) for a, s in self._actors if type(a).runs(task.kind)]
        if not able:
            kinds = sorted({k for a, _ in self._actors for k in type(a).task_kinds})
            raise KindNotRun(f"no actor in this worker runs task kind {task.kind!r} (it runs {kinds})")
        actor, slots = max(able, key=lambda pair: pair[1].value)
        async with slots:
            runtime: Runtime | None = getattr(actor, "runtime", None)  # None: never spawned
            if runtime is None:
                return await _run_task(actor, task)
            name, observer = actor.address.actor, runtime.observer
            # This task's own context: the task's log lines say which actor runs it.
            structlog.contextvars.bind_contextvars(actor=name)
            self._busy += 1
            if observer is not None:
                observer.begin(name, task.kind)
            counts = runtime.cells[name].more_counts if name in runtime.cells else {}
            try:
                for hook in tuple(runtime.before_handle):
                    if await hook(name, task.kind) is DROP:
                        raise TaskDropped(f"task {task.task_id} dropped by an injected fault")
                ref = await _run_task(actor, task)
            except TaskDropped:
                raise
            except Exception:
                counts["tasks_failed"] = counts.get("tasks_failed", 0) + 1
                raise
            else:
                # A task actor handles few messages: its status counts the tasks it ran.
                counts["tasks_done"] = counts.get("tasks_done", 0) + 1
                return ref
            finally:
                self._busy -= 1
                if observer is not None and self._busy == 0:
                    observer.end()


async def _run_task(actor: TaskActor, task: LeasedTask) -> str | None:
    """``actor.run_task(task)``, checked: what it returns becomes the task's result reference in
    the master's journal, which takes a str or nothing. Anything else fails the attempt here,
    saying so; the master would refuse the report, and the task would wait out its lease."""
    made: Any = actor.run_task(task)
    if not inspect.isawaitable(made):  # a plain def behind a decorator, which TaskActor let by
        raise TypeError(
            f"{_named(actor)} must be `async def`: it returned {short_repr(made, 80)}, not a coroutine"
        )
    ref = await made
    if ref is not None and not isinstance(ref, str):
        raise TypeError(
            f"{_named(actor)} returned {short_repr(ref, 80)} ({type(ref).__name__}): it must return a str "
            "(the reference of the task's committed output) or None"
        )
    return ref if ref is None else _checked_ref(actor, ref)


def _checked_ref(actor: TaskActor, ref: str) -> str:
    """``ref``, if a message can carry it and it is short enough to be a reference. Else the
    attempt fails here, saying what to return: the worker's codec refused the report, which
    was worded as the master's refusal, with advice to raise max_message_mb (report px 7)."""
    try:
        # a str longer in characters is longer in bytes: it is not encoded to be refused
        size = len(ref.encode("utf-8")) if len(ref) <= RESULT_REF_MOST_BYTES else None
    except UnicodeEncodeError as exc:
        raise ValueError(
            f"{_named(actor)} returned a str that is not valid UTF-8 ({exc.reason}: "
            f"{ref[exc.start]!r} at index {exc.start} of {short_repr(ref, 60)}), which no message "
            "carries; return the reference of the task's committed output as valid text"
        ) from None
    if size is None or size > RESULT_REF_MOST_BYTES:
        length = f"{len(ref):,} characters" if size is None else f"{size:,} bytes"
        raise ValueError(
            f"{_named(actor)} returned a str of {length}: a task's result is a short reference to "
            f"its committed output, at most {RESULT_REF_MOST_BYTES} bytes of UTF-8; commit the data "
            "with OutputStore and return where it is"
        )
    return ref


def _named(actor: TaskActor) -> str:
    """``MyTask.run_task``: said only when it went wrong, not made for every task."""
    return f"{type(actor).__qualname__}.run_task"
