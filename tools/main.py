"""The ``troupe`` command: a thin client over the runtime."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Annotated, Any

import typer
from typer.core import TyperOption

from troupe.cli.bench.command import bench_app
from troupe.cli.commands import (
    chaos,  # noqa: F401  (adds `ctl chaos` and `ctl heal`)
    compact,  # noqa: F401  (adds `master compact`)
)
from troupe.cli.commands.configs import configs
from troupe.cli.commands.ctl import ctl_app
from troupe.cli.commands.keys import keys_app
from troupe.cli.commands.logs import logs_app
from troupe.cli.commands.master import master_app
from troupe.cli.commands.models import models_app
from troupe.cli.commands.node import node_app
from troupe.cli.commands.run import demo, run
from troupe.cli.stream_encoding import escape_unencodable
from troupe.runtime.code_identity import code_digest
from troupe.runtime.code_identity import version as _package_version
from troupe.runtime.library_logging import own_this_process

__all__ = ["app", "version"]


_DisplayType = Callable[[TyperOption, Any], str | None]  # Any: the context of typer's own click


def _flag_type_hidden(display_type_rich: _DisplayType) -> _DisplayType:
    """Typer 0.29's rich help prints an option's type even for flags (``--help <bool>``); its
    plain help and earlier releases print none. A flag takes no value, so it shows no type."""

    def display(self: TyperOption, ctx: Any) -> str | None:
        if self.is_flag or self.count:
            return None
        return display_type_rich(self, ctx)

    return display


if hasattr(TyperOption, "display_type_rich"):
    # A patch of typer's class: mypy refuses assigning to a method, and types the one read from
    # the class with its ``self`` twice.
    _display = _flag_type_hidden(TyperOption.display_type_rich)
    TyperOption.display_type_rich = _display  # type: ignore[method-assign,assignment]


def version() -> str:
    """The installed troupe's version (from the package metadata; ``unknown`` where a source
    tree was never installed) and the digest of the code it runs: ``0.1.0 (code 3f9a1c2e)``.
    The version alone is the same for every checkout (runtime/code_identity.py)."""
    return f"{_package_version()} (code {code_digest()})"


def _print_version(value: bool) -> None:
    if value:
        typer.echo(f"troupe {version()}")
        raise typer.Exit()


app = typer.Typer(
    name="troupe",
    help="An actor runtime for embodied-AI data and training pipelines.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


@app.callback()
def main(
    _version: Annotated[
        bool | None,
        typer.Option(
            "--version", callback=_print_version, is_eager=True, help="Print troupe's version and exit."
        ),
    ] = None,
) -> None:
    """An actor runtime for embodied-AI data and training pipelines."""
    escape_unencodable()
    own_this_process()  # the command's process: troupe configures its logging


app.add_typer(node_app, name="node", help="Start a node on this host.")
app.add_typer(master_app, name="master", help="Start the cluster's master (jobs, leases, journal).")
app.add_typer(ctl_app, name="ctl", help="Send control messages to a running cluster.")
app.add_typer(bench_app, name="bench", help="Measure troupe against its raw ceilings.")
app.add_typer(logs_app, name="logs", help="Follow the structured logs of the nodes.")
app.add_typer(keys_app, name="keys", help="Make CURVE key pairs (authenticate and encrypt).")
app.add_typer(models_app, name="models", help="Train and inspect troupe's models (the video VAE).")
app.command("run")(run)
app.command("demo")(demo)
app.command("configs")(configs)


def flowing(text: str) -> str:
    """``text`` (a docstring) with each paragraph on one line, for the terminal to wrap.

    Typer's rich help keeps a paragraph's single line breaks, which fit the source, not the
    terminal: ``troupe run --help`` broke mid-sentence at any width, and so did the command list
    of ``troupe --help``. A paragraph that starts with ``\\b`` keeps its lines (click's marker)."""
    paragraphs = inspect.cleandoc(text).partition("\f")[0].split("\n\n")
    return "\n\n".join(p if p.startswith("\b") else " ".join(p.split()) for p in paragraphs)


def _flow_help(typer_app: typer.Typer) -> None:
    """Every command's help under ``typer_app`` (its docstring, where no help was given) and every
    group's, :func:`flowing`."""
    for command in typer_app.registered_commands:
        text = command.help if command.help is not None else inspect.getdoc(command.callback)
        if text:
            command.help = flowing(text)
    for group in typer_app.registered_groups:
        if isinstance(group.help, str):  # else typer's placeholder: the group's own help, below
            group.help = flowing(group.help)
        if group.typer_instance is not None:
            info = group.typer_instance.info
            if isinstance(info.help, str):
                info.help = flowing(info.help)
            _flow_help(group.typer_instance)


_flow_help(app)

if __name__ == "__main__":
    from troupe.cli.closed_output import run_app
    from troupe.cli.stop_signals import keep_ignored_signals

    keep_ignored_signals()  # as the console script's entry does
    run_app(app)
