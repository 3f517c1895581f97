"""A training run's output folder: what its checkpoints were made with, and who uses it now.

``out/.troupe-train/run.json`` records what decides whether a checkpoint can be resumed: the
``[model]`` table, the clip geometry (``train.size``, ``train.clip_frames``), the dataset
(``train.dataset``; under ``{out}`` when it lies there) and the encoder (class, kwargs, weights)
whose latents the model learns from. The lock beside it
(``run.lock``, an OS lock the kernel drops with its holder) is held while a run trains there.

Rules, checked before anything starts (``troupe run TRAIN.toml`` checks them before its progress
bar, the run again as it takes the lock):

- a folder another run holds is refused, naming its pid;
- a new or empty folder (or one holding only what a training run writes: an older troupe's run
  has no record) starts a run, and is recorded;
- a recorded folder resumes when the record matches, and is refused, naming the first field
  that differs, when it does not (its checkpoints would not load: the workers failed, were
  restarted three times, and the run ended in 300 lines of tracebacks);
- anything else holds someone else's files: refused.

``--fresh`` deletes what a training run wrote (the record, ``logs/``, and the checkpoint and
latent-cache folders and the data generation's dataset where they lie in ``out``), in a folder
with a record only; elsewhere it deletes nothing and the rules above apply. Before, it deleted
those folders in any ``--out``, with whatever the user kept in them.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from troupe.runtime.errors import ConfigError
from troupe.runtime.pipeline.run_dir import (
    first_difference,
    held_by_another,
    hold,
    read_record,
    write_record,
)
from troupe.runtime.tasks.journal_lock import JournalLock

__all__ = ["TrainDir", "made_with"]

_FORMAT = 1
_STATE = ".troupe-train"


def made_with(cfg: Any, out: Path) -> dict[str, Any]:
    """What decides whether ``cfg`` (a ``TrainConfig``) can resume the checkpoints of ``out``:
    the model, the clips, the encoder, and the dataset (relative to ``out`` when it lies there,
    as with ``[datagen]``: a copied ``out`` still resumes)."""
    encoders = cfg.encoders
    dataset = Path(cfg.train.dataset).resolve()
    if dataset.is_relative_to(out.resolve()):
        dataset = Path("{out}") / dataset.relative_to(out.resolve())
    data = {
        "model": dict(cfg.model),
        "train": {
            "size": list(cfg.train.size),
            "clip_frames": cfg.train.clip_frames,
            "dataset": str(dataset),
        },
        "encoder": {
            "class": encoders.encoder,
            "kwargs": dict(encoders.encoder_kwargs),
            "weights": encoders.weights,
        },
    }
    made: dict[str, Any] = json.loads(json.dumps(data, default=str))  # as read back
    return made


class TrainDir:
    """The output folder of a training run.

    Args:
        out: the folder (``--out``), absolute; it need not exist yet.
        written: the folders a run writes in it (checkpoints, latent cache, the dataset of its
            data generation): those that lie directly in ``out`` are troupe's.
    """

    def __init__(self, out: Path, written: list[Path]) -> None:
        self.out = out
        self.state_dir = out / _STATE
        self.record_path = self.state_dir / "run.json"
        self._lock_target = self.state_dir / "run"  # its lock file is run.lock
        owned = {_STATE, "logs"} | {p.name for p in written if p.parent == out}
        # A folder found damaged is kept beside itself (the latent cache's: ``<name>.damaged``):
        # troupe's too, so --fresh removes it and a rerun does not take it for the user's.
        self.owned = owned | {f"{name}.damaged" for name in owned}

    def check(self, made: dict[str, Any], fresh: bool) -> None:
        """What :meth:`prepare` would refuse, refused without changing anything.

        Raises:
            ConfigError: the folder is in use, was made with another model or encoder, or
                holds someone else's files.
        """
        if self.out.exists() and not self.out.is_dir():
            raise ConfigError(f"--out {self.out} is a file; give a directory")
        self._not_in_use()
        if fresh and self.record_path.exists():
            return  # it will be wiped
        record = self._read()
        if record is None:
            self._check_new()
        else:
            self._check_same(record, made)

    def prepare(self, made: dict[str, Any], fresh: bool) -> JournalLock:
        """Check the folder against this run, wipe it (``fresh``), record it, and hold it.

        Returns:
            The folder's lock: held until the run releases it (or its process ends).

        Raises:
            ConfigError: as :meth:`check`.
        """
        if self.out.exists() and not self.out.is_dir():
            raise ConfigError(f"--out {self.out} is a file; give a directory")
        self.state_dir.mkdir(parents=True, exist_ok=True)
        lock = hold(self._lock_target, self.out, "training run")
        try:
            wiped = fresh and self.record_path.exists()
            if wiped:
                self._wipe()
            record = self._read()
            if record is None:
                if not wiped:
                    self._check_new()
                self._write({"format": _FORMAT, "made_with": made})
            else:
                self._check_same(record, made)
        except BaseException:
            lock.release()
            raise
        return lock

    # -- private ----------------------------------------------------------------------------

    def _not_in_use(self) -> None:
        problem = (
            held_by_another(self._lock_target, self.out, "training run") if self.state_dir.is_dir() else None
        )
        if problem is not None:
            raise ConfigError(problem)

    def _check_same(self, record: dict[str, Any], made: dict[str, Any]) -> None:
        recorded = record.get("made_with", {})
        if "dataset" not in (recorded.get("train") or {}):  # recorded before runs kept it
            made = {**made, "train": {k: v for k, v in made.get("train", {}).items() if k != "dataset"}}
        diff = first_difference(recorded, made)
        if diff is not None:
            raise ConfigError(
                f"--out {self.out} holds checkpoints made with {diff[0]}, this run asks {diff[1]}: "
                "they cannot be resumed (use --fresh to start anew, or another --out)"
            )

    def _read(self) -> dict[str, Any] | None:
        return read_record(self.record_path, self.out, _FORMAT, "training record")

    def _write(self, record: dict[str, Any]) -> None:
        write_record(self.record_path, record)

    def _check_new(self) -> None:
        try:
            entries = sorted(p.name for p in self.out.iterdir())
        except FileNotFoundError:
            return
        except NotADirectoryError:
            raise ConfigError(f"--out {self.out} is a file; give a directory") from None
        foreign = [e for e in entries if e not in self.owned]
        if foreign:
            raise ConfigError(
                f"--out {self.out} holds {foreign[0]!r}, which no training run wrote; give a new or "
                f"empty directory (a run writes {', '.join(sorted(self.owned - {_STATE}))} there)"
            )

    def _wipe(self) -> None:
        for name in sorted(self.owned - {_STATE}):
            path = self.out / name
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path)
            elif path.exists() or path.is_symlink():
                path.unlink()
        self.record_path.unlink(missing_ok=True)
