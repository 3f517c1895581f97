"""Key pairs on disk: what ``troupe keys generate`` writes, and what every process loads."""

from __future__ import annotations

import errno
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import zmq.auth

from support.small_disk import small_disk
from troupe.runtime.errors import ConfigError
from troupe.runtime.security.keys import generate_keys, load_keys, role_of, user_id


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def _troupe(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "troupe.cli.main", *args], capture_output=True, text=True, timeout=60
    )


def test_generate_writes_the_three_pairs_with_private_secrets(tmp_path: Path) -> None:
    keys = tmp_path / "keys"
    written = generate_keys(keys)
    assert sorted(p.name for p in written) == [
        "cluster.key_secret",
        "operator.key_secret",
        "reader.key_secret",
    ]
    assert sorted(p.name for p in keys.iterdir()) == sorted(
        [f"{n}.key" for n in ("cluster", "operator", "reader")] + [p.name for p in written]
    )
    assert _mode(keys) == 0o700
    for name in ("cluster", "operator", "reader"):
        assert _mode(keys / f"{name}.key_secret") == 0o600
        public, secret = zmq.auth.load_certificate(keys / f"{name}.key_secret")
        assert secret is not None and len(secret) == 40
        assert zmq.auth.load_certificate(keys / f"{name}.key") == (public, None)  # pyzmq's format


def test_generate_refuses_to_overwrite_and_writes_nothing(tmp_path: Path) -> None:
    generate_keys(tmp_path)
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    with pytest.raises(ConfigError, match="the cluster pair exists already; it is not overwritten"):
        generate_keys(tmp_path)
    generate_keys(tmp_path, operators=["alice"])
    with pytest.raises(ConfigError, match="operator-alice pair exists already"):
        generate_keys(tmp_path, operators=["bob", "alice"])
    assert not (tmp_path / "operator-bob.key").exists()  # all checked before any is written
    assert all((tmp_path / name).read_bytes() == data for name, data in before.items())


def test_named_operators_and_readers_are_added_beside_the_cluster(tmp_path: Path) -> None:
    generate_keys(tmp_path)
    written = generate_keys(tmp_path, operators=["alice"], readers=["bob"])
    assert [p.name for p in written] == ["operator-alice.key_secret", "reader-bob.key_secret"]
    assert _mode(tmp_path / "reader-bob.key_secret") == 0o600
    keys = load_keys(tmp_path)
    assert sorted(keys.authorised.values()) == [
        "cluster",
        "operator",
        "operator:alice",
        "reader",
        "reader:bob",
    ]


def test_the_role_is_the_file_names_prefix() -> None:
    assert role_of("cluster") == "cluster"
    assert role_of("operator") == role_of("operator-alice") == "operator"
    assert role_of("reader-bob") == "reader"
    assert role_of("cluster-x") is None and role_of("admin") is None and role_of("operators") is None
    assert user_id("operator-alice") == "operator:alice" and user_id("cluster") == "cluster"


def test_a_process_loads_its_pair_and_a_client_prefers_an_operator_key(tmp_path: Path) -> None:
    generate_keys(tmp_path)
    cluster = load_keys(tmp_path)
    assert cluster.name == "cluster" and cluster.server_public == cluster.public
    assert cluster.heartbeat_key() is not None and len(cluster.heartbeat_key() or b"") == 32
    client = load_keys(tmp_path, None)
    assert client.name == "operator" and client.server_public == cluster.public
    assert client.heartbeat_key() is None  # only the cluster's processes sign heartbeats

    # An operator's own directory: the cluster's public key and their pair only.
    mine = tmp_path / "alice"
    mine.mkdir()
    generate_keys(mine, readers=["alice"])
    (mine / "cluster.key").write_bytes((tmp_path / "cluster.key").read_bytes())
    reader = load_keys(mine, None)
    assert reader.name == "reader-alice" and reader.user_id == "reader:alice"
    assert reader.server_public == cluster.public


def test_bad_key_directories_are_one_line_errors(tmp_path: Path) -> None:
    # A typo on a node's host: making a directory anew would make another cluster's keys.
    with pytest.raises(ConfigError, match=r"no such directory \(a typo\?\); give the cluster's keys") as typo:
        load_keys(tmp_path / "missing")
    assert f"keys {tmp_path / 'missing'}:" in str(typo.value) and "a copy of it" in str(typo.value)
    generate_keys(tmp_path)
    (tmp_path / "cluster.key_secret").chmod(0o644)
    with pytest.raises(ConfigError, match=r"readable by others \(mode 0644\); run chmod 600"):
        load_keys(tmp_path)
    (tmp_path / "cluster.key_secret").chmod(0o600)
    (tmp_path / "cluster.key").write_text("garbage\n")
    with pytest.raises(ConfigError, match=r"cluster\.key: not a CURVE certificate"):
        load_keys(tmp_path)
    (tmp_path / "cluster.key").unlink()
    with pytest.raises(ConfigError, match=r"no cluster\.key"):
        load_keys(tmp_path)


