"""The master: the cluster's control plane for tasks (``troupe master start``).

One per cluster, in its own process or inside a node (``troupe node start --with-master``). It
runs a runtime of its own (process ``master``) bound at its endpoint and answers control
messages; the decisions are the task book's, the durability the journal's, and the driver
(:mod:`troupe.runtime.tasks.master.driver`) journals every state change before it is acknowledged.

Control messages (payloads are maps; ``->`` is the reply)::

    from workers (their TaskGetter)
      register_worker {worker_id, node, endpoint, slots, cpu, gpu, kinds, prefetch?} -> {ok}
      request_task    {worker_id, free_slots, wait_s, held?}
                                                       -> {leases: [lease]}   (long poll)
      renew           {worker_id, task_id, lease_id, more?, node?, pid?}
                                                       -> {outcome: renewed, ttl} | {outcome:
                                                          rejected, reason}: drop the task;
                                                          more?: [{lease_id, outcome, ...}]
      complete        {worker_id, task_id, lease_id, result_ref, request}
                                                       -> {outcome, leases, known}: rejected,
                                                          reason, its attempt failed, where
                                                          result_ref is no reference (result_refs.py)
      fail            {worker_id, task_id, lease_id, error, traceback, request}
                                                       -> {outcome, leases, known}
      decline         {worker_id, task_id, lease_id, reason, request, given_back?}
                                                       -> {outcome, leases, known}
    from nodes (their MasterLink)
      node_beat       {node, endpoint, resources, processes, log_endpoint?, tags?, code?}
                                                       -> {ok, master, node_timeout_s}
      resolve         {address}                        -> {address, endpoint}  (any live node's
                                                          actors: the cluster's directory)
      worker_left     {worker_id, pid, reason}         -> bool
      node_dead       {node}                           -> bool
      node_left       {node}                           -> bool   (it stops on purpose: marked
                                                          left at once, its leases requeued)
    from operators (``troupe ctl``)
      submit {job: <job TOML as a map>, source, job_id?} -> {job_id, tasks, already}
      status -> {...}   jobs -> [job]   cancel {job_id}   drain {node}   dead {job_id} -> [..]
      retry_dead {job_id} -> {job_id, retried, state}  (its dead tasks run again)
      done_tasks {job_id, task_ids} -> {task_id: result_ref}  (those of them that are done)
      undrain {node} -> {node, draining, restarted: [worker names the node started again]}
      wait_job {job_id, timeout_s} -> job   ping -> {master, pid}   shutdown -> true
      log_recent {after?, limit?} -> {incarnation, seq, lines}  (its own log's last lines, see
                                                          troupe.runtime.log_publisher; only a
                                                          master with a log file of its own,
                                                          whose ``status`` says ``log_endpoint``)

    lease = {task_id, lease_id, job_id, kind, seed, refs, attempt, backup, ttl}

``kinds`` are the task kinds the worker runs (empty: every kind); the master leases it only
tasks of those kinds. ``decline`` returns a copy the worker does not run after all: the task
goes back without an attempt counted, and the worker gets no more tasks of that kind.

Every payload is decoded at the boundary into a typed message
(:mod:`troupe.runtime.tasks.master.controls`): a payload that lacks a field or mistypes one is
answered with ``bad_request``, naming the control, the field and the value.

``held`` (request_task) names the leases the worker holds: one granted in reply to an earlier
request_task and not held never reached it, and its task goes back at once, no attempt counted
(``stale_reports`` counts it as ``lease_unseen``).

``prefetch``: the worker may hold that many leases beyond its slots, waiting in it for a slot
(see :mod:`troupe.runtime.tasks.getter`); one reply may then carry several leases, journaled in
one batch. ``more`` (renew) lists the other ``[task_id, lease_id]`` it holds, all renewed by
the one message. ``given_back`` (decline): a lease ahead returned unrun after waiting too long;
no attempt counted, and the worker may get that kind again.

``request`` piggybacks the worker's next request on its report (its free slots, 0 for none),
so a busy worker costs one message per task. ``ttl`` is the lease's remaining life in seconds:
deadlines are kept in the master's clock only. A request from a worker the master does not
know (it restarted) fails with ``unknown_worker``; the worker registers again.

The master sends ``cancel_lease {worker_id, task_id, lease_id, reason}`` to a worker's process
when a copy must stop, and ``master_drained {node}`` to a node whose drain has finished.

Time comes from two injected clocks (tests drive them instead of sleeping): ``clock``, monotonic
seconds, for every duration: node silence, throughput, and the task book's lease deadlines,
backoffs and running times (a step of the wall clock, NTP's at boot, expires no lease and holds
no retry back); ``wall_clock``, for what is journaled or shown as a timestamp (submit and finish
times, a backoff's ``not_before``) and for which finished jobs are old enough to compact.

Every ``COMPACT_EVERY_S`` the master compacts the jobs that finished ``COMPACT_AFTER_S`` ago or
more, in its journal and its book at once, as a restart on the journal would
(:mod:`~troupe.runtime.tasks.master.compaction`): a master left up for days holds the tasks of
its running and recent jobs, not of every job it ran.

Nodes beat every second or so; a node silent for ``node_timeout_s`` is declared dead and the
tasks its workers held are requeued at once. Silence is counted only while the master could
hear: a tick that comes ``HELD_S`` or more late (the loop was held, say by the book taking a
job of millions of tasks in) moves every live node's last beat on by the hold, and logs
``master_loop_held``. A restarted master knows no node and no worker until they beat and
register again; the journal gives it back every job, and every lease held over for the worker
that renews it (see ``TaskTables.restore``): its running copies run on. Such a worker holds
what it named before it registers again: a ``worker_left`` for it, or its node's death (the
``node`` its renew said), requeues those leases at once, as any holder's.

The master is built of parts: the workers' controls and what it keeps of each worker
(:mod:`~troupe.runtime.tasks.master.worker_controls`, with its answers in ``answers.py``), the
nodes' beats and lookups (:mod:`~troupe.runtime.tasks.master.node_controls`) and the operators'
controls (:mod:`~troupe.runtime.tasks.master.operations`); this module runs them all.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import time
from collections.abc import Callable
from typing import Any

import anyio

from troupe.runtime.code_identity import code_identity
from troupe.runtime.core.router import Answer
from troupe.runtime.core.runtime import Runtime, process_runtime
from troupe.runtime.errors import ConfigError, JournalError, Unreachable
from troupe.runtime.gc_pauses import gc_pauses
from troupe.runtime.library_logging import get_logger
from troupe.runtime.log_publisher import LogPublisher
from troupe.runtime.metrics.serving import serving
from troupe.runtime.node.reach import any_port
from troupe.runtime.security.process import (
    install,
    keys_for,
    warn_if_insecure,
    warn_if_not_own,
    warn_of_unnamed_keys,
)
from troupe.runtime.start_limits import in_thread
from troupe.runtime.tasks.book import TaskBook
from troupe.runtime.tasks.journal import Compaction, Journal
from troupe.runtime.tasks.state import (
    CancelLease,
    Command,
    JobFinished,
    NodeDead,
    NodeDrained,
    SchedulerTick,
)
from troupe.runtime.transports.base import Transport
from troupe.runtime.transports.loopback import bind_or_move
from troupe.runtime.wire.codec import Codec

from .compaction import COMPACT_EVERY_S, compact_finished
from .controls import NodeControl
from .driver import Dispatcher
from .journal_open import COMPACT_AFTER_S
from .journal_watch import JournalFile, watch_journal
from .master_config import MasterConfig
from .node_controls import NodeControls
from .nodes import NodeTable
from .operations import Operations
from .run_owners import RunOwners
from .worker_controls import WorkerControls, WorkerEntry

__all__ = ["HELD_S", "Master"]

log = get_logger(__name__)

HELD_S = 1.0
"""A tick this late means the master's loop was held, deaf to every node meanwhile."""


