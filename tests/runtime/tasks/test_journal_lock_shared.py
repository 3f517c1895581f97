"""A journal in a folder several users share (a lab's group-shared run folder, report sh 3): its
file and lock are made as the umask says, like the rest of the folder, and a lock file this
user may not write is refused naming its holder, or its owner and mode (it blamed the directory).

The tests run as root, who may write any file: the refusal of a write is faked, as the kernel
gives it to another user, on a file given to another uid (65534, nobody)."""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from troupe.runtime.errors import ConfigError, JournalError
from troupe.runtime.file_owner import user_name
from troupe.runtime.pipeline.run_dir_lock import hold
from troupe.runtime.tasks import journal_lock
from troupe.runtime.tasks.journal import Journal
from troupe.runtime.tasks.journal_lock import JournalBusy, JournalLock, lock_path

NOBODY = 65534


@pytest.fixture
def umask_0() -> Iterator[None]:
    """A shared folder's umask (the repro's ``umask 000``), for the test's own files only."""
    before = os.umask(0)
    try:
        yield
    finally:
        os.umask(before)


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_the_journal_and_its_lock_are_made_as_the_umask_says(tmp_path: Path, umask_0: None) -> None:
    """They were 0644 whatever the umask: another user of the group could not resume the run."""
    path = tmp_path / "journal.db"
    with Journal.open(path, create=True):
        made = [path, lock_path(path), *(p for p in tmp_path.iterdir() if p.name.endswith(("-wal", "-shm")))]
        assert {p.name: _mode(p) for p in made} == {p.name: 0o666 for p in made}


def _refuse(path: object) -> int:
    raise PermissionError(errno.EACCES, "Permission denied", str(path))


def _lock_files_not_writable(monkeypatch: pytest.MonkeyPatch) -> None:
    """From now on this user may not open a lock file for writing (another user's, 0644)."""
    real_open = os.open

    def refusing(path: object, flags: int, *args: object) -> int:
        if str(path).endswith(".lock") and flags & os.O_RDWR:
            return _refuse(path)
        return real_open(path, flags, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(journal_lock.os, "open", refusing)


def test_another_user_s_lock_file_is_named_with_its_owner_and_mode(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "journal.db"
    JournalLock.acquire(path).release()  # the lock file another user's run left
    os.chmod(lock_path(path), 0o644)
    os.chown(lock_path(path), NOBODY, NOBODY)
    _lock_files_not_writable(monkeypatch)
    with pytest.raises(JournalError) as refused:
        JournalLock.acquire(path)
    assert not isinstance(refused.value, JournalBusy)
    assert str(refused.value) == (
        f"journal {path}: cannot write its lock file {lock_path(path)} (Permission denied; it belongs "
        f"to {user_name(NOBODY)} (mode 0644)); its owner may let this user write it, or remove it while "
        "no run or master uses the journal"
    )


def test_a_held_lock_this_user_may_not_write_names_its_holder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """While the other user's run holds it, the refusal is the documented "in use" one, as the
    holder's own user gets it (it was the lock-file error)."""
    out = tmp_path / "out"
    path = out / ".troupe" / "journal.db"
    path.parent.mkdir(parents=True)
    held = hold(path, out, "troupe run")  # the other user's run
    try:
        _lock_files_not_writable(monkeypatch)
        with pytest.raises(JournalBusy, match=rf"held by another master \(pid {os.getpid()}\)"):
            JournalLock.acquire(path)
        in_use = rf"--out {out} is in use by another troupe run \(pid {os.getpid()}\)"
        with pytest.raises(ConfigError, match=in_use):
            hold(path, out, "troupe run")
    finally:
        held.release()


def test_a_lock_file_that_cannot_be_made_still_blames_the_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "journal.db"
    monkeypatch.setattr(journal_lock.os, "open", lambda p, *a: _refuse(p))
    with pytest.raises(
        JournalError, match=r"cannot create its lock file .*; check that the directory is writable"
    ):
        JournalLock.acquire(path)
