"""A supervisor's kill report that the node reads only after the killed worker's exit (a node
too busy to answer within the supervisor's wait) still says why the worker died."""

from __future__ import annotations

from types import SimpleNamespace

import anyio

from troupe.runtime.node.config import NodeConfig, WorkerSpec
from troupe.runtime.node.worker_handles import HandleState, WorkerHandle
from troupe.runtime.supervision.node_side import NodeSupervision


def running(spec: WorkerSpec, pid: int) -> WorkerHandle:
    handle = WorkerHandle(spec)
    handle.state = HandleState.RUNNING
    handle.pid = pid
    return handle


def supervision_of(workers: dict[str, WorkerHandle]) -> NodeSupervision:
    node = SimpleNamespace(
        config=NodeConfig(name="n"),
        name="n",
        workers=workers,
        worker_exit_listeners=[],
        stopping=anyio.Event(),
    )
    return NodeSupervision(node)  # type: ignore[arg-type]


def report(pid: int) -> dict[str, object]:
    return {"worker": "w", "pid": pid, "reason": "no_heartbeat", "silent_s": 3.2, "last_status": None}


async def test_a_report_read_after_the_exit_and_the_restart_is_kept_as_late() -> None:
    spec = WorkerSpec(name="w", actors=[])
    first = running(spec, 100)
    workers = {"w": first}
    supervision = supervision_of(workers)
    first.exited(-9)
    supervision.worker_exited(first)  # reaped before the report was read: a restart is due
    workers["w"] = running(spec, 200)  # the restart registered too
    assert await supervision._worker_killed(report(100)) is True
    assert supervision.kills["w"]["reason"] == "no_heartbeat"
    assert supervision.kills["w"]["late"] is True
    assert 100 not in supervision._reasons  # the exit is reported: nothing waits on this pid


async def test_a_report_of_a_pid_that_was_never_the_workers_last_is_dropped() -> None:
    spec = WorkerSpec(name="w", actors=[])
    supervision = supervision_of({"w": running(spec, 200)})
    assert await supervision._worker_killed(report(100)) is False
    assert supervision.kills == {}


async def test_a_report_on_time_notes_the_reason_for_the_exit_to_come() -> None:
    spec = WorkerSpec(name="w", actors=[])
    supervision = supervision_of({"w": running(spec, 200)})
    assert await supervision._worker_killed(report(200)) is True
    assert "late" not in supervision.kills["w"]
    assert supervision._reasons[200] == "no_heartbeat"
