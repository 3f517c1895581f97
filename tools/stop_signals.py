"""Ctrl-C, SIGTERM and SIGHUP for the troupe command: the first stops gracefully, a second
Ctrl-C or SIGTERM at once.

Every command runs its work in a cancel scope (``client.run_async``). The first SIGINT, SIGTERM
or SIGHUP cancels that scope: the work stops the structured way, and what owns processes (the
node) stops them in its shielded clean-up, workers first, within its ``stop_grace_s``. The
command then exits 128 + the signal (130 for SIGINT, 143 for SIGTERM, 129 for SIGHUP). A second
SIGINT or SIGTERM during that stop does not wait: every process this one started (the whole
tree) is SIGKILLed and the command exits at once with the first signal's status. Committed
outputs stay committed either way.

SIGHUP is what a command gets when its terminal goes (an ssh session that closes): it used to
end the command at once, by the signal's default action, leaving its processes to find out
alone and its journal unclosed. It is a stop like the others, never a second one: a hangup
comes more than once (from the shell, and from the kernel as the session's leader exits), and
nobody asked twice. With the terminal gone, the stop's lines cannot be written (EIO): they are
dropped, and the stop goes on.

The first signal again within :data:`SAME_STOP_S` of it is that stop's echo, not a second one:
GNU ``timeout`` (and a supervisor that signals a child and then its process group) sends one
SIGTERM twice within microseconds, and whether the two merge while pending is chance, so a
single stop request was taken as "stop at once" about one time in three. Nobody who reads
"(Ctrl-C again to stop at once)" presses again that fast; a sender's pid (``sigwaitinfo``)
cannot tell them apart either: ``timeout``'s two come from one pid, as do a shell's two
``kill``, and a terminal's Ctrl-C comes from the kernel each time. The window holds for Ctrl-C
too: one keypress reaches a command twice where a wrapper passes SIGINT on to a child that its
terminal signalled already (``uv run`` did, 200 ms later; a launcher that forwards to its
children in the same process group). A Ctrl-C taken as an echo is said, as the first one was:
a person who pressed twice knows the stop is still graceful, and to press again.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import signal
import sys
import time
from collections.abc import Callable, Iterator

import anyio
import psutil
from anyio.abc import TaskStatus
from rich.console import Console
from rich.text import Text

from troupe.runtime.last_words import said_at_once
from troupe.runtime.node.leftovers import close_records

from .closed_output import OUTPUT_CLOSED

__all__ = [
    "STOP_SIGNALS",
    "StopSignals",
    "exit_status",
    "heeded_signals",
    "keep_ignored_signals",
    "kill_descendants",
    "lines_above",
    "say_aside",
    "say_if_heard",
    "say_stopping",
    "stop_came",
]

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
# The first signal again this soon after it is the same stop request (see the module's docstring).
SAME_STOP_S = 0.5
# Those the command was started with ignored (``keep_ignored_signals``): they stay ignored.
_IGNORED_AT_START: set[int] = set()
# What stops the command at once once a signal began its graceful stop (said with it).
_AT_ONCE: dict[int, str] = {
    signal.SIGINT: "Ctrl-C again",
    signal.SIGTERM: "SIGTERM again",
    signal.SIGHUP: "Ctrl-C or SIGTERM",
}

# Said of a Ctrl-C taken as the first one's echo: a double press within SAME_STOP_S is one stop,
# and the person who pressed twice is told so, not left waiting on a stop at once.
_SAME_CTRL_C = (
    f"SIGINT again within {SAME_STOP_S:g} s: taken as the same stop (a wrapper may pass one Ctrl-C on "
    "twice); still stopping gracefully (Ctrl-C again to stop at once)"
)

_err = Console(stderr=True)
_displays: list[Console] = []  # consoles that may show a live display now (``lines_above``)


@contextlib.contextmanager
def lines_above(console: Console) -> Iterator[None]:
    """While ``console`` may show a live display (a spinner, progress bars), a stop's lines go
    through it, above the display: a console of their own wrote them beside it, and the
    display's next redraw erased them. Where stderr is not that terminal (``2>file``), they go
    to stderr as before."""
    _displays.append(console)
    try:
        yield
    finally:
        _displays.remove(console)


def say_stopping(text: str | Text) -> None:
    """A line about a command's stop (the stop's own, or what it leaves behind): above a live
    display, else on stderr."""
    say_aside(text)


def say_aside(text: str | Text) -> None:
    """A line beside a command's output (a stop's, a warning): on stderr; through a live
    display's console, above it, where both are the one terminal (its redraw erased it else)."""
    display = _displays[-1] if _displays else None
    console = display if display is not None and display.is_terminal and _stderr_is_a_terminal() else _err
    say_if_heard(console, text)


