"""A run folder's record, ``.troupe/run.json``, and its copy beside it, ``.troupe/made_with.json``.

The record keeps the pipeline the folder was made with (``run_fingerprint.py``), the troupe code
that made what it holds (``made_by``, ``run_code.py``), and, once the stages' ``finalize`` hooks
returned, the finished run (``complete``, ``RunDir.mark_complete``). The copy keeps the pipeline
and the code that began the folder, written as a run starts and never changed after: a record
deleted or damaged is rebuilt from it (:meth:`RunRecord.readable`), for ``RunDir`` to take where
the pipeline is the same. A record a newer troupe wrote is not damaged but another's: refused,
with the way back (:func:`read_record`). Both are written atomically (:func:`write_record`); a
training's folder keeps its own record with the same two (``train_dir``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from troupe.runtime.errors import ConfigError
from troupe.runtime.tasks.output_store import as_commit_error, atomic_file

from .run_code import this_code
from .run_fingerprint import well_formed

__all__ = ["RunRecord", "read_record", "write_record"]

_FORMAT = 1
_COPY_NAME = "made_with.json"  # the pipeline, kept beside the record (see the module docstring)


def read_record(path: Path, out: Path, version: int, what: str) -> dict[str, Any] | None:
    """The JSON record at ``path`` of the output folder ``out``; None when there is none.

    Raises:
        ConfigError: it cannot be read, or is not a record of format ``version`` (``what`` names
            it in the message, which says to start anew with --fresh).
    """
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise ConfigError(f"--out {out}: cannot read {path}: {exc.strerror}") from None
    try:
        record = json.loads(text)
    except ValueError:
        record = None
    newer = _newer_format(record, version)
    if newer is not None:  # not damaged: a newer troupe's, after a downgrade
        raise ConfigError(
            f"--out {out}: {path} was written by a newer troupe (its format {newer}; this troupe "
            f"reads {version}): run it with that troupe, or use --fresh to start anew with this one"
        )
    if not isinstance(record, dict) or record.get("format") != version:
        # Not "delete it": the folder was then taken for whatever the next command gave, its
        # outputs kept beside the new ones (a run folder rebuilds its record itself, RunDir).
        raise ConfigError(
            f"--out {out}: {path} is damaged or not a {what} this troupe reads; put back a copy "
            "of it, or use --fresh to start anew (what the folder holds is made again)"
        )
    return record


def _newer_format(record: Any, version: int) -> int | None:
    """The format of a record a newer troupe wrote (above ``version``); None for any other."""
    found = record.get("format") if isinstance(record, dict) else None
    return found if type(found) is int and found > version else None


def write_record(path: Path, record: dict[str, Any]) -> None:
    """Write ``record`` to ``path`` as JSON, atomically (a reader sees the old or the new one)."""
    with atomic_file(path) as tmp:
        tmp.write_text(json.dumps(record, indent=2, sort_keys=True) + "\n", encoding="utf-8")


class RunRecord:
    """The record of the run folder ``out`` and its copy, in ``state_dir`` (its ``.troupe/``)."""

    def __init__(self, out: Path, state_dir: Path) -> None:
        self.out = out
        self.state_dir = state_dir
        self.path = state_dir / "run.json"
        self.copy_path = state_dir / _COPY_NAME

    def read(self) -> dict[str, Any] | None:
        """The record; None where there is none (:func:`read_record`'s refusals raised)."""
        return read_record(self.path, self.out, _FORMAT, "run record")

    def read_or_lost(self) -> tuple[dict[str, Any] | None, str]:
        """The record, or None and why: ``missing``, or ``damaged`` (not JSON, not a record, its
        pipeline's fields missing or of other types).

        Raises:
            ConfigError: it cannot be read (no permission, a directory in its place), or a newer
                troupe wrote it.
        """
        try:
            record = self.read()
        except ConfigError:
            if not _can_read(self.path) or _by_a_newer_troupe(self.path):  # not damaged
                raise
            return None, "damaged"
        if record is not None and not well_formed(record.get("pipeline")):
            return None, "damaged"
        return record, "missing"

    def write(
        self,
        record: dict[str, Any],
        doing: str = "recording the run",
        kept: str = "",
        path: Path | None = None,
    ) -> None:
        """Write the record (or its copy, at ``path``); a disk that takes nothing (full, or
        read-only since the command's checks) is said in one line, ``kept``: what the run made
        that stays."""
        path = self.path if path is None else path
        try:
            write_record(path, record)
        except OSError as exc:
            raise as_commit_error(
                exc,
                action=f"{doing} in {path}",
                root=self.state_dir,
                retry=f"run the same command again{' ' + kept if kept else ''}",
            ) from exc

    def start(self, made_with: dict[str, Any]) -> None:
        """Record the pipeline a run starts with, and keep its copy with the troupe code that
        starts it. The record's ``made_by`` starts empty: nothing is made here yet, and the
        code is recorded once the run may have made something (``RunDir.note_code``)."""
        record = {"format": _FORMAT, "pipeline": made_with, "complete": None, "made_by": []}
        self.write(record)
        self.keep_copy({**record, "made_by": [this_code()]}, anew=True)

    def keep_copy(self, record: dict[str, Any], anew: bool = False) -> None:
        """Keep the record's pipeline, and the code that began the folder, in its copy
        (``made_with.json``): ``anew`` as a run starts, else only where there is none (a folder
        recorded before troupe kept one)."""
        if not anew and self.copy_path.exists():
            return
        copy = {"format": _FORMAT, "pipeline": record.get("pipeline", {})}
        began = record.get("made_by")
        if isinstance(began, list) and began:
            copy["made_by"] = began[:1]
        self.write(copy, path=self.copy_path)

    def readable(self) -> tuple[dict[str, Any] | None, str | None]:
        """The record, and where it is ``missing`` or ``damaged``, which: then a record rebuilt
        from its copy (its pipeline, nothing complete: the run finalises again), or None where
        the copy cannot be read either (or there is none).

        Raises:
            ConfigError: the record (or its copy) is another troupe's (a newer format).
        """
        record, lost = self.read_or_lost()
        if record is not None:
            return record, None
        try:
            copy = read_record(self.copy_path, self.out, _FORMAT, "copy of the run's pipeline")
        except ConfigError:
            if _by_a_newer_troupe(self.copy_path):
                raise
            copy = None
        if copy is None or not well_formed(copy.get("pipeline")):
            return None, lost if self.state_dir.is_dir() else None
        rebuilt = {"format": _FORMAT, "pipeline": copy["pipeline"], "complete": None}
        if "made_by" in copy:  # the code that began it; any that went on since is not known
            rebuilt["made_by"] = copy["made_by"]
        return rebuilt, lost


def _by_a_newer_troupe(path: Path) -> bool:
    """Whether the record at ``path`` is of a newer troupe's format (not damaged: another's)."""
    try:
        return _newer_format(json.loads(path.read_text(encoding="utf-8")), _FORMAT) is not None
    except (OSError, ValueError):
        return False


def _can_read(path: Path) -> bool:
    try:
        path.read_bytes()
    except OSError:
        return False
    return True
