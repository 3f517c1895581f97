"""What a pipeline run checks and prepares before anything starts: the config (a file's, or one
given with ``items`` changed), ``{out}`` without an ``out``, what ``out`` holds (``run_dir``'s
rules), and a run started by an import in one of troupe's processes.

Apart from ``runner`` because none of it starts anything: it reads the config and the output
directory (in a worker thread, as ``run_pipeline`` calls it) and says what the run will be.
"""

from __future__ import annotations

import os
import stat
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from troupe.runtime.core import process_role
from troupe.runtime.core.config_messages import validation_message
from troupe.runtime.errors import ConfigError
from troupe.runtime.file_owner import belongs_to, is_another_users

from .config import PipelineConfig, load_pipeline
from .run_dir import RunDir
from .run_fingerprint import fingerprint

__all__ = [
    "BOTH_FRESH_AND_RETRY",
    "EarlyCheck",
    "RunPlan",
    "check_early",
    "make_log_dir",
    "plan_run",
    "read_only_answer",
    "refuse_inside_an_import",
]

BOTH_FRESH_AND_RETRY = "--fresh runs every item anew, dead ones too: give --fresh or --retry-dead, not both"


@dataclass(frozen=True, slots=True)
class RunPlan:
    cfg: PipelineConfig  # as declared ({out} unresolved: what the run directory records)
    resolved: PipelineConfig
    out: Path | None
    run_dir: RunDir | None
    log_dir: Path
    complete: dict[str, Any] | None  # the record of a finished run whose outputs are all there


@dataclass(frozen=True, slots=True)
class EarlyCheck:
    cfg: PipelineConfig
    source: str  # where the pipeline came from, for errors
    finished: bool  # out holds a finished run of it: nothing will start
    # out cannot be written and holds a finished run of it: its record's ``complete`` entry,
    # the answer, with nothing taken or written there (``RunDir.answer_read_only``)
    answer: dict[str, Any] | None = None


def check_early(
    pipeline: PipelineConfig | str | os.PathLike[str],
    out: str | os.PathLike[str] | None,
    items: int | None,
    master: str | None,
    fresh: bool,
    retry_dead: bool = False,
) -> EarlyCheck:
    """What is checked before anything starts (a one-host run's template included): the config,
    and, changing nothing, what ``out`` holds. ``retry_dead``: a finished run with dead items is
    not finished (they run again). An ``out`` this process cannot write that holds a finished
    run of the pipeline is the answer (``answer``): its rerun writes nothing there."""
    if fresh and retry_dead:
        raise ConfigError(BOTH_FRESH_AND_RETRY)
    cfg = _as_config(pipeline, items)
    out_dir = None if out is None else Path(out).resolve()
    if out_dir is None:
        _check_no_out(cfg)
    finished = (
        out_dir is not None
        and master is None
        and RunDir(out_dir).finished(fingerprint(cfg), fresh)
        and not (retry_dead and RunDir(out_dir).dead_items() > 0)
    )
    answer = (
        None if out_dir is None or master is not None else read_only_answer(cfg, out_dir, fresh, retry_dead)
    )
    return EarlyCheck(cfg, _source(pipeline, cfg), finished or answer is not None, answer)


def read_only_answer(cfg: PipelineConfig, out: Path, fresh: bool, retry_dead: bool) -> dict[str, Any] | None:
    """Where this process cannot write ``out`` (a read-only archive): the ``complete`` entry of
    its record that answers a one-host rerun of ``cfg`` (``RunDir.answer_read_only``), which
    writes nothing there and takes no lock; None where the rerun would write (``fresh``, dead
    items with ``retry_dead``), and where ``out`` can be written."""
    if fresh:
        return None
    run = RunDir(out)
    answer = run.answer_read_only(fingerprint(cfg))
    if answer is not None and retry_dead and run.dead_items() > 0:
        return None  # they would run again: refused, as the folder cannot be written
    return answer


