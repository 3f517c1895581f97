"""``troupe logs tail``: follow the JSON-lines logs of every node under a logs directory."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import IO, Annotated

import typer

__all__ = ["format_line", "logs_app"]

logs_app = typer.Typer(no_args_is_help=True)

_KEYS_FIRST = ("timestamp", "level", "node", "process", "actor", "event")


def format_line(line: str) -> str:
    """Render one JSON log line compactly; a line that is not JSON is shown as it is."""
    try:
        rec = json.loads(line)
    except ValueError:
        return line.rstrip("\n")
    if not isinstance(rec, dict):
        return line.rstrip("\n")
    head = " ".join(str(rec.pop(k)) for k in _KEYS_FIRST if k in rec)
    rest = " ".join(f"{k}={v}" for k, v in rec.items())
    return f"{head} {rest}".rstrip()


@logs_app.command("tail")
def tail(
    log_dir: Annotated[Path, typer.Option("--logs", help="The nodes' logs directory.")] = Path("logs"),
    follow: Annotated[bool, typer.Option("--follow/--no-follow", "-f", help="Keep waiting for new lines.")] = True,
    lines: Annotated[int, typer.Option("-n", help="Lines of history to show per file first.")] = 20,
    raw: Annotated[bool, typer.Option("--raw", help="Print the JSON lines unchanged.")] = False,
) -> None:
    """Show the last lines of every node's log, then follow them all (Ctrl-C to stop)."""
    if not log_dir.is_dir():
        raise typer.BadParameter(f"{log_dir} is not a directory; pass the node's --logs directory")
    handles: dict[Path, IO[str]] = {}
    show = (lambda s: s.rstrip("\n")) if raw else format_line
    try:
        for path in sorted(log_dir.glob("*.jsonl")):
            f = path.open(encoding="utf-8", errors="replace")
            for line in f.readlines()[-lines:]:
                typer.echo(show(line))
            handles[path] = f
        while follow:
            for path in log_dir.glob("*.jsonl"):
                if path not in handles:
                    handles[path] = path.open(encoding="utf-8", errors="replace")
            quiet = True
            for f in handles.values():
                for line in iter(f.readline, ""):
                    quiet = False
                    typer.echo(show(line))
            if quiet:
                time.sleep(0.2)
    except KeyboardInterrupt:
        pass
    finally:
        for f in handles.values():
            f.close()
