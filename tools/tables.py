"""Rich tables for status replies."""

from __future__ import annotations

from collections import Counter
from typing import Any

from rich.console import Console, RenderableType
from rich.measure import Measurement
from rich.table import Table
from rich.text import Text

from .fitted_table import Column, FittedTable
from .literal import literal, markup
from .trainer_table import trainer_table

__all__ = [
    "pipeline_table",
    "pipeline_view",
    "print_whole",
    "security_cell",
    "status_tables",
    "supervisor_cell",
]

_PROCESS_GONE = ("stopped", "exited", "failed")  # a worker's states with no process running


def print_whole(console: Console, table: RenderableType, unwrapped: bool = False) -> None:
    """Print ``table`` at least as wide as its narrowest rendering without cut cells (with
    ``unwrapped``, as wide as it is with no cell wrapped: a table of figures, whose headers
    rich would still shorten at the narrowest).

    At the console's width (80 columns when the output is a pipe), rich shortens cells with an
    ellipsis: a job id ``indoor-nav`` became ``indoo…``, which ``troupe ctl cancel`` cannot
    take. Wider than the terminal, the lines wrap there, and a pipe gets them whole.
    """
    measured = Measurement.get(console, console.options.update_width(10_000), table)
    needed = measured.maximum if unwrapped else _uncut_width(console, table, measured)
    width = console.width
    if needed <= width:
        console.print(table)
        return
    console.width = needed
    try:
        console.print(table)
    finally:
        console.width = width


def security_cell(security: dict[str, Any]) -> str | Text:
    """A status reply's ``security`` section as one cell: CURVE, insecure (loud), or loopback."""
    # Each refused connection attempt counts (a peer retries), so not a count of peers.
    refused = f"refused connections: {security.get('refused_peers', 0)}"
    if security.get("curve"):
        return markup("CURVE, as ", literal(security.get("user")), f"; {refused}")
    if security.get("insecure"):
        return "[bold red]insecure: true[/] (listening without keys; --insecure)"
    return "no keys (loopback only)"


def supervisor_cell(supervision: dict[str, Any]) -> str | Text:
    """The node's supervisor in a few words: off, failed, starting, or its pid, how it started
    (forked from the template or spawned) and how many times (more than once: it was restarted)."""
    if supervision.get("enabled") is False:
        return literal("off ([supervision] enabled = false): hung workers are not detected")
    if supervision.get("supervisor_failed"):
        return "[bold red]failed[/]: restarted too often; hung workers are not detected"
    pid = supervision.get("supervisor_pid")
    if pid is None:
        return "starting"
    how = supervision.get("supervisor_start")
    starts = supervision.get("supervisor_starts", 1)
    cell = f"pid {pid}" + (f", {how}ed" if how in ("fork", "spawn") else "")
    if isinstance(starts, int) and starts > 1:
        cell += f", started {starts} times"
    if not supervision.get("supervisor"):
        cell += " (no answer)"
    return literal(cell)  # the pid is the peer's word: text, not markup


def _with_tasks(messages: int, tasks: int | None) -> Text:
    """A count of messages, and of tasks for a task actor (which handles few messages)."""
    return literal(messages if tasks is None else f"{messages} + {tasks} tasks")


def status_tables(status: dict[str, Any]) -> list[Table]:
    """Render a node status reply as tables: the node, its workers, their actors; and the
    training ranks it hosts, and the pipeline a `troupe run` drives beside it, where there are."""
    whose = f", user {status['user']}" if "user" in status else ""  # an older node's has none
    node = Table(title=literal(f"node {status['node']}{whose}"), show_header=False)
    node.add_row("endpoint", literal(status["endpoint"]))
    if "out" in status:  # a `troupe run`'s own node: the run's --out
        node.add_row("run out", literal(status["out"]))
    node.add_row("pid", literal(status["pid"]))
    node.add_row("uptime", f"{status['uptime_s']:.1f} s")
    node.add_row("rss", f"{status['rss_mib']} MiB")
    if "tags" in status:
        node.add_row("tags", literal(", ".join(map(str, status["tags"])) or "-"))
    if "security" in status:
        node.add_row("security", security_cell(status["security"]))
    if isinstance(status.get("supervision"), dict):
        node.add_row("supervisor", supervisor_cell(status["supervision"]))
    workers = Table(title="workers")
    for col in ("worker", "kind", "state", "pid", "rss MiB", "restarts", "last exit"):
        # Names and states are what a reader scans for: never cut them short on a narrow terminal.
        workers.add_column(col, no_wrap=col in ("worker", "state"))
    errors = Table(title="workers' last errors")
    errors.add_column("worker", no_wrap=True)
    errors.add_column("last error")
    actors = Table(title="actors")
    for col in ("actor", "worker", "kind", "handled", "failed", "mailbox", "busy"):
        actors.add_column(col)
    for w in status["workers"]:
        # One whose process is gone keeps its last pid in the reply; a pid and an rss of 0 on
        # screen would read as a live process.
        gone = w["state"] in _PROCESS_GONE
        faults = (w.get("runtime") or {}).get("faults") or []
        state = literal(w["state"])
        if faults:
            state.append(f" (faults: {', '.join(map(str, faults))})", style="yellow")
        workers.add_row(
            literal(w["name"]),
            literal(w["kind"]),
            state,
            "-" if gone else literal(w["pid"]),
            "-" if gone else literal(w.get("rss_mib", "")),
            literal(w["restarts"]),
            literal(w["exit"] or "-"),
        )
        if w.get("last_error"):
            errors.add_row(literal(w["name"]), literal(w["last_error"]))
        counted = (w.get("runtime") or {}).get("actors", {})
        for name, a in counted.items():
            actors.add_row(
                literal(name),
                literal(w["name"]),
                literal(a["kind"]),
                _with_tasks(a["handled"], a.get("tasks_done")),
                _with_tasks(a["failed"], a.get("tasks_failed")),
                literal(f"{a['mailbox_depth']}/{a['mailbox_capacity']}"),
                "yes" if a["busy"] else "no",
            )
        # A worker that did not answer (hung, restarting, stopped) still hosts its actors: list
        # them, with no counters, and say why there are none.
        unknown = _no_counters(w)
        for name in w.get("actors", ()):
            if name not in counted:
                actors.add_row(literal(name), literal(w["name"]), "-", "-", "-", "-", unknown)
    tables = [node, workers, *([errors] if errors.row_count else []), actors]
    if (ranks := trainer_table(status["workers"])) is not None:
        tables.append(ranks)
    if "pipeline" in status:
        tables.append(pipeline_table(status["pipeline"]))
    return tables


