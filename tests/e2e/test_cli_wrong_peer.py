"""A master's endpoint given as --node, or a node's as --master, is named in one line: `ctl ping`
and `ctl status` had crashed with a KeyError, `ctl top` printed rows of None, and `ctl jobs`
listed the node's control messages, `logs tail` followed nothing and exited 0."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest

from support.chaos import TaskMaster
from support.tagged_nodes import tagged_nodes
from troupe.runtime.core.client import connect
from troupe.runtime.pipeline.hosts import wait_for_nodes
from troupe.runtime.transports.loopback import free_endpoint

JOB = Path(__file__).resolve().parents[2] / "configs" / "job-example.toml"

pytestmark = pytest.mark.e2e


@pytest.fixture
def node_and_master(tmp_path: Path, master: TaskMaster) -> Iterator[tuple[str, str]]:
    with tagged_nodes(master, tmp_path, {"n1": ("127.0.0.2", "plain")}):

        async def node_endpoint() -> str:
            async with connect(master.endpoint) as rt:
                (host,) = await wait_for_nodes(rt, master.endpoint, 1, timeout_s=30)
                return host.endpoint

        yield anyio.run(node_endpoint), master.endpoint


def troupe(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "troupe.cli.main", *args], capture_output=True, text=True, timeout=120
    )


def test_each_endpoint_given_as_the_other_kind_is_named(node_and_master: tuple[str, str]) -> None:
    node, master = node_and_master
    refused = {
        "ping": troupe("ctl", "ping", "--node", master),
        "top": troupe("ctl", "top", "--once", "--node", master, "--master", node),
        "jobs": troupe("ctl", "jobs", "--master", node),
        "submit": troupe("ctl", "submit", str(JOB), "--master", node),
        "logs": troupe("logs", "tail", "--master", node),
    }
    for command, done in refused.items():
        assert done.returncode == 1, (command, done.stdout, done.stderr)
        assert len(done.stderr.strip().splitlines()) == 1, (command, done.stderr)
        assert "Traceback" not in done.stderr and "KeyError" not in done.stderr
    assert "but not as a node" in refused["ping"].stderr
    assert "it is a master (give it as --master" in refused["top"].stderr
    # With one right, top shows it and says what is wrong with the other.
    top = troupe("ctl", "top", "--once", "--node", master, "--master", master)
    assert top.returncode == 0, top.stderr
    assert "it is a master" in " ".join(top.stdout.split()), top.stdout
    assert f"{node} is not a master" in refused["jobs"].stderr
    assert f"{node} is not a master" in refused["submit"].stderr  # it listed the node's controls
    assert f"{node} answered, but not as a master" in refused["logs"].stderr  # it exited 0, silent

    # status shows what did answer as asked, and notes the other.
    status = troupe("ctl", "status", "--node", node, "--master", node)
    assert status.returncode == 0, status.stderr
    assert "node n1" in status.stdout
    assert f"note: {node} answered, but not as a master" in status.stderr
    status = troupe("ctl", "status", "--node", master, "--master", master)
    assert status.returncode == 0, status.stderr
    assert "jobs" in status.stdout
    assert f"note: {master} answered, but not as a node" in status.stderr


def test_a_master_named_where_none_listens_is_said_not_left_out_silently(
    node_and_master: tuple[str, str],
) -> None:
    """`--master` given and nothing there: status and top show the node and say the master's
    view is left out (they said nothing; at the default endpoint, no master is no news)."""
    node, _ = node_and_master
    nowhere = free_endpoint()
    for args in (("ctl", "status"), ("ctl", "top", "--once")):
        done = troupe(*args, "--node", node, "--master", nowhere)
        assert done.returncode == 0, done.stderr
        said = " ".join((done.stdout + done.stderr).split())
        assert f"no master answers at {nowhere}: its view is left out" in said, (args, said)
