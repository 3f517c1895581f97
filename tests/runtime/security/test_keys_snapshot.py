"""The keys a node hands its children (``snapshot``): what a child loads is what the node
loaded at its start (report ak 1), the secrets travel in a file of this user's alone, never in
the environment, and a snapshot someone else may read is refused."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from troupe.runtime.errors import ConfigError
from troupe.runtime.node.child import child_env
from troupe.runtime.security.keys import generate_keys
from troupe.runtime.security.process import hand_down, install, keys_for, withdraw
from troupe.runtime.security.snapshot import read_snapshot

CHILD_WITHIN_S = 120  # a bound on a child's imports on a loaded machine, not on speed
_CHILD = (
    "import json; from troupe.runtime.security.process import install_from_env as f; k = f(); "
    "print(json.dumps([k.public.decode(), sorted(k.authorised.values()), str(k.directory)]))"
)


@pytest.fixture
def keys(tmp_path: Path) -> Iterator[Path]:
    generate_keys(tmp_path / "keys")
    generate_keys(tmp_path / "new")
    yield tmp_path / "keys"
    install(None)


def test_a_child_started_after_an_edit_loads_the_keys_of_the_nodes_start(tmp_path: Path, keys: Path) -> None:
    loaded = keys_for(keys)
    install(loaded)
    snapshot = tmp_path / "n.1.keys"
    hand_down(snapshot)
    try:
        env = child_env({})
        (keys / "reader.key").unlink()
        for name in ("cluster.key", "cluster.key_secret"):
            shutil.copy2(tmp_path / "new" / name, keys / name)
        done = subprocess.run(
            [sys.executable, "-c", _CHILD], env=env, capture_output=True, text=True, timeout=CHILD_WITHIN_S
        )
        assert done.returncode == 0, done.stderr
        public, users, directory = json.loads(done.stdout)
        assert public == loaded.public.decode()
        assert users == ["cluster", "operator", "reader"]
        assert directory == str(keys)  # its errors name the keys directory, not the snapshot
        secrets = {loaded.secret.decode(), (tmp_path / "new" / "cluster.key_secret").read_text()}
        assert not any(s in v for v in env.values() for s in secrets)  # the path only, no secret
    finally:
        withdraw(snapshot)
    assert not snapshot.exists()


def test_a_snapshot_others_may_read_is_refused(tmp_path: Path, keys: Path) -> None:
    install(keys_for(keys))
    snapshot = tmp_path / "n.1.keys"
    hand_down(snapshot)
    try:
        assert read_snapshot(snapshot).public == keys_for(keys).public
        snapshot.chmod(0o644)
        with pytest.raises(ConfigError, match=r"not this user's alone \(owner uid \d+, mode 0644\)"):
            read_snapshot(snapshot)
    finally:
        withdraw(snapshot)
    with pytest.raises(ConfigError, match=r"cannot read it .*restart the node"):
        read_snapshot(snapshot)


def test_a_node_without_keys_hands_nothing_down(tmp_path: Path) -> None:
    install(None)
    hand_down(tmp_path / "n.1.keys")
    assert not (tmp_path / "n.1.keys").exists()
    assert "TROUPE_KEYS_SNAPSHOT" not in child_env({}) and os.environ.get("TROUPE_KEYS_SNAPSHOT") is None
