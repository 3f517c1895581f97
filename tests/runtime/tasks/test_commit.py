from __future__ import annotations

import errno
import multiprocessing
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from troupe.runtime.errors import CommitError, InvalidTaskId, TaskError
from troupe.runtime.tasks import output_store as commit_mod
from troupe.runtime.tasks.output_store import (
    COMMIT_MARKER,
    OutputStore,
    OutputStoreStats,
    atomic_file,
)


def _visible(store: OutputStore) -> tuple[list[str], list[Path]]:
    return store.committed(), sorted(store.staging_dir.iterdir())


def test_commit_publishes_whole_output(tmp_path: Path) -> None:
    """A committed output appears under the task id with every staged file and the marker."""
    store = OutputStore(tmp_path)
    with store.stage("t1") as staged:
        (staged.path / "a.bin").write_bytes(b"abc")
        (staged.path / "sub").mkdir()
        (staged.path / "sub" / "b.txt").write_text("x")
        assert not store.is_committed("t1")
        assert staged.commit() is True
    out = store.committed_path("t1")
    assert (out / "a.bin").read_bytes() == b"abc"
    assert (out / "sub" / "b.txt").read_text() == "x"
    assert (out / COMMIT_MARKER).read_text().splitlines() == ["t1", "3 a.bin", "1 sub/b.txt"]
    assert _visible(store) == (["t1"], [])
    assert store.statistics() == OutputStoreStats(commits=1, duplicate_commits=0, aborted=0, failed=0)


def test_second_commit_is_noop(tmp_path: Path) -> None:
    """Committing the same task again returns False and leaves the first output untouched."""
    store = OutputStore(tmp_path)
    for payload in (b"first", b"second"):
        with store.stage("t1") as staged:
            (staged.path / "out").write_bytes(payload)
            committed = staged.commit()
        assert committed is (payload == b"first")
    assert (store.committed_path("t1") / "out").read_bytes() == b"first"
    assert _visible(store) == (["t1"], [])
    assert store.statistics().duplicate_commits == 1


def test_empty_output_still_commits_once(tmp_path: Path) -> None:
    """An output with no files commits once: the marker keeps the target non-empty."""
    store = OutputStore(tmp_path)
    results = []
    for _ in range(2):
        with store.stage("empty") as staged:
            results.append(staged.commit())
    assert results == [True, False]


def test_leaving_without_commit_drops_staging(tmp_path: Path) -> None:
    """A staging area left without commit, or by an exception, is deleted and nothing shows."""
    store = OutputStore(tmp_path)
    with store.stage("t1") as staged:
        (staged.path / "a").write_bytes(b"1")
    with pytest.raises(RuntimeError), store.stage("t2") as staged:
        (staged.path / "a").write_bytes(b"1")
        raise RuntimeError("boom")
    assert _visible(store) == ([], [])
    assert store.statistics().aborted == 2


def test_commit_twice_on_one_staging_raises(tmp_path: Path) -> None:
    """Calling commit again on a finished staging area is refused with a TaskError."""
    store = OutputStore(tmp_path)
    with store.stage("t1") as staged:
        staged.commit()
        with pytest.raises(TaskError, match="already finished"):
            staged.commit()


@pytest.mark.parametrize("task_id", ["", ".hidden", "a/b", "..", "a\\b", "a\0b"])
def test_bad_task_ids_rejected(tmp_path: Path, task_id: str) -> None:
    """Task ids that cannot name one directory raise InvalidTaskId, a ValueError."""
    store = OutputStore(tmp_path)
    with pytest.raises(InvalidTaskId) as info:
        store.stage(task_id)
    assert isinstance(info.value, ValueError)
    with pytest.raises(InvalidTaskId):
        store.is_committed(task_id)


