"""``troupe logs tail``: follow the logs of every node, live through the master or from the files.

With ``--master`` (or ``TROUPE_MASTER``) it follows the log stream of every node of the cluster
and the master's own (:mod:`troupe.cli.log_stream`): the history (``-n``) is the last lines they
keep in memory (taken from each in turns), then new lines arrive as they log them, interleaved
by timestamp (each host's own clock), a node or
master that restarts, or a node that joins, is picked up. The stream drops lines a reader cannot
keep up with; the files are the complete record.

Without it (or with ``--logs``) it reads the files under a logs directory, which is also how the
logs of a stopped cluster are read: the history is the last lines of all the files together,
rotated ones included (``<node>.jsonl.1`` ...), taken from the files in turns so that every node
is in it (a timestamp is its host's own clock: the newest lines overall were all of the host
whose clock is ahead), interleaved by their ``timestamp`` as one log would be; following then
prints new lines as they arrive, each poll's batch in timestamp order, across rotations. A line
that is not JSON (or has no timestamp) keeps its place after the line before it in its file.

Filters (``--node``, ``--actor``, ``--task``, ``--level``, see :mod:`troupe.cli.log_filters`)
apply in both modes; ``--json`` prints the lines unchanged. SIGINT, SIGTERM and SIGHUP stop at
once, quietly (a reader has nothing to stop gracefully), with exit status 130, 143 and 129.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path
from types import FrameType
from typing import Annotated

import typer
from rich.console import Console

from troupe.cli.client import endpoint_option, fail, run_async
from troupe.cli.log_filters import LogFilter, format_line, parse_record, readable
from troupe.cli.log_stream import ClusterLogs, latest_in_turns
from troupe.cli.master_client import unreachable_why
from troupe.cli.stop_signals import heeded_signals
from troupe.runtime.log_files import history_files, last_lines
from troupe.runtime.log_follower import FileFollower

from .keys_option import KeysOption, use_group_keys, use_keys

__all__ = ["format_line", "logs_app"]

logs_app = typer.Typer(no_args_is_help=True)


_POLL_S = 0.2
_out = Console(soft_wrap=True, highlight=False, markup=False, emoji=False)
_err = Console(stderr=True, soft_wrap=True, highlight=False, markup=False, emoji=False)


@logs_app.callback()
def _logs(ctx: typer.Context, keys: KeysOption = None) -> None:
    """Follow the structured logs of the nodes."""
    use_group_keys(ctx, keys)  # `troupe logs --keys DIR tail`, as `troupe ctl --keys DIR status`


class _Printer:
    """Prints lines raw (``--json``) or readable; never reads log text as markup."""

    def __init__(self, raw: bool) -> None:
        self.raw = raw

    def __call__(self, line: str) -> None:
        if self.raw:
            sys.stdout.write(line.rstrip("\n") + "\n")
            sys.stdout.flush()
        else:
            _out.print(readable(line.rstrip("\n")))


def _warn(message: str) -> None:
    _err.print(f"note: {message}")


def _node_of(path: Path) -> str:
    """The node a log file belongs to (``n1.jsonl``, ``n1.jsonl.3`` -> ``n1``)."""
    return path.name.split(".jsonl", 1)[0]


class _Source:
    """One node's log file being followed, with the stamp of its last stamped line."""

    def __init__(self, path: Path, at_end: bool) -> None:
        self.path = path
        self.node = _node_of(path)
        self.follower = FileFollower(path, at_end=at_end)
        self._last_stamp = ""

    def stamped(self, line: str) -> tuple[str, str]:
        """``(timestamp, line)``; an unstamped line takes the stamp of the line before it."""
        rec = parse_record(line)
        stamp = rec.get("timestamp") if rec is not None else None
        if isinstance(stamp, str):
            self._last_stamp = stamp
        return self._last_stamp, line

    def new_lines(self) -> list[str]:
        """Complete lines written since the last call (all that is there, however much)."""
        out = [b.decode("utf-8", "replace") for b in self.follower.read_lines()]
        while self.follower.behind:
            out.extend(b.decode("utf-8", "replace") for b in self.follower.read_lines())
        problem = self.follower.new_problem()
        if problem is not None:  # a directory in its place, say: the other files are followed on
            _warn(f"{problem}; skipped until it can be read")
        gap = self.follower.new_gap()
        if gap is not None:  # rotated files it could not read: the files on disk say what they hold
            _warn(gap)
        return out


class _Stopped(Exception):
    """A stop signal arrived: leave with ``code``."""

    def __init__(self, code: int) -> None:
        super().__init__(code)
        self.code = code


def _stop(signum: int, _: FrameType | None) -> None:
    raise _Stopped(128 + signum)


def _file_history(src: _Source, lines: int, keep: LogFilter) -> list[tuple[str, str]]:
    """The last ``lines`` lines of ``src`` that ``keep`` accepts, stamped; the rotated files are
    read, newest first, only when the live one holds too few."""
    if lines == 0:
        return []
    current = [ln for ln in src.new_lines() if keep.accepts(ln, src.node)]
    older: list[str] = []
    if len(current) < lines:

        def accepted(raw: bytes) -> bool:
            return keep.accepts(raw.decode("utf-8", "replace"), src.node)

        rotated = [p for p in history_files(src.path) if p != src.path]
        older = [b.decode("utf-8", "replace") for b in last_lines(rotated, lines - len(current), accepted)]
    return [src.stamped(ln) for ln in [*older, *current][-lines:]]


