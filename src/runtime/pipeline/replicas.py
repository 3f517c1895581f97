"""The engine's replicas: where each starts (``hosts``), when it is replaced or retired, how the
scaler moves slots between stages, and what a node's death does to the replicas it ran.

:class:`ReplicaPool` is the part of :class:`~troupe.runtime.pipeline.engine.PipelineEngine` that
manages them, and the base of its other parts; the engine's item flow calls into it and it into
that flow (``_lose_outputs``, answered in ``lost_holders.py``).
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable
from typing import Any

import anyio
import anyio.abc

from troupe.runtime.core.runtime import Runtime
from troupe.runtime.errors import (
    ActorStopped,
    AskTimeout,
    ConfigError,
    MailboxFull,
    PeerLost,
    StageFailed,
    TroupeError,
    UnknownMessageType,
    Unreachable,
)
from troupe.runtime.library_logging import get_logger
from troupe.runtime.owned_controls import OwnedControls, spawn_owner
from troupe.runtime.owner_beat import OwnerBeat
from troupe.runtime.placement import Host
from troupe.runtime.worker_stop import stop_on_node

from .call_fit import said_receives
from .config import PipelineConfig
from .handoff import OUTBOX_CLASS
from .hosts import EngineHosts, NoNodeNow, given_up
from .model import ScaleInput, decide_scaling
from .records import Replica, StageState, node_of
from .replica_stage_info import stage_info
from .source import ItemSource, send_unanswered

__all__ = ["ReplicaPool"]

log = get_logger(__name__)

_START_S = 120.0  # a replica's process start (torch imports on a busy machine take a while)
_SLOW_START_S = 30.0  # a start still going after this long is said, and again as often
_WATCH_S = 1.0  # how often each node is asked whether the replicas' workers still run
# A replica whose call's connection ended (PeerLost) is looked for at once, then this often, for
# this long at most: its node may not have reaped the worker yet, and a process that still runs
# after its connection dropped is no death.
_SUSPECT_S = 0.1
_SUSPECT_FOR_S = 5.0
_START_RETRIES = 12  # starts in a row that may pass (below) a stage tries before the run fails
_RETRY_FIRST_S = 0.5  # the pause before the first try again; it doubles each time, up to
_RETRY_MAX_S = 8.0  # about 70 s in all: time for a master or a node to restart
_AVOID_S = 10.0  # a node that failed to start one gets no replica that long while another fits


def _may_pass(exc: BaseException) -> bool:
    """A replica's start failed in a way a later try may not: its node stopping (ActorStopped),
    a node or the master not answering (a restart, a busy machine). A worker that exits while
    starting, a class that is no stage, a name taken: the same every time."""
    return isinstance(exc, (ActorStopped, AskTimeout, Unreachable, MailboxFull, NoNodeNow))


class ReplicaPool:
    """Starts, replaces, scales and stops a pipeline's replicas (a part of the engine)."""

    config: PipelineConfig
    runtime: Runtime
    hosts: EngineHosts
    stages: list[StageState]
    placement: dict[str, str]
    scale_log: list[tuple[float, str, int, str]]
    _direct: bool
    _tg: anyio.abc.TaskGroup | None
    _changed: anyio.Event
    _ids: itertools.count[int]
    _created: float
    _fatal: StageFailed | None
    _wanted_before: set[str]
    _finishing: bool
    _launched: dict[str, Host]
    _controls: OwnedControls  # spawn_worker and stop_worker, naming this run's process
    _stop_waits: set[anyio.CancelScope]  # the stops asked of nodes, waiting for their answers
    _suspects: dict[Replica, float]  # replicas whose connection ended, and since when
    _look_now: anyio.Event
    _asking: int  # items a stage that commits outputs is asked about: none drained till answered
    source: ItemSource
    on_event: Callable[[str], None] | None
    nodes_outlive_run: bool
    owner_beat: OwnerBeat | None

    def _lose_outputs(self, replica: Replica) -> None:
        """What ``replica`` held is gone: the engine's item flow restarts those items."""

    def replica_status(self) -> list[dict[str, Any]]:
        """Each replica: its stage, its node, the items it has in calls and the outputs it holds."""
        return [
            {
                "stage": stage.cfg.name,
                "replica": r.name,
                "node": node_of(r),
                "busy": r.busy,
                "held": r.held,
                "state": "lost" if r.lost else "retiring" if r.retiring else "serving",
            }
            for stage in self.stages
            for r in stage.replicas
        ]

    def _spawn(self, stage: StageState) -> None:
        assert self._tg is not None
        stage.starting += 1
        self._tg.start_soon(self._start_replica, stage, self._replica_name(stage))

    def _replica_name(self, stage: StageState) -> str:
        return f"{self.config.name}-{stage.cfg.name}-{next(self._ids)}"

    async def _start_replica(self, stage: StageState, name: str) -> None:
        actors = [{"name": "stage", "class": stage.cfg.actor, "kwargs": dict(stage.cfg.kwargs)}]
        if self._direct:  # it hands over what it holds, and hears of holders that are gone
            actors.append({"name": "outbox", "class": OUTBOX_CLASS, "kwargs": {}})
        spec: dict[str, Any] = {"name": name, "kind": stage.cfg.name, "actors": actors}
        address = getattr(self.runtime, "address", None)
        if self.config.max_message_mb is not None:
            spec["max_message_mb"] = self.config.max_message_mb
        spawned = False
        host: Host | None = None
        asked: float | None = None
        try:
            res = stage.cfg.resources
            # On one host (no master) the stage's needs place nothing: the run said so as it
            # started (resource_notes.py), and its one node takes every replica.
            cluster = self.hosts.master is not None
            host = self.hosts.pick(
                stage.cfg.name, res.tags, res.gpu if cluster else 0, res.cpu if cluster else 0
            )
            # Counted as launched from the request on: a run cancelled while the node starts it
            # tells the node to stop it (``_stop_all``), which the node does once it has started.
            # Not a shielded wait for the answer: a cancelled run's runtime reads no answers.
            self._launched[name] = host
            # The nodes stop the replicas of a run that is gone (killed): by pinging it, or,
            # where they cannot reach it, by asking the master it beats to (owner_beat.py).
            owner = spawn_owner(host.endpoint, address, self.owner_beat) if self.nodes_outlive_run else None
            if owner is not None:  # a node of this host stops them at once once this process is gone
                spec = self._controls.named({**spec, "owner": owner})
            # A worker that exits while starting (its class does not import) is answered at once.
            asked = time.monotonic()
            watch = anyio.CancelScope()
            assert self._tg is not None
            with anyio.CancelScope() as spawning:  # cancelled once the master has the node as dead
                self._tg.start_soon(self._watch_start, stage, name, host, asked, watch, spawning)
                try:
                    record = await self._controls.ask(
                        host.endpoint, "spawn_worker", {**spec, "timeout_s": _START_S}, _START_S + 10
                    )
                finally:
                    watch.cancel()
            if spawning.cancelled_caught:
                raise Unreachable(
                    f"node {host.name} left the cluster (the master has it as dead) before it "
                    f"answered 'spawn_worker' for {name}"
                )
            spawned = True
            incarnation = record.get("incarnation") if isinstance(record, dict) else None
            node, outbox_at = _taught(self.runtime, name, record)
            ref = self.runtime.ref(f"{node}/{name}/stage" if node else f"{name}/stage")
            process_key = f"{node or host.name}/{name}"
            info = await stage_info(
                ref, lambda: self.runtime.directory.forget_process(process_key), stage=stage.cfg.name
            )
            stage.hooks = tuple(str(h) for h in (info or {}).get("hooks", ()))
        except (TroupeError, ConfigError) as exc:
            if host is not None:
                self.hosts.gone(stage.cfg.name, host)
                if not spawned and isinstance(exc, (ActorStopped, PeerLost)):  # the node stops
                    self.hosts.stopping(host)
            # A worker that took its whole start time (an import that hangs) would take it again.
            hung = not spawned and asked is not None and time.monotonic() - asked >= _START_S
            if _may_pass(exc) and not hung and stage.start_failures < _START_RETRIES:
                await self._start_again(stage, name, host, exc, spawned)
                return
            stage.starting -= 1
            why = str(exc)
            if isinstance(exc, UnknownMessageType):
                why = f"{stage.cfg.actor} is not a StageActor ({exc})"
            elif isinstance(exc, NoNodeNow):
                why = given_up(why, stage.start_failures + 1)
            log.error("replica_start_failed", stage=stage.cfg.name, replica=name, error=why)
            # Said before the stop below is awaited: no item may move while it runs.
            if not stage.ready() and not stage.starting:  # nothing left to run the stage's items
                where = f"{name} on node {host.name}" if host is not None and self.hosts.master else name
                self._fatal = StageFailed(f"stage {stage.cfg.name}: replica {where} could not start: {why}")
            self._changed.set()
            if spawned:  # its process runs but cannot serve the stage: stop it, it is no replica
                await self._stop_worker(name, host)
            else:  # the node started nothing (or stopped it itself, past its start timeout)
                self._launched.pop(name, None)
            return
        stage.starting -= 1
        stage.start_failures = 0
        stage.replicas.append(
            Replica(
                name,
                ref,
                host=host,
                incarnation=incarnation if type(incarnation) is int else None,
                node=node,
                outbox_at=outbox_at,
                receives=said_receives(info),
            )
        )
        self.placement[name] = host.name
        log.info("replica_placed", stage=stage.cfg.name, replica=name, node=host.name)
        assert stage.meter is not None
        stage.meter.set_replicas(len(stage.ready()), time.monotonic())
        self.scale_log.append(
            (time.monotonic() - self._created, stage.cfg.name, len(stage.ready()), "started")
        )
        self._changed.set()

    async def _watch_start(
        self,
        stage: StageState,
        name: str,
        host: Host,
        asked: float,
        scope: anyio.CancelScope,
        spawning: anyio.CancelScope,
    ) -> None:
        """While a replica starts on ``host`` (until ``scope`` is cancelled): its spawn
        (``spawning``) ends once the master has the node as dead, and it is said every
        ``_SLOW_START_S``. A node that stopped after its connection had ended answers nothing,
        and the spawn sent to it waited out its whole deadline (130 s), said as slow imports."""
        with scope:
            async with anyio.create_task_group() as tg:
                tg.start_soon(self._say_slow_start, stage, name, host, asked)
                await self.hosts.left(host)
                spawning.cancel()
                tg.cancel_scope.cancel()

    async def _say_slow_start(self, stage: StageState, name: str, host: Host, asked: float) -> None:
        """Every ``_SLOW_START_S`` while a replica starts, a line for people: a constructor that
        waits (for a device, a licence server) looked like a run that hangs, silently. Its node
        is asked first: one that does not answer is said, not the replica's imports."""
        while True:
            await anyio.sleep(_SLOW_START_S)
            starting = f"replica {name} of stage {stage.cfg.name} has been starting for"
            try:
                await self.runtime.control(host.endpoint, "supervision", None, timeout=_WATCH_S * 5)
                why, until = "(its imports or its constructor);", ""
            except TroupeError as exc:
                why = (
                    f"on node {host.name}, which does not answer at {host.endpoint} ({type(exc).__name__}): "
                    "it stopped, or is unreachable from here;"
                )
                until = " once the master has the node as dead, or"
            waited = time.monotonic() - asked
            log.warning("replica_start_slow", stage=stage.cfg.name, replica=name, waited_s=waited, why=why)
            if self.on_event is not None:
                self.on_event(f"{starting} {waited:.0f} s {why} it is given up{until} at {_START_S:.0f} s")

    async def _start_again(
        self, stage: StageState, name: str, host: Host | None, exc: TroupeError, spawned: bool
    ) -> None:
        """A start that failed in a way that may pass (a node stopping, a master restarting, a
        node too busy to answer) is tried again, elsewhere if another node fits, after a pause
        that doubles each time; the stage counts it as starting meanwhile, so the run goes on."""
        stage.start_failures += 1
        delay = min(_RETRY_MAX_S, _RETRY_FIRST_S * 2 ** (stage.start_failures - 1))
        where = f" on node {host.name}" if host is not None and self.hosts.master else ""
        line = (
            f"replica {name} of stage {stage.cfg.name} could not start{where} ({type(exc).__name__}: "
            f"{exc}); trying again in {delay:g} s ({stage.start_failures}/{_START_RETRIES})"
        )
        log.warning("replica_start_retried", stage=stage.cfg.name, replica=name, error=str(exc), in_s=delay)
        if self.on_event is not None:
            self.on_event(line)
        if host is not None:
            self.hosts.avoid(host, _AVOID_S)
        if spawned:  # its process runs but did not come up as a replica: stop it
            await self._stop_worker(name, host)
        else:
            self._launched.pop(name, None)
        assert self._tg is not None
        self._tg.start_soon(self._start_later, stage, delay)

    async def _start_later(self, stage: StageState, delay: float) -> None:
        await anyio.sleep(delay)
        await self._start_replica(stage, self._replica_name(stage))

    def _replace(self, stage: StageState, replica: Replica, given_up: bool = False) -> None:
        """A replica failed under a call: stop using it, stop its worker, start another.
        ``given_up``: its calls were given up already (``_lose``)."""
        assert self._tg is not None
        if replica.retiring:
            return
        self._mark_retiring(stage, replica)
        if not given_up:
            # Its other calls only waited behind the one that failed: they would wait for a reply
            # that cannot come (its process exited, as by sys.exit, or hangs) as long as a call may.
            replica.give_up(f"it failed under an earlier call ({replica.name} is replaced)", working=False)
        self._lose_outputs(replica)  # stopped, it takes what it held with it
        self._tg.start_soon(self._retire, stage, replica)
        self._spawn(stage)

    def _lose(self, stage: StageState, replica: Replica, event: str, why: str, **fields: Any) -> None:
        """``replica`` no longer serves (``why``): its calls end as failed (their items are
        retried), what it held runs again, and another replica starts on a live node."""
        if replica.retiring:
            return
        log.warning(event, stage=stage.cfg.name, replica=replica.name, why=why, **fields)
        replica.give_up(why)
        self._replace(stage, replica, given_up=True)

    def suspect(self, replica: Replica) -> None:
        """The connection of a call to ``replica`` ended (PeerLost): its process died, most
        likely. Its node is asked at once, and every ``_SUSPECT_S`` while in doubt."""
        self._suspects.setdefault(replica, time.monotonic())
        self._look_now.set()

    async def _worker_loop(self) -> None:
        """A replica whose worker died (and maybe was restarted by its node, empty, at another
        endpoint) is replaced: each node is asked every ``_WATCH_S`` for its workers' records,
        without asking any worker (``supervision``: a hung one does not slow it); sooner for a
        replica a call's ended connection made suspect (:meth:`suspect`)."""
        while True:
            fresh = time.monotonic() - _SUSPECT_FOR_S
            self._suspects = {r: t for r, t in self._suspects.items() if not r.retiring and t > fresh}
            with anyio.move_on_after(_SUSPECT_S if self._suspects else _WATCH_S):
                await self._look_now.wait()
            self._look_now = anyio.Event()
            by_host: dict[str, tuple[Host, list[tuple[StageState, Replica]]]] = {}
            for stage in self.stages:
                for replica in stage.replicas:
                    host = replica.host
                    if host is not None and not replica.retiring and host.name in self.hosts.alive:
                        by_host.setdefault(host.name, (host, []))[1].append((stage, replica))
            for host, replicas in by_host.values():
                await self._check_workers(host, replicas)

    async def _check_workers(self, host: Host, replicas: list[tuple[StageState, Replica]]) -> None:
        try:
            reply = await self.runtime.control(host.endpoint, "supervision", None, timeout=_WATCH_S * 5)
        except TroupeError:
            return  # its node is busy, or dying: the master's view of its nodes decides that
        workers = reply.get("workers", ()) if isinstance(reply, dict) else ()
        records = {str(w.get("name")): w for w in workers if isinstance(w, dict)}
        for stage, replica in replicas:
            why = _worker_gone(records.get(replica.name), replica.incarnation)
            if why is not None:
                self._lose(stage, replica, "replica_worker_lost", why)
                self._changed.set()

    async def _node_loop(self) -> None:
        """A node that left the cluster took its replicas: their calls end as failed (their
        items are retried), what they held runs again, and others start on live nodes."""
        while True:
            await self.hosts.changed.wait()
            alive = self.hosts.alive
            for stage in self.stages:
                for replica in list(stage.replicas):
                    if replica.host is not None and replica.host.name not in alive:
                        why = f"its node {replica.host.name} left the cluster"
                        self._lose(stage, replica, "replica_node_lost", why, node=replica.host.name)
            self._changed.set()

    def _mark_retiring(self, stage: StageState, replica: Replica) -> None:
        replica.retiring = True  # from now on it is given no work
        assert stage.meter is not None
        stage.meter.set_replicas(len(stage.ready()), time.monotonic())

    async def _retire(self, stage: StageState, replica: Replica) -> None:
        with anyio.fail_after(600):
            while replica.busy:  # its last call is still running; it ends on its own
                await anyio.sleep(0.02)
        # What that call made is held here until the next stage has settled it (or it runs
        # again, this replica lost meanwhile: held is then 0). Stopped before, the next stage's
        # pull of it waited on a process that was gone, and the run stalled until the lease.
        while replica.held and not replica.lost:
            await anyio.sleep(0.02)
        self.scale_log.append(
            (time.monotonic() - self._created, stage.cfg.name, len(stage.ready()), "retired")
        )
        await self._let_go(stage, replica)

    async def _let_go(self, stage: StageState, replica: Replica) -> None:
        """Stop a retiring replica's worker and give its place on its node back."""
        if replica in stage.replicas:
            stage.replicas.remove(replica)
        await self._stop_worker(replica.name, replica.host)
        if replica.host is not None:
            self.hosts.gone(stage.cfg.name, replica.host)  # a finalize replica may go there
        self._changed.set()

    async def _scale_loop(self) -> None:
        while True:
            await anyio.sleep(self.config.scale_interval_s)
            self._scale_once()

    def _drained(self, stage: StageState) -> bool:
        up = self.config.upstream(stage.index)
        upstream_done = self.source.exhausted() if up is None else (self._drained(self.stages[up]))
        idle = not stage.queue and all(r.busy == 0 for r in stage.replicas)
        # an item asked about (committed_check.py) may be retried yet: its stage keeps a replica
        return upstream_done and idle and not self._asking

    def _scale_once(self) -> None:
        assert self._tg is not None
        if self._finishing:
            return
        inputs = [
            ScaleInput(
                s.cfg.name,
                len(s.ready()),
                s.starting,
                s.cfg.min_replicas,
                s.cfg.most,
                len(s.queue),
                sum(r.busy for r in s.replicas),
                self._drained(s),
            )
            for s in self.stages
        ]
        decisions = decide_scaling(inputs, self.config.slot_budget)
        # Growing costs a process start (seconds of CPU for torch): only grow for a backlog
        # seen on two looks in a row. Giving back drained slots needs no such patience.
        wanted = {d.stage for d in decisions if d.delta > 0}
        confirmed = wanted & self._wanted_before
        self._wanted_before = wanted
        for decision in decisions:
            if decision.delta > 0 and decision.stage not in confirmed:
                continue
            stage = next(s for s in self.stages if s.cfg.name == decision.stage)
            if decision.delta > 0:
                log.info("stage_scaled", stage=decision.stage, delta=decision.delta, reason=decision.reason)
                for _ in range(decision.delta):
                    self._spawn(stage)
            else:
                # One that holds outputs for the next stage stays until they are taken (logged
                # only when one goes: a drained stage that holds is asked again every look).
                free = [r for r in stage.ready() if not r.held]
                idle = sorted(free, key=lambda r: r.busy)[: -decision.delta]
                if idle:
                    log.info("stage_scaled", stage=decision.stage, delta=-len(idle), reason=decision.reason)
                for replica in idle:
                    self._mark_retiring(stage, replica)
                    self._tg.start_soon(self._retire, stage, replica)

    def _stop_unhooked(self) -> None:
        """Every item has its outcome: the replicas of the stages without a ``finalize`` hook
        stop now, while the hooks run, rather than after them (their exits, a torch
        interpreter's among them, were most of a run's stop)."""
        assert self._tg is not None
        for stage in self.stages:
            if "finalize" in stage.hooks:
                continue
            for replica in stage.replicas:
                replica.retiring = True  # no watch takes its exit for a loss
                self._tg.start_soon(self._let_go, stage, replica)

    async def _stop_all(self, cancelled: bool = False) -> None:
        """Stop every worker the run started and has not stopped: the replicas, and those a
        cancelled run left between their start and their place in a stage or being retired.

        ``cancelled``: the run is being cancelled, and its runtime reads no more replies (its
        tasks are cancelled with it): each node is told, and nobody waits for its answer.
        """
        # All at once: a replica's exit (a torch interpreter's teardown: seconds) need not wait
        # for the one before it. A stop of the run that comes meanwhile (Ctrl-C once the
        # finalize hooks returned) ends the waits: the run's runtime reads no more replies, and
        # each would have waited out its 30 s; the nodes stop the workers they were told to.
        async with anyio.create_task_group() as watching:
            watching.start_soon(self._end_stop_waits_if_stopped)
            with anyio.CancelScope(shield=True):
                async with anyio.create_task_group() as tg:
                    for name, host in list(self._launched.items()):
                        tg.start_soon(self._stop_worker, name, host, cancelled)
                    for stage in self.stages:
                        stage.replicas.clear()
            watching.cancel_scope.cancel()

    async def _end_stop_waits_if_stopped(self) -> None:
        """Until cancelled: by the run's stop, which ends the waits for the nodes' answers, or
        as the stops are all answered, when none is left to end."""
        try:
            await anyio.sleep_forever()
        finally:
            self._stop_waits_end()

    async def _stop_worker(self, name: str, host: Host | None, unanswered: bool = False) -> None:
        """Stop this run's worker ``name`` on ``host``. The stop names this run's process: one
        that reached the node late, after another run there started a worker of the name,
        leaves that one alone (``node/stop_owners.py``)."""
        self._launched.pop(name, None)
        if host is None or host.name not in self.hosts.alive:
            return  # its node is gone, and its processes with it
        if unanswered:  # the node stops the worker without us
            payload = self._controls.for_node(host.endpoint, self._controls.named({"name": name}))
            await send_unanswered(self.runtime, host.endpoint, "stop_worker", payload)
            return
        given_up: str | None = None
        with anyio.CancelScope(shield=True) as waiting:
            self._stop_waits.add(waiting)
            try:
                given_up = await stop_on_node(self._controls, name, host, self.hosts.left)
            except TroupeError as exc:
                log.warning("replica_stop_failed", replica=name, error=str(exc))
            finally:
                self._stop_waits.discard(waiting)
        if given_up is not None:  # dead, or dying: it takes its workers with it
            log.warning("replica_stop_given_up", replica=name, node=host.name, why=given_up)
        if waiting.cancelled_caught:
            log.info("replica_stop_unanswered", replica=name, reason="the run stopped before its node said")

    def _stop_waits_end(self) -> None:
        """The run stops (Ctrl-C, a failure): the stops asked of nodes are not waited for any
        more (each node stops the worker it was told to, or is gone with it)."""
        for waiting in list(self._stop_waits):
            waiting.cancel()


