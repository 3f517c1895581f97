"""End-to-end fixtures: real node processes on loopback, always reaped."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from support.chaos import TaskMaster, start_master
from support.cluster import DEMO_CONFIG, NodeProc, running_node


@pytest.fixture
def demo_node(tmp_path: Path) -> Iterator[NodeProc]:
    """A node with an echo, a gate with its opener, and a relay, each in its own process."""
    with running_node(tmp_path, DEMO_CONFIG) as node:
        yield node


@pytest.fixture
def master(tmp_path: Path) -> Iterator[TaskMaster]:
    """A master process on a new journal, reaped after the test (after the nodes)."""
    m = start_master(tmp_path / "master")
    try:
        yield m
    finally:
        assert not m.reap()
