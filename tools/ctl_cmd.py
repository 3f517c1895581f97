"""``troupe ctl``: control messages to a running node (and, through it, the cluster)."""

from __future__ import annotations

import json
import time
from typing import Annotated, Any

import typer
from rich.console import Console

from troupe.runtime.config import DEFAULT_NODE_ENDPOINT

from .client import control, run_async
from .tables import status_tables

__all__ = ["NodeOption", "ctl_app"]

ctl_app = typer.Typer(no_args_is_help=True)
console = Console()

NodeOption = Annotated[
    str, typer.Option("--node", envvar="TROUPE_NODE", help="Endpoint of the node to talk to.")
]
JsonOption = Annotated[bool, typer.Option("--json", help="Print one JSON object instead of tables.")]
TimeoutOption = Annotated[float, typer.Option("--timeout", help="Seconds to wait for the reply.")]


@ctl_app.command("ping")
def ping(node: NodeOption = DEFAULT_NODE_ENDPOINT, timeout: TimeoutOption = 5.0) -> None:
    """Check that a node answers, and how fast."""
    start = time.perf_counter()
    reply: dict[str, Any] = run_async(control, node, "ping", None, timeout)
    ms = (time.perf_counter() - start) * 1000
    console.print(f"node [bold]{reply['node']}[/] (pid {reply['pid']}) answered in {ms:.1f} ms")


@ctl_app.command("status")
def status(node: NodeOption = DEFAULT_NODE_ENDPOINT, as_json: JsonOption = False, timeout: TimeoutOption = 5.0) -> None:
    """Show the node, its workers and their actors."""
    reply = run_async(control, node, "status", None, timeout)
    if as_json:
        typer.echo(json.dumps(reply, indent=2, default=str))
        return
    for table in status_tables(reply):
        console.print(table)