# A worker's state in its node's record, as it reads after "its worker" (else "is STATE").
_STATE_WORDS = {"exited": "has exited", "stopped": "was stopped", "failed": "has failed"}


def _worker_gone(record: Any, incarnation: int | None) -> str | None:
    """Why the worker of a replica no longer serves it (None: it does)."""
    if not isinstance(record, dict):
        return "its node no longer knows its worker"
    state = record.get("state")
    if state != "running":
        became = _STATE_WORDS.get(str(state), f"is {state}")
        return f"its worker {became} ({record.get('exit') or 'no exit recorded'})"
    if incarnation is not None and record.get("incarnation") != incarnation:
        # No incarnation number: the run's report groups its dead items by this text, and two
        # replicas restarted a different number of times split one cause into two lines.
        exit_was = f" after it exited ({record['exit']})" if record.get("exit") else ""
        return f"its worker was restarted{exit_was}, without what it held"
    return None


def _taught(runtime: Runtime, name: str, record: Any) -> tuple[str, str]:
    """The node's name and the worker's outbox endpoint ("" for either it lacks) from the
    node's answer to ``spawn_worker``, with the worker's actors' endpoints taught to
    ``runtime``'s directory. A node of an older troupe answers before the cluster's directory
    (the master) hears of the worker, with the node's next beat, up to a second later: asked
    first, it made every replica a run started on a cluster wait for that beat (a node of now
    beats before it answers; learning here still spares the run a look-up)."""
    node = record.get("node") if isinstance(record, dict) else None
    endpoints = record.get("actor_endpoints") if isinstance(record, dict) else None
    if not isinstance(node, str) or not node or not isinstance(endpoints, dict):
        return "", ""
    if not isinstance(endpoints.get("stage"), str):
        return "", ""
    for actor, endpoint in endpoints.items():
        if isinstance(actor, str) and isinstance(endpoint, str):
            runtime.directory.learn(f"{node}/{name}/{actor}", endpoint)
    outbox = endpoints.get("outbox")
    return node, outbox if isinstance(outbox, str) else ""
