"""A one-host ``troupe run`` whose own journal is deleted while it runs stops with advice for
it: run the same command again (it goes on from the outputs its folder holds). It gave a cluster
operator's ("start a new one (--new), and submit the jobs again"): a run has no --new and no
jobs to submit.

The run's own node and master in this process; the last stage waits at a gate (a file) that
never opens, so the run is mid-way when its journal goes. The node stops its workers on the way
out (reaped by the run itself).
"""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest

from support.gated_pipeline import gated_config
from support.hook_stages import read_records
from troupe.runtime.errors import JournalError
from troupe.runtime.pipeline.runner import run_pipeline
from troupe.runtime.testing.plugin import import_path

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

RUN_TIMEOUT_S = 240
NODE, MASTER = "tcp://127.0.0.1:25530", "tcp://127.0.0.1:25531"


def test_a_run_whose_journal_is_deleted_says_to_run_it_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PYTHONPATH", import_path())  # the run's node imports the tests' stages
    log, gate = tmp_path / "seen.jsonl", tmp_path / "gate"  # the gate stays shut
    out = tmp_path / "out"
    journal = out / ".troupe" / "journal.db"
    raised: list[JournalError] = []

    async def lost_mid_run() -> None:
        async def run() -> None:
            try:
                cfg = gated_config("lost-journal", 4, log, gate)
                await run_pipeline(cfg, out, node_endpoint=NODE, master_endpoint=MASTER)
            except JournalError as exc:
                raised.append(exc)

        with anyio.fail_after(RUN_TIMEOUT_S):
            async with anyio.create_task_group() as tg:
                tg.start_soon(run)
                while not any(r["stage"] == "wait" for r in read_records(log)):
                    await anyio.sleep(0.05)  # an item waits at the gate: the run is mid-way
                for side in ("", "-wal", "-shm"):
                    Path(f"{journal}{side}").unlink(missing_ok=True)

    anyio.run(lost_mid_run)
    assert len(raised) == 1, "the run did not stop on its journal's loss"
    text = str(raised[0])
    assert f"journal {journal} was deleted while the master ran" in text
    assert text.endswith("Run the same troupe run again: it goes on from the outputs its folder still holds")
    assert "--new" not in text and "submit" not in text
