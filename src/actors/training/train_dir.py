"""A training run's output folder: what its checkpoints were made with, and who uses it now.

``out/.troupe-train/run.json`` records what decides whether a checkpoint can be resumed: the
model (every field of the ``WorldModelConfig`` that ``[model]`` builds, the defaults of this
troupe's code included), the clip geometry (``train.size``, ``train.clip_frames``), the dataset
(``train.dataset``; under ``{out}`` when it lies there), ``train.seed`` (the sampler's epochs)
and the encoder (class, kwargs, weights) whose latents the model learns from; and, beside them,
the dataset's identity (:mod:`.dataset_identity`: a store that grew goes on, one replaced or
shrunk is refused). The lock beside it
(``run.lock``, an OS lock the kernel drops with its holder) is held while a run trains there.

Rules, checked before anything starts (``troupe run TRAIN.toml`` checks them before its progress
bar, the run again as it takes the lock):

- a folder another run holds is refused, naming its pid;
- a new or empty folder (or one holding only what a training run writes: an older troupe's run
  has no record) starts a run, and is recorded;
- a recorded folder resumes when the record matches, and is refused, naming the first field
  that differs, when it does not (its checkpoints would not load: the workers failed, were
  restarted three times, and the run ended in 300 lines of tracebacks), and when its dataset
  was replaced or shrank (each restart failed on a clip index out of range); one that holds no
  checkpoint yet (its run failed before the first) binds nothing: this run's config is recorded.
  The model is compared field by field, a recorded model completed with this code's defaults:
  a default another troupe changed is found here (it was found only as rank 0 loaded the
  checkpoint, called unloadable, with advice to move it away that no checkpoint could follow),
  and a record of a troupe that kept only the keys ``[model]`` set still resumes;
- anything else holds someone else's files: refused.

The record also keeps which troupe code trained there (``made_by``, as a data generation's:
``runtime/pipeline/run_code.py``): a resume under other code says so in one line, and goes on.
The code is recorded as the run is prepared, before it may make anything (a run SIGKILLed
later stays recorded: the safe side), and taken back as the run ends where it committed no
checkpoint (:meth:`TrainDir.release`): a run that failed before its first (a checkpoint it
could not load, say) made nothing there, and every later run said the folder mixed both.

``--fresh`` deletes what a training run wrote (the record, ``logs/``, and the checkpoint and
latent-cache folders and the data generation's dataset where they lie in ``out``), in a folder
with a record only; elsewhere it deletes nothing and the rules above apply. Before, it deleted
those folders in any ``--out``, with whatever the user kept in them.

A ``train.checkpoint_dir`` that does not lie directly in ``out`` is the user's folder: the run
binds it to ``out`` (``.troupe-train-out.json`` in it names ``out``; the record lists it), and
another ``--out`` naming it is refused, naming both (it had resumed from, and written over, the
other run's checkpoints). ``--fresh`` deletes the ``step-<n>`` folders of the checkpoint folders
bound to ``out``, nothing else in them (it had deleted none, and the run resumed at once).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
import shlex
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

from troupe.models.world_model import WorldModelConfig
from troupe.runtime.errors import ConfigError
from troupe.runtime.pipeline.run_code import code_line, last_other_code, this_code
from troupe.runtime.pipeline.run_dir_lock import held_by_another, hold
from troupe.runtime.pipeline.run_fingerprint import first_difference
from troupe.runtime.pipeline.run_record import read_record, write_record
from troupe.runtime.tasks.journal_lock import JournalLock

if TYPE_CHECKING:
    from .dataset_identity import DatasetIdentity

__all__ = ["TrainDir", "made_with"]

_FORMAT = 1
_STATE = ".troupe-train"
_BOUND = ".troupe-train-out.json"  # in a checkpoint folder outside --out: the --out it is bound to
_STEP_DIR = re.compile(r"step-\d+")  # a checkpoint's folder (checkpoint.checkpoint_path)
_COMMITTED = "COMMITTED"  # a committed checkpoint's marker (checkpoint.COMMITTED: that imports torch)
_UNSET = object()  # a record's made_by that was not there


def made_with(cfg: Any, out: Path) -> dict[str, Any]:
    """What decides whether ``cfg`` (a ``TrainConfig``) can resume the checkpoints of ``out``:
    the model (every field, as this code builds it: a default that changed is another model),
    the clips, the encoder (its weights file's sha256 too: another file at the same
    path is another encoder, whose latents the checkpoints were not trained on), and the dataset
    (relative to ``out`` when it lies there, as with ``[datagen]``: a copied ``out`` still
    resumes)."""
    encoders = cfg.encoders
    dataset = Path(cfg.train.dataset).resolve()
    if dataset.is_relative_to(out.resolve()):
        dataset = Path("{out}") / dataset.relative_to(out.resolve())
    data = {
        "model": dataclasses.asdict(WorldModelConfig(**cfg.model)),
        "train": {
            "size": None if cfg.train.size is None else list(cfg.train.size),  # None: as stored
            "clip_frames": cfg.train.clip_frames,
            "dataset": str(dataset),
            "seed": cfg.train.seed,  # the sampler's epochs: a checkpoint of another goes on in none
        },
        "encoder": {
            "class": encoders.encoder,
            "kwargs": dict(encoders.encoder_kwargs),
            "weights": encoders.weights,
        },
    }
    digest = _file_sha256(encoders.weights)
    if digest is not None:
        data["encoder"]["weights_sha256"] = digest
    made: dict[str, Any] = json.loads(json.dumps(data, default=str))  # as read back
    return made


class TrainDir:
    """The output folder of a training run.

    Args:
        out: the folder (``--out``), absolute; it need not exist yet.
        written: the folders a run writes in it (checkpoints, latent cache, the dataset of its
            data generation): those that lie directly in ``out`` are troupe's.
        checkpoint_dir: the run's checkpoint folder, absolute (default ``out/checkpoints``); one
            that does not lie directly in ``out`` is bound to ``out``.
    """

    def __init__(self, out: Path, written: list[Path], checkpoint_dir: Path | None = None) -> None:
        self.out = out
        self.checkpoint_dir = checkpoint_dir if checkpoint_dir is not None else out / "checkpoints"
        self.checkpoints = (
            checkpoint_dir if checkpoint_dir is not None and checkpoint_dir.parent != out else None
        )
        self.state_dir = out / _STATE
        self.record_path = self.state_dir / "run.json"
        self._lock_target = self.state_dir / "run"  # its lock file is run.lock
        self.written = {_STATE, "logs"} | {p.name for p in written if p.parent == out}
        # A folder found damaged is kept beside itself (the latent cache's: ``<name>.damaged``):
        # troupe's too, so --fresh removes it and a rerun does not take it for the user's.
        self.owned = self.written | {f"{name}.damaged" for name in self.written}
        self.grown: str | None = None  # set by prepare: the line saying the dataset grew
        # Set by prepare: the line saying other troupe code trained the checkpoints resumed.
        self.other_code: str | None = None
        self._lock: JournalLock | None = None  # set by prepare: released by release
        # Set by prepare where it added this code to made_by: the made_by it replaced (_UNSET:
        # none), and the committed checkpoints then; release puts it back if none came since.
        self._made_by_before: Any = None
        self._committed_before: dict[str, tuple[int, int]] = {}

    def check(self, made: dict[str, Any], fresh: bool, dataset: DatasetIdentity | None = None) -> None:
        """What :meth:`prepare` would refuse, refused without changing anything.

        Raises:
            ConfigError: the folder is in use, was made with another model or encoder, holds
                someone else's files, or its checkpoints were trained on another dataset.
        """
        if self.out.exists() and not self.out.is_dir():
            raise ConfigError(f"--out {self.out} is a file; give a directory")
        self._not_in_use()
        self._check_checkpoints()
        if fresh and self.record_path.exists():
            return  # it will be wiped
        record = self._read()
        if record is None:
            self._check_new()
        elif self._has_checkpoints(record):
            self._check_same(record, made)
            if dataset is not None:
                dataset.against(record.get("dataset"), self.out)

    def prepare(
        self, made: dict[str, Any], fresh: bool, dataset: DatasetIdentity | None = None
    ) -> JournalLock:
        """Check the folder against this run, wipe it (``fresh``), record it, and hold it.

        ``dataset``: the identity of the dataset the run trains on (None: not known, as with a
        data generation beside, whose dataset is the run's own), recorded; :attr:`grown` is set
        to the line saying it grew since the checkpoints began, if it did; :attr:`other_code` to
        the line saying the checkpoints resumed were trained by other troupe code, if they were.
        This code is added to the record's ``made_by``; :meth:`release` takes it back where the
        run committed no checkpoint.

        Returns:
            The folder's lock: held until the run releases it (or its process ends); the run
            releases it through :meth:`release`.

        Raises:
            ConfigError: as :meth:`check`.
        """
        if self.out.exists() and not self.out.is_dir():
            raise ConfigError(f"--out {self.out} is a file; give a directory")
        self.state_dir.mkdir(parents=True, exist_ok=True)
        lock = hold(self._lock_target, self.out, "training run")
        try:
            self._check_checkpoints()
            wiped = fresh and self.record_path.exists()
            if wiped:
                self._wipe()
            record = self._read()
            trained_on = {} if dataset is None else {"dataset": dataset.record()}
            began = {"made_by": [this_code()]}  # the troupe code that trains here (run_code)
            if record is None:
                if not wiped:
                    self._check_new()
                record = {"format": _FORMAT, "made_with": made, **trained_on, **began}
                self._write(self._binding(record))
                self._made_by_before = []  # nothing made here yet
            elif not self._has_checkpoints(record):  # nothing to resume: this run's config binds
                self._write(self._binding({**record, "made_with": made, **trained_on, **began}))
                self._made_by_before = []
            else:
                self._check_same(record, made)
                if dataset is not None:
                    self.grown = dataset.against(record.get("dataset"), self.out)
                made_by, self.other_code = code_line(
                    record.get("made_by"), self.out, "the steps this run trains"
                )
                if made_by != record.get("made_by"):
                    self._made_by_before = record.get("made_by", _UNSET)
                # grown: the larger one binds
                updated = self._binding({**record, **trained_on, "made_by": made_by})
                if updated != record:
                    self._write(updated)
            self._bind()
            self._committed_before = self._committed(self._read() or {})
        except BaseException:
            lock.release()
            raise
        self._lock = lock
        return lock

    def release(self) -> None:
        """End the run's hold on the folder: where :meth:`prepare` added this code to the
        record's ``made_by`` and no checkpoint was committed since, put ``made_by`` back as it
        was (the run made nothing there: one that failed to load the checkpoint it resumed, or
        stopped before its first, would have the folder said to mix both codes for ever); then
        release the lock. A run that dies before this stays recorded: the safe side, as a
        checkpoint may have been committed."""
        if self._lock is None:
            return
        try:
            self._take_back_code()
        finally:
            self._lock.release()
            self._lock = None

    # -- private ----------------------------------------------------------------------------

    def _not_in_use(self) -> None:
        problem = (
            held_by_another(self._lock_target, self.out, "training run") if self.state_dir.is_dir() else None
        )
        if problem is not None:
            raise ConfigError(problem)

    def _check_same(self, record: dict[str, Any], made: dict[str, Any]) -> None:
        recorded = record.get("made_with", {})
        # Recorded before runs kept them: not compared.
        for section, key in (("train", "dataset"), ("train", "seed"), ("encoder", "weights_sha256")):
            if key not in (recorded.get(section) or {}):
                made = {**made, section: {k: v for k, v in made.get(section, {}).items() if k != key}}
        if isinstance(recorded.get("model"), dict):
            recorded = {**recorded, "model": _completed(recorded["model"])}
            made = {**made, "model": _completed(made.get("model", {}))}
            self._check_same_model(record, recorded["model"], made["model"])
        diff = first_difference(recorded, made)
        if diff is not None:
            raise ConfigError(
                f"--out {self.out} holds checkpoints made with {diff[0]}, this run asks {diff[1]}: "
                "they cannot be resumed (use --fresh to start anew, or another --out)"
            )

    def _check_same_model(
        self, record: dict[str, Any], recorded: dict[str, Any], made: dict[str, Any]
    ) -> None:
        """Refuse checkpoints of another model, naming the first field that differs and the ways
        on: the field set in ``[model]`` as they had it (a default this troupe changed is not
        the user's doing), the troupe that made them, or ``--fresh``."""
        field = next((k for k in [*recorded, *made] if recorded.get(k, _UNSET) != made.get(k, _UNSET)), None)
        if field is None:
            return
        ways = []
        if field in recorded and field in {f.name for f in dataclasses.fields(WorldModelConfig)}:
            ways.append(f"set {field} = {json.dumps(recorded[field])} in [model] to resume them, ")
        other = last_other_code(record.get("made_by"))
        if other is not None:
            ways.append(f"run {other}, which made them, ")
        raise ConfigError(
            f"--out {self.out} holds checkpoints made with {_model_field(field, recorded)}, this run "
            f"builds {_model_field(field, made)} (its [model] with this troupe's defaults): they cannot "
            f"be resumed ({''.join(ways)}use --fresh to start anew, or another --out)"
        )

    def _take_back_code(self) -> None:
        if self._made_by_before is None:
            return  # this code was the last already
        try:
            record = self._read()
        except ConfigError:
            return  # damaged since: the next run says so
        if record is None or self._committed(record) != self._committed_before:
            return  # a checkpoint was committed (or removed: not this code's to judge)
        if self._made_by_before is _UNSET:
            record.pop("made_by", None)
        else:
            record["made_by"] = self._made_by_before
        self._write(record)

    def _committed(self, record: dict[str, Any]) -> dict[str, tuple[int, int]]:
        """The committed checkpoints of the folders of ``record`` and of this run, each with
        its marker's inode and mtime: a step saved again (its uncommitted folder removed first)
        is a new commit under the same name."""
        folders = {self.checkpoint_dir, *(Path(p) for p in record.get("checkpoint_dirs") or [])}
        committed = {}
        for step in (step for folder in folders for step in _step_dirs(folder)):
            try:
                marker = (step / _COMMITTED).stat()
            except OSError:
                continue
            committed[str(step)] = (marker.st_ino, marker.st_mtime_ns)
        return committed

    def _has_checkpoints(self, record: dict[str, Any]) -> bool:
        """Whether a checkpoint folder of ``record`` or of this run holds a checkpoint (a
        ``step-<n>`` folder, committed or not): a run that wrote none binds ``out`` to nothing."""
        folders = {self.checkpoint_dir, *(Path(p) for p in record.get("checkpoint_dirs") or [])}
        return any(_step_dirs(folder) for folder in folders)

    def _check_checkpoints(self) -> None:
        """Refuse a checkpoint folder outside ``out`` that another ``--out`` is bound to, or that
        holds checkpoints no run recorded (resumed, they would be another run's)."""
        if self.checkpoints is None:
            return
        bound = _bound_to(self.checkpoints)
        if bound is not None and bound != self.out:
            raise ConfigError(
                f"train.checkpoint_dir {self.checkpoints} holds the checkpoints of --out {bound}, "
                f"not of --out {self.out}: run with --out {shlex.quote(str(bound))}, or give this run a "
                f"train.checkpoint_dir of its own (or delete {self.checkpoints / _BOUND} to hand "
                "them to this --out)"
            )
        if bound is None and not self.record_path.exists() and _step_dirs(self.checkpoints):
            raise ConfigError(
                f"train.checkpoint_dir {self.checkpoints} holds checkpoints no run of --out "
                f"{self.out} made ({_step_dirs(self.checkpoints)[0].name}): give this run a "
                "train.checkpoint_dir of its own, or move them away"
            )

    def _binding(self, record: dict[str, Any]) -> dict[str, Any]:
        """``record`` listing this run's checkpoint folder outside ``out`` too."""
        listed = [str(p) for p in record.get("checkpoint_dirs") or []]
        if self.checkpoints is None or str(self.checkpoints) in listed:
            return record
        return {**record, "checkpoint_dirs": [*listed, str(self.checkpoints)]}

    def _bind(self) -> None:
        if self.checkpoints is not None and _bound_to(self.checkpoints) != self.out:
            self.checkpoints.mkdir(parents=True, exist_ok=True)
            write_record(self.checkpoints / _BOUND, {"format": _FORMAT, "out": str(self.out)})

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
        if ".troupe" in foreign:  # a pipeline run's (its record, journal): not foreign to troupe
            raise ConfigError(
                f"--out {self.out} is a pipeline run's folder (it holds '.troupe'); give a training "
                "run a new or empty directory"
            )
        if foreign:
            raise ConfigError(
                f"--out {self.out} holds {foreign[0]!r}, which no training run wrote; give a new or "
                f"empty directory (a run writes {', '.join(sorted(self.written))} there)"
            )

    def _wipe(self) -> None:
        try:
            record = self._read() or {}
        except ConfigError:  # damaged: its refusal offers --fresh, which must then start anew
            record = {}  # the folders it listed outside out are not known: this run's is below
        outside = {Path(p) for p in record.get("checkpoint_dirs") or []}
        if self.checkpoints is not None:  # checked: bound to out, or to none while out has a record
            outside.add(self.checkpoints)
        for folder in sorted(outside):
            if _bound_to(folder) not in (self.out, None):
                continue  # bound to another --out since
            for step in _step_dirs(folder):  # only troupe's: the folder is the user's
                shutil.rmtree(step)
            (folder / _BOUND).unlink(missing_ok=True)
        for name in sorted(self.owned - {_STATE}):
            path = self.out / name
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path)
            elif path.exists() or path.is_symlink():
                path.unlink()
        self.record_path.unlink(missing_ok=True)


def _completed(model: dict[str, Any]) -> dict[str, Any]:
    """A recorded ``[model]`` with this code's defaults for the fields it lacks (as read back
    from JSON): a troupe that kept only the keys ``[model]`` set recorded no other, and a field
    added since takes its default. One this code cannot build (a field it has not) is kept as
    recorded, and differs."""
    try:
        completed: dict[str, Any] = json.loads(json.dumps(dataclasses.asdict(WorldModelConfig(**model))))
    except (TypeError, ValueError):
        return model
    return completed


def _model_field(field: str, model: dict[str, Any]) -> str:
    """``model.<field>=<value>`` as the refusal names it; ``no model.<field>`` where there is none."""
    if field not in model:
        return f"no model.{field}"
    return f"model.{field}={json.dumps(model[field])}"


def _file_sha256(path: str | None) -> str | None:
    """The sha256 of the file at ``path``; None for none given, or one not readable (the run
    says why it cannot load it)."""
    if path is None or "{out}" in path:
        return None
    digest = hashlib.sha256()
    try:
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                digest.update(block)
    except OSError:
        return None
    return digest.hexdigest()


def _bound_to(checkpoints: Path) -> Path | None:
    """The ``--out`` a checkpoint folder outside it is bound to; None when it is bound to none."""
    marker = checkpoints / _BOUND
    try:
        data = json.loads(marker.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise ConfigError(
            f"train.checkpoint_dir {checkpoints}: {marker} cannot be read ({exc}); delete it to "
            "bind the folder to this run's --out"
        ) from None
    if not isinstance(data, dict) or data.get("format") != _FORMAT or not isinstance(data.get("out"), str):
        raise ConfigError(
            f"train.checkpoint_dir {checkpoints}: {marker} is damaged; delete it to bind the folder "
            "to this run's --out"
        )
    return Path(data["out"])


def _step_dirs(folder: Path) -> list[Path]:
    """The checkpoints' folders in ``folder``, oldest first."""
    try:
        entries = list(folder.iterdir())
    except (FileNotFoundError, NotADirectoryError):
        return []
    return sorted(p for p in entries if _STEP_DIR.fullmatch(p.name) and p.is_dir() and not p.is_symlink())
