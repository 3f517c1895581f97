"""What a training run stopped by Ctrl-C or SIGTERM says last: the newest committed checkpoint
as the disk has it (a half-written one does not count), or that none was committed yet."""

from __future__ import annotations

from pathlib import Path

import pytest

from troupe.actors.training.checkpoint import COMMITTED
from troupe.actors.training.train_config import load_train_config
from troupe.cli.commands.run_train import _stopped_line

ROOT = Path(__file__).resolve().parents[2]


def test_it_names_the_newest_committed_checkpoint_or_says_none_was(tmp_path: Path) -> None:
    cfg = load_train_config(ROOT / "configs" / "train.toml")
    out = tmp_path / "out"
    assert _stopped_line(cfg, out) == (
        "stopped before any checkpoint was committed: the same command run again starts at step 0"
    )
    checkpoints = out / "checkpoints"
    for step, committed in ((8, True), (12, True), (16, False)):  # 16: cut off while it was written
        folder = checkpoints / f"step-{step:09d}"
        folder.mkdir(parents=True)
        if committed:
            (folder / COMMITTED).write_text("")
    said = _stopped_line(cfg, out)
    assert said == (
        f"stopped: checkpoint at step 12 in {(checkpoints / 'step-000000012').resolve()}; "
        "the same command run again resumes from it"
    )


def test_a_checkpoint_folder_that_cannot_be_read_is_said_not_raised(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The line is said while the command stops: an error reading the disk must not replace the
    stop's exit status with a traceback."""
    import troupe.actors.training.checkpoint as checkpoint

    def unreadable(directory: object) -> None:
        raise PermissionError(13, "Permission denied", str(directory))

    monkeypatch.setattr(checkpoint, "latest", unreadable)
    cfg = load_train_config(ROOT / "configs" / "train.toml")
    said = _stopped_line(cfg, tmp_path / "out")
    assert said.startswith(f"stopped; its checkpoints in {(tmp_path / 'out' / 'checkpoints').resolve()}")
    assert "Permission denied" in said
