"""`troupe logs tail` filters and prints: --node, --actor, --task, --level, --json, on canned lines."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from rich.console import Console

from troupe.cli.log_filters import LogFilter, format_line, readable


def _rec(**fields: object) -> str:
    base = {"timestamp": "2026-01-01T00:00:01Z", "level": "info", "node": "n1", "event": "e"}
    return json.dumps({**base, **fields})


HOSTILE = _rec(event="[bold red]owned[/] \x1b[2J :smile:", actor="enc[1]")


@pytest.mark.parametrize(
    ("options", "line", "node", "shown"),
    [
        ({}, "not json at all", "n1", True),
        ({"nodes": ["n1"]}, _rec(), "nX", True),  # the line's own node field wins
        ({"nodes": ["n2,n3"]}, _rec(node="n3"), "n3", True),  # comma-separated
        ({"nodes": ["n2"]}, _rec(), "n1", False),
        ({"nodes": ["n2"]}, "not json", "n2", True),  # by the file or stream it came from
        ({"nodes": ["n2"]}, "not json", "n1", False),
        ({"actors": ["enc"]}, _rec(actor="enc"), "n1", True),
        ({"actors": ["enc"]}, _rec(actor="encoder"), "n1", False),  # exact without *
        ({"actors": ["enc*"]}, _rec(actor="encoder-3"), "n1", True),
        ({"actors": ["dec", "enc*"]}, _rec(actor="dec"), "n1", True),
        ({"actors": ["enc*"]}, _rec(), "n1", False),  # no actor field
        ({"actors": ["enc*"]}, "not json", "n1", False),
        ({"tasks": ["t-7"]}, _rec(task_id="t-7"), "n1", True),
        ({"tasks": ["t-7"]}, _rec(task_id="t-70"), "n1", False),
        ({"level": "warning"}, _rec(level="error"), "n1", True),
        ({"level": "warning"}, _rec(level="warning"), "n1", True),
        ({"level": "warning"}, _rec(level="info"), "n1", False),
        ({"level": "WARNING"}, _rec(level="critical"), "n1", True),
        ({"level": "error"}, _rec(level="exception"), "n1", True),
        ({"level": "warning"}, _rec(level="chatter"), "n1", False),  # unknown counts as info
        ({"level": "debug"}, _rec(level="chatter"), "n1", True),
        ({"level": "info"}, "[1, 2]", "n1", False),  # JSON, but not a record
        ({"nodes": ["n1"], "level": "error", "actors": ["a"]}, _rec(level="error", actor="a"), "n1", True),
        ({"nodes": ["n1"], "level": "error", "actors": ["a"]}, _rec(level="error", actor="b"), "n1", False),
    ],
)
def test_a_filter_shows_what_matches_every_given_option(
    options: dict[str, object], line: str, node: str, shown: bool
) -> None:
    """Each option narrows; values of one option are alternatives; non-JSON lines pass --node only."""
    keep = LogFilter.from_options(**options)  # type: ignore[arg-type]
    assert keep.accepts(line, node) is shown


def test_an_unknown_level_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match=r"'loud'.*debug, info, warning, error, critical"):
        LogFilter.from_options(level="loud")


def test_hostile_text_is_printed_as_it_is() -> None:
    """Markup, emoji codes and escape codes in a line are text: nothing is styled, dropped or run."""
    console = Console(record=True, width=40, soft_wrap=True, markup=False, emoji=False, color_system=None)
    console.print(readable(HOSTILE))
    out = console.export_text()
    assert "[bold red]owned[/]" in out and ":smile:" in out and "enc[1]" in out
    assert format_line("plain text\n") == "plain text"
    assert format_line(_rec(extra=1)).split() == ["2026-01-01T00:00:01Z", "info", "n1", "e", "extra=1"]


def _tail(logs: Path, *options: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "troupe.cli.main",
            "logs",
            "tail",
            "--logs",
            str(logs),
            "--no-follow",
            *options,
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.fixture
def logs(tmp_path: Path) -> Path:
    d = tmp_path / "logs"
    d.mkdir()
    lines = [
        _rec(timestamp="2026-01-01T00:00:01Z", node="n1", event="a", actor="enc1", task_id="t1"),
        _rec(timestamp="2026-01-01T00:00:03Z", node="n1", event="c", level="error", actor="dec"),
        "garbage-from-crash",
        HOSTILE.replace("00:00:01", "00:00:05"),
    ]
    (d / "n1.jsonl").write_text("\n".join(lines) + "\n")
    (d / "n2.jsonl").write_text(
        _rec(timestamp="2026-01-01T00:00:02Z", node="n2", event="b", actor="enc2", task_id="t1") + "\n"
    )
    return d


def _events(out: str) -> list[str]:
    """The event of each printed line (the hostile one's starts with "[bold"), or the line itself."""
    return [next((t for t in ln.split() if t in ("a", "b", "c", "[bold")), ln) for ln in out.splitlines()]


def test_the_command_filters_the_files(logs: Path) -> None:
    """The options as a user types them, over two nodes' files, interleaved in time."""
    assert _events(_tail(logs).stdout)[:4] == ["a", "b", "c", "garbage-from-crash"]
    assert _events(_tail(logs, "--node", "n2").stdout) == ["b"]
    assert _events(_tail(logs, "--actor", "enc*").stdout) == ["a", "b", "[bold"]
    assert _events(_tail(logs, "--task", "t1", "--node", "n1").stdout) == ["a"]
    assert _events(_tail(logs, "--level", "error").stdout) == ["c"]
    assert _events(_tail(logs, "--node", "n1", "-n", "2").stdout) == ["garbage-from-crash", "[bold"]


def test_json_prints_the_lines_unchanged_and_readable_shows_markup_as_text(logs: Path) -> None:
    raw = _tail(logs, "--json", "--level", "info", "--node", "n1")
    assert raw.returncode == 0, raw.stderr
    assert [json.loads(ln)["event"] for ln in raw.stdout.splitlines()][-1] == json.loads(HOSTILE)["event"]
    shown = _tail(logs, "--actor", "enc1,enc[1]")
    assert "[bold red]owned[/]" in shown.stdout and "\\x1b[2J" in shown.stdout and "\x1b" not in shown.stdout


def test_bad_filter_options_exit_2_naming_them(logs: Path) -> None:
    """Each in one line, as every other refusal (typer's were a boxed usage message)."""
    out = _tail(logs, "--level", "loud")
    assert out.returncode == 2 and "--level" in out.stderr and "loud" in out.stderr
    assert "Traceback" not in out.stderr and out.stderr.count("\n") == 1, out.stderr
    missing = _tail(logs.parent / "no-such-dir")
    assert missing.returncode == 2 and missing.stderr.count("\n") == 1, missing.stderr
    assert "--logs" in missing.stderr and "no-such-dir does not exist;" in missing.stderr
    a_file = _tail(logs / "n1.jsonl")
    assert a_file.returncode == 2 and a_file.stderr.count("\n") == 1, a_file.stderr
    assert "n1.jsonl is not a directory;" in a_file.stderr


@pytest.mark.parametrize("pattern", ["*2", "t*k", "task?"])
def test_an_actor_pattern_other_than_a_prefix_is_refused(pattern: str) -> None:
    """Only a name or a prefix ending in * is supported: the others matched nothing, silently."""
    with pytest.raises(ValueError, match=r"--actor .*: give an actor.s name, or the start of names"):
        LogFilter.from_options(actors=[pattern])
    assert LogFilter.from_options(actors=["enc*", "task"]).actors == ("enc*", "task")