def _no_counters(worker: dict[str, Any]) -> str | Text:
    """Why a worker's actors have no counters in the table: it did not answer, or it is not running."""
    if worker["state"] != "running":
        return literal(f"({worker['state']})", "dim")
    return "[yellow](no answer)[/]" if (worker.get("runtime") or {}).get("error") else "[dim](unknown)[/]"


def _nodes(names: list[str]) -> str:
    return ", ".join(f"{n} x{c}" if c > 1 else n for n, c in Counter(names).items())


# The pipeline's columns; on ``ctl top``'s narrow terminal the least telling give way first.
_PIPELINE_COLUMNS = (
    Column("stage", text=True, wraps=4, justify="right"),
    Column("in", justify="right"),
    Column("out", justify="right"),
    Column("failed", gives_way=5, justify="right"),
    Column("l_s (s)", gives_way=4, justify="right"),
    Column("N_s", gives_way=2, justify="right"),
    Column("mu_s (/s)", gives_way=6, justify="right"),
    Column("queue", justify="right"),
    Column("busy", gives_way=3, justify="right"),
    Column("replicas", gives_way=7, justify="right"),
    Column("on nodes", text=True, gives_way=1),
)


def pipeline_table(p: dict[str, Any]) -> Table:
    """The live metrics of a pipeline driven beside the node (``troupe run``), whole
    (``ctl status`` prints it wider than the terminal rather than cut it)."""
    title, rows = _pipeline_cells(p)
    table = Table(title=title)
    for column in _PIPELINE_COLUMNS:
        table.add_column(column.header, justify=column.justify)
    for row in rows:
        table.add_row(*row)
    return table


def pipeline_view(p: dict[str, Any]) -> FittedTable:
    """:func:`pipeline_table` fitted to the terminal (``ctl top``): no figure cut."""
    title, rows = _pipeline_cells(p)
    table = FittedTable(title, _PIPELINE_COLUMNS)
    for row in rows:
        table.add_row(*row)
    return table


def _pipeline_cells(p: dict[str, Any]) -> tuple[Text, list[tuple[str | Text, ...]]]:
    title = literal(
        f"pipeline: lambda {p['lambda_measured']:.2f}/s, lambda_theory "
        f"{p['lambda_theory']:.2f}/s, lambda_succ {p['lambda_succ']:.2f}/s, "
        f"bottleneck {p['bottleneck'] or '-'}"
    )
    where: dict[str, list[str]] = {}
    for r in p.get("replicas") or ():  # where each replica runs (a cluster run spreads them)
        if isinstance(r, dict):
            where.setdefault(str(r.get("stage")), []).append(str(r.get("node")))
    rows: list[tuple[str | Text, ...]] = []
    for s in p["stages"]:
        rows.append(
            (
                literal(s["name"]),
                literal(s["items_in"]),
                literal(s["items_out"]),
                literal(s["failed"]),
                f"{s['latency_s']:.3f}",
                f"{s['concurrency']:.2f}",
                f"{s['throughput']:.2f}",
                literal(f"{s['queue_depth']}/{s['queue_bound']}"),
                f"{s['busy_fraction']:.0%}",
                literal(s["replicas"]),
                literal(_nodes(where.get(s["name"], []))),
            )
        )
    return title, rows


def _uncut_width(console: Console, table: RenderableType, measured: Measurement) -> int:
    """The narrowest width, from the measured minimum up, at which no cell is cut. rich's
    minimum is not one: past the columns it may wrap, it shortens every column alike, a
    column that may not wrap too (``ctl status`` cut a node's name, ``gpu-node-02.c…``)."""
    lo, hi = measured.minimum, max(measured.minimum, measured.maximum)
    while lo < hi:
        mid = (lo + hi) // 2
        if _ELLIPSIS in _rendered(console, table, mid):
            lo = mid + 1
        else:
            hi = mid
    return lo


_ELLIPSIS = "\u2026"  # what rich puts where it cuts a cell


def _rendered(console: Console, table: RenderableType, width: int) -> str:
    lines = console.render_lines(table, console.options.update_width(width), pad=False)
    return "".join(segment.text for line in lines for segment in line)
