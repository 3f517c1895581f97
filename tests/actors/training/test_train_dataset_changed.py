"""A training resumed on a dataset other than its checkpoints were trained on is refused before
anything starts, in one line: a dataset made again with fewer clips failed each of three
restarts on ``IndexError: clip index 21 out of range``, another ``train.seed`` on the sampler's
``ValueError``, and a larger dataset of other content trained on without a word. A store that
grew (a run still writing it) goes on, and the run says so."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from trainer_testdata import train_data, write_clips

from support.train_run_cli import config_copy, run_cli
from troupe.actors.training.train_prepare import prepare_run
from troupe.runtime.errors import ConfigError


def _checkpointed(dataset: Path, out: Path, **train: object) -> None:
    """``out`` as a run on ``dataset`` left it: recorded, one checkpoint committed."""
    prepare_run(train_data(dataset, 4, **train), out, None, fresh=False)[2].release()
    step = out / "checkpoints" / "step-000000002"
    step.mkdir(parents=True)
    (step / "COMMITTED").write_text("2\n")


def _resume(dataset: Path, out: Path, **train: object) -> list[str]:
    _cfg, _out, held, lines = prepare_run(train_data(dataset, 4, **train), out, None, fresh=False)
    held.release()
    return lines


def _record(out: Path) -> dict[str, object]:
    data: dict[str, object] = json.loads((out / ".troupe-train" / "run.json").read_text())
    return data


def test_a_dataset_made_again_with_fewer_episodes_is_refused(tmp_path: Path) -> None:
    dataset, out = write_clips(tmp_path / "data", episodes=3), tmp_path / "out"
    _checkpointed(dataset, out)
    shutil.rmtree(dataset)
    write_clips(dataset, episodes=2)  # the same first episodes: it shrank
    with pytest.raises(ConfigError) as err:
        _resume(dataset, out)
    assert str(err.value) == (
        f"train.dataset {dataset} holds 2 episodes, fewer than the 3 --out {out}'s checkpoints were "
        "trained on: it changed since; give the run back the dataset it trained on, or --fresh to "
        "start anew on this one"
    )
    prepare_run(train_data(dataset, 4), out, None, fresh=True)[2].release()  # --fresh: anew on it


def test_a_larger_dataset_of_other_content_is_refused(tmp_path: Path) -> None:
    dataset, out = write_clips(tmp_path / "data", episodes=3), tmp_path / "out"
    _checkpointed(dataset, out)
    shutil.rmtree(dataset)
    write_clips(dataset, episodes=4, length=20)  # other episodes under the same names
    with pytest.raises(ConfigError, match=r"is not the dataset --out .* were trained on: its episode ep-0 "
                       r"holds other data \(4 episodes now, 3 then\); give the run back"):  # fmt: skip
        _resume(dataset, out)


def test_a_dataset_that_grew_goes_on_and_is_said(tmp_path: Path) -> None:
    dataset, out = write_clips(tmp_path / "data", episodes=2), tmp_path / "out"
    _checkpointed(dataset, out)
    assert _resume(dataset, out) == []
    write_clips(dataset, episodes=4)  # two more episodes committed to the same store
    assert _resume(dataset, out) == [
        f"train.dataset {dataset} has grown since the checkpoints began: 4 episodes, 2 then"
    ]
    assert _record(out)["dataset"]["episodes"] == 4  # type: ignore[index]
    assert _resume(dataset, out) == []  # said once: the larger one is recorded


def test_another_seed_is_refused_naming_it(tmp_path: Path) -> None:
    dataset, out = write_clips(tmp_path / "data"), tmp_path / "out"
    _checkpointed(dataset, out)
    with pytest.raises(ConfigError, match=r"made with train\.seed=3, this run asks train\.seed=7"):
        _resume(dataset, out, seed=7)


def test_a_record_of_an_older_troupe_resumes_and_is_completed(tmp_path: Path) -> None:
    """Recorded without the seed and the dataset's identity: nothing to hold the run to."""
    dataset, out = write_clips(tmp_path / "data"), tmp_path / "out"
    _checkpointed(dataset, out)
    record = _record(out)
    del record["dataset"], record["made_with"]["train"]["seed"]  # type: ignore[attr-defined]
    (out / ".troupe-train" / "run.json").write_text(json.dumps(record))
    assert _resume(dataset, out, seed=7) == []
    assert _record(out)["dataset"]["episodes"] == 3  # type: ignore[index]


def test_troupe_run_refuses_a_replaced_dataset_in_one_line_before_anything_starts(tmp_path: Path) -> None:
    dataset, out = write_clips(tmp_path / "data", episodes=3), tmp_path / "out"
    config = config_copy(tmp_path / "train.toml", "train.toml", {"train": {"dataset": str(dataset)}})
    prepare_run(config, out, None, fresh=False)[2].release()
    step = out / "checkpoints" / "step-000000003"
    step.mkdir(parents=True)
    (step / "COMMITTED").write_text("3\n")
    shutil.rmtree(dataset)
    write_clips(dataset, episodes=2, length=20)
    code, stdout, stderr = run_cli("run", str(config), "--out", str(out), timeout=120)
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert code == 2 and len(lines) == 1, stdout + stderr
    assert lines[0].startswith(f"error: train.dataset {dataset} is not the dataset --out {out}'s"), lines
    assert "train " not in stdout, stdout  # refused before the progress bar
