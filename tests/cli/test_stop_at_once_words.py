"""What a stop at once (a second Ctrl-C) says: a run's last words where one runs
(runtime/last_words.py), else the processes it killed. A training on a cluster said only
``stopped at once: 0 processes killed``, which read as its ranks left running (report dt 7).
The stop's kill and exit are faked here: nothing is killed, and the exit is raised."""

from __future__ import annotations

import signal

import pytest

from troupe.cli import stop_signals
from troupe.runtime.last_words import last_words


class _Exited(Exception):
    pass


def _forced(monkeypatch: pytest.MonkeyPatch, killed: int) -> tuple[list[str], int]:
    """The lines a forced stop says, killing ``killed`` processes, and its exit status."""
    said: list[str] = []
    monkeypatch.setattr(stop_signals, "kill_descendants", lambda: killed)
    monkeypatch.setattr(stop_signals, "close_records", lambda: None)
    monkeypatch.setattr(stop_signals, "say_stopping", lambda text: said.append(str(text)))

    def exit_now(status: int) -> None:
        raise _Exited(status)

    monkeypatch.setattr(stop_signals.os, "_exit", exit_now)
    stop = stop_signals.StopSignals()
    stop.signum = signal.SIGINT
    with pytest.raises(_Exited) as exited:
        stop.force()
    return said, exited.value.args[0]


def test_a_run_s_last_words_are_said_instead_of_no_process_killed(monkeypatch: pytest.MonkeyPatch) -> None:
    with last_words(lambda: "checkpoint at step 700 in /o/ck/step-000000700; the same command ..."):
        said, status = _forced(monkeypatch, 0)
    assert said == ["stopped at once: checkpoint at step 700 in /o/ck/step-000000700; the same command ..."]
    assert status == 130


def test_the_processes_killed_here_are_said_beside_the_run_s_words(monkeypatch: pytest.MonkeyPatch) -> None:
    with last_words(lambda: "checkpoint at step 7 in D"), last_words(lambda: None):
        said, _ = _forced(monkeypatch, 3)
    assert said == ["stopped at once: checkpoint at step 7 in D (3 processes killed here)"]


def test_without_a_run_the_processes_killed_are_said(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken() -> str:
        raise OSError("a folder that cannot be read")

    with last_words(broken):  # one that fails says nothing: the stop still ends, saying the rest
        said, _ = _forced(monkeypatch, 1)
    assert said == ["stopped at once: 1 process killed"]
