"""A stop signal that reaches `troupe run` after its finalisation has written the outputs (as
the replicas and the node stop) does not say "stopped": the run was complete, so the command
says so and exits 0, and the same command run again says "already complete" rather than
finalising again. It used to exit 130 with `stopped: at least 4 of 4 items done`, its record
not yet written, and the rerun finalised again. ``run_pipeline`` stopped (cancelled) there
returns its result: it raised the cancellation, although the outputs were complete.

The moment is made, not raced: the last stage's replica (``support.held_stop``), stopped once
its ``finalize`` ran, holds its stop until the test has stopped the run.
"""

from __future__ import annotations

from functools import partial
from pathlib import Path

import anyio
import pytest

from support.held_stop import (
    HELD_FINALS,
    HELD_ITEMS,
    cancelled_once_held,
    finalized,
    held_pipeline,
    rerun_finalises_nothing,
)
from support.run_resume_helpers import running
from troupe.runtime.pipeline.config import load_pipeline
from troupe.runtime.pipeline.runner import run_pipeline
from troupe.runtime.testing.plugin import free_endpoint, import_path

pytestmark = pytest.mark.e2e

WAIT_S = 120.0  # a bound on waiting for another process, not on its speed


@pytest.mark.timeout(300)
def test_a_ctrl_c_after_the_finalisation_says_complete_and_the_rerun_finalises_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PYTHONPATH", import_path())  # the replicas import the test's stages
    log, held, release = tmp_path / "hooks.jsonl", tmp_path / "held", tmp_path / "release"
    config, out = held_pipeline(tmp_path, log, held, release), tmp_path / "out"
    args = ["run", str(config), "--out", str(out), "--endpoint", free_endpoint(), "--master", free_endpoint()]
    with running(args, tmp_path, "run") as run:
        status = run.ctrl_c_while_held(
            "the finalisation's end (the last stage's replica stopping)", held, release, WAIT_S
        )
        text = run.text()
        flat = " ".join(text.split())
        assert status == 0, text[-3000:]
        assert f"complete when the stop came: {HELD_FINALS}" in flat
        assert "stopped: at least" not in text, text[-3000:]
        assert not run.survivors(), "processes of the run left behind"
        assert len(run.seen) >= 3  # the template and a replica per stage were tracked
    assert finalized(log) == 2  # each stage's finalize, once

    rerun_finalises_nothing(args, tmp_path, log, WAIT_S)


@pytest.mark.timeout(300)
def test_run_pipeline_stopped_after_the_finalisation_returns_its_result(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PYTHONPATH", import_path())  # the replicas import the test's stages
    log, held, release = tmp_path / "hooks.jsonl", tmp_path / "held", tmp_path / "release"
    cfg = load_pipeline(held_pipeline(tmp_path, log, held, release))
    run = partial(run_pipeline, cfg, tmp_path / "out")
    returned = anyio.run(cancelled_once_held, run, held, release, WAIT_S)
    assert len(returned) == 1, "the stopped run raised rather than returning its result"
    (result,) = returned
    assert not result.already_complete
    assert result.counts()["ok"] == HELD_ITEMS
    assert [f["summary"] for f in result.finals.values()] == HELD_FINALS.split("; ")

    again = anyio.run(partial(run_pipeline, cfg, tmp_path / "out"))
    assert again.already_complete and again.finals == result.finals
    assert finalized(log) == 2  # each stage's finalize, once: the rerun finalised nothing again
