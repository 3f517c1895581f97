"""A Ctrl-C that reaches a benchmark's child while its interpreter still starts (the terminal
sends it to the whole group) is ignored as the child's later Ctrl-Cs are: it printed the
traceback of whichever import the child was in, over the benchmark's one line."""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import time

import pytest

from troupe.cli.bench.stopping import deaf_to_ctrl_c, start_deaf

WITHIN_S = 60.0  # a bound on a hang, not on speed


def test_a_ctrl_c_while_a_bench_child_starts_is_ignored(capfd: pytest.CaptureFixture[str]) -> None:
    child = mp.get_context("spawn").Process(target=deaf_to_ctrl_c, args=(time.sleep, 0.0))
    start_deaf(child)
    try:
        os.kill(child.pid, signal.SIGINT)  # its interpreter has only begun to start
        child.join(WITHIN_S)
        assert child.exitcode == 0, f"the child died of the Ctrl-C (exit {child.exitcode})"
    finally:
        if child.is_alive():
            child.kill()
            child.join(WITHIN_S)
    err = capfd.readouterr().err
    assert "KeyboardInterrupt" not in err and "Traceback" not in err, err


class _StartingWithACtrlC:
    """A process whose start meets a Ctrl-C (the terminal's, sent to the benchmark)."""

    def start(self) -> None:
        os.kill(os.getpid(), signal.SIGINT)


def test_the_benchmark_itself_still_takes_a_ctrl_c_that_came_during_a_start() -> None:
    """Blocked in the starting thread only, not ignored: the benchmark stops as before."""
    taken: list[int] = []
    previous = signal.signal(signal.SIGINT, lambda signum, _frame: taken.append(signum))
    try:
        start_deaf(_StartingWithACtrlC())
        deadline = time.monotonic() + WITHIN_S
        while not taken and time.monotonic() < deadline:
            time.sleep(0.001)  # Python runs the handler between bytecodes of this thread
    finally:
        signal.signal(signal.SIGINT, previous)
    assert taken == [signal.SIGINT]