def say_if_heard(console: Console, text: str | Text) -> None:
    """Print ``text`` on ``console``, or nothing where nobody can read it any more: a terminal
    that hung up (EIO), a closed pipe. A command stopping must go on stopping, not fail on
    the line that says so."""
    try:
        console.print(text, highlight=False, soft_wrap=True)
    except OSError:  # EIO: the terminal is gone; what the console holds would fail again
        console.quiet = True
    except SystemExit as exc:  # a closed pipe (closed_output): its console is silenced already
        if exc.code != OUTPUT_CLOSED:
            raise


def stop_came() -> bool:
    """Whether a stop signal cancelled the command's work (``run_async``'s scope), although
    what it awaited returned: the cancelled scope says so at once, awaiting nothing."""
    return anyio.current_effective_deadline() == -math.inf


def _stderr_is_a_terminal() -> bool:
    try:
        return os.isatty(2)
    except OSError:
        return False


def keep_ignored_signals() -> None:
    """Note the stop signals this process was started with ignored, before troupe handles any:
    they stay ignored. ``nohup`` ignores SIGHUP so that a command outlives its session (the
    README's way to keep a node past an ssh session), and a shell script's background job has
    SIGINT ignored; handled anyway, a node started under nohup stopped with its session. Called
    by the command line's entry only (a program that runs troupe in-process keeps its own)."""
    _IGNORED_AT_START.update(s for s in STOP_SIGNALS if signal.getsignal(s) == signal.SIG_IGN)


def heeded_signals() -> tuple[signal.Signals, ...]:
    """The stop signals a command handles: :data:`STOP_SIGNALS` less those it was started with
    ignored (:func:`keep_ignored_signals`)."""
    return tuple(s for s in STOP_SIGNALS if s not in _IGNORED_AT_START)


def exit_status(signum: int) -> int:
    """The shell's status for a command stopped by ``signum`` (130 for SIGINT, 143 for SIGTERM,
    129 for SIGHUP)."""
    return 128 + int(signum)


def kill_descendants(wait_s: float = 2.0) -> int:
    """SIGKILL every process this one started, children of children included; reap them.

    Returns:
        How many processes were signalled.
    """
    try:
        procs = psutil.Process().children(recursive=True)
    except psutil.Error:
        return 0
    for proc in procs:
        try:
            proc.kill()
        except psutil.Error:
            pass  # it exited meanwhile
    psutil.wait_procs(procs, timeout=wait_s)  # reaps our own children: no zombie left behind
    return len(procs)


