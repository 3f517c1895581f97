"""The ``--keys DIR`` option of the commands that talk to a cluster, and what it does."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from troupe.cli.client import fail
from troupe.runtime.errors import ConfigError
from troupe.runtime.security.process import install, keys_for

__all__ = ["KeysOption", "use_keys"]

KeysOption = Annotated[
    Path | None,
    typer.Option(
        "--keys",
        envvar="TROUPE_KEYS",
        help="CURVE keys directory: presents its operator key (else reader, else cluster).",
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
