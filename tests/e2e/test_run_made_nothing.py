"""A `troupe run` whose every item died made nothing: it exits 1 in one line that says so (it
exited 0, and a script went on to train on nothing), and so does a rerun that finds it complete.
A run with some dead items among others made something: it still exits 0
(``tests/cli/test_run_dead_items.py`` names their errors)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from support.train_run_cli import finish, troupe
from troupe.cli.commands.run_pipeline import RETRY_DEAD_HINT
from troupe.runtime.testing.plugin import import_path

pytestmark = pytest.mark.e2e

PIPELINE = """
[pipeline]
name = "doomed"
items = 3
max_attempts = 1

[[stages]]
name = "only"
actor = "support.hook_stages:{cls}"
"""


@pytest.fixture(autouse=True)
def replicas_import_the_test_stages(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv("PYTHONPATH", import_path())
    yield


def _run(config: Path, out: Path, *flags: str) -> tuple[int, str, str]:
    with troupe("run", str(config), "--out", str(out), *flags) as (proc, _):
        return finish(proc)


def test_a_run_whose_every_item_died_exits_1_and_so_does_its_rerun(tmp_path: Path) -> None:
    config = tmp_path / "doomed.toml"
    config.write_text(PIPELINE.format(cls="DoomedStage"), encoding="utf-8")
    out = tmp_path / "out"
    code, stdout, stderr = _run(config, out, "--json")
    assert code == 1, stdout[-2000:] + stderr[-2000:]
    figures = json.loads(stdout)
    assert figures["made_nothing"] is True and figures["items"]["dead"] == 3
    # The items' time ends with the last one's death (the master's dead letter), not before
    # the first item moved: it had been counted as finalisation, and lambda over 0 s.
    assert figures["steady_s"] > 0 and figures["elapsed_s"] > 0
    assert "error: every item died (3): the run made nothing;" in stderr
    assert "then run the same command with --retry-dead" in stderr
    code, stdout, stderr = _run(config, out)
    assert code == 1, stdout[-2000:] + stderr[-2000:]
    assert "already complete" in stdout
    assert "already complete, but every item died there (3): nothing was made" in stderr


def test_a_store_whose_every_item_died_is_not_finalised_and_its_rerun_says_so(tmp_path: Path) -> None:
    """Its finalize over nothing could only fail (the dataset writer's "no committed episodes"):
    that error stood where the items' deaths and ``--retry-dead`` belonged, and a rerun said
    "every item was done by an earlier run" before failing the same way (report ev 8)."""
    config = tmp_path / "doomed.toml"
    config.write_text(PIPELINE.format(cls="DoomedStoreStage"), encoding="utf-8")
    out = tmp_path / "out"
    code, stdout, stderr = _run(config, out)
    assert code == 1, stdout[-2000:] + stderr[-2000:]
    assert "finalize failed" not in stderr and "dead 3: KeyError" in " ".join(stdout.split())
    assert "every item died (3): the run made nothing;" in stderr and "--retry-dead" in stderr
    # As a run of before left it: the items dead in its journal, its record not complete.
    record = out / ".troupe" / "run.json"
    record.write_text(json.dumps({**json.loads(record.read_text()), "complete": None}))
    code, stdout, stderr = _run(config, out)
    assert code == 1, stdout[-2000:] + stderr[-2000:]
    said = " ".join(stdout.split())
    assert "every item died in an earlier run (3 of 3): nothing to finalise" in said, said
    assert "every item was done" not in said and "finalize failed" not in stderr
    assert "every item died (3): the run made nothing;" in stderr and "--retry-dead" in stderr


def test_a_run_whose_every_item_was_pruned_says_so_and_takes_another_config(tmp_path: Path) -> None:
    """It failed in the writer's finalize ("no committed episodes"), and so did every rerun:
    now it made nothing, says why (the first reason) and the way out (another config, the same
    --out), which takes the folder."""
    config = tmp_path / "pruned.toml"
    config.write_text(PIPELINE.format(cls="PruningStoreStage"), encoding="utf-8")
    out = tmp_path / "out"
    code, stdout, stderr = _run(config, out, "--json")
    assert code == 1, stdout[-2000:] + stderr[-2000:]
    assert json.loads(stdout)["made_nothing"] is True and "finalize failed" not in stderr
    said = " ".join(stderr.split())
    assert "error: no item made an output (3 pruned): the run made nothing;" in said, said
    assert "(the first: seed 0: no path to the goal)" in said and "into the same --out" in said
    code, stdout, stderr = _run(config, out)
    assert code == 1, stdout[-2000:] + stderr[-2000:]
    assert "already complete, but no item made an output there (3 pruned)" in " ".join(stderr.split())
    config.write_text(PIPELINE.format(cls="EchoStage"), encoding="utf-8")
    code, stdout, stderr = _run(config, out, "--json")
    assert code == 0, stdout[-2000:] + stderr[-2000:]
    assert json.loads(stdout)["items"]["ok"] == 3


def test_a_run_that_made_something_exits_0(tmp_path: Path) -> None:
    config = tmp_path / "echo.toml"
    config.write_text(PIPELINE.format(cls="EchoStage"), encoding="utf-8")
    code, stdout, stderr = _run(config, tmp_path / "out", "--json")
    assert code == 0, stdout[-2000:] + stderr[-2000:]
    assert json.loads(stdout)["made_nothing"] is False


MIXED = """
[pipeline]
name = "mixed"
items = 8
max_attempts = 1

[[stages]]
name = "first"
actor = "support.hook_stages:RecordingStage"
kwargs = {{ log = "{log}", prune_every = 4 }}

[[stages]]
name = "second"
actor = "support.hook_stages:FailingSeedStage"
kwargs = {{ every = 3 }}
"""


def test_a_rerun_that_finds_the_run_complete_counts_its_items(tmp_path: Path) -> None:
    """Found complete, a rerun reports how the job's items ended (``job_items``: --json had only
    this run's, all 0) and says how many died, where their errors are, and what runs them again."""
    config = tmp_path / "mixed.toml"
    config.write_text(MIXED.format(log=tmp_path / "first.jsonl"), encoding="utf-8")
    out = tmp_path / "out"
    code, stdout, stderr = _run(config, out, "--json")
    assert code == 0, stdout[-2000:] + stderr[-2000:]
    # Seeds 0 and 4 pruned by the first stage; 3 and 6 die in the second; 1, 2, 5, 7 ok.
    first = json.loads(stdout)
    assert first["items"] == {"ok": 4, "pruned": 2, "dead": 2, "kept": 0}
    assert first["job_items"] == {"ok": 4, "pruned": 2, "dead": 2}
    code, stdout, stderr = _run(config, out, "--json")
    assert code == 0, stdout[-2000:] + stderr[-2000:]
    again = json.loads(stdout)
    assert again["already_complete"] is True and again["job_items"] == first["job_items"]
    assert again["items"] == {"ok": 0, "pruned": 0, "dead": 0, "kept": 0}  # this run ran nothing
    code, stdout, stderr = _run(config, out)
    assert code == 0, stdout[-2000:] + stderr[-2000:]
    said = " ".join(stdout.split())
    assert "already complete" in said
    log = out / "logs" / "local.jsonl"
    assert f"2 of its 8 items died (their errors: {log}); {RETRY_DEAD_HINT}" in said
