"""Stage classes for the tests of the stage lifecycle hooks and the ``run_pipeline`` API.

Worker processes load them as ``support.hook_stages:RecordingStage`` (``tests/`` on
``PYTHONPATH``). What they see goes to a JSON-lines file (``log``) shared by every replica of
every stage of a run: each record is one ``os.write`` on an ``O_APPEND`` descriptor, so lines
from several processes never interleave, and the file's order is the order of the writes.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import anyio
import psutil

from troupe.runtime.core.actor import Actor
from troupe.runtime.errors import ItemFailed
from troupe.runtime.pipeline.stage import StageActor, StageRun

__all__ = [
    "AttemptStage",
    "CommittedStage",
    "DiskFullStage",
    "EchoStage",
    "ExitingStage",
    "FailingFinalizeStage",
    "FailingSeedStage",
    "GatedOutputStage",
    "GatedStage",
    "HeldStopStage",
    "NotAStage",
    "OutputFileStage",
    "RecordingStage",
    "SlowStartStage",
    "TemplateGoneStage",
    "UpstreamGoneStage",
    "UpstreamStage",
    "append_record",
    "read_records",
]


def append_record(log: str, record: dict[str, Any]) -> None:
    """Append ``record`` to the JSON-lines file ``log`` in one write (processes never interleave)."""
    line = (json.dumps(record, sort_keys=True) + "\n").encode()
    fd = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line)
    finally:
        os.close(fd)


def read_records(log: Path) -> list[dict[str, Any]]:
    """Every record written to ``log`` so far, in order (none if it does not exist)."""
    try:
        text = log.read_text(encoding="utf-8")
    except FileNotFoundError:
        return []
    return [json.loads(line) for line in text.splitlines() if line.strip()]


class RecordingStage(StageActor):
    """Records each ``start``, ``process`` and ``finalize`` call, then passes the item on.

    Args:
        log: the JSON-lines file to append to.
        label: names this stage in the records of ``process`` (hooks name it via StageRun).
        cost_s: seconds each item takes (a sleep).
        prune_every: prune items whose seed is divisible by this (0: never).
    """

    def __init__(self, log: str, label: str = "", cost_s: float = 0.0, prune_every: int = 0) -> None:
        self.log = log
        self.label = label
        self.cost_s = cost_s
        self.prune_every = prune_every

    def _record(self, kind: str, **fields: Any) -> None:
        append_record(self.log, {"hook": kind, "pid": os.getpid(), "ppid": os.getppid(), **fields})

    def start(self, run: StageRun) -> list[str]:
        self._record("start", **run.to_wire())
        return []

    def process(self, item: dict[str, Any]) -> dict[str, Any]:
        self._record("process", stage=self.label, task_id=item["task_id"], seed=item["seed"])
        if self.cost_s:
            time.sleep(self.cost_s)
        if self.prune_every and int(item["seed"]) % self.prune_every == 0:
            raise ItemFailed(f"seed {item['seed']} pruned by the test")
        return {"task_id": item["task_id"], "seed": item["seed"]}

    def finalize(self, run: StageRun) -> dict[str, Any]:
        self._record("finalize", **run.to_wire())
        return {"summary": f"{run.stage} finalised {run.items} items", "stage": run.stage, "pid": os.getpid()}


class CommittedStage(RecordingStage):
    """A :class:`RecordingStage` whose ``start`` names ``committed`` as committed already.

    Args:
        committed: task ids whose output an earlier run committed.
    """

    def __init__(self, log: str, committed: list[str], label: str = "", cost_s: float = 0.0) -> None:
        super().__init__(log, label, cost_s)
        self.committed = list(committed)

    def start(self, run: StageRun) -> list[str]:
        super().start(run)
        return self.committed


class FailingFinalizeStage(RecordingStage):
    """A :class:`RecordingStage` whose ``finalize`` raises.

    Args:
        fail_while: raise only while this file exists (default: always).
    """

    MESSAGE = "finalize broke on purpose"

    def __init__(self, log: str, label: str = "", fail_while: str = "") -> None:
        super().__init__(log, label)
        self.fail_while = fail_while

    def finalize(self, run: StageRun) -> dict[str, Any]:
        if self.fail_while and not Path(self.fail_while).exists():
            return super().finalize(run)
        self._record("finalize", **run.to_wire())
        raise RuntimeError(self.MESSAGE)


class HeldStopStage(RecordingStage):
    """A :class:`RecordingStage` whose replica, stopped once its stage's ``finalize`` ran, writes
    the file ``held`` and waits (``wait_s`` at most) for the file ``release``: it holds the run
    between its finalisation and its end (the replicas' stop), for a test to stop it there.
    A replica stopped before (the scaler's) holds nothing.

    Args:
        held: the file written as the stop is held.
        release: the file that ends the hold.
        wait_s: the hold's bound (under the run's node's stop grace, 10 s).
    """

    def __init__(self, log: str, held: str, release: str, label: str = "", wait_s: float = 9.0) -> None:
        super().__init__(log, label)
        self.held = Path(held)
        self.release = Path(release)
        self.wait_s = wait_s

    async def stopping(self) -> None:
        finalised = any(
            r["hook"] == "finalize" and r.get("stage") == self.label for r in read_records(Path(self.log))
        )
        if not finalised:
            return
        self.held.write_text(str(os.getpid()), encoding="utf-8")
        with anyio.move_on_after(self.wait_s):
            while not self.release.exists():
                await anyio.sleep(0.02)


class OutputFileStage(FailingFinalizeStage):
    """Commits one file per item in ``outputs`` (named by its task id) and names every file
    there from ``start``, as the dataset writer does with its episodes; ``finalize`` fails
    while ``fail_while`` exists.

    Args:
        outputs: the directory of the committed files.
    """

    start_lists_every_output = True

    def __init__(self, log: str, outputs: str, fail_while: str) -> None:
        super().__init__(log, "w", fail_while)
        self.outputs = Path(outputs)

    def start(self, run: StageRun) -> list[str]:
        super().start(run)
        self.outputs.mkdir(parents=True, exist_ok=True)
        return sorted(p.name for p in self.outputs.iterdir())

    def process(self, item: dict[str, Any]) -> dict[str, Any]:
        out = super().process(item)
        staged = self.outputs / f".{item['task_id']}.tmp"
        staged.write_text(str(item["seed"]), encoding="utf-8")
        staged.rename(self.outputs / item["task_id"])
        return out


_GATE_POLL_S = 0.02
_GATE_MOST_S = 300.0  # a gate never opened errs the item rather than hang the run


async def _held_at(held: str, gate: str) -> None:
    """Write the file ``held``, then wait (on the event loop: the replica stays live) until the
    file ``gate`` exists."""
    Path(held).write_text(str(os.getpid()), encoding="utf-8")
    with anyio.fail_after(_GATE_MOST_S):
        while not os.path.exists(gate):
            await anyio.sleep(_GATE_POLL_S)


class GatedStage(RecordingStage):
    """A :class:`RecordingStage` that holds each item until the file ``gate`` exists, having
    written the file ``held``: a run held before its last stage, for a test to stop it there.

    Args:
        held: the file written as an item is held.
        gate: the file that lets the items go on.
    """

    def __init__(self, log: str, held: str, gate: str, label: str = "") -> None:
        super().__init__(log, label)
        self.held, self.gate = held, gate

    async def process(self, item: dict[str, Any]) -> dict[str, Any]:  # type: ignore[override]
        await _held_at(self.held, self.gate)
        return super().process(item)


class GatedOutputStage(OutputFileStage):
    """An :class:`OutputFileStage` that, once it committed an item's file, holds the answer
    until the file ``gate`` exists, having written the file ``held``: a run whose output is
    committed while the run has not heard of it yet, for a test to kill it there.

    Args:
        held: the file written as a committed item is held.
        gate: the file that lets the answers go.
    """

    def __init__(self, log: str, outputs: str, held: str, gate: str) -> None:
        super().__init__(log, outputs, fail_while=str(Path(outputs) / ".never"))
        self.held, self.gate = held, gate

    async def process(self, item: dict[str, Any]) -> dict[str, Any]:  # type: ignore[override]
        out = super().process(item)
        await _held_at(self.held, self.gate)
        return out


class ExitingStage(StageActor):
    """Calls ``sys.exit(3)`` on the items whose seed is divisible by ``exit_every``, as code that
    gives up on the process does; passes the others on."""

    def __init__(self, exit_every: int) -> None:
        self.exit_every = exit_every

    def process(self, item: dict[str, Any]) -> dict[str, Any]:
        if int(item["seed"]) % self.exit_every == self.exit_every - 1:
            sys.exit(3)
        return {"task_id": item["task_id"], "seed": item["seed"]}


class FailingSeedStage(StageActor):
    """Raises (a retryable error) on every attempt at the seeds divisible by ``every``."""

    def __init__(self, every: int) -> None:
        self.every = every

    def process(self, item: dict[str, Any]) -> dict[str, Any]:
        if int(item["seed"]) % self.every == 0:
            raise OSError(f"seed {item['seed']} always fails")
        return {"task_id": item["task_id"], "seed": item["seed"]}


class DiskFullStage(StageActor):
    """Fails (``ENOSPC``) at the seeds divisible by ``every`` while the file ``full`` exists, as a
    writer does on a full disk; records every item it passes in ``log``."""

    def __init__(self, every: int, full: str, log: str) -> None:
        self.every, self.full, self.log = every, full, log

    def process(self, item: dict[str, Any]) -> dict[str, Any]:
        if int(item["seed"]) % self.every == 0 and os.path.exists(self.full):
            raise OSError(28, "No space left on device")
        append_record(self.log, {"task_id": item["task_id"], "attempt": item.get("attempt")})
        return {"task_id": item["task_id"], "seed": item["seed"]}


class SlowStartStage(StageActor):
    """A constructor that waits ``wait_s`` (for a device, a licence server) before it returns."""

    def __init__(self, wait_s: float) -> None:
        time.sleep(wait_s)

    def process(self, item: dict[str, Any]) -> dict[str, Any]:
        return {"task_id": item["task_id"], "seed": item["seed"]}


class AttemptStage(StageActor):
    """Records the ``attempt`` each item carries; errs (retryably) on attempt 0 of some seeds.

    Stateless on purpose: whichever replica gets the retry, it passes, because the item says it
    is attempt 1.

    Args:
        log: the JSON-lines file to append to.
        fail_every: err on the first attempt at seeds divisible by this (0: never).
    """

    def __init__(self, log: str, fail_every: int = 0) -> None:
        self.log = log
        self.fail_every = fail_every

    def process(self, item: dict[str, Any]) -> dict[str, Any]:
        seed, attempt = int(item["seed"]), item.get("attempt")
        append_record(
            self.log, {"hook": "process", "task_id": item["task_id"], "seed": seed, "attempt": attempt}
        )
        if self.fail_every and seed % self.fail_every == 0 and attempt == 0:
            raise OSError(f"first attempt at seed {seed} fails on purpose")
        return {"task_id": item["task_id"], "seed": seed}


class DoomedStage(StageActor):
    """Raises on every item: every item of a run through it dies."""

    def process(self, item: Any) -> Any:
        raise KeyError("no such scene")


class DoomedStoreStage(DoomedStage):
    """Every item dies, and its finalize fails over no output, as the dataset writer's does."""

    def finalize(self, run: StageRun) -> dict[str, Any]:
        raise ValueError("no committed output to finalize")


class PruningStoreStage(DoomedStoreStage):
    """Every item is pruned (a planner that finds no path in any scene), and its finalize fails
    over no output, as the dataset writer's does."""

    def process(self, item: Any) -> Any:
        raise ItemFailed(f"seed {item['seed']}: no path to the goal")


class EchoStage(StageActor):
    """Returns its input as its output."""

    def process(self, item: Any) -> Any:
        return item


class UpstreamStage(StageActor):
    """Records its pid with each item, and has no ``finalize`` hook.

    Args:
        log: the JSON-lines file to append to.
    """

    def __init__(self, log: str) -> None:
        self.log = log

    def process(self, item: dict[str, Any]) -> dict[str, Any]:
        append_record(self.log, {"hook": "process", "stage": "upstream", "pid": os.getpid()})
        return item


class UpstreamGoneStage(EchoStage):
    """Its ``finalize`` waits (up to ``wait_s``) for the processes of the :class:`UpstreamStage`
    replicas to be gone, and says whether they went before it returned.

    Args:
        log: the JSON-lines file the upstream replicas wrote to.
        wait_s: how long to wait for them.
    """

    def __init__(self, log: str, wait_s: float = 30.0) -> None:
        self.log = Path(log)
        self.wait_s = wait_s

    def finalize(self, run: StageRun) -> dict[str, Any]:
        pids = {r["pid"] for r in read_records(self.log) if r.get("stage") == "upstream"}
        deadline = time.monotonic() + self.wait_s
        while any(_alive(pid) for pid in pids) and time.monotonic() < deadline:
            time.sleep(0.01)
        return {"upstream": sorted(pids), "gone": not any(_alive(pid) for pid in pids)}


class TemplateGoneStage(EchoStage):
    """Its ``finalize`` waits (up to ``wait_s``) until its node (its parent) has no template
    process left, and says whether none was left before it returned."""

    def __init__(self, wait_s: float = 30.0) -> None:
        self.wait_s = wait_s

    def finalize(self, run: StageRun) -> dict[str, Any]:
        deadline = time.monotonic() + self.wait_s
        while _templates() and time.monotonic() < deadline:
            time.sleep(0.01)
        return {"templates_left": len(_templates())}


def _templates() -> list[int]:
    """The node's children that are templates (by their titles), zombies not counted."""
    found = []
    for child in psutil.Process(os.getppid()).children():
        with contextlib.suppress(psutil.Error):
            if child.status() != psutil.STATUS_ZOMBIE and "template" in " ".join(child.cmdline()):
                found.append(child.pid)
    return found


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


class NotAStage(Actor):
    """An actor that is no stage: it starts (any kwargs) but answers no stage message."""

    def __init__(self, **kwargs: Any) -> None:
        self.kwargs = kwargs
