"""Flow control across processes: a sender parked at the high-water mark always resumes."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest

from support.cluster import NodeProc, running_node
from troupe.runtime.core.client import connect

pytestmark = pytest.mark.e2e

CONFIG = """
[node]
hwm = 64

[[workers]]
name = "src"
actors = [{ name = "source", class = "troupe.cli.bench.actors:Source" }]

[[workers]]
name = "dst"
actors = [{ name = "sink", class = "troupe.cli.bench.actors:Sink" }]
"""


@pytest.fixture
def pair_node(tmp_path: Path) -> Iterator[NodeProc]:
    """A node with a load source and a sink in two worker processes."""
    with running_node(tmp_path, CONFIG) as node:
        yield node


async def test_a_sender_blocked_at_the_high_water_mark_always_resumes(pair_node: NodeProc) -> None:
    """Floods of tells that keep parking the sender at the high-water mark all arrive, round after round.

    Before the fix, the sender's reader could consume the socket's "writable again" signal while the
    sender was parked, and the sender slept forever (about one run in three stalled).
    """
    async with connect(pair_node.endpoint, pair_node.name) as rt:
        source = rt.ref("src/source")
        for _ in range(4):
            with anyio.fail_after(60):
                rate = await source.ask(
                    "tells", {"target": "dst/sink", "n": 100_000, "kind": "small"}, timeout=60
                )
            assert rate > 0
            assert await rt.ref("dst/sink").ask("count") == 100_000
