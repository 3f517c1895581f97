"""A process's identity (``runtime/process_identity.py``): a rerun tells at once, on the same
host, that the run it found registered was killed."""

from __future__ import annotations

import subprocess
import sys

from troupe.runtime.process_identity import gone_here, process_identity


def test_a_reaped_process_is_gone_and_a_running_one_is_not() -> None:
    child = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    try:
        identity = process_identity(child.pid)
        assert identity.endswith(f":{child.pid}:{identity.rsplit(':', 1)[1]}")
        assert not gone_here(identity)
        assert not gone_here(process_identity())  # this very process
    finally:
        child.communicate(timeout=60)  # stdin closed: it exits, and is reaped
    assert gone_here(identity)


def test_a_pid_taken_by_another_process_is_gone() -> None:
    """The pid alone would be another process's, once reused: the start time tells them apart."""
    mine = process_identity()
    space, pid, started = mine.rsplit(":", 2)
    assert gone_here(f"{space}:{pid}:{int(started) + 1}")


def test_what_cannot_be_told_is_never_gone() -> None:
    """Another host's identity, an older troupe's (none), a peer's malformed text: the rerun
    asks the master, as before."""
    space, pid, started = process_identity().rsplit(":", 2)
    other_boot = "00000000-0000-0000-0000-000000000000:" + space.split(":")[1]
    another_host = f"{other_boot}:{pid}:{int(started) + 1}"
    for identity in (another_host, "", None, 7, "a:b:c", f"{space}:x:1", f"{space}:1"):
        assert not gone_here(identity), identity
