"""Stage lifecycle hooks with real replicas: ``start`` once before any item, committed items
kept, ``finalize`` once after the last item (even when the scaler took the stage's replicas
away), a failing ``finalize`` reported by stage, the first stage told each item's attempt, and
the last stage's outputs returned.

Each test runs ``run_pipeline`` with no ``out``: a node inside the test process, whose workers
are the replicas (``tests/support/hook_stages.py``, imported through ``PYTHONPATH``); the
suite's conftest fails a test that leaves a process behind.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import psutil
import pytest

from support.hook_stages import FailingFinalizeStage, read_records
from troupe.runtime.errors import StageFailed
from troupe.runtime.pipeline import replicas
from troupe.runtime.pipeline.config import PipelineConfig
from troupe.runtime.pipeline.engine import PipelineResult
from troupe.runtime.pipeline.runner import run_pipeline
from troupe.runtime.testing.plugin import import_path

pytestmark = pytest.mark.e2e

HOOKS = "support.hook_stages"
COST = "troupe.actors.bench.synthetic:CostStage"
RUN_TIMEOUT_S = 90


@pytest.fixture(autouse=True)
def workers_import_the_test_stages(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The replicas (and the class check's child) import what this process imports."""
    monkeypatch.setenv("PYTHONPATH", import_path())
    yield


def _stage(name: str, cls: str, **fields: Any) -> dict[str, Any]:
    kwargs = fields.pop("kwargs", {})
    return {"name": name, "actor": cls if ":" in cls else f"{HOOKS}:{cls}", **fields, "kwargs": kwargs}


def _pipeline(items: int, *stages: dict[str, Any], **fields: Any) -> PipelineConfig:
    return PipelineConfig.model_validate(
        {"name": "hooks", "items": items, "scale_interval_s": 0.1, **fields, "stages": list(stages)}
    )


async def _run(cfg: PipelineConfig, **kwargs: Any) -> PipelineResult:
    with anyio.fail_after(RUN_TIMEOUT_S):
        return await run_pipeline(cfg, **kwargs)


def _ids(records: list[dict[str, Any]], hook: str, stage: str | None = None) -> list[int]:
    """Positions in the log of ``hook`` records (of ``stage``, if given)."""
    return [
        i
        for i, r in enumerate(records)
        if r["hook"] == hook and (stage is None or stage in (r.get("stage"), r.get("label")))
    ]


def _task_id(index: int) -> str:
    return f"hooks-{index:06d}"


async def test_start_runs_once_before_any_item_and_finalize_once_after_the_last(tmp_path: Path) -> None:
    """Two replicas of "a" and one of "b": each stage's start runs once, on one of its replicas,
    before any item is processed anywhere, told the run; each finalize runs once, after every
    item, and its return is the run's finals."""
    log = str(tmp_path / "hooks.jsonl")
    cfg = _pipeline(
        8,
        _stage("a", "RecordingStage", replicas=2, kwargs={"log": log, "label": "a", "cost_s": 0.01}),
        _stage("b", "RecordingStage", kwargs={"log": log, "label": "b"}),
        seed_start=5,
    )
    result = await _run(cfg)
    records = read_records(Path(log))

    assert result.counts() == {"ok": 8, "pruned": 0, "dead": 0, "kept": 0}
    processed = _ids(records, "process")
    assert len(processed) == 16  # each item once in each stage
    for stage in ("a", "b"):
        (start,) = _ids(records, "start", stage)
        (final,) = _ids(records, "finalize", stage)
        assert start < min(processed) and final > max(processed), records
        told = {k: records[start][k] for k in ("pipeline", "stage", "items", "seed_start", "out", "fresh")}
        assert told == {
            "pipeline": "hooks",
            "stage": stage,
            "items": 8,
            "seed_start": 5,
            "out": None,
            "fresh": False,
        }
        assert result.finals[stage] == {
            "summary": f"{stage} finalised 8 items",
            "stage": stage,
            "pid": records[final]["pid"],
        }
    a_pids = {records[i]["pid"] for i in _ids(records, "process", "a")}
    assert len(a_pids) == 2, "both replicas of a should have worked"
    assert records[_ids(records, "start", "a")[0]]["pid"] in a_pids  # on a replica, not a process of its own
    a_seeds = sorted(r["seed"] for r in records if r["hook"] == "process" and r["stage"] == "a")
    assert a_seeds == list(range(5, 13))  # seed_start = 5


