"""A node, its workers and a master with CURVE keys, driven through the ``troupe`` command.

Keys are generated into tmp_path. The operator key may do everything, the reader key may look
(ping, status) but not submit, a key from another cluster gets nothing at all (its messages are
never delivered; the node counts and logs it), a command without keys gets no answer; and the
signed heartbeats keep every worker alive.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest

from troupe.runtime import Unreachable, connect
from troupe.runtime.core.runtime import process_runtime
from troupe.runtime.security.keys import CurveKeys, generate_keys, load_keys
from troupe.runtime.security.process import install
from troupe.runtime.security.roles import NotPermitted
from troupe.runtime.testing import plugin as troupe_testing
from troupe.runtime.testing.plugin import Cluster

pytestmark = pytest.mark.e2e

troupe_cluster = troupe_testing.troupe_cluster

WAIT_S = 60.0  # bound of every poll: a loaded 2-core box may be slow, never wedged

CONFIG = """
[node]
stop_grace_s = 2
keys = "{keys}"

[supervision]
interval_s = 0.1
heartbeat_timeout_s = 2.0

[[workers]]
name = "w-echo"
actors = [{{ name = "echo", class = "troupe.actors.demo.actors:Echo" }}]

[[workers]]
name = "w-task"
[[workers.actors]]
name = "task"
class = "troupe.actors.demo.tasks:SleepTask"
kwargs = {{ outputs = "{out}", durable = false }}
"""
JOB = '[job]\nname = "curved"\nkind = "sleep"\ncount = 5\n'


def troupe(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "troupe.cli.main", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **(env or {})},
    )


@pytest.fixture
def keys(tmp_path: Path) -> Iterator[Path]:
    """The cluster's keys; this test process talks as the operator while the test runs."""
    directory = tmp_path / "keys"
    generate_keys(directory)
    install(load_keys(directory, None))
    try:
        yield directory
    finally:
        install(None)


def _reader_dir(keys: Path, tmp_path: Path) -> Path:
    """What a reader is given: the cluster's public key and their own pair."""
    mine = tmp_path / "reader"
    mine.mkdir(mode=0o700)
    for name in ("cluster.key", "reader.key", "reader.key_secret"):
        shutil.copy2(keys / name, mine / name)
    return mine


def _stranger(keys: Path, tmp_path: Path) -> CurveKeys:
    """A pair this cluster never authorised, presented to the cluster's server key."""
    generate_keys(tmp_path / "elsewhere")
    stranger = load_keys(tmp_path / "elsewhere")
    return CurveKeys(
        stranger.directory, "stranger", stranger.public, stranger.secret, load_keys(keys).public, {}
    )


def _node_log(cluster: Cluster) -> list[dict[str, Any]]:
    lines = []
    for path in sorted(cluster.log_dir.glob("*.jsonl*")):
        for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
            if line.startswith("{"):
                lines.append(json.loads(line))
    return lines


