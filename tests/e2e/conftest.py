"""End-to-end fixtures: real node processes on loopback, always reaped."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from support.cluster import DEMO_CONFIG, NodeProc, running_node


@pytest.fixture
def demo_node(tmp_path: Path) -> Iterator[NodeProc]:
    """A node with an echo, a gate with its opener, and a relay, each in its own process."""
    with running_node(tmp_path, DEMO_CONFIG) as node:
        yield node
