"""What `troupe run` says while its node's template imports: the import, named.

On a terminal the spinner names the class or module being imported and the seconds so far;
piped, a usual start says nothing, and a long one gets a line after 30 s and every minute.
"""

from __future__ import annotations

import io

from rich.console import Console

from troupe.cli.commands.starting_status import StartingStatus

NOW = "mypkg.stages:Render"


def _status(terminal: bool, quiet: bool = False) -> tuple[StartingStatus, io.StringIO, io.StringIO]:
    screen, notes = io.StringIO(), io.StringIO()
    status = StartingStatus(
        Console(file=screen, force_terminal=terminal, width=200),
        cluster=False,
        quiet=quiet,
        notes=Console(file=notes, width=200),
    )
    return status, screen, notes


def test_piped_a_long_start_is_said_after_30_s_then_every_minute() -> None:
    status, screen, notes = _status(terminal=False)
    status.start()
    for waited in (1.0, 12.0, 29.0):
        status.importing(NOW, waited)
    assert notes.getvalue() == "", "a start of usual length says nothing"
    status.importing(NOW, 31.0)
    status.importing(NOW, 60.0)
    status.importing(None, 91.5)
    lines = notes.getvalue().splitlines()
    assert len(lines) == 2, lines
    assert lines[0].startswith("still starting the node after 31 s: its template imports mypkg.stages:Render")
    assert lines[1].startswith("still starting the node after 92 s: its template imports the stages' classes")
    assert "Ctrl-C stops it now" in lines[0]
    status.stop()
    assert screen.getvalue() == ""


def test_json_on_a_terminal_keeps_stdout_clean_and_says_it_on_stderr() -> None:
    status, screen, notes = _status(terminal=True, quiet=True)
    status.start()
    status.importing(NOW, 45.0)
    status.stop()
    assert screen.getvalue() == ""
    assert "after 45 s" in notes.getvalue()


def test_a_terminal_spinner_names_the_import_and_its_seconds() -> None:
    status, _screen, notes = _status(terminal=True)
    status.start()
    try:
        status.importing("[bold]odd\\", 7.2)  # markup, and a backslash that escape() doubled
        text = status.text
    finally:
        status.stop()
    assert text == "starting the node: its template imports [bold]odd\\ (7 s)"
    assert notes.getvalue() == "", "the spinner says it: no line on stderr"
