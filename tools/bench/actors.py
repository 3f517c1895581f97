"""Actors that the messaging benchmark runs in real worker processes."""

from __future__ import annotations

import time
from typing import Any

import anyio
import numpy as np

from troupe.runtime import Actor, handles

__all__ = ["Sink", "Source"]

# A run is one message handler: it reports progress as it goes, so that a long run (a slow or
# busy machine, CURVE) is not killed by its supervisor as making none. Every 256 messages: a
# machine busy with other work ran 1,024 asks one at a time past a half-second progress
# timeout (CI, beside another suite's runs); a report costs a counter's increment.
_PROGRESS_EVERY = 256


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
        await sink.ask("expect", n)
        t0 = time.perf_counter()
        for i in range(n):
            await sink.tell("hit", payload)
            if not i % _PROGRESS_EVERY:
                self.progress(_PROGRESS_EVERY)
        while await sink.ask("count", timeout=60) < n:
            self.progress()
            await anyio.sleep(0.001)
        return n / (time.perf_counter() - t0)

    @handles("asks")
    async def asks(self, spec: dict[str, Any]) -> float:
        sink = self.ref(spec["target"])
        n, window = int(spec["n"]), int(spec["window"])
        payload = bench_payload(spec["kind"])
        self.progress()  # begun: the resolve and the connection may take a while on a busy machine
        await sink.ask("echo", payload)  # resolve and connect before timing
        per = n // window

        async def loop() -> None:
            for i in range(per):
                await sink.ask("echo", payload, timeout=60)
                if not i % _PROGRESS_EVERY:
                    self.progress(_PROGRESS_EVERY)

        t0 = time.perf_counter()
        async with anyio.create_task_group() as tg:
            for _ in range(window):
                tg.start_soon(loop)
        return per * window / (time.perf_counter() - t0)
