"""A run on a cluster stopped after its finalisation (as its replicas stop) is complete, as a
one-host run is: `troupe run --cluster` says `complete when the stop came` and exits 0, and the
same command run again says `already complete` without finalising again; ``run_pipeline``
returns its result, and its rerun is ``already_complete``. Such a run kept no record in --out:
it was not said complete, and its rerun finalised again. The stop also ends the run's waits for
the node's answers to its replicas' stops, which it no longer reads: each was waited out (30 s)
before the command exited.

The moment is made, not raced: the last stage's replica (``support.held_stop``), stopped once
its ``finalize`` ran, holds its stop until the test has stopped the run. One node on loopback
(127.0.0.2) joined to a test's master; every process is reaped by its pid.
"""

from __future__ import annotations

from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import anyio
import pytest

from support.chaos import TaskMaster
from support.held_stop import (
    HELD_FINALS,
    HELD_ITEMS,
    cancelled_once_held,
    finalized,
    held_pipeline,
    rerun_finalises_nothing,
)
from support.hook_stages import read_records
from support.run_resume_helpers import running
from support.tagged_nodes import tagged_nodes
from troupe.runtime.pipeline.config import load_pipeline
from troupe.runtime.pipeline.result import PipelineResult
from troupe.runtime.pipeline.runner import run_pipeline
from troupe.runtime.testing.plugin import import_path

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]

NODES = {"na": ("127.0.0.2", "any")}
WAIT_S = 120.0  # a bound on waiting for another process, not on its speed
HOLD_S = 4.0  # the replica's hold, should the test not end it: under the node's stop grace (5 s)


@pytest.fixture
def one_node(tmp_path: Path, master: TaskMaster, monkeypatch: pytest.MonkeyPatch) -> Iterator[TaskMaster]:
    monkeypatch.setenv("PYTHONPATH", import_path())  # the command and the replicas import the stages
    with tagged_nodes(master, tmp_path, NODES, env={"PYTHONPATH": import_path()}):
        yield master


def _stops_given_up(out: Path) -> list[dict[str, Any]]:
    """The replica stops whose answer the run waited out (30 s each) in its log: once stopped,
    its runtime reads no replies, so a wait the stop does not end ends only so."""
    logs = sorted((out / "logs").glob("*.jsonl"))
    return [r for path in logs for r in read_records(path) if r.get("event") == "replica_stop_failed"]


def test_a_ctrl_c_after_a_cluster_run_s_finalisation_says_complete_and_the_rerun_finalises_nothing(
    tmp_path: Path, one_node: TaskMaster
) -> None:
    log, held, release = tmp_path / "hooks.jsonl", tmp_path / "held", tmp_path / "release"
    config, out = held_pipeline(tmp_path, log, held, release, HOLD_S), tmp_path / "out"
    args = ["run", str(config), "--out", str(out), "--cluster", one_node.endpoint]
    with running(args, tmp_path, "run") as run:
        status = run.ctrl_c_while_held(
            "the finalisation's end (the last stage's replica stopping)", held, release, WAIT_S
        )
        text = run.text()
        assert status == 0, text[-3000:]
        assert f"complete when the stop came: {HELD_FINALS}" in " ".join(text.split()), text[-3000:]
        assert "stopped: at least" not in text, text[-3000:]
        assert not run.survivors(), "processes of the run left behind"
    assert finalized(log) == 2  # each stage's finalize, once
    assert _stops_given_up(out) == []  # the stop ended the waits for the node's answers

    rerun_finalises_nothing(args, tmp_path, log, WAIT_S)


def test_run_pipeline_stopped_after_a_cluster_run_s_finalisation_returns_its_result(
    tmp_path: Path, one_node: TaskMaster
) -> None:
    log, held, release = tmp_path / "hooks.jsonl", tmp_path / "held", tmp_path / "release"
    cfg = load_pipeline(held_pipeline(tmp_path, log, held, release, HOLD_S))
    out = tmp_path / "out"

    run = partial(run_pipeline, cfg, out, cluster=one_node.endpoint)
    returned = anyio.run(cancelled_once_held, run, held, release, WAIT_S)
    assert len(returned) == 1, "the stopped run raised rather than returning its result"
    (result,) = returned
    assert not result.already_complete
    assert result.counts()["ok"] == HELD_ITEMS
    assert [f["summary"] for f in result.finals.values()] == HELD_FINALS.split("; ")
    assert finalized(log) == 2

    async def rerun() -> PipelineResult:
        with anyio.fail_after(WAIT_S):
            return await run_pipeline(cfg, out, cluster=one_node.endpoint)

    again = anyio.run(rerun)
    assert again.already_complete
    assert again.finals == result.finals
    assert finalized(log) == 2  # the rerun finalised nothing again
