"""One trainer rank's pipeline: batches read, encoded by encoder actors in tagged sample groups,
reassembled by tag, and trained on, with at most K batches in flight.

Three concurrent parts (anyio tasks) of :func:`train_remote`:

- the producer reads a batch (a dict with ``"video"`` (B, C, T, H, W) and whatever the train step
  needs, such as ``"actions"`` and ``"action_mask"``), cuts its video into sample groups of
  ``group_size`` samples, tags each ``(batch, group)`` and sends each to an encoder actor, every
  group in its own task, so the replies come back in any order;
- the receiver puts each returned group's latents into its batch by tag and queues the batches
  that are complete, in the order they were read;
- the training loop takes completed batches and calls ``train_step`` on a thread of its own,
  the same one for every step, so reading and encoding go on meanwhile. (One thread rather than
  any of a pool: a step that moves between threads moves between their memory arenas and
  caches too, which cost the steps a tenth more CPU time on a 2-core machine.)

A batch is in flight from the moment it is read until its train step returns; at ``inflight``
such batches the producer waits before reading, so memory is bounded by construction. Each rank
sends to every encoder actor round-robin from an offset given by its rank (``(rank + i) % n``): no
central scheduler, equal load. A group whose ask fails on delivery (the actor died, stopped,
is unknown or its mailbox full) or misses its deadline goes to the next actor; a group that fails
on every actor fails the run (:class:`GroupFailed`), so no batch is ever trained with a hole.
The handler's own error (``RemoteError``: the encoder refused the input) fails the run at once:
another actor would refuse it too.

Each rank keeps its own view of the actors' health, so a dead actor does not cost every later
group a failure (or a whole deadline, when it hangs): after a failure the round robin passes over
the actor for a back-off (``retry_after_s``, doubling up to ``retry_after_max_s``), then sends it
one group, the probe: a success makes it healthy again, a failure doubles the back-off. A probe
waits a few times the slowest recent answer (:func:`probe_wait_s`), not the whole deadline: an
actor whose node died has nobody listening, so its asks would wait out ``deadline_s`` (a minute),
and the rank, which trains no batch with a missing group, with them, at every probe. The
healthy actors share the skipped actor's turns evenly, since the round robin moves on over them
alone. When every actor a group may still try is backed off, it goes to the one whose back-off
ends first rather than failing.

:func:`train_local` encodes inside the trainer, in the same groups with the same mapping of
frames as ``EncoderActor``, so its losses equal the remote ones (the baseline of ``troupe bench
train`` and of the loss-parity test): bit for bit with groups of one or the actors' cache off, to
float32 rounding otherwise, as the cache gives a sample back as the batch that encoded it computed
it (README, Decisions).
"""

from __future__ import annotations

import asyncio
import math
import time
from collections import deque
from collections.abc import Awaitable, Callable, Collection, Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import anyio
import torch
from anyio.abc import TaskGroup
from torch import nn

from troupe.runtime import ActorStopped, AskTimeout, MailboxFull, RemoteError, UnknownActor, Unreachable

__all__ = [
    "RETRYABLE",
    "EncodeFn",
    "GroupFailed",
    "InflightConfig",
    "RoundRobin",
    "SampleGroup",
    "StageTimings",
    "TrainResult",
    "TrainStep",
    "actor_encoder",
    "encode_video",
    "probe_wait_s",
    "split_groups",
    "train_local",
    "train_remote",
]

RETRYABLE: tuple[type[BaseException], ...] = (
    Unreachable,
    ActorStopped,
    UnknownActor,
    MailboxFull,
    AskTimeout,
    TimeoutError,
)
"""Errors after which a group is sent to the next actor: the actor, not the group, is at fault."""

TrainStep = Callable[[dict[str, Any]], Any]
"""``train_step(batch) -> loss``: the batch as read, with ``"latents"`` added; a float or 0-dim tensor."""


