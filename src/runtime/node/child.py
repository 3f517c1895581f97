"""What every child process of a node does first: tie its life to the node, read its spec,
name itself.

A child of a node must die with the node, whatever state it is in (DESIGN.md invariant 6). Two
independent guards, set up before anything else runs:

- the parent-death signal (Linux ``PR_SET_PDEATHSIG``) is SIGKILL, not SIGTERM: a worker that
  is stalled, hung in a C call, or already past its first SIGTERM would never act on a
  catchable signal, and with the node gone there is nobody left to stop gracefully for;
- a watchdog thread compares ``os.getppid()`` with the pid of the node that started it (passed
  in ``$TROUPE_PARENT_PID``) and SIGKILLs this process when they differ. It covers what the
  parent-death signal does not: the node died before ``prctl`` ran, or the node *thread* that
  forked is not the one whose exit ends the node.

A node that dies anyway leaves a record for its successor to reap (``leftovers.py``).

Every child starts in a session of its own (``start_new_session``): a Ctrl-C at the terminal
goes to the foreground process group, and a child in it would die of a KeyboardInterrupt (a
traceback on the terminal) if it came while it still imported, before it could ignore SIGINT.
The command that started it stops it, in order (SIGTERM, then SIGKILL), as it does on SIGTERM.

Every child names itself for ``ps`` and ``top`` (``name_process``): a worker forked from the
template would otherwise show the template's command line, and every child the same
interpreter running a troupe module.
"""

from __future__ import annotations

import atexit
import json
import os
import signal
import sys
import threading
import time
import traceback
import weakref
from collections.abc import Callable, Mapping
from typing import NoReturn, TypeVar

import setproctitle
from pydantic import BaseModel, ValidationError

from troupe.runtime.security.process import KEYS_ENV, SNAPSHOT_ENV, child_env_entry
from troupe.runtime.start_limits import limit_line

from .config import validation_message

__all__ = [
    "PARENT_PID_ENV",
    "child_env",
    "die_with_parent",
    "load_launch_spec",
    "name_process",
    "run_and_exit",
]

M = TypeVar("M", bound=BaseModel)

PARENT_PID_ENV = "TROUPE_PARENT_PID"
_WATCH_INTERVAL_S = 0.5


def child_env(extra: Mapping[str, str]) -> dict[str, str]:
    """The environment for a child that the calling process (the node) starts: ours, plus
    ``extra``, plus this process's pid for the child's parent watchdog, plus this process's keys
    (``TROUPE_KEYS``, ``TROUPE_KEYS_SNAPSHOT``; removed when this process has no keys)."""
    env = {**os.environ, **extra, PARENT_PID_ENV: str(os.getpid())}
    env.pop(KEYS_ENV, None)
    env.pop(SNAPSHOT_ENV, None)
    return {**env, **child_env_entry()}


def name_process(title: str, short: str) -> None:
    """Show this process as ``title`` where its command line shows (``ps``, ``top -c``, psutil's
    ``cmdline``) and as ``short`` where its name does (``top``; the kernel keeps 15 characters)."""
    setproctitle.setproctitle(title)
    setproctitle.setthreadtitle(short)  # the main thread's name is the process's name


def die_with_parent() -> None:
    """Make sure this process dies with the node (or program) that started it, whatever it is
    doing then.

    Exits at once, quietly, with status 1 if that process is already gone: its stderr is the
    one it inherited, often a terminal that has moved on (a refused ``troupe run`` printed
    "supervisor: the node that started it (pid N) is gone" after its own error), and nobody
    is left to read it otherwise; the node's successor reaps what it left (``leftovers.py``).
    """
    raw = os.environ.pop(PARENT_PID_ENV, "")  # popped: a grandchild has a parent of its own
    parent = int(raw) if raw.isdigit() else os.getppid()
    if sys.platform.startswith("linux"):
        import ctypes

        pr_set_pdeathsig = 1
        ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGKILL)
    if os.getppid() != parent:  # the node died before the guard was in place
        sys.exit(1)
    threading.Thread(target=_watch_parent, args=(parent,), name="troupe-parent-watch", daemon=True).start()


def _watch_parent(parent: int) -> None:
    while True:
        time.sleep(_WATCH_INTERVAL_S)
        if os.getppid() != parent:
            os.kill(os.getpid(), signal.SIGKILL)


def load_launch_spec(model: type[M], env: str, who: str, hint: str) -> M:
    """Read and validate the JSON launch spec in ``$env``; exit with a clear message if bad."""
    raw = os.environ.get(env)
    if not raw:
        sys.exit(f"{env} is not set: {hint}")
    try:
        return model.model_validate(json.loads(raw))
    except (ValueError, ValidationError) as exc:
        msg = validation_message(env, exc) if isinstance(exc, ValidationError) else str(exc)
        sys.exit(f"bad {who} spec: {msg}")


def run_and_exit(main: Callable[[], None]) -> NoReturn:
    """Run a child's ``main``, then exit as a forked child of multiprocessing does: non-daemon
    threads joined and atexit hooks run as at any exit, but no teardown of the modules.

    The teardown frees every module's objects one by one: tens of milliseconds in a plain
    child, seconds with torch imported, all of it spent after the child's work is done and
    while its node, stopping, waits for it. Exit statuses are the interpreter's: a
    ``sys.exit`` message goes to stderr with status 1, an uncaught exception's traceback too
    (a start a process or memory limit refused: one line, ``start_limits.limit_line``), and
    Ctrl-C ends the process by SIGINT.
    """
    code = 0
    try:
        main()
    except SystemExit as exc:
        if exc.code is None or isinstance(exc.code, int):
            code = exc.code or 0
        else:
            print(exc.code, file=sys.stderr)  # as the interpreter says a sys.exit message
            code = 1
    except KeyboardInterrupt:
        code = -1
    except BaseException as exc:
        # A process or thread limit refused a start (the parent watch's thread, a heartbeat's):
        # one line, the limit named, not a traceback on the terminal of the run above.
        limited = limit_line(exc)
        if limited is not None:
            print(limited, file=sys.stderr)
        else:
            traceback.print_exc()
        code = 1
    try:
        threading._shutdown()  # type: ignore[attr-defined]  # what the interpreter's exit runs
        _skip_torch_library_release()
        atexit._run_exitfuncs()
        sys.stdout.flush()
        sys.stderr.flush()
    finally:
        if code == -1:  # killed by Ctrl-C, as an interpreter reports an unhandled one
            signal.signal(signal.SIGINT, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGINT)
        os._exit(code & 0xFF)


def _skip_torch_library_release() -> None:
    """torch keeps a finalizer per operator library it registered (over a hundred) that takes
    the library out of its dispatcher at exit: work for a process about to end, 25 ms in a
    worker forked from a template that imported torch. Those finalizers no longer run at exit;
    every other one does."""
    release = getattr(sys.modules.get("torch.library"), "_del_library", None)
    registry = getattr(weakref.finalize, "_registry", None)
    if release is None or not isinstance(registry, dict):
        return
    for finalizer, info in list(registry.items()):
        if getattr(info, "func", None) is release:
            finalizer.atexit = False
