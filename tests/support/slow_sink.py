"""A benchmark sink that answers its first ``expect`` and ``echo`` seconds late, alive and saying
progress meanwhile: a sink starved of CPU on a loaded machine, as its source sees it."""

from __future__ import annotations

from typing import Any

import anyio

from troupe.cli.bench.actors import Sink
from troupe.runtime import handles

LATE_S = 3.0  # twice the source's progress timeout in tests/e2e/test_bench_source_progress.py


class SlowSink(Sink):
    def __init__(self) -> None:
        super().__init__()
        self.late: set[str] = {"expect", "echo"}  # each answered late once

    async def _late(self, kind: str) -> None:
        if kind in self.late:
            self.late.discard(kind)
            with anyio.move_on_after(LATE_S):
                while True:
                    self.progress()  # busy, not hung: its own supervisor leaves it be
                    await anyio.sleep(0.1)

    @handles("expect")
    async def expect_late(self, n: int) -> None:
        await self._late("expect")
        self.expect(n)

    @handles("echo")
    async def echo_late(self, payload: Any) -> Any:
        await self._late("echo")
        return payload
