"""What the node's collaborators see of it: a few calls each, not the whole :class:`~.node.Node`.

The node's side of supervision, the chaos relay and the master link are handed the node, but
each types it with the protocol below that lists what it uses (structural typing: ``Node``
satisfies them without naming them). A collaborator that needs more of the node adds it here,
public, so the seam stays visible; none of them calls a private method of the node.

- :class:`NodeView` (the chaos relay): the node's name, its worker handles, its runtime.
- :class:`LinkedNode` (the master link): that, plus the config and the worker-exit listeners.
- :class:`SupervisedNode` (the node's side of supervision): that, plus the stop flag, the
  record of its children, its template (which forks the supervisor when ready) and
  :meth:`~SupervisedNode.start_worker`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol, runtime_checkable

if TYPE_CHECKING:
    import anyio
    from anyio.abc import TaskGroup

    from troupe.runtime.core.runtime import Runtime
    from troupe.runtime.errors import ConfigError

    from .config import NodeConfig, WorkerSpec
    from .leftovers import ChildRecord
    from .template_link import TemplateLink
    from .worker_handles import WorkerHandle

__all__ = ["LinkedNode", "NodeView", "SupervisedNode"]


@runtime_checkable
class NodeView(Protocol):
    """The node as its workers' targets: name, worker handles and runtime (None until it runs)."""

    @property
    def name(self) -> str: ...

    @property
    def workers(self) -> dict[str, WorkerHandle]: ...

    @property
    def runtime(self) -> Runtime | None: ...


@runtime_checkable
class LinkedNode(NodeView, Protocol):
    """The node as the master link sees it: also its config, the worker-exit listeners
    (called as ``listener(handle, reason)`` after every worker exit), and the names of the
    workers a drain stopped (their records stay while drained)."""

    @property
    def config(self) -> NodeConfig: ...

    @property
    def drained(self) -> set[str]: ...

    @property
    def worker_exit_listeners(self) -> list[Callable[[WorkerHandle, str], None]]: ...

    def refuse(self, error: ConfigError) -> None:
        """Stop, then raise ``error``: the master refused the node (another runs under its name)."""
        ...


@runtime_checkable
class SupervisedNode(LinkedNode, Protocol):
    """The node as its supervision sees it: also the stop flag, the record of its children, its
    template (None without one), and starting (or restarting) a worker."""

    @property
    def stopping(self) -> anyio.Event: ...

    @property
    def children(self) -> ChildRecord: ...

    @property
    def template(self) -> TemplateLink | None: ...

    def start_worker(
        self, tg: TaskGroup, spec: WorkerSpec, restart_reason: str | None = None
    ) -> WorkerHandle:
        """Start the worker ``spec`` in ``tg`` (its handle is reused if the node has one); a
        restart passes the reason its actors get in ``restarted``."""
        ...
