"""The line a run prints when the default endpoints were taken names the ones that were: it
said both were when only the master's had moved."""

from __future__ import annotations

from troupe.cli.commands.moved_endpoint import moved_note

NODE, MASTER = "tcp://127.0.0.1:7479", "tcp://127.0.0.1:7478"


def test_the_line_names_only_the_endpoints_that_moved() -> None:
    assert moved_note(NODE, False, MASTER, False) is None
    only_master = moved_note(NODE, False, "tcp://127.0.0.1:40001", True)
    assert only_master is not None
    assert only_master.startswith("the default master's endpoint is taken (another troupe run?): ")
    assert f"this run's node listens on {NODE}, its master on tcp://127.0.0.1:40001" in only_master
    only_node = moved_note("tcp://127.0.0.1:40002", True, MASTER, False)
    assert only_node is not None and only_node.startswith("the default node's endpoint is taken")
    both = moved_note("tcp://127.0.0.1:40002", True, "tcp://127.0.0.1:40001", True)
    assert both is not None and both.startswith("the default node's and master's endpoints are taken")
