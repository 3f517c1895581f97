"""One training run's workers on the cluster: the encoder actors and trainer ranks placed on
their hosts and spawned through each host's node, the ranks started and polled to the end, and
all of them started again from the latest committed checkpoint when one is lost (at most
``train.max_restarts`` times). On a master's cluster, an encoder whose node dies is started again
on a live node while the ranks train (``_watch_encoders``); it restarts no rank. Where its node
was only cut off and answers again, the encoder it kept is stopped there (``_watch_left_behind``).

The workers have the same names in every run (``w-train-rank-0``...). Their spawns and stops
name the run's process (``runtime/owned_controls.py``): a node leaves a rerun's rank alone when a
late stop of an earlier run reaches it. On a master's cluster, whose nodes outlive the run, the
spawns also name the run their owner (its runtime where the node can ping it back, else its token
at the master it beats to, ``runtime/owner_beat.py``): a node stops the ranks and encoders of a
run that was killed, as it stops a killed pipeline run's replicas, and a rerun takes their names."""

from __future__ import annotations

import contextlib
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import anyio

from troupe.actors.encoders.latent_cache import DISK_RESERVE
from troupe.runtime import TroupeError, UnknownActor
from troupe.runtime.core.runtime import Runtime
from troupe.runtime.library_logging import get_logger
from troupe.runtime.owned_controls import OwnedControls, spawn_owner
from troupe.runtime.owner_beat import OwnerBeat
from troupe.runtime.placement import Host, place
from troupe.runtime.worker_stop import node_silent

from .encoder_figures import ask_encoders, not_stored_line, rank_asks
from .lost_nodes import live_hosts, moves, silent_nodes
from .master_silence import watch_master
from .train_cluster import stop_worker
from .train_datagen import run_datagen, wait_episodes
from .train_result import (
    TrainingFailed,
    TrainProgress,
    TrainRunResult,
    committed_checkpoints,
    committed_steps,
    rank_timings,
)
from .worker_addresses import WorkerAddresses

__all__ = ["ENCODER_CLASS", "TRAINER_CLASS", "Rank", "TrainDriver", "restart_line"]

log = get_logger(__name__)

ENCODER_CLASS = "troupe.actors.encoders.encoder_actor:EncoderActor"
TRAINER_CLASS = "troupe.actors.training.trainer:TrainerActor"

_POLL_S = 0.5
_ASK_S = 20.0
_SPAWN_S = 120.0
_LOST_AFTER_S = 120.0  # a rank that answers nothing this long is restarted as if it answered idle
_PEER_GRACE_S = 30.0  # a rank's failure waits this long for a silent peer: its death may be the cause
_WATCH_S = 2.0  # how often the encoders' nodes are pinged while the ranks train

PROGRESS_EVERY = 10
"""Steps between the run's ``train_progress`` events: the first poll past each multiple of it
(and the last step) is logged."""


def restart_line(restart: int, max_restarts: int, reason: str) -> str:
    """A restart as the run says it (the terminal, and the log's ``train_said``), from the figures
    its ``train_restart`` event logs."""
    return f"{reason}; restarting every rank from the last checkpoint ({restart}/{max_restarts})"


@dataclass
class Rank:
    """One trainer rank: its worker, actor, host, and its last ``progress`` answer."""

    index: int
    worker: str
    actor: str
    host: Host
    last: dict[str, Any] = field(default_factory=dict)
    silent_since: float | None = None


