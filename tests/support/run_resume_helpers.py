"""`troupe run` and the other long-running commands as real processes, for the stop and resume
tests: started in a session of their own (so a test can Ctrl-C the whole group, as a terminal
does), their descendants tracked while they run, and everything reaped at the end."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import psutil
import pyarrow.parquet as pq

from troupe.runtime.testing.plugin import free_endpoint

__all__ = ["Command", "dataset_task_ids", "run_args", "running", "small_pipeline", "summary_counts"]

ROOT = Path(__file__).resolve().parents[2]


def small_pipeline(tmp_path: Path) -> Path:
    """configs/datagen.toml at a quarter of the pixels and a third of the frames (quick)."""
    text = (ROOT / "configs" / "datagen.toml").read_text(encoding="utf-8")
    small = text.replace("width = 96, height = 72", "width = 48, height = 36").replace(
        "max_frames = 60", "max_frames = 20"
    )
    assert "width = 48, height = 36" in small and "max_frames = 20" in small, (
        "configs/datagen.toml changed shape"
    )
    path = tmp_path / "datagen-small.toml"
    path.write_text(small, encoding="utf-8")
    return path


def run_args(config: Path, out: Path, scenes: int, *extra: str) -> list[str]:
    """``troupe run`` arguments on free loopback ports."""
    return [
        "run",
        str(config),
        "--scenes",
        str(scenes),
        "--out",
        str(out),
        "--endpoint",
        free_endpoint(),
        "--master",
        free_endpoint(),
        *extra,
    ]


@dataclass
class Command:
    """A troupe command running in its own session, with every process it was seen to start."""

    proc: subprocess.Popen[bytes]
    output: Path
    seen: dict[int, psutil.Process] = field(default_factory=dict)

    def track(self) -> None:
        """Remember the current descendants (a worker started later is caught by a later look)."""
        try:
            for child in psutil.Process(self.proc.pid).children(recursive=True):
                self.seen.setdefault(child.pid, child)
        except psutil.NoSuchProcess:
            pass

    def wait_until(self, what: str, done: Callable[[], bool], timeout: float = 180.0) -> None:
        """Poll ``done`` (bounded), tracking descendants meanwhile; fail if the command exits."""
        deadline = time.monotonic() + timeout
        while not done():
            self.track()
            assert self.proc.poll() is None, (
                f"exited {self.proc.returncode} before {what}:\n{self.text()[-3000:]}"
            )
            assert time.monotonic() < deadline, f"no {what} within {timeout}s:\n{self.text()[-3000:]}"
            time.sleep(0.05)
        self.track()

    def signal(self, signum: int, group: bool = False) -> None:
        """Send ``signum`` to the command (``group``: to its whole process group, like Ctrl-C)."""
        self.track()
        if group:
            os.killpg(self.proc.pid, signum)
        else:
            self.proc.send_signal(signum)

    def wait(self, timeout: float = 120.0) -> int:
        return self.proc.wait(timeout=timeout)

    def ctrl_c_while_held(self, what: str, held: Path, release: Path, timeout: float) -> int:
        """Ctrl-C the command once it holds at the point ``what`` names (``held`` exists), let it
        go on once it took the signal (``release``), and return its exit status."""
        self.wait_until(what, held.exists, timeout)
        self.signal(signal.SIGINT)
        self.wait_until("the command taking the signal", lambda: "SIGINT: stopping gracefully" in self.text())
        release.write_text("")
        return self.wait(timeout=timeout)

    def text(self) -> str:
        return self.output.read_text(encoding="utf-8", errors="replace")

    def survivors(self, timeout: float = 30.0) -> list[int]:
        """Pids of processes of this command still alive after a bounded wait (zombies count as gone)."""
        deadline = time.monotonic() + timeout
        while True:
            alive = [p.pid for p in self.seen.values() if _alive(p)]
            if not alive or time.monotonic() > deadline:
                return alive
            time.sleep(0.05)


def _alive(proc: psutil.Process) -> bool:
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


@contextmanager
def running(args: list[str], tmp_path: Path, name: str = "cmd", code: str | None = None) -> Iterator[Command]:
    """Start ``troupe *args`` (``code``: ``python -c code *args`` instead, a command with a test's
    hook, ``support.cli_scripts``); on exit SIGKILL whatever of it is left, whatever the test did."""
    output = tmp_path / f"{name}-{time.monotonic_ns()}.out"
    command = ["-m", "troupe.cli.main"] if code is None else ["-c", code]
    with output.open("wb") as sink:
        proc = subprocess.Popen(
            [sys.executable, *command, *args],
            stdin=subprocess.DEVNULL,
            stdout=sink,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1", "COLUMNS": "200"},
        )
    cmd = Command(proc, output)
    try:
        yield cmd
    finally:
        cmd.track()
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
        for child in cmd.seen.values():
            try:
                child.kill()
            except psutil.Error:
                pass


def dataset_task_ids(out: Path) -> tuple[int, list[str]]:
    """``total_episodes`` of the dataset under ``out`` and the task id of each of its episodes."""
    info = json.loads((out / "meta" / "info.json").read_text(encoding="utf-8"))
    ids: list[str] = []
    for path in sorted((out / "meta" / "episodes").rglob("*.parquet")):
        ids += pq.read_table(path).column("troupe/task_id").to_pylist()
    return int(info["total_episodes"]), ids


def summary_counts(text: str) -> dict[str, int]:
    """The outcome counts `troupe run` printed: ok, pruned, dead, kept and done before."""
    flat = " ".join(text.split())
    found = re.search(r"(\d+) ok, (\d+) pruned, (\d+) dead", flat)
    assert found, text[-3000:]
    kept = re.search(r"(\d+) found committed", flat)
    before = re.search(r"\((\d+) done before\)", flat)
    ok, pruned, dead = map(int, found.groups())
    earlier = re.search(r"(\d+) done by earlier runs", flat)
    kept_n, before_n = int(kept.group(1)) if kept else 0, int(before.group(1)) if before else 0
    # The closing line counts what earlier runs did, so that it adds up to the items.
    assert (int(earlier.group(1)) if earlier else 0) == kept_n + before_n, text[-3000:]
    return {
        "ok": ok,
        "pruned": pruned,
        "dead": dead,
        "kept": kept_n,
        "before": before_n,
    }
