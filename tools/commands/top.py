"""``troupe ctl top``: a live terminal view of the cluster (nodes, workers, stages and queues),
refreshing in place.

Built from the ``status`` replies of a node and of the master, asked together every
``--interval`` seconds; rates (messages handled per second, tasks done per second) are the
difference between two looks. A look that fails (a node restarting) shows as a line in the
frame, and the next look tries again. With a stdout that is not a terminal, or with ``--once``,
it prints one frame and exits 0, so it can be scripted; when neither the node nor the master
answers the first look, it says so in one line and exits 1. Ctrl-C, SIGTERM or SIGHUP end it at
once, quietly (exit 130 / 143 / 129), the terminal restored.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from typing import Annotated, Any

import anyio
import typer
from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.text import Text

from troupe.cli.client import endpoint_option, fail, node_status, run_async, seconds_option
from troupe.cli.fitted_table import Column, FittedTable
from troupe.cli.literal import literal
from troupe.cli.master_client import absent_master, live_figures, master_status, reachable
from troupe.cli.reply_shape import SHAPE_ERRORS, shaped_as
from troupe.cli.tables import pipeline_view
from troupe.runtime.errors import TroupeError
from troupe.runtime.node.config import DEFAULT_NODE_ENDPOINT
from troupe.runtime.tasks.master.master_config import DEFAULT_MASTER_ENDPOINT

from .keys_option import KeysOption, use_keys

__all__ = ["Look", "frame", "top"]

_PIPED_WIDTH = 160
_MAILBOX_ROWS = 12  # the deepest mailboxes; `ctl status --json` has them all


@dataclass
class Look:
    """One look at the cluster: the replies that came, and why the others did not."""

    at: float
    node: dict[str, Any] | None = None
    master: dict[str, Any] | None = None
    errors: dict[str, str] = field(default_factory=dict)


async def look(node: str, master: str, timeout: float) -> Look:
    """Ask the node and the master for their status, together."""
    seen = Look(time.monotonic())

    async def ask(key: str, endpoint: str) -> None:
        call = node_status if key == "node" else master_status
        try:
            reply = await call(endpoint, timeout)
        except TroupeError as exc:
            seen.errors[key] = str(exc)
            return
        setattr(seen, key, reply)

    async with anyio.create_task_group() as tg:
        tg.start_soon(ask, "node", node)
        if reachable(master):
            tg.start_soon(ask, "master", master)
        elif (absent := absent_master(master)) is not None:
            seen.errors["master"] = absent
    return seen


def top(
    node: Annotated[
        str,
        typer.Option(
            "--node", envvar="TROUPE_NODE", help="Endpoint of the node to watch.", callback=endpoint_option
        ),
    ] = DEFAULT_NODE_ENDPOINT,
    master: Annotated[
        str,
        typer.Option(
            "--master",
            envvar="TROUPE_MASTER",
            help="Endpoint of the master to watch.",
            callback=endpoint_option,
        ),
    ] = DEFAULT_MASTER_ENDPOINT,
    interval: Annotated[
        float, typer.Option("--interval", help="Seconds between refreshes.", callback=seconds_option)
    ] = 2.0,
    once: Annotated[bool, typer.Option("--once", help="Print one frame and exit (as when piped).")] = False,
    timeout: Annotated[
        float, typer.Option("--timeout", help="Seconds to wait for each reply.", callback=seconds_option)
    ] = 5.0,
    keys: KeysOption = None,
) -> None:
    """A live view of nodes, workers, stages and queues, refreshing in place until Ctrl-C."""
    use_keys(keys)
    console = Console()
    if not console.is_terminal and "COLUMNS" not in os.environ:  # piped: no terminal to fit
        console = Console(width=_PIPED_WIDTH)
    # A stop signal ends it quietly: a view has nothing to stop gracefully.
    run_async(_watch, console, node, master, interval, timeout, once or not console.is_terminal, reader=True)


async def _watch(
    console: Console, node: str, master: str, interval: float, timeout: float, once: bool
) -> None:
    first = await look(node, master, timeout)
    if first.node is None and first.master is None:
        raise fail(first.errors.get("node") or f"no node answers at {node}")
    if once:
        console.print(_shaped_frame(first, None, node, master, None))  # one frame: no "every", no Ctrl-C
        return
    first_frame = _shaped_frame(first, None, node, master, interval)
    with Live(first_frame, console=console, auto_refresh=False) as view:
        before = first
        while True:
            await anyio.sleep(interval)
            now = await look(node, master, timeout)
            view.update(_shaped_frame(now, before, node, master, interval), refresh=True)
            before = now


def _shaped_frame(
    now: Look, before: Look | None, node: str, master: str, interval: float | None
) -> RenderableType:
    """``frame``, or one line and exit 1 where a reply has a shape the view does not know: the
    master's, where the frame of the node's alone builds, else the node's (``reply_shape.py``)."""
    try:
        return frame(now, before, node, master, interval)
    except SHAPE_ERRORS:
        pass
    with shaped_as(node, "node"):
        frame(Look(now.at, node=now.node), None, node, master, interval)
    with shaped_as(master, "master"):
        return frame(now, before, node, master, interval)


