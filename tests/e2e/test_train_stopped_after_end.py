"""A stop signal that reaches ``troupe run TRAIN.toml`` once the training has ended (its final
checkpoint committed), as its workers and node stop, does not say "stopped": the training was
complete, so the command says so and exits 0, and the same command run again says "already
complete". It used to exit 130, after the whole report (the stop cancelled nothing the run
still awaited, and the command took the signal for a stop), and a stop that landed on an await
of the node's stop said ``stopped: checkpoint at step N``. ``run_training`` stopped there
returns its result rather than raising the cancellation.

The moment is made, not raced: the rank's worker, stopped once the ranks were done, holds its
exit (``support.held_train``) until the test has stopped the run.
"""

from __future__ import annotations

import json
from functools import partial
from pathlib import Path

import anyio
import pytest

from support.clip_data import write_run
from support.held_stop import cancelled_once_held
from support.held_train import HELD, RELEASE
from support.run_resume_helpers import running
from support.train_run_cli import SMALL, config_copy
from troupe.actors.training.train_config import load_train_config
from troupe.actors.training.train_run import run_training
from troupe.runtime.testing.plugin import free_endpoint, import_path

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]

WAIT_S = 300.0  # a bound on waiting for another process, not on its speed
STEPS = SMALL["train"]["steps"]


def _held_config(tmp_path: Path) -> Path:
    """The shrunk train.toml on a tiny dataset, its rank's worker holding its exit."""
    dataset = tmp_path / "dataset"
    write_run(dataset, {f"ep{i}": 24 for i in range(4)})
    train = {"dataset": str(dataset), "dataset_class": "support.held_train:HeldClips"}
    return config_copy(tmp_path / "train.toml", "train.toml", {"train": train})


@pytest.mark.parametrize("as_json", [False, True], ids=["text", "json"])
def test_a_ctrl_c_after_the_training_ended_says_complete_and_the_rerun_trains_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, as_json: bool
) -> None:
    monkeypatch.setenv("PYTHONPATH", import_path())  # the rank's worker imports HeldClips
    config, out = _held_config(tmp_path), tmp_path / "out"
    held, release = tmp_path / HELD, tmp_path / RELEASE
    args = ["run", str(config), "--out", str(out), "--endpoint", free_endpoint()]
    final = (out / "checkpoints" / f"step-{STEPS:09d}").resolve()
    with running([*args, "--json"] if as_json else args, tmp_path, "run") as run:
        status = run.ctrl_c_while_held(
            "the training's end (the rank's worker exiting)", held, release, WAIT_S
        )
        text = run.text()
        assert status == 0, text[-3000:]
        assert "stopped" not in text.replace("stopping gracefully", ""), text[-3000:]
        if as_json:  # the object a rerun prints (stdout and stderr share the file here)
            said = json.loads(text[text.index("{") :])
            assert said == {"already_complete": True, "step": STEPS, "checkpoint": str(final)}, said
        else:
            flat = " ".join(text.split())
            assert f"complete when the stop came: {final} is step {STEPS}" in flat, text[-3000:]
            assert "trained " not in text  # not the report of a run that went on to its end
        assert not run.survivors(), "processes of the run left behind"

    with running(args, tmp_path, "rerun") as rerun:
        assert rerun.wait(timeout=WAIT_S) == 0, rerun.text()[-3000:]
        flat = " ".join(rerun.text().split())
    assert f"already complete: {final} is step {STEPS}" in flat, flat[-3000:]


def test_run_training_stopped_after_the_training_ended_returns_its_result(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PYTHONPATH", import_path())  # the rank's worker imports HeldClips
    cfg = load_train_config(_held_config(tmp_path))
    run = partial(run_training, cfg, tmp_path / "out")
    returned = anyio.run(cancelled_once_held, run, tmp_path / HELD, tmp_path / RELEASE, WAIT_S)
    assert len(returned) == 1, "the stopped run raised rather than returning its result"
    (result,) = returned
    assert result.steps == STEPS and len(result.losses) == STEPS
    assert Path(result.checkpoints[-1]).name == f"step-{STEPS:09d}"
