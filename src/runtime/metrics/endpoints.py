"""The metrics endpoints of a node, of a master and of a pipeline run: a private registry with
the process's collectors, served by a :class:`~.server.MetricsServer`."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry

from .master_metrics import MasterCollector
from .node_metrics import NodeCollector
from .pipeline_metrics import PipelineCollector
from .server import MetricsServer

if TYPE_CHECKING:
    from .ports import MeteredMaster, MeteredNode

__all__ = ["master_endpoint", "node_endpoint", "pipeline_endpoint"]


def node_endpoint(node: MeteredNode, address: str, extra: Sequence[Any] = ()) -> MetricsServer:
    """The node's endpoint at ``address``; ``extra`` collectors join it (a master run in the
    node's process, ``--with-master``).

    Raises:
        ConfigError: ``address`` cannot be bound.
    """
    registry = CollectorRegistry()
    collector = NodeCollector(node)
    registry.register(collector)
    refreshers = [collector.refresh]
    for other in extra:
        registry.register(other)
        if hasattr(other, "refresh"):
            refreshers.append(other.refresh)
    return MetricsServer(address, registry, refreshers, who="node")


def master_endpoint(master: MeteredMaster, address: str) -> MetricsServer:
    """The master's endpoint at ``address``.

    Raises:
        ConfigError: ``address`` cannot be bound.
    """
    registry = CollectorRegistry()
    registry.register(MasterCollector(master))
    return MetricsServer(address, registry, who="master")


def pipeline_endpoint(address: str, pipeline: str) -> tuple[MetricsServer, PipelineCollector]:
    """The endpoint at ``address`` of a run whose replicas run on other processes' nodes, and
    its collector (labelled ``pipeline``), whose ``figures`` the run sets once its engine exists.

    Raises:
        ConfigError: ``address`` cannot be bound.
    """
    registry = CollectorRegistry()
    collector = PipelineCollector({"pipeline": pipeline})
    registry.register(collector)
    return MetricsServer(address, registry, who="run"), collector
