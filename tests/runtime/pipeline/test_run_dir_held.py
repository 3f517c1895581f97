"""A `troupe run` holds its output folder from its checks until its master takes the journal
over: a second run into it is refused, naming the first, before it reads or writes anything.

Two runs started together both passed the check (it only probed the journal's lock, which the
master took later): one recorded its pipeline over the other's dataset, which a rerun then took
for complete. Here the first run's hold is the lock itself (flock: two open files conflict in
one process as in two), so nothing waits on timing.
"""

from __future__ import annotations

import os
import textwrap
from pathlib import Path

import pytest

from support.held_in_child import held_in_child
from troupe.actors.datagen.config import default_pipeline
from troupe.runtime.errors import ConfigError
from troupe.runtime.pipeline import runner
from troupe.runtime.pipeline.run_dir import RunDir
from troupe.runtime.pipeline.run_fingerprint import fingerprint
from troupe.runtime.pipeline.run_journal import open_run_journal
from troupe.runtime.pipeline.runner import run_pipeline_sync
from troupe.runtime.tasks.journal_lock import JournalLock

HANG_GUARD_S = 60  # a bound on a hang, never on speed


def _made_with(**overrides: object) -> dict[str, object]:
    return fingerprint(default_pipeline(**overrides))


def _in_use(out: Path, pid: int) -> str:
    return f"--out {out} is in use by another troupe run \\(pid {pid}\\)"


def test_a_second_run_is_refused_while_the_first_holds_the_folder_before_its_record(
    tmp_path: Path,
) -> None:
    """The race the check lost: the first run holds the folder, its record not written yet (a
    `.troupe/` with no `run.json`); the second is refused naming it, and neither adopts the
    folder nor writes a record (it took the folder for a run whose record was deleted)."""
    out = tmp_path / "out"
    second = RunDir(out)
    (out / ".troupe").mkdir(parents=True)
    first = JournalLock.acquire(second.journal_path)  # as the first run holds it from its check on
    try:
        for fresh in (False, True):
            with pytest.raises(ConfigError, match=_in_use(out, os.getpid())):
                second.prepare(_made_with(items=8), fresh=fresh)
            with pytest.raises(ConfigError, match=_in_use(out, os.getpid())):
                second.check(_made_with(items=8), fresh=fresh)  # and the checks before the start
        assert second.in_use_problem() is not None  # what `troupe run` checks first
        assert not second.record_path.exists() and not second.adopted and second.lock is None
    finally:
        first.release()
    assert second.prepare(_made_with(items=8), fresh=False) is None  # the first ended: its turn
    assert second.record_path.is_file() and not second.adopted  # a .troupe/ of locks held no run
    second.release()


def test_a_prepared_run_holds_its_folder_until_it_releases_it(tmp_path: Path) -> None:
    """From prepare on, another run is refused and the record left as it was (not rewritten,
    not wiped by its --fresh); a refused prepare holds nothing, and a release frees the folder."""
    out = tmp_path / "out"
    first = RunDir(out)
    assert first.prepare(_made_with(items=16), fresh=False) is None
    assert first.lock is not None
    (out / "data").mkdir()  # it made something: its record binds
    (out / "data" / "file-000.parquet").write_bytes(b"PAR1")
    recorded = first.record_path.read_bytes()
    stat = first.record_path.stat()
    second = RunDir(out)
    for made, fresh in (
        (_made_with(items=16), False),
        (_made_with(items=8), False),
        (_made_with(items=8), True),
    ):
        with pytest.raises(ConfigError, match=_in_use(out, os.getpid())):
            second.prepare(made, fresh=fresh)
        assert second.lock is None
    assert first.record_path.read_bytes() == recorded
    assert first.record_path.stat().st_mtime_ns == stat.st_mtime_ns
    first.check(_made_with(items=16), fresh=False)  # its own hold is no other run's
    assert first.prepare(_made_with(items=16), fresh=False) is None  # nor is it again

    first.release()
    first.release()  # twice is fine
    with pytest.raises(ConfigError, match="was made with items=16, this run asks items=8"):
        second.prepare(_made_with(items=8), fresh=False)
    assert second.lock is None  # refused: it holds nothing
    JournalLock.acquire(second.journal_path).release()


def test_the_run_s_master_takes_the_held_lock_over_with_its_journal(tmp_path: Path) -> None:
    """The master of a one-host run runs in the run's process: its journal takes the lock the
    run holds (taking it again would be refused by that very hold), the folder stays held while
    the journal is open, and its close frees it."""
    out = tmp_path / "out"
    run = RunDir(out)
    run.prepare(_made_with(items=8), fresh=False)
    held = run.lock
    journal, _book = open_run_journal(run.journal_path, None, held)
    try:
        with pytest.raises(ConfigError, match=_in_use(out, os.getpid())):
            RunDir(out).prepare(_made_with(items=8), fresh=False)
        assert run.lock is held
    finally:
        journal.close()
    assert run.lock is None  # freed with the journal: the run's release is a no-op now
    run.release()
    again = RunDir(out)
    assert again.prepare(_made_with(items=8), fresh=False) is None
    again.release()


def test_a_run_stopped_before_its_master_started_frees_its_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run that ends between its checks and its master's start (here its log folder cannot be
    made, just after the run took the folder over) frees the folder, even while its error, and
    the frames it holds, are kept. (A callback that raises no longer stops the run where it is
    called, but at the run's next await, as Ctrl-C does: by then the master starts.)"""
    out = tmp_path / "out"
    (out / ".troupe" / "episodes" / "committed").mkdir(parents=True)

    def refused(log_dir: Path) -> None:
        raise PermissionError(f"stopped at: making {log_dir}")

    monkeypatch.setattr(runner, "make_log_dir", refused)
    adopted: list[str] = []
    with pytest.raises(PermissionError, match=r"stopped at: making .*logs") as info:
        # A running node: no template to start; the run stops before it is asked anything.
        run_pipeline_sync(default_pipeline(items=2), out, node="tcp://127.0.0.1:9", on_event=adopted.append)
    assert info.value is not None  # kept: its traceback holds the run's frames
    assert "held a run that made nothing, and no record" in adopted[0]
    assert (out / ".troupe" / "run.json").is_file()
    JournalLock.acquire(out / ".troupe" / "journal.db").release()


_HOLDER = textwrap.dedent(
    """
    import sys
    from pathlib import Path

    from troupe.actors.datagen.config import default_pipeline
    from troupe.runtime.pipeline.run_dir import RunDir
    from troupe.runtime.pipeline.run_fingerprint import fingerprint

    run = RunDir(Path(sys.argv[1]))
    run.prepare(fingerprint(default_pipeline(items=16)), fresh=False)
    print("held", flush=True)
    sys.stdin.read()  # held until the test closes its stdin (or the process dies)
    """
)


def test_a_run_in_another_process_is_named_by_its_pid(tmp_path: Path) -> None:
    """Another process's run, between its checks and its master's start: refused, naming its
    pid; once it is gone the folder is free (the kernel dropped its lock)."""
    out = tmp_path / "out"
    with held_in_child(_HOLDER, str(out)) as holder:
        recorded = (out / ".troupe" / "run.json").read_bytes()
        with pytest.raises(ConfigError, match=_in_use(out, holder.pid)):
            RunDir(out).prepare(_made_with(items=8), fresh=False)
        assert (out / ".troupe" / "run.json").read_bytes() == recorded
    assert holder.returncode == 0
    run = RunDir(out)
    assert run.prepare(_made_with(items=16), fresh=False) is None
    run.release()
