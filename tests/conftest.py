"""Suite-wide guards: no test may leave a child process behind; no logger of the test process
is cached, so that a test's capture of log events sees them whatever ran before it; the commands
the tests start get SIGINT and SIGHUP at their defaults, whatever the harness ignores, and
whatever a command run in the test process left."""

from __future__ import annotations

import logging
import signal
from collections.abc import Callable, Iterator
from typing import Any

import psutil
import pytest
import structlog

from troupe.runtime.library_logging import own_this_process


def _never_cached(configure: Callable[..., None]) -> Callable[..., None]:
    """``structlog.configure`` without ``cache_logger_on_first_use`` in this process.

    A run, a node or a bench started in the test process configures logging as a program does,
    each module's logger cached on its first use with the processors of that configuration; a
    run configures twice (its held lines, then its log file), and ``capture_logs``, which swaps
    the processors of the configuration of the moment, no longer reaches a logger cached under
    the first. A test that captured a module's events passed alone and failed after a pipeline
    had run in the same worker (CI: the journal's replay notes, the master's held-loop
    warnings). The processes the tests start are untouched.
    """

    def configure_uncached(*args: Any, **kwargs: Any) -> None:
        kwargs["cache_logger_on_first_use"] = False
        configure(*args, **kwargs)

    return configure_uncached


structlog.configure = _never_cached(structlog.configure)


def _children_get_default_stop_signals() -> None:
    """A harness that starts the suite with SIGINT or SIGHUP ignored (a script's background
    job, nohup) would hand that on to every command a test starts, and a troupe command keeps a
    stop signal it was started with ignored: its Ctrl-C tests would hang. Handled here, by a
    handler that does nothing (this process stays as deaf as the harness wanted), the signal is
    back at its default in what the tests exec."""
    for signum in (signal.SIGINT, signal.SIGHUP):
        if signal.getsignal(signum) == signal.SIG_IGN:
            signal.signal(signum, lambda _signum, _frame: None)


_children_get_default_stop_signals()

# multiprocessing keeps these helpers alive on purpose for the rest of the session.
_SESSION_HELPERS = ("multiprocessing.resource_tracker", "multiprocessing.forkserver")


def _children() -> list[psutil.Process]:
    out = []
    for p in psutil.Process().children(recursive=True):
        try:
            cmd = " ".join(p.cmdline())
        except psutil.Error:
            continue
        if not any(h in cmd for h in _SESSION_HELPERS):
            out.append(p)
    return out


@pytest.fixture(autouse=True)
def no_leaked_children() -> Iterator[None]:
    """Every process a test starts is reaped by the end of the test; a leak fails it (and is killed)."""
    before = {p.pid for p in _children()}
    yield
    leaked = [p for p in _children() if p.pid not in before]
    if not leaked:
        return
    _, alive = psutil.wait_procs(leaked, timeout=10)  # a process may still be exiting on its own
    names = []
    for p in alive:
        try:
            names.append((p.pid, " ".join(p.cmdline())[:120]))
            p.kill()
        except psutil.Error:
            pass
    psutil.wait_procs(alive, timeout=5)
    if names:
        pytest.fail(f"test left child processes running: {names}")


_STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


@pytest.fixture(autouse=True)
def stop_signals_as_they_were() -> Iterator[None]:
    """A command run in the test process (``troupe run``'s report, a training's end) installs
    its stop handlers, and ignores a signal that comes as it ends: left so, every command a
    later test of the same worker started inherited SIGINT ignored, and its Ctrl-C test ran to
    the end (CI, twice). Each test ends with them as it found them."""
    before = {signum: signal.getsignal(signum) for signum in _STOP_SIGNALS}
    yield
    for signum, handler in before.items():
        if handler is not None and signal.getsignal(signum) is not handler:
            signal.signal(signum, handler)


@pytest.fixture(autouse=True)
def logging_as_a_fresh_command_has_it() -> Iterator[None]:
    """Each test starts as a troupe command's process does: its logging troupe's own, structlog
    not yet configured. A run in the test process then holds its lines and writes them to its
    own file, as ``troupe run``'s does, and structlog's ``capture_logs`` sees troupe's lines (in a
    program's process they go to the standard library's loggers instead; the tests of that say
    so: ``own_this_process(False)``). ``capture_logs``, which restores the processors by
    configuring them, left structlog "configured" with its defaults (lines printed to stdout),
    and a later test's run took that for a configuration of its own and printed its lines into
    the test's --json output.

    The root logger is a fresh process's too: at warning, with no handler but pytest's. A bench
    measured in the test process configures logging at error (its stdout stays JSON), and a later
    test of the same worker that counted on Python's last resort for a warning saw nothing (CI:
    tests/runtime/test_run_log.py after tests/cli/test_bench_messaging_json_types.py)."""
    own_this_process()
    structlog.reset_defaults()
    root = logging.getLogger()
    root.setLevel(logging.WARNING)
    for handler in list(root.handlers):
        if type(handler).__module__ != "_pytest.logging":  # a run's file or console, left behind
            root.removeHandler(handler)
            handler.close()
    yield


@pytest.fixture(scope="session")
def anyio_backend() -> str:
    """asyncio only: troupe runs on asyncio (uvloop), and pytest-asyncio runs the async tests.
    anyio's own fixture takes every backend installed, so where trio happened to be installed a
    hundred and forty tests ran twice, under names that claimed trio, on the same asyncio loop."""
    return "asyncio"
