"""Every writer of a node's log file rotates it before a line that would take it past its size, under
one lock: a burst from several processes at once leaves no file past the size by more than a line of
each other writer, every line once and whole (report ob 3: 1 MB configured, 12.4 MB files)."""

from __future__ import annotations

import json
import logging
import os
import select
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

import troupe.runtime.log_files as log_files
from troupe.runtime.log_files import (
    ReopeningFileHandler,
    history_files,
    lock_path,
    rotate_if_larger,
    rotated_path,
    rotation_lock,
)

WAIT_S = 60.0  # a bound on waiting for another process, not on its speed

_WRITER = textwrap.dedent(
    """
    import sys
    from pathlib import Path

    import structlog

    from troupe.runtime.logs import configure_logging

    log_dir, name, count, limit = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    configure_logging("n", name, log_dir, console=False, rotate_at_bytes=limit, keep=1000)
    log = structlog.get_logger("w")
    print("ready", flush=True)
    sys.stdin.readline()  # every writer starts at once: one burst from all of them
    for i in range(count):
        log.info("spam_line", i=i, pad="x" * 200)
    """
)


def _lines_of(path: Path) -> list[bytes]:
    data = path.read_bytes()
    assert not data or data.endswith(b"\n"), f"{path.name} ends in a torn line"
    return data.splitlines()


def test_a_burst_from_several_processes_keeps_every_file_to_the_size(tmp_path: Path) -> None:
    """Only the node rotated, on its 0.2 s poll, and workers appended to the renamed file for up to a
    second: each rotated file held the size plus a second of every process's writes."""
    writers, count, limit = 3, 2000, 16 * 1024
    path = tmp_path / "n.jsonl"
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _WRITER, str(tmp_path), f"w{k}", str(count), str(limit)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        for k in range(writers)
    ]
    try:
        for proc in procs:
            assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
        for proc in procs:
            assert proc.stdin is not None
            proc.stdin.write("go\n")
            proc.stdin.flush()
        assert [p.wait(timeout=WAIT_S) for p in procs] == [0] * writers
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
            proc.communicate(timeout=WAIT_S)
    files = history_files(path)
    lines = {p: _lines_of(p) for p in files}
    records = [json.loads(ln) for p in files for ln in lines[p]]  # whole JSON, every one
    assert sorted((r["process"], r["i"]) for r in records) == sorted(
        (f"w{k}", i) for k in range(writers) for i in range(count)
    )
    longest = max(len(ln) + 1 for p in files for ln in lines[p])
    bound = limit + (writers - 1) * longest  # a line of each other writer, in the same instant
    sizes = {p.name: p.stat().st_size for p in files}
    assert all(size <= bound for size in sizes.values()), (bound, sizes)
    assert len(files) > writers * count * longest // bound // 2  # rotated all along the burst


def _record(msg: str) -> logging.LogRecord:
    return logging.LogRecord("t", logging.INFO, __file__, 1, "%s", (msg,), None)


def test_writers_in_threads_keep_to_the_size_and_to_keep(tmp_path: Path) -> None:
    """Handlers with a descriptor each (as processes have) rotate under the lock: never more than
    `keep` rotated files, none past the size by more than a line of the other writers, no line
    twice or torn."""
    writers, count, limit, keep = 4, 400, 2048, 3
    path = tmp_path / "n.jsonl"
    handlers = [ReopeningFileHandler(path, max_bytes=limit, keep=keep) for _ in range(writers)]
    start = threading.Barrier(writers, timeout=WAIT_S)

    def write(k: int) -> None:
        start.wait()
        for i in range(count):
            handlers[k].emit(_record(f"t{k}-{i:04d}-" + "y" * 80))

    threads = [threading.Thread(target=write, args=(k,)) for k in range(writers)]
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=WAIT_S)
        assert not any(t.is_alive() for t in threads)
    finally:
        for handler in handlers:
            handler.close()
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        ["n.jsonl", "n.jsonl.lock", "n.rotations", *(rotated_path(path, k).name for k in range(1, keep + 1))]
    )
    lines = [ln for p in history_files(path) for ln in _lines_of(p)]
    assert len(lines) == len(set(lines)) and all(len(ln) == len(lines[0]) for ln in lines)
    bound = limit + (writers - 1) * (len(lines[0]) + 1)
    assert all(p.stat().st_size <= bound for p in history_files(path))
    assert all(h.dropped == 0 for h in handlers)


def test_a_file_that_cannot_be_rotated_is_written_on_and_said_once(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where the lock cannot be taken (a directory in the lock file's place) the lines still go to the
    file, past its size, stderr hears it once, and the next try after it is mended rotates."""
    monkeypatch.setattr(log_files, "REOPEN_CHECK_S", 0.0)  # try again at every line
    path = tmp_path / "n.jsonl"
    lock_path(path).mkdir()
    handler = ReopeningFileHandler(path, max_bytes=100, keep=2, who="process w1")
    try:
        for i in range(10):
            handler.emit(_record(f"line-{i}-" + "z" * 20))
        said = capsys.readouterr().err
        assert said.count("cannot rotate the log file") == 1, said
        assert f"{lock_path(path)}: Is a directory" in said and "(process w1)" in said
        assert len(path.read_text().splitlines()) == 10 and handler.dropped == 0
        lock_path(path).rmdir()
        handler.emit(_record("after"))
    finally:
        handler.close()
    assert len(rotated_path(path, 1).read_text().splitlines()) == 10
    assert path.read_text() == "after\n"
    assert capsys.readouterr().err == ""


def test_the_poll_leaves_a_file_being_rotated_to_its_writer(tmp_path: Path) -> None:
    """The node's poll takes the writers' lock without waiting: held, a writer is rotating now."""
    path = tmp_path / "n.jsonl"
    path.write_bytes(b"x" * 99 + b"\n")
    with rotation_lock(path) as locked:
        assert locked
        assert not rotate_if_larger(path, 100, keep=2)
    assert rotate_if_larger(path, 100, keep=2)
    assert rotated_path(path, 1).read_bytes() == b"x" * 99 + b"\n" and not path.exists()


def test_a_child_forked_while_the_lock_is_held_does_not_keep_it(tmp_path: Path) -> None:
    """A flock belongs to the open file: a process forked while another thread rotated (a data
    loader's workers) held every writer's next rotation for as long as it lived."""
    path = tmp_path / "n.jsonl"
    ready_r, ready_w = os.pipe()
    release_r, release_w = os.pipe()
    with rotation_lock(path):
        pid = os.fork()
        if pid == 0:  # the child: says it runs (its fork hooks have run), waits, never back into pytest
            try:
                os.write(ready_w, b"r")
                os.read(release_r, 1)
            finally:
                os._exit(0)
    try:
        ready, _, _ = select.select([ready_r], [], [], WAIT_S)
        assert ready and os.read(ready_r, 1) == b"r"
        with rotation_lock(path, wait=False) as locked:
            assert locked, "the forked child holds the rotation lock"
    finally:
        os.write(release_w, b"x")
        deadline = time.monotonic() + WAIT_S
        while os.waitpid(pid, os.WNOHANG) == (0, 0):
            if time.monotonic() > deadline:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                break
            time.sleep(0.01)  # a bounded poll for the released child's exit
        for fd in (ready_r, ready_w, release_r, release_w):
            os.close(fd)