class StopSignals:
    """Watches SIGINT, SIGTERM and SIGHUP for one command run.

    Args:
        quiet: say nothing on the first signal: a command with nothing to stop (a reader, such
            as ``logs tail``) ends at once, and "stopping gracefully" would be nonsense there.
        clock: the monotonic seconds a signal is taken at, to tell a repeat of the first within
            :data:`SAME_STOP_S` (the same request) from a second one; a test's fake.

    Attributes:
        signum: the first stop signal received, None while none came.
        work_done: set by the command once its work is done and said (``run_async``'s
            ``done_if_returned``): a stop signal from then on stops nothing and is ignored, to
            the process's end, so the command exits 0. As the process wound down (a second or
            more with torch imported) it ended it with the signal's status or, once the
            interpreter had put its default handlers back to free the modules, killed it by
            the signal: a shell said 130 after a complete run's report. Ignored, not handled:
            the interpreter keeps an ignored signal ignored, a handled one it resets.
    """

    def __init__(self, quiet: bool = False, clock: Callable[[], float] = time.monotonic) -> None:
        self.signum: int | None = None
        self.quiet = quiet
        self.work_done = False
        self._clock = clock
        self._first_at = -math.inf  # when the first signal was taken

    def _echo(self, signum: int) -> bool:
        """Whether ``signum``, taken after the first, is that first request again: the same
        signal within :data:`SAME_STOP_S` (one ``timeout`` sends twice), or any hangup."""
        if signum == signal.SIGHUP:  # a hangup again is the same hangup
            return True
        return signum == self.signum and self._clock() - self._first_at < SAME_STOP_S

    @property
    def exit_status(self) -> int | None:
        """128 + the first signal, None when no signal stopped the command."""
        return None if self.signum is None else exit_status(self.signum)

    async def watch(
        self, work: anyio.CancelScope, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        """Cancel ``work`` on the first signal; on the second, kill the process tree and exit."""
        try:
            with anyio.open_signal_receiver(*heeded_signals()) as signals:
                task_status.started()
                async for signum in signals:
                    if self.work_done:
                        continue
                    if self.signum is None:
                        self.signum = signum
                        self._first_at = self._clock()
                        work.cancel()
                        if not self.quiet:
                            name = signal.Signals(signum).name
                            say_stopping(f"{name}: stopping gracefully ({_AT_ONCE[signum]} to stop at once)")
                        continue
                    if not self._echo(signum):
                        self.force()
                    elif signum == signal.SIGINT and not self.quiet:  # a person may have pressed twice
                        say_stopping(_SAME_CTRL_C)
        finally:
            # The work is over and the process winds down (threads, sockets): a signal now
            # ends it at once with the right status, not with a traceback or signal death;
            # where the work is done and said, it stops nothing and is ignored (``work_done``).
            for signum in heeded_signals():
                signal.signal(signum, signal.SIG_IGN if self.work_done else self._late)

    def _late(self, signum: int, _frame: object) -> None:
        if signum == signal.SIGHUP:
            return  # the terminal went as the command ends: it ends as it would have
        if self.signum is not None and self._echo(signum):
            return  # the first stop's echo: that stop ends as it would have
        if self.signum is None:
            self.signum = signum
        self.force()

    def exit(self) -> None:
        """The stop is done: exit with the signal's status now.

        Not through the interpreter's own wind-down: it resets the signal handlers first and
        then takes a while (modules, sockets), and a second Ctrl-C in that window would end
        the process as killed by the signal instead of with the status.
        """
        assert self.signum is not None
        logging.shutdown()
        _flush_output()
        os._exit(exit_status(self.signum))

    def force(self) -> None:
        """Stop now: SIGKILL every process this one started, then exit with the first signal's
        status; a run's last words (``runtime/last_words.py``: its log's end, the checkpoint a
        rerun resumes from) are recorded and said first."""
        assert self.signum is not None
        killed = kill_descendants()
        close_records()  # what its nodes recorded for a successor is dead: as a clean stop does
        words = said_at_once()
        with contextlib.suppress(OSError, SystemExit):  # a terminal gone, a closed pipe: no matter
            for console in (Console(), _err):  # a progress display hid it; os._exit skips rich's clean-up
                console.show_cursor(True)
            if _err.is_terminal:  # the cursor may be at the end of a progress bar's line
                _err.line()
        processes = f"{killed} process{'' if killed == 1 else 'es'} killed"
        if not words:
            say_stopping(f"stopped at once: {processes}")
        for line in words:  # a run on a cluster killed nothing here: "0 killed" read as left running
            say_stopping(f"stopped at once: {line}" + (f" ({processes} here)" if killed else ""))
        _flush_output()
        os._exit(exit_status(self.signum))


def _flush_output() -> None:
    """What the command printed, out before ``os._exit`` (which skips the interpreter's flush)."""
    for stream in (sys.stdout, sys.stderr):
        if stream is None:  # a program's process that set it so: nothing to flush
            continue
        try:
            stream.flush()
        except (OSError, ValueError):
            pass  # a closed pipe: nothing more to say
