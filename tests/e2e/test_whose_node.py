"""Whose node it is (report sh 2): two users' `troupe run`s on one host both have a node called
`local`, and nothing in its status said which user's it was; a flagless `ctl status` that found
another user's run at the run's default sent the caller there as if it were theirs. The node's
`ping` and `status` say its user now, `ctl status`'s header shows it (and a run's --out), and
the hint names another user's node as theirs."""

from __future__ import annotations

import os
from collections.abc import Callable

import pytest

from troupe.cli import client as cli_client
from troupe.cli.tables import status_tables
from troupe.runtime import Unreachable
from troupe.runtime.process_identity import user_name
from troupe.runtime.testing.cluster import Cluster
from troupe.runtime.transports.loopback import free_endpoint


async def test_status_and_the_hint_say_whose_node_it_is(
    troupe_cluster: Callable[..., Cluster], monkeypatch: pytest.MonkeyPatch
) -> None:
    cluster = troupe_cluster("[node]\n", name="host")
    status = await cluster.status()
    assert (status["user"], status["uid"]) == (user_name(), os.getuid())
    assert f"node host, user {user_name()}" in str(status_tables(status)[0].title)

    nobody = free_endpoint()
    monkeypatch.setattr(cli_client, "RUN_NODE_ENDPOINT", cluster.endpoint)
    monkeypatch.setattr(cli_client, "DEFAULT_NODE_ENDPOINT", nobody)
    with pytest.raises(Unreachable, match=f"pass --node {cluster.endpoint}"):  # the caller's own
        await cli_client.control(nobody, "ping", timeout=5)
    monkeypatch.setattr(cli_client, "user_name", lambda: "someone-else")
    with pytest.raises(Unreachable) as err:
        await cli_client.control(nobody, "ping", timeout=5)
    said = str(err.value)
    assert f"a node of user {user_name()} listens at {cluster.endpoint}" in said, said
    assert f"pass --node {cluster.endpoint}" not in said


def test_a_run_s_node_shows_its_out() -> None:
    status = {"node": "local", "user": "alice", "out": "/data/run", "endpoint": "tcp://127.0.0.1:7479"}
    status |= {"pid": 1, "uptime_s": 1.0, "rss_mib": 1.0, "workers": []}
    node = status_tables(status)[0]
    assert str(node.title) == "node local, user alice"
    assert "run out" in [str(c) for c in node.columns[0]._cells]
    assert "/data/run" in [str(c) for c in node.columns[1]._cells]
