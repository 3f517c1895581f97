"""lc 6: a training run's log (``--out/logs/local.jsonl``) is its durable record: it says where the
run started (``train_started``: the steps, the step resumed from), each checkpoint committed, the
step, loss and samples/s every ``PROGRESS_EVERY`` steps, and how it ended (``train_finished``,
``train_stopped`` with the checkpoint a rerun resumes from, ``train_failed`` at error), and every
line it said on the terminal (``train_said``). It had said only that the workers were spawned.
Without processes: the run's driver over fake ranks (support/fake_training.py), and
``run_training`` over them where its folder and cluster are faked."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, MutableMapping
from pathlib import Path
from typing import Any

import anyio
import pytest

from support.fake_training import train_driver
from support.log_capture import module_logs
from support.recording_node import RecordingNode
from troupe.actors.training import train_driver as driver_module
from troupe.actors.training import train_run
from troupe.actors.training.checkpoint import COMMITTED, checkpoint_path
from troupe.actors.training.train_result import TrainingFailed
from troupe.runtime.errors import leaf_errors
from troupe.runtime.last_words import said_at_once
from troupe.runtime.placement import Host

HANG_GUARD_S = 60  # a bound on a hang, never on speed
NODE = "tcp://127.0.0.1:1"
STEPS = 25


class ScriptedRanks:
    """One node, whose rank 0 resumes from step 10 and answers ``progress`` from ``script`` (the
    last answer repeated). ``hold``: the last answer is never given, ``held`` set as it is asked
    (the rank trains on until the run is stopped)."""

    address = "tcp://127.0.0.1:9"

    def __init__(self, script: list[dict[str, Any]], hold: bool = False) -> None:
        self.nodes = {NODE: RecordingNode()}
        self.script, self.hold = list(script), hold
        self.held = anyio.Event()

    async def control(self, endpoint: str, kind: str, payload: Any, timeout: float | None = None) -> Any:
        return await self.nodes[endpoint].control(endpoint, kind, payload, timeout)

    def ref(self, actor: str) -> Any:
        return _Rank(self)


class _Rank:
    def __init__(self, cluster: ScriptedRanks) -> None:
        self.cluster = cluster

    async def ask(self, msg_type: str, payload: Any, timeout: float | None = None) -> Any:
        cluster = self.cluster
        if msg_type == "start":
            return {"started": True, "resumed_from": 10}
        if len(cluster.script) == 1 and cluster.hold:
            cluster.held.set()
            await anyio.sleep_forever()
        return cluster.script.pop(0) if len(cluster.script) > 1 else cluster.script[0]


def _running(step: int, checkpoint: int) -> dict[str, Any]:
    return {"state": "running", "step": step, "steps": STEPS, "loss": 1.0 / step, "samples_per_s": 4.0,
            "checkpoint": checkpoint}  # fmt: skip


DONE = {"state": "done", "step": STEPS, "steps": STEPS, "loss": 0.04, "samples_per_s": 4.0,
        "checkpoint": STEPS, "result": {"losses": [0.05] * 14 + [0.04]}}  # fmt: skip
SCRIPT = [_running(12, 10), _running(20, 20), _running(22, 20), DONE]


def _events(logs: list[MutableMapping[str, Any]], *names: str) -> list[MutableMapping[str, Any]]:
    return [e for e in logs if e["event"] in names]


async def test_the_driver_logs_the_start_each_checkpoint_and_the_progress(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    driver = train_driver(ScriptedRanks(SCRIPT), tmp_path, None, ranks=1, encoders=0, max_restarts=0)
    driver.cfg.train.steps = STEPS
    with module_logs(monkeypatch, driver_module) as logs, anyio.fail_after(HANG_GUARD_S):
        await driver.main(False)
    started, *_ = _events(logs, "train_started")
    assert (started["steps"], started["resumed_from"], started["ranks"]) == (STEPS, 10, 1)
    assert started["checkpoint_dir"] == str(tmp_path / "ck")
    # The checkpoint it resumed from was an earlier run's: not committed by this one.
    committed = [(e["step"], e["path"]) for e in _events(logs, "train_checkpoint_committed")]
    assert committed == [(s, str(checkpoint_path(tmp_path / "ck", s))) for s in (20, STEPS)]
    progress = [(e["step"], e["loss"], e["checkpoint"]) for e in _events(logs, "train_progress")]
    assert progress == [(20, 1.0 / 20, 20), (STEPS, 0.04, STEPS)]  # past 20, and the last step
    assert all(e["log_level"] == "info" for e in _events(logs, "train_started", "train_progress"))


@contextlib.contextmanager
def _faked_run(monkeypatch: pytest.MonkeyPatch, cluster: Any, out: Path) -> Any:
    """``run_training`` over ``cluster``: its folder's checks and its cluster faked."""
    cfg = train_driver(cluster, out, None, ranks=1, encoders=0, max_restarts=0).cfg
    cfg.train.steps = STEPS

    class Held:
        def release(self) -> None:
            pass

    (out / "logs").mkdir(parents=True, exist_ok=True)
    monkeypatch.setattr(train_run, "prepare_run", lambda *_: (cfg, out, Held(), ["other code made --out"]))

    @contextlib.asynccontextmanager
    async def cluster_here(*_: Any) -> AsyncIterator[tuple[Any, list[Host]]]:
        yield cluster, [Host.anything("n0", NODE, 0)]

    monkeypatch.setattr(train_run, "training_cluster", cluster_here)
    with module_logs(monkeypatch, train_run, driver_module) as logs:
        yield logs


