"""Ctrl-C in the middle of a benchmark, sent as a terminal sends it (to the process group): exit
130 and one line, no traceback (the benchmark's, nor its children's), and no process it started
left running. ``bench messaging`` went on through its phases with half its figures
and ended in a KeyError; ``bench train`` in "no median for empty data"; ``bench recovery``
waited 30 s for a process that waited for good, and left it running."""

from __future__ import annotations

import contextlib
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from troupe.runtime.testing.plugin import reap

pytestmark = pytest.mark.e2e

HANG_GUARD_S = 180  # only so a regression cannot hang the suite; nothing here measures speed


@pytest.fixture
def bench() -> Iterator[list[subprocess.Popen[str]]]:
    started: list[subprocess.Popen[str]] = []
    yield started
    for proc in started:
        try:
            children = psutil.Process(proc.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            children = []
        reap(proc, children)  # type: ignore[arg-type]  # text mode: reap only signals and waits
        for reader in [t for t in threading.enumerate() if t.name == f"bench-out-{proc.pid}"]:
            reader.join(timeout=HANG_GUARD_S)  # at the pipe's end, now the process is gone
        assert proc.stdout is not None
        proc.stdout.close()


def _children_once_one_runs(proc: subprocess.Popen[str], mark: str, said: list[str]) -> list[psutil.Process]:
    """The bench's processes, once one whose command line holds ``mark`` runs (polled; the
    bench's own phases bound it)."""
    while True:
        assert proc.poll() is None, "".join(said)
        children = psutil.Process(proc.pid).children(recursive=True)
        for p in children:
            with contextlib.suppress(psutil.Error):
                if mark in " ".join(p.cmdline()):
                    return children
        time.sleep(0.01)


def _lines(proc: subprocess.Popen[str]) -> queue.Queue[str | None]:
    lines: queue.Queue[str | None] = queue.Queue()

    def read() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.put(line)
        lines.put(None)

    threading.Thread(target=read, name=f"bench-out-{proc.pid}", daemon=True).start()
    return lines


@pytest.mark.parametrize(
    ("args", "phase", "child"),
    [
        # A multiprocessing child of the raw pyzmq side ("spawn_main" in its command line).
        (["messaging", "--quick", "--repeat", "1"], "measuring ask1", "spawn_main"),
        (["train", "--steps", "4", "--repeat", "1", "--inflight", "1"], "round 1 of 1", ""),
        (["recovery", "--repeat", "1"], "importing torch too", ""),
    ],
    ids=["messaging", "train", "recovery"],
)
def test_a_benchmark_stopped_midway_exits_130_and_leaves_nothing(
    bench: list[subprocess.Popen[str]], args: list[str], phase: str, child: str, tmp_path: Path
) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "troupe.cli.main", "bench", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "COLUMNS": "200", "TMPDIR": str(tmp_path)},  # its folders, looked at after
        start_new_session=True,  # a group of its own, to get Ctrl-C as a terminal sends it
    )
    bench.append(proc)
    lines = _lines(proc)
    said: list[str] = []
    while not any(phase in line for line in said):
        line = lines.get(timeout=HANG_GUARD_S)
        assert line is not None, f"it ended before {phase!r}: {''.join(said)}"
        said.append(line)
    started = _children_once_one_runs(proc, child, said)
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=HANG_GUARD_S) == 130, "".join(said)
    while (line := lines.get(timeout=HANG_GUARD_S)) is not None:
        said.append(line)
    output = "".join(said)
    assert "stopped (SIGINT): the benchmark prints no figures" in output, output
    assert "Traceback" not in output, output
    left = [p.pid for p in started if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
    assert left == [], output
    assert [f.name for f in tmp_path.glob("troupe-bench*")] == [], output  # its temporary folders