@dataclass(frozen=True)
class SampleGroup:
    """Group ``index`` of batch ``batch``: consecutive samples of its video, sent to one encoder."""

    batch: int
    index: int
    video: torch.Tensor

    @property
    def tag(self) -> tuple[int, int]:
        return (self.batch, self.index)


EncodeFn = Callable[[int, SampleGroup], Awaitable[torch.Tensor]]
"""``encode(actor_index, group) -> latents``: one ask to one encoder actor."""


class GroupFailed(RuntimeError):
    """A sample group could not be encoded by any actor: the run stops rather than train on a hole."""


@dataclass(frozen=True)
class InflightConfig:
    """Settings of one rank's pipeline.

    Attributes:
        inflight: K, the most batches read and not yet trained.
        group_size: samples per group sent to an encoder (the last group of a batch may be smaller).
        rank: this rank; the round-robin over the actors starts at ``rank % n_actors``.
        deadline_s: seconds one group may take on one actor before it goes to the next.
        max_steps: stop after this many train steps (None: when the batches run out).
        retry_after_s: seconds an actor is passed over after a failure before a group probes it.
        retry_after_max_s: the most that back-off grows to, doubling after each failed probe.
        probe_deadline_s: seconds a probe waits before its group goes on to the next actor; None:
            :func:`probe_wait_s` of the rank's recent answers.
    """

    inflight: int = 2
    group_size: int = 1
    rank: int = 0
    deadline_s: float = 60.0
    max_steps: int | None = None
    retry_after_s: float = 1.0
    retry_after_max_s: float = 30.0
    probe_deadline_s: float | None = None

    def __post_init__(self) -> None:
        for name in ("inflight", "group_size"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"InflightConfig.{name}={value!r}: expected a positive integer")
        if not isinstance(self.rank, int) or self.rank < 0:
            raise ValueError(f"InflightConfig.rank={self.rank!r}: expected an integer >= 0")
        if not self.deadline_s > 0:
            raise ValueError(f"InflightConfig.deadline_s={self.deadline_s!r}: expected a positive time")
        if self.max_steps is not None and self.max_steps < 0:
            raise ValueError(f"InflightConfig.max_steps={self.max_steps!r}: expected None or >= 0")
        if self.probe_deadline_s is not None and not self.probe_deadline_s > 0:
            raise ValueError(
                f"InflightConfig.probe_deadline_s={self.probe_deadline_s!r}: expected None or a positive time"
            )
        if not self.retry_after_s > 0:
            raise ValueError(f"InflightConfig.retry_after_s={self.retry_after_s!r}: expected a positive time")
        if not self.retry_after_max_s >= self.retry_after_s:
            raise ValueError(
                f"InflightConfig.retry_after_max_s={self.retry_after_max_s!r}: expected a time >= "
                f"retry_after_s ({self.retry_after_s!r})"
            )


@dataclass
class StageTimings:
    """Seconds spent per stage by the training side, and the rate it reached.

    ``read_s``: reading batches (the producer); ``wait_s``: the training loop waiting for a batch
    whose latents have not all come back; ``train_s``: in train steps; ``wall_s``: the whole run.
    With encoding hidden behind training, ``read_s`` and ``wait_s`` stay near zero.
    """

    read_s: float = 0.0
    wait_s: float = 0.0
    train_s: float = 0.0
    wall_s: float = 0.0
    steps: int = 0
    samples: int = 0

    @property
    def samples_per_s(self) -> float:
        return self.samples / self.wall_s if self.wall_s > 0 else 0.0

    def as_dict(self) -> dict[str, float]:
        return {"read_s": self.read_s, "wait_s": self.wait_s, "train_s": self.train_s,
                "wall_s": self.wall_s, "steps": self.steps, "samples": self.samples,
                "samples_per_s": self.samples_per_s}  # fmt: skip


