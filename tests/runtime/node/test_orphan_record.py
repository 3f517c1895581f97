"""The node's record of its children, and the reaping of a dead predecessor's, on real processes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from troupe.runtime.node.leftovers import ChildRecord, pids_file, reap_predecessors


@pytest.fixture
def sleeper() -> Iterator[subprocess.Popen[bytes]]:
    """A child process that sleeps until it is killed; reaped at teardown."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        yield proc
    finally:
        proc.kill()
        proc.wait(timeout=30)


def test_the_record_lists_live_children_and_goes_away_at_a_clean_stop(
    tmp_path: Path, sleeper: subprocess.Popen[bytes]
) -> None:
    """add() records pid and start time (dropping children gone since); close() removes the file once all are
    gone."""
    record = ChildRecord(tmp_path, "n1")
    assert record.path == pids_file(tmp_path, "n1", os.getpid())
    done = subprocess.Popen([sys.executable, "-c", "pass"])
    done.wait(timeout=30)
    record.add(done.pid, "worker w-done")  # already gone: not recorded
    record.add(sleeper.pid, "worker w1")
    data = json.loads(record.path.read_text())
    assert data["node"] == "n1" and data["owner"]["pid"] == os.getpid()
    assert data["children"] == [
        {"pid": sleeper.pid, "create_time": psutil.Process(sleeper.pid).create_time(), "role": "worker w1"}
    ]
    record.close()
    assert record.path.exists()  # a child outlived the stop: the record stays for a successor
    sleeper.kill()
    sleeper.wait(timeout=30)
    record.close()
    assert not record.path.exists()


def test_a_live_node_s_record_is_never_reaped(tmp_path: Path, sleeper: subprocess.Popen[bytes]) -> None:
    """Another live node of the same name sharing the directory keeps its children."""
    owner = psutil.Process(sleeper.pid)  # stands for the other, live, node
    path = pids_file(tmp_path, "n1", owner.pid)
    path.write_text(
        json.dumps(
            {
                "node": "n1",
                "owner": {"pid": owner.pid, "create_time": owner.create_time()},
                "children": [{"pid": owner.pid, "create_time": owner.create_time(), "role": "worker w1"}],
            }
        )
    )
    assert reap_predecessors(tmp_path, "n1") == []
    assert sleeper.poll() is None and path.exists()


def test_a_dead_node_s_children_are_killed_unless_their_pid_was_reused(
    tmp_path: Path, sleeper: subprocess.Popen[bytes]
) -> None:
    """A match of pid and start time is SIGKILLed; another node name's record and garbage are left alone."""
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        mine, reused = psutil.Process(sleeper.pid), psutil.Process(other.pid)
        pids_file(tmp_path, "n1", 999_999_999).write_text(
            json.dumps(
                {
                    "node": "n1",
                    "owner": {"pid": 999_999_999, "create_time": 1.0},
                    "children": [
                        {"pid": mine.pid, "create_time": mine.create_time(), "role": "worker w1"},
                        {"pid": reused.pid, "create_time": reused.create_time() + 9.0, "role": "w2"},
                    ],
                }
            )
        )
        (tmp_path / "n1.5.pids").write_text("not json")
        other_node = pids_file(tmp_path, "n1.x", 999_999_998)
        other_node.write_text(
            json.dumps(
                {
                    "node": "n1.x",
                    "owner": {"pid": 999_999_998, "create_time": 1.0},
                    "children": [{"pid": reused.pid, "create_time": reused.create_time(), "role": "w"}],
                }
            )
        )
        assert reap_predecessors(tmp_path, "n1") == [mine.pid]
        assert sleeper.wait(timeout=30) == -signal.SIGKILL
        assert other.poll() is None
        assert not pids_file(tmp_path, "n1", 999_999_999).exists()
        assert (tmp_path / "n1.5.pids").exists() and other_node.exists()
    finally:
        other.kill()
        other.wait(timeout=30)
