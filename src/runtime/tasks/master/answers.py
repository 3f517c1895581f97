"""Answers the master builds from the driver's futures: one that waits for several, and the
leases a reply carries, as the worker reads them.

:func:`after_all` lets one control queue several events (a renewal of every lease a worker
holds, returns before a request) and answer once they are all done; :func:`lease_payloads`
writes the book's ``Lease`` commands as the maps a worker's ``TaskGetter`` reads. Apart from
``worker_controls.py``: plain functions of futures and commands, tested on their own.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from troupe.runtime.core.router import Answer
from troupe.runtime.tasks.state import Command, Lease

__all__ = ["after_all", "lease_payloads"]


def after_all(futures: list[asyncio.Future[list[Command]]], then: Callable[[list[Any]], Any]) -> Answer:
    """The Answer ``then(results)``, once every future is done (results in their order).

    The driver finishes the events of one control in the order they were queued, so waiting
    for the last future is nearly always enough: one callback, where ``asyncio.gather`` pays
    a future of its own and a callback per event. An earlier one still running is waited for.
    """

    def done(_: Any) -> Any:
        for future in futures:
            if not future.done():
                return Answer(future, done)
        try:
            results = [future.result() for future in futures]
        except BaseException:
            for future in futures:  # the others' errors are seen too: none logged as lost
                if not future.cancelled():
                    future.exception()
            raise
        return then(results)

    return Answer(futures[-1], done)


def lease_payloads(reply: list[Command], now: float) -> list[dict[str, Any]]:
    return [
        {
            "task_id": c.task_id,
            "lease_id": c.lease_id,
            "job_id": c.job_id,
            "kind": c.kind,
            "seed": c.seed,
            "refs": dict(c.refs),
            "attempt": c.attempt,
            "backup": c.backup,
            "ttl": round(c.deadline - now, 3),
        }
        for c in reply
        if isinstance(c, Lease)
    ]