class TrainDriver:
    """The workers of one training run, their starts, polls and restarts.

    ``master``: the master whose nodes run the workers (they outlive the run: the spawns name the
    run their owner); None for a node started in this process, which stops with it.
    """

    def __init__(
        self,
        rt: Runtime,
        cfg: Any,
        out: Path,
        hosts: list[Host],
        say: Callable[[str], None],
        on_progress: Callable[[TrainProgress], None] | None,
        master: str | None = None,
    ) -> None:
        self.rt, self.cfg, self.out, self.say, self.on_progress = rt, cfg, out, say, on_progress
        self.master = master
        self.controls = OwnedControls(rt)  # spawn_worker and stop_worker, naming this process
        self.owner_beat = None if master is None else OwnerBeat(rt, master)
        enc, tr = cfg.encoders, cfg.trainers
        local = cfg.train.local_encoding  # the ranks encode themselves: no encoder actors
        enc_hosts = [] if local else place(enc.count, hosts, enc.tags, enc.gpus, what="encoders")
        rank_hosts = place(tr.ranks, hosts, tr.tags, tr.gpus, what="trainers")
        self.encoders = [(f"train-encode-{i}", f"w-train-encode-{i}", h) for i, h in enumerate(enc_hosts)]
        self.ranks = [Rank(r, f"w-train-rank-{r}", f"train-rank-{r}", h) for r, h in enumerate(rank_hosts)]
        self.spawned: list[tuple[str, Host]] = []
        # Encoders moved off a node that stopped answering, by (worker, that host): its node may
        # only be cut off, holding them; each is stopped there once it answers again.
        self.left_behind: list[tuple[str, Host]] = []
        self.addresses = WorkerAddresses(rt)  # reached through their nodes, not the master
        self._moving = anyio.Lock()  # the encoders' watch and a restart move them one at a time
        self._unplaced: set[str] = set()  # encoders said to have no live node to go to
        self.restarts = 0
        self.resumed_from: int | None = None
        self.first_step = 0
        self.datagen: dict[str, Any] | None = None
        self._said: set[str] = set()  # the ranks' notes said (rank 0's: the LR schedule extended)
        self.step = 0  # rank 0's step, as its last progress said
        self._logged_step = 0  # the step of the last train_progress event
        self._logged_checkpoint: int | None = None  # the step of the last checkpoint logged

    @property
    def placement(self) -> dict[str, str]:
        return {**{a: h.name for a, _, h in self.encoders}, **{r.actor: r.host.name for r in self.ranks}}

    @property
    def to_stop(self) -> list[tuple[str, Host]]:
        """The workers the run's end stops, by (worker, host): those it spawned, and the encoders
        left behind on a node that did not answer again before the end (given up there once it
        does not answer a ping; a node that comes back after the end stops them itself, as the
        workers of a run that is gone, where their spawns named the run their owner)."""
        return [*self.spawned, *self.left_behind]

    # -- workers ----------------------------------------------------------------------------------

    async def _spawn(
        self, worker: str, kind: str, actor: str, cls: str, kwargs: dict[str, Any], host: Host
    ) -> None:
        spec = {"name": worker, "kind": kind, "actors": [{"name": actor, "class": cls, "kwargs": kwargs}]}
        if self.master is not None:
            owner = spawn_owner(host.endpoint, self.rt.address, self.owner_beat)
            spec = spec if owner is None else {**spec, "owner": owner}
        # Named even without an owner: the stops name the process too (see the module).
        spec = self.controls.named({**spec, "timeout_s": _SPAWN_S})
        record = await self.controls.ask(host.endpoint, "spawn_worker", spec, _SPAWN_S + 10)
        self.addresses.learn(worker, record)
        self.spawned.append((worker, host))
        log.info("train_worker_spawned", worker=worker, kind=kind, node=host.name)

    async def _stop_worker(self, worker: str, host: Host) -> None:
        await stop_worker(self.controls, worker, host)
        with contextlib.suppress(ValueError):
            self.spawned.remove((worker, host))

    def _encoder_kwargs(self) -> dict[str, Any]:
        enc = self.cfg.encoders
        kwargs = {
            "encoder": enc.encoder,
            "encoder_kwargs": dict(enc.encoder_kwargs),
            "weights": enc.weights,
            "memory_mb": enc.memory_mb,
            "disk_mb": enc.disk_mb,
            "cache_dir": enc.cache_dir,
            "threads": enc.threads,
            "inline_below_ms": enc.inline_below_ms,
        }
        return {k: v for k, v in kwargs.items() if v is not None}

    def _trainer_kwargs(self) -> dict[str, Any]:
        threads = self.cfg.trainers.threads
        return {} if threads is None else {"threads": threads}

    async def _spawn_encoders(self) -> None:
        kwargs = self._encoder_kwargs()
        async with anyio.create_task_group() as tg:
            for actor, worker, host in self.encoders:
                tg.start_soon(self._spawn, worker, "encoder", actor, ENCODER_CLASS, kwargs, host)

    async def _same_encoders(self) -> None:
        """Refuse encoder actors that compute different functions (their fingerprints differ: a
        factory whose weights are not the same in every process, unseeded): a batch's latents
        would depend on which actor encoded which group, and the run trained on silently.

        Raises:
            TrainingFailed: two fingerprints differ (one line, naming them).
        """
        if len(self.encoders) < 2:
            return
        found = {}
        for actor, _, _ in self.encoders:
            reply = await self._ask_new(actor, "stats", None)
            fingerprint = reply.get("fingerprint") if isinstance(reply, dict) else None
            if isinstance(fingerprint, str):
                found[actor] = fingerprint
        if len(set(found.values())) > 1:
            shown = ", ".join(f"{actor} {fingerprint[:12]}" for actor, fingerprint in found.items())
            raise TrainingFailed(
                f"the encoder actors compute different functions (fingerprints {shown}): "
                f"encoders.encoder = {self.cfg.encoders.encoder!r} builds other weights in each process; "
                "seed them in the factory, or give encoders.weights"
            )

    async def _spawn_rank(self, rank: Rank) -> None:
        await self._spawn(
            rank.worker, "trainer", rank.actor, TRAINER_CLASS, self._trainer_kwargs(), rank.host
        )

    # -- the run ----------------------------------------------------------------------------------

    async def main(self, fresh: bool) -> TrainRunResult:
        async with anyio.create_task_group() as beating:
            if self.owner_beat is not None:  # before the first spawn: it names the run's token
                await self.owner_beat.beat()
                beating.start_soon(self.owner_beat.run)
            try:
                result = await self._main(fresh)
            finally:
                beating.cancel_scope.cancel()  # the workers are stopped (or their stop asked) next
        return result

    async def _main(self, fresh: bool) -> TrainRunResult:
        self.say(
            f"placing {len(self.encoders)} encoder actor(s) and {len(self.ranks)} rank(s): "
            + ", ".join(f"{a} on {n}" for a, n in self.placement.items())
        )
        async with anyio.create_task_group() as tg:
            datagen_done = anyio.Event()
            if self.cfg.datagen is not None:
                tg.start_soon(self._datagen, fresh, datagen_done)
            await self._spawn_encoders()
            await self._same_encoders()
            async with anyio.create_task_group() as spawn:
                for rank in self.ranks:
                    spawn.start_soon(self._spawn_rank, rank)
            if self.cfg.datagen is not None:
                await wait_episodes(self.cfg, datagen_done, self.say, _POLL_S)
            async with anyio.create_task_group() as watch:
                if self.master is not None and self.encoders:
                    watch.start_soon(self._watch_encoders)
                    watch.start_soon(self._watch_left_behind)
                if self.master is not None:
                    watch.start_soon(watch_master, self.rt, self.master, self.say, _WATCH_S)
                final = await self._train()
                watch.cancel_scope.cancel()
        return await self._result(final)

    async def _start_ranks(self, attempt: int) -> None:
        payload = {
            "config": self.cfg.to_data(),
            "out": str(self.out),
            "world_size": len(self.ranks),
            "encoders": [a for a, _, _ in self.encoders],
            "rendezvous": f"train-rendezvous-{attempt}",
            "host": _reachable_host(self.ranks[0].host.endpoint),
        }
        replies = [
            await self._ask_new(rank.actor, "start", {**payload, "rank": rank.index}) for rank in self.ranks
        ]
        resumed = replies[0].get("resumed_from") if isinstance(replies[0], dict) else None
        self.first_step = self.step = self._logged_step = int(resumed or 0)
        self._logged_checkpoint = None if resumed is None else int(resumed)  # committed before
        where = f"step {resumed} (checkpoints in {self.cfg.train.checkpoint_dir})"
        if attempt == 0:
            self.resumed_from = None if resumed is None else int(resumed)
            log.info(
                "train_started",
                steps=int(self.cfg.train.steps),
                resumed_from=self.resumed_from,
                ranks=len(self.ranks),
                encoders=len(self.encoders),
                checkpoint_dir=str(self.cfg.train.checkpoint_dir),
            )
        if attempt == 0 and resumed is not None:
            self.say(f"resuming from {where}")
        elif attempt > 0:
            self.say(f"ranks started again from {where if resumed is not None else 'the start'}")
        for rank in self.ranks:
            rank.last, rank.silent_since = {}, None

    async def _ask_new(self, actor: str, msg_type: str, payload: Any) -> Any:
        """Ask an actor just spawned: a master learns of it from its node's next beat, so an
        unknown name is asked again for a while."""
        deadline = time.monotonic() + _SPAWN_S
        while True:
            try:
                return await self.rt.ref(self.addresses.of(actor)).ask(msg_type, payload, timeout=_ASK_S * 3)
            except UnknownActor:
                if time.monotonic() > deadline:
                    raise
                await anyio.sleep(0.2)

    async def _train(self) -> list[dict[str, Any]]:
        """Start the ranks and poll them to the end; restart them all when one is lost."""
        limit = int(self.cfg.train.max_restarts)
        attempt = 0
        await self._start_ranks(attempt)
        while True:
            await anyio.sleep(_POLL_S)
            lost = await self._poll()
            if lost is None:
                if all(r.last.get("state") == "done" for r in self.ranks):
                    return [r.last for r in self.ranks]
                continue
            errors = "; ".join(
                f"rank {r.index}: {r.last.get('error') or r.last.get('state') or 'no answer'}"
                for r in self.ranks
                if r.last.get("state") != "running"
            )
            final = [r for r in self.ranks if r.last.get("state") == "failed" and r.last.get("final")]
            if final:
                raise TrainingFailed(
                    f"training failed: rank {final[0].index}: {final[0].last.get('error')} "
                    "(not restarted: every restart would fail the same way)"
                )
            if self.restarts >= limit:
                raise TrainingFailed(
                    f"training failed after {self.restarts} restart(s) "
                    f"(train.max_restarts = {limit}): {lost}; {errors}"
                )
            self.restarts += 1
            attempt += 1
            self._say_restart(lost, errors, limit)
            await self._respawn_ranks()
            await self._start_ranks(attempt)

    def _say_restart(self, reason: str, errors: str, limit: int) -> None:
        """A restart in the run's log at warning, with the ranks' errors (``train_restart``), and
        on the terminal in one line, which ``say`` logs too (``train_said``): both from the same
        figures, so that the two records of one restart cannot say another reason or count."""
        figures: dict[str, Any] = {"restart": self.restarts, "max_restarts": limit, "reason": reason}
        log.warning("train_restart", **figures, errors=errors)
        self.say(restart_line(**figures))

    async def _poll(self) -> str | None:
        """Ask every rank for its progress; the reason to restart, or None.

        A rank whose worker died is the reason, not its peers' failures: they fail at once in
        their collective (gloo's ``Connection reset by peer``), while the dead rank answers
        nothing until its node has started its worker again (then ``idle``). A failure is held
        back while a peer does not answer, for ``_PEER_GRACE_S``, to name the rank that died."""
        now = time.monotonic()
        failed: list[str] = []
        silent: list[Rank] = []
        for rank in self.ranks:
            try:
                reply = await self.rt.ref(self.addresses.of(rank.actor)).ask("progress", None, timeout=_ASK_S)
            except TroupeError:
                # Its node restarted it elsewhere, or the master (asked where it went) is gone.
                await self.addresses.resolve_at_node(rank.actor, rank.worker, rank.host)
                rank.silent_since = rank.silent_since or now
                if now - rank.silent_since > _LOST_AFTER_S:
                    return f"rank {rank.index} answered nothing for {_LOST_AFTER_S:g} s"
                gone = await node_silent(self.rt, rank.host)  # a dead node: no need to wait that long
                if gone is not None:
                    return f"rank {rank.index} answered nothing and its {gone}"
                silent.append(rank)
                continue
            rank.silent_since = None
            rank.last = dict(reply) if isinstance(reply, dict) else {}
            note = rank.last.get("note")
            if rank.index == 0 and isinstance(note, str) and note not in self._said:
                self._said.add(note)  # once: a restart from the same checkpoint says it again
                self.say(note)
            state = rank.last.get("state")
            if state == "failed":
                failed.append(f"rank {rank.index} failed: {rank.last.get('error')}")
            if state == "idle":
                why = await self._worker_end(rank)
                return f"rank {rank.index} lost its worker ({why}restarted by its node)"
        if failed:
            waiting = [r for r in silent if now - (r.silent_since or now) < _PEER_GRACE_S]
            return None if waiting else failed[0]
        self._record()
        return None

    async def _worker_end(self, rank: Rank) -> str:
        """How the rank's worker ended, as its node tells it (``killed by SIGKILL; ``, or the
        last error it wrote: a checkpoint that does not load), or "" when the node cannot say."""
        try:
            reply = await self.rt.control(rank.host.endpoint, "supervision", None, timeout=_ASK_S)
        except TroupeError:
            return ""
        workers = reply.get("workers", []) if isinstance(reply, dict) else []
        for worker in workers:
            if isinstance(worker, dict) and worker.get("name") == rank.worker:
                said = [str(worker[k]) for k in ("exit", "last_error") if worker.get(k)]
                return "".join(f"{part}; " for part in said)
        return ""

    def _record(self) -> None:
        head = self.ranks[0].last
        if not head:
            return
        step, loss = int(head.get("step") or 0), head.get("loss")
        progress = TrainProgress(
            step=step,
            steps=int(head.get("steps") or self.cfg.train.steps),
            loss=None if loss is None else float(loss),
            samples_per_s=sum(float(r.last.get("samples_per_s") or 0.0) for r in self.ranks),
            checkpoint=None if head.get("checkpoint") is None else int(head["checkpoint"]),
            restarts=self.restarts,
            states=tuple(str(r.last.get("state", "?")) for r in self.ranks),
            resumed_from=self.resumed_from,
        )
        self.step = step
        self._log_progress(progress)
        if self.on_progress is not None:
            self.on_progress(progress)

    def _log_progress(self, p: TrainProgress) -> None:
        """The run's log has what the terminal shows (the bar: ``say`` lines are logged by the
        caller): each checkpoint the ranks committed, as a poll finds it, and the step, loss and
        samples/s every ``PROGRESS_EVERY`` steps and at the last."""
        logged = self._logged_checkpoint
        if p.checkpoint is not None and (logged is None or p.checkpoint > logged):
            self._log_checkpoints(p.checkpoint)
        last = p.step >= p.steps and p.step > self._logged_step
        if p.step // PROGRESS_EVERY > self._logged_step // PROGRESS_EVERY or last:
            self._logged_step = p.step
            log.info("train_progress", step=p.step, steps=p.steps, loss=p.loss,
                     samples_per_s=round(p.samples_per_s, 3), checkpoint=p.checkpoint)  # fmt: skip

    def _log_checkpoints(self, newest: int) -> None:
        """Log each checkpoint committed since the last one logged, up to ``newest`` (the ranks'),
        in step order. The ranks name only their newest, so two committed between polls (0.5 s)
        were one event: the folder's ``COMMITTED`` markers say which were; where the run cannot
        see the folder (a cluster's ranks writing on their own disks), the ranks' newest alone."""
        from .checkpoint import checkpoint_path  # torch: once a checkpoint is there to name

        after = -1 if self._logged_checkpoint is None else self._logged_checkpoint
        directory = Path(self.cfg.train.checkpoint_dir)
        steps = {step for step in committed_steps(directory) if after < step <= newest} | {newest}
        for step in sorted(steps):
            log.info("train_checkpoint_committed", step=step, path=str(checkpoint_path(directory, step)))
        self._logged_checkpoint = newest

    async def _respawn_ranks(self) -> None:
        """Every rank's worker stopped (a rank left in a collective would hang) and started again,
        on a live node where its own is gone (``lost_nodes``), as are the encoders there."""
        async with anyio.create_task_group() as tg:
            for rank in self.ranks:
                tg.start_soon(self._stop_worker, rank.worker, rank.host)
        await self._leave_lost_nodes()
        async with anyio.create_task_group() as tg:
            for rank in self.ranks:
                tg.start_soon(self._spawn_rank, rank)

    async def _leave_lost_nodes(self) -> None:
        if self.master is None:  # the run's own node: it lives as long as the run
            return
        placed = [r.host for r in self.ranks] + [h for _, _, h in self.encoders]
        live = await live_hosts(self.rt, self.master, placed)
        if live is None:
            return
        tr = self.cfg.trainers
        for i, host in moves([r.host for r in self.ranks], live, tr.tags, tr.gpus, "trainers").items():
            rank = self.ranks[i]
            self._moved(rank.worker, rank.host, host)
            rank.host = host
        async with self._moving:
            await self._move_encoders(live)

    async def _move_encoders(self, live: list[Host]) -> None:
        """The encoders whose node is not among ``live`` started on live nodes that fit them."""
        enc = self.cfg.encoders
        moved = moves([h for _, _, h in self.encoders], live, enc.tags, enc.gpus, "encoders")
        if moved:
            kwargs = self._encoder_kwargs()
            async with anyio.create_task_group() as tg:
                for i, host in moved.items():
                    actor, worker, old = self.encoders[i]
                    self._moved(worker, old, host)
                    if self._left_on(worker, old) is None:
                        self.left_behind.append((worker, old))
                    self.encoders[i] = (actor, worker, host)
                    tg.start_soon(self._spawn_moved_encoder, actor, worker, host, kwargs)

    async def _spawn_moved_encoder(self, actor: str, worker: str, host: Host, kwargs: dict[str, Any]) -> None:
        """Spawn a moved encoder on ``host``; one of its name this run left behind there (moved
        off it before, its node silent since) is stopped first: the node refuses a second."""
        left = self._left_on(worker, host)
        if left is not None:
            self.left_behind.remove(left)
            await stop_worker(self.controls, worker, left[1])
        await self._spawn(worker, "encoder", actor, ENCODER_CLASS, kwargs, host)

    def _left_on(self, worker: str, host: Host) -> tuple[str, Host] | None:
        """The entry of ``left_behind`` for ``worker`` on ``host``'s node (by its name: the
        master's list of it may say another state, drained say, since)."""
        return next((e for e in self.left_behind if e[0] == worker and e[1].name == host.name), None)

    async def _watch_encoders(self) -> None:
        """While the ranks train, an encoder whose node stops answering is started again on a live
        node; the ranks take it back at their next probe of it (``inflight``), resolving its name
        afresh. Without this, the other encoders carried its share until the ranks restarted.
        One that cannot be placed (no live node fits) or started is said once; the run goes on."""
        assert self.master is not None
        while True:
            await anyio.sleep(_WATCH_S)
            hosts = [h for _, _, h in self.encoders]
            silent = await silent_nodes(self.rt, hosts)
            if not silent:
                continue
            try:
                async with self._moving:
                    live = await live_hosts(self.rt, self.master, hosts)
                    if live is not None:
                        await self._move_encoders(live)
            except* TroupeError as group:  # no node fits, or a spawn failed (in a task group)
                self._not_replaced(sorted(silent), group.exceptions[0])

    async def _watch_left_behind(self) -> None:
        """While the ranks train, the nodes encoders were moved off are pinged every round; those
        left behind on one that answers again (a cut link mended) are stopped there: such a node
        kept them running through the cut and rejoined the master with them, under the names
        their replacements have, until the run ended. The stop names this run's process and that
        node alone: it cannot reach the replacement on another node. A loop of its own: a node
        that stays dead holds each ping its whole deadline, which the encoders' watch would wait."""
        while True:
            await anyio.sleep(_WATCH_S)
            left = list(self.left_behind)
            if left:
                silent = await silent_nodes(self.rt, [host for _, host in left])
                await self._stop_left_behind([e for e in left if e[1].name not in silent])

    async def _stop_left_behind(self, answering: list[tuple[str, Host]]) -> None:
        if not answering:
            return
        async with self._moving:  # a restart's move may have spawned one there since the ping
            back = [entry for entry in answering if entry in self.left_behind]
            for entry in back:
                self.left_behind.remove(entry)
            async with anyio.create_task_group() as tg:
                for worker, host in back:
                    tg.start_soon(self._stop_one_left_behind, worker, host)

    async def _stop_one_left_behind(self, worker: str, host: Host) -> None:
        if not await stop_worker(self.controls, worker, host):
            return  # not there (its node restarted since), or silent again: nothing stopped to say
        log.warning("train_worker_left_behind_stopped", worker=worker, node=host.name)
        self.say(f"{worker}: node {host.name} answers again; the one left running there is stopped")

    def _not_replaced(self, nodes: list[str], error: BaseException) -> None:
        lost = ", ".join(nodes)
        if lost in self._unplaced:  # the watch tries again every round: said once
            return
        self._unplaced.add(lost)
        log.warning("train_encoder_not_replaced", nodes=lost, error=str(error))
        self.say(f"the encoders of node(s) {lost}, gone, are not started elsewhere ({error}); the rest go on")

    def _moved(self, worker: str, gone: Host, to: Host) -> None:
        with contextlib.suppress(ValueError):  # its node took it: no stop to send there at the end
            self.spawned.remove((worker, gone))
        log.warning("train_worker_moved", worker=worker, gone=gone.name, to=to.name)
        self.say(f"{worker}: node {gone.name} is gone; it starts again on {to.name}")

    # -- data generation beside ---------------------------------------------------------------

    async def _datagen(self, fresh: bool, done: anyio.Event) -> None:
        try:
            self.datagen = await run_datagen(self.cfg, self.ranks[0].host.endpoint, fresh, self.say)
        finally:
            done.set()

    # -- the end ----------------------------------------------------------------------------------

    async def _result(self, final: list[dict[str, Any]]) -> TrainRunResult:
        head = final[0]
        result: dict[str, Any] = head["result"] if isinstance(head.get("result"), dict) else {}
        losses = self._losses(result)
        timings = {str(r.index): rank_timings(r.last) for r in self.ranks}
        # Asked here, before the cluster's exit stops the encoder actors (their counts go with them),
        # each where its node says it listens now: one the node restarted listens elsewhere, and
        # the ask to its old address waited out its deadline and dropped its counts.
        for actor, worker, host in self.encoders:
            await self.addresses.resolve_at_node(actor, worker, host)
        names = [a for a, _, _ in self.encoders]
        encoders = await ask_encoders(
            lambda actor: self.rt.ref(self.addresses.of(actor)).ask("stats", None, timeout=_ASK_S),
            names,
            rank_asks(names, [r.last for r in self.ranks]),  # the run's requests: the ranks' asks
        )
        if self.encoders:
            self._say_not_stored(encoders.latent_cache)
        return TrainRunResult(
            steps=int(head.get("step") or 0),
            losses=losses,
            loss=losses[-1] if losses else None,
            samples_per_s=sum(float(r.last.get("samples_per_s") or 0.0) for r in self.ranks),
            timings=timings,
            requests=encoders.requests,
            restarts=self.restarts,
            checkpoints=committed_checkpoints(Path(self.cfg.train.checkpoint_dir)),
            placement=self.placement,
            wall_s=0.0,
            resumed_from=self.resumed_from,
            first_step=self.first_step,
            datagen=self.datagen,
            latent_cache=encoders.latent_cache if self.encoders else None,
        )

    def _say_not_stored(self, cache: dict[str, Any]) -> None:
        """Say once, and log at warning, where the latent cache's disk tier stored fewer entries
        than it was given (a disk under the cache's reserve, or failing): nothing said so, and
        every rerun encoded them all again. The free space is this host's disk's, where the
        encoders run (none on a cluster: its hosts' own disks)."""
        cache_dir = self.cfg.encoders.cache_dir
        free = None if self.master is not None else _free_bytes(Path(cache_dir))
        line = not_stored_line(cache, cache_dir, free, DISK_RESERVE)
        if line is None:
            return
        log.warning(
            "train_latent_cache_not_stored",
            disk_writes=cache["disk_writes"],
            disk_writes_skipped=cache["disk_writes_skipped"],
            disk_errors=cache["disk_errors"],
            cache_dir=cache_dir,
            free_bytes=free,
            reserve_bytes=DISK_RESERVE,
            note=line,
        )
        self.say(line)

    def _losses(self, result: dict[str, Any]) -> list[float]:
        """Rank 0's losses of the last (re)start: steps ``first_step + 1`` to the end."""
        return [float(x) for x in result.get("losses") or []]


def _free_bytes(folder: Path) -> int | None:
    """The free bytes of the disk holding ``folder``; None where it cannot be asked."""
    try:
        return shutil.disk_usage(folder).free
    except OSError:
        return None


def _reachable_host(endpoint: str) -> str:
    """The address other hosts reach a node at, from its endpoint (loopback for a wildcard)."""
    host = urlsplit(endpoint).hostname or "127.0.0.1"
    return "127.0.0.1" if host in ("0.0.0.0", "*", "::") else host
