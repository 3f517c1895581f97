"""Suite-wide guards: no test may leave a child process behind."""

from __future__ import annotations

from collections.abc import Iterator

import psutil
import pytest

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
