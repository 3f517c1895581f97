"""The record of a `troupe run` output directory: resume, refuse, or start anew (in memory and
on tmp_path, no processes)."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import pytest

from troupe.actors.datagen.config import default_pipeline
from troupe.runtime.errors import ConfigError
from troupe.runtime.pipeline.run_dir import RunDir
from troupe.runtime.pipeline.run_fingerprint import fingerprint, first_difference
from troupe.runtime.tasks.journal_lock import JournalLock


def _made_with(**overrides: object) -> dict[str, object]:
    return fingerprint(default_pipeline(**overrides))


def test_only_what_decides_the_episodes_is_compared() -> None:
    """Items, seeds and stage kwargs count; replicas, queues and slots do not."""
    base = default_pipeline(items=8)
    faster = base.model_copy(
        update={
            "slots": 9,
            "stages": tuple(s.model_copy(update={"queue": 16, "max_replicas": 4}) for s in base.stages),
        }
    )
    assert first_difference(fingerprint(base), fingerprint(faster)) is None
    assert first_difference(_made_with(items=32), _made_with(items=8)) == ("items=32", "items=8")
    assert first_difference(_made_with(seed_start=0), _made_with(seed_start=5)) == (
        "seed_start=0",
        "seed_start=5",
    )
    wider = base.model_copy(
        update={
            "stages": tuple(
                s.model_copy(update={"kwargs": {**s.kwargs, "width": 128}}) if s.name == "load" else s
                for s in base.stages
            )
        }
    )
    assert first_difference(fingerprint(base), fingerprint(wider)) == (
        "stage.load.kwargs.width=96",
        "stage.load.kwargs.width=128",
    )
    on_gpu = base.model_copy(
        update={
            "stages": tuple(
                s.model_copy(update={"kwargs": {"device": "cuda"}}) if s.name == "render" else s
                for s in base.stages
            )
        }
    )
    assert first_difference(fingerprint(base), fingerprint(on_gpu)) == (
        "no stage.render.kwargs.device",
        "stage.render.kwargs.device=cuda",
    )


def test_a_new_directory_is_recorded_then_resumed_then_complete(tmp_path: Path) -> None:
    run = RunDir(tmp_path / "out")
    assert run.prepare(_made_with(items=8), fresh=False) is None
    assert run.record_path.is_file()
    assert run.prepare(_made_with(items=8), fresh=False) is None  # resumed: not complete yet
    made = tmp_path / "out" / "made.bin"
    made.write_bytes(b"12345")
    run.mark_complete({"store": {"episodes": 7, "outputs": [str(made)]}}, items={"ok": 7, "dead": 1})
    complete = run.prepare(_made_with(items=8), fresh=False)
    st = made.stat()
    assert complete == {
        "finals": {"store": {"episodes": 7, "outputs": [str(made)]}},
        "out": str(tmp_path / "out"),
        "made_nothing": False,
        "items": {"ok": 7, "dead": 1},
        "stats": {str(made): [5, st.st_mtime_ns]},
    }
    assert run.still_there(complete)
    assert not run.still_there({"finals": {"store": {"outputs": [str(tmp_path / "gone")]}}})


def test_an_output_damaged_or_edited_since_the_run_finished_is_finalised_again(tmp_path: Path) -> None:
    """A dataset file truncated (or written to) after the run finished: the rerun writes it
    again rather than saying "already complete" over a damaged dataset; a record made before
    runs kept the outputs' stats is judged on their presence alone."""
    run = RunDir(tmp_path / "out")
    run.prepare(_made_with(items=8), fresh=False)
    made = tmp_path / "out" / "made.bin"
    made.write_bytes(b"12345")
    run.mark_complete({"store": {"outputs": [str(made)]}})
    assert run.finished(_made_with(items=8), fresh=False)
    with made.open("r+b") as f:
        f.truncate(2)
    assert not run.finished(_made_with(items=8), fresh=False)
    older = {"finals": {"store": {"outputs": [str(made)]}}, "out": str(tmp_path / "out")}
    assert run.still_there(older)
    assert not run.still_there({"finals": {"store": {"outputs": "not a list"}}, "stats": []})


