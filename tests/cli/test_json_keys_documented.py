"""au 5: every key of the ``--json`` outputs a script reads is in docs/METRICS.md ("The `--json`
outputs": key, type, unit, meaning), and ``ctl submit --json`` always carries ``state``.

The outputs themselves are taken from a real run and a real node where those are run already
(tests/e2e/test_run_startup_share.py, test_cli.py, test_cluster_hosts.py call ``undocumented``);
here the check's own reading of the doc, the submit reply of a master in memory, and (lc 5: it
had no table) a real tiny training run's ``--json``, with its node's ``ctl status --json`` taken
while the rank is held between two steps.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from support.clip_data import write_run
from support.json_doc import documented, undocumented
from support.memory_master import master_in_memory
from support.port_range import test_endpoint
from support.train_run_cli import config_copy, finish, troupe
from troupe.cli.commands import ctl
from troupe.cli.main import app
from troupe.runtime.testing.plugin import import_path

JOB = {"job": {"job": {"name": "j", "kind": "k", "count": 2}}, "source": "t"}


def test_the_doc_names_the_keys_a_script_asked_about() -> None:
    """Those the finding found in no document, and both sides of a cell naming several."""
    run = documented("troupe run --json")
    assert {"elapsed_s", "wall_s", "stages.*.items_in", "stages.*.queue_bound", "finals.*.episodes"} <= run
    status = documented("troupe ctl status --json")
    assert {"template.light_pid", "security.incomplete_handshakes", "master.gc.pause_s"} <= status
    assert {"supervision.supervisor.beats_bad_mac", "master.speculative.won"} <= status
    assert {"state", "already"} <= documented("troupe ctl submit --json")


def test_a_key_no_row_names_is_found_wherever_it_is() -> None:
    report: dict[str, Any] = {
        "wall_s": 1.0,
        "stages": {"render": {"items_in": 3, "new_figure": 1}},
        "finals": {},
        "errors": {"job-000001": "KeyError: 'x'"},
        "brand_new": [1, 2],
    }
    assert undocumented("troupe run --json", report) == ["stages.render.new_figure", "brand_new"]
    status = {"workers": [{"name": "w", "odd": 1}, {"name": "v"}], "master": {"workers": []}}
    assert undocumented("troupe ctl status --json", status) == ["workers[].odd"]
    training = {"steps": 2, "latent_cache": {"misses": 4, "brand_new": 1}, "stages": {"s": {"l_s": 1.0}}}
    assert undocumented("troupe run --json", training, of="a training config") == [
        "latent_cache.brand_new",
        "stages.s.l_s",  # a pipeline's key: not the training's table
    ]


def test_a_training_run_s_table_is_its_own() -> None:
    """A training's keys are in their own table, not read from the pipeline's, and back."""
    training = documented("troupe run --json", "a training config")
    assert {
        "steps_this_run",
        "latent_cache.not_counted",
        "timings.*.wait_s",
        "datagen.finals.*.root",
    } <= training
    assert {
        "latent_cache.disk_writes",
        "latent_cache.disk_writes_skipped",
        "latent_cache.disk_errors",
    } <= training
    assert "lambda" not in training and "steps_this_run" not in documented("troupe run --json")


async def test_the_master_says_the_state_of_a_new_job_too(tmp_path: Path) -> None:
    """A new job's reply said no ``state`` (a repeat's did): a script had to test for the key."""
    async with master_in_memory(tmp_path) as m:
        new = await m.call("submit", JOB)
        again = await m.call("submit", JOB)
    assert new == {"job_id": "j", "tasks": 2, "already": False, "state": None}
    assert again == {"job_id": "j", "tasks": 2, "already": True, "state": "running"}
    assert undocumented("troupe ctl submit --json", new) == []


def test_submit_json_says_state_even_where_an_older_master_did_not(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``ctl submit --json`` prints ``state`` null for a new job whatever the master's reply."""
    monkeypatch.setattr(
        ctl, "run_async", lambda *_args, **_kw: {"job_id": "demo", "tasks": 3, "already": False}
    )
    job = tmp_path / "job.toml"
    job.write_text('[job]\nname = "demo"\nkind = "nap"\ncount = 3\n', encoding="utf-8")
    result = CliRunner().invoke(app, ["ctl", "submit", str(job), "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.output) == {"job_id": "demo", "tasks": 3, "already": False, "state": None}


TRAINER_TESTS = Path(__file__).resolve().parents[1] / "actors" / "training"  # trainer_testdata


def _status_once_trained(proc: subprocess.Popen[str], node: str) -> dict[str, Any]:
    """``ctl status --json`` of the run's node, with a ``--master`` where nothing listens, once
    the rank has a loss and a committed checkpoint (it is held after them: see the test)."""
    nobody = test_endpoint()  # free a moment ago: nothing listens there
    deadline = time.monotonic() + 300
    while True:
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "the rank never showed a loss and a checkpoint"
        done = subprocess.run(
            [sys.executable, "-m", "troupe.cli.main", "ctl", "status", "--json", "--node", node,
             "--master", nobody, "--timeout", "5"],
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        if done.returncode == 0:
            status: dict[str, Any] = json.loads(done.stdout)
            for worker in status.get("workers", []):
                figures = (worker.get("runtime") or {}).get("actor_metrics", {}).get("train-rank-0", {})
                if {"loss", "checkpoint_step"} <= set(figures):
                    return status


@pytest.mark.e2e
@pytest.mark.timeout(600)
def test_a_training_run_s_json_and_its_node_s_status_are_documented(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """lc 5: a training run's ``--json`` had no table at all, and its node's status carried
    ``master_error`` and the actors' own figures, in no row. The rank reads through
    ``GatedClips``: after 4 clips (2 steps of 2, each checkpointed) it waits for a gate file, so
    the status is taken while it trains, deterministically."""
    gate = tmp_path / "gate"
    monkeypatch.setenv("PYTHONPATH", import_path(TRAINER_TESTS))  # the rank imports GatedClips
    monkeypatch.setenv("TROUPE_TEST_GATE", str(gate))
    monkeypatch.setenv("TROUPE_TEST_GATE_AFTER", "4")
    dataset = tmp_path / "dataset"
    write_run(dataset, {f"ep{i}": 24 for i in range(4)})
    train = {"dataset": str(dataset), "dataset_class": "trainer_testdata:GatedClips", "steps": 3,
             "checkpoint_every": 1}  # fmt: skip
    config = config_copy(tmp_path / "train.toml", "train.toml", {"train": train})
    out = tmp_path / "out"
    with troupe("run", str(config), "--out", str(out), "--json") as (proc, node):
        status = _status_once_trained(proc, node)
        gate.touch()
        code, stdout, stderr = finish(proc)
    assert code == 0, stdout[-3000:] + stderr[-3000:]
    report = json.loads(stdout)
    assert report["steps"] == 3 and report["latent_cache"] is not None, report
    assert undocumented("troupe run --json", report, of="a training config") == []
    assert status["out"] == str(out.resolve()) and "master_error" in status, sorted(status)
    assert undocumented("troupe ctl status --json", status) == []
