"""A log file stays JSON lines through a full disk: no line torn, none glued to the next, no
piece of an old line written later (report ob 5: a buffered writer kept the unwritten tail of
the line the disk cut short and wrote it, once there was room, in front of the next record)."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import anyio
import pytest

from support.local_node import echo_node_config, running_node
from support.small_disk import small_disk
from troupe.runtime.log_files import ReopeningFileHandler


def _record(n: int) -> logging.LogRecord:
    # 301 bytes a line: no page boundary of the small disk falls between two lines.
    text = json.dumps({"n": n, "pad": "x" * (282 - len(str(n)))})
    return logging.LogRecord("t", logging.INFO, __file__, 1, "%s", (text,), None)


def _fill(disk: Path) -> Path:
    """A file that takes all the room left on ``disk``."""
    filler = disk / "filler"
    with filler.open("wb", buffering=0) as f:
        try:
            while True:
                f.write(b"\0" * 4096)
        except OSError:
            pass
    return filler


def test_every_line_is_whole_json_after_the_disk_filled_and_was_freed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with small_disk(tmp_path / "disk", "64k") as disk:
        path = disk / "n.jsonl"
        handler = ReopeningFileHandler(path)
        try:
            n = 0
            while handler.dropped == 0:  # until the disk fills, mid-line
                handler.emit(_record(n))
                n += 1
            for k in range(n, n + 20):  # lost: the disk is full
                handler.emit(_record(k))
            os.truncate(path, 0)  # room again (an operator deleting the old lines)
            for k in range(1000, 1005):
                handler.emit(_record(k))
        finally:
            handler.close()
        lines = path.read_bytes().split(b"\n")
    assert lines[-1] == b"", "the file ends with a whole line"
    assert [json.loads(ln)["n"] for ln in lines[:-1]] == list(range(1000, 1005))
    assert capsys.readouterr().err.count("cannot write the log file") == 1


def test_a_line_the_disk_cut_short_is_taken_back(tmp_path: Path) -> None:
    with small_disk(tmp_path / "disk", "64k") as disk:
        path = disk / "n.jsonl"
        room = disk / "room"
        room.write_bytes(b"\0" * 8192)
        handler = ReopeningFileHandler(path)
        try:
            n = 0
            while handler.dropped == 0:
                handler.emit(_record(n))
                n += 1
            kept = path.read_bytes()
            room.unlink()  # room again: the lines after are whole, and nothing of the cut one
            for k in range(1000, 1003):
                handler.emit(_record(k))
        finally:
            handler.close()
        lines = path.read_bytes().split(b"\n")
    assert len(kept) % 301 == 0, "the cut line was taken back"
    assert [json.loads(ln)["n"] for ln in kept.splitlines()] == list(range(n - 1))
    assert lines[-1] == b""
    assert [json.loads(ln)["n"] for ln in lines[:-1]] == [*range(n - 1), 1000, 1001, 1002]


async def test_a_worker_that_cannot_write_the_node_s_log_says_so(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    """The node's workers and supervisor were told to leave it to the node, which said nothing
    when only they logged (report ob 5): each process now says it, naming itself."""
    with small_disk(tmp_path / "disk", "64k") as disk:
        filler = _fill(disk)
        try:
            cfg = echo_node_config(disk, "nfull", log_level="info", endpoint="tcp://127.0.0.1:26210")
            async with running_node(cfg):
                with anyio.fail_after(60):
                    while "(process w1)" not in (said := capfd.readouterr().err):
                        await anyio.sleep(0.05)  # a bounded poll of the worker's stderr
        finally:
            filler.unlink()
    assert f"troupe: cannot write the log file {disk / 'nfull.jsonl'} (No space left on device)" in said
