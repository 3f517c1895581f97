"""Where a pipeline run's replicas run, and where its items come from: a running master's
cluster (``cluster=``: its live nodes, its job), or one node (``on_node``: the node started
here, or a running one with ``node=``) with a master (started here over ``out``'s journal, or a
running one with ``master=``) or none (the config's seed range).

Apart from ``runner`` because it holds what a run starts and stops (the node, the master, the
journal) and how: ``runner`` only enters one of these and drives the engine over it.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import anyio
import anyio.abc

from troupe.runtime.core.client import connect
from troupe.runtime.core.runtime import Runtime
from troupe.runtime.node.config import KindSupervision, NodeConfig, SupervisionConfig
from troupe.runtime.node.local import start_local_node
from troupe.runtime.node.node import Node
from troupe.runtime.node.template_link import TemplateLink
from troupe.runtime.placement import place
from troupe.runtime.tasks.book import TaskBook
from troupe.runtime.tasks.master.master import Master
from troupe.runtime.tasks.master.master_config import MasterConfig
from troupe.runtime.transports.loopback import free_endpoint
from troupe.runtime.wire.codec import Codec

from .config import PipelineConfig
from .hosts import EngineHosts, wait_for_nodes
from .master_job import master_source
from .mixed_code import warn_if_mixed
from .run_dir import RunDir
from .run_journal import open_run_journal
from .run_keys import connect_run
from .source import ItemSource

__all__ = ["LOCAL_NODE", "RunCluster", "engine_codec", "on_cluster", "on_node", "stage_supervision"]

_SAY_WAIT_S = 1.0  # a stop still waiting this long says what for

LOCAL_NODE = "local"  # the name of the node a one-host run starts
# What recovers a run whose own journal (or whole --out) was lost as it ran: the same command,
# which goes on from the outputs its folder still holds; not a cluster operator's --new.
RUN_JOURNAL_LOST = "Run the same troupe run again: it goes on from the outputs its folder still holds"


def engine_codec(cfg: PipelineConfig) -> Codec | None:
    """The codec of the run's own process, the engine's: under the pipeline's ``max_message_mb``
    where it sets one, the bound its replicas take too, so that an item inline between 64 MiB
    and that bound reaches the engine and goes on from it; None (the default, 64 MiB) where it
    sets none. Its ``max_frames`` is the default (a pipeline has no such option)."""
    if cfg.max_message_mb is None:
        return None
    return Codec(int(cfg.max_message_mb * 1024 * 1024))


@dataclass
class RunCluster:
    runtime: Runtime
    node_endpoint: str
    node: Node | None
    source: ItemSource | None
    before: int
    hosts: EngineHosts | None = None
    book: TaskBook | None = None  # the master's, where it runs here
    master_endpoint: str | None = None  # where the master started here listens


@asynccontextmanager
async def on_cluster(
    cfg: PipelineConfig,
    master: str,
    nodes: int,
    keys: str | os.PathLike[str] | None,
    fresh: bool,
    out: Path | None,
    on_event: Callable[[str], None] | None = None,
    on_warning: Callable[[str], None] | None = None,
    retry_dead: bool = False,
    mailbox: str | None = None,
) -> AsyncIterator[RunCluster]:
    """A client of the running master at ``master``: its job is the items (made with ``out``),
    its live nodes run the replicas; nothing is started here, so nothing is stopped but the
    replicas. ``on_event``: told what the run waits for (``master_source``); ``on_warning``:
    told once where the cluster runs mixed code (``mixed_code.py``), and where the master cannot
    reach the run (``run_keys.py``). ``retry_dead``: the job's dead items run again. ``mailbox``:
    where the run's mailbox listens (``run_keys.run_mailbox``)."""
    async with connect_run(master, keys, on_warning, engine_codec(cfg), mailbox) as rt:
        live = await wait_for_nodes(rt, master, nodes, keyed=keys is not None)
        await warn_if_mixed(rt, master, on_warning)
        for stage in cfg.stages:  # every stage has a node before anything starts
            res = stage.resources
            place(1, live, res.tags, res.gpu, what=f"stages.{stage.name}", cpus=res.cpu)
        source, before = await master_source(
            rt, master, cfg, fresh=fresh, out=out, on_event=on_event, retry_dead=retry_dead
        )
        yield RunCluster(rt, live[0].endpoint, None, source, before, EngineHosts(live, master, rt))


