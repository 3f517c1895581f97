"""The dataset writer's ``dataset`` folder: a relative one is the run's out's, and one that holds
what no run of the writer's store wrote is refused as the run starts, before any item runs."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from troupe.actors.datagen.dataset_root import MARK
from troupe.actors.datagen.lifecycle import LeRobotWriter
from troupe.actors.lerobot.episode import EpisodeData, write_episode
from troupe.runtime.errors import ConfigError
from troupe.runtime.pipeline.stage import StageRun
from troupe.runtime.tasks.output_store import OutputStore


@pytest.fixture
def writers() -> Iterator[list[LeRobotWriter]]:
    made: list[LeRobotWriter] = []
    yield made
    for stage in made:
        stage.writer.close(timeout=10)


def _writer(writers: list[LeRobotWriter], store: Path, **kwargs: object) -> LeRobotWriter:
    stage = LeRobotWriter(store=str(store), **kwargs)  # type: ignore[arg-type]
    writers.append(stage)
    return stage


def _run(out: Path, items: int = 1) -> StageRun:
    return StageRun("p", "store", items, 0, out=str(out))


def _commit_one(store: Path) -> None:
    length, h, w = 10, 16, 16
    episode = EpisodeData(
        task_id="p-000000",
        task="navigate to the goal",
        fps=10,
        rgb=np.zeros((length, h, w, 3), dtype=np.uint8),
        depth=np.ones((length, h, w), dtype=np.float32),
        ego=np.zeros((length, 9), dtype=np.float32),
    )
    assert write_episode(OutputStore(store, durable=False), episode) is True


def test_a_dataset_folder_holding_another_dataset_is_refused_before_any_item(
    tmp_path: Path, writers: list[LeRobotWriter]
) -> None:
    """A LeRobot dataset no run of this store made was replaced by finalize without a word
    (40 episodes became 6), where the same folder as --out is refused (report ds 6)."""
    theirs = tmp_path / "theirs"
    (theirs / "meta").mkdir(parents=True)
    (theirs / "meta" / "info.json").write_text("{}", encoding="utf-8")
    stage = _writer(writers, tmp_path / "out/.troupe/episodes", dataset=str(theirs))
    with pytest.raises(ConfigError) as info:
        stage.start(_run(tmp_path / "out"))
    said = str(info.value)
    assert said.startswith(f"kwargs.dataset {theirs} holds 'meta', which no run of this store wrote")
    assert "give a new or empty directory" in said and "\n" not in said
    assert sorted(p.name for p in theirs.iterdir()) == ["meta"]  # untouched, unmarked


def test_a_new_folder_is_marked_and_taken_again_by_its_store_only(
    tmp_path: Path, writers: list[LeRobotWriter]
) -> None:
    ds = tmp_path / "ds"
    ours = _writer(writers, tmp_path / "out/.troupe/episodes", dataset=str(ds))
    ours.start(_run(tmp_path / "out"))
    assert (ds / MARK).is_file()
    (ds / "meta").mkdir()  # what its finalize wrote
    ours.start(_run(tmp_path / "out"))  # a rerun of the same store
    other = _writer(writers, tmp_path / "other/.troupe/episodes", dataset=str(ds))
    with pytest.raises(ConfigError, match=r"holds the dataset of another store \(.*out/\.troupe/episodes\)"):
        other.start(_run(tmp_path / "other"))
    (tmp_path / "empty").mkdir()
    empty = _writer(writers, tmp_path / "x/.troupe/episodes", dataset=str(tmp_path / "empty"))
    empty.start(_run(tmp_path / "x"))
    assert (tmp_path / "empty" / MARK).is_file()


def test_the_runs_out_is_left_to_its_record(tmp_path: Path, writers: list[LeRobotWriter]) -> None:
    """--out holds the run's own folders: its run record guards it, no mark is written there."""
    out = tmp_path / "out"
    (out / "logs").mkdir(parents=True)
    _writer(writers, out / ".troupe/episodes").start(_run(out))
    _writer(writers, out / ".troupe/episodes", dataset=str(out)).start(_run(out))
    assert not (out / MARK).exists()


def test_a_relative_dataset_is_taken_from_the_runs_out_and_said_absolute(
    tmp_path: Path, writers: list[LeRobotWriter], monkeypatch: pytest.MonkeyPatch
) -> None:
    """It was taken from the shell's folder, printed relative, and a rerun from another folder
    wrote a second dataset there (report ds 4)."""
    shell = tmp_path / "shell"
    shell.mkdir()
    monkeypatch.chdir(shell)
    out = tmp_path / "out"
    store = out / ".troupe/episodes"
    _commit_one(store)
    stage = _writer(writers, store, dataset="rel_ds")
    stage.start(_run(out))
    final = stage.finalize(_run(out))
    assert final["root"] == str(out / "rel_ds")
    assert final["summary"].endswith(f"LeRobot v3.0 at {out / 'rel_ds'}")
    assert (out / "rel_ds" / "meta" / "info.json").is_file()
    assert list(shell.iterdir()) == []


def test_the_dataset_is_the_folders_readme_names_as_it(tmp_path: Path, writers: list[LeRobotWriter]) -> None:
    """README says which parts of --out are the dataset, to copy or publish, and which are the
    run's (report ds 3: the whole folder went, a second copy of the data, the journal, the logs);
    every file finalize writes is in the former."""
    readme = (Path(__file__).resolve().parents[3] / "README.md").read_text(encoding="utf-8")
    said = " ".join(readme.partition("**Which parts of `--out` are the dataset.**")[2].split()[:60])
    assert "`data/`, `meta/` and `videos/` are the LeRobot dataset" in said, said
    assert "`.troupe/`" in said and "`logs/`" in said
    out = tmp_path / "out"
    store = out / ".troupe/episodes"
    _commit_one(store)
    stage = _writer(writers, store)
    stage.start(_run(out))
    final = stage.finalize(_run(out))
    assert {Path(p).relative_to(out).parts[0] for p in final["outputs"]} == {"data", "meta", "videos"}


@pytest.mark.parametrize(
    ("plan", "store", "said"),
    [
        ("fps = 10", "fps = 5", "kwargs.fps = 5, but stage plan plans its episodes at 10 fps"),
        ("", "fps = 5", "kwargs.fps = 5, but stage plan plans its episodes at 10 fps"),  # its default
        ("fps = 5", "fps = 5", None),
        ("fps = 5", "", None),  # the episodes' rate
    ],
)
def test_a_writer_fps_other_than_the_planners_is_refused_before_anything_starts(
    tmp_path: Path, plan: str, store: str, said: str | None
) -> None:
    """It rendered every item, then failed finalize (report ds 2)."""
    from troupe.runtime.core.loading import first_failure, stage_checks
    from troupe.runtime.pipeline.config import load_pipeline

    path = tmp_path / "pipe.toml"
    path.write_text(
        f"""
[[stages]]
name = "plan"
actor = "troupe.actors.datagen.lifecycle:NavPlanner"
kwargs = {{ {plan} }}

[[stages]]
name = "store"
actor = "troupe.actors.datagen.lifecycle:LeRobotWriter"
kwargs = {{ store = "{{out}}/s"{", " + store if store else ""} }}
""",
        encoding="utf-8",
    )
    failure = first_failure(stage_checks(load_pipeline(path)))
    if said is None:
        assert failure is None
        return
    assert failure is not None
    assert failure[0] == "stages.store.kwargs"
    assert failure[1].startswith(f"troupe.actors.datagen.lifecycle:LeRobotWriter: {said}"), failure
    assert "leave fps out (the episodes' rate is taken) or give 10" in failure[1]