@dataclass
class TrainResult:
    """What a rank's run did: one loss per step, timings, and the asks each actor received."""

    losses: list[float] = field(default_factory=list)
    timings: StageTimings = field(default_factory=StageTimings)
    requests: list[int] = field(default_factory=list)
    """Asks sent to each actor (retries included); empty in local mode."""
    retries: int = 0
    """Groups sent again after an actor failed them."""
    skipped: list[int] = field(default_factory=list)
    """Groups the round robin did not send to each actor because it was backed off after a
    failure; empty in local mode."""


class RoundRobin:
    """Actor indices ``(rank + i) % n`` for i = 0, 1, ...: each rank starts at its own offset."""

    def __init__(self, n_actors: int, rank: int) -> None:
        if n_actors < 1:
            raise ValueError(f"n_actors={n_actors!r}: expected at least one encoder actor")
        self.n_actors = n_actors
        self._next = rank % n_actors

    def __next__(self) -> int:
        index = self._next
        self._next = (index + 1) % self.n_actors
        return index

    def __iter__(self) -> Iterator[int]:
        return self


@dataclass
class _Health:
    """One actor as a rank sees it: healthy (``backoff == 0``), or passed over until ``until``."""

    backoff: float = 0.0
    until: float = 0.0
    probing: bool = False
    """A probe is out: no other group goes to the actor before its answer."""


class _Dispatch:
    """The rank's round robin (:class:`RoundRobin`'s order) over the actors that are not backed
    off, and their health (see the module)."""

    def __init__(
        self, n_actors: int, config: InflightConfig, clock: Callable[[], float], skipped: list[int]
    ) -> None:
        if n_actors < 1:
            raise ValueError(f"n_actors={n_actors!r}: expected at least one encoder actor")
        self.n_actors = n_actors
        self.config = config
        self.clock = clock
        self.skipped = skipped
        self.health = [_Health() for _ in range(n_actors)]
        self._next = config.rank % n_actors

    def _open(self, actor: int, now: float) -> bool:
        h = self.health[actor]
        return h.backoff == 0 or (now >= h.until and not h.probing)

    def pick(self, tried: Collection[int] = ()) -> tuple[int, bool]:
        """The next actor for a group that ``tried`` already failed, and whether the ask probes
        it. Actors passed over because they are backed off count as ``skipped``."""
        now = self.clock()
        n = self.n_actors
        order = [(self._next + i) % n for i in range(n) if (self._next + i) % n not in tried]
        if not order:
            raise ValueError("pick: every actor was tried")
        chosen = next((a for a in order if self._open(a, now)), None)
        if chosen is None:  # every actor left is backed off: the one free soonest, probes last
            chosen = min(order, key=lambda a: (self.health[a].probing, self.health[a].until))
        for actor in order[: order.index(chosen)]:
            self.skipped[actor] += 1
        self._next = (chosen + 1) % n
        h = self.health[chosen]
        probe = h.backoff > 0 and not h.probing
        h.probing = h.probing or probe
        return chosen, probe

    def succeeded(self, actor: int) -> None:
        self.health[actor] = _Health()

    def failed(self, actor: int, probe: bool) -> None:
        h = self.health[actor]
        if probe:
            h.probing = False
            h.backoff = min(max(2 * h.backoff, self.config.retry_after_s), self.config.retry_after_max_s)
        elif h.backoff == 0:
            h.backoff = self.config.retry_after_s
        else:
            return  # an ask sent before the actor was known to fail: its back-off already runs
        h.until = self.clock() + h.backoff


PROBE_ANSWERS = 32
"""The recent answered asks whose slowest sets a probe's wait."""
PROBE_FACTOR = 4.0
PROBE_MIN_S = 1.0


def probe_wait_s(config: InflightConfig, answered: Collection[float]) -> float:
    """Seconds a probe waits: ``config.probe_deadline_s`` where set; else ``PROBE_FACTOR`` times
    the slowest of ``answered`` (the rank's last ``PROBE_ANSWERS`` answered asks, in seconds), at
    least ``PROBE_MIN_S``; never more than ``deadline_s``, which is the wait before any answer."""
    if config.probe_deadline_s is not None:
        return min(config.probe_deadline_s, config.deadline_s)
    if not answered:
        return config.deadline_s
    return min(config.deadline_s, max(PROBE_MIN_S, PROBE_FACTOR * max(answered)))


