"""Another process beating under the name of a live node: refused while that node answers
under the name, taken as the node started again elsewhere once it does not."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import structlog.testing

from support.memory_master import master_in_memory
from troupe.runtime.core.runtime import Runtime
from troupe.runtime.errors import NameTaken

pytestmark = pytest.mark.anyio


def beat(endpoint: str, process: str) -> dict[str, Any]:
    return {"node": "n1", "endpoint": endpoint, "resources": {}, "process": process}


async def test_a_second_process_under_a_live_node_s_name_is_refused_until_that_node_is_gone(
    tmp_path: Path,
) -> None:
    async with master_in_memory(tmp_path) as m:
        async with Runtime("n1", "node", m.hub.transport()) as holder:
            holder.register_control("ping", lambda _: {"node": "n1", "pid": 1, "process": "p1"})
            assert (await m.call("node_beat", beat(holder.address, "p1")))["ok"]
            assert (await m.call("node_beat", beat(holder.address, "p1")))["ok"]  # its own beats
            with pytest.raises(NameTaken, match=f"node name 'n1' is taken: the node at {holder.address}"):
                await m.call("node_beat", beat("mem://second", "p2"))
            holding = [n["endpoint"] for n in (await m.call("status"))["nodes"]]
        # The holder answers no more (stopped, its last beats still recent): the name passes.
        with structlog.testing.capture_logs() as logs:
            assert (await m.call("node_beat", beat("mem://second", "p2")))["ok"]
        passed = [n["endpoint"] for n in (await m.call("status"))["nodes"]]
    assert holding == [holder.address] and passed == ["mem://second"]
    assert [e["event"] for e in logs if e["event"].startswith("node_")] == ["node_replaced"]


async def test_an_older_node_that_says_no_process_is_taken_as_before(tmp_path: Path) -> None:
    """No process in the beat (an older node): nothing to tell two nodes apart by, no ping."""
    async with master_in_memory(tmp_path) as m:
        assert (await m.call("node_beat", beat("mem://a", "p1")))["ok"]
        older = {"node": "n1", "endpoint": "mem://b", "resources": {}}
        assert (await m.call("node_beat", older))["ok"]
        assert [n["endpoint"] for n in (await m.call("status"))["nodes"]] == ["mem://b"]