def test_a_copied_or_moved_directory_is_finalised_again_where_it_is_now(tmp_path: Path) -> None:
    """Its record names the outputs where it finished: complete there is not complete here."""
    run = RunDir(tmp_path / "out")
    run.prepare(_made_with(items=8), fresh=False)
    made = tmp_path / "out" / "made.bin"
    made.write_bytes(b"12345")
    run.mark_complete({"store": {"episodes": 8, "outputs": [str(made)]}})
    shutil.copytree(tmp_path / "out", tmp_path / "copy")
    copy = RunDir(tmp_path / "copy")
    assert copy.prepare(_made_with(items=8), fresh=False) is not None  # the record came along
    assert not copy.finished(_made_with(items=8), fresh=False)
    assert run.finished(_made_with(items=8), fresh=False)


def test_a_master_fed_run_s_completion_counts_for_its_own_job_only(tmp_path: Path) -> None:
    """A run on a cluster records the master's job it finished (its id and submission time):
    the same job's rerun finds it complete; a job made anew under the same name (a master that
    lost its journal) does not, and its run drops the word before it finalises again. Stages
    that write nothing under the folder leave it as bare as a run that failed as it started:
    its record stays all the same."""
    run = RunDir(tmp_path / "out")
    run.take_shared(_made_with(items=8)).release()
    made = tmp_path / "made.bin"  # outside the folder
    made.write_bytes(b"12345")
    job = {"job_id": "datagen", "submitted_at": 1765000000.125}
    run.mark_complete({"store": {"outputs": [str(made)]}}, job=job)
    run.take_shared(_made_with(items=8)).release()  # the rerun holds the folder: the word stays
    assert run.completed_job(dict(job)) is not None
    assert run.completed_job({**job, "submitted_at": 1765000999.5}) is None
    assert run.completed() is not None  # what a stop once it finished reads: complete

    run.forget_complete()
    assert run.completed() is None and run.completed_job(job) is None
    run.take_shared(_made_with(items=8)).release()  # the pipeline is still the folder's


def test_another_pipeline_is_refused_naming_the_field(tmp_path: Path) -> None:
    run = RunDir(tmp_path / "out")
    run.prepare(_made_with(items=32), fresh=False)
    (tmp_path / "out" / "data").mkdir()
    (tmp_path / "out" / "data" / "file-000.parquet").write_bytes(b"PAR1")  # it made something
    with pytest.raises(ConfigError) as err:
        run.prepare(_made_with(items=8), fresh=False)
    assert str(err.value) == (
        f"--out {tmp_path / 'out'} was made with items=32, this run asks items=8 (use --fresh to start anew)"
    )


def test_someone_elses_directory_is_refused_and_never_wiped(tmp_path: Path) -> None:
    out = tmp_path / "out"
    (out / "data").mkdir(parents=True)
    (out / "data" / "table.csv").write_text("1,2\n")
    (out / "report.pdf").write_text("%PDF")
    for fresh in (False, True):
        with pytest.raises(ConfigError, match=r"'report\.pdf', which no troupe run wrote"):
            RunDir(out).prepare(_made_with(), fresh=fresh)
    assert (out / "data" / "table.csv").read_text() == "1,2\n"


def _committed(out: Path) -> None:
    """An episode committed in ``out``, as a run's store leaves it."""
    episode = out / ".troupe" / "episodes" / "committed" / "t-1"
    episode.mkdir(parents=True)
    (episode / "episode.json").write_text("{}")


def _faster(**overrides: object) -> dict[str, object]:
    """The pipeline planned at another speed: other episodes, which the writer does not check."""
    made = _made_with(**overrides)
    made["stage"]["plan"]["kwargs"]["speed"] = 2.0  # type: ignore[index]
    return made