def frame(now: Look, before: Look | None, node: str, master: str, interval: float | None) -> RenderableType:
    """The view of one look; rates against ``before`` (none on the first frame). ``interval``:
    how often the view is redrawn, None for a single frame."""
    parts: list[RenderableType] = [_header(now, node, master, interval)]
    for key, endpoint in (("node", node), ("master", master)):
        if key in now.errors:
            parts.append(Text(f"{key} {endpoint}: {now.errors[key]}", style="yellow"))
    parts.append(_nodes(now))
    if now.node is not None:
        parts.append(_workers(now, before))
        if isinstance(now.node.get("pipeline"), dict):
            parts.append(pipeline_view(now.node["pipeline"]))
    queues = _queues(now)
    if queues.row_count:
        parts.append(queues)
    return Group(*parts)


def _header(now: Look, node: str, master: str, interval: float | None) -> Text:
    who = []
    if now.node is not None:
        who.append(f"node {now.node.get('node', '?')} at {node}")
    if now.master is not None:
        who.append(f"master {now.master.get('master', '?')} at {master}")
    clock = time.strftime("%H:%M:%S")
    redrawn = f"  (every {interval:g} s; Ctrl-C to quit)" if interval is not None else ""
    return Text(f"troupe top  {clock}  {' · '.join(who)}{redrawn}", style="bold")


# Each table's columns: on a narrow terminal the columns that matter least give way and names
# wrap, step by step (lowest first); a figure is never cut (fitted_table.py).
_NODE_COLUMNS = (
    Column("node", text=True, wraps=3),
    Column("alive"),
    Column("task workers", gives_way=5),
    Column("uptime", gives_way=4),
    Column("rss MiB", gives_way=2),
    Column("load", gives_way=3),
    Column("mem free MiB", gives_way=1),
    Column("last beat", gives_way=6),
)
_WORKER_COLUMNS = (
    Column("worker", text=True, wraps=4),
    Column("kind", text=True, gives_way=1),
    Column("state"),
    Column("pid", gives_way=6),
    Column("rss MiB", gives_way=2),
    Column("restarts", gives_way=7),
    Column("handled", gives_way=5),
    Column("msg/s", gives_way=3, justify="right"),
    Column("mailbox"),
    Column("busy", gives_way=8),
)
_QUEUE_COLUMNS = (
    Column("queue", text=True, wraps=2),
    Column("waiting"),
    Column("bound / total"),
    Column("in work", gives_way=1),
)


