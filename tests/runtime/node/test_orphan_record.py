"""The node's record of its children, and the reaping of a dead predecessor's, on real processes."""

from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from support.log_capture import module_logs
from troupe.runtime.file_owner import user_name
from troupe.runtime.node import leftovers
from troupe.runtime.node.leftovers import ChildRecord, keys_file, pids_file, reap_predecessors
from troupe.runtime.process_start import start_ticks

NOBODY = 65534  # a uid no test process runs as: "another user of the host"


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

    def full(path: Path, text: str) -> None:
        path.write_text("")  # created, then the disk is full
        raise OSError(errno.ENOSPC, "No space left on device")

    record = ChildRecord(tmp_path, "local")
    monkeypatch.setattr(leftovers, "_write_new", full)
    record.add(os.getpid(), "worker w")
    monkeypatch.undo()
    assert list(tmp_path.iterdir()) == []


def _dead_node_record(path: Path, child: subprocess.Popen[bytes]) -> None:
    """A record, as a dead node ``n1`` (pid 999999997) left it, naming ``child`` as its worker."""
    record = {"pid": child.pid, "start_ticks": start_ticks(child.pid), "role": "worker x"}
    owner = {"pid": 999_999_997, "start_ticks": 1}
    path.write_text(json.dumps({"node": "n1", "owner": owner, "children": [record]}))


def test_a_dead_node_s_keys_snapshot_goes_with_its_record(
    tmp_path: Path, sleeper: subprocess.Popen[bytes]
) -> None:
    """The keys a node hands its workers (a copy of the cluster's secret, ``security/snapshot``)
    are removed as it stops; one that died hard left them, which its successor removes."""
    _dead_node_record(pids_file(tmp_path, "n1", 999_999_997), sleeper)
    left = keys_file(tmp_path, "n1", 999_999_997)
    left.write_text("{}")
    assert reap_predecessors(tmp_path, "n1") == [sleeper.pid]
    assert not left.exists()


