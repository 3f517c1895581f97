"""A Ctrl-C while the `troupe` command still imports, or while typer builds its command line,
ends it with status 130 and no traceback."""

from __future__ import annotations

import subprocess
import sys
from importlib import metadata

import pytest

from support.cli_scripts import INTERRUPT_AT_COMMAND_IMPORT

# The interrupt is raised where a Ctrl-C would land: while the command's modules import.
INTERRUPTED_IMPORT = (
    INTERRUPT_AT_COMMAND_IMPORT
    + """
from troupe.cli.entry import main
main()
"""
)


# ... and where a Ctrl-C 1 s after `troupe run` landed on this machine: typer reading the
# commands' signatures, after the imports.
INTERRUPTED_BUILD = """
import sys
import typer.main

def interrupted(*args, **kwargs):
    raise KeyboardInterrupt

typer.main.get_command = interrupted
sys.argv = ["troupe", "run", "--help"]
from troupe.cli.entry import main
main()
"""


@pytest.mark.parametrize("script", [INTERRUPTED_IMPORT, INTERRUPTED_BUILD], ids=["import", "command-line"])
def test_an_interrupt_before_the_command_runs_exits_130_quietly(script: str) -> None:
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert done.returncode == 130, done.stderr
    assert done.stdout == "" and done.stderr == ""


def test_the_console_script_goes_through_the_entry() -> None:
    (script,) = [ep for ep in metadata.entry_points(group="console_scripts") if ep.name == "troupe"]
    assert script.value == "troupe.cli.entry:main"
