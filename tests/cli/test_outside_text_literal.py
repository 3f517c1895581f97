"""Outside text (paths, endpoints, ids, names, reasons, errors) is printed exactly as it is, by
real rich rendering: a journal path holding ``[/]`` made ``ctl status`` fail with a
MarkupError, ``[prod]`` in an endpoint was dropped, and a trailing backslash came out doubled
(``rich.markup.escape`` adds one where no tag follows)."""

from __future__ import annotations

import io
from typing import Any

import pytest
from rich.console import Console
from typer.testing import CliRunner

from troupe.cli.client import fail
from troupe.cli.commands import ctl
from troupe.cli.commands.top import Look, frame
from troupe.cli.master_client import jobs_tables, master_tables
from troupe.cli.tables import print_whole, status_tables

CLOSES = "/tmp/x[/]y/j.db"  # a closing tag with nothing to close: MarkupError
DROPPED = "ipc:///tmp/[prod]/n.sock"  # a tag rich took and removed
BACKSLASH = "C:\\data\\"  # ends in one backslash, to stay one
TAGGED = "[red]j[/red]\\"  # a tag and a trailing backslash


def _rendered(renderables: list[Any]) -> str:
    out = io.StringIO()
    console = Console(file=out, width=300, color_system=None)
    for renderable in renderables:
        print_whole(console, renderable)
    return out.getvalue()


def _shown(text: str, value: str) -> None:
    assert value in text, f"{value!r} not shown as it is in:\n{text}"
    assert value + "\\" not in text, f"{value!r}'s trailing backslash doubled in:\n{text}"


def _node_status() -> dict[str, Any]:
    runtime = {
        "actors": {TAGGED: {"kind": BACKSLASH, "handled": 1, "failed": 0, "mailbox_depth": 0,
                            "mailbox_capacity": 8, "busy": False}},
        "faults": [CLOSES],
    }  # fmt: skip
    worker = {"name": "w[/]", "kind": "[prod]", "state": "running", "pid": 7, "restarts": 0,
              "exit": BACKSLASH, "last_error": f"boom in {CLOSES} {BACKSLASH}", "actors": [TAGGED],
              "runtime": runtime}  # fmt: skip
    return {"node": "n[/]1\\", "pid": 1, "endpoint": DROPPED, "uptime_s": 3.0, "rss_mib": 40.0,
            "tags": ["[gpu]", BACKSLASH], "workers": [worker],
            "security": {"curve": True, "user": BACKSLASH},
            "supervision": {"supervisor_pid": "[/]", "supervisor": True}}  # fmt: skip


def _master_status() -> dict[str, Any]:
    job = {"job_id": TAGGED, "state": "running", "total": 2, "counts": {"done": 1}, "done_per_s": 1.0,
           "waiting": [{"tasks": 1, "reason": f"a node tagged [gpu] {BACKSLASH}"}]}  # fmt: skip
    node = {"node": BACKSLASH, "alive": True, "workers": 1, "last_beat_age_s": 0.5, "resources": {},
            "tags": ["[/]"], "code": TAGGED}  # fmt: skip
    worker = {"worker_id": f"{BACKSLASH}/w", "node": "[prod]", "used": 0, "slots": 1, "gpu": None,
              "draining": False, "kinds": ["[/]"]}  # fmt: skip
    return {"master": "m[/]", "endpoint": DROPPED, "pid": 2, "journal": CLOSES, "code": BACKSLASH,
            "tasks": {"done": 1}, "throughput": {"done_per_s": 1.0, "window_s": 30, "done_since_start": 1},
            "speculative": {"launched": 0, "won": 0}, "leases_outstanding": 0, "nodes": [node],
            "workers": [worker], "jobs": [job]}  # fmt: skip


def test_a_node_s_status_shows_paths_names_and_errors_as_they_are() -> None:
    text = _rendered(status_tables(_node_status()))
    for value in (DROPPED, "n[/]1\\", "w[/]", "[prod]", BACKSLASH, TAGGED, CLOSES, "[gpu]", "pid [/]"):
        _shown(text, value)
    _shown(text, f"boom in {CLOSES} {BACKSLASH}")


def test_the_master_s_status_shows_its_journal_endpoint_and_jobs_as_they_are() -> None:
    text = _rendered(master_tables(_master_status()))
    for value in (CLOSES, DROPPED, "m[/]", TAGGED, BACKSLASH, f"{BACKSLASH}/w", "[prod]", "[/]"):
        _shown(text, value)
    _shown(text, f"a node tagged [gpu] {BACKSLASH}")
    _shown(_rendered(jobs_tables(_master_status()["jobs"])), TAGGED)


def test_ctl_top_shows_them_as_they_are() -> None:
    node = _node_status()
    text = _rendered([frame(Look(node=node, master=_master_status(), at=0.0), None, DROPPED, CLOSES, None)])
    for value in ("w[/]", TAGGED, BACKSLASH):
        _shown(text, value)


def test_an_error_line_keeps_its_backslash_and_brackets(capsys: pytest.CaptureFixture[str]) -> None:
    fail(f"journal {CLOSES} at {BACKSLASH}")
    err = capsys.readouterr().err
    assert err.strip() == f"error: journal {CLOSES} at {BACKSLASH}"


@pytest.mark.parametrize(
    ("args", "reply", "said"),
    [
        (["cancel", TAGGED], "failed\\", f"job {TAGGED} ended already (failed\\): nothing to cancel"),
        (["cancel", BACKSLASH], None, f"job {BACKSLASH} cancelled"),
        (
            ["undrain", "n[/]"],
            {"restarted": ["w\\"]},
            "node n[/] takes tasks again; workers started again: w\\",
        ),
        (["dead", BACKSLASH], [], f"job {BACKSLASH} has no dead-lettered task"),
    ],
)
def test_ctl_lines_say_ids_and_names_as_they_are(
    monkeypatch: pytest.MonkeyPatch, args: list[str], reply: Any, said: str
) -> None:
    monkeypatch.setattr(ctl, "run_async", lambda *_a, **_k: reply)
    monkeypatch.setattr(ctl, "console", Console(width=300, color_system=None))
    done = CliRunner().invoke(ctl.ctl_app, args)
    assert done.exit_code == 0, done.output
    assert done.output.strip() == said
