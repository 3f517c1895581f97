"""The configs the README and --help name ship with troupe (pk 3: an install from the wheel had
none, and ``troupe run configs/train.toml`` found no file): ``troupe configs`` lists them,
``troupe configs NAME`` writes one out (never over a file without --force), a missing
``configs/NAME`` says how to get it, and the wheel holds them."""

from __future__ import annotations

import shutil
import subprocess
import sys
import warnings
import zipfile
from pathlib import Path

import pytest
from typer.testing import CliRunner

from troupe.actors.training.train_config import load_train_config
from troupe.cli.main import app
from troupe.runtime.errors import ConfigError
from troupe.runtime.node.config import load_node_config
from troupe.runtime.pipeline.config import load_pipeline
from troupe.runtime.tasks.jobspec import load_job

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = ROOT / "configs"
SHIPPED = sorted(
    str(p.relative_to(CONFIGS))
    for p in CONFIGS.rglob("*")
    if p.is_file() and p.suffix in (".toml", ".service", ".sbatch")
)


def _troupe(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(app, list(args))
    return result.exit_code, result.output


def test_every_config_of_the_repository_is_listed() -> None:
    assert {"train.toml", "node.toml", "slurm/troupe.sbatch", "troupe-master.service"} <= set(SHIPPED)
    code, output = _troupe("configs")
    assert code == 0, output
    listed = [line.split()[0] for line in output.splitlines() if line.strip()]
    assert listed == SHIPPED, output
    assert "train.toml             Training on the dataset the data generation pipeline wrote" in output


def test_a_config_is_written_where_the_readme_looks_and_never_over_a_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    code, output = _troupe("configs", "train.toml", "slurm/troupe.sbatch")
    assert code == 0, output
    for name in ("train.toml", "slurm/troupe.sbatch"):
        assert (tmp_path / "configs" / name).read_bytes() == (CONFIGS / name).read_bytes()
        assert f"wrote configs/{name}" in output

    mine = tmp_path / "configs" / "train.toml"
    mine.write_text("# mine\n")
    code, output = _troupe("configs", "node.toml", "train.toml")
    assert code == 2 and "configs/train.toml: already exists; pass --force" in output, output
    assert mine.read_text() == "# mine\n" and not (tmp_path / "configs" / "node.toml").exists(), "nothing"
    code, output = _troupe("configs", "train.toml", "--force")
    assert code == 0 and mine.read_bytes() == (CONFIGS / "train.toml").read_bytes(), output

    code, output = _troupe("configs", "node.toml", "--out", str(tmp_path / "etc" / "n.toml"))
    assert code == 0 and (tmp_path / "etc" / "n.toml").read_bytes() == (CONFIGS / "node.toml").read_bytes()


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["trian.toml"], "no shipped config 'trian.toml'; did you mean train.toml?"),
        (["train.toml", "node.toml", "--out", "x.toml"], "--out takes one NAME, got 2"),
        (["--force"], "--out and --force go with a NAME"),
    ],
)
def test_wrong_use_is_one_line_and_writes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, args: list[str], said: str
) -> None:
    monkeypatch.chdir(tmp_path)
    code, output = _troupe("configs", *args)
    assert code == 2 and said in output and len(output.strip().splitlines()) == 1, output
    assert list(tmp_path.iterdir()) == []


def test_a_missing_shipped_config_says_how_to_get_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    for load, name in (
        (load_pipeline, "train.toml"),
        (load_node_config, "node.toml"),
        (load_job, "job-example.toml"),
    ):
        with pytest.raises(ConfigError) as info:
            load(Path("configs", name))
        assert str(info.value).endswith(f"; troupe ships it: `troupe configs {name}` writes it there"), (
            info.value
        )
    with pytest.raises(ConfigError) as elsewhere:
        load_pipeline(tmp_path / "configs" / "slurm" / "node.toml")
    assert f"`troupe configs slurm/node.toml --out {tmp_path}/configs/slurm/node.toml`" in str(
        elsewhere.value
    )
    with pytest.raises(ConfigError) as other:
        load_pipeline(Path("configs", "mine.toml"))
    assert "troupe configs" not in str(other.value)


# Which loader reads each shipped TOML file (a new one must be named here).
_LOADERS = {
    "datagen.toml": load_pipeline,
    "datagen-train.toml": load_train_config,
    "train.toml": load_train_config,
    "job-example.toml": load_job,
    "node.toml": load_node_config,
    "slurm/node.toml": load_node_config,
}


def test_every_shipped_config_loads_without_a_warning() -> None:
    """fh 1: configs/node.toml, the file README and ``troupe configs`` point a new user to, had
    its node warn ``config_setting_ignored`` of its own ``[supervision.kinds.render]`` at every
    start: troupe's own files must load clean (no warning, no setting the node would ignore)."""
    tomls = [name for name in SHIPPED if name.endswith(".toml")]
    assert sorted(_LOADERS) == tomls, "name the loader of a new shipped config in _LOADERS"
    for name, load in _LOADERS.items():
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            loaded = load(CONFIGS / name)
        if load is load_node_config:
            assert loaded.ignored_settings() == [], name


@pytest.mark.timeout(300)
def test_the_wheel_holds_the_configs(tmp_path: Path) -> None:
    """Built from a copy of the source (a build in the checkout leaves build/ there)."""
    source = tmp_path / "source"
    shutil.copytree(
        ROOT,
        source,
        ignore=shutil.ignore_patterns(
            ".git", "tests", "build", "dist", "*.egg-info", "__pycache__", ".*_cache"
        ),
    )
    built = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            ".",
            "-w",
            str(tmp_path / "w"),
        ],
        cwd=source,
        capture_output=True,
        text=True,
        timeout=280,
    )
    assert built.returncode == 0, built.stdout[-2000:] + built.stderr[-2000:]
    (wheel,) = (tmp_path / "w").glob("troupe-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        inside = {
            n.removeprefix("troupe/configs/"): archive.read(n)
            for n in archive.namelist()
            if n.startswith("troupe/configs/")
        }
    assert set(SHIPPED) <= set(inside), sorted(inside)
    assert all(inside[name] == (CONFIGS / name).read_bytes() for name in SHIPPED)
