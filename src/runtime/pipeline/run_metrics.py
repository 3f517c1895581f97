"""A run's Prometheus endpoint (``metrics=``, ``troupe run --metrics HOST:PORT``).

Who serves it depends on where the engine's figures are. A node started by the run lives in the
run's process: it serves its own families and the pipeline's (``node_metrics`` reads them from
its status extras). Nodes that were running already (``cluster=``, ``node=``) never see the
engine: the run's own process serves the pipeline's families there, labelled with its name.

The address follows the rule of every endpoint: off loopback only with CURVE keys. A one-host
run has none (its node, master and endpoints are this host's alone); a run on a cluster has
the cluster's, given or ``$TROUPE_KEYS``.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

from troupe.runtime.errors import ConfigError
from troupe.runtime.metrics.address import as_endpoint, parse_host_port
from troupe.runtime.metrics.serving import serving
from troupe.runtime.node.config import is_loopback
from troupe.runtime.security.process import KEYS_ENV

__all__ = ["HandFigures", "check_run_metrics", "run_endpoint"]

HandFigures = Callable[[Callable[[], Any]], None]
"""Hands the endpoint what reads the engine's figures, once the engine exists."""


def check_run_metrics(address: str | None, keys: str | os.PathLike[str] | None, own_node: bool) -> None:
    """Refuse a metrics address this run may not serve at, before anything starts.

    ``own_node``: the run starts its node here (a one-host run); else ``keys`` (or
    ``$TROUPE_KEYS``) are the cluster's.

    Raises:
        ConfigError: not ``HOST:PORT``, or off loopback where the run has no keys; one line.
    """
    if address is None:
        return
    try:
        loopback = is_loopback(as_endpoint(*parse_host_port(address)))
    except ValueError as exc:
        raise ConfigError(f"metrics: {exc}") from None
    if loopback:
        return
    if own_node:
        raise ConfigError(
            f"metrics {address} is not on loopback: a one-host run listens on this host only "
            "(127.0.0.1, ::1), with no keys; serve them on loopback (a local agent can forward "
            "them), or run on a cluster's nodes with its keys (--cluster, --keys)"
        )
    if keys is None and not os.environ.get(KEYS_ENV):
        raise ConfigError(
            f"metrics {address} is not on loopback and the run has no CURVE keys; give the "
            f"cluster's --keys DIR (or ${KEYS_ENV}), or serve them on loopback"
        )


@asynccontextmanager
async def run_endpoint(
    address: str | None, pipeline: str
) -> AsyncIterator[Callable[[Callable[[], Any]], None]]:
    """Serve the pipeline's families at ``address`` (None: nothing) from this process while the
    block runs; bound on entry, so a port in use is refused before the run starts anything.

    Yields:
        Where the run hands the engine's figures (a function that reads them) once it exists.

    Raises:
        ConfigError: ``address`` cannot be bound.
    """
    if address is None:
        yield lambda _figures: None
        return
    from troupe.runtime.metrics.endpoints import pipeline_endpoint  # prometheus-client: only now

    server, collector = pipeline_endpoint(address, pipeline)

    def hand(figures: Callable[[], Any]) -> None:
        collector.figures = figures

    async with serving(server):
        yield hand
