"""A worker SIGKILLed by no part of troupe (most often the kernel's OOM killer) says so, with its
last sampled memory and, where the node's memory cgroup counts them, that its OOM killer ran:
it said only "killed by SIGKILL", the words of any kill, in ``ctl status``, the dead letters
and the log (report rs 2). The kill here is the test's own; the cgroup counts are fakes."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from support.local_node import echo_node_config, running_node
from support.memory_master import until
from support.port_range import test_endpoint
from troupe.runtime.node.config import WorkerSpec
from troupe.runtime.node.worker_handles import WorkerHandle
from troupe.runtime.supervision.memory_kills import MemorySamples, oom_kills

WAIT_S = 60.0  # a bound on a worker's start and restart on a loaded machine, not on speed


async def test_a_sigkill_from_outside_says_not_by_troupe_with_the_rss(tmp_path: Path) -> None:
    async with running_node(echo_node_config(tmp_path, "oomnode", endpoint=test_endpoint())) as node:
        w1 = node.workers["w1"]
        await until(lambda: "w1" in node.supervision.memory.rss, WAIT_S)  # sampled once at least
        assert w1.pid is not None
        exits: list[str] = []
        node.worker_exit_listeners.append(lambda _handle, reason: exits.append(reason))
        os.kill(w1.pid, signal.SIGKILL)  # as the OOM killer does: no part of troupe knows of it
        await until(lambda: exits, WAIT_S)
    assert exits[0].startswith("killed by SIGKILL (not by troupe; rss was "), exits
    assert exits[0].endswith(" at its last sample: the kernel's OOM killer?)"), exits


async def test_a_kill_troupe_made_says_its_own_reason(tmp_path: Path) -> None:
    async with running_node(echo_node_config(tmp_path, "chaosnode", endpoint=test_endpoint())) as node:
        w1 = node.workers["w1"]
        await until(lambda: w1.pid is not None and w1.endpoint is not None, WAIT_S)
        exits: list[str] = []
        node.worker_exit_listeners.append(lambda _handle, reason: exits.append(reason))
        node.supervision.note_kill(w1.pid, "no_heartbeat")  # what the supervisor's report does
        assert w1.pid is not None
        os.kill(w1.pid, signal.SIGKILL)
        await until(lambda: exits, WAIT_S)
    # The first exit is the kill's; the restarted worker's own, at the node's stop, may follow.
    assert exits[0] == "no_heartbeat" and not any("OOM" in reason for reason in exits), exits


def test_the_cgroup_s_oom_killer_is_named_where_its_count_rose() -> None:
    counts = iter([3, 4, 4])
    samples = MemorySamples(lambda: next(counts))
    samples.rss["w1"] = 3 * 2**30 // 2
    assert samples.unexplained_kill("w1") == (
        "not by troupe: the OOM killer of the node's memory cgroup ran (its oom_kill count rose); "
        "rss was 1.5 GiB at its last sample"
    )
    assert samples.unexplained_kill("w2") == "not by troupe: the kernel's OOM killer?"  # unchanged count


@pytest.mark.parametrize(
    ("cgroup", "file", "text"),
    [
        ("0::/a/b\n", "a/b/memory.events", "low 0\nhigh 0\nmax 2\noom 2\noom_kill 2\n"),
        (
            "4:memory:/x\n0::/\n",
            "memory/x/memory.oom_control",
            "oom_kill_disable 0\nunder_oom 0\noom_kill 2\n",
        ),
    ],
    ids=["v2", "v1"],
)
def test_the_oom_kill_count_is_read_from_v1_and_v2(tmp_path: Path, cgroup: str, file: str, text: str) -> None:
    proc = tmp_path / "cgroup"
    proc.write_text(cgroup)
    (tmp_path / file).parent.mkdir(parents=True)
    (tmp_path / file).write_text(text)
    assert oom_kills(proc, tmp_path) == 2


def test_no_readable_cgroup_counts_nothing(tmp_path: Path) -> None:
    assert oom_kills(tmp_path / "missing", tmp_path) is None
    (tmp_path / "cgroup").write_text("0::/hidden\n")
    assert oom_kills(tmp_path / "cgroup", tmp_path) is None


def test_a_worker_never_sampled_gets_the_hint_without_a_size() -> None:
    samples = MemorySamples(lambda: None)
    samples.sample([WorkerHandle(WorkerSpec(name="w9"))])  # no process: nothing to read
    assert samples.unexplained_kill("w9") == "not by troupe: the kernel's OOM killer?"