class Master(NodeControls, WorkerControls):
    """The control plane's process (or task, inside a node).

    Args:
        config: how it runs.
        journal: the open journal.
        book: the book replayed from ``journal`` (see :func:`open_journal`).
        transport: defaults to ZeroMQ bound at ``config.endpoint``; tests pass a memory one.
        clock: monotonic seconds, for every duration (node silence, throughput, the task book's
            ``now``: lease deadlines, backoffs); tests pass a fake one.
        wall_clock: wall seconds, for everything journaled or shown as a timestamp (the task
            book's ``wall``: submit times, a backoff's ``not_before``); tests pass a fake one.
    """

    def __init__(
        self,
        config: MasterConfig,
        journal: Journal,
        book: TaskBook,
        transport: Transport | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self.config = config
        self.journal = journal
        self.clock = clock
        self.wall_clock = wall_clock
        self.dispatcher = Dispatcher(
            book,
            journal,
            self._perform,
            clock=clock,
            wall_clock=wall_clock,
            linger_s=config.batch_linger_s,
        )
        self.book = book
        self.nodes = NodeTable(config.node_timeout_s)
        self._asking: set[asyncio.Task[bool]] = set()  # pings of names' holders (node_controls.py)
        self._drains_told: set[str] = set()  # beats said drained, the drain not landed (the same)
        self._undrains_telling: set[str] = set()  # owed undrains being told (the same)
        self.runtime: Runtime | None = None
        self.ready = anyio.Event()
        # The endpoint is a default found free a moment ago: taken meanwhile, the master binds a
        # free port of the same host instead (``config.endpoint`` then says which).
        self.endpoint_may_move = False
        self.failure: JournalError | None = None
        self.gc = gc_pauses()  # the process's collector pauses, from now on: status shows them
        self.log_publisher: LogPublisher | None = None  # its own log stream, with config.log_file
        self.code = ""  # the troupe code it runs (code_identity.py): status says it once read
        self._transport = transport
        self._stopping = anyio.Event()
        self._workers: dict[str, WorkerEntry] = {}
        self.run_owners = RunOwners()  # the runs that own replicas on the nodes: when last heard
        # Reports and renewals the book turned away: stale lease ids (a copy requeued while
        # its host was cut off, or superseded), a task already done. Dropped, never applied.
        self._stale: dict[str, int] = {}
        # The stale reports counted, by (report, worker, lease): a worker's retries of one report,
        # queued while its link was cut, arrive together and are one report, counted once.
        self._stale_seen: dict[tuple[str, str, int], None] = {}
        self.ops = Operations(self)
        # Counted for the metrics endpoint (docs/METRICS.md); nothing else keeps these totals.
        self.dispatched = 0  # leases granted
        self.lease_expiries = 0  # leases that ran out unrenewed

    def stop(self) -> None:
        """Ask the master to stop (it finishes the batch in hand, then shuts down)."""
        self._stopping.set()

    def _bind(self, endpoint: str) -> Runtime:
        return process_runtime(
            self.config.name,
            "master",
            bind=endpoint,
            hwm=self.config.hwm,
            transport=self._transport,
            codec=Codec(256 * 2**20, node_limits=False, no_extension_imports="master"),
            drain_timeout=0.5,
        )

    async def run(self) -> None:
        """Serve until :meth:`stop` or a ``shutdown`` message.

        Raises:
            ConfigError: the endpoint cannot be bound.
            JournalError: the journal failed while serving; the master stopped.
        """
        cfg = self.config
        if cfg.keys is not None:  # a master in a node's process shares the node's keys
            install(keys_for(cfg.keys))
        metrics = None
        if cfg.metrics is not None:  # bound first: a port in use stops the start, as the endpoint's
            from troupe.runtime.metrics.endpoints import master_endpoint  # prometheus-client: only now

            metrics = master_endpoint(self, cfg.metrics)
        try:
            runtime, moved = bind_or_move(self._bind, cfg.endpoint, self.endpoint_may_move)
        except Unreachable as exc:
            if metrics is not None:
                metrics.close()
            raise ConfigError(f"{exc}; is another master running there? pick --endpoint") from None
        if moved:
            log.warning("endpoint_taken", wanted=cfg.endpoint, endpoint=runtime.address)
            self.config = cfg = dataclasses.replace(cfg, endpoint=runtime.address)
        self.runtime = runtime
        self._install_controls(runtime)
        served = False  # to the end of a stop, not out through an error
        try:
            async with serving(metrics), runtime, anyio.create_task_group() as tg:
                self._stream_log(runtime, tg)
                tg.start_soon(self._drive)
                tg.start_soon(self._tick)
                tg.start_soon(self._watch_journal)
                tg.start_soon(self._read_code)
                tg.start_soon(self._compact_periodically)
                self.ready.set()
                log.info(
                    "master_started",
                    endpoint=runtime.address,
                    journal=str(self.journal.path),
                    jobs=len(self.book.jobs()),
                )
                warn_if_insecure(cfg.endpoint, cfg.insecure)
                warn_if_not_own()
                warn_of_unnamed_keys()
                await self._stopping.wait()
                tg.cancel_scope.cancel()
            served = True
        finally:
            if served:  # before its stream closes: its last line, which a tail sees
                log.info("master_stopped")
            if self.log_publisher is not None:  # it publishes what the file got since its last poll
                self.log_publisher.close()
        if self.failure is not None:
            raise self.failure

    async def _read_code(self) -> None:
        """Read the code identity in a thread: tens of ms of source files, not on the loop nor
        before the master answers; ``status`` says None for it until then."""
        self.code = await in_thread(code_identity, what="code_identity")

    def _stream_log(self, runtime: Runtime, tg: anyio.abc.TaskGroup) -> None:
        """Publish the master's own log file, as a node publishes its (``log_publisher``), from
        before it logs that it started, and answer ``log_recent`` from it. A master with no file
        of its own (inside a node, whose stream has its lines) does neither: its ``status`` says
        no ``log_endpoint``, and ``log_recent`` is an unknown type to it, as to an older one."""
        if self.config.log_file is None:
            return
        publisher = LogPublisher(self.config.name, self.config.log_file, any_port(self.config.endpoint))
        self.log_publisher = publisher
        runtime.register_control("log_recent", lambda payload: Answer.now(publisher.answer(payload)))
        tg.start_soon(publisher.run)  # closed as the master stops, after master_stopped

    @property
    def log_endpoint(self) -> str | None:
        """Where the master publishes its own log (None: it does not)."""
        return self.log_publisher.endpoint if self.log_publisher is not None else None

    async def _drive(self) -> None:
        try:
            await self.dispatcher.run()
        except JournalError as exc:
            self.failure = exc
            self._stopping.set()

    async def _watch_journal(self) -> None:
        opened = JournalFile.at(self.journal.path)
        if opened is None:  # nothing on disk to watch
            return
        lost = await watch_journal(opened, advice=self.config.journal_lost_advice)
        log.error("journal_lost", journal=str(self.journal.path), error=str(lost))
        self.failure = lost
        self._stopping.set()

    async def _tick(self) -> None:
        while True:
            before = time.monotonic()
            await anyio.sleep(self.config.tick_s)
            held = time.monotonic() - before - self.config.tick_s
            # Measured on the real clock: a test's hand-driven clock jumps without any hold.
            if held >= HELD_S and self.clock is time.monotonic:
                self.loop_held(held)
            try:
                await self.tick()
            except JournalError:
                return

    def loop_held(self, held_s: float) -> None:
        """The master's loop came back ``held_s`` late (a big submit taken in, a swap storm):
        it heard nothing meanwhile, so no node is judged silent for that time (the beats it
        held are read after). Logged, as a master that stops listening is worth knowing of."""
        log.warning("master_loop_held", held_s=round(held_s, 3))
        self.nodes.forgive(held_s, self.clock())

    async def tick(self) -> None:
        """One look at the clocks (every ``tick_s``): expire leases, end backoffs, declare
        silent nodes dead. Tests that drive a fake clock may call it to look at once.

        Raises:
            JournalError: the journal failed; the master is stopping.
        """
        await self.dispatcher.handle(SchedulerTick())
        for node in self.nodes.expired(self.clock()):
            log.warning("node_dead", node=node, silent_for_s=self.config.node_timeout_s)
            await self._node_gone(node)

    async def _compact_periodically(self) -> None:
        while True:
            await anyio.sleep(COMPACT_EVERY_S)
            try:
                await self.compact()
            except JournalError as exc:
                if self.dispatcher.failed:
                    return  # the dispatcher said so, and the master is stopping
                log.error("compaction_failed", error=str(exc))  # nothing of it kept: tried again later
            except Exception as exc:  # a bug, as the driver's task_book_failed: the master serves on
                log.error("compaction_failed", error=repr(exc))

    async def compact(self) -> Compaction:
        """Compact the jobs that finished ``COMPACT_AFTER_S`` ago or more, in the journal and
        the book, as a restart would (every ``COMPACT_EVERY_S``; see ``compaction.py``). Tests
        that drive a fake wall clock call it to look at once.

        Raises:
            JournalError: the journal failed; nothing of the step that failed was kept.
        """
        return await compact_finished(self.dispatcher, self.wall_clock() - COMPACT_AFTER_S)

    async def _node_gone(self, node: str, left: bool = False) -> None:
        for worker_id in [w for w, e in self._workers.items() if e.node == node]:
            del self._workers[worker_id]
            self.dispatcher.unpark(worker_id)
        await self.dispatcher.handle(NodeDead(node, left))

    # ------------------------------------------------------------------ side commands

    def _perform(self, commands: list[Command]) -> None:
        assert self.runtime is not None
        for command in commands:
            if isinstance(command, CancelLease):
                if command.reason == "lease expired":  # the book's reason for an expiry
                    self.lease_expiries += 1
                entry = self._workers.get(command.worker_id)
                if entry is not None:
                    self.runtime.start_soon(
                        self._send,
                        entry.endpoint,
                        "cancel_lease",
                        {
                            "worker_id": command.worker_id,
                            "task_id": command.task_id,
                            "lease_id": command.lease_id,
                            "reason": command.reason,
                        },
                    )
            elif isinstance(command, NodeDrained):
                endpoint = self.nodes.endpoint(command.node_id)
                log.info("drained_node_told", node=command.node_id, endpoint=endpoint)
                if endpoint:
                    self.runtime.start_soon(self._send, endpoint, "master_drained", {"node": command.node_id})
            elif isinstance(command, JobFinished):
                self.ops.job_finished(command.job_id)

    async def _send(self, endpoint: str, msg_type: str, payload: Any) -> None:
        assert self.runtime is not None
        try:
            await self.runtime.control(endpoint, msg_type, payload, timeout=5.0)
        except Exception as exc:  # the peer may be gone; its lease or drain ends anyway
            log.info("master_send_failed", type=msg_type, endpoint=endpoint, error=repr(exc))

    # ------------------------------------------------------------------ control messages

    def _install_controls(self, runtime: Runtime) -> None:
        runtime.register_controls(
            dict(
                ping=self._ping,
                register_worker=self._register_worker,
                request_task=self._request_task,
                renew=self._renew,
                complete=self._complete,
                fail=self._fail,
                decline=self._decline,
                node_beat=self._node_beat,
                resolve=self._resolve,
                worker_left=self._worker_left,
                node_dead=self._node_dead,
                node_left=self._node_left,
                shutdown=self._shutdown,
                owner_beat=self._owner_beat,
                owner_seen=self._owner_seen,
                owner_gone=self._owner_gone,
                **self.ops.handlers(),
            )
        )

    def _ping(self, _: Any) -> Answer:
        return Answer.now({"master": self.config.name, "pid": os.getpid(), "time": self.wall_clock()})

    async def _node_dead(self, payload: Any) -> bool:
        node = NodeControl.decode("node_dead", payload).node
        self.nodes.mark_dead(node)
        await self._node_gone(node)
        return True

    async def _node_left(self, payload: Any) -> bool:
        """The node stops on purpose (SIGTERM, Ctrl-C): stopped now, not dead once silent, and
        what its workers held goes back as for a dead node's, its drain kept."""
        node = NodeControl.decode("node_left", payload).node
        if self.nodes.leave(node):
            log.info("node_left", node=node)
            await self._node_gone(node, left=True)
        return True

    async def _shutdown(self, _: Any) -> bool:
        self.stop()
        return True