def test_an_output_cut_short_or_gone_since_its_commit_is_found_and_set_aside(tmp_path: Path) -> None:
    """The marker lists each committed file's size: a file cut short, grown or deleted since is
    named; set aside, the output is no longer committed, so its task can be made again."""
    store = OutputStore(tmp_path)
    for task_id in ("a", "b", "c", "d"):
        with store.stage(task_id) as staged:
            (staged.path / "sub").mkdir()
            (staged.path / "sub" / "frames.bin").write_bytes(b"x" * 100)
            (staged.path / "meta.json").write_text("{}")
            staged.commit()
    assert [store.damage(t) for t in "abcd"] == [None] * 4
    with (store.committed_path("b") / "sub" / "frames.bin").open("r+b") as f:
        f.truncate(10)
    (store.committed_path("c") / "meta.json").unlink()
    marker = store.committed_path("d") / commit_mod.COMMIT_MARKER
    marker.write_text("d\n")  # an older troupe's marker: the task id alone, nothing to compare
    assert store.damage("a") is None and store.damage("d") is None
    assert store.damage("b") == "sub/frames.bin is 10 bytes, 100 when it was committed"
    assert store.damage("c") == "meta.json is gone"
    aside = store.set_aside("b")
    assert aside == tmp_path / commit_mod.DAMAGED_DIR / "b" and (aside / "sub" / "frames.bin").is_file()
    assert store.committed() == ["a", "c", "d"] and not store.is_committed("b")
    with store.stage("b") as staged:  # made again, then found damaged again: the older one goes
        (staged.path / "frames.bin").write_bytes(b"y")
        staged.commit()
    (store.committed_path("b") / "frames.bin").unlink()
    store.set_aside("b")
    assert sorted(p.name for p in store.set_aside("c").parent.iterdir()) == ["b", "c"]
    store.clear()
    assert not (tmp_path / commit_mod.DAMAGED_DIR).exists() and store.committed() == []