def _video_of(batch: Any, index: int) -> torch.Tensor:
    if not isinstance(batch, dict) or "video" not in batch:
        keys = sorted(map(str, batch)) if isinstance(batch, dict) else type(batch).__name__
        raise ValueError(f"batch {index}: expected a dict with 'video', got {keys}")
    video = batch["video"]
    if not isinstance(video, torch.Tensor) or video.ndim != 5:
        shape = tuple(video.shape) if isinstance(video, torch.Tensor) else type(video).__name__
        raise ValueError(f"batch {index}: 'video' must be a (B, C, T, H, W) tensor, got {shape}")
    return video


def split_groups(batch_index: int, video: torch.Tensor, group_size: int) -> list[SampleGroup]:
    """The batch's video cut along its first axis into groups of ``group_size`` samples."""
    return [
        SampleGroup(batch_index, i, chunk.contiguous())
        for i, chunk in enumerate(torch.split(video, group_size, dim=0))
    ]


def encode_video(module: nn.Module, video: torch.Tensor) -> torch.Tensor:
    """What ``EncoderActor`` computes for one group, in this process: uint8 frames mapped to
    [-1, 1], float ones taken as they are; the module's ``encode`` where it has one; float32."""
    x = video.float() / 127.5 - 1.0 if video.dtype == torch.uint8 else video.float()
    fn = getattr(module, "encode", None)
    with torch.no_grad():
        latents = fn(x) if callable(fn) else module(x)
    return latents.float().cpu()


def actor_encoder(
    runtime: Any, names: Sequence[str], params: dict[str, Any] | None = None, timeout: float | None = None
) -> EncodeFn:
    """The :data:`EncodeFn` that asks the encoder actors ``names`` through troupe refs.

    Args:
        runtime: a troupe runtime (``connect(...)``, or an actor's own).
        names: the encoder actors, in the order every rank uses.
        params: the preprocessing the trainer did (JSON data), part of the actors' cache key.
        timeout: seconds of one ask (the runtime's default when None); the pipeline's deadline
            bounds it too.
    """
    refs = [runtime.ref(name) for name in names]

    async def encode(index: int, group: SampleGroup) -> torch.Tensor:
        payload = {"tag": list(group.tag), "video": group.video, "params": params or {}}
        try:
            reply = await refs[index].ask("encode", payload, timeout=timeout)
        except RemoteError:
            raise
        except BaseException:
            # No answer: the actor may be started again on another node (its own died). A ref
            # keeps the node/process it resolved to, so the next ask resolves the name afresh.
            refs[index] = runtime.ref(names[index])
            raise
        if list(reply.get("tag") or ()) != list(group.tag):
            raise ValueError(f"encoder {names[index]!r} answered tag {reply.get('tag')!r} for {group.tag}")
        latents = reply["latents"]
        return latents if isinstance(latents, torch.Tensor) else torch.as_tensor(latents)

    return encode


def _loss_value(loss: Any) -> float:
    return float(loss.detach()) if isinstance(loss, torch.Tensor) else float(loss)


async def _read(iterator: Iterator[Any]) -> Any:
    """The next batch, on a thread (a DataLoader blocks); ``_END`` when there is none."""
    return await anyio.to_thread.run_sync(next, iterator, _END)


_END = object()


class _StepThread:
    """Runs the train steps of one run on one thread of its own, always the same."""

    def __init__(self) -> None:
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="troupe-train-step")

    async def run(self, train_step: TrainStep, batch: dict[str, Any]) -> Any:
        """``train_step(batch)`` on the thread; a cancellation waits for the step to end, as a
        step cannot be stopped halfway."""
        future = self._executor.submit(train_step, batch)
        with anyio.CancelScope(shield=True):
            return await asyncio.wrap_future(future)

    def close(self) -> None:
        self._executor.shutdown(wait=True)


