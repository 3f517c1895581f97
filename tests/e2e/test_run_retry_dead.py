"""`troupe run --retry-dead`: items that died of a cause since fixed (a full disk) run again,
each once, and the dataset is finalised with them; a plain rerun leaves them dead and says how
to run them. Refused with --fresh, and a no-op (said) where no item died."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from support.hook_stages import read_records
from support.train_run_cli import finish, troupe
from troupe.cli.commands.run_pipeline import RETRY_DEAD_HINT
from troupe.runtime.testing.plugin import import_path

pytestmark = pytest.mark.e2e

PIPELINE = """
[pipeline]
name = "full"
items = 6
max_attempts = 2

[[stages]]
name = "write"
actor = "support.hook_stages:DiskFullStage"
kwargs = {{ every = 3, full = "{full}", log = "{log}" }}
"""


@pytest.fixture(autouse=True)
def replicas_import_the_test_stages(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv("PYTHONPATH", import_path())
    yield


def _run(config: Path, out: Path, *flags: str) -> tuple[int, str, str]:
    with troupe("run", str(config), "--out", str(out), *flags) as (proc, _):
        return finish(proc)


def test_dead_items_run_again_with_retry_dead_and_only_then(tmp_path: Path) -> None:
    full, log, out = tmp_path / "disk-full", tmp_path / "written.jsonl", tmp_path / "out"
    full.touch()
    config = tmp_path / "full.toml"
    config.write_text(PIPELINE.format(full=full, log=log), encoding="utf-8")
    code, stdout, stderr = _run(config, out, "--json")
    assert code == 0, stdout[-2000:] + stderr[-2000:]
    assert json.loads(stdout)["items"]["dead"] == 2  # seeds 0 and 3
    full.unlink()  # the disk is cleared
    code, stdout, stderr = _run(config, out)
    assert code == 0, stdout[-2000:] + stderr[-2000:]
    said = " ".join(stdout.split())
    assert "already complete" in said and RETRY_DEAD_HINT in said
    code, stdout, stderr = _run(config, out, "--retry-dead", "--json")
    assert code == 0, stdout[-2000:] + stderr[-2000:]
    figures = json.loads(stdout)
    assert figures["already_complete"] is False
    assert figures["items"]["ok"] == 2 and figures["job_items"] == {"ok": 6, "pruned": 0, "dead": 0}
    assert "--retry-dead: 2 dead items of an earlier run run again" in stderr
    written = Counter(r["task_id"] for r in read_records(log))
    assert written == Counter({f"full-{n:06d}": 1 for n in range(6)})  # every item once
    code, stdout, stderr = _run(config, out, "--retry-dead")
    assert code == 0, stdout[-2000:] + stderr[-2000:]
    assert "already complete" in stdout and RETRY_DEAD_HINT not in " ".join(stdout.split())


def test_retry_dead_with_fresh_is_refused_before_anything_starts(tmp_path: Path) -> None:
    config = tmp_path / "full.toml"
    config.write_text(PIPELINE.format(full=tmp_path / "f", log=tmp_path / "l"), encoding="utf-8")
    code, stdout, stderr = _run(config, tmp_path / "out", "--retry-dead", "--fresh")
    assert code == 2, stdout[-2000:] + stderr[-2000:]
    assert "give --fresh or --retry-dead, not both" in stderr
    assert not (tmp_path / "out").exists()
