"""Ctrl-C while ``run_pipeline_sync`` runs items: the script gets KeyboardInterrupt (as
``except KeyboardInterrupt`` expects), and every process of the run is gone. It got an
UnboundLocalError from inside the runner, whenever a task group on the way out took the
cancellation asyncio made of the SIGINT for its own."""

from __future__ import annotations

import signal
import time
from pathlib import Path

import pytest

from support.processes import kill_all_in, left_working_in, start_script

pytestmark = pytest.mark.e2e

HANG_GUARD_S = 120  # only so a regression cannot hang the suite; nothing here measures speed

STAGES = """
import time
from troupe.runtime import StageActor


class Slow(StageActor):
    def process(self, item):
        time.sleep(0.2)
        return {"task_id": item["task_id"]}
"""

SCRIPT = """
import sys
from troupe.runtime import PipelineConfig, StageConfig, run_pipeline_sync

if __name__ == "__main__":
    cfg = PipelineConfig(name="s", items=200, stages=[StageConfig(name="a", actor="interrupted_stages:Slow")])
    try:
        run_pipeline_sync(cfg, "out")
    except KeyboardInterrupt:
        print("KeyboardInterrupt")
        sys.exit(130)
"""


def test_ctrl_c_in_run_pipeline_sync_is_a_keyboard_interrupt(tmp_path: Path) -> None:
    (tmp_path / "interrupted_stages.py").write_text(STAGES, encoding="utf-8")
    (tmp_path / "script.py").write_text(SCRIPT, encoding="utf-8")
    proc = start_script(tmp_path, "script.py", new_session=True)  # one SIGINT, to it alone, as Ctrl-C
    try:
        log = tmp_path / "out" / "logs" / "local.jsonl"
        deadline = time.monotonic() + HANG_GUARD_S
        while not (log.is_file() and '"replica_placed"' in log.read_text(encoding="utf-8")):
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            time.sleep(0.05)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=HANG_GUARD_S)
    finally:
        kill_all_in(tmp_path, proc)
    assert proc.returncode == 130 and "KeyboardInterrupt" in out, err[-3000:]
    assert "UnboundLocalError" not in err, err[-3000:]
    assert left_working_in(tmp_path, HANG_GUARD_S) == []
