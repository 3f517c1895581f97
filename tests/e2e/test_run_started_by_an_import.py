"""A script that defines its stage class and starts the run at its top level, without ``if
__name__ == "__main__":``: each process that imported the script for the class (the node's
template, a worker) started a run of its own, whose template imported it again, without end,
and the chain went on after Ctrl-C. Now the run started by the import is refused, naming the
guard, and the script's run fails in one error; nothing is left running."""

from __future__ import annotations

from pathlib import Path

import pytest

from support.processes import kill_all_in, left_working_in, start_script

pytestmark = pytest.mark.e2e

HANG_GUARD_S = 120  # only so a regression cannot hang the suite; nothing here measures speed

SCRIPT = """
from troupe.runtime import PipelineConfig, StageActor, StageConfig, run_pipeline_sync


class Double(StageActor):
    def process(self, item):
        return {"task_id": item["task_id"], "x": item["seed"] * 2}


stages = [StageConfig(name="d", actor="noguard:Double")]
print(run_pipeline_sync(PipelineConfig(name="m", items=3, stages=stages), "out").counts())
"""


def test_a_run_started_by_importing_the_stages_module_is_refused(tmp_path: Path) -> None:
    (tmp_path / "noguard.py").write_text(SCRIPT, encoding="utf-8")
    proc = start_script(tmp_path, "noguard.py")
    try:
        _, err = proc.communicate(timeout=HANG_GUARD_S)
    finally:
        kill_all_in(tmp_path, proc)  # a regression's chain: stopped whatever the assertion below says
    assert proc.returncode == 1, err[-3000:]
    assert "a pipeline run was started as troupe's template process imported 'noguard'" in err, err[-3000:]
    assert 'if __name__ == "__main__":' in err
    assert left_working_in(tmp_path, HANG_GUARD_S) == []