def plan_run(
    cfg: PipelineConfig,
    out: str | os.PathLike[str] | None,
    master: str | None,
    fresh: bool,
    retry_dead: bool = False,
) -> RunPlan:
    """Everything prepared before anything starts, once :func:`check_early` passed and the stage
    classes were checked: by a one-host run's template (``early_template``), or here for a run
    on a cluster (the classes whose module is here); a node reports a bad one it imports as
    the stage's failure. The plan's ``run_dir`` holds ``out`` (``RunDir.lock``): the run's
    master takes it over, or the caller releases it. ``retry_dead``: a finished run with dead
    items is not complete: its record's word is dropped, as the run will finalise again. A run
    that will make or finalise anything learns whether other troupe code made what the folder
    holds (``RunDir.check_code``); it records its own only once it may have made something
    (``RunDir.note_code``, ``first_output.py``)."""
    out_dir = None if out is None else Path(out).resolve()
    resolved = cfg if out_dir is None else cfg.with_out(out_dir)
    run_dir = RunDir(out_dir) if out_dir is not None and master is None else None
    complete = run_dir.prepare(fingerprint(cfg), fresh) if run_dir is not None else None
    if out_dir is not None and master is not None:  # held once the master took the run
        RunDir(out_dir).check_shared(fingerprint(cfg))
    if complete is not None and run_dir is not None and not run_dir.still_there(complete):
        complete = None  # finalised once, but its outputs are gone: finalise again
    if complete is not None and run_dir is not None and retry_dead and run_dir.dead_items():
        run_dir.forget_complete()  # a stop before the new finalisation must not find it complete
        complete = None
    if complete is None and run_dir is not None:  # the run makes or finalises something here
        run_dir.check_code()  # the runner says its line (other_code)
    log_dir = out_dir / "logs" if out_dir is not None else temp_log_dir()
    return RunPlan(cfg, resolved, out_dir, run_dir, log_dir, complete)


def temp_log_dir() -> Path:
    """Where a run without ``out`` logs: a folder of this user's own in the system temp directory.

    One folder for every user (``troupe-run-logs``) belonged to whoever made it first: another
    user could read this user's logs, put a link where its log file goes, or leave a record that
    had this user's node SIGKILL any process of theirs (report sh 6).
    """
    return Path(tempfile.gettempdir()) / f"troupe-run-logs-{os.geteuid()}"


def make_log_dir(log_dir: Path) -> None:
    """Make the run's log folder where missing; the temp one (:func:`temp_log_dir`) mode 0700,
    and refused unless it is a directory of this user's that no other user may write.

    Raises:
        ConfigError: the temp folder is not this user's own.
    """
    if log_dir != temp_log_dir():
        log_dir.mkdir(parents=True, exist_ok=True)
        return
    try:
        log_dir.mkdir(mode=0o700, exist_ok=True)
        st = log_dir.lstat()  # a link there is another's doing: not followed
    except OSError as exc:
        raise ConfigError(f"cannot make the log folder {log_dir} ({exc.strerror}); pass out=DIR") from None
    if stat.S_ISLNK(st.st_mode):
        problem = "it is a symbolic link"
    elif not stat.S_ISDIR(st.st_mode):
        problem = "it is not a directory"
    elif is_another_users(st):
        problem = belongs_to(st)
    elif st.st_mode & 0o022:
        problem = f"other users may write it (mode {stat.S_IMODE(st.st_mode):04o})"
    else:
        return
    raise ConfigError(
        f"run_pipeline without out logs to {log_dir}, but {problem}; remove it, or pass out=DIR"
    )


def _source(pipeline: PipelineConfig | str | os.PathLike[str], cfg: PipelineConfig) -> str:
    return str(pipeline) if not isinstance(pipeline, PipelineConfig) else f"pipeline {cfg.name}"


def _as_config(pipeline: PipelineConfig | str | os.PathLike[str], items: int | None) -> PipelineConfig:
    if isinstance(pipeline, PipelineConfig):
        if items is None:
            return pipeline
        data = pipeline.model_dump()
        data["items"] = items
        try:
            return PipelineConfig.model_validate(data)
        except ValidationError as exc:  # one line, as a file's: pydantic's own ran to four
            said = validation_message("run_pipeline(items=...)", exc, data, PipelineConfig)
            raise ConfigError(said) from None
    return load_pipeline(Path(pipeline), items=items)


def _check_no_out(cfg: PipelineConfig) -> None:
    for stage in cfg.stages:
        for key, value in stage.kwargs.items():
            if isinstance(value, str) and "{out}" in value:
                raise ConfigError(
                    f"stages.{stage.name}.kwargs.{key} uses {{out}}, but the run was given no out "
                    "directory; pass out=DIR (troupe run: --out DIR)"
                )


def refuse_inside_an_import() -> None:
    """A run started by a module's top-level code as a process of troupe's imports it (see
    ``core.process_role``): refused, before it starts processes that import the module again."""
    role, module = process_role.role(), process_role.importing_module()
    if role is not None and module is not None:
        raise ConfigError(
            f"a pipeline run was started as troupe's {role} process imported {module!r}: a "
            "module that holds stage classes runs its top-level code in every process that "
            "imports them, and each would start a run of its own; start the run under "
            '`if __name__ == "__main__":`, or from another module'
        )
