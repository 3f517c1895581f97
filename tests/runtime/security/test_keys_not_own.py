"""A keys directory that is not this user's alone is said at start, in one line, as ssh's
StrictModes would (report sh 10): its owner, or whoever may write it, holds the cluster."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from support.log_capture import module_logs
from troupe.runtime.file_owner import user_name
from troupe.runtime.security import process
from troupe.runtime.security.keys import generate_keys, load_keys, not_own

NOBODY = 65534


@pytest.fixture
def keys(tmp_path: Path) -> Iterator[Path]:
    generate_keys(tmp_path / "keys")
    yield tmp_path / "keys"
    process.install(None)


def test_the_user_s_own_private_directory_is_not_said(keys: Path) -> None:
    assert not_own(load_keys(keys)) is None


@pytest.mark.skipif(os.geteuid() != 0, reason="only root can give a file to another user")
def test_another_user_s_directory_or_secret_is_said(keys: Path) -> None:
    me = user_name(os.geteuid())
    os.chown(keys / "cluster.key_secret", NOBODY, NOBODY)
    assert not_own(load_keys(keys)) == (
        f"secret key {keys / 'cluster.key_secret'} belongs to {user_name(NOBODY)}, not to this "
        f"process's user {me}"
    )
    os.chown(keys, NOBODY, NOBODY)
    assert not_own(load_keys(keys)) == (
        f"keys {keys} belong to {user_name(NOBODY)}, not to this process's user {me}"
    )


def test_a_directory_others_may_write_is_said(keys: Path) -> None:
    os.chmod(keys, 0o777)
    assert not_own(load_keys(keys)) == f"keys {keys} may be written by other users (mode 0777)"


def test_the_start_warns_in_one_line_and_starts_on(keys: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    os.chmod(keys, 0o775)
    with module_logs(monkeypatch, process) as logs:
        process.warn_if_not_own()  # no keys installed: nothing to say
        process.install(load_keys(keys))
        process.warn_if_not_own()
    [said] = logs
    assert said["event"] == "keys_not_own" and said["log_level"] == "warning"
    assert said["message"] == (
        f"keys {keys} may be written by other users (mode 0775): whoever owns or writes them decides "
        "who may control this cluster; use a keys directory that only this user owns and writes "
        "(chown, chmod 700)"
    )


def test_public_keys_whose_name_gives_no_role_are_said_at_start(
    keys: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``operator_alice.key`` or ``alice.key`` was passed over without a word, and its holder,
    refused, was asked whether the key was in the keys directory: it was (report ak 4)."""
    generate_keys(keys.parent / "alice", operators=["alice"])
    for name in ("operator_alice.key", "alice.key"):
        (keys / name).write_bytes((keys.parent / "alice" / "operator-alice.key").read_bytes())
    loaded = load_keys(keys)
    assert loaded.unnamed == ("alice.key", "operator_alice.key")
    assert set(loaded.authorised.values()) == {"cluster", "operator", "reader"}
    with module_logs(monkeypatch, process) as logs:
        process.install(loaded)
        process.warn_of_unnamed_keys()
    [said] = logs
    assert said["event"] == "keys_unnamed" and said["log_level"] == "warning"
    assert said["message"].startswith(f"alice.key, operator_alice.key in {keys}: not authorised, the name"), (
        said
    )
    assert "operator-NAME.key" in said["message"] and "restart" in said["message"]
