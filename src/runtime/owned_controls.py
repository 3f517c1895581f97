"""The controls a run sends a node about the workers it spawned there, naming the run's process.

``spawn_worker`` and ``stop_worker`` carry ``owner_process`` (``process_identity``): the node
stops a run's workers at once once that process is gone from its host, and a stop from another
process (a late one of an earlier run: a pipeline's replicas, a training run's ranks have the
same names in every run) leaves the worker of the name alone. A node of before the field refuses
it as it refuses any field its spec does not allow, before it does anything: the control is sent
again without it, and that node is sent it no more. A cluster's nodes and the runs on it are not
upgraded at one instant.

Shared by the pipeline engine and the training driver (``troupe.actors.training``), which is why
it is not in ``pipeline``: the owner contract is the node's (``node/spawn_owners.py``,
``node/stop_owners.py``), not any one kind of run's.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from troupe.runtime.core.runtime import Runtime
from troupe.runtime.errors import BadRequest
from troupe.runtime.library_logging import get_logger
from troupe.runtime.node.config import is_loopback
from troupe.runtime.process_identity import process_identity

if TYPE_CHECKING:
    from troupe.runtime.owner_beat import OwnerBeat

__all__ = ["OWNER_PROCESS", "OwnedControls", "can_ping_back", "spawn_owner"]

log = get_logger(__name__)

OWNER_PROCESS = "owner_process"


def can_ping_back(node: str, owner: str) -> bool:
    """Whether the node at ``node`` can reach the run at ``owner``. A run binds loopback by
    default: a node it reaches off loopback (another host, another network namespace) would ping
    its own loopback, find nobody, and stop the workers of a run that is well. Such a run's
    workers are watched through the master it beats to instead (``owner_beat.py``)."""
    try:
        return not is_loopback(owner) or is_loopback(node)
    except ValueError:
        return False


def _on_loopback(endpoint: str) -> bool:
    try:
        return is_loopback(endpoint)
    except ValueError:
        return False


def spawn_owner(node: str, address: object, beat: OwnerBeat | None) -> str | None:
    """The owner a run's ``spawn_worker`` on the node at ``node`` names, so that the node stops
    the worker once the run is gone (killed, its host dead; ``node/spawn_owners.py``): the run's
    runtime at ``address`` where the node can ping it back, else the run's token where the master
    it beats to took a beat (``beat``), else none (the node never stops it for the run's going).

    A node on another host asks the master even where it could ping the run (a cluster run
    listens on its host's address towards the master, ``pipeline/run_keys.py``): a run whose
    host lets nothing in (a workstation's firewall) would have its replicas stopped as gone."""
    if beat is not None and beat.vouched and not _on_loopback(node):
        return beat.token
    if isinstance(address, str) and can_ping_back(node, address):
        return address
    if beat is not None and beat.vouched:
        return beat.token
    return None


class OwnedControls:
    """Sends a node controls that may name this run's process, minding the nodes that refuse it.

    Args:
        runtime: the run's runtime.
    """

    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime
        self.identity = process_identity()  # "" where none can be told: then never sent
        self.older_nodes: set[str] = set()  # endpoints of nodes that refuse ``owner_process``

    def named(self, payload: dict[str, Any]) -> dict[str, Any]:
        """``payload`` naming this run's process (as it is where none can be told)."""
        return {**payload, OWNER_PROCESS: self.identity} if self.identity else payload

    def for_node(self, endpoint: str, payload: dict[str, Any]) -> dict[str, Any]:
        """``payload`` as the node at ``endpoint`` takes it: without ``owner_process`` for a node
        known to refuse it."""
        if endpoint in self.older_nodes:
            return {k: v for k, v in payload.items() if k != OWNER_PROCESS}
        return payload

    async def ask(self, endpoint: str, control: str, payload: dict[str, Any], timeout: float) -> Any:
        """``control`` with ``payload`` asked of the node at ``endpoint``; asked again without
        ``owner_process`` where the node refuses that field (and so from then on)."""
        payload = self.for_node(endpoint, payload)
        try:
            return await self.runtime.control(endpoint, control, payload, timeout=timeout)
        except BadRequest as exc:
            if OWNER_PROCESS not in payload or f"'{OWNER_PROCESS}'" not in str(exc):
                raise
        self.older_nodes.add(endpoint)
        log.info("node_without_owner_process", endpoint=endpoint, control=control)
        return await self.ask(endpoint, control, payload, timeout)