def test_the_longest_task_id_commits_and_a_longer_one_is_refused(tmp_path: Path) -> None:
    """An id of the most bytes a task id may have stages and commits (its staging directory's
    name, with the suffix, still fits a file name); one byte more is InvalidTaskId saying the
    bound, not an OS error on a file name too long."""
    store = OutputStore(tmp_path)
    longest = "é" * (commit_mod.TASK_ID_MOST_BYTES // 2)  # two bytes each in UTF-8
    with store.stage(longest) as staged:
        (staged.path / "out.txt").write_text("x")
        staged.commit()
    assert store.committed() == [longest]
    with pytest.raises(InvalidTaskId, match=f"{commit_mod.TASK_ID_MOST_BYTES + 1} bytes long; .* at most"):
        store.stage(longest + "a")


def test_disk_full_on_rename_leaves_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """ENOSPC at the rename raises CommitError naming task and fix, and leaves nothing visible."""
    store = OutputStore(tmp_path)

    def full(src: object, dst: object) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(commit_mod.os, "rename", full)
    with pytest.raises(CommitError) as info, store.stage("t1") as staged:
        (staged.path / "a").write_bytes(b"1")
        staged.commit()
    assert info.value.errno == errno.ENOSPC
    assert "'t1'" in str(info.value) and "free space" in str(info.value)
    assert _visible(store) == ([], [])
    monkeypatch.undo()
    with store.stage("t1") as staged:  # the retry commits once
        assert staged.commit() is True


def test_disk_full_while_writing_becomes_commit_error(tmp_path: Path) -> None:
    """An OSError raised while writing the output aside becomes CommitError and is cleaned up."""
    store = OutputStore(tmp_path)
    with pytest.raises(CommitError, match="writable") as info, store.stage("t1"):
        raise PermissionError(errno.EACCES, "Permission denied")
    assert isinstance(info.value, OSError) and info.value.errno == errno.EACCES
    assert _visible(store) == ([], [])
    assert store.statistics().failed == 1


def test_fsync_failure_becomes_commit_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An fsync failure during commit raises CommitError and publishes nothing."""
    store = OutputStore(tmp_path)

    def broken(fd: int) -> None:
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(commit_mod.os, "fsync", broken)
    with pytest.raises(CommitError), store.stage("t1") as staged:
        (staged.path / "a").write_bytes(b"1")
        staged.commit()
    assert _visible(store) == ([], [])


def test_sweep_removes_crashed_leftovers_only(tmp_path: Path) -> None:
    """sweep_staging removes leftovers but spares areas this store has open and recent ones."""
    store = OutputStore(tmp_path)
    (store.staging_dir / "dead.123").mkdir()
    (store.staging_dir / "dead.123" / "f").write_bytes(b"x")
    (store.staging_dir / "stray.tmp").write_bytes(b"x")
    old = store.staging_dir / "old.1"
    old.mkdir()
    os.utime(old, (1000.0, 1000.0))
    with store.stage("live") as staged:
        assert store.sweep_staging(older_than=2000.0) == 1  # only "old.1" is older
        assert store.sweep_staging() == 2
        assert staged.path.exists()
        assert staged.commit() is True
    assert _visible(store) == (["live"], [])


def test_threads_commit_same_task_once(tmp_path: Path) -> None:
    """Of several threads committing the same task at once, exactly one returns True."""
    store = OutputStore(tmp_path)
    barrier = threading.Barrier(4, timeout=10)
    results: list[bool] = []

    def attempt(i: int) -> None:
        with store.stage("same") as staged:
            (staged.path / "who").write_text(str(i))
            barrier.wait()
            results.append(staged.commit())

    threads = [threading.Thread(target=attempt, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=10)
    assert sorted(results) == [False, False, False, True]
    assert _visible(store) == (["same"], [])


def _commit_in_child(root: str, barrier: object, results: object, i: int) -> None:
    store = OutputStore(Path(root))
    with store.stage("race") as staged:
        (staged.path / "who").write_text(str(i))
        barrier.wait()  # type: ignore[attr-defined]
        results.put((i, staged.commit()))  # type: ignore[attr-defined]


def test_processes_commit_same_task_once(tmp_path: Path) -> None:
    """Two processes committing the same task concurrently: exactly one commit wins."""
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(2, timeout=30)
    results = ctx.Queue()
    procs = [
        ctx.Process(target=_commit_in_child, args=(str(tmp_path), barrier, results, i)) for i in range(2)
    ]
    for p in procs:
        p.start()
    try:
        got = dict(results.get(timeout=30) for _ in procs)
    finally:
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
                p.join(timeout=5)
    assert sorted(got.values()) == [False, True]
    winner = next(i for i, ok in got.items() if ok)
    store = OutputStore(tmp_path)
    assert (store.committed_path("race") / "who").read_text() == str(winner)
    assert _visible(store) == (["race"], [])
    results.close()
    results.join_thread()


def test_atomic_file_replaces_whole_or_not_at_all(tmp_path: Path) -> None:
    """atomic_file publishes on success and leaves the old file and no temp on failure."""
    dest = tmp_path / "d" / "info.json"
    with atomic_file(dest) as tmp:
        tmp.write_text("v1")
    assert dest.read_text() == "v1"
    with pytest.raises(RuntimeError), atomic_file(dest) as tmp:
        tmp.write_text("v2-partial")
        raise RuntimeError("crash")
    assert dest.read_text() == "v1"
    assert [p.name for p in dest.parent.iterdir()] == ["info.json"]


# ---------------------------------------------------------------- abandoned staging is swept

STAGING_WRITER = """
import os, signal, sys
from pathlib import Path
from troupe.runtime.tasks.output_store import OutputStore
staged = OutputStore(Path(sys.argv[1]), durable=False).stage(sys.argv[2]).__enter__()
(staged.path / "half.bin").write_bytes(b"x" * 100)
print(staged.path, flush=True)
if sys.argv[3] == "die":
    os.kill(os.getpid(), signal.SIGKILL)
sys.stdin.readline()  # a live writer: staging until told to stop
"""


def _writer(root: Path, task_id: str, mode: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", STAGING_WRITER, str(root), task_id, mode],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )


def test_opening_a_store_sweeps_what_killed_writers_left_and_keeps_live_ones(
    tmp_path: Path,
) -> None:
    """A worker killed mid-write leaves its staging dir; the next store opened removes it."""
    root = tmp_path / "store"
    live = _writer(root, "t-live", "wait")
    killed: subprocess.Popen[str] | None = None
    try:
        assert live.stdout is not None
        live_path = Path(live.stdout.readline().strip())
        killed = _writer(root, "t-killed", "die")  # opened after the live one: nothing to sweep
        dead_path = Path(killed.communicate(timeout=60)[0].strip())
        assert killed.returncode == -signal.SIGKILL
        assert dead_path.is_dir() and live_path.is_dir()
        store = OutputStore(root)
        assert not dead_path.exists()
        assert live_path.is_dir() and (live_path / "half.bin").is_file()
        assert store.sweep_abandoned() == 0
    finally:
        for proc in (killed, live):
            if proc is None:
                continue
            if proc.poll() is None:
                proc.kill()
            proc.communicate(timeout=30)
    assert OutputStore(root).sweep_abandoned() == 0  # swept at open: the live one has died too
    assert list((root / ".staging").iterdir()) == []


def test_a_reused_pid_does_not_keep_a_dead_writer_s_staging(tmp_path: Path) -> None:
    """A staging dir named for a live pid but another start tick belongs to a dead writer."""
    store = OutputStore(tmp_path)
    with store.stage("mine") as staged:
        pid, start, scope = staged.path.name.rsplit(".", 1)[1].split("-")
        assert int(pid) == os.getpid() and start.startswith("t")
        reused = store.staging_dir / f"t.{'a' * 16}.{pid}-t{int(start[1:]) - 1000}-{scope}"
        reused.mkdir()
        other = OutputStore(tmp_path)
        assert not reused.exists() and staged.path.is_dir()  # the open one's writer is alive
        assert other.sweep_abandoned() == 0
        assert staged.commit() is True


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="psutil's boot time is Linux's here")
def test_a_clock_step_does_not_make_a_live_writer_look_dead(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Linux derives the boot time from the wall clock at each read, so an NTP step moves every
    process's start *time*: a live writer's staging dir must not be swept from under it."""
    import psutil._pslinux as pslinux

    store = OutputStore(tmp_path)
    with store.stage("mine") as staged:
        (staged.path / "half.bin").write_bytes(b"x")
        stepped = pslinux.boot_time() + 30.0
        monkeypatch.setattr(pslinux, "boot_time", lambda: stepped)
        assert OutputStore(tmp_path).sweep_abandoned() == 0
        assert (staged.path / "half.bin").is_file()
        assert staged.commit() is True


def test_an_older_troupe_s_staging_named_with_a_time_goes_only_when_stale(tmp_path: Path) -> None:
    """Names that carry a start time (an older troupe's) cannot be judged by tick: kept while
    fresh, removed once untouched for ``stale_after_s``, as another host's are."""
    store = OutputStore(tmp_path, stale_after_s=3600)
    older = store.staging_dir / f"t.{'c' * 16}.{os.getpid()}-{int(time.time())}-{commit_mod._scope()}"
    older.mkdir()
    assert store.sweep_abandoned() == 0 and older.is_dir()
    os.utime(older, (time.time() - 7200, time.time() - 7200))
    assert store.sweep_abandoned() == 1 and not older.exists()


def test_entries_whose_writer_cannot_be_checked_go_only_when_stale(tmp_path: Path) -> None:
    """Another host's (or an older troupe's) staging dirs are removed only once untouched long."""
    store = OutputStore(tmp_path, stale_after_s=3600)
    foreign = store.staging_dir / f"t.{'b' * 16}.1-1-00000000"  # another host's scope tag
    legacy = store.staging_dir / "t.0123456789abcdef"  # the naming without a writer
    for entry in (foreign, legacy):
        entry.mkdir()
    assert store.sweep_abandoned() == 0
    os.utime(legacy, (time.time() - 7200, time.time() - 7200))
    assert store.sweep_abandoned() == 1
    assert foreign.is_dir() and not legacy.exists()
    assert OutputStore(tmp_path, stale_after_s=0.0, sweep=True).committed() == []
    assert list(store.staging_dir.iterdir()) == []
