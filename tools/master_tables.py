"""The tables the master's ``status`` reply is shown in (``troupe ctl status``, ``ctl jobs``,
``ctl top``): its summary, nodes, busiest workers, jobs and what their stuck tasks wait for.
"""

from __future__ import annotations

from typing import Any

from rich.table import Table
from rich.text import Text

from .literal import literal
from .tables import security_cell

__all__ = ["jobs_table", "jobs_tables", "live_figures", "master_tables", "waiting_table"]

_WORKER_ROWS = 40  # a status of 1,000 workers lists the busiest few; --json has them all


def _counts(tasks: dict[str, int]) -> str:
    return ", ".join(f"{state} {n}" for state, n in tasks.items() if n) or "none"


def live_figures(node: dict[str, Any]) -> dict[str, Any]:
    """A node's figures that hold only while it lives (its processes, load and free memory, from
    its last beat); none for a dead node, whose last beat's are long out of date."""
    if not node.get("alive"):
        return {}
    r = node.get("resources") or {}
    held = {k: r[k] for k in ("load1", "mem_available_mib") if k in r}
    return {"processes": node.get("processes", "-"), **held}


def master_tables(status: dict[str, Any]) -> list[Table]:
    """Render a master ``status`` reply: summary, nodes, busiest workers, jobs."""
    name = str(status["master"])  # "master" unless `master start --name` gave another
    head = Table(title="master" if name == "master" else literal(f"master {name}"), show_header=False)
    head.add_row("endpoint", literal(status["endpoint"]))
    head.add_row("pid", literal(status["pid"]))
    head.add_row("journal", literal(status["journal"]))
    head.add_row("code", _code_cell(status.get("code")))
    if "security" in status:
        head.add_row("security", security_cell(status["security"]))
    head.add_row("tasks", literal(_counts(status["tasks"])))
    thr = status["throughput"]
    head.add_row(
        "throughput",
        literal(
            f"{thr['done_per_s']:.1f} done/s over {thr['window_s']:.0f} s "
            f"({thr['done_since_start']} since start)"
        ),
    )
    spec = status["speculative"]
    head.add_row(
        "leases",
        literal(
            f"{status['leases_outstanding']} outstanding; "
            f"backups {spec['launched']} launched, {spec['won']} won"
        ),
    )
    nodes = Table(title="nodes (master's view)")
    columns = (
        "node",
        "alive",
        "workers",
        "processes",
        "cpus",
        "load",
        "mem free MiB",
        "gpus",
        "tags",
        "code",
        "last beat",
    )
    # What an operator copies into a command (ctl drain NODE) or compares is never cut, nor a
    # figure or its header; the columns of words wrap.
    for col in columns:
        nodes.add_column(col, no_wrap=col not in ("alive", "mem free MiB", "tags", "last beat"))
    for n in status["nodes"]:
        r = n.get("resources") or {}
        live = live_figures(n)
        nodes.add_row(
            literal(n["node"]),
            ("yes" if n["alive"] else "stopped" if n.get("left") else "[red]dead[/]")
            + (", [yellow]draining[/]" if n.get("draining") else ""),
            literal(n["workers"]),
            literal(live.get("processes", "-")),
            literal(r.get("cpus", "-")),
            literal(live.get("load1", "-")),
            literal(live.get("mem_available_mib", "-")),
            literal(r.get("gpus", "-")),
            literal(", ".join(map(str, n.get("tags") or ())) or "-"),  # wraps between tags, uncut
            _code_cell(n.get("code")),
            f"{n['last_beat_age_s']:.1f} s ago",
        )
    workers = Table(title=f"workers ({len(status['workers'])} registered)")
    for col in ("worker", "node", "used/slots", "gpu", "draining", "kinds"):
        workers.add_column(col, no_wrap=col in ("worker", "node"))
    busiest = sorted(status["workers"], key=lambda w: (-w["used"], w["worker_id"]))
    for w in busiest[:_WORKER_ROWS]:
        # A worker registers its id, node and kinds itself: text from a peer, not markup.
        workers.add_row(
            literal(w["worker_id"]),
            literal(w["node"]),
            _used(int(w["used"]), int(w["slots"])),
            literal(w["gpu"]),
            "yes" if w["draining"] else "no",
            literal(",".join(map(str, w["kinds"])) or "any"),
        )
    return [head, nodes, workers, *jobs_tables(status["jobs"])]


def _code_cell(code: Any) -> str | Text:
    """The troupe code a master or node runs (``0.1.0+3f9a1c2e``), or ``unknown`` where it did
    not say: an older one (or a master that has not read its own yet). Text from a peer: literal."""
    return literal(code) if code else "[yellow]unknown[/]"


def _used(used: int, slots: int) -> str:
    """``2/1 (1 ahead)``: a worker holds leases beyond its slots (prefetch), waiting for one."""
    ahead = f" ({used - slots} ahead)" if used > slots else ""
    return f"{used}/{slots}{ahead}"


def jobs_tables(jobs: list[dict[str, Any]]) -> list[Table]:
    """The jobs table, and the waiting table below it when some job's tasks wait."""
    waiting = waiting_table(jobs)
    return [jobs_table(jobs), *([waiting] if waiting.row_count else [])]


def waiting_table(jobs: list[dict[str, Any]]) -> Table:
    """What the jobs' stuck pending tasks wait for, a row per reason. A table of its own: as a
    column of the jobs table, a reason had the width the other columns left, a word per line
    at 80 columns."""
    table = Table(title="waiting tasks")
    table.add_column("job", no_wrap=True)
    table.add_column("tasks", justify="right")
    table.add_column("waiting for")
    for j in jobs:
        for w in j.get("waiting", ()):
            table.add_row(literal(j["job_id"]), literal(w["tasks"]), literal(w["reason"]))
    return table


def jobs_table(jobs: list[dict[str, Any]]) -> Table:
    """Render the master's jobs: state, progress by task state, rate, how many tasks are stuck
    (``waiting_table`` says on what)."""
    table = Table(title="jobs")
    # The cancelled tasks only where a job has some: the counts of a cancelled job add up to its
    # total then, and the usual table stays narrow.
    cancelled = any(j["counts"].get("cancelled") for j in jobs)
    counts = ("pending", "leased", "failed", "dead", *(("cancelled",) if cancelled else ()))
    for col in ("job", "state", "done/total", *counts, "done/s", "waiting"):
        # The job id is what `troupe ctl cancel` and `dead` take: never cut (see print_whole).
        table.add_column(col, no_wrap=True)
    for j in jobs:
        c = j["counts"]
        rate = j.get("done_per_s") if j["state"] != "cancelled" else None  # no rate for a stopped job
        waiting = sum(int(w["tasks"]) for w in j.get("waiting", ()))
        table.add_row(
            literal(j["job_id"]),
            literal(j["state"]),
            literal(f"{c.get('done', 0)}/{j['total']}"),
            *(literal(c.get(name, 0)) for name in counts),
            f"{rate:.1f}" if rate is not None else "-",
            str(waiting) if waiting else "-",
        )
    return table
