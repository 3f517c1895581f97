"""Every `troupe ctl` command takes `--timeout S` and `--keys DIR`, as the README says: `ctl heal`
and `ctl chaos` did not take the first ("No such option: --timeout", exit 2), `ctl top` the second.
Read from the command tree itself, so a command added without them fails here."""

from __future__ import annotations

import pytest
import typer

import troupe.cli.main  # noqa: F401  (registers every ctl command)
from troupe.cli.commands.ctl import ctl_app


@pytest.mark.parametrize("option", ["--timeout", "--keys"])
def test_every_ctl_command_takes_the_option(option: str) -> None:
    group = typer.main.get_command(ctl_app)
    commands = group.commands  # type: ignore[attr-defined]
    assert {"chaos", "heal", "status", "jobs", "top"} <= set(commands)
    missing = sorted(
        name
        for name, command in commands.items()
        if option not in {o for p in command.params for o in p.opts}
    )
    assert not missing, f"troupe ctl {missing} take no {option}"
