"""A store replica killed right after it committed an item's output, before it answered, on the
item's last attempt: the item was counted dead (the closing line, ``--json``, a rerun's "1 of
its 4 items died") while its output was committed, and finalize took it (report jx 4). Now the
engine asks the stage (``committed_among``) before it dead-letters the item, which ends ok.

``run_pipeline`` with no ``out``: a node inside the test process, whose workers are the replicas
(``tests/support/commit_then_die.py``, imported through ``PYTHONPATH``).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest

from troupe.runtime.pipeline.config import PipelineConfig
from troupe.runtime.pipeline.runner import run_pipeline
from troupe.runtime.testing.plugin import import_path

pytestmark = pytest.mark.e2e

RUN_TIMEOUT_S = 120  # a bound on a hang, never on speed


@pytest.fixture(autouse=True)
def workers_import_the_test_stages(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The replicas import what this process imports."""
    monkeypatch.setenv("PYTHONPATH", import_path())
    yield


async def test_an_item_whose_store_died_after_its_commit_ends_ok(tmp_path: Path) -> None:
    store = tmp_path / "store"
    store.mkdir()
    cfg = PipelineConfig.model_validate(
        {
            "name": "p",
            "items": 4,
            "max_attempts": 1,
            "scale_interval_s": 0.1,
            "stages": [
                {
                    "name": "store",
                    "actor": "support.commit_then_die:CommitThenDieStage",
                    "kwargs": {"folder": str(store), "dies": "p-000003"},
                }
            ],
        }
    )
    with anyio.fail_after(RUN_TIMEOUT_S):
        result = await run_pipeline(cfg)
    assert (store / ".died").exists()  # the replica was killed after the commit
    assert result.counts() == {"ok": 4, "pruned": 0, "dead": 0, "kept": 0}, result.errors
    assert sorted(p.name for p in store.iterdir() if not p.name.startswith(".")) == [
        f"p-{i:06d}" for i in range(4)
    ]
