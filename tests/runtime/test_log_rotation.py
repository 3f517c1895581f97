"""Log files rotate by size: the node renames, every writer reopens, readers follow, nothing is lost."""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from troupe.runtime.errors import ConfigError
from troupe.runtime.log_files import (
    ReopeningFileHandler,
    history_files,
    last_lines,
    rotate,
    rotate_if_larger,
    rotated_path,
    rotation_count,
    rotations_path,
)
from troupe.runtime.log_follower import MAX_LINE, FileFollower
from troupe.runtime.node.config import load_node_config

WAIT_S = 60.0  # a bound on waiting for another process, not on its speed


def _all_lines(path: Path) -> list[bytes]:
    return [ln for p in history_files(path) for ln in p.read_bytes().splitlines()]


def test_writing_past_the_limit_rotates_and_keeps_n(tmp_path: Path) -> None:
    """At the size limit the file rolls to .1 (.1 to .2 ...); only `keep` rotated files stay, newest
    lines last, none repeated."""
    path = tmp_path / "n.jsonl"
    rotations = 0
    for i in range(200):
        with path.open("ab") as f:
            f.write(b"%04d %s\n" % (i, b"x" * 95))  # 101 bytes a line
        rotations += rotate_if_larger(path, 1000, keep=3)
    assert rotations == 20  # every tenth line reaches 1010 bytes
    # The lock and the count of rotations stay, for the next
    names = ["n.jsonl.1", "n.jsonl.2", "n.jsonl.3", "n.jsonl.lock", "n.rotations"]
    assert sorted(p.name for p in tmp_path.iterdir()) == names
    numbers = [int(ln.split()[0]) for ln in _all_lines(path)]
    assert numbers == list(range(170, 200))  # the last three files' worth, oldest first
    assert not rotate_if_larger(path, 1000, keep=3)  # no file: nothing to do
    with pytest.raises(ValueError, match="keep"):
        rotate(rotated_path(path, 1), 0)


def test_each_rotation_counts_itself_and_a_failed_one_counts_too(tmp_path: Path) -> None:
    """No count file: no rotation counted yet. Each rotation adds one; one that failed midway leaves
    no count to read until the next, which counts it as well (the count runs ahead, never behind).
    A file that holds no count is none, and is counted anew from there."""
    path = tmp_path / "n.jsonl"
    assert rotation_count(path) == 0
    for _ in range(3):
        path.write_bytes(b"x\n")
        rotate(path, keep=2)
    assert rotation_count(path) == 3
    with pytest.raises(FileNotFoundError):
        rotate(path, keep=2)  # the path is not there: the last rename fails
    assert rotation_count(path) is None
    path.write_bytes(b"x\n")
    rotate(path, keep=2)
    assert rotation_count(path) == 5
    rotations_path(path).write_bytes(b"a count of rotations\n")
    assert rotation_count(path) is None
    path.write_bytes(b"x\n")
    rotate(path, keep=2)
    assert rotation_count(path) == 1
    assert rotations_path(path).read_bytes() == b"2\n"  # the longer text before is cut off


def test_history_reads_the_rotated_files_newest_first_only_as_far_as_needed(tmp_path: Path) -> None:
    """last_lines takes the last N matching lines across rotated files, in order; a partial last line of
    the live file is not a line yet."""
    path = tmp_path / "n.jsonl"
    for i in range(3):
        path.write_bytes(b"".join(b"f%d-%d\n" % (i, k) for k in range(3)))
        rotate(path, keep=5)
    path.write_bytes(b"f3-0\nf3-1\nhalf")
    files = history_files(path)
    assert [p.name for p in files] == ["n.jsonl.3", "n.jsonl.2", "n.jsonl.1", "n.jsonl"]
    assert last_lines(files, 4) == [b"f1-2", b"f2-0", b"f2-1", b"f2-2", b"f3-0", b"f3-1"][-4:]
    assert last_lines(files, 3, lambda ln: ln.endswith(b"-0")) == [b"f1-0", b"f2-0", b"f3-0"]
    assert last_lines(files, 0) == []


