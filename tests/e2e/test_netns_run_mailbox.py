"""A ``troupe run --cluster`` on another host than its master's: the master reaches the run.

The master calls the run's mailbox (``cancel_lease``: a ``ctl cancel`` of its job, a lease that
expired). The run's mailbox listened on 127.0.0.1 whatever host it ran on, so a master on
another host dialled its own loopback, and a cancel stopped the run only at its next lease
renewal, tens of seconds later. Two network-namespace hosts (tests/support/netns.py): the
master's end on the first, the run (``run_keys.connect_run``, support/run_mailbox_peer.py) on
the second, both with the cluster's keys generated into tmp_path.

Skipped, saying why, only where namespaces cannot be made (not root, no ``ip``, a kernel that
refuses). Both processes are reaped by their pids, then the namespaces are deleted.
"""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from support.netns import Host, lan, netns_unavailable
from troupe.runtime.security.keys import generate_keys
from troupe.runtime.testing.plugin import reap

_WHY_NOT = netns_unavailable()
pytestmark = [
    pytest.mark.e2e,
    pytest.mark.timeout(300),
    pytest.mark.skipif(_WHY_NOT is not None, reason=_WHY_NOT or ""),
]

TESTS_DIR = Path(__file__).resolve().parents[1]
MASTER_PORT = 49010
WAIT_S = 90.0  # bound of every read; never a bound on how fast anything is


class Peers:
    """The processes started on the namespaces' hosts, reaped at the end."""

    def __init__(self) -> None:
        self.procs: list[subprocess.Popen[str]] = []

    def start(self, host: Host, *args: str) -> subprocess.Popen[str]:
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join(p for p in (str(TESTS_DIR), os.environ.get("PYTHONPATH")) if p),
        }
        env.pop("TROUPE_KEYS", None)
        proc = subprocess.Popen(
            host.command([sys.executable, "-m", "support.run_mailbox_peer", *args]),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            env=env,
        )
        self.procs.append(proc)
        return proc

    def stop(self) -> list[int]:
        survivors: list[int] = []
        for proc in reversed(self.procs):
            for pipe in (proc.stdin, proc.stdout):
                if pipe is not None:
                    pipe.close()
            survivors += reap(proc, [])  # type: ignore[arg-type]
        return survivors


def _read(proc: subprocess.Popen[str]) -> dict[str, Any]:
    assert proc.stdout is not None
    ready, _, _ = select.select([proc.stdout], [], [], WAIT_S)
    assert ready, f"{proc.args} said nothing within {WAIT_S}s"
    line = proc.stdout.readline()
    assert line, f"{proc.args} exited ({proc.wait(timeout=WAIT_S)}) without a word"
    said: dict[str, Any] = json.loads(line)
    return said


@pytest.fixture
def peers() -> Iterator[Peers]:
    started = Peers()
    try:
        yield started
    finally:
        assert not started.stop(), "processes survived the test"


def test_a_master_on_another_host_reaches_a_cluster_run(tmp_path: Path, peers: Peers) -> None:
    keys = tmp_path / "keys"
    generate_keys(keys)
    with lan(2, tag="rm") as net:
        master_host, run_host = net.hosts
        master = peers.start(master_host, "master", str(keys), f"tcp://{master_host.address}:{MASTER_PORT}")
        endpoint = _read(master)["ready"]
        run = peers.start(run_host, "run", str(keys), endpoint)
        said = _read(run)
        # Registered with the master by the address it is reached at, not its own loopback.
        assert said["address"].startswith(f"tcp://{run_host.address}:"), said
        assert said["warnings"] == []
        assert master.stdin is not None
        master.stdin.write(said["address"] + "\n")
        master.stdin.flush()
        assert _read(master) == {"answer": "cancelled"}
        assert _read(run) == {"cancelled": True}
        assert run.wait(timeout=WAIT_S) == 0
        assert not peers.stop(), "processes survived the test"
