"""A node's uptime is measured on the monotonic clock: a step of the host's wall clock (NTP at
boot) makes it neither negative nor an hour too long, in ``ctl status`` and in the metrics."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from troupe.runtime.metrics.node_metrics import NodeCollector
from troupe.runtime.node.config import NodeConfig
from troupe.runtime.node.node import Node


def scraped_uptime(collector: NodeCollector) -> float:
    registry = CollectorRegistry()
    registry.register(collector)
    text = generate_latest(registry).decode()
    families = text_string_to_metric_families(text)
    return next(s.value for f in families for s in f.samples if s.name == "troupe_node_uptime_seconds")


@pytest.mark.parametrize("step_s", [-3600.0, 3600.0])
def test_uptime_stays_true_when_the_wall_clock_steps(tmp_path: Path, step_s: float) -> None:
    node = Node(NodeConfig(name="n1", log_dir=tmp_path), handle_signals=False)
    collector = NodeCollector(node)
    wall = time.time
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(time, "time", lambda: wall() + step_s)  # the host's clock steps now
        scraped = scraped_uptime(collector)
        status = node.uptime_s  # what ``ctl status`` shows
    assert 0 <= scraped < 600  # made a moment ago, not an hour ago nor in an hour
    assert 0 <= status < 600
