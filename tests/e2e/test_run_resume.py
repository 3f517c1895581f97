"""`troupe run` into an --out that already holds a run: it resumes, says it is done, or refuses.

Real `troupe run` processes on loopback with a small pipeline. The interruption comes at a
random moment (a seeded delay after the first episode is committed; the seed is in the
failure message, and TROUPE_RESUME_SEED replays it).
"""

from __future__ import annotations

import json
import os
import random
import re
import signal
import time
from collections.abc import Callable
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from support.cluster import ctl
from support.run_resume_helpers import dataset_task_ids, run_args, running, small_pipeline, summary_counts

pytestmark = pytest.mark.e2e

SEED = int(os.environ.get("TROUPE_RESUME_SEED", "9"))


def _committed(out: Path) -> list[str]:
    store = out / ".troupe" / "episodes" / "committed"
    return sorted(p.name for p in store.iterdir()) if store.is_dir() else []


# Enough items that the Ctrl-C lands while the run still works: a run of 8 small items can end
# inside the random delay now that workers start from the template.
ITEMS = 32


@pytest.mark.timeout(400)
def test_a_run_stopped_by_ctrl_c_resumes_keeps_its_episodes_and_then_says_it_is_complete(
    tmp_path: Path,
) -> None:
    """Ctrl-C at a random moment: exit 130, no process left. The rerun keeps what was committed,
    makes the rest and finalises every episode exactly once; a third run says it is complete
    and starts nothing; another --scenes is refused in one line."""
    config, out = small_pipeline(tmp_path), tmp_path / "out"
    delay = random.Random(SEED).uniform(0.0, 0.5)
    with running(run_args(config, out, ITEMS), tmp_path, "first") as first:
        first.wait_until("a committed episode", lambda: bool(_committed(out)))
        first.wait_until("the random moment", _after(delay))
        first.signal(signal.SIGINT, group=True)  # what a terminal's Ctrl-C does
        assert first.wait() == 130, f"seed {SEED}:\n{first.text()[-3000:]}"
        assert not first.survivors(), f"seed {SEED}: processes of the run left behind"
    kept_before = _committed(out)
    assert kept_before
    # Its last line says how far it got (no more than it committed) and how to go on.
    said = re.search(r"stopped: at least (\d+) of (\d+) items done; (.*)", " ".join(first.text().split()))
    assert said is not None, f"seed {SEED}:\n{first.text()[-3000:]}"
    stopped_done = int(said[1])
    assert stopped_done <= ITEMS and int(said[2]) == ITEMS, said[0]
    assert "the same command run again goes on from there" in said[3], said[0]

    with running(run_args(config, out, ITEMS), tmp_path, "rerun") as rerun:
        assert rerun.wait(timeout=300) == 0, f"seed {SEED}:\n{rerun.text()[-3000:]}"
    if "every item was done by an earlier run" not in rerun.text():  # else the stop came after the last
        counts = summary_counts(rerun.text())
        assert counts["dead"] == 0
        assert counts["ok"] + counts["pruned"] + counts["kept"] + counts["before"] == ITEMS, counts
        assert stopped_done <= counts["before"] + counts["kept"], (stopped_done, counts)  # never more
    total, ids = dataset_task_ids(out)
    committed = _committed(out)
    assert set(kept_before) <= set(committed)  # kept, and not written again (exactly once)
    assert total == len(ids) == len(set(ids)) == len(committed) and sorted(ids) == committed
    assert (
        json.loads((out / ".troupe" / "run.json").read_text())["complete"]["finals"]["store"]["episodes"]
        == total
    )

    done = ctl(*run_args(config, out, ITEMS), timeout=120)
    assert done.returncode == 0, done.stderr
    said = " ".join(done.stdout.split())
    assert (
        f"already complete: dataset: {total} episodes," in said and f"LeRobot v3.0 at {out.resolve()}" in said
    )
    assert "node up" not in done.stdout

    other = ctl(*run_args(config, out, 4), timeout=120)
    assert other.returncode == 2
    assert other.stderr.count("\n") == 1 and "Traceback" not in other.stderr
    assert f"items={ITEMS}" in other.stderr and "items=4" in other.stderr and "--fresh" in other.stderr


