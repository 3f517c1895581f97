"""A node stopped on purpose (SIGTERM) tells its master, which lists it as left at once: it
stayed alive for its node timeout, then was logged ``node_dead`` as if it had crashed."""

from __future__ import annotations

import signal
from pathlib import Path

import anyio
import pytest

from support.chaos import start_master
from support.tagged_nodes import tagged_nodes

pytestmark = pytest.mark.e2e

STOP_S = 60  # a bound only: the node stops in a few seconds


def test_a_node_stopped_with_sigterm_is_left_at_the_master_not_dead(tmp_path: Path) -> None:
    # Silence makes a node dead only after an hour here: only the node's word can stop it.
    master = start_master(tmp_path / "master", extra=("--node-timeout", "3600"))
    try:
        with tagged_nodes(master, tmp_path, {"n1": ("127.0.0.2", "plain")}) as nodes:
            proc = nodes["n1"].proc
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(timeout=STOP_S) == 128 + signal.SIGTERM
            status = anyio.run(master.call, "status")
    finally:
        assert not master.reap()
    (n1,) = status["nodes"]
    assert (n1["alive"], n1["left"]) == (False, True), n1
