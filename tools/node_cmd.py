"""``troupe node start``: run this host's node in the foreground."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from troupe.runtime.config import load_node_config
from troupe.runtime.logs import configure_logging
from troupe.runtime.node import Node

from .client import run_async

__all__ = ["node_app"]

node_app = typer.Typer(no_args_is_help=True)


@node_app.command("start")
def start(
    config: Annotated[Optional[Path], typer.Option("--config", "-c", help="Node TOML file.")] = None,
    name: Annotated[Optional[str], typer.Option(help="Node name (default: host name).")] = None,
    endpoint: Annotated[Optional[str], typer.Option(help="Control endpoint, loopback only.")] = None,
    log_dir: Annotated[Optional[Path], typer.Option("--logs", help="Directory of the JSON-lines logs.")] = None,
    log_level: Annotated[Optional[str], typer.Option(help="debug, info, warning or error.")] = None,
) -> None:
    """Start a node: spawn the configured workers and answer control messages until SIGTERM."""

    async def main() -> None:
        cfg = load_node_config(config, name=name, endpoint=endpoint, log_dir=log_dir, log_level=log_level)
        configure_logging(cfg.name, "node", cfg.log_dir, console=True, level=cfg.log_level)
        await Node(cfg).run()

    run_async(main)
