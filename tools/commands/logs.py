"""``troupe logs tail``: follow the JSON-lines logs of every node under a logs directory.

The history (``-n``) is the last lines of all the files together, interleaved by their
``timestamp`` as one log would be; following then prints new lines as they arrive, each poll's
batch in timestamp order. A line that is not JSON (or has no timestamp) keeps its place after
the line before it in its file. SIGINT and SIGTERM stop at once, with exit status 130 and 143.
"""

from __future__ import annotations

import json
import signal
import time
from collections import deque
from collections.abc import Iterator
from pathlib import Path
from types import FrameType
from typing import IO, Annotated

import typer

__all__ = ["format_line", "logs_app"]

logs_app = typer.Typer(no_args_is_help=True)

_KEYS_FIRST = ("timestamp", "level", "node", "process", "actor", "event")
_POLL_S = 0.2


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


def _timestamp(line: str) -> str | None:
    if not line.startswith("{"):
        return None
    try:
        rec = json.loads(line)
    except ValueError:
        return None
    stamp = rec.get("timestamp") if isinstance(rec, dict) else None
    return stamp if isinstance(stamp, str) else None


class _Source:
    """One log file being read; keeps a partly written last line until its newline arrives."""

    def __init__(self, path: Path) -> None:
        self.file: IO[str] = path.open(encoding="utf-8", errors="replace")
        self._partial = ""
        self._last_stamp = ""

    def stamped(self, line: str) -> tuple[str, str]:
        """``(timestamp, line)``; an unstamped line takes the stamp of the line before it."""
        stamp = _timestamp(line)
        if stamp is not None:
            self._last_stamp = stamp
        return self._last_stamp, line

    def last(self, n: int) -> list[tuple[str, str]]:
        """The last ``n`` complete lines now in the file, stamped; reading stops at the end."""
        if n == 0:
            self.file.seek(0, 2)
            return []
        tail: deque[tuple[str, str]] = deque(maxlen=n)
        for line in self.new_lines():
            tail.append(self.stamped(line))
        return list(tail)

    def new_lines(self) -> Iterator[str]:
        """Complete lines written since the last call."""
        for chunk in iter(self.file.readline, ""):
            if not chunk.endswith("\n"):
                self._partial += chunk
                return
            yield self._partial + chunk
            self._partial = ""

    def close(self) -> None:
        self.file.close()


class _Stopped(Exception):
    """A stop signal arrived: leave with ``code``."""

    def __init__(self, code: int) -> None:
        super().__init__(code)
        self.code = code


def _stop(signum: int, _: FrameType | None) -> None:
    raise _Stopped(128 + signum)


@logs_app.command("tail")
def tail(
    log_dir: Annotated[Path, typer.Option("--logs", help="The nodes' logs directory.")] = Path("logs"),
    follow: Annotated[
        bool, typer.Option("--follow/--no-follow", "-f", help="Keep waiting for new lines.")
    ] = True,
    lines: Annotated[
        int, typer.Option("-n", help="Lines of history to show first, from all files, in time order.")
    ] = 20,
    raw: Annotated[bool, typer.Option("--raw", help="Print the JSON lines unchanged.")] = False,
) -> None:
    """Show the last lines of every node's log, then follow them all (Ctrl-C to stop)."""
    if lines < 0:
        raise typer.BadParameter(f"{lines} is negative; give 0 or more lines", param_hint="'-n'")
    if not log_dir.is_dir():
        raise typer.BadParameter(
            f"{log_dir} is not a directory; pass the node's --logs directory", param_hint="'--logs'"
        )
    show = (lambda s: s.rstrip("\n")) if raw else format_line
    sources: dict[Path, _Source] = {}
    previous = {s: signal.signal(s, _stop) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        for path in sorted(log_dir.glob("*.jsonl")):
            sources[path] = _Source(path)
        # A stable sort, not a merge: lines of one file written by several processes may be
        # a little out of time order themselves.
        history = sorted((sl for src in sources.values() for sl in src.last(lines)), key=lambda sl: sl[0])
        for _, line in history[len(history) - lines :]:
            typer.echo(show(line))
        while follow:
            for path in log_dir.glob("*.jsonl"):
                if path not in sources:
                    sources[path] = _Source(path)  # a node that started since: from its start
            batch = [src.stamped(line) for src in sources.values() for line in src.new_lines()]
            batch.sort(key=lambda sl: sl[0])
            for _, line in batch:
                typer.echo(show(line))
            if not batch:
                time.sleep(_POLL_S)
    except _Stopped as stopped:
        raise typer.Exit(stopped.code) from None
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        for src in sources.values():
            src.close()
