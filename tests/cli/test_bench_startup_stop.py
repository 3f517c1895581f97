"""A stop during ``troupe bench messaging``'s start-up measurement SIGTERMs the node it started
at once: it waited 15 s for a node never told to stop, then SIGKILLed it (finding sg 2)."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import anyio
import pytest

from troupe.cli.bench import bench_children, messaging

WITHIN_S = 60.0  # a bound on a hang, not on speed
# A node that never comes up, and ends by itself at the latest by then: none is left for long.
_NEVER_UP = [sys.executable, "-c", "import time; time.sleep(120)"]


def test_a_stop_during_the_startup_measurement_sigterms_the_node(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    started: list[subprocess.Popen[Any]] = []
    real_start = bench_children.start

    def start(args: list[str], **popen_kwargs: Any) -> subprocess.Popen[Any]:
        proc = real_start(_NEVER_UP, **popen_kwargs)
        started.append(proc)
        return proc

    monkeypatch.setattr(messaging.bench_children, "start", start)

    async def stopped_while_probing() -> None:
        async with anyio.create_task_group() as tg:
            tg.start_soon(messaging.measure_startup, tmp_path)
            with anyio.fail_after(WITHIN_S):
                while not started:
                    await anyio.sleep(0.01)
            await anyio.sleep(0.2)  # into the probe
            tg.cancel_scope.cancel()  # what the bench's stop does to it

    try:
        anyio.run(stopped_while_probing)
    finally:
        for proc in started:
            if proc.poll() is None:
                proc.kill()
            proc.wait(WITHIN_S)
    assert len(started) == 1
    # SIGTERM, as the stop sent it; not the SIGKILL that ended the wait for a node never told to stop.
    assert started[0].returncode == -signal.SIGTERM