def _first_error(group: BaseExceptionGroup[BaseException]) -> BaseException:
    """The error that failed a task group (not the cancellations it caused)."""
    for exc in group.exceptions:
        if isinstance(exc, BaseExceptionGroup):
            return _first_error(exc)
        if not isinstance(exc, anyio.get_cancelled_exc_class()):
            return exc
    return group.exceptions[0]


class _Rank:
    """The state the three parts share during one :func:`train_remote` run."""

    def __init__(
        self, encode: EncodeFn, n_actors: int, config: InflightConfig, clock: Callable[[], float]
    ) -> None:
        self.encode = encode
        self.config = config
        self.result = TrainResult(requests=[0] * max(n_actors, 0), skipped=[0] * max(n_actors, 0))
        self.dispatch = _Dispatch(n_actors, config, clock, self.result.skipped)
        self.answered: deque[float] = deque(maxlen=PROBE_ANSWERS)  # seconds, for probe_wait_s
        self.slots = anyio.Semaphore(config.inflight)
        # The producer's batches, the groups' latents and the final count share one stream, so the
        # receiver sees a batch before its groups. Unbounded: the slots bound what is out (K
        # batches' messages), and a finished ask never waits on the receiver.
        self.returns_in, self.returns_out = anyio.create_memory_object_stream[tuple[Any, ...]](math.inf)
        self.completed_in, self.completed_out = anyio.create_memory_object_stream[dict[str, Any]](
            config.inflight
        )

    async def encode_group(self, group: SampleGroup) -> None:
        n = self.dispatch.n_actors
        errors: list[str] = []
        tried: list[int] = []
        for attempt in range(n):
            actor, probe = self.dispatch.pick(tried)
            tried.append(actor)
            self.result.requests[actor] += 1
            if attempt:
                self.result.retries += 1
            wait = probe_wait_s(self.config, self.answered) if probe else self.config.deadline_s
            sent = time.perf_counter()
            try:
                with anyio.fail_after(wait):
                    latents = await self.encode(actor, group)
            except RETRYABLE as exc:
                self.dispatch.failed(actor, probe)
                errors.append(f"actor {actor}: {type(exc).__name__}: {exc}")
                continue
            except BaseException:
                if probe:  # cancelled, or a failure that ends the run: no answer is coming
                    self.dispatch.health[actor].probing = False
                raise
            self.answered.append(time.perf_counter() - sent)
            self.dispatch.succeeded(actor)
            await self.returns_in.send(("group", group.batch, group.index, latents))
            return
        raise GroupFailed(
            f"group {group.index} of batch {group.batch}: every encoder actor failed it ({n} tried); "
            + "; ".join(errors)
        )

    async def produce(self, batches: Iterable[Any], tg: TaskGroup) -> None:
        iterator = iter(batches)
        count = 0
        while self.config.max_steps is None or count < self.config.max_steps:
            await self.slots.acquire()  # at K batches in flight, reading waits here
            start = time.perf_counter()
            batch = await _read(iterator)
            self.result.timings.read_s += time.perf_counter() - start
            if batch is _END:
                self.slots.release()
                break
            groups = split_groups(count, _video_of(batch, count), self.config.group_size)
            await self.returns_in.send(("batch", count, batch, len(groups)))
            for group in groups:
                tg.start_soon(self.encode_group, group)
            count += 1
        await self.returns_in.send(("end", count))

    async def receive(self) -> None:
        pending: dict[int, tuple[dict[str, Any], list[torch.Tensor | None]]] = {}
        total: int | None = None
        emitted = 0
        async with self.completed_in:
            while total is None or emitted < total:
                message = await self.returns_out.receive()
                if message[0] == "batch":
                    _, index, batch, n_groups = message
                    pending[index] = (batch, [None] * n_groups)
                elif message[0] == "group":
                    _, index, group, latents = message
                    pending[index][1][group] = latents
                else:
                    total = message[1]
                # Complete batches go out in the order they were read.
                while emitted in pending and all(x is not None for x in pending[emitted][1]):
                    batch, parts = pending.pop(emitted)
                    latents = torch.cat([p for p in parts if p is not None], dim=0)
                    await self.completed_in.send({**batch, "latents": latents})
                    emitted += 1

    async def train(self, train_step: TrainStep, steps: _StepThread) -> None:
        timings = self.result.timings
        async with self.completed_out:
            while True:
                start = time.perf_counter()
                try:
                    batch = await self.completed_out.receive()
                except anyio.EndOfStream:
                    return
                timings.wait_s += time.perf_counter() - start
                start = time.perf_counter()
                loss = await steps.run(train_step, batch)
                timings.train_s += time.perf_counter() - start
                self.result.losses.append(_loss_value(loss))
                timings.steps += 1
                timings.samples += int(batch["video"].shape[0])
                self.slots.release()