def _tail_files(log_dir: Path, follow: bool, lines: int, keep: LogFilter, show: _Printer) -> None:
    sources: dict[Path, _Source] = {}
    previous = {s: signal.signal(s, _stop) for s in heeded_signals()}
    try:
        history: list[list[tuple[str, str]]] = []
        for path in sorted(log_dir.glob("*.jsonl")):
            src = sources[path] = _Source(path, at_end=lines == 0)
            history.append(_file_history(src, lines, keep))
        for line in latest_in_turns(history, lines):
            show(line)
        while follow:
            for path in log_dir.glob("*.jsonl"):
                if path not in sources:
                    sources[path] = _Source(path, at_end=False)  # a node that started since
            batch = [
                src.stamped(line)
                for src in sources.values()
                for line in src.new_lines()
                if keep.accepts(line, src.node)
            ]
            batch.sort(key=lambda sl: sl[0])
            for _, line in batch:
                show(line)
            if not batch:
                time.sleep(_POLL_S)
    except _Stopped as stopped:
        raise typer.Exit(stopped.code) from None
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        for src in sources.values():
            src.follower.close()


@logs_app.command("tail")
def tail(
    master: Annotated[
        str | None,
        typer.Option(
            "--master",
            envvar="TROUPE_MASTER",
            help="Follow every node of the cluster, and the master, live through this master.",
            show_default=False,
            callback=endpoint_option,
        ),
    ] = None,
    log_dir: Annotated[
        Path | None,
        typer.Option(
            "--logs", help="Read the nodes' log files under this directory instead (default: logs)."
        ),
    ] = None,
    node: Annotated[
        list[str] | None, typer.Option("--node", help="Only these nodes (repeat or comma-separate).")
    ] = None,
    actor: Annotated[
        list[str] | None,
        typer.Option("--actor", help="Only these actors: a name, or a prefix ending in * (repeatable)."),
    ] = None,
    task: Annotated[
        list[str] | None, typer.Option("--task", help="Only these task ids (repeatable).")
    ] = None,
    level: Annotated[
        str, typer.Option("--level", help="Only this level and above: debug, info, warning, error, critical.")
    ] = "",
    as_json: Annotated[bool, typer.Option("--json", "--raw", help="Print the JSON lines unchanged.")] = False,
    follow: Annotated[
        bool, typer.Option("--follow/--no-follow", "-f", help="Keep waiting for new lines.")
    ] = True,
    lines: Annotated[
        int,
        typer.Option(
            "-n",
            help="Lines of history to show first, from all nodes (taken in turns), in time order.",
        ),
    ] = 20,
    keys: KeysOption = None,
) -> None:
    """Show the last lines of every node's log, then follow them all (Ctrl-C to stop)."""
    # Refusals are one line, exit 2, as everywhere else (typer's were a boxed usage message).
    if lines < 0:
        raise fail(f"-n: {lines} is negative; give 0 or more lines", 2)
    try:
        keep = LogFilter.from_options(node or (), actor or (), task or (), level)
    except ValueError as exc:
        raise fail(str(exc), 2) from None
    show = _Printer(as_json)
    if master and log_dir is not None and master != os.environ.get("TROUPE_MASTER"):
        raise fail(f"--master {master} follows the cluster live, --logs {log_dir} reads files: give one", 2)
    if master and log_dir is None:
        use_keys(keys)  # a reader key is enough: the stream and log_recent only read
        _tail_cluster(master, follow, lines, keep, show)
        return
    log_dir = log_dir if log_dir is not None else Path("logs")
    where = "pass the node's --logs directory (a `troupe run`'s is OUT/logs)"
    if log_dir.exists() and not log_dir.is_dir():
        raise fail(f"--logs: {log_dir} is not a directory; {where}", 2)
    if not log_dir.exists():  # a tail started beside the node that makes it: wait, as for no log
        if not follow:
            raise fail(f"--logs: {log_dir} does not exist; {where}", 2)
        _warn(f"{log_dir} does not exist (yet); waiting for a node to write its log there")
    elif not any(log_dir.glob("*.jsonl")):  # a wrong folder said nothing at all, and exited 0
        _warn(f"no node's log (*.jsonl) in {log_dir}" + ("; waiting for one" if follow else ""))
    _tail_files(log_dir, follow, lines, keep, show)


def _tail_cluster(master: str, follow: bool, lines: int, keep: LogFilter, show: _Printer) -> None:
    if (absent := unreachable_why(master, "master")) is not None:
        raise fail(f"{absent}; pass --master ENDPOINT or --logs DIR")
    stream = ClusterLogs(master, keep.nodes, lambda line, n: keep.accepts(line, n), lines, _warn)

    async def main() -> None:
        await stream.run(lambda _, line: show(line), follow)

    run_async(main, reader=True)  # a stop signal ends it quietly: it has nothing to stop