def test_the_command_generates_and_refuses_with_exit_status_2(tmp_path: Path) -> None:
    keys = tmp_path / "keys"
    out = _troupe("keys", "generate", str(keys))
    assert out.returncode == 0, out.stderr
    assert "cluster.key_secret" in out.stdout
    again = _troupe("keys", "generate", str(keys))
    assert again.returncode == 2
    assert again.stderr.strip().splitlines() == [
        f"error: keys {keys}: the cluster pair exists already; it is not overwritten (remove "
        "cluster.key and cluster.key_secret first to replace it)"
    ]
    bad = _troupe("keys", "generate", str(keys), "--operator", "a b")
    assert bad.returncode == 2 and "--operator 'a b'" in bad.stderr
    added = _troupe("keys", "generate", str(keys), "--operator", "alice", "--reader", "bob")
    assert added.returncode == 0, added.stderr
    assert (keys / "operator-alice.key_secret").exists() and (keys / "reader-bob.key").exists()
    assert "no cluster.key" not in added.stdout


def test_named_pairs_in_a_directory_without_the_cluster_pair_say_how_to_get_it(tmp_path: Path) -> None:
    """Named pairs make no cluster: the command says how to make its pair, or where it comes from."""
    mine = tmp_path / "alice"
    out = _troupe("keys", "generate", str(mine), "--operator", "alice")
    assert out.returncode == 0, out.stderr
    said = " ".join(out.stdout.split())
    assert f"{mine} has no cluster.key: for a new cluster, run `troupe keys generate {mine}`" in said
    assert "copy the cluster's cluster.key in" in said
    assert not (mine / "cluster.key").exists()  # an operator's own directory stays theirs


def test_keys_without_curve_in_libzmq_are_refused_saying_how_to_fix_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from troupe.runtime.security import keys as keys_module
    from troupe.runtime.security.process import keys_for

    generate_keys(tmp_path)
    monkeypatch.setattr(keys_module.zmq, "has", lambda capability: capability != "curve")
    with pytest.raises(ConfigError, match=r"lacks CURVE, which --keys needs; reinstall pyzmq"):
        keys_for(tmp_path)


@pytest.mark.parametrize("left_kib", [0, 8, 12])
def test_a_generate_that_fills_the_disk_leaves_nothing_and_a_rerun_works(
    tmp_path: Path, left_kib: int
) -> None:
    """It left an empty cluster.key (or a good pair and an empty operator.key), and the rerun
    refused it as "exists already"; its docstring: nothing is written unless every pair is new."""
    with small_disk(tmp_path / "disk", "64k") as disk:
        kept = disk / "kept"  # an existing directory, with a file of its own
        kept.mkdir()
        (kept / "notes.txt").write_text("mine")
        fill = disk / "fill"
        fill.write_bytes(b"\0" * (shutil.disk_usage(disk).free - (left_kib << 10)))
        for directory in (disk / "keys", kept):
            with pytest.raises(
                ConfigError, match=r"cannot write \(No space left on device\); nothing was left"
            ):
                generate_keys(directory)
        assert sorted(p.name for p in disk.iterdir()) == ["fill", "kept"]  # the folder it made is gone
        assert [p.name for p in kept.iterdir()] == ["notes.txt"]
        fill.unlink()
        assert len(generate_keys(disk / "keys")) == 3
        assert len(generate_keys(kept)) == 3


@pytest.mark.parametrize("code", [errno.EACCES, errno.EPERM, errno.EROFS])
@pytest.mark.parametrize("new", [True, False], ids=["new-directory", "existing-directory"])
def test_a_directory_that_may_not_be_written_is_said_so_not_a_full_disk(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, code: int, new: bool
) -> None:
    """A root-owned folder for another user (or a read-only mount): the advice was to free space
    on its disk. CI runs as root, whom permissions do not stop: the write fails here on purpose."""
    from troupe.runtime.security import keys as keys_module

    def refused(directory: Path, name: str, created: list[Path]) -> None:
        raise OSError(code, os.strerror(code), str(directory / f"{name}.key"))

    monkeypatch.setattr(keys_module, "write_pair", refused)
    monkeypatch.chdir(tmp_path)
    directory = Path("keys") if new else tmp_path  # relative: the folder is still named whole
    with pytest.raises(ConfigError) as err:
        generate_keys(directory)
    assert str(err.value) == (
        f"keys {directory}: cannot write in {tmp_path} ({os.strerror(code)}): give a directory you may write"
    )
    assert not (tmp_path / "keys").exists()  # the folder it made is gone