async def test_a_run_logs_what_it_said_and_that_it_finished(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    said: list[str] = []
    with _faked_run(monkeypatch, ScriptedRanks(SCRIPT), tmp_path / "out") as logs:
        with anyio.fail_after(HANG_GUARD_S):
            result = await train_run.run_training("faked", tmp_path / "out", on_event=said.append)
    assert said[0] == "other code made --out" and said[-1].startswith("resuming from step 10 "), said
    assert [e["line"] for e in _events(logs, "train_said")] == said
    finished, *_ = _events(logs, "train_finished")
    assert (finished["step"], finished["steps_this_run"], finished["resumed_from"]) == (STEPS, 15, 10)
    assert finished["loss"] == result.loss == 0.04 and finished["wall_s"] == round(result.wall_s, 3)
    assert logs[-1]["event"] == "train_finished"


async def test_a_run_that_fails_logs_it_at_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    failing = [
        _running(12, 10),
        {"state": "failed", "step": 12, "error": "LossNotFinite: nan", "final": True},
    ]
    with (
        _faked_run(monkeypatch, ScriptedRanks(failing), tmp_path / "out") as logs,
        anyio.fail_after(HANG_GUARD_S),
        pytest.raises(BaseExceptionGroup) as raised,
    ):  # the CLI says its one TrainingFailed
        await train_run.run_training("faked", tmp_path / "out")
    assert [type(e) for e in leaf_errors(raised.value)] == [TrainingFailed]
    failed, *_ = _events(logs, "train_failed")
    assert failed["log_level"] == "error" and failed["step"] == 12
    assert failed["error"].startswith("TrainingFailed: training failed: rank 0: LossNotFinite: nan"), failed
    assert not _events(logs, "train_finished", "train_stopped")


async def test_a_stopped_run_logs_the_checkpoint_a_rerun_resumes_from(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "out"
    stop_saved = checkpoint_path(out / "ck", 14)  # as the rank saves the step it stopped at
    stop_saved.mkdir(parents=True)
    (stop_saved / COMMITTED).write_text("14\n")
    cluster = ScriptedRanks([_running(12, 10), _running(14, 10)], hold=True)  # 14: never answered
    with _faked_run(monkeypatch, cluster, out) as logs:
        with anyio.fail_after(HANG_GUARD_S):
            async with anyio.create_task_group() as tg:
                tg.start_soon(train_run.run_training, "faked", out)
                await cluster.held.wait()  # rank 0 seen at step 12, then training on
                tg.cancel_scope.cancel()  # the run's Ctrl-C
    stopped, *_ = _events(logs, "train_stopped")
    assert (stopped["step"], stopped["checkpoint_step"], stopped["checkpoint"]) == (12, 14, str(stop_saved))
    assert not _events(logs, "train_finished", "train_failed")


def _commit(directory: Path, step: int) -> None:
    """A checkpoint folder of ``step``, committed (its ``COMMITTED`` marker) as rank 0 commits it."""
    folder = checkpoint_path(directory, step)
    folder.mkdir(parents=True)
    (folder / COMMITTED).write_text(f"{step}\n")


def test_each_checkpoint_committed_between_two_polls_is_logged_in_step_order(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """tr 2: the ranks name only their newest checkpoint, so two committed between polls (0.5 s)
    were one event; the folder's markers say which were. The polls driven here one by one."""
    driver = train_driver(ScriptedRanks(SCRIPT), tmp_path, None, ranks=1, encoders=0, max_restarts=0)
    driver.cfg.train.steps = STEPS
    ck = tmp_path / "ck"
    for step in (5, 10, 15, 20):
        _commit(ck, step)
    checkpoint_path(ck, 22).mkdir()  # written, not committed (a run killed while writing it)

    def poll(step: int, checkpoint: int) -> list[int]:
        driver.ranks[0].last = _running(step, checkpoint)
        with module_logs(monkeypatch, driver_module) as logs:
            driver._record()
        return [e["step"] for e in _events(logs, "train_checkpoint_committed")]

    driver._logged_checkpoint = 10  # resumed from 10, as _start_ranks records it: an earlier run's
    assert poll(21, 20) == [15, 20]  # 5 and 10 were committed before this run
    assert poll(22, 20) == []  # said already
    _commit(ck, 25)
    assert poll(25, 20) == []  # in the folder, not yet in the ranks' answer: the next poll's
    assert poll(25, 25) == [25]
    # A folder the run cannot see (a cluster's ranks writing on their own disks): the ranks' newest.
    driver.cfg.train.checkpoint_dir = str(tmp_path / "elsewhere")
    assert poll(31, 30) == [30]


@pytest.mark.parametrize("master", [None, "tcp://127.0.0.1:2"], ids=["one host", "cluster"])
async def test_a_stop_at_once_logs_the_end_and_names_the_checkpoint_a_rerun_resumes_from(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, master: str | None
) -> None:
    """dt 7: a second Ctrl-C exits at once (os._exit) from the CLI's stop: the log had no end and
    the terminal said ``0 processes killed`` (a cluster's ranks are not this host's). The run's
    last words (runtime/last_words.py), called as that stop calls them while the run runs, log
    ``train_stopped`` once and say the newest committed checkpoint read from the disk."""
    out = tmp_path / "out"
    _commit(out / "ck", 10)
    cluster = ScriptedRanks([_running(12, 10), _running(14, 10)], hold=True)
    if master is not None:  # the driver pings its master too
        cluster.nodes[master] = RecordingNode()
    checked: list[str] = []

    async def master_checked(endpoint: str, keys: Any) -> None:
        checked.append(endpoint)

    monkeypatch.setattr(train_run, "check_master", master_checked)

    async def stop_remote_here(*_: Any) -> None:
        pass

    monkeypatch.setattr(train_run, "stop_remote", stop_remote_here)
    with _faked_run(monkeypatch, cluster, out) as logs:
        with anyio.fail_after(HANG_GUARD_S):
            async with anyio.create_task_group() as tg:
                tg.start_soon(lambda: train_run.run_training("faked", out, master=master))
                await cluster.held.wait()  # rank 0 seen at step 12, then training on
                _commit(out / "ck", 14)  # as a rank commits the step it stopped at, meanwhile
                said = await anyio.to_thread.run_sync(said_at_once)
                again = await anyio.to_thread.run_sync(said_at_once)  # a third signal: logged once
                tg.cancel_scope.cancel()
    final = checkpoint_path(out / "ck", 14)
    line = f"checkpoint at step 14 in {final}; the same command run again resumes from it"
    assert said == again and said[0].startswith(line), said
    asked = "its ranks and encoders on the cluster's nodes were asked to stop"
    assert (asked in said[0]) is (master is not None), said
    stopped = _events(logs, "train_stopped")
    assert len(stopped) == 1, stopped  # the run's own end, once the stop reached it, logs none
    assert (stopped[0]["step"], stopped[0]["checkpoint_step"], stopped[0]["at_once"]) == (12, 14, True)
    assert stopped[0]["checkpoint"] == str(final)
    assert said_at_once() == []  # the run is over: nothing of it is said
    assert checked == ([] if master is None else [master])  # asked before --out is made (dt 2)