def _nodes(now: Look) -> FittedTable:
    table = FittedTable("nodes", _NODE_COLUMNS)
    mine = now.node or {}
    listed = set()
    for n in (now.master or {}).get("nodes", ()):
        here, live = n.get("node") == mine.get("node"), live_figures(n)
        listed.add(n.get("node"))
        table.add_row(
            literal(n.get("node")),
            "yes" if n.get("alive") else "[red]dead[/]",
            literal(n.get("workers", "-")),
            f"{mine['uptime_s']:.0f} s" if here and "uptime_s" in mine else "-",
            literal(mine.get("rss_mib", "-")) if here else "-",
            literal(live.get("load1", "-")),
            literal(live.get("mem_available_mib", "-")),
            f"{n.get('last_beat_age_s', 0):.1f} s ago",
        )
    if mine and mine.get("node") not in listed:  # no master, or this node has not joined it
        table.add_row(
            literal(mine.get("node")),
            "yes",
            "-",
            f"{mine.get('uptime_s', 0):.0f} s",
            literal(mine.get("rss_mib", "-")),
            "-",
            "-",
            "-",
        )
    return table


def _handled(look: Look | None) -> dict[str, int]:
    """Messages handled so far, per worker (summed over its actors)."""
    out: dict[str, int] = {}
    for w in ((look.node if look else None) or {}).get("workers", ()):
        actors = (w.get("runtime") or {}).get("actors") or {}
        out[str(w.get("name"))] = sum(int(a.get("handled", 0)) for a in actors.values())
    return out


def _workers(now: Look, before: Look | None) -> FittedTable:
    assert now.node is not None
    table = FittedTable("workers", _WORKER_COLUMNS)
    was, is_ = _handled(before), _handled(now)
    span = now.at - before.at if before is not None else 0.0
    for w in now.node.get("workers", ()):
        name = str(w.get("name"))
        runtime = w.get("runtime") or {}
        actors = runtime.get("actors") or {}
        state = str(w.get("state"))
        colour = {"running": "green", "failed": "red", "exited": "yellow"}.get(state)
        rate = "-"
        if name in was and name in is_ and span > 0 and is_[name] >= was[name]:
            rate = f"{(is_[name] - was[name]) / span:.1f}"
        depth = sum(int(a.get("mailbox_depth", 0)) for a in actors.values())
        capacity = sum(int(a.get("mailbox_capacity", 0)) for a in actors.values())
        table.add_row(
            literal(name),
            literal(w.get("kind")),
            literal(state, colour or ""),
            literal(w.get("pid") or "-"),
            literal(w.get("rss_mib", "-")),
            literal(w.get("restarts", 0)),
            literal(is_.get(name, "-"))
            if actors
            else ("[yellow]no answer[/]" if runtime.get("error") else "-"),
            rate,
            f"{depth}/{capacity}" if actors else "-",
            "yes" if any(a.get("busy") for a in actors.values()) else "no",
        )
    return table


def _queues(now: Look) -> FittedTable:
    """The deepest actor mailboxes, and the master's task queue per job."""
    table = FittedTable("queues", _QUEUE_COLUMNS)
    boxes = []
    for w in (now.node or {}).get("workers", ()):
        for actor, a in ((w.get("runtime") or {}).get("actors") or {}).items():
            boxes.append((int(a.get("mailbox_depth", 0)), str(w.get("name")), str(actor), a))
    for depth, worker, actor, a in sorted(boxes, key=lambda b: (-b[0], b[1], b[2]))[:_MAILBOX_ROWS]:
        table.add_row(
            literal(f"mailbox {worker}/{actor}"),
            literal(depth),
            literal(a.get("mailbox_capacity", "-")),
            "yes" if a.get("busy") else "no",
        )
    for job in (now.master or {}).get("jobs", ()):
        if job.get("state") != "running":
            continue
        counts = job.get("counts") or {}
        table.add_row(
            literal(f"tasks of job {job.get('job_id')}"),
            literal(counts.get("pending", 0)),
            literal(f"{counts.get('done', 0)}/{job.get('total', '?')} done"),
            literal(counts.get("leased", 0)),
        )
    return table
