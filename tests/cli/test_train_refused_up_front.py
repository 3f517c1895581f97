"""``troupe run TRAIN.toml`` refuses what it can know is wrong before anything starts, in one line,
exit 2, with nothing made on disk: it had started the cluster, then failed in repeated lines and
left ``--out`` behind."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from support.train_run_cli import config_copy, datagen_made, run_cli
from troupe.runtime.testing.plugin import free_endpoint

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled:UserWarning")


def _dataset(tmp_path: Path) -> Path:
    dataset = tmp_path / "data"
    (dataset / ".troupe" / "episodes").mkdir(parents=True)
    return dataset


def _refused(config: Path, out: Path, *args: str, made: list[Path] | None = None) -> str:
    """The one line of a refusal (exit 2), checked to have made nothing (``made``: what --out
    held before, else nothing)."""
    code, stdout, stderr = run_cli("run", str(config), "--out", str(out), *args, timeout=120)
    assert code == 2, stdout + stderr
    if made is None:
        assert not out.exists(), sorted(p.name for p in out.rglob("*"))
    else:
        assert sorted(p.relative_to(out) for p in out.rglob("*")) == made
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), stderr
    assert "train " not in stdout, stdout  # refused before the progress bar
    return lines[0]


@pytest.mark.parametrize("where", ["kernel file system", "under a file"])
def test_a_cache_dir_that_cannot_be_made_is_refused(tmp_path: Path, where: str) -> None:
    (tmp_path / "afile").write_text("x")
    cache = "/proc/latent-cache" if where == "kernel file system" else str(tmp_path / "afile" / "cache")
    changes = {"train": {"dataset": str(_dataset(tmp_path))}, "encoders": {"cache_dir": cache}}
    config = config_copy(tmp_path / "train.toml", "train.toml", changes)
    line = _refused(config, tmp_path / "out")
    assert f"encoders.cache_dir {cache}" in line, line


def test_a_data_generation_of_other_items_is_refused_naming_the_out_given(tmp_path: Path) -> None:
    """A rerun without the first run's --items: refused once the cluster had started ("train
    0/40"), naming --out/data and only --fresh, which deletes the checkpoints too."""
    out = tmp_path / "dt-out"
    datagen_made(out / "data", 6)
    before = sorted(p.relative_to(out) for p in out.rglob("*"))
    config = config_copy(tmp_path / "dt.toml", "datagen-train.toml")
    line = _refused(config, out, "--steps", "4", made=before)
    assert f"--out {out} holds a data generation made with items=6, this run asks items=16" in line
    assert "--items 6" in line and "--fresh" in line, line


def test_fewer_items_than_min_episodes_are_refused_before_the_progress_bar(tmp_path: Path) -> None:
    config = config_copy(tmp_path / "dt.toml", "datagen-train.toml")
    line = _refused(config, tmp_path / "out", "--items", "2", "--steps", "5")
    assert "fewer than train.min_episodes = 4" in line, line


def test_a_cache_dir_holding_the_users_files_is_refused(tmp_path: Path) -> None:
    """The cache deletes its own files when its index is damaged; a folder holding others' is
    not given to it (the whole folder used to be renamed aside, then deleted by the next damage)."""
    cache = tmp_path / "mine"
    cache.mkdir()
    (cache / "NOTES.txt").write_text("precious")
    changes = {"train": {"dataset": str(_dataset(tmp_path))}, "encoders": {"cache_dir": str(cache)}}
    config = config_copy(tmp_path / "train.toml", "train.toml", changes)
    line = _refused(config, tmp_path / "out")
    assert f"encoders.cache_dir {cache} holds 'NOTES.txt', which the latent cache did not write" in line
    assert sorted(p.name for p in cache.iterdir()) == ["NOTES.txt"]


def test_a_master_that_is_not_there_is_refused_at_once_with_the_flags_meaning(tmp_path: Path) -> None:
    """``--master E`` with nothing at E: a pipeline's command line reused for a training, whose
    --master is a running master, not one the run starts. The run asked E for its status and
    said AskTimeout 5 s later, leaving .troupe-train/ and logs/ in --out (cf 8): a plain connect
    first, refused at once, exit 2, nothing made, the flag's meaning said."""
    changes = {"train": {"dataset": str(_dataset(tmp_path))}}
    config = config_copy(tmp_path / "train.toml", "train.toml", changes)
    nobody = free_endpoint()
    line = _refused(config, tmp_path / "out", "--master", nobody)
    assert f"--master: no master answers at {nobody} (connection refused)" in line, line
    assert "--master is a running master" in line and "leave --master out to train on this host" in line
    assert "AskTimeout" not in line, line


def test_checkpoints_of_a_model_default_another_troupe_changed_are_refused(tmp_path: Path) -> None:
    """Report lc 3: found only as rank 0 loaded the checkpoint, once the cluster was up, and
    called unloadable with advice to move it away, which every checkpoint failed the same way."""
    from troupe.actors.training.train_prepare import prepare_run

    changes = {"train": {"dataset": str(_dataset(tmp_path))}}
    config = config_copy(tmp_path / "train.toml", "train.toml", changes)
    out = tmp_path / "out"
    prepare_run(config, out, None, fresh=False)[2].release()
    (out / "checkpoints" / "step-000000005").mkdir(parents=True)
    (out / "checkpoints" / "step-000000005" / "COMMITTED").write_text("5\n")
    record_path = out / ".troupe-train" / "run.json"
    record = json.loads(record_path.read_text())
    record["made_with"]["model"]["mlp_ratio"] = 2.0  # as a troupe of another default recorded it
    record["made_by"] = [{"version": "0.0.9", "digest": "0123abcd"}]
    record_path.write_text(json.dumps(record))
    before = sorted(p.relative_to(out) for p in out.rglob("*"))
    line = _refused(config, out, made=before)
    assert (
        f"--out {out} holds checkpoints made with model.mlp_ratio=2.0, this run builds "
        "model.mlp_ratio=4.0 (its [model] with this troupe's defaults)"
    ) in line, line
    assert "set mlp_ratio = 2.0 in [model]" in line and "run troupe 0.0.9 (code 0123abcd)" in line
    assert "--fresh" in line and json.loads(record_path.read_text()) == record


@pytest.mark.parametrize(
    ("cache_dir", "said"),
    [
        ("{out}/checkpoints", "is the run's train.checkpoint_dir"),
        ("{out}", "is the run's --out"),
        ("{out}/logs/cache", "lies in the run's logs folder {out}/logs"),
    ],
)
def test_a_cache_dir_that_is_one_of_the_run_s_own_folders_is_refused(
    tmp_path: Path, cache_dir: str, said: str
) -> None:
    """Report lc 7: "{out}/checkpoints" was taken by the first run, which wrote the cache beside
    its checkpoints, and every later run was refused, --fresh too, naming its own checkpoints;
    "{out}" failed in an encoder worker once the run had started."""
    changes = {"train": {"dataset": str(_dataset(tmp_path))}, "encoders": {"cache_dir": cache_dir}}
    config = config_copy(tmp_path / "train.toml", "train.toml", changes)
    out = tmp_path / "out"
    for fresh in ((), ("--fresh",)):
        line = _refused(config, out, *fresh)
        where, said_here = (text.replace("{out}", str(out)) for text in (cache_dir, said))
        assert line == (
            f"error: encoders.cache_dir {where} {said_here}: the latent cache needs a folder of its own (it "
            'refuses one holding files it did not write); give it one, as "{out}/latent-cache"'
        ), line
