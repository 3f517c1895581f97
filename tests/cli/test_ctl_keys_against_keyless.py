"""`troupe ctl --keys DIR` talking to a master that runs without keys was told that the CURVE
handshake failed "as a troupe process does whose server key is not the one in DIR/cluster.key
(rotated? another cluster's? ... its log says peer_refused)", which sent its user to copy keys
around: that master logs nothing of the kind (report kl 5, ak 12). The peer's greeting says its
mechanism: the command now says that what listens runs without keys, and how to talk to it."""

from __future__ import annotations

from pathlib import Path

import anyio

from support.chaos import start_master
from support.cli_session import troupe_in_session
from support.port_range import test_endpoint
from troupe.runtime.security.keys import generate_keys
from troupe.runtime.security.process import KEYS_ENV, install

HANG_GUARD_S = 120  # a bound on a hang (the command's own --timeout is an hour), never on speed


def test_a_keyed_ctl_is_told_the_master_runs_without_keys(tmp_path: Path) -> None:
    keys = tmp_path / "keys"
    generate_keys(keys)
    install(None)
    master = start_master(tmp_path / "master", endpoint=test_endpoint())  # no keys
    try:
        cmd = ["ctl", "jobs", "--master", master.endpoint, "--keys", str(keys), "--timeout", "3600"]
        done = troupe_in_session(*cmd, timeout=HANG_GUARD_S, env={KEYS_ENV: ""})  # "": no keys
        assert anyio.run(master.call, "jobs") is not None  # the master is healthy all along
    finally:
        assert master.reap() == []
    said = " ".join(done.stderr.split())
    assert done.returncode == 1, done
    assert said == (
        f"error: the master at {master.endpoint} runs without CURVE keys (its handshake offers none), "
        f"and this command uses the keys in {keys}: leave out --keys (and $TROUPE_KEYS) to talk to it, "
        "or start that master with the cluster's keys"
    ), said
    assert "rotated?" not in said and "peer_refused" not in said, said
