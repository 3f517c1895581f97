"""A getter in a worker process: built from the hosted task actors, and told of cancels.

:func:`start_task_getter` starts the getter of a worker process that hosts task actors, with its
slots, GPUs and kinds summed from them and an :class:`~troupe.runtime.tasks.task_runner.ActorRunner`
to run its leases; :func:`install_task_control` answers the master's ``cancel_lease`` for the
getters of a process (the ``scale`` benchmark runs hundreds in one). The getter itself knows
nothing of actors or of the process's control handlers, hence the split.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from troupe.runtime.core.control_payloads import ControlPayload
from troupe.runtime.core.runtime import Runtime
from troupe.runtime.library_logging import get_logger

from .getter import TaskGetter
from .getter_config import GetterConfig
from .task_actor import TaskActor
from .task_runner import ActorRunner

__all__ = ["install_task_control", "start_task_getter"]

log = get_logger(__name__)


def install_task_control(runtime: Runtime, getters: Mapping[str, TaskGetter]) -> None:
    """Answer the master's ``cancel_lease`` messages for the getters of this process.

    Args:
        runtime: the process's runtime.
        getters: worker id -> its getter (looked up on every message, so it may grow).
    """

    async def cancel_lease(payload: Any) -> bool:
        p = ControlPayload("cancel_lease", payload)
        worker_id, lease_id = p.require("worker_id", str), p.require("lease_id", int)
        reason = p.optional("reason", str, "")
        getter = getters.get(worker_id)
        if getter is None:
            return False
        return getter.cancel(lease_id, reason)

    runtime.register_control("cancel_lease", cancel_lease)


def start_task_getter(runtime: Runtime, master: str, node: str, process: str) -> TaskGetter | None:
    """Start pulling tasks for the task actors this worker process hosts, if any.

    Args:
        runtime: the worker's runtime, with its actors spawned.
        master: the master's endpoint.
        node: the node name; the worker id is ``node/process``.
        process: the worker process's name.

    Returns:
        The running getter, or None when no hosted actor is a TaskActor.
    """
    actors = [cell.actor for cell in runtime.cells.values() if isinstance(cell.actor, TaskActor)]
    if not actors:
        return None
    for cell in runtime.cells.values():
        if isinstance(cell.actor, TaskActor):  # counted from the start: "0 tasks" says it runs them
            cell.more_counts.update(tasks_done=0, tasks_failed=0)
    # an actor that names no kind runs every kind, and so does its worker
    every = any(not type(a).task_kinds for a in actors)
    kinds = () if every else tuple(sorted({k for a in actors for k in type(a).task_kinds}))
    config = GetterConfig(
        worker_id=f"{node}/{process}",
        node_id=node,
        slots=sum(type(a).slots for a in actors),
        gpu=sum(type(a).gpus for a in actors),
        kinds=kinds,
    )
    getter = TaskGetter(runtime, master, config, ActorRunner(actors))
    install_task_control(runtime, {getter.worker_id: getter})
    runtime.start_soon(getter.run)
    log.info(
        "task_getter_started",
        master=master,
        worker=getter.worker_id,
        slots=config.slots,
        kinds=list(kinds) or "any",
    )
    return getter
