"""A node's template started ahead, at a command's entry, while the command imports itself.

``troupe run`` spends a second or more importing its own modules before its run starts the
node's template, which then spends seconds importing what the workers need (torch). Started
at the command's entry instead, the template imports on the core the command leaves idle. Its
node's name, the stage classes to check and any modules the command's guess missed come later,
as the first message on its socket (``LATER_ENV``): the run sends them once it has its parsed
config (``TemplateLink(ahead=)``). Nothing depends on the guess: a wrong one costs imports only.

It dies with the command: the command kills and reaps a template it did not hand to a run as
it exits, the template's parent-death signal covers a command that is killed, and a template
whose socket ends before the message exits by itself.

Light on purpose (the standard library only): ``troupe.runtime``'s own imports take most of a
second, and this runs before them.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import signal
import socket
import time
from collections.abc import Sequence
from dataclasses import dataclass

from troupe.lean_start import argv as lean_argv

__all__ = [
    "CHECKS_ENV",
    "CHECK_ONLY_ENV",
    "FD_ENV",
    "LATER_ENV",
    "MODULES_ENV",
    "NODE_ENV",
    "Prestarted",
    "prestart",
    "take",
    "template_argv",
]

FD_ENV = "TROUPE_TEMPLATE_FD"
MODULES_ENV = "TROUPE_TEMPLATE_MODULES"  # JSON list of modules or classes to import at start
NODE_ENV = "TROUPE_TEMPLATE_NODE"  # the node's name, for the process title
CHECKS_ENV = "TROUPE_TEMPLATE_CHECKS"  # JSON list of [field, class, kind, kwarg names]: loading.first_failure
# "1": the node's name, the checks and more modules come as the socket's first message.
LATER_ENV = "TROUPE_TEMPLATE_LATER"
# "1": a template for the class check alone (a run on a cluster's nodes forks nothing here): the
# classes' modules, without what they name in ``preload_modules`` (torch, say).
CHECK_ONLY_ENV = "TROUPE_TEMPLATE_CHECK_ONLY"


def template_argv() -> list[str]:
    """How a template is started, by a node or ahead of it: without rich, with the current
    folder after the installed packages (``lean_start``)."""
    return lean_argv("troupe.runtime.node.template")


@dataclass
class Prestarted:
    """A template this process started ahead: its pid (our child), our end of its socket
    (blocking), and when it started (``time.monotonic()``)."""

    pid: int
    sock: socket.socket
    started: float

    def discard(self) -> None:
        """Kill and reap it, and close our end (for a command that did not run a node)."""
        with contextlib.suppress(OSError):
            os.kill(self.pid, signal.SIGKILL)
        with contextlib.suppress(ChildProcessError):
            os.waitpid(self.pid, 0)
        self.sock.close()


_ahead: Prestarted | None = None


def prestart(modules: Sequence[str], check_only: bool = False) -> Prestarted | None:
    """Start a template that imports what every worker imports and ``modules`` (modules or
    ``pkg.mod:Class``), then waits for its node (:func:`take` hands it over). None where it
    could not be started: the run starts its own, as without this. ``check_only``: for the
    class check of a run on a cluster's nodes (``CHECK_ONLY_ENV``)."""
    global _ahead
    if _ahead is not None:
        return _ahead
    import json

    try:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    except (OSError, AttributeError):  # no SEQPACKET pairs here: the node spawns its workers
        return None
    try:
        os.set_inheritable(theirs.fileno(), True)
        extra = {FD_ENV: str(theirs.fileno()), MODULES_ENV: json.dumps(list(modules)), LATER_ENV: "1"}
        if check_only:
            extra[CHECK_ONLY_ENV] = "1"
        env = {**os.environ, **extra}
        argv = template_argv()
        pid = os.posix_spawn(
            argv[0],
            argv,
            env,
            # stdout is the command's own (``troupe run --json``): what imports print goes to stderr
            file_actions=[(os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0), (os.POSIX_SPAWN_DUP2, 2, 1)],
            setsid=True,  # out of the terminal's Ctrl-C: the node stops it (child.py)
        )
    except (OSError, NotImplementedError, AttributeError):  # no posix_spawn, or no setsid in it
        ours.close()
        return None
    finally:
        theirs.close()
    _ahead = Prestarted(pid, ours, time.monotonic())
    atexit.register(_discard_unused)
    return _ahead


def take() -> Prestarted | None:
    """The template started ahead, once (None if there is none, or it was taken)."""
    global _ahead
    ahead, _ahead = _ahead, None
    return ahead


def _discard_unused() -> None:
    ahead = take()
    if ahead is not None:
        ahead.discard()
