"""The node's record of its children, and the reaping of a dead predecessor's, on real processes."""

from __future__ import annotations

import errno
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
from troupe.runtime.process_start import start_ticks


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
    """add() records pid and start tick (dropping children gone since); close() removes the file once all are
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
        {"pid": sleeper.pid, "start_ticks": start_ticks(sleeper.pid), "role": "worker w1"}
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


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="psutil's boot time is Linux's here")
def test_records_by_start_tick_hold_across_a_clock_step(
    tmp_path: Path, sleeper: subprocess.Popen[bytes], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A clock step moves every start *time* psutil reads (Linux derives the boot time from the
    wall clock): a live node's record is still its own, a dead one's child is still reaped."""
    import psutil._pslinux as pslinux

    child = {"pid": sleeper.pid, "start_ticks": start_ticks(sleeper.pid), "role": "worker w1"}
    live = pids_file(tmp_path, "live", sleeper.pid)  # the sleeper stands for the other, live, node
    owner = {"pid": sleeper.pid, "start_ticks": start_ticks(sleeper.pid)}
    live.write_text(json.dumps({"node": "live", "owner": owner, "children": [child]}))
    dead = pids_file(tmp_path, "n1", 999_999_997)
    dead.write_text(
        json.dumps({"node": "n1", "owner": {"pid": 999_999_997, "start_ticks": 1}, "children": [child]})
    )
    stepped = pslinux.boot_time() + 30.0
    monkeypatch.setattr(pslinux, "boot_time", lambda: stepped)

    assert reap_predecessors(tmp_path, "live") == [] and live.exists()
    assert sleeper.poll() is None
    assert reap_predecessors(tmp_path, "n1") == [sleeper.pid]
    assert sleeper.wait(timeout=30) == -signal.SIGKILL


def test_a_record_that_cannot_be_written_leaves_no_half_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A full disk: the node runs on without its record, and the temporary file it began (an
    empty ``local.<pid>.pids.tmp`` in the run's logs/) is not left behind."""
    real_write = Path.write_text

    def full(self: Path, text: str, *args: object, **kwargs: object) -> int:
        real_write(self, "")  # created, then the disk is full
        raise OSError(errno.ENOSPC, "No space left on device")

    record = ChildRecord(tmp_path, "local")
    monkeypatch.setattr(Path, "write_text", full)
    record.add(os.getpid(), "worker w")
    monkeypatch.undo()
    assert list(tmp_path.iterdir()) == []
