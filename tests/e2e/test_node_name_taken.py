"""A second node started under the name of a live node of the same master is refused in one
line, exit 2, before it starts anything: it had joined, taken the first node's workers at the
master (``worker_left reason=rejoined``) and written into the same log file."""

from __future__ import annotations

from pathlib import Path

import pytest

from support.chaos import TaskMaster
from support.cli_session import troupe_in_session
from support.tagged_nodes import tagged_nodes
from troupe.runtime.transports.loopback import free_endpoint

pytestmark = pytest.mark.e2e

REFUSAL_S = 60  # a bound only: the refusal comes before the node starts anything


def test_a_second_node_of_a_live_node_s_name_is_refused(tmp_path: Path, master: TaskMaster) -> None:
    with tagged_nodes(master, tmp_path, {"n1": ("127.0.0.2", "plain")}):
        done = troupe_in_session(
            "node",
            "start",
            "--name",
            "n1",
            "--master",
            master.endpoint,
            "--endpoint",
            free_endpoint(),
            "--logs",
            str(tmp_path / "second"),
            timeout=REFUSAL_S,
        )
        err = done.stderr
        assert done.returncode == 2, err
        assert err.startswith("error: node name 'n1' is taken: the node at tcp://127.0.0.2:"), err
        assert len(err.strip().splitlines()) == 1, err
        assert not (tmp_path / "second").exists()


def test_a_node_named_like_its_master_is_refused(tmp_path: Path, master: TaskMaster) -> None:
    """A node under the master's own name (``master`` by default, as a host may be called) is
    refused in one line, exit 2: both wrote one ``master.jsonl`` when their logs shared a folder."""
    done = troupe_in_session(
        "node",
        "start",
        "--name",
        "master",
        "--master",
        master.endpoint,
        "--endpoint",
        free_endpoint(),
        "--logs",
        str(tmp_path / "named-master"),
        timeout=REFUSAL_S,
    )
    err = done.stderr
    assert done.returncode == 2, err
    assert err.startswith(f"error: node name 'master' is the name of the master at {master.endpoint}:"), err
    assert len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "named-master").exists()
