"""What the collectors read of the node and of the master: public attributes only, typed here
as protocols so that the collectors run on fakes in tests and import neither.

Both are read on the event loop's thread, on each scrape: the collectors keep no copy of the
state they report, except what only another process knows (a worker's mailboxes, the
supervisor's counts), fetched once per scrape (see :mod:`.node`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from troupe.runtime.core.runtime import Runtime
    from troupe.runtime.node.worker_handles import WorkerHandle
    from troupe.runtime.tasks.book import TaskBook
    from troupe.runtime.tasks.master.driver import Dispatcher
    from troupe.runtime.tasks.master.nodes import NodeTable

__all__ = ["MeteredMaster", "MeteredNode", "SupervisionView"]


class SupervisionView(Protocol):
    """The node's side of supervision: its supervisor's starts, the workers' restarts by
    ``(worker, kind)`` over the node's life, and its status (which asks the supervisor process
    for its counts)."""

    @property
    def starts(self) -> int: ...

    @property
    def worker_restarts(self) -> Mapping[tuple[str, str], int]: ...

    async def describe(self) -> dict[str, Any]: ...


class MeteredNode(Protocol):
    """The node as its collector reads it."""

    @property
    def name(self) -> str: ...

    @property
    def uptime_s(self) -> float: ...

    @property
    def workers(self) -> dict[str, WorkerHandle]: ...

    @property
    def runtime(self) -> Runtime | None: ...

    @property
    def supervision(self) -> SupervisionView: ...

    @property
    def status_extras(self) -> dict[str, Callable[[], Any]]: ...

    @property
    def worker_exit_listeners(self) -> list[Callable[[WorkerHandle, str], None]]: ...


class _MasterConfigView(Protocol):
    @property
    def name(self) -> str: ...


class _JournalView(Protocol):
    @property
    def path(self) -> Path: ...


class _Throughput(Protocol):
    def done_per_s(self) -> float: ...


class MeteredMaster(Protocol):
    """The master as its collector reads it: the book, the driver, the node table, the
    registered workers, the journal's file, and the counters it keeps for metrics."""

    @property
    def config(self) -> _MasterConfigView: ...

    @property
    def clock(self) -> Callable[[], float]: ...

    @property
    def book(self) -> TaskBook: ...

    @property
    def dispatcher(self) -> Dispatcher: ...

    @property
    def nodes(self) -> NodeTable: ...

    @property
    def journal(self) -> _JournalView: ...

    @property
    def ops(self) -> _Throughput: ...

    @property
    def dispatched(self) -> int: ...

    @property
    def lease_expiries(self) -> int: ...

    def workers(self) -> Mapping[str, Mapping[str, Any]]: ...
