"""What a run records and says of itself when the command stops at once (a second Ctrl-C).

The stop at once (``troupe.cli.stop_signals``) SIGKILLs the command's processes and exits
without any clean-up: a training run's log had no end (no ``train_stopped``), and the terminal
said ``stopped at once: 0 processes killed`` (its ranks run on a cluster's nodes, not here),
without the checkpoint a rerun resumes from, which the graceful stop names. A run registers its
last words here for as long as it runs (:func:`last_words`): a call that records its end and
returns the line to say; the stop calls them (:func:`said_at_once`), each bounded, before it
exits. The runtime owns the registry, not the CLI, so that a run of ``troupe.actors`` registers
without importing the CLI.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator

__all__ = ["last_words", "said_at_once"]

_SAY_WAIT_S = 2.0  # a stop at once is no longer than this for a folder that hangs (a lost NFS server)

_words: list[Callable[[], str | None]] = []


@contextlib.contextmanager
def last_words(words: Callable[[], str | None]) -> Iterator[None]:
    """While the block runs, a stop at once calls ``words``: it records the run's end (a log
    line) and returns what the stop says of the run (None: nothing)."""
    _words.append(words)
    try:
        yield
    finally:
        _words.remove(words)


def said_at_once(wait_s: float = _SAY_WAIT_S) -> list[str]:
    """Call every run's last words, in a thread waited on for at most ``wait_s``: the stop ends
    the process next, and neither a folder that hangs nor a lock the interrupted main thread
    holds may keep it from that. The lines said by then, in the order the runs registered."""
    said: list[str] = []

    def say_all() -> None:
        for words in list(_words):
            with contextlib.suppress(Exception):  # one that fails: the next, still
                line = words()
                if line:
                    said.append(line)

    sayer = threading.Thread(target=say_all, name="last-words", daemon=True)
    try:
        sayer.start()
    except RuntimeError:  # no thread to be had (a pids limit): the stop says what it knows
        return []
    sayer.join(wait_s)
    return list(said)