@pytest.mark.parametrize("damage", [None, "{ cut sh", "[]", ""])
def test_a_record_lost_is_rebuilt_from_its_copy_or_refused(tmp_path: Path, damage: str | None) -> None:
    """A record deleted or damaged (a file cut short) is no licence to mix: the folder's pipeline
    is kept beside it too, so another pipeline is refused naming what differs (the stage kwarg
    the writer does not check: it took the folder, and planned half its episodes at another
    speed, report up 1), and the same pipeline gets its record back, committed outputs kept."""
    out = tmp_path / "out"
    run = RunDir(out)
    run.prepare(_faster(items=8), fresh=False)
    run.mark_complete({})
    run.release()
    _committed(out)
    if damage is None:
        run.record_path.unlink()
    else:
        run.record_path.write_text(damage)
    for look in (
        lambda r: r.check(_made_with(items=8), False),
        lambda r: r.prepare(_made_with(items=8), False),
    ):
        with pytest.raises(
            ConfigError, match=r"was made with stage\.plan\.kwargs\.speed=2\.0, this run asks no stage"
        ):
            look(RunDir(out))
    again = RunDir(out)
    assert again.prepare(_faster(items=8), fresh=False) is None  # finalised again: complete unknown
    assert again.recovered == ("missing" if damage is None else "damaged") and not again.adopted
    again.release()
    assert json.loads(run.record_path.read_text())["pipeline"] == _faster(items=8)
    assert (out / ".troupe" / "episodes" / "committed" / "t-1").is_dir()
    with pytest.raises(ConfigError, match="was made with"):  # recorded again: as any other
        RunDir(out).prepare(_made_with(items=8), fresh=False)


@pytest.mark.parametrize("damage", [None, "{ cut sh"])
def test_a_record_lost_with_its_copy_is_refused_where_outputs_are(tmp_path: Path, damage: str | None) -> None:
    """Nothing says what the outputs were made with: --fresh (or the record put back), not a
    folder taken for whatever pipeline comes; a folder that holds no output is taken."""
    out = tmp_path / "out"
    run = RunDir(out)
    run.prepare(_faster(items=8), fresh=False)
    run.release()
    run.copy_path.unlink()
    if damage is None:
        run.record_path.unlink()
    else:
        run.record_path.write_text(damage)
    bare = RunDir(out)  # it made nothing (it failed as it started): this run's
    assert bare.prepare(_made_with(items=8), fresh=False) is None and bare.record_path.is_file()
    bare.release()
    bare.record_path.unlink()
    bare.copy_path.unlink()
    _committed(out)
    said = r"its record .*run\.json is (gone|damaged), and so is made_with\.json beside it: .*--fresh"
    for look in (
        lambda r: r.check(_made_with(items=8), False),
        lambda r: r.prepare(_made_with(items=8), False),
    ):
        with pytest.raises(ConfigError, match=said):
            look(RunDir(out))
    assert not run.record_path.exists()  # it bound nothing
    assert RunDir(out).prepare(_made_with(items=8), fresh=True) is None  # --fresh: anew


def test_a_folder_recorded_before_the_copy_gets_one(tmp_path: Path) -> None:
    out = tmp_path / "out"
    run = RunDir(out)
    run.prepare(_made_with(items=8), fresh=False)
    run.release()
    run.copy_path.unlink()  # as a troupe of before left it
    RunDir(out).prepare(_made_with(items=8), fresh=False)
    assert json.loads(run.copy_path.read_text())["pipeline"] == _made_with(items=8)


@pytest.mark.parametrize("inside", [".troupe/x", ".troupe", "data/x/y", "logs", "meta/runs"])
def test_a_folder_inside_what_another_run_owns_is_refused(tmp_path: Path, inside: str) -> None:
    """The outer run's --fresh (or its finalize, under data/, videos/, meta/) would delete it."""
    outer = tmp_path / "outer"
    RunDir(outer).prepare(_made_with(items=8), fresh=False)
    nested = RunDir(outer / inside)
    for call in (lambda: nested.check(_made_with(), False), lambda: nested.prepare(_made_with(), False)):
        with pytest.raises(ConfigError, match=f"is inside {outer}/.*, which the run in {outer} owns"):
            call()
    assert not (outer / inside / ".troupe").exists()
    RunDir(outer / "sub").prepare(_made_with(), fresh=False)  # beside troupe's entries: the user's own
    RunDir(tmp_path / "data" / "x").prepare(_made_with(), fresh=False)  # a "data" that is no run's


def test_fresh_wipes_troupes_files_only(tmp_path: Path) -> None:
    out = tmp_path / "out"
    run = RunDir(out)
    run.prepare(_made_with(items=32), fresh=False)
    for sub in ("data/chunk-000", "meta/episodes", "videos/x", "logs", ".troupe/episodes/committed/t-1"):
        (out / sub).mkdir(parents=True, exist_ok=True)
    (out / "NOTES.md").write_text("mine\n")
    run.mark_complete({})
    assert run.prepare(_made_with(items=8), fresh=True) is None
    assert sorted(p.name for p in out.iterdir()) == [".troupe", "NOTES.md"]
    # The journal's lock file stays: the run holds it (deleted, another could lock a new one).
    assert sorted(p.name for p in (out / ".troupe").iterdir()) == [
        "journal.db.lock",
        "made_with.json",
        "run.json",
    ]
    assert run.prepare(_made_with(items=8), fresh=False) is None


