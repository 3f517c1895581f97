"""The workers of one training run as it spawns them: its trainer ranks and encoder actors,
each spawned through its host's node under the name it has in every run, stopped there, and asked
once spawned (a master learns of an actor from its node's next beat).

:class:`TrainWorkers` is a part of :class:`~troupe.actors.training.train_driver.TrainDriver`: it
uses the driver's fields.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import anyio

from troupe.runtime import UnknownActor
from troupe.runtime.core.runtime import Runtime
from troupe.runtime.errors import TroupeError
from troupe.runtime.library_logging import get_logger
from troupe.runtime.owned_controls import OwnedControls, spawn_owner
from troupe.runtime.owner_beat import OwnerBeat
from troupe.runtime.pipeline.mixed_code import UNKNOWN, node_codes
from troupe.runtime.placement import Host, cluster_status

from .train_cluster import stop_worker
from .train_result import TrainingFailed
from .worker_addresses import WorkerAddresses

__all__ = ["ASK_S", "ENCODER_CLASS", "SPAWN_S", "TRAINER_CLASS", "Rank", "TrainWorkers"]

log = get_logger(__name__)

ENCODER_CLASS = "troupe.actors.encoders.encoder_actor:EncoderActor"
TRAINER_CLASS = "troupe.actors.training.trainer:TrainerActor"

ASK_S = 20.0
SPAWN_S = 120.0


@dataclass
class Rank:
    """One trainer rank: its worker, actor, host, and its last ``progress`` answer."""

    index: int
    worker: str
    actor: str
    host: Host
    last: dict[str, Any] = field(default_factory=dict)
    silent_since: float | None = None


class TrainWorkers:
    """Spawns, stops and asks the run's workers (a part of the driver)."""

    rt: Runtime
    cfg: Any
    say: Callable[[str], None]
    master: str | None  # the master whose nodes run the workers; None: a node of this process
    controls: OwnedControls  # spawn_worker and stop_worker, naming this process
    owner_beat: OwnerBeat | None
    encoders: list[tuple[str, str, Host]]  # (actor, worker, host)
    ranks: list[Rank]
    spawned: list[tuple[str, Host]]
    addresses: WorkerAddresses

    @property
    def placement(self) -> dict[str, str]:
        return {**{a: h.name for a, _, h in self.encoders}, **{r.actor: r.host.name for r in self.ranks}}

    async def _spawn(
        self, worker: str, kind: str, actor: str, cls: str, kwargs: dict[str, Any], host: Host
    ) -> None:
        spec = {"name": worker, "kind": kind, "actors": [{"name": actor, "class": cls, "kwargs": kwargs}]}
        if self.master is not None:
            owner = spawn_owner(host.endpoint, self.rt.address, self.owner_beat)
            spec = spec if owner is None else {**spec, "owner": owner}
        # Named even without an owner: the stops name the process too (see the module).
        spec = self.controls.named({**spec, "timeout_s": SPAWN_S})
        record = await self.controls.ask(host.endpoint, "spawn_worker", spec, SPAWN_S + 10)
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
            codes = await self._encoder_codes()
            if len(set(codes.values())) > 1:  # the fingerprint covers troupe's encoder code too
                ran = ", ".join(f"{node} {code}" for node, code in codes.items())
                raise TrainingFailed(
                    f"the encoder actors run on nodes of different troupe code ({ran}): an encoder's "
                    "fingerprint covers troupe's own encoder code, so their latents may differ; "
                    'upgrade every encoder node to one code (README, "Upgrading a cluster"), or place '
                    "the encoders by encoders.tags on nodes of one code"
                )
            shown = ", ".join(f"{actor} {fingerprint[:12]}" for actor, fingerprint in found.items())
            raise TrainingFailed(
                f"the encoder actors compute different functions (fingerprints {shown}): "
                f"encoders.encoder = {self.cfg.encoders.encoder!r} builds other weights in each process; "
                "seed them in the factory, or give encoders.weights"
            )

    async def _encoder_codes(self) -> dict[str, str]:
        """The troupe code each node of an encoder runs, by node name, as the master says it
        (``mixed_code.py``'s words for a node that does not); empty where the workers run in
        this process's node, or the master does not answer (the fingerprints' line then)."""
        if self.master is None:
            return {}
        try:
            status = await cluster_status(self.rt, self.master)
        except TroupeError:
            return {}
        codes = node_codes(status)
        return {host.name: codes.get(host.name, UNKNOWN) for _, _, host in self.encoders}

    async def _spawn_rank(self, rank: Rank) -> None:
        await self._spawn(
            rank.worker, "trainer", rank.actor, TRAINER_CLASS, self._trainer_kwargs(), rank.host
        )

    async def _ask_new(self, actor: str, msg_type: str, payload: Any) -> Any:
        """Ask an actor just spawned: a master learns of it from its node's next beat, so an
        unknown name is asked again for a while."""
        deadline = time.monotonic() + SPAWN_S
        while True:
            try:
                return await self.rt.ref(self.addresses.of(actor)).ask(msg_type, payload, timeout=ASK_S * 3)
            except UnknownActor:
                if time.monotonic() > deadline:
                    raise
                await anyio.sleep(0.2)
