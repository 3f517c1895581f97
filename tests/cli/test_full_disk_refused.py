"""``troupe run TRAIN.toml`` on a disk with (nearly) no room: refused before anything starts, in
one line saying the disk is full and what is free. It failed as it recorded its --out (a
traceback), or as its encoders opened their cache's index (a raw ``database or disk is full``,
and the healthy cache set aside as damaged)."""

from __future__ import annotations

import contextlib
from pathlib import Path
from types import SimpleNamespace

import pytest
import typer

from troupe.cli import preflight
from troupe.cli.preflight import FULL_BELOW, full_disk_problem


@pytest.mark.parametrize("free", [0, FULL_BELOW - 1])
def test_a_full_disk_is_said_in_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, free: int) -> None:
    asked: list[Path] = []

    def usage(path: Path) -> SimpleNamespace:
        asked.append(Path(path))
        return SimpleNamespace(free=free)

    monkeypatch.setattr(preflight.shutil, "disk_usage", usage)
    out = tmp_path / "new" / "out"  # not made yet: its nearest existing folder's disk
    line = full_disk_problem(out, "--out")
    assert line == (
        f"--out {out}: the disk holding it is full ({free / 2**20:.1f} MiB free); free space on it, "
        "then run again"
    )
    assert asked == [tmp_path]


def test_a_disk_with_room_is_no_problem(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(preflight.shutil, "disk_usage", lambda _: SimpleNamespace(free=FULL_BELOW))
    assert full_disk_problem(tmp_path, "--out") is None


def test_troupe_run_on_a_full_disk_is_refused_unless_its_run_finished_there(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The data generation's --out too (it failed with a traceback as it recorded its run); a
    rerun of a finished run writes nothing, and still answers that it is complete."""
    from troupe.runtime.pipeline import run_outcome

    monkeypatch.setattr(preflight.shutil, "disk_usage", lambda _: SimpleNamespace(free=0))
    out = tmp_path / "out"
    with pytest.raises(typer.Exit) as refused:
        preflight.check_run(None, out, 2, "tcp://127.0.0.1:1", "tcp://127.0.0.1:2")
    assert refused.value.exit_code == 2
    assert f"--out {out}: the disk holding it is full" in capsys.readouterr().err
    monkeypatch.setattr(run_outcome, "completed_run", lambda _: object())
    with contextlib.suppress(typer.Exit):  # another check's refusal is no matter here
        preflight.check_run(None, out, 2, "tcp://127.0.0.1:1", "tcp://127.0.0.1:2")
    assert "is full" not in capsys.readouterr().err