@pytest.mark.timeout(300)
def test_fresh_starts_anew_keeping_files_troupe_did_not_write(tmp_path: Path) -> None:
    """--fresh deletes troupe's own files and starts over; a user's file in --out stays. A run
    into a directory troupe did not make, or with another resolution, is refused in one line."""
    config, out = small_pipeline(tmp_path), tmp_path / "out"
    first = ctl(*run_args(config, out, 2), timeout=200)
    assert first.returncode == 0, first.stdout[-2000:] + first.stderr
    (out / "NOTES.md").write_text("mine\n")

    bigger = tmp_path / "bigger.toml"
    bigger.write_text(config.read_text().replace("width = 48", "width = 64"))
    changed = ctl(*run_args(bigger, out, 2), timeout=120)
    assert changed.returncode == 2 and changed.stderr.count("\n") == 1
    assert "stage.load.kwargs.width=48" in changed.stderr and "width=64" in changed.stderr

    fresh = ctl(*run_args(config, out, 3, "--fresh"), timeout=200)
    assert fresh.returncode == 0, fresh.stdout[-2000:] + fresh.stderr
    counts = summary_counts(fresh.stdout)
    assert counts["kept"] == counts["before"] == 0 and counts["ok"] + counts["pruned"] == 3
    assert (out / "NOTES.md").read_text() == "mine\n"
    total, ids = dataset_task_ids(out)
    assert total == len(set(ids)) == counts["ok"]

    foreign = tmp_path / "someone-elses"
    foreign.mkdir()
    (foreign / "thesis.tex").write_text("\\begin{document}\n")
    refused = ctl(*run_args(config, foreign, 2, "--fresh"), timeout=120)
    assert refused.returncode == 2 and "thesis.tex" in refused.stderr and refused.stderr.count("\n") == 1
    assert sorted(p.name for p in foreign.iterdir()) == ["thesis.tex"]


@pytest.mark.timeout(300)
def test_a_dataset_file_damaged_after_the_run_finished_is_written_again(tmp_path: Path) -> None:
    """A finished run's data file truncated afterwards: the rerun writes the dataset again from
    the committed episodes (it said "already complete" over a dataset no reader could open),
    and the run after that finds it complete."""
    config, out = small_pipeline(tmp_path), tmp_path / "out"
    first = ctl(*run_args(config, out, 2), timeout=200)
    assert first.returncode == 0, first.stdout[-2000:] + first.stderr
    (data,) = sorted((out / "data").rglob("*.parquet"))
    frames = pq.read_table(data).num_rows
    with data.open("r+b") as f:
        f.truncate(100)

    again = ctl(*run_args(config, out, 2), timeout=200)
    assert again.returncode == 0, again.stdout[-2000:] + again.stderr
    assert "already complete" not in again.stdout and "finalising" in again.stdout, again.stdout
    assert pq.read_table(data).num_rows == frames
    assert dataset_task_ids(out)[0] == 2
    done = ctl(*run_args(config, out, 2), timeout=200)
    assert done.returncode == 0 and "already complete" in done.stdout, done.stdout + done.stderr


def _after(delay: float) -> Callable[[], bool]:
    deadline = time.monotonic() + delay
    return lambda: time.monotonic() >= deadline


def test_a_json_run_stopped_by_ctrl_c_says_how_far_it_got(tmp_path: Path) -> None:
    """With --json, a stopped run printed only 'SIGINT: stopping gracefully': its stdout (the
    JSON's) stays empty, and the line that says how far it got and how to go on comes on stderr."""
    config, out = small_pipeline(tmp_path), tmp_path / "out"
    with running(run_args(config, out, ITEMS, "--json"), tmp_path, "json") as first:
        first.wait_until("a committed episode", lambda: bool(_committed(out)))
        first.signal(signal.SIGINT, group=True)
        assert first.wait() == 130, first.text()[-3000:]
    text = " ".join(first.text().split())
    assert re.search(r"stopped: at least \d+ of 32 items done; ", text), text[-3000:]
    assert "{" not in first.text(), first.text()[-3000:]  # no JSON object: the run did not end
    with running(run_args(config, out, ITEMS, "--json"), tmp_path, "rerun") as rerun:
        assert rerun.wait(timeout=300) == 0, rerun.text()[-3000:]
    start = re.search(r"^\{", rerun.text(), re.MULTILINE)  # stdout's object, among stderr's lines
    assert start is not None, rerun.text()[-3000:]
    report, _ = json.JSONDecoder().raw_decode(rerun.text()[start.start() :])
    # items: this run's; job_items: how every item of the job ended, the stopped run's too
    assert sum(report["job_items"].values()) == ITEMS, report["job_items"]
    assert sum(report["items"].values()) <= ITEMS
