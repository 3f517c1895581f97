"""A master's (or node's) reply of a shape this troupe version does not know (a field null, a
string where a number goes, a node entry that is a string) is said in one line, exit 1, by
``ctl status``, ``ctl jobs``, ``ctl dead`` and ``ctl top --once``: they printed a Python
traceback (``'NoneType' object has no attribute 'items'``)."""

from __future__ import annotations

import io
from typing import Any

import pytest
import typer
from rich.console import Console
from typer.testing import CliRunner

from troupe.cli.commands import ctl
from troupe.cli.commands.top import Look, _shaped_frame

MASTER = "tcp://127.0.0.1:47560"
NODE = "tcp://127.0.0.1:47561"
AS_A_MASTER = f"{MASTER} answered, but not as a master of this troupe version expects"


def _master(**changed: Any) -> dict[str, Any]:
    node = {"node": "n1", "alive": True, "workers": 1, "last_beat_age_s": 0.5, "resources": {}}
    job = {"job_id": "j", "state": "running", "total": 2, "counts": {"done": 1}, "done_per_s": 1.0}
    reply = {"master": "master", "endpoint": MASTER, "pid": 2, "journal": "j.db", "code": None,
             "tasks": {"done": 1}, "throughput": {"done_per_s": 1.0, "window_s": 30, "done_since_start": 1},
             "speculative": {"launched": 0, "won": 0}, "leases_outstanding": 0, "nodes": [node],
             "workers": [], "jobs": [job]}  # fmt: skip
    return {**reply, **changed}


def _job(**changed: Any) -> dict[str, Any]:
    return {**_master()["jobs"][0], **changed}


BAD_MASTERS = {
    "counts null": _master(jobs=[_job(counts=None)]),
    "a beat's age a string": _master(nodes=[{**_master()["nodes"][0], "last_beat_age_s": "abc"}]),
    "a node entry a string": _master(nodes=["n1"]),
    "tasks missing": {k: v for k, v in _master().items() if k != "tasks"},
}


def _one_line(output: str, said: str) -> None:
    lines = [line for line in output.splitlines() if line.strip()]
    assert len(lines) == 1 and said in lines[0], output
    assert "Traceback" not in output


def _invoke(monkeypatch: pytest.MonkeyPatch, reply: Any, *args: str) -> Any:
    monkeypatch.setattr(ctl, "run_async", lambda *_a, **_k: reply)
    monkeypatch.setattr(ctl, "console", Console(file=io.StringIO(), width=200))  # nothing half-printed
    return CliRunner().invoke(ctl.ctl_app, list(args))


@pytest.mark.parametrize("shape", BAD_MASTERS)
def test_ctl_status_says_the_master_answered_in_another_shape(
    monkeypatch: pytest.MonkeyPatch, shape: str
) -> None:
    done = _invoke(monkeypatch, (None, BAD_MASTERS[shape], {}), "status", "--master", MASTER, "--node", NODE)
    assert done.exit_code == 1
    _one_line(done.output, AS_A_MASTER)
    assert ctl.console.file.getvalue() == "", "no part of the view before the error"


def test_a_missing_field_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    done = _invoke(monkeypatch, (None, BAD_MASTERS["tasks missing"], {}), "status", "--master", MASTER)
    _one_line(done.output, f"{AS_A_MASTER} (no field 'tasks')")


def test_a_node_s_reply_of_another_shape_is_the_node_s(monkeypatch: pytest.MonkeyPatch) -> None:
    node = {"node": "n1", "pid": 1, "endpoint": NODE, "uptime_s": "abc", "rss_mib": 1, "workers": []}
    done = _invoke(monkeypatch, (node, None, {}), "status", "--node", NODE)
    assert done.exit_code == 1
    _one_line(done.output, f"{NODE} answered, but not as a node of this troupe version expects")


@pytest.mark.parametrize("reply", [[_job(counts=None)], [_job(), "j2"], {"j": 1}])
def test_ctl_jobs_says_it(monkeypatch: pytest.MonkeyPatch, reply: Any) -> None:
    done = _invoke(monkeypatch, reply, "jobs", "--master", MASTER)
    assert done.exit_code == 1
    _one_line(done.output, AS_A_MASTER)


@pytest.mark.parametrize("reply", [{"t1": "boom"}, [{"task_id": "t1"}], ["t1"]])
def test_ctl_dead_says_it(monkeypatch: pytest.MonkeyPatch, reply: Any) -> None:
    done = _invoke(monkeypatch, reply, "dead", "j", "--master", MASTER)
    assert done.exit_code == 1
    _one_line(done.output, AS_A_MASTER)


@pytest.mark.parametrize("shape", ["a beat's age a string", "a node entry a string"])
def test_ctl_top_once_says_which_answered_in_another_shape(
    capsys: pytest.CaptureFixture[str], shape: str
) -> None:
    with pytest.raises(typer.Exit) as stopped:
        _shaped_frame(Look(0.0, master=BAD_MASTERS[shape]), None, NODE, MASTER, None)
    assert stopped.value.exit_code == 1
    _one_line(capsys.readouterr().err, AS_A_MASTER)


def test_ctl_top_shows_a_reply_of_the_known_shape() -> None:
    assert _shaped_frame(Look(0.0, master=_master()), None, NODE, MASTER, None) is not None
