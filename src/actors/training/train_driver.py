"""One training run's workers on the cluster: the encoder actors and trainer ranks placed on
their hosts and spawned through each host's node, the ranks started and polled to the end, and
all of them started again from the latest committed checkpoint when one is lost (at most
``train.max_restarts`` times). On a master's cluster, an encoder whose node dies is started again
on a live node while the ranks train (``_watch_encoders``); it restarts no rank. Where its node
was only cut off and answers again, the encoder it kept is stopped there (``_watch_left_behind``;
both in :mod:`.worker_moves`).

The workers have the same names in every run (``w-train-rank-0``...). Their spawns and stops
name the run's process (``runtime/owned_controls.py``): a node leaves a rerun's rank alone when a
late stop of an earlier run reaches it. On a master's cluster, whose nodes outlive the run, the
spawns also name the run their owner (its runtime where the node can ping it back, else its token
at the master it beats to, ``runtime/owner_beat.py``): a node stops the ranks and encoders of a
run that was killed, as it stops a killed pipeline run's replicas, and a rerun takes their names."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import anyio

from troupe.runtime import TroupeError
from troupe.runtime.core.runtime import Runtime
from troupe.runtime.library_logging import get_logger
from troupe.runtime.owned_controls import OwnedControls
from troupe.runtime.owner_beat import OwnerBeat
from troupe.runtime.pipeline.mixed_code import warn_if_mixed
from troupe.runtime.placement import Host, place
from troupe.runtime.worker_stop import node_silent

from .master_silence import watch_master
from .train_datagen import run_datagen, wait_episodes
from .train_end import TrainEnd
from .train_result import TrainingFailed, TrainProgress, TrainRunResult, committed_steps
from .train_workers import ASK_S, ENCODER_CLASS, TRAINER_CLASS, Rank
from .worker_addresses import WorkerAddresses
from .worker_moves import WATCH_S, WorkerMoves

__all__ = ["ENCODER_CLASS", "TRAINER_CLASS", "Rank", "TrainDriver", "restart_line"]

log = get_logger(__name__)

_POLL_S = 0.5
_LOST_AFTER_S = 120.0  # a rank that answers nothing this long is restarted as if it answered idle
_PEER_GRACE_S = 30.0  # a rank's failure waits this long for a silent peer: its death may be the cause

PROGRESS_EVERY = 10
"""Steps between the run's ``train_progress`` events: the first poll past each multiple of it
(and the last step) is logged."""


def restart_line(restart: int, max_restarts: int, reason: str) -> str:
    """A restart as the run says it (the terminal, and the log's ``train_said``), from the figures
    its ``train_restart`` event logs."""
    return f"{reason}; restarting every rank from the last checkpoint ({restart}/{max_restarts})"


class TrainDriver(WorkerMoves, TrainEnd):
    """The workers of one training run, their starts, polls and restarts (spawned, stopped and
    asked in :mod:`.train_workers`, moved off lost nodes in :mod:`.worker_moves`, the result
    gathered in :mod:`.train_end`).

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
    def to_stop(self) -> list[tuple[str, Host]]:
        """The workers the run's end stops, by (worker, host): those it spawned, and the encoders
        left behind on a node that did not answer again before the end (given up there once it
        does not answer a ping; a node that comes back after the end stops them itself, as the
        workers of a run that is gone, where their spawns named the run their owner)."""
        return [*self.spawned, *self.left_behind]

    # -- workers ----------------------------------------------------------------------------------

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
        if self.master is not None:  # as a pipeline's --cluster run says it
            await warn_if_mixed(self.rt, self.master, self.say)
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
                    watch.start_soon(watch_master, self.rt, self.master, self.say, WATCH_S)
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
                reply = await self.rt.ref(self.addresses.of(rank.actor)).ask("progress", None, timeout=ASK_S)
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
            reply = await self.rt.control(rank.host.endpoint, "supervision", None, timeout=ASK_S)
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

    # -- data generation beside ---------------------------------------------------------------

    async def _datagen(self, fresh: bool, done: anyio.Event) -> None:
        try:
            self.datagen = await run_datagen(self.cfg, self.ranks[0].host.endpoint, fresh, self.say)
        finally:
            done.set()


def _reachable_host(endpoint: str) -> str:
    """The address other hosts reach a node at, from its endpoint (loopback for a wildcard)."""
    host = urlsplit(endpoint).hostname or "127.0.0.1"
    return "127.0.0.1" if host in ("0.0.0.0", "*", "::") else host
