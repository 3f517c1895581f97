"""``troupe keys generate DIR``: the CURVE key pairs of a cluster and of its operators.

Without options it writes the ``cluster``, ``operator`` and ``reader`` pairs; ``--operator NAME``
and ``--reader NAME`` (repeatable) add ``operator-NAME`` and ``reader-NAME`` pairs to an
existing directory. An existing pair is never overwritten (exit status 2).
"""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from troupe.cli.client import fail
from troupe.cli.literal import literal
from troupe.runtime.errors import ConfigError
from troupe.runtime.security.keys import generate_keys

__all__ = ["keys_app"]

keys_app = typer.Typer(no_args_is_help=True)
console = Console()


@keys_app.callback()
def _keys() -> None:
    """Make CURVE key pairs for the cluster, its operators and its readers."""


@keys_app.command("generate")
def generate(
    directory: Annotated[Path, typer.Argument(metavar="DIR", help="Where the key files go (made 0700).")],
    operator: Annotated[
        list[str] | None,
        typer.Option(
            "--operator",
            metavar="NAME",
            help="Add the pair operator-NAME (every control message); repeatable.",
        ),
    ] = None,
    reader: Annotated[
        list[str] | None,
        typer.Option(
            "--reader", metavar="NAME", help="Add the pair reader-NAME (ping, status, jobs...); repeatable."
        ),
    ] = None,
) -> None:
    """Write new key pairs: NAME.key (public) and NAME.key_secret (secret, mode 0600)."""
    try:
        written = generate_keys(directory, operator or (), reader or ())
    except ConfigError as exc:
        raise fail(str(exc), 2) from None
    for path in written:
        console.print(literal(f"wrote {path} and {path.stem}.key"), highlight=False, soft_wrap=True)
    console.print(
        "every host: cluster.key, cluster.key_secret and the operators' and readers' *.key; "
        "an operator: cluster.key and their own pair",
        highlight=False,
        soft_wrap=True,
    )
    if not (directory / "cluster.key").exists():
        # Named pairs alone make no cluster: a new cluster's pair comes without options.
        console.print(
            literal(
                f"{directory} has no cluster.key: for a new cluster, run `troupe keys generate "
                f"{shlex.quote(str(directory))}` (no --operator or --reader) for its pair; in an "
                "operator's own directory, copy the cluster's cluster.key in"
            ),
            highlight=False,
            soft_wrap=True,
        )
