"""What ps and top show for a node's children: each names itself, forked or spawned.

Real nodes in this process, with their templates, supervisors and workers. What an operator
relies on: ``ps`` tells a worker from its siblings by name (a forked one would otherwise show
the template's command line, and every child the same interpreter), and ``top`` shows the
worker's own name.
"""

from __future__ import annotations

from pathlib import Path

import anyio
import psutil
import pytest

from support.local_node import echo_node_config, running_node
from troupe.runtime.node.node import Node

WITHIN_S = 60.0  # a bound on a start on a loaded machine, not on speed


def _shown(pid: int) -> tuple[str, str]:
    process = psutil.Process(pid)
    return " ".join(process.cmdline()).strip(), process.name()  # the title is padded to its area


async def _supervisor_pid(node: Node) -> int:
    with anyio.fail_after(WITHIN_S):
        while True:
            info = await node.supervision.describe()
            if info.get("supervisor"):  # it registered: past its start, named
                return int(info["supervisor_pid"])
            await anyio.sleep(0.02)  # a bounded poll of the node's own status


@pytest.mark.parametrize("fast_start", [True, False], ids=["forked", "spawned"])
async def test_workers_and_the_supervisor_show_what_they_are(tmp_path: Path, fast_start: bool) -> None:
    cfg = echo_node_config(tmp_path, "titles", fast_start=fast_start)
    async with running_node(cfg) as node:
        worker = node.workers["w1"]
        assert worker.pid is not None
        assert _shown(worker.pid) == ("troupe worker w1 (node titles)", "w1")
        assert _shown(await _supervisor_pid(node)) == ("troupe supervisor (node titles)", "troupe-sup")
        if fast_start:
            assert node.template is not None and node.template.pid is not None
            assert _shown(node.template.pid) == ("troupe template (node titles)", "troupe-template")
