"""A log file that cannot be written (a directory in its place, a file this user may not write), a run's
log folder that is a file, or a run's lock that is a directory: refused before the start in one line,
exit 2, as an unwritable --logs is (each was a traceback, exit 1)."""

from __future__ import annotations

import errno
import os
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from support.cli_session import troupe_in_session
from troupe.cli import preflight
from troupe.cli.preflight import log_file_problem
from troupe.runtime.transports.loopback import free_endpoint

REFUSAL_S = 120  # a refusal comes before anything starts; a bound only, should it start after all


def _refused(done: subprocess.CompletedProcess[str], said: str) -> None:
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert done.stderr.startswith(f"error: {said}"), done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr


def test_node_start_refuses_a_directory_where_its_log_file_goes(tmp_path: Path) -> None:
    (tmp_path / "n1.jsonl").mkdir()
    done = troupe_in_session(
        "node",
        "start",
        "--name",
        "n1",
        "--endpoint",
        free_endpoint(),
        "--logs",
        str(tmp_path),
        timeout=REFUSAL_S,
    )
    _refused(
        done, f"log file {tmp_path / 'n1.jsonl'} is a directory; remove it, or give another logs directory"
    )


def test_master_start_refuses_a_directory_where_its_log_file_goes(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    (logs / "m1.jsonl").mkdir(parents=True)
    journal = tmp_path / "j.db"
    done = troupe_in_session(
        "master", "start", "--name", "m1", "--endpoint", free_endpoint(), "--logs", str(logs),
        "--journal", str(journal), "--new", timeout=REFUSAL_S,
    )  # fmt: skip
    _refused(done, f"log file {logs / 'm1.jsonl'} is a directory; remove it, or give another --logs")
    assert not journal.exists()


@pytest.mark.parametrize(
    ("make", "said"),
    [
        (
            lambda out: (out / "logs" / "local.jsonl").mkdir(parents=True),
            "log file {out}/logs/local.jsonl is a",
        ),
        (lambda out: (out / "logs").write_text(""), "--out {out}: its log folder {out}/logs is a file"),
        (
            lambda out: (out / ".troupe" / "journal.db.lock").mkdir(parents=True),
            "journal {out}/.troupe/journal.db: cannot create its lock file",
        ),
    ],
    ids=["log-file-a-directory", "log-folder-a-file", "lock-a-directory"],
)
def test_run_refuses_an_out_whose_logs_or_lock_cannot_be_written(
    tmp_path: Path, make: Callable[[Path], object], said: str
) -> None:
    out = tmp_path / "out"
    out.mkdir()
    make(out)
    done = troupe_in_session(
        "run", "--out", str(out), "--items", "2", "--endpoint", free_endpoint(), "--master", free_endpoint(),
        timeout=REFUSAL_S,
    )  # fmt: skip
    _refused(done, said.format(out=out))
    assert "Traceback" not in done.stderr


def test_a_log_file_this_user_may_not_write_or_not_a_file_is_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An immutable file, or one root made for a service that runs as another user (root writes any
    file, so the refusal is faked); a FIFO in the file's place is not waited on."""
    assert log_file_problem(tmp_path, "n1", "--logs") is None  # missing: made at the start
    (tmp_path / "n1.jsonl").write_text("")
    assert log_file_problem(tmp_path, "n1", "--logs") is None
    real_open = os.open

    def refusing(path: object, flags: int, *args: object) -> int:
        if str(path) == str(tmp_path / "n1.jsonl"):
            raise PermissionError(errno.EPERM, "Operation not permitted", str(path))
        return real_open(path, flags, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(preflight.os, "open", refusing)
    assert log_file_problem(tmp_path, "n1", "--logs") == (
        f"log file {tmp_path / 'n1.jsonl'} cannot be written (Operation not permitted); let this user "
        "write it (or remove it), or give another --logs"
    )
    monkeypatch.undo()
    os.mkfifo(tmp_path / "n2.jsonl")
    problem = log_file_problem(tmp_path, "n2", "--logs")
    assert problem is not None and "is not a regular file" in problem


def test_a_log_file_that_is_a_symbolic_link_is_refused(tmp_path: Path) -> None:
    """In a log folder another user may write, their link made the node append to any file of ours
    (report sh 6): refused before the start, the file it names untouched."""
    victim = tmp_path / "private.txt"
    victim.write_text("PRIVATE\n")
    (tmp_path / "n1.jsonl").symlink_to(victim)
    assert log_file_problem(tmp_path, "n1", "--logs") == (
        f"log file {tmp_path / 'n1.jsonl'} is a symbolic link, which troupe does not follow; remove it, "
        "or give another --logs"
    )
    assert victim.read_text() == "PRIVATE\n"