async def test_stages_without_a_finalize_hook_stop_while_the_others_finalize(tmp_path: Path) -> None:
    """Once every item has its outcome, the replicas of a stage with nothing to finalise stop
    at once, while the stages that finalise do (a dataset's write), not after them: their
    exits were most of a run's stop."""
    log = str(tmp_path / "hooks.jsonl")
    cfg = _pipeline(
        4,
        _stage("up", "UpstreamStage", replicas=2, kwargs={"log": log}),
        _stage("last", "UpstreamGoneStage", kwargs={"log": log}),
    )
    result = await _run(cfg)
    assert result.counts() == {"ok": 4, "pruned": 0, "dead": 0, "kept": 0}
    assert result.finals["last"]["upstream"], result.finals  # the upstream replicas were seen
    assert result.finals["last"]["gone"] is True, result.finals


async def test_the_node_retires_its_template_while_the_stages_finalize(tmp_path: Path) -> None:
    """Once every item has its outcome and each finalize hook has its replica, the run's node
    stops its template (and its light sibling): their exits go on during the finalize hooks,
    not in the node's stop after them."""
    cfg = _pipeline(3, _stage("a", "EchoStage"), _stage("last", "TemplateGoneStage"))
    result = await _run(cfg)
    assert result.counts()["ok"] == 3
    assert result.finals["last"]["templates_left"] == 0, result.finals


async def test_items_named_committed_by_start_are_kept_and_never_processed(tmp_path: Path) -> None:
    """What ``start`` names as committed ends "kept": no stage processes it, it is counted in
    ``result.kept`` and not in the run's own ok count; the rest run as usual."""
    log = str(tmp_path / "hooks.jsonl")
    committed = [_task_id(1), _task_id(4)]
    cfg = _pipeline(
        6,
        _stage("a", "CommittedStage", kwargs={"log": log, "label": "a", "committed": committed}),
        _stage("b", "RecordingStage", kwargs={"log": log, "label": "b"}),
    )
    result = await _run(cfg)
    records = read_records(Path(log))

    assert {tid for tid, o in result.outcomes.items() if o == "kept"} == set(committed)
    assert result.kept == 2
    assert result.counts() == {"ok": 4, "pruned": 0, "dead": 0, "kept": 2}
    assert result.metrics.items_ok == 4
    seen = {r["task_id"] for r in records if r["hook"] == "process"}
    assert seen == {_task_id(i) for i in (0, 2, 3, 5)}
    assert set(committed).isdisjoint(result.outputs)


async def test_finalize_runs_once_on_a_new_replica_when_the_scaler_retired_the_stage(tmp_path: Path) -> None:
    """Stage "a" drains early and the scaler gives its replica back; its finalize still runs
    exactly once, after the last item of the run, on a replica started for it."""
    log = str(tmp_path / "hooks.jsonl")
    cfg = _pipeline(
        20,
        _stage("a", "RecordingStage", kwargs={"log": log, "label": "a"}),
        _stage("b", "RecordingStage", queue=20, kwargs={"log": log, "label": "b", "cost_s": 0.05}),
    )
    result = await _run(cfg)
    records = read_records(Path(log))

    assert result.counts()["ok"] == 20
    assert ("a", 0, "retired") in [entry[1:] for entry in result.scale_log], result.scale_log
    (final,) = _ids(records, "finalize", "a")
    assert final > max(_ids(records, "process")), "finalize ran before the last item"
    processing_pids = {records[i]["pid"] for i in _ids(records, "process", "a")}
    assert records[final]["pid"] not in processing_pids  # the retired replica is gone
    assert result.finals["a"]["pid"] == records[final]["pid"]
    assert len(_ids(records, "finalize", "b")) == 1