def test_a_fresh_wipe_that_cannot_remove_a_file_says_which_and_leaves_the_directory_troupes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A file --fresh may not remove (an immutable flag: root's permissions do not stop it):
    one error naming it, and the state directory still there, so that the same --fresh, once
    the file is freed, wipes the rest (it was removed first, and the directory was then
    refused for good as someone else's)."""
    out = tmp_path / "out"
    run = RunDir(out)
    run.prepare(_made_with(items=8), fresh=False)
    (out / "meta").mkdir()
    (out / "meta" / "info.json").write_text("{}")
    real_rmtree = shutil.rmtree

    def immutable_meta(path: Path, *args: object, **kwargs: object) -> None:
        if Path(path).name == "meta":
            raise PermissionError(1, "Operation not permitted", str(Path(path) / "info.json"))
        real_rmtree(path, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(shutil, "rmtree", immutable_meta)
    with pytest.raises(
        ConfigError, match=r"--fresh: cannot remove .*meta/info\.json .*Operation not permitted"
    ):
        run.prepare(_made_with(items=8), fresh=True)
    assert run.state_dir.is_dir() and run.record_path.is_file()
    monkeypatch.setattr(shutil, "rmtree", real_rmtree)
    assert run.prepare(_made_with(items=8), fresh=True) is None
    assert not (out / "meta").exists()


def test_a_finished_run_that_cannot_be_recorded_says_so_in_one_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from troupe.runtime.errors import CommitError
    from troupe.runtime.pipeline import run_record

    run = RunDir(tmp_path / "out")
    run.prepare(_made_with(items=8), fresh=False)

    def refused(path: Path, record: dict[str, object]) -> None:
        raise PermissionError(1, "Operation not permitted", str(path))

    monkeypatch.setattr(run_record, "write_record", refused)
    with pytest.raises(CommitError, match=r"recording the finished run in .*run\.json failed"):
        run.mark_complete({})


def test_a_directory_in_use_by_another_run_is_refused_and_left_alone(tmp_path: Path) -> None:
    run = RunDir(tmp_path / "out")
    run.prepare(_made_with(), fresh=False)
    run.journal_path.write_bytes(b"")
    run.release()  # that run ended; another holds the folder now
    held = JournalLock.acquire(run.journal_path)  # what a running `troupe run` holds
    try:
        with pytest.raises(ConfigError, match=f"in use by another troupe run \\(pid {os.getpid()}\\)"):
            run.prepare(_made_with(), fresh=True)
        assert run.record_path.is_file()
    finally:
        held.release()


def test_a_master_fed_run_that_made_only_empty_folders_binds_nothing(tmp_path: Path) -> None:
    """A cluster run that failed as it started (a class the nodes could not import) left its
    record, its log and the store's empty folders: the same job with its class put right takes
    the folder over (it was refused as made with the misspelt class, and so was every other
    --out, the master's job naming this one). One file committed there, and it binds."""
    run = RunDir(tmp_path / "out")
    run.take_shared(_made_with(items=32)).release()
    (tmp_path / "out" / ".troupe" / "episodes" / "committed").mkdir(parents=True)
    (tmp_path / "out" / "logs").mkdir()
    (tmp_path / "out" / "logs" / "local.jsonl").write_text("{}\n")
    run.check_shared(_made_with(items=8))
    run.take_shared(_made_with(items=8)).release()
    assert run.finished(_made_with(items=8), fresh=False) is False  # recorded as this run's

    committed = tmp_path / "out" / ".troupe" / "episodes" / "committed" / "ep-000000"
    committed.mkdir()
    (committed / "episode.json").write_text("{}")
    with pytest.raises(ConfigError, match="was made with items=8, this run asks items=32"):
        run.check_shared(_made_with(items=32))
    with pytest.raises(ConfigError, match="was made with items=8, this run asks items=32"):
        run.take_shared(_made_with(items=32))


def test_a_run_that_failed_as_it_started_binds_nothing_and_its_journal_goes(tmp_path: Path) -> None:
    """A one-host run refused once it had made its record and journal (a port taken, a stage's
    bad kwarg): the same command with its mistake put right runs there (it was refused as made
    with the mistake), the earlier journal's items gone with it. Made something, it binds."""
    run = RunDir(tmp_path / "out")
    run.prepare(_made_with(items=2), fresh=False)
    for name in ("journal.db", "journal.db-wal", "journal.db-shm", "journal.db.lock"):
        (run.state_dir / name).write_bytes(b"")
    (tmp_path / "out" / "logs").mkdir()
    (tmp_path / "out" / "logs" / "local.jsonl").write_text("{}\n")
    run.check(_made_with(items=3), fresh=False)
    assert run.prepare(_made_with(items=3), fresh=False) is None
    assert not run.journal_path.exists() and not (run.state_dir / "journal.db-wal").exists()
    assert (tmp_path / "out" / "logs" / "local.jsonl").exists()  # its log stays: it says what failed

    (tmp_path / "out" / "data").mkdir()
    (tmp_path / "out" / "data" / "file-000.parquet").write_bytes(b"PAR1")
    with pytest.raises(ConfigError, match="was made with items=3, this run asks items=2"):
        run.prepare(_made_with(items=2), fresh=False)


@pytest.mark.parametrize("items", [None, 20], ids=["same-items", "other-items"])
def test_another_pipeline_s_folder_says_to_give_its_file_not_fresh(tmp_path: Path, items: int | None) -> None:
    """A folder of another pipeline (its file forgotten on the command line): the way out is
    that file or another --out; --fresh would delete what it made. Its item count differing too
    (the default 64 against any other) said "use --fresh": the items came first in the record."""
    run = RunDir(tmp_path / "out")
    signals = default_pipeline().model_copy(
        update={"name": "signals", "items": items or default_pipeline().items}
    )
    run.prepare(fingerprint(signals), fresh=False)
    (tmp_path / "out" / "signals").mkdir()
    (tmp_path / "out" / "signals" / "part-0.npy").write_bytes(b"\x93NUMPY")
    with pytest.raises(ConfigError) as err:
        run.prepare(_made_with(), fresh=False)
    said = str(err.value)
    assert "was made with name=signals, this run asks name=indoor-nav" in said, said
    assert "give its file, `troupe run PIPELINE.toml`, to resume it, or another --out" in said
    assert "--fresh would delete" in said


def test_a_training_run_s_folder_is_named_so(tmp_path: Path) -> None:
    """Not "holds '.troupe-train', which no troupe run wrote": a troupe training run wrote it."""
    out = tmp_path / "out"
    (out / ".troupe-train").mkdir(parents=True)
    with pytest.raises(ConfigError, match=r"is a training run's folder \(it holds '\.troupe-train'\)"):
        RunDir(out).prepare(_made_with(), fresh=False)


@pytest.mark.parametrize(
    "edit",
    [
        lambda r: {**r, "pipeline": {**r["pipeline"], "items": "8"}},
        lambda r: {k: v for k, v in r.items() if k != "pipeline"},
        lambda r: {**r, "pipeline": {k: v for k, v in r["pipeline"].items() if k != "name"}},
    ],
)
def test_a_record_of_fields_missing_or_of_other_types_is_damaged(tmp_path: Path, edit: Any) -> None:
    """Edited by hand or cut: it read "made with items=8, this run asks items=8", or "made with
    no name"; damaged, it is rebuilt from its copy (report up 6)."""
    out = tmp_path / "out"
    run = RunDir(out)
    run.prepare(_made_with(items=8), fresh=False)
    run.release()
    run.record_path.write_text(json.dumps(edit(json.loads(run.record_path.read_text()))))
    again = RunDir(out)
    assert again.prepare(_made_with(items=8), fresh=False) is None and again.recovered == "damaged"
    again.release()
    assert json.loads(run.record_path.read_text())["pipeline"] == _made_with(items=8)


@pytest.mark.parametrize("which", ["run.json", "made_with.json"])
def test_a_newer_troupes_record_is_said_so_not_damaged(tmp_path: Path, which: str) -> None:
    """After a downgrade: "damaged ... delete it" was the advice, which took the folder over."""
    out = tmp_path / "out"
    run = RunDir(out)
    run.prepare(_made_with(items=8), fresh=False)
    run.release()
    if which == "made_with.json":
        run.record_path.unlink()
    path = out / ".troupe" / which
    path.write_text(json.dumps({**json.loads(path.read_text()), "format": 2}))
    for look in (
        lambda r: r.check(_made_with(items=8), False),
        lambda r: r.prepare(_made_with(items=8), False),
    ):
        with pytest.raises(
            ConfigError, match=rf"{which} was written by a newer troupe \(its format 2; this troupe reads 1\)"
        ):
            look(RunDir(out))


def test_values_of_one_text_and_other_types_are_said_with_their_types() -> None:
    made = {"stage": {"load": {"kwargs": {"width": "96"}}}}
    asked = {"stage": {"load": {"kwargs": {"width": 96}}}}
    assert first_difference(made, asked) == (
        'stage.load.kwargs.width="96" (a string)',
        "stage.load.kwargs.width=96 (an integer)",
    )


def test_a_stage_kwarg_that_differs_says_to_resume_with_it_as_it_was(tmp_path: Path) -> None:
    """Compared as written, one that only tunes (render's threads) too (README: Decisions): the
    way out that keeps the work is named first, not --fresh alone, which makes it all again."""
    base = default_pipeline(items=8)
    threads = base.model_copy(
        update={
            "stages": tuple(
                s.model_copy(update={"kwargs": {"threads": 2}}) if s.name == "render" else s
                for s in base.stages
            )
        }
    )
    run = RunDir(tmp_path / "out")
    run.prepare(fingerprint(base), fresh=False)
    run.release()
    _committed(tmp_path / "out")
    with pytest.raises(
        ConfigError,
        match=r"made with no stage\.render\.kwargs\.threads, this run asks stage\.render\.kwargs\.threads=2 "
        r"\(run it with the stages as they were to resume it; --fresh starts anew",
    ):
        RunDir(tmp_path / "out").check(fingerprint(threads), fresh=False)


def _store_kwargs(made: dict[str, Any], **kwargs: object) -> dict[str, Any]:
    made["stage"]["store"]["kwargs"].update(kwargs)
    return made


def test_a_kwarg_only_finalize_reads_changed_finalises_again_and_is_recorded(tmp_path: Path) -> None:
    """The writer's robot_type (fps, dataset) decides no episode: a rerun with it changed was
    refused as made with another pipeline, its committed episodes pinned by it (report ds 2).
    The finalize hook's answer names them; a changed one takes the folder, to finalise again."""
    out = tmp_path / "out"
    run = RunDir(out)
    run.prepare(_made_with(items=8), fresh=False)
    _committed(out)
    made = out / "meta" / "info.json"
    made.parent.mkdir()
    made.write_text("{}")
    run.mark_complete({"store": {"outputs": [str(made)], "finalize_kwargs": ["fps", "robot_type"]}})
    run.release()
    renamed = _store_kwargs(_made_with(items=8), robot_type="x")
    assert RunDir(out).finished(_made_with(items=8), fresh=False)
    assert not RunDir(out).finished(renamed, fresh=False)  # it finalises again
    again = RunDir(out)
    assert again.prepare(renamed, fresh=False) is None
    again.release()
    record = json.loads((out / ".troupe" / "run.json").read_text())
    assert record["pipeline"] == renamed and record["complete"] is None
    with pytest.raises(ConfigError, match=r"made with no stage\.store\.kwargs\.threads, this run asks"):
        RunDir(out).check(_store_kwargs(_made_with(items=8), threads=2), fresh=False)  # it is no such kwarg


def test_a_kwarg_only_finalize_reads_is_held_where_no_finalize_named_it(tmp_path: Path) -> None:
    """A run that never finalised cannot tell them: compared as written, as the rest."""
    out = tmp_path / "out"
    run = RunDir(out)
    run.prepare(_made_with(items=8), fresh=False)
    run.release()
    _committed(out)
    with pytest.raises(ConfigError, match=r"made with no stage\.store\.kwargs\.robot_type"):
        RunDir(out).check(_store_kwargs(_made_with(items=8), robot_type="x"), fresh=False)
