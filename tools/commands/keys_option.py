"""The ``--keys DIR`` option of the commands that talk to a cluster, and what it does."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from troupe.cli.client import fail
from troupe.runtime.errors import ConfigError
from troupe.runtime.security.process import install, keys_for

__all__ = [
    "KeysOption",
    "from_environment",
    "insecure_with_keys",
    "keys_directory",
    "use_group_keys",
    "use_keys",
]

_GIVEN = "troupe.keys_given"  # in the contexts' shared meta: a --keys DIR on the command line


def _command_line_wins(ctx: typer.Context, param: typer.CallbackParam, value: Path | None) -> Path | None:
    """A ``--keys DIR`` on the command line wins over ``$TROUPE_KEYS``, wherever it stands: the
    group's (``troupe ctl --keys DIR ping``) was replaced by the subcommand's option, filled
    from the environment (report ak 5), and a reader's directory given to act read-only acted
    as the operator a shell's profile named."""
    if value is None or param.name is None:
        return value
    if from_environment(ctx, param.name):
        return None if ctx.meta.get(_GIVEN) else value
    ctx.meta[_GIVEN] = True  # meta is shared by a group's context and its command's
    return value


def from_environment(ctx: typer.Context, name: str) -> bool:
    """Whether the option ``name`` took its value from its environment variable."""
    source = ctx.get_parameter_source(name)
    return source is not None and source.name == "ENVIRONMENT"


def keys_directory(value: str) -> Path:
    """The parser of every ``--keys DIR`` option: an empty one (``--keys ''``, ``--keys "$UNSET"``)
    was the current folder (``Path('')`` is ``.``), keys or not (report kl 2). An empty
    ``$TROUPE_KEYS`` is no keys, as an unset one: the option never sees it."""
    if value == "":
        raise fail(
            "--keys is empty (an empty path would be the current folder): give the keys directory, or "
            "leave --keys out to use none",
            2,
        )
    return Path(value)


def insecure_with_keys(insecure_from: str, keys_from: str) -> str:
    """Why a start given ``--insecure`` (or ``insecure = true``) and keys is refused: the keys
    won without a word, and which of the two was meant is the user's to say (report kl 4)."""
    way_out = "leave one of them out"
    if keys_from.startswith("$"):
        way_out += " (`TROUPE_KEYS= troupe ...` runs one command without the variable's keys)"
    return (
        f"{insecure_from} and {keys_from} contradict each other: --insecure is to listen without "
        f"keys, and the keys authenticate and encrypt every socket; {way_out}"
    )


KeysOption = Annotated[
    Path | None,
    typer.Option(
        "--keys",
        envvar="TROUPE_KEYS",
        help="CURVE keys directory: presents its operator key (else reader, else cluster).",
        callback=_command_line_wins,
        parser=keys_directory,
        metavar="DIR",
    ),
]


def use_keys(keys: Path | None) -> None:
    """Talk to the cluster with the key found in ``keys`` (see ``load_keys``): every socket of
    this command then authenticates and encrypts. Exits 2 with one line if the keys are bad."""
    if keys is None:
        return
    try:
        install(keys_for(keys, None))
    except ConfigError as exc:
        raise fail(str(exc), 2) from None


def use_group_keys(ctx: typer.Context, keys: Path | None) -> None:
    """A group's ``--keys DIR`` (``troupe logs --keys DIR tail``), used where it is on the command
    line: ``$TROUPE_KEYS`` is left to the commands that talk to a cluster (``logs tail --logs
    DIR`` reads files, and a stale variable must not stop it)."""
    if not from_environment(ctx, "keys"):
        use_keys(keys)
