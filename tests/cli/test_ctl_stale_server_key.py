"""`troupe ctl --keys DIR` whose DIR/cluster.key is not the server key of the master it talks to
(rotated since, another cluster's): the master hangs up on every handshake, and the command
waited out its timeout, then called a healthy master "busy, paused (SIGSTOP) or hung" (report
mt 1). It now says at once which key file is not that master's."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import anyio

from support.chaos import start_master
from support.port_range import test_endpoint
from troupe.runtime.security.keys import generate_keys
from troupe.runtime.security.process import KEYS_ENV, install, keys_for

HANG_GUARD_S = 120  # a bound on a hang (the command's own --timeout is an hour), never on speed


def test_a_stale_cluster_key_is_named_at_once_not_blamed_on_a_hung_master(tmp_path: Path) -> None:
    keys, other = tmp_path / "keys", tmp_path / "other"
    generate_keys(keys)
    generate_keys(other)
    stale = tmp_path / "op_old"  # this cluster's operator pair, another cluster's server key
    stale.mkdir(mode=0o700)
    shutil.copy2(other / "cluster.key", stale / "cluster.key")
    for name in ("operator.key", "operator.key_secret"):
        shutil.copy2(keys / name, stale / name)
    install(keys_for(keys, None))  # start_master's readiness call, as the cluster's operator
    master = start_master(tmp_path / "master", endpoint=test_endpoint(), extra=("--keys", str(keys)))
    try:
        env = {k: v for k, v in os.environ.items() if k != KEYS_ENV}
        cmd = ["ctl", "jobs", "--master", master.endpoint, "--keys", str(stale), "--timeout", "3600"]
        done = subprocess.run(
            [sys.executable, "-m", "troupe.cli.main", *cmd],
            capture_output=True,
            text=True,
            timeout=HANG_GUARD_S,
            env=env,
        )
        assert anyio.run(master.call, "jobs") is not None  # the master is healthy all along
    finally:
        install(None)
        assert master.reap() == []
    said = " ".join(done.stderr.split())
    assert done.returncode == 1, done
    assert f"the CURVE handshake with {master.endpoint} failed" in said, said
    assert f"{stale / 'cluster.key'} (rotated? another cluster's?" in said, said
    assert "busy, paused" not in said and "did not answer" not in said, said