def test_a_follower_reads_across_a_rotation_without_losing_or_repeating(tmp_path: Path) -> None:
    """Lines a late writer still appends to the renamed file are read, then the new file's, each once."""
    path = tmp_path / "n.jsonl"
    late = path.open("ab", buffering=0)  # a writer that has not reopened yet
    try:
        late.write(b"a1\na2\n")
        follower = FileFollower(path)
        assert follower.read_lines() == [b"a1", b"a2"]
        late.write(b"a3\npart")
        rotate(path, keep=2)
        late.write(b"ial\n")  # lands in n.jsonl.1: the writer has not looked yet
        with path.open("ab") as fresh:
            fresh.write(b"b1\n")
        assert follower.read_lines() == [b"a3", b"partial", b"b1"]
        late.write(b"a4\n")
        with path.open("ab") as fresh:
            fresh.write(b"b2\n")
        assert sorted(follower.read_lines()) == [b"a4", b"b2"]
        assert follower.read_lines() == []
        follower.close()
    finally:
        late.close()


def test_a_writer_reopens_the_file_after_a_rotation(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The handler notices the rename (at its next look) and writes to a new file at the path; a handler
    given max_bytes rotates its file itself."""
    import logging

    import troupe.runtime.log_files as log_files

    monkeypatch.setattr(log_files, "REOPEN_CHECK_S", 0.0)  # look before every line
    path = tmp_path / "n.jsonl"
    handler = ReopeningFileHandler(path)
    record = logging.LogRecord("t", logging.INFO, __file__, 1, "%s", ("one",), None)
    try:
        handler.emit(record)
        rotate(path, keep=2)
        record.args = ("two",)
        handler.emit(record)
    finally:
        handler.close()
    assert rotated_path(path, 1).read_text() == "one\n"
    assert path.read_text() == "two\n"

    own = ReopeningFileHandler(tmp_path / "m.jsonl", max_bytes=10, keep=2)
    try:
        for word in ("first-line", "second-one", "third"):
            record.args = (word,)
            own.emit(record)
    finally:
        own.close()
    assert [p.name for p in history_files(tmp_path / "m.jsonl")] == ["m.jsonl.2", "m.jsonl.1", "m.jsonl"]
    assert (tmp_path / "m.jsonl").read_text() == "third\n"


_WRITER = textwrap.dedent(
    """
    import sys
    from pathlib import Path

    import structlog

    import troupe.runtime.log_files as log_files
    from troupe.runtime.logs import configure_logging

    log_files.REOPEN_CHECK_S = 0.001  # look often, so lines land in both files
    configure_logging("n", sys.argv[2], Path(sys.argv[1]), console=False)
    log = structlog.get_logger("w")
    count = int(sys.argv[3])
    for i in range(count):
        if i == count // 2:
            print("half", flush=True)
            sys.stdin.readline()  # the test rotates here, for certain, while this file is open
        log.info("line", i=i)
    """
)


def test_two_processes_appending_across_rotations_lose_no_line(tmp_path: Path) -> None:
    """Two processes log to one file while it rotates (once for certain mid-way, more as it grows):
    every line of both is in the files exactly once, and both write to the new file after a rotation."""
    count = 3000
    path = tmp_path / "n.jsonl"
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _WRITER, str(tmp_path), f"w{k}", str(count)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        for k in range(2)
    ]
    rotations = 0
    try:
        for proc in procs:
            assert proc.stdout is not None and proc.stdout.readline() == "half\n"
        rotate(path, keep=1000)
        rotations += 1
        for proc in procs:
            assert proc.stdin is not None
            proc.stdin.write("go\n")
            proc.stdin.flush()
        deadline = time.monotonic() + WAIT_S
        while any(p.poll() is None for p in procs) and time.monotonic() < deadline:
            rotations += rotate_if_larger(path, 32 * 1024, keep=1000)
            time.sleep(0.005)
        assert [p.wait(timeout=WAIT_S) for p in procs] == [0, 0]
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
            proc.communicate(timeout=WAIT_S)
    records = [json.loads(ln) for ln in _all_lines(path)]
    assert sorted((r["process"], r["i"]) for r in records) == sorted(
        (f"w{k}", i) for k in range(2) for i in range(count)
    )
    assert len(history_files(path)) in (rotations, rotations + 1)  # + the live file, unless just rotated
    oldest = [json.loads(ln) for ln in history_files(path)[0].read_bytes().splitlines()]
    # Each writer went on in a new file after the certain rotation (a look every millisecond,
    # 1,500 lines to write): its last line is not in the oldest file.
    assert {r["process"] for r in oldest} == {"w0", "w1"}
    assert all(r["i"] < count - 1 for r in oldest)


def _rec(event: str, second: int) -> bytes:
    stamp = f"2026-01-01T00:{second // 60:02d}:{second % 60:02d}Z"
    return json.dumps({"timestamp": stamp, "level": "info", "node": "n", "event": event}).encode() + b"\n"


def test_tail_reads_the_rotated_files_for_history(tmp_path: Path) -> None:
    """`troupe logs tail --no-follow -n N` of a stopped node's files takes the last N lines across the
    rotated files, oldest first."""
    path = tmp_path / "n.jsonl"
    for k in range(3):
        path.write_bytes(b"".join(_rec(f"e{k * 4 + i}", k * 4 + i) for i in range(4)))
        rotate(path, keep=5)
    path.write_bytes(_rec("e12", 12))
    args = ["logs", "tail", "--logs", str(tmp_path), "--no-follow", "-n", "6", "--json"]
    out = subprocess.run(
        [sys.executable, "-m", "troupe.cli.main", *args],
        capture_output=True,
        text=True,
        timeout=WAIT_S,
    )
    assert out.returncode == 0, out.stderr
    assert [json.loads(ln)["event"] for ln in out.stdout.splitlines()] == [f"e{i}" for i in range(7, 13)]


def test_tail_follows_across_a_rotation(tmp_path: Path) -> None:
    """A following tail prints every line once across a rotation: the late writer's lines in the renamed
    file and the new file's alike."""
    path = tmp_path / "n.jsonl"
    path.write_bytes(b"")
    tail = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "troupe.cli.main",
            "logs",
            "tail",
            "--logs",
            str(tmp_path),
            "-n",
            "0",
            "--json",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    printed: list[str] = []
    buffer = [b""]

    def read_until(event: str) -> None:
        """Read what the tail prints until ``event`` (raw reads: a buffered readline would hide lines
        from select)."""
        assert tail.stdout is not None
        deadline = time.monotonic() + WAIT_S
        while event not in printed and time.monotonic() < deadline:
            ready, _, _ = select.select([tail.stdout], [], [], max(deadline - time.monotonic(), 0.0))
            if ready:
                *lines, buffer[0] = (buffer[0] + os.read(tail.stdout.fileno(), 65536)).split(b"\n")
                printed.extend(json.loads(ln)["event"] for ln in lines)
        assert event in printed, printed

    try:
        with path.open("ab", buffering=0) as late:
            k = 0
            while not printed:  # a bounded poll: until the tail reads the file
                late.write(_rec(f"warmup{k}", 0))
                k += 1
                ready, _, _ = select.select([tail.stdout], [], [], 0.2)
                if ready:
                    read_until(f"warmup{k - 1}")
                assert tail.poll() is None and k < WAIT_S / 0.2
            late.write(_rec("before", 1))
            rotate(path, keep=3)
            late.write(_rec("late", 2))  # still the renamed file: this writer has not reopened
            with path.open("ab") as fresh:
                fresh.write(_rec("after", 3))
            read_until("after")
            read_until("late")
            late.write(_rec("later", 4))
            read_until("later")
        tail.send_signal(signal.SIGINT)
        assert tail.wait(timeout=WAIT_S) == 130
        events = [e for e in printed if not e.startswith("warmup")]
        assert sorted(events) == ["after", "before", "late", "later"]
    finally:
        if tail.poll() is None:
            tail.kill()
        tail.communicate(timeout=WAIT_S)


def test_a_line_without_end_is_passed_on_in_pieces(tmp_path: Path) -> None:
    """A writer that never ends its line does not make a reader hold it all."""
    path = tmp_path / "n.jsonl"
    path.write_bytes(b"x" * (MAX_LINE + 10))
    follower = FileFollower(path)
    try:
        assert [len(ln) for ln in follower.read_lines()] == [MAX_LINE + 10]
        with path.open("ab") as f:
            f.write(b"yz\n")
        assert follower.read_lines() == [b"yz"]
    finally:
        follower.close()


@pytest.mark.parametrize(("field", "value"), [("log_max_mb", "0"), ("log_keep", "0"), ("log_keep", '"5"')])
def test_bad_rotation_settings_are_refused_by_name(tmp_path: Path, field: str, value: str) -> None:
    config = tmp_path / "node.toml"
    config.write_text(f"[node]\n{field} = {value}\n")
    with pytest.raises(ConfigError, match=f"node.{field}"):
        load_node_config(config)
