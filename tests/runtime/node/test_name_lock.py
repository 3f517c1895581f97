"""ns: a node's name in its log folder, held by a flock for its life (``node/name_lock.py``), so
that of two namesakes started at once exactly one runs; on real processes holding it."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from support.held_in_child import held_in_child
from support.log_capture import module_logs
from troupe.runtime.log_files import history_files
from troupe.runtime.logs import log_file
from troupe.runtime.node import leftovers, name_lock
from troupe.runtime.node.name_lock import hold_name, name_lock_file

NOBODY = 65534  # a uid no test process runs as: "another user of the host"
WAIT_S = 60.0  # a bound on another process, not a measure

HOLDS_THE_NAME = """
import sys
from pathlib import Path
from troupe.runtime.node.name_lock import hold_name

hold = hold_name(Path(sys.argv[1]), sys.argv[2])
assert hold.held, hold.holder
print("held", flush=True)
sys.stdin.read()
"""


def test_of_two_at_once_one_holds_the_name_and_the_other_is_told_its_pid(tmp_path: Path) -> None:
    """The second taker is refused at once, naming the holder, though no record was written;
    another name, or another folder, is free; let go, the name is free again."""
    with held_in_child(HOLDS_THE_NAME, str(tmp_path), "n1") as holder:
        second = hold_name(tmp_path, "n1")
        assert (second.held, second.holder) == (False, str(holder.pid))
        assert not list(tmp_path.glob("*.pids"))  # the lock alone said it
        with hold_name(tmp_path, "n2") as other, hold_name(tmp_path / "elsewhere", "n1") as there:
            assert other.held and there.held and other.holder is None is there.holder
    with hold_name(tmp_path, "n1") as after:
        assert after.held


def test_two_takers_in_one_process_are_two(tmp_path: Path) -> None:
    """A flock belongs to its open file: a second take in the same process is refused as well
    (naming this process), not granted again as a record lock would be."""
    with hold_name(tmp_path, "n1") as first:
        second = hold_name(tmp_path, "n1")
        assert first.held and (second.held, second.holder) == (False, str(os.getpid()))
    first.release()  # twice is fine


def test_a_holder_killed_leaves_nothing_stale(tmp_path: Path) -> None:
    """SIGKILL drops the flock with the process: the next node takes the name at once, the file
    still there and nothing to clean away."""
    with held_in_child(HOLDS_THE_NAME, str(tmp_path), "n1") as holder:
        holder.send_signal(signal.SIGKILL)
        holder.wait(timeout=WAIT_S)
        assert name_lock_file(tmp_path, "n1").exists()
        with hold_name(tmp_path, "n1") as next_one:
            assert next_one.held
            assert name_lock_file(tmp_path, "n1").read_text() == f"{os.getpid()}\n"


def test_without_the_kernel_s_table_the_pid_in_the_file_is_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Off Linux (no /proc/locks) the refusal names the pid the holder wrote into the file."""
    monkeypatch.setattr(name_lock, "flock_holder", lambda st: None)
    with held_in_child(HOLDS_THE_NAME, str(tmp_path), "n1") as holder:
        assert hold_name(tmp_path, "n1").holder == str(holder.pid)
        name_lock_file(tmp_path, "n1").write_text("")  # emptied: nothing says who
        assert hold_name(tmp_path, "n1").holder == "unknown"


@pytest.mark.parametrize("node", ["n1", "n1.jsonl"])
def test_the_lock_file_is_no_record_no_log_and_no_rotation_lock(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, node: str
) -> None:
    """Held beside the log, it is no record to reap or to read a namesake from, no rotated log
    of any node (``n1.jsonl``'s name lock beside ``n1``'s log included) and no rotation lock."""
    log_file(tmp_path, "n1").write_text("")
    with held_in_child(HOLDS_THE_NAME, str(tmp_path), node), module_logs(monkeypatch, leftovers) as logs:
        assert leftovers.reap_predecessors(tmp_path, node) == []
        assert leftovers.live_namesake(tmp_path, node) is None
        assert history_files(log_file(tmp_path, "n1")) == [log_file(tmp_path, "n1")]
        assert name_lock_file(tmp_path, node) != Path(f"{log_file(tmp_path, 'n1')}.lock")
        assert logs == []  # not even read as an unreadable record
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["n1.jsonl", f"{node}.name.lock"])


def test_a_link_in_the_lock_s_place_is_not_followed(tmp_path: Path) -> None:
    """A symbolic link there (in a folder another user may write) could name any file of ours,
    which the pid would overwrite: it is left alone, and the records decide, as before."""
    victim = tmp_path / "private.txt"
    victim.write_text("PRIVATE\n")
    name_lock_file(tmp_path, "n1").symlink_to(victim)
    with hold_name(tmp_path, "n1") as hold:
        assert (hold.held, hold.holder) == (False, None)
    assert victim.read_text() == "PRIVATE\n"


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a file to another user needs root")
def test_another_user_s_lock_file_is_not_used(tmp_path: Path) -> None:
    """As their records are, another user's lock file in a shared folder is theirs: not locked
    nor written; the records decide."""
    path = name_lock_file(tmp_path, "n1")
    path.write_text("")
    os.chown(path, NOBODY, NOBODY)
    with hold_name(tmp_path, "n1") as hold:
        assert (hold.held, hold.holder) == (False, None)
    assert path.read_text() == ""


def test_a_folder_that_cannot_be_made_holds_nothing(tmp_path: Path) -> None:
    """No lock to be had (the log folder's place is a file): nothing held, nobody named."""
    (tmp_path / "logs").write_text("")
    with hold_name(tmp_path / "logs", "n1") as hold:
        assert (hold.held, hold.holder) == (False, None)