@asynccontextmanager
async def on_node(
    cfg: PipelineConfig,
    run_dir: RunDir | None,
    log_dir: Path,
    node: str | None,
    master: str | None,
    node_endpoint: str | None,
    master_endpoint: str | None,
    template: TemplateLink | None = None,
    fresh: bool = False,
    out: Path | None = None,
    endpoints_may_move: bool = False,
    on_event: Callable[[str], None] | None = None,
    retry_dead: bool = False,
    metrics: str | None = None,
    master_may_move: bool = False,
) -> AsyncIterator[RunCluster]:
    """The node and the item source of a run; what was started here is stopped on the way out
    (done, failed or cancelled): the node first (its workers within its stop grace), then the
    master, then its journal. ``template``: the node's, started already (``early_template``).
    ``out``: the run's output directory, which a master's job is made with. ``retry_dead``: the
    job's dead items run again. ``metrics``: where a node started here serves its metrics,
    the pipeline's among them (HOST:PORT; None: nowhere). ``endpoints_may_move``: both
    endpoints are defaults that may move if taken meanwhile; ``master_may_move``: the master's
    alone is."""
    journal = None
    try:
        async with anyio.create_task_group() as tg:
            local_node: Node | None = None
            local_master: Master | None = None
            try:
                if run_dir is not None:
                    run_dir.state_dir.mkdir(parents=True, exist_ok=True)
                    journal, book = open_run_journal(run_dir.journal_path, on_event, run_dir.lock)
                    master = master_endpoint or free_endpoint()
                    local_config = MasterConfig(
                        endpoint=master, name="local-master", journal_lost_advice=RUN_JOURNAL_LOST
                    )
                    local_master = Master(local_config, journal, book)
                    local_master.endpoint_may_move = endpoints_may_move or master_may_move
                    await _start_master(tg, local_master)
                    master = local_master.config.endpoint  # another, if it had to move
                if node is None:
                    node_cfg = NodeConfig(
                        name=LOCAL_NODE,
                        endpoint=node_endpoint or free_endpoint(),
                        log_dir=log_dir,
                        stop_grace_s=10,
                        master=master,
                        # The template imports the stages' classes (torch...) once for every replica.
                        preload=tuple(dict.fromkeys(s.actor for s in cfg.stages)),
                        supervision=stage_supervision(cfg),
                        metrics=metrics,
                    )
                    local_node = await start_local_node(
                        tg, node_cfg, template=template, endpoint_may_move=endpoints_may_move
                    )
                    node = local_node.config.endpoint  # another, if it had to move
                # A node started here is keyless, whatever $TROUPE_KEYS names (another cluster's).
                started = local_node is not None
                async with connect(
                    node, "local" if started else "", env_keys=not started, codec=engine_codec(cfg)
                ) as rt:
                    outlives = local_master is None  # one started here replays its journal
                    # A master started here keeps its journal in ``out``: they cannot part.
                    job_out = out if outlives else None
                    source, before = (
                        await master_source(rt, master, cfg, outlives, fresh, job_out, on_event, retry_dead)
                        if master
                        else (None, 0)
                    )
                    here = local_master.book if local_master is not None else None
                    own = master if local_master is not None else None
                    yield RunCluster(rt, node, local_node, source, before, book=here, master_endpoint=own)
            finally:
                with anyio.CancelScope(shield=True):
                    if local_node is not None:
                        local_node.stopping.set()
                        with anyio.move_on_after(local_node.config.stop_grace_s + 30):
                            await _stopped_saying_who(local_node, on_event)
                    if local_master is not None:
                        local_master.stop()
    finally:
        if journal is not None:
            journal.close()


async def _stopped_saying_who(node: Node, on_event: Callable[[str], None] | None) -> None:
    """Wait for the run's node to stop; past ``_SAY_WAIT_S``, say which replicas it waits for
    (one busy with an item ends it, within the node's stop grace, or is killed then): a stop
    that took seconds said nothing, where one without a busy replica takes well under one."""
    with anyio.move_on_after(_SAY_WAIT_S):
        await node.stopped.wait()
    alive = sorted(h.spec.name for h in node.workers.values() if h.process and h.returncode is None)
    if alive and not node.stopped.is_set() and on_event is not None:
        grace = node.config.stop_grace_s
        on_event(
            f"stopping: waiting for {', '.join(alive)} to end what it is doing (at most {grace:g} s, "
            "then it is killed)"
        )
    await node.stopped.wait()


async def _start_master(tg: anyio.abc.TaskGroup, master: Master) -> None:
    async def serve() -> None:
        with anyio.CancelScope(shield=True):  # it outlives the node's stop; master.stop() ends it
            await master.run()

    tg.start_soon(serve)
    with anyio.fail_after(30):
        await master.ready.wait()


def stage_supervision(cfg: PipelineConfig) -> SupervisionConfig:
    """The run's own node's supervision: a stage's ``progress_timeout_s`` for its replicas (their
    kind is the stage's name)."""
    kinds = {
        s.name: KindSupervision(progress_timeout_s=s.progress_timeout_s)
        for s in cfg.stages
        if s.progress_timeout_s is not None
    }
    return SupervisionConfig(kinds=kinds)
