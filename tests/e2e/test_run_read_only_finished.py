"""``troupe run`` into a finished --out mounted read-only (an archived dataset): `already complete`,
exit 0, and with --json the object a writable rerun prints; an unfinished one is refused as
before, `cannot write`, exit 2 (report up 7: every rerun there was refused, so a script that
reads `already_complete` could not tell a complete dataset from a broken one).

The folder is a bind mount remounted read-only (``chmod`` does not stop root); the test is
skipped where mounting is not permitted.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

from support.read_only_mount import read_only_mount
from support.run_resume_helpers import run_args, small_pipeline
from support.synthetic_runs import synthetic_pipeline, troupe, troupe_run
from troupe.runtime.tasks.journal_lock import JournalLock

pytestmark = pytest.mark.e2e

TIMINGS = {"command_s", "command_startup_share"}  # the command's own wall time: each its own


@pytest.mark.timeout(300)
def test_a_finished_run_mounted_read_only_answers_as_a_writable_rerun(tmp_path: Path) -> None:
    toml, out = synthetic_pipeline(tmp_path), tmp_path / "out"
    first = troupe_run(toml, out)
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    writable = troupe_run(toml, out, "--json")
    assert writable.returncode == 0, writable.stdout[-3000:] + writable.stderr[-3000:]
    expected = json.loads(writable.stdout)
    assert expected["already_complete"] is True

    with read_only_mount(out):
        text = troupe_run(toml, out)
        as_json = troupe_run(toml, out, "--json")
        fresh = troupe_run(toml, out, "--fresh")  # it would delete: refused as ever
    assert text.returncode == 0, text.stdout[-3000:] + text.stderr[-3000:]
    assert text.stdout.startswith("already complete: "), text.stdout
    assert text.stderr == ""
    assert as_json.returncode == 0, as_json.stdout[-3000:] + as_json.stderr[-3000:]
    answered = json.loads(as_json.stdout)  # the whole of stdout: one object
    assert {k: v for k, v in answered.items() if k not in TIMINGS} == {
        k: v for k, v in expected.items() if k not in TIMINGS
    }
    assert fresh.returncode == 2 and "cannot write in" in fresh.stderr, fresh.stdout + fresh.stderr


@pytest.mark.timeout(300)
def test_an_unfinished_run_mounted_read_only_is_refused_as_before(tmp_path: Path) -> None:
    toml, out = synthetic_pipeline(tmp_path), tmp_path / "out"
    first = troupe_run(toml, out)
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    record_path = out / ".troupe" / "run.json"
    record = json.loads(record_path.read_text(encoding="utf-8"))
    record_path.write_text(json.dumps({**record, "complete": None}), encoding="utf-8")  # stopped early
    with read_only_mount(out):
        refused = [troupe_run(toml, out, *flag) for flag in ((), ("--json",))]
    for proc in refused:
        assert proc.returncode == 2, proc.stdout[-3000:] + proc.stderr[-3000:]
        assert proc.stdout == ""
        assert proc.stderr.strip() == (
            f"error: --out {out}: cannot write in {out} (Read-only file system); it holds an "
            "unfinished run, which can go on only where --out can be written"
        )
    # A run holding the folder (here: this process) is named, as on a writable path: it said only
    # "cannot write (Read-only file system)" (report rg 3).
    lock = JournalLock.acquire(out / ".troupe" / "journal.db")
    try:
        with read_only_mount(out):
            held = troupe_run(toml, out)
    finally:
        lock.release()
    assert held.returncode == 2, held.stdout[-3000:] + held.stderr[-3000:]
    assert f"is in use by another troupe run (pid {os.getpid()})" in held.stderr, held.stderr


@pytest.mark.timeout(300)
def test_a_dataset_mounted_read_only_at_another_path_answers_naming_it(tmp_path: Path) -> None:
    """The report's own steps: a finished --out bind-mounted read-only elsewhere, asked again."""
    config, golden, ro = small_pipeline(tmp_path), tmp_path / "o1.golden", tmp_path / "ro"
    first = troupe(*run_args(config, golden, 2))
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    with read_only_mount(golden, ro):
        text = troupe(*run_args(config, ro, 2))
        as_json = troupe(*run_args(config, ro, 2, "--json"))
    assert text.returncode == 0, text.stdout[-3000:] + text.stderr[-3000:]
    said = rf"already complete: dataset: 2 episodes, \d+ frames, LeRobot v3\.0 at {re.escape(str(ro))}\n"
    assert re.fullmatch(said, text.stdout), text.stdout
    assert as_json.returncode == 0, as_json.stdout[-3000:] + as_json.stderr[-3000:]
    answered = json.loads(as_json.stdout)
    assert answered["already_complete"] is True and answered["made_nothing"] is False
    assert answered["finals"]["store"]["root"] == str(ro)
    assert all(p.startswith(f"{ro}/") for p in answered["finals"]["store"]["outputs"])