async def test_roles_refusals_and_heartbeats_with_keys(
    troupe_cluster: Callable[..., Cluster], keys: Path, tmp_path: Path
) -> None:
    cluster = troupe_cluster(CONFIG.format(keys=keys, out=tmp_path / "out"), "c1", master=True)
    node, master = cluster.endpoint, str(cluster.master_endpoint)

    # The operator: everything.
    ping = await anyio.to_thread.run_sync(troupe, "ctl", "ping", "--node", node, "--keys", str(keys))
    assert ping.returncode == 0, ping.stderr
    # The same keys before the command (for every ctl command), or from the environment.
    before = await anyio.to_thread.run_sync(troupe, "ctl", "--keys", str(keys), "ping", "--node", node)
    assert before.returncode == 0, before.stderr
    from_env = await anyio.to_thread.run_sync(
        lambda: troupe("ctl", "ping", "--node", node, env={"TROUPE_KEYS": str(keys)})
    )
    assert from_env.returncode == 0, from_env.stderr
    job = tmp_path / "job.toml"
    job.write_text(JOB, encoding="utf-8")
    submit = await anyio.to_thread.run_sync(
        troupe, "ctl", "submit", str(job), "--master", master, "--keys", str(keys)
    )
    assert submit.returncode == 0, submit.stderr
    done = await cluster.wait_job("curved", timeout=WAIT_S)
    assert done["counts"].get("done") == 5

    # The reader: ping and status, not submit (one line, naming both keys' roles).
    reader = str(_reader_dir(keys, tmp_path))
    assert (
        await anyio.to_thread.run_sync(troupe, "ctl", "ping", "--node", node, "--keys", reader)
    ).returncode == 0
    status = await anyio.to_thread.run_sync(
        troupe, "ctl", "status", "--json", "--node", node, "--master", master, "--keys", reader
    )
    assert status.returncode == 0, status.stderr
    shown = json.loads(status.stdout)
    assert shown["security"]["curve"] is True and shown["security"]["insecure"] is False
    assert shown["master"]["security"]["curve"] is True
    refused = await anyio.to_thread.run_sync(
        troupe, "ctl", "submit", str(job), "--id", "again", "--master", master, "--keys", reader
    )
    assert refused.returncode == 1
    assert refused.stderr.strip().splitlines() == [
        "error: submit needs an operator key; this peer has a reader key (reader)"
    ]
    assert "again" not in json.dumps(await cluster.master_control("jobs"))

    # A script's client (``troupe.connect``) with a keys directory: the operator's asks are
    # answered; the reader's reach no actor.
    install(None)
    try:
        async with connect(node, "c1", keys=keys) as rt:
            assert await rt.ref("echo").ask("echo", "hi", timeout=WAIT_S) == "hi"
        async with connect(node, "c1", keys=reader) as rt:
            with pytest.raises(NotPermitted, match="messages to actors need an operator key"):
                await rt.ref("echo").ask("echo", "hi", timeout=WAIT_S)
    finally:
        install(load_keys(keys, None))

    # No keys: no answer at all, and the message says what is missing.
    bare = await anyio.to_thread.run_sync(troupe, "ctl", "ping", "--node", node, "--timeout", "1")
    assert bare.returncode == 1 and "--keys DIR" in bare.stderr

    # A key of another cluster: nothing delivered, counted and logged by the node.
    before = (await cluster.status())["security"]["refused_peers"]
    echo = (await cluster.control("resolve", {"address": "echo"}))["endpoint"]
    async with process_runtime("x", "stranger", security=_stranger(keys, tmp_path)) as rt:
        # Refused, and told so at once (zmq_peer_loss.py), rather than left to its deadline.
        with pytest.raises(Unreachable, match="refused this process's CURVE key"):
            await rt.control(node, "ping", timeout=WAIT_S)
        rt.directory.learn("c1/w-echo/echo", echo)
        with pytest.raises(Unreachable, match="refused this process's CURVE key"):
            await rt.ref("c1/w-echo/echo").ask("echo", "let me in", timeout=WAIT_S)
    status_after = await cluster.status()
    assert status_after["security"]["refused_peers"] > before
    echo_stats = Cluster.worker_in(status_after, "w-echo")["runtime"]["actors"]["echo"]
    assert echo_stats["handled"] == 1  # the operator's; the reader's and the stranger's never reached it
    with anyio.fail_after(WAIT_S):  # the log line is written by the node's auth thread
        while not [e for e in _node_log(cluster) if e.get("event") == "peer_refused" and e.get("peer_key")]:
            await anyio.sleep(0.05)

    # Signed heartbeats all along: no worker was restarted, no beat was refused.
    supervision = status_after["supervision"]
    assert all(w["restarts"] == 0 for w in status_after["workers"]), status_after["workers"]
    assert supervision["supervisor"]["beats_received"] > 0
    assert supervision["supervisor"]["beats_bad_mac"] == 0