@pytest.mark.parametrize("public", ["cluster", "operator-alice"])
def test_a_secret_under_a_public_keys_name_is_refused_naming_the_file(tmp_path: Path, public: str) -> None:
    """A ``NAME.key_secret`` copied over ``NAME.key`` (mode 0644) was taken without a word: the
    public files are the ones handed to every host and operator, so the secret went with them,
    readable by every user there (report ak 2). Refused at start now, for a node and a client."""
    generate_keys(tmp_path)
    generate_keys(tmp_path, operators=["alice"])
    shutil.copy2(tmp_path / f"{public}.key_secret", tmp_path / f"{public}.key")
    (tmp_path / f"{public}.key").chmod(0o644)
    for identity in ("cluster", None):
        with pytest.raises(ConfigError) as refused:
            load_keys(tmp_path, identity)
        said = str(refused.value)
        assert f"public key file {tmp_path / f'{public}.key'} holds a secret key" in said, said
        assert f"keep the secret in {public}.key_secret (mode 0600)" in said, said
        assert "\n" not in said


def test_the_secret_key_is_not_in_the_keys_repr(tmp_path: Path) -> None:
    """The repr printed the secret key (the cluster's, on every host): any f-string or debug
    line of the keys would have logged it (report ak 9)."""
    generate_keys(tmp_path)
    keys = load_keys(tmp_path)
    assert keys.secret.decode() not in repr(keys) and keys.public.decode() in repr(keys)


def test_keys_naming_a_file_say_it_is_a_file(tmp_path: Path) -> None:
    """``--keys DIR/cluster.key_secret`` was told "no such directory (a typo?)" (report ak 8)."""
    generate_keys(tmp_path)
    with pytest.raises(
        ConfigError, match=r"cluster\.key_secret: is a file, not a directory; give the directory"
    ):
        load_keys(tmp_path / "cluster.key_secret")


def test_a_client_without_a_pair_of_its_own_is_not_sent_for_the_cluster_secret(tmp_path: Path) -> None:
    """An operator whose secret was forgotten or misnamed was told "no cluster.key_secret
    (secret key)", as if the cluster's secret belonged on their machine (report ak 7)."""
    generate_keys(tmp_path / "made", operators=["alice"])
    generate_keys(tmp_path / "made")
    mine = tmp_path / "mine"
    mine.mkdir(mode=0o700)
    for name in ("cluster.key", "operator-alice.key"):
        shutil.copy2(tmp_path / "made" / name, mine / name)
    with pytest.raises(ConfigError) as forgotten:
        load_keys(mine, None)
    said = str(forgotten.value)
    assert f"keys {mine}: no operator or reader pair; an operator's directory holds" in said, said
    assert "cluster.key_secret" not in said, said
    shutil.copy2(tmp_path / "made" / "operator-alice.key_secret", mine / "alice.key_secret")
    with pytest.raises(
        ConfigError, match=r"no operator or reader pair \(alice\.key_secret is there, but its name"
    ):
        load_keys(mine, None)


def test_a_pair_replaced_half_way_is_refused_at_start(tmp_path: Path) -> None:
    """A rotation that replaced cluster.key_secret and not cluster.key started a node whose
    supervisor and workers then failed in a loop, and a master nobody could reach (report ak 13)."""
    generate_keys(tmp_path / "old")
    generate_keys(tmp_path / "new")
    shutil.copy2(tmp_path / "new" / "cluster.key_secret", tmp_path / "old" / "cluster.key_secret")
    with pytest.raises(
        ConfigError, match=r"cluster\.key is not the public key of cluster\.key_secret \(a pair"
    ):
        load_keys(tmp_path / "old")


def test_a_public_key_in_place_of_a_secret_is_called_so(tmp_path: Path) -> None:
    """It was "not a CURVE certificate (keys are 40 Z85 characters)" (report ak 15)."""
    generate_keys(tmp_path)
    shutil.copy2(tmp_path / "operator.key", tmp_path / "operator.key_secret")
    (tmp_path / "operator.key_secret").chmod(0o600)
    with pytest.raises(
        ConfigError, match=r"operator\.key_secret: holds only a public key; the secret operator"
    ):
        load_keys(tmp_path, "operator")
