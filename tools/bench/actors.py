"""Actors that the messaging benchmark runs in real worker processes."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
import numpy as np

from troupe.runtime import Actor, handles

__all__ = ["Sink", "Source"]

# A run is one message handler: it reports progress as it goes, so that a long run (a slow or
# busy machine, CURVE) is not killed by its supervisor as making none. By the clock, not by a
# count: a machine busy with other work ran 256 asks past a half-second progress timeout (CI,
# beside another suite's runs). The clock is read every few messages only: a tell costs about
# two microseconds, a clock read a twentieth of that.
_REPORT_S = 0.05


class _Progress:
    """Reports an actor's progress at most every ``_REPORT_S``, with the messages sent since;
    the clock is read every ``check_every`` messages."""

    def __init__(self, actor: Actor, check_every: int) -> None:
        self.actor = actor
        self.check_every = check_every
        self.sent = 0
        self.next_report = time.monotonic() + _REPORT_S

    def sent_one(self) -> None:
        self.sent += 1
        if self.sent % self.check_every == 0 and time.monotonic() >= self.next_report:
            self.actor.progress(self.sent)
            self.sent = 0
            self.next_report = time.monotonic() + _REPORT_S


@asynccontextmanager
async def _waiting_said(actor: Actor) -> AsyncIterator[None]:
    """Progress said every ``_REPORT_S`` while the body runs: it waits on the sink, and a sink
    starved of CPU by a loaded machine answers (or takes tells) seconds late, which is no stall of
    this actor's: it was killed as one mid-measurement. A stuck event loop here still stops the
    heartbeats."""

    done = anyio.Event()

    async def tick() -> None:  # the runtime's task: an error of the body's stays as it was raised
        while not done.is_set():
            with anyio.move_on_after(_REPORT_S):
                await done.wait()
            actor.progress()

    actor.runtime.start_soon(tick)
    try:
        yield
    finally:
        done.set()


def bench_payload(kind: str) -> Any:
    """About 100 bytes for ``small``; a 1 MiB float64 array for ``large``."""
    if kind == "large":
        return np.ones(1 << 17, dtype=np.float64)
    return b"x" * 100


class Sink(Actor):
    """Counts ``hit`` tells and echoes ``echo`` asks."""

    mailbox_capacity = 10_000

    def __init__(self) -> None:
        self.count = 0
        self.target = 0
        self.reached = anyio.Event()

    @handles("hit")
    def hit(self, _: Any) -> None:
        self.count += 1
        if self.count == self.target:
            self.reached.set()

    @handles("echo")
    def echo(self, payload: Any) -> Any:
        return payload

    @handles("expect")
    def expect(self, n: int) -> None:
        self.count = 0
        self.target = n
        self.reached = anyio.Event()

    @handles("count")
    def current(self, _: Any) -> int:
        return self.count


class Source(Actor):
    """Drives the load: tells or asks to a sink, and reports the rate it saw."""

    @handles("tells")
    async def tells(self, spec: dict[str, Any]) -> float:
        sink = self.ref(spec["target"])
        n = int(spec["n"])
        payload = bench_payload(spec["kind"])
        self.progress()  # begun: the resolve and the connection may take a while on a busy machine
        async with _waiting_said(self):
            await sink.ask("expect", n)
            progress = _Progress(self, check_every=64)
            t0 = time.perf_counter()
            for _ in range(n):
                await sink.tell("hit", payload)
                progress.sent_one()
            while await sink.ask("count", timeout=60) < n:
                await anyio.sleep(0.001)
            return n / (time.perf_counter() - t0)

    @handles("asks")
    async def asks(self, spec: dict[str, Any]) -> float:
        sink = self.ref(spec["target"])
        n, window = int(spec["n"]), int(spec["window"])
        payload = bench_payload(spec["kind"])
        self.progress()  # begun: the resolve and the connection may take a while on a busy machine
        per = n // window
        progress = _Progress(self, check_every=1)  # an ask takes a hundred microseconds or more

        async def loop() -> None:
            for _ in range(per):
                await sink.ask("echo", payload, timeout=60)
                progress.sent_one()

        async with _waiting_said(self):
            await sink.ask("echo", payload)  # resolve and connect before timing
            t0 = time.perf_counter()
            async with anyio.create_task_group() as tg:
                for _ in range(window):
                    tg.start_soon(loop)
            return per * window / (time.perf_counter() - t0)
