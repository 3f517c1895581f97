"""`troupe keys generate DIR` into a folder another user may write: a symbolic link planted at a
key file's name (``cluster.key_secret -> /somewhere``) was followed, the cluster's secret written
where the link pointed (a file of the user's overwritten, or one made where the planter reads
it) and that file chmod-ed (report kl 3). Key files are created never through a link now: the
link is named, nothing is written, and what the link points to is left as it was."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from troupe.runtime.errors import ConfigError
from troupe.runtime.security import keys as keys_module
from troupe.runtime.security.keys import generate_keys, load_keys


@pytest.mark.parametrize("name", ["cluster.key_secret", "cluster.key", "reader.key_secret"])
@pytest.mark.parametrize("target_exists", [True, False], ids=["to-a-file", "dangling"])
def test_a_link_at_a_key_files_name_is_named_and_never_written_through(
    tmp_path: Path, name: str, target_exists: bool
) -> None:
    shared, elsewhere = tmp_path / "shared", tmp_path / "elsewhere"
    shared.mkdir()
    elsewhere.mkdir()
    target = elsewhere / "theirs"
    if target_exists:
        target.write_text("the user's own file")
        target.chmod(0o640)
    (shared / name).symlink_to(target)
    with pytest.raises(ConfigError) as refused:
        generate_keys(shared)
    said = str(refused.value)
    assert said.startswith(f"keys {shared}: {name} is a symbolic link (to {target}), which a key file"), said
    assert "remove it" in said and "\n" not in said, said
    assert sorted(p.name for p in shared.iterdir()) == [name]  # nothing written beside it
    if target_exists:
        assert target.read_text() == "the user's own file"
        assert target.stat().st_mode & 0o777 == 0o640
    else:
        assert not target.exists()
    (shared / name).unlink()
    assert len(generate_keys(shared)) == 3  # the link removed: generated as ever
    assert load_keys(shared).name == "cluster"


def test_a_link_planted_while_the_pairs_are_written_is_not_followed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The link put there after the look for taken names, before the pair's files are opened
    (the race a planter would run): the open itself refuses it, and only this call's own files
    are taken back, not the link nor what it points to."""
    shared, target = tmp_path / "shared", tmp_path / "theirs"
    write_pair = keys_module.write_pair

    def planted_first(directory: Path, name: str, created: list[Path]) -> Path:
        if name == "operator":
            (directory / "operator.key_secret").symlink_to(target)
        return write_pair(directory, name, created)

    monkeypatch.setattr(keys_module, "write_pair", planted_first)
    with pytest.raises(ConfigError, match=r"operator\.key_secret is a symbolic link \(to "):
        generate_keys(shared)
    assert not target.exists()
    assert sorted(p.name for p in shared.iterdir()) == ["operator.key_secret"]  # the cluster pair went


def test_the_command_says_it_in_one_line_exit_2(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    (shared / "cluster.key_secret").symlink_to(tmp_path / "theirs")
    done = subprocess.run(
        [sys.executable, "-m", "troupe.cli.main", "keys", "generate", str(shared)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2, done
    said = " ".join(done.stderr.split())
    assert "cluster.key_secret is a symbolic link" in said, said
    assert "Traceback" not in done.stderr
    assert not (tmp_path / "theirs").exists()
    assert os.listdir(shared) == ["cluster.key_secret"]
