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
      renew           {worker_id, task_id, lease_id, more?}
                                                       -> {outcome: renewed, ttl} | {outcome:
                                                          rejected, reason}: drop the task;
                                                          more?: [{lease_id, outcome, ...}]
      complete        {worker_id, task_id, lease_id, result_ref, request}
                                                       -> {outcome, leases, known}
      fail            {worker_id, task_id, lease_id, error, traceback, request}
                                                       -> {outcome, leases, known}
      decline         {worker_id, task_id, lease_id, reason, request, given_back?}
                                                       -> {outcome, leases, known}
    from nodes (their MasterLink)
      node_beat       {node, endpoint, resources, processes, log_endpoint?, tags?, code?}
                                                       -> {ok}
      resolve         {address}                        -> {address, endpoint}  (any live node's
                                                          actors: the cluster's directory)
      worker_left     {worker_id, pid, reason}         -> bool
      node_dead       {node}                           -> bool
    from operators (``troupe ctl``)
      submit {job: <job TOML as a map>, source, job_id?} -> {job_id, tasks, already}
      status -> {...}   jobs -> [job]   cancel {job_id}   drain {node}   dead {job_id} -> [..]
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
seconds, for node silence and throughput; ``wall_clock``, for what is journaled or shown as a
timestamp (lease deadlines, backoffs, submit and finish times).

Nodes beat every second or so; a node silent for ``node_timeout_s`` is declared dead and the
tasks its workers held are requeued at once. Silence is counted only while the master could
hear: a tick that comes ``HELD_S`` or more late (the loop was held, say by the book taking a
job of millions of tasks in) moves every live node's last beat on by the hold, and logs
``master_loop_held``. A restarted master knows no node and no worker until they beat and
register again; the journal gives it back every job.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import anyio
import structlog

from troupe.runtime.code_identity import code_identity
from troupe.runtime.core.router import Answer
from troupe.runtime.core.runtime import Runtime, process_runtime
from troupe.runtime.errors import ConfigError, JournalError, UnknownWorker, Unreachable
from troupe.runtime.gc_pauses import gc_pauses
from troupe.runtime.log_publisher import LogPublisher
from troupe.runtime.metrics.serving import serving
from troupe.runtime.node.reach import any_port
from troupe.runtime.security.process import install, keys_for, warn_if_insecure
from troupe.runtime.tasks.book import TaskBook
from troupe.runtime.tasks.journal import Journal
from troupe.runtime.tasks.state import (
    Ack,
    CancelLease,
    Command,
    Complete,
    Decline,
    Fail,
    JobFinished,
    Lease,
    NodeDead,
    NodeDrained,
    Reject,
    Renew,
    Resources,
    SchedulerTick,
    WorkerJoined,
    WorkerLeft,
)
from troupe.runtime.transports.base import Transport
from troupe.runtime.transports.loopback import bind_or_move
from troupe.runtime.wire.codec import Codec

from .controls import (
    NodeBeatControl,
    NodeControl,
    OwnerControl,
    RegisterWorkerControl,
    RenewControl,
    ReportControl,
    RequestTaskControl,
    ResolveControl,
    WorkerLeftControl,
)
from .driver import Dispatcher
from .journal_watch import JournalFile, watch_journal
from .master_config import MasterConfig
from .nodes import NodeTable, ProcessEntry
from .operations import Operations, raise_rejected
from .run_owners import RunOwners

__all__ = ["HELD_S", "Master"]

log = structlog.get_logger(__name__)

HELD_S = 1.0
"""A tick this late means the master's loop was held, deaf to every node meanwhile."""


@dataclass(slots=True)
class _WorkerEntry:
    node: str
    endpoint: str
    pid: int
    slots: int
    resources: Resources
    kinds: list[str]
    declined: frozenset[str] = frozenset()
    process: str = ""  # its identity (process_identity.py): a rerun on its host checks it
    # Leases sent in replies to its request_task that it has not yet said it holds: one it
    # still does not hold at its next request never reached it (see _return_unseen).
    granted: dict[int, str] = field(default_factory=dict)

    @property
    def signature(self) -> tuple[str, int, Resources, tuple[str, ...], frozenset[str]]:
        # workers alike in all of these are served alike (see the driver's long polls)
        return (self.node, self.slots, self.resources, tuple(self.kinds), self.declined)


class Master:
    """The control plane's process (or task, inside a node).

    Args:
        config: how it runs.
        journal: the open journal.
        book: the book replayed from ``journal`` (see :func:`open_journal`).
        transport: defaults to ZeroMQ bound at ``config.endpoint``; tests pass a memory one.
        clock: monotonic seconds (node silence, throughput); tests pass a fake one.
        wall_clock: wall seconds, for everything journaled or shown as a timestamp (the task
            book's ``now``: lease deadlines, backoffs); tests pass a fake one.
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
            book, journal, self._perform, clock=wall_clock, linger_s=config.batch_linger_s
        )
        self.book = book
        self.nodes = NodeTable(config.node_timeout_s)
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
        self._workers: dict[str, _WorkerEntry] = {}
        self.run_owners = RunOwners()  # the runs that own replicas on the nodes: when last heard
        # Reports and renewals the book turned away: stale lease ids (a copy requeued while
        # its host was cut off, or superseded), a task already done. Dropped, never applied.
        self._stale: dict[str, int] = {}
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
            codec=Codec(256 * 2**20),
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
        try:
            async with serving(metrics), runtime, anyio.create_task_group() as tg:
                self._stream_log(runtime, tg)
                tg.start_soon(self._drive)
                tg.start_soon(self._tick)
                tg.start_soon(self._watch_journal)
                tg.start_soon(self._read_code)
                self.ready.set()
                log.info(
                    "master_started",
                    endpoint=runtime.address,
                    journal=str(self.journal.path),
                    jobs=len(self.book.jobs()),
                )
                warn_if_insecure(cfg.endpoint, cfg.insecure)
                await self._stopping.wait()
                tg.cancel_scope.cancel()
        finally:
            if self.log_publisher is not None:  # its run closes it, if it got to run
                self.log_publisher.close()
        log.info("master_stopped")
        if self.failure is not None:
            raise self.failure

    async def _read_code(self) -> None:
        """Read the code identity in a thread: tens of ms of source files, not on the loop nor
        before the master answers; ``status`` says None for it until then."""
        self.code = await anyio.to_thread.run_sync(code_identity)

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
        tg.start_soon(publisher.run)  # closes its socket when cancelled

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
        lost = await watch_journal(opened)
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

    async def _node_gone(self, node: str) -> None:
        for worker_id in [w for w, e in self._workers.items() if e.node == node]:
            del self._workers[worker_id]
            self.dispatcher.unpark(worker_id)
        await self.dispatcher.handle(NodeDead(node))

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
                shutdown=self._shutdown,
                owner_beat=self._owner_beat,
                owner_seen=self._owner_seen,
                owner_gone=self._owner_gone,
                **self.ops.handlers(),
            )
        )

    # The workers' controls (and the nodes' beats) are plain handlers that return an Answer:
    # they queue their events and the router replies when the batch is journaled, with no task
    # per message (see troupe.runtime.core.router). Decoding errors raise before anything is
    # queued, and are answered like any handler's.

    def _owner_beat(self, payload: Any) -> Answer:
        self.run_owners.beat(OwnerControl.decode("owner_beat", payload).owner)
        return Answer.now(True)

    def _owner_gone(self, payload: Any) -> Answer:
        self.run_owners.gone(OwnerControl.decode("owner_gone", payload).owner)
        return Answer.now(True)

    def _owner_seen(self, payload: Any) -> Answer:
        owner = OwnerControl.decode("owner_seen", payload).owner
        owners = self.run_owners
        return Answer.now({"silent_s": owners.silent_s(owner), "heard": owners.heard(owner)})

    def _ping(self, _: Any) -> Answer:
        return Answer.now({"master": self.config.name, "pid": os.getpid(), "time": self.wall_clock()})

    def _register_worker(self, payload: Any) -> Answer:
        m = RegisterWorkerControl.decode(payload)
        worker_id, node, slots = m.worker_id, m.node, m.slots
        resources = Resources(m.cpu, m.gpu)
        kinds = sorted(set(m.kinds))
        self.dispatcher.unpark(worker_id)
        joined = self.dispatcher.put(
            WorkerJoined(worker_id, node, resources, slots, frozenset(kinds), m.prefetch)
        )

        def registered(reply: list[Command]) -> dict[str, Any]:
            raise_rejected(reply)
            self._workers[worker_id] = _WorkerEntry(
                node, m.endpoint, m.pid, slots, resources, kinds, process=m.process
            )
            log.info(
                "worker_joined", worker=worker_id, node=node, slots=slots, gpu=resources.gpu,
                kinds=kinds or "any",
            )  # fmt: skip
            return {"ok": True, "master": self.config.name}

        return Answer(joined, registered)

    def _entry(self, worker_id: str) -> _WorkerEntry:
        entry = self._workers.get(worker_id)
        if entry is None:
            raise UnknownWorker(
                f"master {self.config.name} does not know worker {worker_id!r}; "
                "register it first (register_worker)"
            )
        return entry

    def _request_task(self, payload: Any) -> Answer:
        m = RequestTaskControl.decode(payload)
        entry = self._entry(m.worker_id)
        unseen = self._return_unseen(m.worker_id, entry, m.held, m.sync) if m.held is not None else []
        wait_s = min(m.wait_s, self.config.max_wait_s)
        # queued after the returns: the book has the tasks back before it answers the request
        future = self.dispatcher.put_request(m.worker_id, m.free_slots, wait_s, entry.signature)
        track = m.held is not None

        def granted(reply: list[Command]) -> dict[str, Any]:
            raise_rejected(reply)
            leases = _leases(reply, self.wall_clock())
            self.dispatched += len(leases)
            if track:
                entry.granted.update((lease["lease_id"], lease["task_id"]) for lease in leases)
            return {"leases": leases}

        if not unseen:
            return Answer(future, granted)

        def returned(replies: list[list[Command]]) -> dict[str, Any]:
            for ((task_id, lease_id), _), reply in zip(unseen, replies, strict=False):
                if any(isinstance(c, Ack) and str(c.outcome) == "returned" for c in reply):
                    self._count_stale("lease", "unseen", m.worker_id, task_id, lease_id)
            return granted(replies[-1])

        return _after_all([*(f for _, f in unseen), future], returned)

    def _return_unseen(
        self, worker_id: str, entry: _WorkerEntry, held: frozenset[int], sync: bool = False
    ) -> list[tuple[tuple[str, int], asyncio.Future[list[Command]]]]:
        """Put back the tasks of leases whose reply never reached the worker; return the
        queued returns (their futures say whether each went back).

        A worker asks for tasks one request at a time, and runs what a reply leases it before
        asking again; so a lease granted in reply to an earlier request that it does not hold
        now was never received: the reply was lost or came after the worker gave up waiting
        (a link cut while the request was held). Without this the task would wait for the
        lease to expire, and the worker, its slot taken in the book, would idle as long. The
        task goes back without an attempt counted; a lease the worker ran and reported since
        is ignored by the book.

        With ``sync`` the worker says a reply to one of its reports was lost, with the leases
        its piggybacked request got (the master paused past the report's timeout, say): then
        every lease the book has it hold and ``held`` lacks goes back. Not otherwise: a report's
        reply may be on its way while the worker asks (it sends ``sync`` only with none out).
        """
        lost = {**entry.granted, **self.book.leases_of(worker_id)} if sync else entry.granted
        unseen = []
        for lease_id, task_id in lost.items():
            if lease_id not in held:
                event = Decline(
                    worker_id, task_id, lease_id, "the lease never reached the worker", unseen=True
                )
                unseen.append(((task_id, lease_id), self.dispatcher.put(event)))
        entry.granted.clear()
        return unseen

    def _renew(self, payload: Any) -> Answer:
        m = RenewControl.decode(payload)
        pairs = ((m.task_id, m.lease_id), *m.more)
        # queued back to back: one batch, one journal transaction for all the worker holds
        futures = [self.dispatcher.put(Renew(m.worker_id, task_id, lease_id)) for task_id, lease_id in pairs]

        def renewed(replies: list[list[Command]]) -> dict[str, Any]:
            answers = [
                {"lease_id": lease_id, **self._renewed(m.worker_id, task_id, lease_id, reply)}
                for (task_id, lease_id), reply in zip(pairs, replies, strict=True)
            ]
            first = answers[0]
            del first["lease_id"]
            if m.more:
                first["more"] = answers[1:]
            return first

        return _after_all(futures, renewed)

    def _renewed(self, worker_id: str, task_id: str, lease_id: int, reply: list[Command]) -> dict[str, Any]:
        for command in reply:
            if isinstance(command, Ack) and command.deadline is not None:
                return {"outcome": str(command.outcome), "ttl": command.deadline - self.wall_clock()}
            if isinstance(command, Reject):
                self._count_stale("renew", "rejected", worker_id, task_id, lease_id)
                return {"outcome": "rejected", "reason": command.reason}
        return {"outcome": "rejected", "reason": "no answer from the task book"}

    def _count_stale(self, report: str, outcome: str, worker_id: str, task_id: str, lease_id: int) -> None:
        key = f"{report}_{outcome}"
        self._stale[key] = self._stale.get(key, 0) + 1
        log.info("stale_report_dropped", report=report, outcome=outcome, worker=worker_id,
                 task_id=task_id, lease_id=lease_id)  # fmt: skip

    def stale_reports(self) -> dict[str, int]:
        """Reports and renewals dropped as stale, by ``<report>_<outcome>`` (e.g.
        ``complete_duplicate``: a copy cut off from the master finished a task done since)."""
        return dict(self._stale)

    def _complete(self, payload: Any) -> Answer:
        m = ReportControl.decode("complete", payload)
        event = Complete(m.worker_id, m.task_id, m.lease_id, m.result_ref, m.run_s)
        return self._report(event, m)

    def _fail(self, payload: Any) -> Answer:
        m = ReportControl.decode("fail", payload)
        return self._report(Fail(m.worker_id, m.task_id, m.lease_id, m.error, m.traceback), m)

    def _decline(self, payload: Any) -> Answer:
        m = ReportControl.decode("decline", payload)
        event = Decline(m.worker_id, m.task_id, m.lease_id, m.reason, given_back=m.given_back)
        entry = self._workers.get(event.worker_id)
        if entry is not None and m.kind and not m.given_back:  # nor will the book lease it that kind
            entry.declined = entry.declined | {m.kind}
        return self._report(event, m)

    def _report(self, event: Complete | Fail | Decline, m: ReportControl) -> Answer:
        entry = self._workers.get(event.worker_id)
        if entry is None or m.request <= 0:
            future = self.dispatcher.put(event)
        else:
            # The report and the next request in one entry of one batch: one fsync covers the
            # report and the next lease, and the reply carries both.
            future = self.dispatcher.put_report(event, event.worker_id, m.request)
        known = entry is not None
        return Answer(future, lambda reply: self._reported(event, m, known, reply))

    def _reported(
        self, event: Complete | Fail | Decline, m: ReportControl, known: bool, reply: list[Command]
    ) -> dict[str, Any]:
        """The reply to a report: its outcome, and the leases its piggybacked request got."""
        leases = _leases(reply, self.wall_clock())
        self.dispatched += len(leases)
        out: dict[str, Any] = {"leases": leases, "known": known}
        for command in reply:
            if isinstance(command, Ack):
                out["outcome"] = str(command.outcome)
                if str(command.outcome) == "committed":
                    self.ops.task_done()
            elif isinstance(command, Reject):
                out["outcome"], out["reason"] = "rejected", command.reason
        if out.get("outcome") in ("duplicate", "ignored", "rejected"):
            self._count_stale(m.control, out["outcome"], event.worker_id, event.task_id, event.lease_id)
        return out

    def _node_beat(self, payload: Any) -> Answer:
        m = NodeBeatControl.decode(payload)
        processes = (
            None
            if m.processes is None
            else {name: ProcessEntry(endpoint, actors) for name, (endpoint, actors) in m.processes.items()}
        )
        if self.nodes.beat(m.node, m.endpoint, m.resources, self.clock(), processes):
            log.info("node_joined", node=m.node, endpoint=m.endpoint)
        self.nodes.set_log_endpoint(m.node, m.log_endpoint)
        self.nodes.set_tags(m.node, m.tags)
        self.nodes.set_code(m.node, m.code)
        return Answer.now({"ok": True, "master": self.config.name})

    def _resolve(self, payload: Any) -> Answer:
        """The cluster's directory: a node asks where an actor of another node listens."""
        full, endpoint = self.nodes.resolve(ResolveControl.decode(payload).address)
        return Answer.now({"address": str(full), "endpoint": endpoint})

    async def _worker_left(self, payload: Any) -> bool:
        m = WorkerLeftControl.decode(payload)
        worker_id, pid = m.worker_id, m.pid
        entry = self._workers.get(worker_id)
        if entry is None:
            return False
        if pid and entry.pid and pid != entry.pid:  # a newer incarnation registered already
            self._stale["worker_left_stale"] = self._stale.get("worker_left_stale", 0) + 1
            log.info(
                "stale_report_dropped", report="worker_left", worker=worker_id, pid=pid, current_pid=entry.pid
            )
            return False
        del self._workers[worker_id]
        self.dispatcher.unpark(worker_id)
        await self.dispatcher.handle(WorkerLeft(worker_id, m.reason))
        log.info("worker_left_master", worker=worker_id, reason=m.reason)
        return True

    async def _node_dead(self, payload: Any) -> bool:
        node = NodeControl.decode("node_dead", payload).node
        self.nodes.mark_dead(node)
        await self._node_gone(node)
        return True

    def workers(self) -> dict[str, dict[str, Any]]:
        """Return the registered workers as plain data (node, endpoint, slots, kinds)."""
        return {
            w: {
                "node": e.node,
                "endpoint": e.endpoint,
                "slots": e.slots,
                "cpu": e.resources.cpu,
                "gpu": e.resources.gpu,
                "kinds": e.kinds,
                "process": e.process,
            }
            for w, e in self._workers.items()
        }

    async def _shutdown(self, _: Any) -> bool:
        self.stop()
        return True


def _after_all(futures: list[asyncio.Future[list[Command]]], then: Callable[[list[Any]], Any]) -> Answer:
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


def _leases(reply: list[Command], now: float) -> list[dict[str, Any]]:
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
