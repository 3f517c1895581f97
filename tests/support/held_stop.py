"""A pipeline held between its finalisation and its end, for the tests that stop a run there:
its last stage's replica (``hook_stages.HeldStopStage``), stopped once its ``finalize`` ran,
writes ``held`` and holds its stop until ``release`` exists (or ``wait_s`` passed)."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TypeVar

import anyio

from support.hook_stages import read_records
from support.run_resume_helpers import running

__all__ = [
    "HELD_FINALS",
    "HELD_ITEMS",
    "cancelled_once_held",
    "finalized",
    "held_pipeline",
    "rerun_finalises_nothing",
]

T = TypeVar("T")

HELD_ITEMS = 4
HELD_FINALS = f"a finalised {HELD_ITEMS} items; b finalised {HELD_ITEMS} items"  # the finalize lines


def held_pipeline(tmp_path: Path, log: Path, held: Path, release: Path, wait_s: float = 9.0) -> Path:
    """The pipeline file: stage ``a`` records its hooks in ``log``, stage ``b`` too and holds
    its replica's stop; ``wait_s`` bounds the hold (under the stop grace of the node that runs
    it, which kills a replica that outstays it)."""
    path = tmp_path / "held.toml"
    path.write_text(
        f"""
[pipeline]
name = "held"
items = {HELD_ITEMS}

[[stages]]
name = "a"
actor = "support.hook_stages:RecordingStage"
kwargs = {{ log = {json.dumps(str(log))}, label = "a" }}

[[stages]]
name = "b"
actor = "support.hook_stages:HeldStopStage"
replicas = 1
max_replicas = 1

[stages.kwargs]
log = {json.dumps(str(log))}
label = "b"
held = {json.dumps(str(held))}
release = {json.dumps(str(release))}
wait_s = {wait_s}
""",
        encoding="utf-8",
    )
    return path


def finalized(log: Path) -> int:
    """How many finalize hooks ran, every run's."""
    return sum(1 for r in read_records(log) if r["hook"] == "finalize")


async def cancelled_once_held(
    run: Callable[[], Awaitable[T]], held: Path, release: Path, wait_s: float
) -> list[T]:
    """Start ``run``, cancel it once ``held`` exists (a pipeline's: its last stage's replica
    holds its stop, its finalize hooks returned; a training's: ``support.held_train``), then
    let the hold go (``release``); what ``run`` returned (nothing where it raised the
    cancellation). ``wait_s`` bounds the wait for the hold."""
    returned: list[T] = []

    async def keep() -> None:
        returned.append(await run())

    async with anyio.create_task_group() as tg:
        tg.start_soon(keep)
        with anyio.fail_after(wait_s):
            while not held.exists():
                await anyio.sleep(0.05)
        tg.cancel_scope.cancel()
        release.write_text("")
    return returned


def rerun_finalises_nothing(args: list[str], tmp_path: Path, log: Path, wait_s: float) -> None:
    """``troupe *args`` again, after a run stopped once its finalisation was done: it says
    ``already complete`` and runs no finalize hook again (each stage's ran once, in ``log``)."""
    with running(args, tmp_path, "rerun") as rerun:
        assert rerun.wait(timeout=wait_s) == 0, rerun.text()[-3000:]
        flat = " ".join(rerun.text().split())
    assert f"already complete: {HELD_FINALS}" in flat, flat[-3000:]
    assert "finalising" not in flat
    assert finalized(log) == 2  # the rerun finalised nothing again
