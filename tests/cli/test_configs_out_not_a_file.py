"""``troupe configs NAME --out`` a pipe, a terminal or a link (au 6): ``--out /dev/stdout`` was
refused as a file "already there; pass --force", and with --force the file made beside it was
renamed over the link, so /dev/stdout itself would have become a regular file; ``--out -``
wrote a file named ``-``; a config kept as a link was replaced by a copy. These are written
through now; only a regular file is refused without --force. Never run against the real
/dev/stdout with --force: links and FIFOs of the test's own stand for it."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from typer.testing import CliRunner

from troupe.cli.main import app

CONFIGS = Path(__file__).resolve().parents[2] / "configs"
NODE = (CONFIGS / "node.toml").read_text(encoding="utf-8")


def _troupe(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(app, list(args))
    return result.exit_code, result.output


def test_out_dash_is_stdout(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    code, output = _troupe("configs", "node.toml", "--out", "-")
    assert code == 0 and output == NODE, output[-300:]
    assert list(tmp_path.iterdir()) == [], "no file named -"


@pytest.mark.parametrize("force", [False, True])
def test_a_link_to_a_descriptor_is_written_through_and_kept(tmp_path: Path, force: bool) -> None:
    """What /dev/stdout is: a link to /proc/self/fd/1, here one of the test's own."""
    mine = tmp_path / "mystdout"
    mine.symlink_to("/proc/self/fd/1")
    done = subprocess.run(
        [sys.executable, "-m", "troupe.cli", "configs", "node.toml", "--out", str(mine)]
        + (["--force"] if force else []),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0 and done.stdout == NODE, done.stderr
    assert mine.is_symlink() and os.readlink(mine) == "/proc/self/fd/1"


def test_a_fifo_is_written_to(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    got: list[bytes] = []
    reader = threading.Thread(target=lambda: got.append(fifo.read_bytes()), daemon=True)
    reader.start()
    code, output = _troupe("configs", "node.toml", "--out", str(fifo))
    reader.join(timeout=60)
    if reader.is_alive():  # nothing was written: let the reader's open return
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
    assert code == 0 and output == "", output
    assert got == [NODE.encode()] and fifo.is_fifo()


def test_a_link_to_a_file_is_refused_then_written_through(tmp_path: Path) -> None:
    target = tmp_path / "srv" / "node.toml"
    target.parent.mkdir()
    target.write_text("# kept by config management\n")
    link = tmp_path / "node.toml"
    link.symlink_to(target)
    code, output = _troupe("configs", "node.toml", "--out", str(link))
    assert code == 2 and f"already exists (a link to {target}); pass --force" in output, output
    code, output = _troupe("configs", "node.toml", "--out", str(link), "--force")
    assert code == 0, output
    assert link.is_symlink() and os.readlink(link) == str(target)
    assert target.read_text(encoding="utf-8") == NODE
    assert sorted(p.name for p in target.parent.iterdir()) == ["node.toml"], "no temporary left"


def test_what_cannot_be_written_to_is_one_line(tmp_path: Path) -> None:
    import socket

    path = tmp_path / "sock"
    with socket.socket(socket.AF_UNIX) as listener:
        listener.bind(str(path))
        code, output = _troupe("configs", "node.toml", "--out", str(path), "--force")
    assert code == 1 and "cannot write to it (No such device or address)" in output, output
    assert len(output.strip().splitlines()) == 1 and path.is_socket()
