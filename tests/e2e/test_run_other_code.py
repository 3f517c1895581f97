"""``troupe run`` resuming a folder another troupe code made: one line on the terminal (on stderr
with --json), both codes in run.json, and no second word once this code ran there (report up 5:
an older troupe's interrupted run, resumed by today's, mixed two encoders' episodes silently).

The other code is written into the record, as an older install would have left it; the pipeline
is the synthetic CostStage one at a millisecond per item, so a run is quick.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from troupe.runtime.pipeline.run_code import this_code
from troupe.runtime.testing.plugin import free_endpoint

pytestmark = pytest.mark.e2e

PIPELINE = """\
[pipeline]
name = "synthetic"
items = 4

[[stages]]
name = "plan"
actor = "troupe.actors.bench.synthetic:CostStage"
kwargs = { cost_s = 0.001 }

[[stages]]
name = "store"
actor = "troupe.actors.bench.synthetic:CostStage"
kwargs = { cost_s = 0.001 }
"""
OLDER = {"version": "0.0.9", "digest": "0123abcd"}


def _troupe_run(toml: Path, out: Path, *args: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "troupe.cli.main", "run", str(toml), "--out", str(out)]
    command += ["--endpoint", free_endpoint(), "--master", free_endpoint(), *args]
    env = {**os.environ, "COLUMNS": "400"}
    return subprocess.run(command, capture_output=True, text=True, timeout=120, check=False, env=env)


def _begun_by_older_code(out: Path) -> None:
    """The record as an older troupe left it when its run was stopped before it finished."""
    record_path = out / ".troupe" / "run.json"
    record = json.loads(record_path.read_text(encoding="utf-8"))
    record_path.write_text(json.dumps({**record, "complete": None, "made_by": [OLDER]}), encoding="utf-8")


@pytest.mark.timeout(300)
@pytest.mark.parametrize("as_json", [False, True])
def test_a_run_resumed_under_other_code_says_so_in_one_line(tmp_path: Path, as_json: bool) -> None:
    toml, out = tmp_path / "synthetic.toml", tmp_path / "out"
    toml.write_text(PIPELINE, encoding="utf-8")
    json_flag = ("--json",) if as_json else ()
    first = _troupe_run(toml, out)
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    assert "was made by" not in first.stdout + first.stderr
    _begun_by_older_code(out)

    resumed = _troupe_run(toml, out, *json_flag)
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    said = resumed.stderr if as_json else resumed.stdout
    now = this_code()
    lines = [ln for ln in said.splitlines() if "was made by" in ln]
    assert lines == [
        f"--out {out.resolve()} was made by troupe 0.0.9 (code 0123abcd); this is troupe "
        f"{now['version']} (code {now['digest']}): what this run makes there will be this code's and "
        "may differ from what is there already (an encoder's settings, say), so the folder mixes "
        "both; --fresh makes everything again with this one"
    ], said
    if as_json:
        assert json.loads(resumed.stdout)["already_complete"] is False  # stdout: the JSON alone
    record = json.loads((out / ".troupe" / "run.json").read_text(encoding="utf-8"))
    assert record["made_by"] == [OLDER, now]

    again = _troupe_run(toml, out, *json_flag)  # finished by this code: nothing more to say
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    assert "was made by" not in again.stdout + again.stderr