def _failing_finalize_pipeline(log: str) -> PipelineConfig:
    return _pipeline(
        4,
        _stage("a", "RecordingStage", kwargs={"log": log, "label": "a"}),
        _stage("b", "FailingFinalizeStage", kwargs={"log": log, "label": "b"}),
    )


async def test_a_failing_finalize_raises_stage_failed_and_reaps_every_process(tmp_path: Path) -> None:
    """A finalize that raises ends the run with StageFailed itself (``except StageFailed``
    catches it, no ExceptionGroup around it) naming the stage and the error, after every item
    was processed; the node and every replica are gone afterwards."""
    log = str(tmp_path / "hooks.jsonl")
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    with pytest.raises(StageFailed) as raised:
        await _run(_failing_finalize_pipeline(log))
    message = str(raised.value)
    assert "stage b" in message and FailingFinalizeStage.MESSAGE in message, message
    records = read_records(Path(log))
    assert len(_ids(records, "finalize", "b")) == 1
    assert len([r for r in records if r["hook"] == "process" and r["stage"] == "b"]) == 4
    left = [p for p in psutil.Process().children(recursive=True) if p.pid not in before]
    _, alive = psutil.wait_procs(left, timeout=10)
    assert not alive, f"processes left after the failed run: {alive}"


async def test_an_output_deleted_after_its_item_ended_is_made_again_by_the_rerun(tmp_path: Path) -> None:
    """A first run into ``out`` ends every item (its finalize fails, so the run is not
    complete); one committed output is deleted; the rerun makes that item again, and only it,
    and says so: the job's record had it done, but a committed output is the truth. Without
    it the rerun finalised a dataset one episode short and exited 0."""
    log, outputs, gate = str(tmp_path / "hooks.jsonl"), tmp_path / "outputs", tmp_path / "finalize-fails"
    gate.touch()
    cfg = _pipeline(
        6,
        _stage("w", "OutputFileStage", kwargs={"log": log, "outputs": str(outputs), "fail_while": str(gate)}),
    )
    with pytest.raises(StageFailed):
        await _run(cfg, out=tmp_path / "out")
    assert sorted(p.name for p in outputs.iterdir()) == [_task_id(i) for i in range(6)]
    (outputs / _task_id(2)).unlink()
    gate.unlink()
    first = len(read_records(Path(log)))
    events: list[str] = []

    result = await _run(cfg, out=tmp_path / "out", on_event=events.append)

    again = [r["task_id"] for r in read_records(Path(log))[first:] if r["hook"] == "process"]
    assert again == [_task_id(2)]
    assert sorted(p.name for p in outputs.iterdir()) == [_task_id(i) for i in range(6)]
    assert result.remade == 1 and result.outcomes == {_task_id(2): "ok"}, result
    assert "; 5 done by earlier runs (5 recorded); 1 made again" in result.earlier_runs(6)
    assert any(_task_id(2) in line and "made again" in line for line in events), events


async def test_a_rerun_does_not_count_an_earlier_runs_dead_items_as_its_own(tmp_path: Path) -> None:
    """Items dead-lettered by a first run (its finalize failed, so it was run again): the rerun
    counts them with what earlier runs ended, not among its own dead as well (its closing line
    added up to more items than the pipeline has)."""
    log, gate = str(tmp_path / "hooks.jsonl"), tmp_path / "finalize-fails"
    gate.touch()
    cfg = _pipeline(
        6,
        _stage("a", "FailingSeedStage", kwargs={"every": 3}),
        _stage("b", "FailingFinalizeStage", kwargs={"log": log, "fail_while": str(gate)}),
        max_attempts=1,
    )
    with pytest.raises(StageFailed):
        await _run(cfg, out=tmp_path / "out")
    gate.unlink()
    starts: list[Any] = []
    result = await _run(cfg, out=tmp_path / "out", on_start=starts.append)
    assert starts[0].before == 6
    assert result.counts() == {"ok": 0, "pruned": 0, "dead": 0, "kept": 0}, result.outcomes
    assert result.earlier_runs(starts[0].before) == "; 6 done by earlier runs (6 recorded)"


