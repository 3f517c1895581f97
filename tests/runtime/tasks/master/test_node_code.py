"""The code each part of a cluster runs: a node's beat says its own (``code``), the master
keeps it per node and says it, with its own, in ``status``; a node of before the field is
``None`` there, as ``ctl status`` shows it unknown."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from support.memory_master import master_in_memory, until
from troupe.runtime.code_identity import code_identity
from troupe.runtime.errors import BadRequest

BEAT: dict[str, Any] = {"node": "n1", "endpoint": "tcp://10.0.0.1:7470", "resources": {}}


def _codes(status: dict[str, Any]) -> dict[str, Any]:
    return {n["node"]: n["code"] for n in status["nodes"]}


async def test_the_master_keeps_each_node_s_code_and_says_its_own(tmp_path: Path) -> None:
    async with master_in_memory(tmp_path) as m:
        await m.call("node_beat", {**BEAT, "code": "0.1.0+3f9a1c2e"})
        await m.call("node_beat", {**BEAT, "node": "old"})  # a node of before the field
        assert _codes(await m.call("status")) == {"n1": "0.1.0+3f9a1c2e", "old": None}
        await m.call("node_beat", {**BEAT, "code": "0.1.0+77aa0b1c"})  # upgraded, restarted
        assert _codes(await m.call("status"))["n1"] == "0.1.0+77aa0b1c"
        # The master reads its own in a thread as it starts: said once read.
        await until(lambda: m.master.code)
        assert (await m.call("status"))["code"] == code_identity()


@pytest.mark.parametrize("code", ["x" * 81, "0.1.0\n[red]", 7])
async def test_a_beat_with_a_code_no_table_can_show_is_a_bad_request(tmp_path: Path, code: Any) -> None:
    async with master_in_memory(tmp_path) as m:
        with pytest.raises(BadRequest, match=r"control 'node_beat'.*'code'"):
            await m.call("node_beat", {**BEAT, "code": code})
