"""A double Ctrl-C within ``SAME_STOP_S`` is one graceful stop, kept so (a wrapper passes one
Ctrl-C on twice: README, Decisions); a person who pressed twice was told nothing and waited on a
stop at once that never came. The echo is said now, with the way to stop at once; a Ctrl-C after
the window still stops at once.

The watch runs in a child this test starts, its window set there to an hour (every repeat is
within it, however slow the machine) or to nothing (every repeat is past it), its graceful stop
held until the test writes a line to its stdin; the child is reaped whatever happens."""

from __future__ import annotations

import queue
import signal
import subprocess
import sys
import textwrap
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import IO

WAIT_S = 60.0  # a bound on a line's coming, not on its speed

CHILD = """
import sys

import anyio

from troupe.cli import stop_signals

stop_signals.SAME_STOP_S = float(sys.argv[1])


async def main() -> None:
    signals = stop_signals.StopSignals()
    async with anyio.create_task_group() as tg:
        work = anyio.CancelScope()
        await tg.start(signals.watch, work)
        print("ready", flush=True)
        with work:
            await anyio.sleep_forever()
        print("stopping", flush=True)
        await anyio.to_thread.run_sync(sys.stdin.readline)  # the graceful stop, held
        tg.cancel_scope.cancel()
    signals.exit()


anyio.run(main)
"""


class Child:
    """The child's process and its output's lines, read in threads, each awaited with a bound."""

    def __init__(self, window_s: float) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", textwrap.dedent(CHILD), str(window_s)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.out: queue.Queue[str] = queue.Queue()
        self.err: queue.Queue[str] = queue.Queue()
        self.said: list[str] = []
        assert self.proc.stdout is not None and self.proc.stderr is not None
        self.readers = [
            threading.Thread(target=_read, args=(stream, lines), daemon=True)
            for stream, lines in ((self.proc.stdout, self.out), (self.proc.stderr, self.err))
        ]
        for reader in self.readers:
            reader.start()

    def close(self) -> None:
        """Reap the child (killed if it still runs) and close its pipes, once read to their end."""
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=WAIT_S)
        for reader in self.readers:
            reader.join(timeout=WAIT_S)
        for stream in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            if stream is not None:
                stream.close()

    def line(self, lines: queue.Queue[str], what: str) -> str:
        try:
            line = lines.get(timeout=WAIT_S)
        except queue.Empty:
            raise AssertionError(f"no {what} within {WAIT_S} s; stderr: {self.said}") from None
        self.said.append(line)
        return line

    def finish(self) -> int:
        """Let the graceful stop end; the child's exit status."""
        assert self.proc.stdin is not None
        self.proc.stdin.write("go\n")
        self.proc.stdin.flush()
        return self.proc.wait(timeout=WAIT_S)


def _read(stream: IO[str], lines: queue.Queue[str]) -> None:
    for line in stream:
        lines.put(" ".join(line.split()))


@contextmanager
def child(window_s: float) -> Iterator[Child]:
    started = Child(window_s)
    try:
        assert started.line(started.out, "ready line") == "ready"
        yield started
    finally:
        started.close()


def test_a_double_ctrl_c_is_one_stop_and_is_said() -> None:
    with child(window_s=3600.0) as c:
        c.proc.send_signal(signal.SIGINT)
        assert c.line(c.out, "stop") == "stopping"
        said = c.line(c.err, "first stop's line")
        assert said == "SIGINT: stopping gracefully (Ctrl-C again to stop at once)", said
        c.proc.send_signal(signal.SIGINT)  # the same keypress, passed on twice
        said = c.line(c.err, "echo's line")
        assert said.startswith("SIGINT again within ") and said.endswith(
            "s: taken as the same stop (a wrapper may pass one Ctrl-C on twice); still stopping "
            "gracefully (Ctrl-C again to stop at once)"
        ), said
        assert c.finish() == 130
        assert not any("stopped at once" in line for line in c.said)


def test_a_ctrl_c_past_the_window_stops_at_once() -> None:
    with child(window_s=0.0) as c:
        c.proc.send_signal(signal.SIGINT)
        assert c.line(c.out, "stop") == "stopping"
        c.line(c.err, "first stop's line")
        c.proc.send_signal(signal.SIGINT)
        assert c.line(c.err, "stop at once's line") == "stopped at once: 0 processes killed"
        assert c.proc.wait(timeout=WAIT_S) == 130