async def test_a_replica_that_starts_slowly_is_said_while_the_run_waits(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A constructor that waits: the run says which replica it waits for and for how long (it
    said nothing until the start was given up, two minutes on), then goes on once it serves."""
    monkeypatch.setattr(replicas, "_SLOW_START_S", 0.1)
    events: list[str] = []
    result = await _run(
        _pipeline(2, _stage("s", "SlowStartStage", kwargs={"wait_s": 1.5})), on_event=events.append
    )
    assert result.counts()["ok"] == 2
    slow = [line for line in events if "has been starting for" in line]
    assert slow and "replica hooks-s-0 of stage s" in slow[0] and "given up at 120 s" in slow[0], events


async def test_a_stage_that_calls_sys_exit_kills_its_items_not_the_run(tmp_path: Path) -> None:
    """``sys.exit(3)`` in ``process`` on every fifth item, two calls outstanding per replica:
    those items die, each naming the sys.exit, and every other item passes. The call that
    waited behind the exiting one waited for a reply that could not come: the run hung."""
    cfg = _pipeline(10, _stage("x", "ExitingStage", inflight=2, kwargs={"exit_every": 5}), max_attempts=2)
    result = await _run(cfg)
    dead = sorted(t for t, outcome in result.outcomes.items() if outcome == "dead")
    assert dead == [_task_id(4), _task_id(9)], result.outcomes
    assert result.counts()["ok"] == 8
    assert all("sys.exit(3)" in result.errors[t] for t in dead), result.errors


async def test_the_first_stage_sees_attempt_0_and_1_on_a_retry(tmp_path: Path) -> None:
    """The first stage's items carry ``attempt``: 0 at first, 1 on the retry of an item whose
    first attempt erred; the retried items then end ok."""
    log = str(tmp_path / "attempts.jsonl")
    cfg = _pipeline(
        7,
        _stage("a", "AttemptStage", kwargs={"log": log, "fail_every": 3}),
        _stage("b", "EchoStage"),
    )
    result = await _run(cfg)

    assert result.counts() == {"ok": 7, "pruned": 0, "dead": 0, "kept": 0}
    seen: dict[int, list[int]] = {}
    for r in read_records(Path(log)):
        seen.setdefault(r["seed"], []).append(r["attempt"])
    assert {seed: sorted(a) for seed, a in seen.items()} == {
        seed: [0, 1] if seed % 3 == 0 else [0] for seed in range(7)
    }


async def test_outputs_of_the_last_stage_are_returned_by_task_id(tmp_path: Path) -> None:
    """``run_pipeline`` keeps the last stage's output of each ok item (``keep_outputs``, on by
    default): a pruned item has none; with ``keep_outputs=False`` there are none at all."""
    cfg = _pipeline(
        6,
        _stage("a", COST, kwargs={"cost_s": 0.001, "prune_every": 4}),
        _stage("b", "EchoStage"),
    )
    result = await _run(cfg)
    ok = {_task_id(i): {"task_id": _task_id(i), "seed": i} for i in (1, 2, 3, 5)}
    assert result.counts() == {"ok": 4, "pruned": 2, "dead": 0, "kept": 0}
    assert result.outputs == ok

    quiet = await _run(cfg, keep_outputs=False)
    assert quiet.counts()["ok"] == 4 and quiet.outputs == {}
