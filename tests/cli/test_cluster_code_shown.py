"""Which troupe code the parts of a cluster run, as operators see it: ``ctl status`` shows the
master's and each node's (unknown for older ones, in the tables and in --json), and ``troupe
run --cluster`` warns of a mixed cluster on stderr."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import pytest
import typer
from rich.console import Console

from troupe.cli import master_client
from troupe.cli.commands import run_pipeline
from troupe.cli.commands.run_pipeline import Cluster, finish_run
from troupe.cli.master_client import master_status, master_tables
from troupe.runtime.errors import ConfigError

MASTER = "tcp://127.0.0.1:30002"


def _reply(**extra: Any) -> dict[str, Any]:
    """A master's status reply as an older master sends it: no ``code`` anywhere."""
    node = {"node": "n1", "alive": True, "workers": 0, "last_beat_age_s": 0.5, "resources": {}}
    return {
        "master": "master",
        "endpoint": MASTER,
        "pid": 2,
        "journal": "j.db",
        "tasks": {},
        "throughput": {"done_per_s": 0.0, "window_s": 30, "done_since_start": 0},
        "speculative": {"launched": 0, "won": 0},
        "leases_outstanding": 0,
        "nodes": [node],
        "workers": [],
        "jobs": [],
        **extra,
    }


def _text(status: dict[str, Any]) -> str:
    console = Console(record=True, width=240, color_system=None)
    for table in master_tables(status):
        console.print(table)
    return console.export_text()


def test_the_tables_show_each_part_s_code_and_older_ones_as_unknown() -> None:
    status = _reply(code="0.1.0+3f9a1c2e")
    status["nodes"].append({**status["nodes"][0], "node": "n2", "code": "0.1.0+[bold]x"})
    lines = _text(status).splitlines()
    assert any("code" in line and "0.1.0+3f9a1c2e" in line for line in lines)  # the master's row
    (n1,) = [line for line in lines if "│ n1 " in line]
    (n2,) = [line for line in lines if "│ n2 " in line]
    assert "unknown" in n1  # a node of before the field
    assert "0.1.0+[bold]x" in n2  # a peer's text, not markup
    assert "unknown" in _text(_reply())  # an older master says no code of its own


def test_json_says_null_for_an_older_master_and_its_nodes(monkeypatch: pytest.MonkeyPatch) -> None:
    async def older_master(endpoint: str, msg_type: str, payload: Any = None, timeout: float = 10.0) -> Any:
        return _reply()

    monkeypatch.setattr(master_client, "master_call", older_master)
    status = anyio.run(master_status, MASTER, 1.0)
    assert status["code"] is None and status["nodes"][0]["code"] is None


def test_a_cluster_run_warns_of_mixed_code_on_stderr(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    async def mixed_cluster(*args: Any, on_warning: Any = None, **kwargs: Any) -> Any:
        on_warning("this cluster runs mixed troupe code (node [n2] unknown)")
        raise ConfigError("stopped here: the run itself is not this test's")

    monkeypatch.setattr(run_pipeline, "run_pipeline", mixed_cluster)
    with pytest.raises(typer.Exit):  # the ConfigError, said as the CLI says it
        finish_run(None, tmp_path / "out", 2, "", "", as_json=True, cluster=Cluster(MASTER))
    out, err = capsys.readouterr()
    assert "warning: this cluster runs mixed troupe code (node [n2] unknown)" in err
    assert "mixed" not in out  # stdout is the JSON's
