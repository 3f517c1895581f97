"""au 5: every key of the ``--json`` outputs a script reads is in docs/METRICS.md ("The `--json`
outputs": key, type, unit, meaning), and ``ctl submit --json`` always carries ``state``.

The outputs themselves are taken from a real run and a real node where those are run already
(tests/e2e/test_run_startup_share.py, test_cli.py, test_cluster_hosts.py call ``undocumented``);
here the check's own reading of the doc, and the submit reply of a master in memory.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from support.json_doc import documented, undocumented
from support.memory_master import master_in_memory
from troupe.cli.commands import ctl
from troupe.cli.main import app

JOB = {"job": {"job": {"name": "j", "kind": "k", "count": 2}}, "source": "t"}


def test_the_doc_names_the_keys_a_script_asked_about() -> None:
    """Those the finding found in no document, and both sides of a cell naming several."""
    run = documented("troupe run --json")
    assert {"elapsed_s", "wall_s", "stages.*.items_in", "stages.*.queue_bound", "finals.*.episodes"} <= run
    status = documented("troupe ctl status --json")
    assert {"template.light_pid", "security.incomplete_handshakes", "master.gc.pause_s"} <= status
    assert {"supervision.supervisor.beats_bad_mac", "master.speculative.won"} <= status
    assert {"state", "already"} <= documented("troupe ctl submit --json")


def test_a_key_no_row_names_is_found_wherever_it_is() -> None:
    report: dict[str, Any] = {
        "wall_s": 1.0,
        "stages": {"render": {"items_in": 3, "new_figure": 1}},
        "finals": {},
        "errors": {"job-000001": "KeyError: 'x'"},
        "brand_new": [1, 2],
    }
    assert undocumented("troupe run --json", report) == ["stages.render.new_figure", "brand_new"]
    status = {"workers": [{"name": "w", "odd": 1}, {"name": "v"}], "master": {"workers": []}}
    assert undocumented("troupe ctl status --json", status) == ["workers[].odd"]


async def test_the_master_says_the_state_of_a_new_job_too(tmp_path: Path) -> None:
    """A new job's reply said no ``state`` (a repeat's did): a script had to test for the key."""
    async with master_in_memory(tmp_path) as m:
        new = await m.call("submit", JOB)
        again = await m.call("submit", JOB)
    assert new == {"job_id": "j", "tasks": 2, "already": False, "state": None}
    assert again == {"job_id": "j", "tasks": 2, "already": True, "state": "running"}
    assert undocumented("troupe ctl submit --json", new) == []


def test_submit_json_says_state_even_where_an_older_master_did_not(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``ctl submit --json`` prints ``state`` null for a new job whatever the master's reply."""
    monkeypatch.setattr(
        ctl, "run_async", lambda *_args, **_kw: {"job_id": "demo", "tasks": 3, "already": False}
    )
    job = tmp_path / "job.toml"
    job.write_text('[job]\nname = "demo"\nkind = "nap"\ncount = 3\n', encoding="utf-8")
    result = CliRunner().invoke(app, ["ctl", "submit", str(job), "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.output) == {"job_id": "demo", "tasks": 3, "already": False, "state": None}
