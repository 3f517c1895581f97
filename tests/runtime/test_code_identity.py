"""The build identity: a digest of the package's source files, changing whenever one does,
the same for the same code however it was installed (a checkout's src/ and tools/, a wheel's
troupe/ with troupe/cli inside)."""

from __future__ import annotations

import shutil
from pathlib import Path

from troupe.runtime import code_identity
from troupe.runtime.code_identity import package_roots, source_digest


def _tree(root: Path) -> dict[str, Path]:
    """A small copy of a checkout's layout: the package and the CLI in folders of their own."""
    (root / "src" / "runtime").mkdir(parents=True)
    (root / "src" / "__init__.py").write_text("")
    (root / "src" / "runtime" / "beat.py").write_text("BEAT_S = 1.0\n")
    (root / "tools").mkdir()
    (root / "tools" / "main.py").write_text("print('troupe')\n")
    return {"troupe": root / "src", "troupe/cli": root / "tools"}


def test_the_digest_changes_when_a_source_file_does(tmp_path: Path) -> None:
    roots = _tree(tmp_path)
    before = source_digest(roots)
    assert source_digest(roots) == before  # the same files, the same digest
    (tmp_path / "src" / "runtime" / "beat.py").write_text("BEAT_S = 2.0\n")
    changed = source_digest(roots)
    assert changed != before
    (tmp_path / "tools" / "added.py").write_text("")
    assert source_digest(roots) not in (before, changed)  # a file added counts too


def test_compiled_files_and_other_files_do_not_count(tmp_path: Path) -> None:
    roots = _tree(tmp_path)
    before = source_digest(roots)
    (tmp_path / "src" / "__pycache__").mkdir()
    (tmp_path / "src" / "__pycache__" / "x.py").write_text("stale = True\n")
    (tmp_path / "src" / "weights.md").write_text("how the weights were made\n")
    assert source_digest(roots) == before


def test_a_wheel_layout_of_the_same_code_has_the_same_digest(tmp_path: Path) -> None:
    roots = _tree(tmp_path / "checkout")
    wheel = tmp_path / "site-packages" / "troupe"
    shutil.copytree(roots["troupe"], wheel)
    shutil.copytree(roots["troupe/cli"], wheel / "cli")
    # The wheel's troupe.cli lies inside troupe/: found under both roots, counted once.
    assert source_digest({"troupe": wheel, "troupe/cli": wheel / "cli"}) == source_digest(roots)


def test_this_process_s_identity_is_the_version_and_the_digest_of_its_package() -> None:
    roots = package_roots()
    assert (roots["troupe"] / "runtime" / "code_identity.py").is_file()
    assert "troupe/cli" in roots
    assert code_identity.code_identity() == f"{code_identity.version()}+{source_digest(roots)}"