async def train_remote(
    batches: Iterable[Any],
    train_step: TrainStep,
    encode: EncodeFn,
    n_actors: int,
    config: InflightConfig | None = None,
    *,
    clock: Callable[[], float] = time.monotonic,
) -> TrainResult:
    """Train on ``batches`` with their video encoded by ``n_actors`` encoder actors (see the module).

    ``clock``: the seconds the actors' back-offs are measured in (a test's fake clock).

    Raises:
        GroupFailed: a group failed on every actor; nothing was trained on its batch.
        ValueError: a batch has no (B, C, T, H, W) ``"video"``.
        Whatever ``train_step``, the encoder's handler (``RemoteError``) or the reading raised.
    """
    config = config or InflightConfig()
    rank = _Rank(encode, n_actors, config, clock)
    steps = _StepThread()
    start = time.perf_counter()
    try:
        async with rank.returns_in, rank.returns_out, anyio.create_task_group() as tg:
            tg.start_soon(rank.produce, batches, tg)
            tg.start_soon(rank.receive)
            tg.start_soon(rank.train, train_step, steps)
    except BaseExceptionGroup as group:
        raise _first_error(group) from None
    finally:
        steps.close()
    rank.result.timings.wall_s = time.perf_counter() - start
    return rank.result


def train_local(
    batches: Iterable[Any],
    train_step: TrainStep,
    encoder: nn.Module,
    config: InflightConfig | None = None,
) -> TrainResult:
    """Train on ``batches`` encoding inside the trainer: read, encode group by group, train.

    The same groups and frame mapping as :func:`train_remote` with ``EncoderActor``, so the same
    latents (to float32 rounding where the actors' cache answers; see the module);
    ``timings.wait_s`` is the time spent encoding. ``inflight``, ``rank`` and
    ``deadline_s`` do not apply.
    """
    config = config or InflightConfig()
    result = TrainResult()
    timings = result.timings
    start_run = time.perf_counter()
    iterator = iter(batches)
    count = 0
    while config.max_steps is None or count < config.max_steps:
        start = time.perf_counter()
        batch: Any = next(iterator, _END)
        timings.read_s += time.perf_counter() - start
        if batch is _END:
            break
        start = time.perf_counter()
        groups = split_groups(count, _video_of(batch, count), config.group_size)
        latents = torch.cat([encode_video(encoder, g.video) for g in groups], dim=0)
        timings.wait_s += time.perf_counter() - start
        start = time.perf_counter()
        loss = train_step({**batch, "latents": latents})
        timings.train_s += time.perf_counter() - start
        result.losses.append(_loss_value(loss))
        timings.steps += 1
        timings.samples += int(batch["video"].shape[0])
        count += 1
    timings.wall_s = time.perf_counter() - start_run
    return result
