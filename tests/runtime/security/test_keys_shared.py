"""A keys directory a lab shares (report sh 4): the client's pair is the first one this user may
read, and a secret it may not read is said so, naming its owner (it was "not a CURVE certificate").

The tests run as root, who reads any file: what the kernel refuses another user (a 0600 file of
someone else's) is refused here by a fake, on files given to uid 65534 (nobody)."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from troupe.runtime.errors import ConfigError
from troupe.runtime.file_owner import user_name
from troupe.runtime.security import keys as keys_mod
from troupe.runtime.security.keys import generate_keys, load_keys

NOBODY = 65534

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="only root can give a file to another user")


def _others_unreadable(monkeypatch: pytest.MonkeyPatch) -> None:
    """This process reads no file another user owns, as a user who is not root."""
    real_access, real_load = os.access, keys_mod.zmq.auth.load_certificate

    def theirs(path: object) -> bool:
        return os.stat(str(path)).st_uid != os.geteuid()

    def access(path: object, mode: int, **kwargs: object) -> bool:
        return not (os.path.exists(str(path)) and theirs(path)) and real_access(path, mode, **kwargs)  # type: ignore[arg-type]

    def load(path: object) -> tuple[bytes, bytes | None]:
        if theirs(path):
            raise PermissionError(errno.EACCES, "Permission denied", str(path))
        return real_load(path)  # type: ignore[arg-type]

    monkeypatch.setattr(keys_mod.os, "access", access)
    monkeypatch.setattr(keys_mod.zmq.auth, "load_certificate", load)


@pytest.fixture
def lab(tmp_path: Path) -> Path:
    """The report's folder: root's three pairs, and bob's (here: this user's) operator and reader."""
    generate_keys(tmp_path)
    generate_keys(tmp_path, operators=["bobop"], readers=["bob"])
    for name in ("cluster", "operator", "reader"):
        os.chown(tmp_path / f"{name}.key_secret", NOBODY, NOBODY)
    return tmp_path


def test_the_client_presents_the_first_operator_pair_it_may_read(
    lab: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _others_unreadable(monkeypatch)
    assert load_keys(lab, None).name == "operator-bobop"


def test_a_secret_this_user_may_not_read_is_said_with_its_owner(
    lab: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A node's cluster pair, or a client's where none is readable: "cannot read", not "not a
    CURVE certificate"."""
    _others_unreadable(monkeypatch)
    expected = (
        f"cannot read {lab / 'cluster.key_secret'} (Permission denied; it belongs to {user_name(NOBODY)}); "
        "use a keys directory of this user's own: the cluster's cluster.key and a pair of yours"
    )
    with pytest.raises(ConfigError) as node:
        load_keys(lab)
    assert str(node.value) == expected
    for name in ("operator-bobop", "reader-bob"):
        os.chown(lab / f"{name}.key_secret", NOBODY, NOBODY)
    with pytest.raises(ConfigError) as client:
        load_keys(lab, None)
    assert str(client.value) == expected.replace("cluster.key_secret", "operator.key_secret")
