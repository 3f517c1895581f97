"""``troupe node start``: run this host's node in the foreground."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from troupe.cli.client import run_async
from troupe.cli.preflight import check_node_start
from troupe.runtime.logs import configure_logging
from troupe.runtime.node.config import load_node_config
from troupe.runtime.node.node import Node
from troupe.runtime.tasks.master.master import Master, MasterConfig

from .master import DEFAULT_JOURNAL, load_journal, run_node_with_master

__all__ = ["node_app"]

node_app = typer.Typer(no_args_is_help=True)


@node_app.command("start")
def start(
    config: Annotated[Path | None, typer.Option("--config", "-c", help="Node TOML file.")] = None,
    name: Annotated[str | None, typer.Option(help="Node name (default: host name).")] = None,
    endpoint: Annotated[str | None, typer.Option(help="Control endpoint, loopback only.")] = None,
    log_dir: Annotated[Path | None, typer.Option("--logs", help="Directory of the JSON-lines logs.")] = None,
    log_level: Annotated[str | None, typer.Option(help="debug, info, warning or error.")] = None,
    master: Annotated[str | None, typer.Option(help="Join the master at this endpoint.")] = None,
    with_master: Annotated[
        bool, typer.Option("--with-master", help="Run the master in this node's process too.")
    ] = False,
    journal: Annotated[
        Path, typer.Option(help="With --with-master: the master's journal.")
    ] = DEFAULT_JOURNAL,
    new: Annotated[
        bool, typer.Option("--new", help="With --with-master: create the journal if missing.")
    ] = False,
) -> None:
    """Start a node: spawn the configured workers and answer control messages until SIGTERM."""
    master = check_node_start(
        config, with_master, name=name, endpoint=endpoint, log_dir=log_dir, log_level=log_level, master=master
    )  # exits 2 on bad input

    async def main() -> None:
        cfg = load_node_config(
            config, name=name, endpoint=endpoint, log_dir=log_dir, log_level=log_level, master=master
        )
        configure_logging(cfg.name, "node", cfg.log_dir, console=True, level=cfg.log_level)
        if not with_master:
            await Node(cfg, handle_signals=False).run()
            return
        assert cfg.master is not None
        opened, book = load_journal(journal, new)  # task dispatch: the master lives here too
        try:
            await run_node_with_master(
                Node(cfg, handle_signals=False), Master(MasterConfig(cfg.master), opened, book)
            )
        finally:
            opened.close()

    run_async(main)
