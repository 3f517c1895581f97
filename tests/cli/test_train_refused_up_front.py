"""``troupe run TRAIN.toml`` refuses what it can know is wrong before anything starts, in one line,
exit 2, with nothing made on disk: it had started the cluster, then failed in repeated lines and
left ``--out`` behind."""

from __future__ import annotations

from pathlib import Path

import pytest

from support.train_run_cli import config_copy, run_cli

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled:UserWarning")


def _dataset(tmp_path: Path) -> Path:
    dataset = tmp_path / "data"
    (dataset / ".troupe" / "episodes").mkdir(parents=True)
    return dataset


def _refused(config: Path, out: Path, *args: str) -> str:
    """The one line of a refusal (exit 2), checked to have made nothing."""
    code, stdout, stderr = run_cli("run", str(config), "--out", str(out), *args, timeout=120)
    assert code == 2, stdout + stderr
    assert not out.exists(), sorted(p.name for p in out.rglob("*"))
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