@pytest.mark.skipif(os.geteuid() != 0, reason="only root can give a file to another user")
def test_another_user_s_record_is_not_acted_on(
    tmp_path: Path, sleeper: subprocess.Popen[bytes], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A log folder shared with another user: their record, naming a live process of ours (forged,
    or their node's own), is skipped with a warning naming it and its owner, and left in place
    (report sh 6, sh 8)."""
    path = pids_file(tmp_path, "n1", 999_999_997)
    _dead_node_record(path, sleeper)
    os.chown(path, NOBODY, NOBODY)
    with module_logs(monkeypatch, leftovers) as logs:
        assert reap_predecessors(tmp_path, "n1") == []
    assert sleeper.poll() is None and path.exists()
    [said] = [e for e in logs if e["event"] == "child_record_of_other_user"]
    assert said["path"] == str(path) and said["owner"] == user_name(NOBODY)


def test_a_record_behind_a_symbolic_link_is_not_followed(
    tmp_path: Path, sleeper: subprocess.Popen[bytes], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A link in the shared folder to a file of ours is not read as a record (report sh 6)."""
    elsewhere = tmp_path / "mine" / "record.json"
    elsewhere.parent.mkdir()
    _dead_node_record(elsewhere, sleeper)
    (tmp_path / "logs").mkdir()
    pids_file(tmp_path / "logs", "n1", 999_999_997).symlink_to(elsewhere)
    with module_logs(monkeypatch, leftovers) as logs:
        assert reap_predecessors(tmp_path / "logs", "n1") == []
    assert sleeper.poll() is None
    assert [e["event"] for e in logs] == ["child_record_unreadable"]


def test_a_leftover_this_user_may_not_signal_is_said_not_raised(
    tmp_path: Path, sleeper: subprocess.Popen[bytes], monkeypatch: pytest.MonkeyPatch
) -> None:
    """EPERM on the SIGKILL (the pid is another user's process now): logged, the node starts on
    (it raised PermissionError out of the node's start, a 79-line traceback; report sh 8)."""
    _dead_node_record(pids_file(tmp_path, "n1", 999_999_997), sleeper)
    real_kill = os.kill

    def not_permitted(pid: int, sig: int) -> None:
        if pid == sleeper.pid:
            raise PermissionError(errno.EPERM, "Operation not permitted")
        real_kill(pid, sig)

    with module_logs(monkeypatch, leftovers) as logs:
        monkeypatch.setattr(leftovers.os, "kill", not_permitted)
        assert reap_predecessors(tmp_path, "n1") == []
        monkeypatch.setattr(leftovers.os, "kill", real_kill)
    assert sleeper.poll() is None
    [said] = [e for e in logs if e["event"] == "leftover_not_ours"]
    assert said["leftover_pid"] == sleeper.pid and said["role"] == "worker x"
    assert not [e for e in logs if e["event"] == "leftover_survived_sigkill"]


def test_the_record_is_not_written_through_a_symbolic_link(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another user's link where the record's temporary file goes (its name is the node's pid) had
    the node overwrite the file it names (report sh 6): not followed, the node runs on unrecorded."""
    victim = tmp_path / "private.txt"
    victim.write_text("PRIVATE\n")
    (tmp_path / "logs").mkdir()
    record = ChildRecord(tmp_path / "logs", "local")
    record.path.with_suffix(".pids.tmp").symlink_to(victim)
    with module_logs(monkeypatch, leftovers) as logs:
        record.add(os.getpid(), "worker w")
    assert victim.read_text() == "PRIVATE\n" and not record.path.exists()
    assert [e["event"] for e in logs] == ["child_record_not_written"]


def test_a_live_namesake_is_found_by_its_record(tmp_path: Path, sleeper: subprocess.Popen[bytes]) -> None:
    """au 4: a record whose owner runs says the name and log directory are in use; one whose owner
    is gone, this process's own, or another name's, does not."""
    assert leftovers.live_namesake(tmp_path, "n1") is None
    owner = {"pid": sleeper.pid, "start_ticks": start_ticks(sleeper.pid)}
    record = {"node": "n1", "owner": owner, "children": []}
    pids_file(tmp_path, "n1", sleeper.pid).write_text(json.dumps(record))
    assert leftovers.live_namesake(tmp_path, "n1") == sleeper.pid
    assert leftovers.live_namesake(tmp_path, "n2") is None
    ChildRecord(tmp_path, "n2").claim()  # ours, before any child: in use, but not by another
    assert pids_file(tmp_path, "n2", os.getpid()).exists()
    assert leftovers.live_namesake(tmp_path, "n2") is None
    sleeper.kill()
    sleeper.wait(timeout=30)
    assert leftovers.live_namesake(tmp_path, "n1") is None


def test_a_stop_at_once_removes_the_records_of_dead_children(
    tmp_path: Path, sleeper: subprocess.Popen[bytes]
) -> None:
    """fh 3: close_records (a stop at once, after its SIGKILLs) closes every record of this
    process as a clean stop does: removed where what it named is dead, kept where one lives."""
    done = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    gone, kept = ChildRecord(tmp_path, "gone"), ChildRecord(tmp_path, "kept")
    gone.add(done.pid, "worker w1")
    kept.add(sleeper.pid, "worker w2")
    done.kill()
    done.wait(timeout=30)
    leftovers.close_records()
    assert not gone.path.exists()
    assert [c["pid"] for c in json.loads(kept.path.read_text())["children"]] == [sleeper.pid]


def test_a_stop_at_once_with_no_thread_to_be_had_goes_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """At a pids limit a thread cannot start: the stop at once must still end the process (the
    record stays for a successor to reap) rather than fail in its clean-up."""
    record = ChildRecord(tmp_path, "limited")
    record.claim()

    def refused(_self: threading.Thread) -> None:
        raise RuntimeError("can't start new thread")

    monkeypatch.setattr(threading.Thread, "start", refused)
    leftovers.close_records()  # no exception
    assert record.path.exists()
