"""A stop signal that reaches `troupe run` after its finalisation has written the outputs (as
the replicas and the node stop) does not say "stopped": the run was complete, so the command
says so and exits 0, and the same command run again says "already complete" rather than
finalising again. It used to exit 130 with `stopped: at least 4 of 4 items done`, its record
not yet written, and the rerun finalised again.

The moment is made, not raced: the last stage's replica (``HeldStopStage``), stopped once its
``finalize`` ran, holds its stop until the test has seen the command take the signal.
"""

from __future__ import annotations

import json
import signal
from pathlib import Path

import pytest

from support.hook_stages import read_records
from support.run_resume_helpers import running
from troupe.runtime.testing.plugin import free_endpoint, import_path

pytestmark = pytest.mark.e2e

ITEMS = 4
WAIT_S = 120.0  # a bound on waiting for another process, not on its speed


def _pipeline(tmp_path: Path, log: Path, held: Path, release: Path) -> Path:
    path = tmp_path / "held.toml"
    path.write_text(
        f"""
[pipeline]
name = "held"
items = {ITEMS}

[[stages]]
name = "a"
actor = "support.hook_stages:RecordingStage"
kwargs = {{ log = {json.dumps(str(log))}, label = "a" }}

[[stages]]
name = "b"
actor = "support.hook_stages:HeldStopStage"
replicas = 1
max_replicas = 1

[stages.kwargs]
log = {json.dumps(str(log))}
label = "b"
held = {json.dumps(str(held))}
release = {json.dumps(str(release))}
""",
        encoding="utf-8",
    )
    return path


def _finalized(log: Path) -> int:
    return sum(1 for r in read_records(log) if r["hook"] == "finalize")


@pytest.mark.timeout(300)
def test_a_ctrl_c_after_the_finalisation_says_complete_and_the_rerun_finalises_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PYTHONPATH", import_path())  # the replicas import the test's stages
    log, held, release = tmp_path / "hooks.jsonl", tmp_path / "held", tmp_path / "release"
    config, out = _pipeline(tmp_path, log, held, release), tmp_path / "out"
    args = ["run", str(config), "--out", str(out), "--endpoint", free_endpoint(), "--master", free_endpoint()]
    with running(args, tmp_path, "run") as run:
        run.wait_until("the finalisation's end (the last stage's replica stopping)", held.exists, WAIT_S)
        run.signal(signal.SIGINT)
        run.wait_until("the command taking the signal", lambda: "SIGINT: stopping gracefully" in run.text())
        release.write_text("")
        status = run.wait(timeout=WAIT_S)
        text = run.text()
        flat = " ".join(text.split())
        assert status == 0, text[-3000:]
        assert f"complete when the stop came: a finalised {ITEMS} items; b finalised {ITEMS} items" in flat
        assert "stopped: at least" not in text, text[-3000:]
        assert not run.survivors(), "processes of the run left behind"
        assert len(run.seen) >= 3  # the template and a replica per stage were tracked
    assert _finalized(log) == 2  # each stage's finalize, once

    with running(args, tmp_path, "rerun") as rerun:
        assert rerun.wait(timeout=WAIT_S) == 0, rerun.text()[-3000:]
        flat = " ".join(rerun.text().split())
    assert f"already complete: a finalised {ITEMS} items; b finalised {ITEMS} items" in flat, flat[-3000:]
    assert "finalising" not in flat
    assert _finalized(log) == 2  # the rerun finalised nothing again
