"""i14 1: `troupe bench scale` on a machine many times slower than the job's ideal makespan
ended, after minutes, in a traceback (``RuntimeError: bench job scale_no_speculation ended
running: {...}``), the figures of the job that had finished thrown away. A job not done within
its wait is one line saying how far it got and what to do, exit 1; ``--json`` keeps the figures
measured before it. Without processes: a fake master for the job, a fake measurement for the
command."""

from __future__ import annotations

import json
import os
from typing import Any

import anyio
import pytest
from typer.testing import CliRunner

from troupe.cli.bench import scale
from troupe.cli.main import app

_COUNTS = {"pending": 31188, "leased": 1991, "failed": 0, "done": 66821, "dead": 0, "cancelled": 0}


def test_a_job_not_done_within_its_wait_says_how_far_it_got(monkeypatch: pytest.MonkeyPatch) -> None:
    async def master_call(endpoint: str, kind: str, payload: Any, timeout: float) -> Any:
        if kind == "wait_job":  # the master's answer when its wait ran out
            return {"state": "running", "counts": _COUNTS}
        return {}

    monkeypatch.setattr(scale, "master_call", master_call)
    with pytest.raises(scale.JobOutran) as outran:
        anyio.run(scale._run_job, "tcp://fake:1", os.getpid(), "scale_no_speculation", 100_000, False, 218.4)
    said = str(outran.value)
    assert said.startswith("bench job scale_no_speculation was running, not done, after its wait of 218 s")
    assert "66,821 of 100,000 tasks done, 31,188 pending, 1,991 leased" in said and "\n" not in said


@pytest.mark.parametrize("as_json", [False, True])
def test_the_command_says_it_in_one_line_and_keeps_what_it_measured(
    monkeypatch: pytest.MonkeyPatch, as_json: bool
) -> None:
    def measure_scale(*args: Any, **kwargs: Any) -> dict[str, Any]:
        outran = scale.JobOutran("scale_no_speculation", "running", _COUNTS, 218.4, 100_000)
        outran.figures = {"workers": 1000, "efficiency": 0.97}  # the job with speculation finished
        raise outran

    monkeypatch.setattr(scale, "measure_scale", measure_scale)
    result = CliRunner().invoke(app, ["bench", "scale", *(["--json"] if as_json else [])])
    assert result.exit_code == 1, result.output
    assert "Traceback" not in result.output
    assert "error: bench job scale_no_speculation was running, not done" in result.output
    if as_json:
        figures = json.loads(result.stdout[: result.stdout.rindex("}") + 1])
        assert figures["efficiency"] == 0.97 and "66,821 of 100,000" in figures["incomplete"]
    else:
        assert "speculation on: efficiency 0.970" in result.output
