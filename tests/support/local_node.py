"""A real node in the test's own process, stopped (workers and template reaped) on the way out;
and the small config with one echo worker that the node's own tests start it with."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import anyio

from troupe.runtime.node.config import ActorSpec, NodeConfig, RestartConfig, WorkerSpec
from troupe.runtime.node.local import start_local_node
from troupe.runtime.node.node import Node
from troupe.runtime.node.template_link import TemplateLink
from troupe.runtime.testing.plugin import free_endpoint

__all__ = ["ECHO", "echo_node_config", "ready_template", "running_node"]

ECHO = ActorSpec(name="echo", cls="troupe.actors.demo.actors:Echo")

STOP_WITHIN_S = 60.0  # a bound on the stop's grace and reaping, not on speed
READY_WITHIN_S = 60.0  # a bound on a template's imports on a loaded machine, not on speed


@asynccontextmanager
async def ready_template(link: TemplateLink) -> AsyncIterator[TemplateLink]:
    """``link`` started and ready before any node, as a one-host run starts its own; stopped
    when the block ends, however it ends."""
    async with anyio.create_task_group() as tg:
        await link.start(tg)
        try:
            with anyio.fail_after(READY_WITHIN_S):
                while not link.describe()["ready"]:
                    await anyio.sleep(0.01)  # a bounded poll of in-process state
            yield link
        finally:
            with anyio.CancelScope(shield=True):
                await link.stop()
            tg.cancel_scope.cancel()


@asynccontextmanager
async def running_node(cfg: NodeConfig, template: TemplateLink | None = None) -> AsyncIterator[Node]:
    """The node of ``cfg``, started and ready (forking from ``template``, one started already,
    as a one-host run's node does); stopped when the block ends, however it ends."""
    async with anyio.create_task_group() as tg:
        node = await start_local_node(tg, cfg, template=template)
        try:
            yield node
        finally:
            node.stopping.set()
            with anyio.fail_after(STOP_WITHIN_S):
                await node.stopped.wait()


def echo_node_config(tmp_path: Path, name: str, **extra: object) -> NodeConfig:
    """A node ``name`` logging under ``tmp_path``, with one echo worker ``w1`` restarted at once
    (``extra`` replaces any field)."""
    fields: dict[str, object] = {
        "name": name,
        "endpoint": free_endpoint(),
        "log_dir": tmp_path,
        "log_level": "warning",
        "stop_grace_s": 5.0,
        "workers": (WorkerSpec(name="w1", actors=(ECHO,)),),
        "restart": RestartConfig(backoff_base_s=0.0, backoff_max_s=0.0),
        **extra,
    }
    return NodeConfig.model_validate(fields)
