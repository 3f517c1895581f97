"""The default pipeline's dataset writer and the folder it writes the dataset to, run for real:
a ``dataset`` kwarg naming someone else's dataset is refused before any item runs, and the
config put right takes the same --out."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from support.train_run_cli import CONFIGS, finish, troupe
from troupe.runtime.testing.plugin import free_endpoint

pytestmark = pytest.mark.e2e

STORE_KWARGS = 'kwargs = { store = "{out}/.troupe/episodes" }'


def _pipeline(tmp_path: Path, store_kwargs: str) -> Path:
    text = (CONFIGS / "datagen.toml").read_text(encoding="utf-8")
    assert STORE_KWARGS in text, "configs/datagen.toml changed shape"
    path = tmp_path / "pipe.toml"
    path.write_text(text.replace(STORE_KWARGS, store_kwargs), encoding="utf-8")
    return path


def _run(config: Path, out: Path) -> tuple[int, str, str]:
    master = free_endpoint()  # not the default port: another run on the machine may hold it
    with troupe("run", str(config), "--out", str(out), "--items", "2", "--master", master) as (proc, _):
        return finish(proc)


def test_a_dataset_kwarg_naming_another_dataset_is_refused_and_the_fixed_config_runs(tmp_path: Path) -> None:
    """It replaced the dataset there without a word (40 episodes became 6), where the same folder
    as --out is refused (report ds 6)."""
    theirs = tmp_path / "theirs"
    (theirs / "meta").mkdir(parents=True)
    info = json.dumps({"total_episodes": 40})
    (theirs / "meta" / "info.json").write_text(info, encoding="utf-8")
    config = _pipeline(tmp_path, f'kwargs = {{ store = "{{out}}/.troupe/episodes", dataset = "{theirs}" }}')
    out = tmp_path / "out"
    code, stdout, stderr = _run(config, out)
    assert code != 0, stdout[-2000:] + stderr[-2000:]
    assert f"kwargs.dataset {theirs} holds 'meta', which no run of this store wrote" in stderr, stderr
    assert not any((out / ".troupe" / "episodes" / "committed").glob("*"))  # no item ran
    assert (theirs / "meta" / "info.json").read_text(encoding="utf-8") == info
    assert sorted(p.name for p in theirs.iterdir()) == ["meta"]
    code, stdout, stderr = _run(CONFIGS / "datagen.toml", out)  # the run made nothing: the folder is free
    assert code == 0, stdout[-2000:] + stderr[-2000:]
    assert f"LeRobot v3.0 at {out}" in stdout


def test_a_writer_fps_other_than_the_planners_is_one_line_before_anything_is_made(tmp_path: Path) -> None:
    """Every item was rendered, then finalize failed, and the config put right was refused as
    another pipeline's: only --fresh, all the work again, got out (report ds 2)."""
    config = _pipeline(tmp_path, 'kwargs = { store = "{out}/.troupe/episodes", fps = 5 }')
    out = tmp_path / "out"
    code, stdout, stderr = _run(config, out)
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert code == 2 and len(lines) == 1, stdout[-2000:] + stderr[-2000:]
    assert (
        "stages.store.kwargs: troupe.actors.datagen.lifecycle:LeRobotWriter: kwargs.fps = 5, but" in lines[0]
    )
    assert not out.exists()


def test_a_rerun_with_a_kwarg_only_finalize_reads_changed_finalises_again(tmp_path: Path) -> None:
    """The writer's robot_type decides no episode: the rerun was refused as made with another
    pipeline, and only --fresh, all the work again, got out (report ds 2)."""
    out = tmp_path / "out"
    code, stdout, stderr = _run(CONFIGS / "datagen.toml", out)
    assert code == 0, stdout[-2000:] + stderr[-2000:]
    config = _pipeline(tmp_path, 'kwargs = { store = "{out}/.troupe/episodes", robot_type = "rover" }')
    code, stdout, stderr = _run(config, out)
    assert code == 0, stdout[-2000:] + stderr[-2000:]
    assert "every item was done by an earlier run" in " ".join(stdout.split())
    assert json.loads((out / "meta" / "info.json").read_text(encoding="utf-8"))["robot_type"] == "rover"
