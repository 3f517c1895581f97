"""``troupe bench``: measurements that print each figure beside its ceiling."""

from __future__ import annotations

import json
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from .bench_messaging import measure_messaging

__all__ = ["bench_app"]

bench_app = typer.Typer(no_args_is_help=True)
console = Console(stderr=True)

JsonOption = Annotated[bool, typer.Option("--json", help="Print one JSON object with every figure.")]
QuickOption = Annotated[bool, typer.Option("--quick", help="A fifth of the messages: faster, noisier.")]


@bench_app.command("messaging")
def messaging(as_json: JsonOption = False, quick: QuickOption = False) -> None:
    """Tell and ask throughput, startup time and idle memory, against raw pyzmq."""
    fig = measure_messaging(quick, progress=lambda m: console.print(f"[dim]measuring {m}...[/]"))
    if as_json:
        typer.echo(json.dumps(fig, indent=2))
        return
    table = Table(title="troupe messaging vs raw pyzmq (same run)")
    for col in ("figure", "raw ceiling", "troupe 2 processes", "ratio", "troupe 1 process", "ratio"):
        table.add_column(col, justify="right")
    names = {"tell_small": "tell 100 B msgs/s", "tell_large": "tell 1 MiB msgs/s",
             "ask1": "ask, 1 outstanding, rt/s", "ask64": "ask, 64 outstanding, rt/s"}
    for key, label in names.items():
        table.add_row(label, f"{fig[f'raw_{key}_per_s']:,.0f}", f"{fig[f'troupe_{key}_per_s']:,.0f}",
                      f"{fig[f'{key}_ratio']:.2f}", f"{fig[f'troupe_local_{key}_per_s']:,.0f}",
                      f"{fig[f'local_{key}_ratio']:.2f}")
    Console().print(table)
    Console().print(f"startup (node start -> first ask answered): {fig['startup_s']:.2f} s; "
                    f"idle RSS of {fig['idle_processes']:.0f} processes: {fig['idle_rss_mib']:.0f} MiB")
