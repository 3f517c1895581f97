"""A drained node stays drained across a master restart, and the restarted master shows it
draining: it listed the node as healthy (alive, not draining) while the node ran no worker and
took nothing, until someone thought of ``ctl undrain``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import pytest

from support.chaos import TaskMaster, start_master
from support.tagged_nodes import tagged_nodes

pytestmark = pytest.mark.e2e

POLL_S = 60  # a bound on each poll, not on speed


async def node_row(master: TaskMaster, name: str, want: dict[str, Any]) -> dict[str, Any]:
    """The master's row of node ``name`` once it has the fields ``want`` (a bounded poll)."""
    with anyio.fail_after(POLL_S):
        while True:
            rows = [n for n in (await master.call("status"))["nodes"] if n["node"] == name]
            if rows and all(rows[0].get(k) == v for k, v in want.items()):
                return rows[0]
            await anyio.sleep(0.1)


async def took_the_drain(log: Path) -> None:
    """Until the node's log says it took the master's drain (a bounded poll)."""
    with anyio.fail_after(POLL_S):
        while not log.exists() or "node_drained_stopping_workers" not in log.read_text(encoding="utf-8"):
            await anyio.sleep(0.1)


def test_a_restarted_master_learns_a_drained_node_s_drain_from_its_beats(tmp_path: Path) -> None:
    master = start_master(tmp_path / "master")
    try:
        with tagged_nodes(master, tmp_path, {"n1": ("127.0.0.2", "plain")}):
            anyio.run(master.call, "drain", {"node": "n1"})
            # Until the node took the drain (one with no worker is drained at once), its beats
            # say nothing of it: the master restarts once it has.
            anyio.run(took_the_drain, tmp_path / "logs" / "n1.jsonl")
            assert not master.reap()
            master = start_master(tmp_path / "master", endpoint=master.endpoint)
            row = anyio.run(node_row, master, "n1", {"alive": True, "draining": True})
            anyio.run(master.call, "undrain", {"node": "n1"})
            undrained = anyio.run(node_row, master, "n1", {"draining": False})
    finally:
        assert not master.reap()
    assert row["draining"] is True and undrained["alive"] is True
