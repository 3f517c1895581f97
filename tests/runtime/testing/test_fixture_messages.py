"""What the pytest fixture says when a node is not ready, has died, or a job does not end.

A fake node process and fake replies stand in for a node: each failure is told from what the
node last said (or that its process exited), not guessed by the user from a bare timeout.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import pytest

from troupe.runtime.errors import AskTimeout
from troupe.runtime.testing.cluster import Cluster
from troupe.runtime.testing.plugin import ClusterStartError, _wait_started


class FakeProc:
    """A node process that runs until ``returncode`` is set."""

    def __init__(self, returncode: int | None = None) -> None:
        self.returncode = returncode
        self.pid = 0

    def poll(self) -> int | None:
        return self.returncode


def fake_cluster(tmp_path: Path, proc: FakeProc, reply: Any) -> Cluster:
    cluster = Cluster(proc, "tcp://127.0.0.1:26999", "t", tmp_path, "tcp://127.0.0.1:26998")  # type: ignore[arg-type]

    async def answer(*_args: Any, **_kwargs: Any) -> Any:
        await anyio.sleep(0.01)  # a reply takes a moment: the waits are polls, not spins
        if isinstance(reply, Exception):
            raise reply
        return reply

    cluster.supervision = answer  # type: ignore[method-assign]
    cluster.master_control = answer  # type: ignore[method-assign]
    return cluster


HANGING = {
    "workers": [
        {"name": "w-ok", "state": "running", "pid": 11, "restarts": 0, "exit": ""},
        {"name": "w-h", "state": "starting", "pid": 12, "restarts": 0, "exit": ""},
    ],
    "supervision": {"enabled": True, "supervisor": {"workers": {"w-ok": {"pid": 11}}}},
}


async def test_a_node_not_ready_in_time_names_each_worker_not_ready_and_its_state(tmp_path: Path) -> None:
    """Before: "node 't' not ready within 8s (exit 143)", where 143 was the fixture's own
    SIGTERM of the reap, and no worker named."""
    with pytest.raises(ClusterStartError) as caught:
        await _wait_started(fake_cluster(tmp_path, FakeProc(), HANGING), timeout=0.2)
    said = str(caught.value)
    assert "troupe node 't' not ready within 0.2s; workers not ready: 'w-h' starting (pid 12" in said, said
    assert "w-ok" not in said and "exit" not in said, said
    assert str(tmp_path) in said, said


async def test_a_node_that_never_answers_in_time_says_so(tmp_path: Path) -> None:
    cluster = fake_cluster(tmp_path, FakeProc(), AskTimeout("no reply"))
    with pytest.raises(
        ClusterStartError, match=r"node 't' never answered within 0\.2s \(it was still running\)"
    ):
        await _wait_started(cluster, timeout=0.2)


async def test_wait_for_after_the_node_died_says_it_exited_with_its_status(tmp_path: Path) -> None:
    """Before: "the node never answered within 3 s", after waiting all of it."""
    cluster = fake_cluster(tmp_path, FakeProc(-9), AskTimeout("no reply"))
    with pytest.raises(RuntimeError, match=r"wait_for: troupe node 't' exited \(-9\)") as caught:
        await cluster.wait_for(lambda s: False, timeout=30)  # at once, not after the timeout
    assert "lambda s: False" in str(caught.value)


async def test_run_job_past_its_timeout_says_what_the_job_waits_for(tmp_path: Path) -> None:
    reason = "waiting for kind mien: no live worker runs it"
    job = {
        "state": "running",
        "counts": {"pending": 1, "leased": 0},
        "waiting": [{"kind": "mien", "needs": {"cpu": 1.0, "gpu": 0}, "tasks": 1, "reason": reason}],
    }
    cluster = fake_cluster(tmp_path, FakeProc(), job)
    with pytest.raises(
        TimeoutError, match=rf"job 'a' still running after 3s: .*'pending': 1.*; 1 task\(s\) {reason}"
    ):
        await cluster.wait_job("a", timeout=3)
