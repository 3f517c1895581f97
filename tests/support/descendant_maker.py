"""A test-only actor that starts processes of its own and leaves them running, as a stage's
helpers would: a ``sleep`` through ``subprocess``, and a forked child that ignores SIGTERM (a
fork keeps the worker's SIGTERM handler, which that child never runs: a plain kill does nothing
to it either)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from typing import Any

import psutil

from troupe.runtime.core.actor import Actor, handles
from troupe.runtime.pipeline.stage import StageActor

__all__ = ["MOST_S", "DescendantMaker", "DescendantStage", "start_descendants", "start_in_background"]

MOST_S = 120  # each child ends by itself after this at the latest: a failing test leaves none for long


def start_descendants(most_s: float = MOST_S) -> list[int]:
    """Start a ``sleep`` and a forked child that ignores SIGTERM (both for ``most_s`` at most,
    the forked one holding what the worker holds: its stdout and stderr); their pids."""
    sleeper = subprocess.Popen(
        ["sleep", str(most_s)], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    pid = os.fork()
    if pid == 0:  # the child: never back into the worker's code
        try:
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            time.sleep(most_s)
        finally:
            os._exit(0)
    return [sleeper.pid, pid]


def start_in_background(most_s: float = MOST_S) -> int:
    """A ``sleep`` a shell puts in the background (``sleep N &``) and leaves: orphaned at once, it
    is no longer below the worker; its pid."""
    said = subprocess.run(
        ["/bin/sh", "-c", f"sleep {most_s} >/dev/null 2>&1 & echo $!"],
        stdin=subprocess.DEVNULL, capture_output=True, text=True, check=True, timeout=60,
    )  # fmt: skip
    return int(said.stdout.strip())


class DescendantMaker(Actor):
    """``start`` starts the two children and answers their pids (never waited for);
    ``background`` a shell's background ``sleep``, its pid; ``pid`` the worker's own."""

    @handles("start")
    def start(self, _: object) -> list[int]:
        return start_descendants()

    @handles("background")
    def background(self, _: object) -> int:
        return start_in_background()

    @handles("pid")
    def pid(self, _: object) -> int:
        return os.getpid()


class DescendantStage(StageActor):
    """A stage whose replica starts the two children with its first item, and appends them to
    the JSON-lines file ``pids`` (pid and start time, so that a test kills only those)."""

    def __init__(self, pids: str, most_s: float = MOST_S) -> None:
        self.pids, self.most_s, self.made = pids, most_s, False

    def process(self, item: Any) -> Any:
        if not self.made:  # ("started" is the actor's own hook)
            self.made = True
            with open(self.pids, "a", encoding="utf-8") as out:
                for pid in start_descendants(self.most_s):
                    taken = {"pid": pid, "create_time": psutil.Process(pid).create_time()}
                    out.write(json.dumps(taken) + "\n")
        return item
