"""A second node started under the name of a live node of the same master is refused in one
line, exit 2, before it starts anything: it had joined, taken the first node's workers at the
master (``worker_left reason=rejoined``) and written into the same log file."""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest

from support.chaos import TaskMaster
from support.cli_session import troupe_in_session
from support.tagged_nodes import tagged_nodes
from troupe.runtime.errors import NameTaken
from troupe.runtime.node.config import load_node_config
from troupe.runtime.node.node import Node
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


def test_a_second_node_past_the_command_s_look_is_refused_by_the_master(
    tmp_path: Path, master: TaskMaster
) -> None:
    """Two nodes of one name started at the same moment both passed the command's look (neither
    saw the other at the master), joined, and the master's record of the name flipped between
    them with every beat. The master itself now refuses a second process under a live node's
    name: that node stops (``NameTaken``, exit 2 from ``troupe node start``), and the name stays
    the first node's."""

    async def second_node() -> None:
        with anyio.fail_after(REFUSAL_S):
            await Node(second, handle_signals=False).run()  # as the command runs it, past its look

    async def n1_endpoints() -> list[str]:
        seen = []
        for _ in range(3):  # beats of the first after the refusal: the name stays its own
            status = await master.call("status")
            seen += [n["endpoint"] for n in status["nodes"] if n["node"] == "n1"]
            await anyio.sleep(0.5)
        return seen

    with tagged_nodes(master, tmp_path, {"n1": ("127.0.0.2", "plain")}) as nodes:
        first = nodes["n1"].endpoint
        (tmp_path / "second.toml").write_text(f'[node]\nmaster = "{master.endpoint}"\n', encoding="utf-8")
        second = load_node_config(
            tmp_path / "second.toml", name="n1", endpoint=free_endpoint(), log_dir=tmp_path / "second"
        )
        with pytest.raises(NameTaken) as refused:
            anyio.run(second_node)
        assert str(refused.value).startswith(f"node name 'n1' is taken: the node at {first} runs under it")
        assert anyio.run(n1_endpoints) == [first] * 3


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
