"""A pipeline run's output directory: what it was made with, so that a rerun resumes it.

``out/.troupe/run.json`` records the pipeline the directory was made with, in the terms that
decide what its episodes hold (``run_fingerprint.py``); once the run is complete, what the stages'
``finalize`` hooks returned and the outputs they wrote (``run_outputs.py``), and, for a run whose
items are a master's job (a cluster's), which job it finished: the master's, so a rerun asks it
(``completed_job``). It keeps which troupe code made what the directory holds (``made_by``,
``run_code``): a rerun under other code that makes or finalises anything there says so in one
line, and goes on; a run's code is recorded once it may have made something
(``first_output.py``), not as it is planned. The record and its copy are read and written by
``run_record.py``; the folder is held by ``run_dir_lock.py``'s lock.

Rules, checked before anything runs:

- a directory another run holds is refused, naming its pid: a run holds its directory from its
  checks (``RunDir.prepare``, before it reads or writes anything there) to its end, by the lock
  of its journal, which its master takes over (``RunDir.lock``);
- a new or empty directory (or one holding only ``logs/``) starts a run;
- a directory with a record resumes it when the pipeline is the same, and is refused, naming
  the first field that differs, when it is not; kwargs a stage's finalize hook named as its
  alone (``StageActor.finalize_kwargs``, kept in the record's ``finalize_only``) are not
  compared: changed, they are recorded, and the run finalises again;
- the pipeline is also kept beside the record, in ``.troupe/made_with.json`` (written with it,
  never changed after): a record deleted or damaged is rebuilt from that copy where the
  pipeline is the same (``recovered``), and refused, naming the first field that differs, where
  it is not. A record lost was a licence to mix: the folder was taken for whatever pipeline
  the next command gave, its committed outputs kept beside the new ones (report up 1);
- a directory with ``.troupe/`` but neither a record nor its copy is taken for this run's only
  where it holds no output (``adopted``: a run that failed as it started); one that holds
  outputs is refused with ``--fresh``, as nothing says what they were made with;
- a directory inside what another run's folder holds for troupe (its ``.troupe/``, ``data/``,
  ``videos/``, ``meta/``, ``logs/``) is refused: that run's ``--fresh`` would delete it;
- anything else is someone else's directory (troupe would write ``data/``, ``videos/`` and
  ``meta/`` there and remove files under them it did not write): refused.

``--fresh`` deletes what troupe wrote (``.troupe/``, ``logs/``, and the dataset entries
``data/``, ``videos/``, ``meta/``) in a directory troupe made (it has ``.troupe/``), leaves every
other file alone, and starts anew; in any other directory it deletes nothing and the rules
above apply. Outputs a stage keeps elsewhere are the stage's own: its ``start`` hook is told
``fresh`` and drops them.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

from troupe.runtime.errors import ConfigError
from troupe.runtime.tasks.journal_lock import JournalLock, lock_path

from .run_code import code_line
from .run_dir_lock import held_by_another, hold, in_use_message
from .run_dir_read_only import cannot_write, found_here, held_read_only
from .run_fingerprint import finalize_only, first_difference, well_formed, without_finalize_only
from .run_outputs import finals_outputs, output_stats, still_there
from .run_record import RunRecord

__all__ = ["TROUPE_ENTRIES", "RunDir"]

TROUPE_ENTRIES = frozenset({".troupe", "data", "videos", "meta", "logs"})
"""The entries of an output directory that troupe writes; nothing else is ever deleted."""

# A master-fed run cannot start anew with --fresh (the master's job keeps its items' outcomes).
_FRESH_ADVICE = "use --fresh to start anew"  # a one-host run's way out of another pipeline's folder
_SHARED_ADVICE = "give another --out, or delete the folder to start anew"


class RunDir:
    """The output directory of ``troupe run``.

    Args:
        out: the directory (``--out``); it need not exist yet.
    """

    def __init__(self, out: Path) -> None:
        self.out = out
        self.state_dir = out / ".troupe"
        self._record = RunRecord(out, self.state_dir)  # the record and its copy
        self.record_path = self._record.path
        self.copy_path = self._record.copy_path
        self.journal_path = self.state_dir / "journal.db"
        # Set by prepare: the folder held a run that made nothing, and no record of it: this
        # run's pipeline is recorded as the folder's.
        self.adopted = False
        # Set by prepare: the record was "missing" or "damaged", and was rebuilt from its copy,
        # which names this run's pipeline.
        self.recovered: str | None = None
        # Set by check_code: the line saying that other troupe code made what the folder holds.
        self.other_code: str | None = None
        self._lock: JournalLock | None = None  # the journal's, held from prepare on (see lock)

    @property
    def lock(self) -> JournalLock | None:
        """The journal's lock while this object holds the folder: taken as :meth:`prepare`
        checks it, before it reads or writes anything there, and held until the run's master
        takes it over with the journal (``open_run_journal``), whose close frees it, or until
        :meth:`release`. A second run is refused from the check on, naming this one; it had
        only probed the lock, and two runs started together both passed before either master
        held it (one of them then recorded its pipeline over the other's dataset). None when
        not held."""
        return self._lock if self._lock is not None and self._lock.held else None

    def release(self) -> None:
        """Free the folder for another run, where the lock was not taken over since (a run that
        failed or was stopped before its master started). Releasing twice is fine."""
        lock, self._lock = self._lock, None
        if lock is not None:
            lock.release()

    def prepare(self, made_with: dict[str, Any], fresh: bool) -> dict[str, Any] | None:
        """Check the directory against this run, start it anew or record it, and hold it
        (:attr:`lock`, until the run's master takes it over or :meth:`release`).

        Args:
            made_with: this run's ``fingerprint``.
            fresh: ``--fresh``: delete what troupe wrote here first.

        Returns:
            The record's ``complete`` entry (``{"finals": {stage: summary}}``) when the
            directory holds a finished run of this pipeline, else None.

        Raises:
            ConfigError: the directory was made with another pipeline, by an older troupe, or
                holds someone else's files; or a run is using it right now.
        """
        self._not_inside_a_run()
        troupes_own = self.state_dir.is_dir()  # only a directory troupe made is wiped
        if not troupes_own:
            self._check_new()  # someone else's is refused before .troupe/ (the lock's) is made there
        self._hold()
        try:
            return self._prepare(made_with, fresh and troupes_own)
        except BaseException:
            self.release()
            raise

    def _prepare(self, made_with: dict[str, Any], wipe: bool) -> dict[str, Any] | None:
        """:meth:`prepare`, the folder held."""
        if lock_path(self.record_path).exists():  # a run whose items come from a master
            problem = held_by_another(self.record_path, self.out, "troupe run")
            if problem is not None:
                raise ConfigError(problem)
        if wipe:
            self._wipe()
        record, lost = self._record.readable()
        if record is None:
            if not wipe:  # what --fresh left is the user's own: it stays, and troupe's goes on
                self._check_new()
                self._refuse_unconfirmed(lost)
            self._record.start(made_with)
            return None
        if self._binds_nothing(record, made_with):
            self._drop_journal()  # its items were the other pipeline's
            self._record.start(made_with)
            return None
        self._check_same(record, made_with)
        if lost is not None:  # rebuilt from its copy, which names this pipeline
            self._record.write(record)
            self.recovered = lost
        self._record.keep_copy(record)
        self._take_finalize_kwargs(record, made_with)
        complete = record.get("complete")
        return complete if isinstance(complete, dict) else None

    def unadopt(self) -> None:
        """Take back the record :meth:`prepare` wrote for a folder it adopted (``adopted``), for a
        run that failed before anything ran (its master's job was made with other items, say):
        the folder is as it was, and the command that matches its job adopts it then."""
        if self.adopted:
            self.record_path.unlink(missing_ok=True)
            self.copy_path.unlink(missing_ok=True)
            self.adopted = False

    def _hold(self) -> None:
        if self.lock is None:
            self.state_dir.mkdir(parents=True, exist_ok=True)
            self._lock = hold(self.journal_path, self.out, "troupe run")

    def check(self, made_with: dict[str, Any], fresh: bool) -> None:
        """What :meth:`prepare` would refuse, refused without changing anything.

        Raises:
            ConfigError: as :meth:`prepare`.
        """
        self._not_in_use()
        if fresh and self.state_dir.is_dir():
            return  # it will be wiped
        record, lost = self._record.readable()
        if record is None:
            self._check_new()
            self._refuse_unconfirmed(lost)
            return
        if not self._binds_nothing(record, made_with):
            self._check_same(record, made_with)

    def recorded(self) -> dict[str, Any] | None:
        """The pipeline (``fingerprint``) the run recorded here was made with; None where
        there is no record, or where its run made nothing (the record binds nothing then).

        Raises:
            ConfigError: the record is damaged.
        """
        record, _ = self._record.readable()
        if record is None or self._made_nothing():
            return None
        pipeline = record.get("pipeline")
        return pipeline if isinstance(pipeline, dict) else {}

    def finished(self, made_with: dict[str, Any], fresh: bool) -> bool:
        """Whether :meth:`prepare` would answer with a finished run whose outputs are all there;
        what it would refuse, refused (:meth:`check`). Changes nothing."""
        self.check(made_with, fresh)
        record = None if fresh else self._record.readable()[0]
        complete = record.get("complete") if record is not None else None
        as_made = record is not None and first_difference(record.get("pipeline", {}), made_with) is None
        return isinstance(complete, dict) and self.still_there(complete) and as_made

    def is_complete(self) -> bool:
        """A run finished here, its outputs still as it wrote them (whatever it was made with)."""
        return self.completed() is not None

    def completed(self) -> dict[str, Any] | None:
        """The record's ``complete`` entry (as :meth:`prepare` answers it) when a run finished
        here and its outputs are still as it wrote them; None otherwise. The record is written
        as the finalize hooks return, so this also tells whether a run stopped by a signal had
        finished first."""
        record = self._record.read()
        complete = record.get("complete") if record is not None else None
        return complete if isinstance(complete, dict) and self.still_there(complete) else None

    def mark_complete(
        self,
        finals: dict[str, Any],
        made_nothing: bool = False,
        items: dict[str, int] | None = None,
        job: dict[str, Any] | None = None,
    ) -> None:
        """Record that every item has its outcome and the stages finalised (``finals``: what
        their ``finalize`` hooks returned; ``made_nothing``: every item died; ``items``: the
        job's items by how they ended, every run's, for a rerun that finds it complete;
        ``job``: for a run whose items came from a master, the job it ran, as
        :meth:`completed_job` is asked)."""
        record = self._record.read() or {}
        only = finalize_only(finals)
        if only:
            record["finalize_only"] = only
        record["complete"] = {
            "finals": finals,
            "out": str(self.out),
            "made_nothing": made_nothing,
            "items": items or {},
            "stats": output_stats(finals),
            **({"job": job} if job is not None else {}),
        }
        self._record.write(record, "recording the finished run", "(what the run committed stays)")

    def completed_job(self, job: dict[str, Any]) -> dict[str, Any] | None:
        """For a run whose items come from a master: the record's ``complete`` entry when a run
        of the master's job ``job`` (its id and submission time) finished here, its outputs
        still as it wrote them; None otherwise. The job is the master's, so a record of another
        job (one made anew under the same name, by a master that lost its journal) says nothing
        of this one's items."""
        complete = self.completed()
        return complete if complete is not None and complete.get("job") == job else None

    def check_code(self) -> str | None:
        """The line to say, as a run that will make or finalise something here begins, where
        the code that made what the folder holds last is another than this process's (also
        kept in :attr:`other_code`), else None. Nothing is recorded: :meth:`note_code` is, once
        the run may have made something."""
        record = self._record.read()
        if record is None:
            return None
        _, self.other_code = code_line(record.get("made_by"), self.out, "what this run makes there")
        return self.other_code

    def note_code(self) -> None:
        """Record this process's troupe code as one that made outputs here (``made_by``, see
        ``run_code``), as the run may first have made something: before it first hands an item
        to its last stage, or finalises (``first_output.py``). Noted as it was planned, a run
        stopped before it made anything stood there as one that had, and every later run said
        the folder mixed both codes (report rg 6). The record is written only where the code is
        not its last entry already."""
        record = self._record.read()
        if record is None:
            return
        made_by, _ = code_line(record.get("made_by"), self.out, "what this run makes there")
        if made_by != record.get("made_by"):
            doing = "recording the troupe code that makes outputs here"
            self._record.write({**record, "made_by": made_by}, doing, "(what the run committed stays)")

    def dead_items(self) -> int:
        """How many items the finished run recorded here ended dead (0: none, or no finished run)."""
        record = self._record.read()
        complete = record.get("complete") if record is not None else None
        items = complete.get("items") if isinstance(complete, dict) else None
        dead = items.get("dead", 0) if isinstance(items, dict) else 0
        return dead if type(dead) is int and dead > 0 else 0

    def forget_complete(self) -> None:
        """Drop the record's word that a run finished here, as a run that will finalise again
        begins: until it does, the directory is not complete (a stop meanwhile must not find a
        completion that an earlier job's run recorded)."""
        record = self._record.read()
        if record is not None and record.get("complete") is not None:
            record["complete"] = None
            self._record.write(record)

    def still_there(self, complete: dict[str, Any]) -> bool:
        """Whether the finished run's outputs are still as it wrote them, in this directory
        (``run_outputs.still_there``)."""
        return still_there(complete, self.out)

    def answer_read_only(self, made_with: dict[str, Any]) -> dict[str, Any] | None:
        """Where this process cannot write the directory (a read-only mount, an archive): the
        record's ``complete`` entry, as :meth:`prepare` answers it, when a run of this pipeline
        finished here and its outputs are all as it recorded them (``run_dir_read_only``:
        mounted or copied here since, they are found under this folder, which the entry then
        names). None otherwise, and where it can be written (a rerun holds it, as always)."""
        if not cannot_write(self.state_dir):
            return None
        try:
            record = self._record.read()
        except ConfigError:  # damaged, or unreadable: refused as ever
            return None
        if record is None:
            return None
        pipeline = record.get("pipeline")
        if not isinstance(pipeline, dict) or not well_formed(pipeline):
            return None
        if first_difference(pipeline, made_with) is not None:
            return None
        complete = record.get("complete")
        if not isinstance(complete, dict) or not isinstance(complete.get("finals"), dict):
            return None  # not finished: the run would write
        outputs = finals_outputs(complete["finals"])
        return None if outputs is None else found_here(complete, outputs, self.out)

    def in_use_problem(self) -> str | None:
        """Why this directory cannot be run into now (another run holds it), or None."""
        if cannot_write(self.state_dir):  # its locks cannot be taken: looked at without writing
            holders = [t for t in (self.journal_path, self.record_path) if held_read_only(t)]
            return in_use_message(holders[0], self.out, "troupe run") if holders else None
        # Its lock file without a journal: a run that holds the folder until its master starts.
        held = self.journal_path.exists() or lock_path(self.journal_path).exists()
        if held and self.lock is None:  # held here: by this run, not another
            problem = held_by_another(self.journal_path, self.out, "troupe run")
            if problem is not None:
                return problem
        if lock_path(self.record_path).exists():  # a run whose items come from a master
            return held_by_another(self.record_path, self.out, "troupe run")
        return None

    def check_shared(self, made_with: dict[str, Any]) -> None:
        """For a run whose items come from a master (a cluster's, or ``master=``), which keeps
        no journal here: what :meth:`take_shared` would refuse, refused without changing
        anything. Such runs were not refused at all: another pipeline wrote its episodes into
        this one's store, and neither could finalise the dataset again.

        Raises:
            ConfigError: as :meth:`check`: inside another run's folder, made with another
                pipeline, or in use by another run.
        """
        self._not_in_use()
        record, lost = self._record.readable()
        if record is None:
            self._refuse_unconfirmed(lost, _SHARED_ADVICE)
        elif not self._made_nothing():
            self._check_same(record, made_with, _SHARED_ADVICE)

    def take_shared(self, made_with: dict[str, Any]) -> JournalLock:
        """Hold this directory for a run whose items come from a master, one run at a time
        (until the lock is released), and record its pipeline where none is recorded.

        Raises:
            ConfigError: another run holds it, or it was made with another pipeline.
        """
        self.state_dir.mkdir(parents=True, exist_ok=True)
        lock = hold(self.record_path, self.out, "troupe run")
        try:
            record, lost = self._record.readable()
            if record is None:
                self._refuse_unconfirmed(lost, _SHARED_ADVICE)
            # Another pipeline's run that failed at its start: no matter. The same pipeline's
            # record stays, its word that a run finished here with it (stages that write
            # nothing here leave a folder as bare as a failed start's).
            if record is None or self._binds_nothing(record, made_with):
                self._record.start(made_with)
            else:
                self._check_same(record, made_with, _SHARED_ADVICE)
                if lost is not None:
                    self._record.write(record)
                self._record.keep_copy(record)
                self._take_finalize_kwargs(record, made_with)
        except BaseException:
            lock.release()
            raise
        return lock

    # -- private ----------------------------------------------------------------------------

    def _not_in_use(self) -> None:
        self._not_inside_a_run()
        problem = self.in_use_problem()
        if problem is not None:
            raise ConfigError(problem)

    def _not_inside_a_run(self) -> None:
        """An output folder inside one that troupe owns in another run's folder (its
        ``.troupe/``, ``data/``...): that run's ``--fresh`` or finalize would delete it."""
        for inner in (self.out, *self.out.parents):
            outer = inner.parent
            if inner.name in TROUPE_ENTRIES and _holds_a_run(outer):
                raise ConfigError(
                    f"--out {self.out} is inside {inner}, which the run in {outer} owns (its "
                    "--fresh or finalize would delete it); give a folder outside it"
                )

    def _take_finalize_kwargs(self, record: dict[str, Any], made_with: dict[str, Any]) -> None:
        """Record this run's pipeline where it differs from the record's in kwargs only a
        ``finalize`` hook reads (``StageActor.finalize_kwargs``, as :meth:`_check_same` let it
        pass), and drop the record's word that a run finished: the run finalises again, with
        them (a writer's ``robot_type`` changed was refused, its episodes pinned by it)."""
        if first_difference(record.get("pipeline", {}), made_with) is None:
            return
        record["pipeline"], record["complete"] = made_with, None
        self._record.write(record)

    def _check_same(
        self, record: dict[str, Any], made_with: dict[str, Any], advice: str = _FRESH_ADVICE
    ) -> None:
        only = record.get("finalize_only")
        diff = first_difference(
            without_finalize_only(record.get("pipeline", {}), only), without_finalize_only(made_with, only)
        )
        if diff is not None and advice == _FRESH_ADVICE and "stage." in diff[0].partition("=")[0]:
            # A stage's actor or kwargs, compared as written: one that only tunes (render's
            # threads) is refused too, as troupe cannot tell it from one that changes the outputs.
            advice = (
                "run it with the stages as they were to resume it; --fresh starts anew, making "
                "every item again"
            )
        if diff is not None and diff[0].startswith("name="):  # another pipeline: its file forgotten?
            held = f"it holds the pipeline {diff[0][5:]!r}: give its file, `troupe run PIPELINE.toml`"
            advice = (
                f"{held}, to resume it, or another --out; --fresh would delete what it made"
                if advice == _FRESH_ADVICE
                else f"{held}, to resume it; or {advice}"
            )
        if diff is not None:
            raise ConfigError(f"--out {self.out} was made with {diff[0]}, this run asks {diff[1]} ({advice})")

    def _binds_nothing(self, record: dict[str, Any], made_with: dict[str, Any]) -> bool:
        """Whether a record of another pipeline is no reason to refuse this one: its run made
        nothing (it failed as it started: a port taken, a stage's bad kwarg), so the same
        command with its mistake put right takes the folder (it had been refused there as made
        with the mistake)."""
        return first_difference(record.get("pipeline", {}), made_with) is not None and self._made_nothing()

    def _locks(self) -> set[Path]:
        """The lock files of this folder's journal and record, real paths (symlinks resolved)."""
        return {lock_path(self.record_path), lock_path(self.journal_path)}

    def _journal_files(self) -> list[Path]:
        return [self.journal_path.with_name(self.journal_path.name + s) for s in ("", "-wal", "-shm")]

    def _drop_journal(self) -> None:
        for path in self._journal_files():
            path.unlink(missing_ok=True)

    def _made_nothing(self) -> bool:
        """Whether this directory holds only a run's record, journal and logs (a run that failed
        as it started, a stage class misspelt, say): its record binds nothing then. The
        folders a store stage made as it started (``.troupe/episodes/committed``, empty) are
        nothing: a file anywhere else is something."""
        own = {self.record_path, self.copy_path, *self._journal_files()}
        locks = self._locks()
        try:
            for path in self.out.rglob("*"):
                if path.is_dir() and not path.is_symlink():
                    continue
                if path in own or Path(os.path.realpath(path)) in locks:
                    continue
                if path.relative_to(self.out).parts[0] == "logs":
                    continue
                return False
        except OSError:
            return False
        return True

    def _refuse_unconfirmed(self, lost: str | None, advice: str = "use --fresh to start anew") -> None:
        """Refuse a folder whose record is ``lost`` (and its copy with it) where it holds
        outputs: nothing says what they were made with, and this run would mix its own with
        them. One that holds none (a run that failed as it started) is this run's."""
        if lost is None or self._made_nothing():
            return
        self.adopted = False
        what = "is damaged" if lost == "damaged" else "is gone"
        raise ConfigError(
            f"--out {self.out}: its record {self.record_path} {what}, and so is {self.copy_path.name} "
            "beside it: nothing says what the outputs there were made with, and this run would "
            f"mix its own with them; put the record back, or {advice} (what it holds is made again)"
        )

    def _check_new(self) -> None:
        try:
            entries = sorted(p.name for p in self.out.iterdir())
        except FileNotFoundError:
            return
        except NotADirectoryError:
            raise ConfigError(f"--out {self.out} is a file; give a directory") from None
        if set(entries) <= {"logs"}:
            return
        if ".troupe" in entries and set(entries) <= TROUPE_ENTRIES:
            # Its record deleted: this run's pipeline is taken for its own. A .troupe/ that holds
            # only locks was made as a run took the folder (this one, say): it held no run.
            self.adopted = not set(entries) <= {".troupe", "logs"} or not self._only_locks()
            return
        foreign = [e for e in entries if e not in TROUPE_ENTRIES] or [e for e in entries if e != "logs"]
        if ".troupe-train" in entries:  # a training run's: the way out is the same, the words not
            raise ConfigError(
                f"--out {self.out} is a training run's folder (it holds '.troupe-train'); give a data "
                "generation run a new or empty directory"
            )
        raise ConfigError(
            f"--out {self.out} holds {foreign[0]!r}, which no troupe run wrote; give a "
            "new or empty directory (troupe owns data/, videos/ and meta/ there)"
        )

    def _only_locks(self) -> bool:
        try:
            return all(Path(os.path.realpath(p)) in self._locks() for p in self.state_dir.iterdir())
        except OSError:
            return False

    def _wipe(self) -> None:
        # The state directory last, and never itself: a wipe stopped halfway (a file it may not
        # remove, a kill) leaves a directory troupe still knows for its own, which --fresh wipes
        # again. Its lock files stay: this run holds the journal's, and one deleted would let
        # another run lock a new file of that name while this one holds the old.
        for name in sorted(TROUPE_ENTRIES - {self.state_dir.name}):
            self._remove(self.out / name)
        locks = self._locks()
        for path in sorted(self.state_dir.iterdir()):
            if Path(os.path.realpath(path)) not in locks:
                self._remove(path)

    def _remove(self, path: Path) -> None:
        try:
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path)
            elif path.exists() or path.is_symlink():
                path.unlink()
        except OSError as exc:
            where = exc.filename or path
            raise ConfigError(
                f"--fresh: cannot remove {where} from --out {self.out} ({exc.strerror or exc}); "
                "fix its permissions (or its immutable flag: lsattr, chattr -i) and run again"
            ) from None


def _holds_a_run(folder: Path) -> bool:
    run = RunDir(folder)
    return run.record_path.is_file() or run.journal_path.is_file()
