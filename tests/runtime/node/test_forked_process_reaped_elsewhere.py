"""A ``ForkedProcess`` whose pid is not (or no longer) this process's child: a node's stop failed
with ``ChildProcessError`` on one, once, in a run that raced another for its ports. It is waited
for until gone, then ends with ``UNKNOWN_EXIT`` and a warning."""

from __future__ import annotations

import subprocess
import sys

import anyio
import pytest

from support.log_capture import module_logs
from troupe.runtime.node import forked_process
from troupe.runtime.node.forked_process import UNKNOWN_EXIT, ForkedProcess

WAIT_S = 60  # a bound against a hang, not a measure

# A child that starts a grandchild reading our pipe (its stdin, inherited), prints its pid and
# waits for it: the grandchild is not our child, and ends when we close the pipe.
PARENT = (
    "import subprocess, sys\n"
    "p = subprocess.Popen([sys.executable, '-c', 'import sys; sys.stdin.read()'])\n"
    "print(p.pid, flush=True)\n"
    "p.wait()\n"
)


async def test_a_child_someone_else_reaped_ends_with_an_unknown_exit(monkeypatch: pytest.MonkeyPatch) -> None:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()  # its status is taken: the pid is nobody's child now
    with module_logs(monkeypatch, forked_process) as logs, anyio.fail_after(WAIT_S):
        assert await ForkedProcess(proc.pid, None).wait() == UNKNOWN_EXIT
    assert [(e["event"], e["child_pid"]) for e in logs] == [("child_reaped_elsewhere", proc.pid)]


async def test_a_live_process_that_is_not_our_child_is_waited_for_until_it_ends(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    parent = subprocess.Popen(
        [sys.executable, "-c", PARENT], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert parent.stdout is not None and parent.stdin is not None
        grandchild = int(parent.stdout.readline())
        waited = ForkedProcess(grandchild, None)
        with module_logs(monkeypatch, forked_process) as logs, anyio.fail_after(WAIT_S):
            async with anyio.create_task_group() as tg:
                codes: list[int] = []

                async def wait() -> None:
                    codes.append(await waited.wait())

                tg.start_soon(wait)
                await anyio.wait_all_tasks_blocked()
                assert codes == []  # alive: still waited for
                parent.stdin.close()  # the grandchild reads its end: it exits
        assert codes == [UNKNOWN_EXIT]
        assert [e["event"] for e in logs] == ["child_reaped_elsewhere"]
    finally:
        parent.kill()
        parent.wait(WAIT_S)
        for pipe in (parent.stdin, parent.stdout):
            if pipe is not None:
                pipe.close()
