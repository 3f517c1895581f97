"""Every `troupe ctl` command takes `--timeout S`, as the README says: `ctl heal` and `ctl chaos`
did not ("No such option: --timeout", exit 2). Read from the command tree itself, so a command
added without it fails here."""

from __future__ import annotations

import typer

import troupe.cli.main  # noqa: F401  (registers every ctl command)
from troupe.cli.commands.ctl import ctl_app


def test_every_ctl_command_takes_a_timeout() -> None:
    group = typer.main.get_command(ctl_app)
    commands = group.commands  # type: ignore[attr-defined]
    assert {"chaos", "heal", "status", "jobs"} <= set(commands)
    missing = sorted(
        name
        for name, command in commands.items()
        if "--timeout" not in {o for p in command.params for o in p.opts}
    )
    assert not missing, f"troupe ctl {missing} take no --timeout"
