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

The parts: :mod:`.inflight_types` (the settings, groups, errors and results),
:mod:`.inflight_dispatch` (the round robin and the actors' health) and :mod:`.inflight_groups`
(a batch's video cut into groups and encoded, here or by the actors); their public names are
re-exported here.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import anyio
import torch
from anyio.abc import TaskGroup
from torch import nn

from .inflight_dispatch import PROBE_ANSWERS, Dispatch, RoundRobin, probe_wait_s
from .inflight_groups import actor_encoder, encode_video, split_groups, video_of
from .inflight_types import (
    RETRYABLE,
    EncodeFn,
    GroupFailed,
    InflightConfig,
    SampleGroup,
    StageTimings,
    TrainResult,
    TrainStep,
)

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
        self.dispatch = Dispatch(n_actors, config, clock, self.result.skipped)
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
            groups = split_groups(count, video_of(batch, count), self.config.group_size)
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
        groups = split_groups(count, video_of(batch, count), config.group_size)
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
