"""The multi-host tests' namespaces outlive a test process killed outright: the next run deletes them."""

from __future__ import annotations

import os
import subprocess
import sys

import psutil
import pytest

from tests.support.netns import _ip, netns_unavailable, sweep_orphans

_WHY_NOT = netns_unavailable()
pytestmark = pytest.mark.skipif(_WHY_NOT is not None, reason=_WHY_NOT or "")


def _dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait(timeout=30)
    assert not psutil.pid_exists(child.pid)
    return child.pid


def _names() -> set[str]:
    return {line.split()[0] for line in _ip("netns", "list").stdout.splitlines() if line.strip()}


def test_a_dead_runs_namespaces_are_deleted_and_a_live_ones_kept() -> None:
    dead, live, foreign = f"trp{_dead_pid()}-h1", f"trp{os.getpid()}sweep-h1", f"keep{os.getpid()}-trp1"
    try:
        for name in (dead, live, foreign):
            assert _ip("netns", "add", name).returncode == 0
        deleted = sweep_orphans()
        assert dead in deleted
        names = _names()
        assert dead not in names
        assert {live, foreign} <= names
    finally:
        for name in (dead, live, foreign):
            _ip("netns", "del", name)
