"""What ``troupe ctl status`` and ``ctl jobs`` print, from status replies shaped as the node
and the master send them."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.table import Table

from troupe.cli.master_client import jobs_table, jobs_tables, master_tables
from troupe.cli.tables import print_whole, status_tables


def text(tables: list[Table]) -> str:
    console = Console(record=True, width=200, color_system=None)
    for table in tables:
        console.print(table)
    return console.export_text()


def rows(tables: list[Table]) -> dict[str, list[str]]:
    """The body rows of the rendered tables, by their first cell."""
    out = {}
    for line in text(tables).splitlines():
        cells = [c.strip() for c in line.split("│")[1:-1]]
        if cells and cells[0]:
            out[cells[0]] = cells
    return out


def worker(
    name: str, actors: list[str], runtime: dict[str, Any] | None, state: str = "running"
) -> dict[str, Any]:
    return {
        "name": name,
        "kind": "default",
        "state": state,
        "pid": 4242,
        "endpoint": "tcp://127.0.0.1:1",
        "actors": actors,
        "actor_endpoints": {},
        "incarnation": 1,
        "restarts": 0,
        "exit": "",
        "rss_mib": 30.0,
        "runtime": runtime,
    }


def counters(kind: str) -> dict[str, Any]:
    return {
        "kind": kind,
        "handled": 7,
        "failed": 1,
        "mailbox_depth": 0,
        "mailbox_capacity": 100,
        "busy": False,
    }


NODE = {"node": "n1", "pid": 1, "endpoint": "tcp://127.0.0.1:2", "uptime_s": 3.0, "rss_mib": 40.0}


def test_a_hung_worker_s_actors_are_listed_without_counters() -> None:
    """A worker that did not answer the status ask still shows its actors, marked so."""
    reply = {
        **NODE,
        "workers": [
            worker("w-ok", ["echo"], {"actors": {"echo": counters("Echo")}}),
            worker("w-hung", ["render", "encode"], {"error": "AskTimeout('no reply within 1.0s')"}),
            worker("w-off", ["store"], None, state="stopped"),
        ],
    }
    actors = rows(status_tables(reply))
    assert actors["echo"] == ["echo", "w-ok", "Echo", "7", "1", "0/100", "no"]
    assert actors["render"] == ["render", "w-hung", "-", "-", "-", "-", "(no answer)"]
    assert actors["encode"] == ["encode", "w-hung", "-", "-", "-", "-", "(no answer)"]
    assert actors["store"] == ["store", "w-off", "-", "-", "-", "-", "(stopped)"]


def master_reply(name: str) -> dict[str, Any]:
    return {
        "master": name,
        "endpoint": "tcp://127.0.0.1:3",
        "pid": 2,
        "journal": "j.db",
        "tasks": {"done": 3},
        "throughput": {"done_per_s": 1.0, "window_s": 30, "done_since_start": 3},
        "speculative": {"launched": 0, "won": 0},
        "leases_outstanding": 0,
        "nodes": [],
        "workers": [],
        "jobs": [],
    }


def test_the_master_section_is_titled_once() -> None:
    """The default master name does not make a "master master" title; another name is shown."""
    assert "master master" not in text(master_tables(master_reply("master")))
    assert "master east-1" in text(master_tables(master_reply("east-1")))


def test_a_worker_holding_leases_ahead_says_so_rather_than_more_used_than_slots() -> None:
    """2/1 with no word looked like a bug: the second is a lease held ahead (prefetch)."""
    reply = master_reply("master")
    w = {"node": "n2", "gpu": 0, "draining": False, "kinds": ["sleep"]}
    reply["workers"] = [
        {"worker_id": "n2/w-sleep", "used": 2, "slots": 1, **w},
        {"worker_id": "n2/w-idle", "used": 0, "slots": 1, **w},
    ]
    shown = rows(master_tables(reply))
    assert "2/1 (1 ahead)" in shown["n2/w-sleep"] and "0/1" in shown["n2/w-idle"]


def job(state: str) -> dict[str, Any]:
    return {
        "job_id": f"job-{state}",
        "state": state,
        "total": 10,
        "counts": {"done": 4, "cancelled": 6},
        "done_per_s": 2.0,
    }


def test_a_cancelled_job_shows_no_rate() -> None:
    """A running job shows its done/s; a cancelled one shows "-"."""
    table = rows([jobs_table([job("running"), job("cancelled")])])
    assert table["job-running"][8] == "2.0"
    assert table["job-cancelled"][8] == "-"


def test_a_cancelled_job_s_counts_add_up_to_its_total() -> None:
    """Its cancelled tasks have a column (they were in --json only: 4/10 done and nothing else);
    a table without a cancelled task has none."""
    cancelled = jobs_table([job("cancelled")])
    headers = [str(c.header) for c in cancelled.columns]
    assert headers[:8] == ["job", "state", "done/total", "pending", "leased", "failed", "dead", "cancelled"]
    assert rows([cancelled])["job-cancelled"][2:8] == ["4/10", "0", "0", "0", "0", "6"]
    plain = jobs_table([{**job("running"), "counts": {"done": 4, "pending": 6}}])
    assert "cancelled" not in [str(c.header) for c in plain.columns]
    assert rows([plain])["job-running"][2:4] == ["4/10", "6"]


def test_a_job_id_is_printed_whole_on_a_narrow_terminal() -> None:
    """`troupe ctl cancel` takes the id `ctl jobs` shows: at 80 columns (a pipe's width) the
    table had cut ``indoor-nav`` to ``indoo…``. It is printed as wide as its cells need."""
    long_id = "indoor-nav-from-the-second-building-2026"
    console = Console(record=True, width=80, color_system=None)
    print_whole(console, jobs_table([{**job("running"), "job_id": long_id}]))
    printed = console.export_text()
    assert long_id in printed
    assert "…" not in printed
    assert console.width == 80  # the console itself is left as it was


def test_the_nodes_table_cuts_no_cell_on_a_narrow_terminal() -> None:
    """`troupe ctl drain` takes the node's name: at 80 columns ``ctl status`` cut it to
    ``gpu-node-02.c…`` (and the memory, the tags, the code), though the table is printed as
    wide as its cells need: rich's narrowest width shortened every column past those it wraps."""
    reply = master_reply("master")
    node = {
        "alive": True,
        "workers": 10,
        "processes": 12,
        "last_beat_age_s": 0.5,
        "resources": {"cpus": 16, "load1": 3.25, "mem_available_mib": 120345, "gpus": 8},
        "tags": ["gpu", "rack-a"],
        "code": "0.1.0+3f9a1c2e",
    }
    reply["nodes"] = [{**node, "node": "n1"}, {**node, "node": "gpu-node-02.cluster.local"}]
    console = Console(record=True, width=80, color_system=None)
    for table in master_tables(reply):
        print_whole(console, table)
    printed = console.export_text()
    assert "…" not in printed, printed
    for whole in ("gpu-node-02.cluster.local", "120345", "rack-a", "0.1.0+3f9a1c2e", "processes"):
        assert whole in printed, whole


def test_what_workers_registered_is_shown_as_text_not_markup() -> None:
    """A worker's id, node and kinds come from its registration: rich markup in them is
    printed as written, not interpreted (nor an error that hides the table)."""
    reply = master_reply("master")
    reply["workers"] = [
        {
            "worker_id": "[red]w1[/]",
            "node": "[bold]n1",
            "used": 0,
            "slots": 1,
            "gpu": 0,
            "draining": False,
            "kinds": ["[blink]k"],
        }
    ]
    printed = text(master_tables(reply))
    assert "[red]w1[/]" in printed
    assert "[bold]n1" in printed
    assert "[blink]k" in printed


def test_what_stuck_tasks_wait_for_keeps_its_words_together_at_80_columns() -> None:
    """The reasons have a table of their own: as a column of the jobs table they had the width
    the other columns left, one word per line at a pipe's 80 columns."""
    reason = "waiting for kind nap: no live worker runs it"
    stuck = {**job("running"), "counts": {"pending": 12}, "waiting": [{"tasks": 12, "reason": reason}]}
    console = Console(record=True, width=80, color_system=None)
    for table in jobs_tables([stuck, job("done")]):
        print_whole(console, table)
    printed = console.export_text()
    assert reason in printed, printed
    assert rows([jobs_table([stuck])])["job-running"][8] == "12"  # the jobs table counts them
    assert len(jobs_tables([job("done")])) == 1  # no waiting table when nothing waits


def test_a_worker_whose_process_is_gone_shows_no_pid_or_rss() -> None:
    """A failed or stopped worker's reply keeps its last pid (and an rss of 0): the table shows
    "-" for both, so that it does not read as a live process."""
    reply = {
        **NODE,
        "workers": [
            worker("w-live", [], None),
            {**worker("w-failed", [], None, state="failed"), "rss_mib": 0.0},
            {**worker("w-stopped", [], None, state="stopped"), "rss_mib": 0.0},
        ],
    }
    table = rows(status_tables(reply))
    assert table["w-live"][3:5] == ["4242", "30.0"]
    assert table["w-failed"][3:5] == ["-", "-"]
    assert table["w-stopped"][3:5] == ["-", "-"]


def supervision(**fields: Any) -> dict[str, Any]:
    return {"enabled": True, "supervisor_failed": False, "supervisor_starts": 1, **fields}


def test_the_node_table_says_how_its_supervisor_is() -> None:
    """Running (forked or spawned, restarted, answering or not), starting, failed or off: the
    operator sees whether hung workers are being watched."""
    answering = {"pid": 77, "workers": {}}
    cases = {
        "pid 77, forked": supervision(supervisor_pid=77, supervisor_start="fork", supervisor=answering),
        "pid 78, spawned, started 3 times (no answer)": supervision(
            supervisor_pid=78, supervisor_start="spawn", supervisor_starts=3
        ),
        "starting": supervision(supervisor_pid=None),
        "failed: restarted too often; hung workers are not detected": supervision(
            supervisor_pid=None, supervisor_failed=True
        ),
        "off ([supervision] enabled = false): hung workers are not detected": supervision(enabled=False),
    }
    for said, sup in cases.items():
        node = rows(status_tables({**NODE, "workers": [], "supervision": sup}))
        assert node["supervisor"] == ["supervisor", said]


def test_a_supervisor_pid_from_the_wire_is_shown_as_text_not_markup() -> None:
    sup = supervision(supervisor_pid="[red]9[/]", supervisor_start="[bold]fork", supervisor={"x": 1})
    node = rows(status_tables({**NODE, "workers": [], "supervision": sup}))
    assert node["supervisor"] == ["supervisor", "pid [red]9[/]"]


def test_the_stage_table_of_a_run_keeps_every_figure_on_a_narrow_terminal() -> None:
    """``COLUMNS=20``: the stage table of ``troupe run`` was all ellipses, headers and figures
    (``ret…``, ``10…`` for 100%); it is printed as wide as its figures, whole."""
    from troupe.cli.commands.run_pipeline import metrics_table
    from troupe.runtime.pipeline.result import PipelineMetrics, StageMetrics

    stage = StageMetrics("render", 64, 64, 0, 3, 0.1294, 1.58, 12.2, 0, 4, 4, 0.95, 2, 0.1290)
    metrics = PipelineMetrics((stage,), 6.0, 64, 64, 0, 0, 11.2, 11.2, 12.2, "render")
    console = Console(record=True, width=20, color_system=None)
    print_whole(console, metrics_table(metrics), unwrapped=True)
    printed = console.export_text()
    assert "…" not in printed
    assert "errors" in printed and "129.4" in printed and "95%" in printed and "4/4" in printed


def test_the_nodes_table_says_which_node_drains_and_how_many_processes_each_runs() -> None:
    """``troupe ctl drain`` was visible nowhere in ``ctl status``; and a node running a
    pipeline's replicas showed 0 workers (those are the task workers registered)."""
    reply = master_reply("master")
    reply["nodes"] = [
        {"node": "n1", "alive": True, "draining": True, "processes": 3, "workers": 0, "resources": {},
         "tags": [], "last_beat_age_s": 0.2},
        {"node": "n2", "alive": True, "draining": False, "processes": 0, "workers": 0, "resources": {},
         "tags": [], "last_beat_age_s": 0.4},
    ]  # fmt: skip
    body = rows(master_tables(reply))
    assert body["n1"][1:4] == ["yes, draining", "0", "3"], body["n1"]
    assert body["n2"][1:4] == ["yes", "0", "0"], body["n2"]


def test_a_dead_node_shows_no_figures_of_its_last_beat() -> None:
    """A node the master declared dead kept its last beat's processes, load and free memory in
    ``ctl status`` (``dead ... processes 4``) long after they were gone."""
    reply = master_reply("master")
    resources = {"cpus": 2, "load1": 1.5, "mem_available_mib": 900, "gpus": 0}
    node = {"draining": False, "processes": 4, "workers": 2, "tags": [], "last_beat_age_s": 40.0}
    node["resources"] = resources
    reply["nodes"] = [{**node, "node": "n1", "alive": True}, {**node, "node": "n2", "alive": False}]
    body = rows(master_tables(reply))
    assert body["n1"][3:7] == ["4", "2", "1.5", "900"], body["n1"]
    assert body["n2"][1] == "dead" and body["n2"][3:7] == ["-", "2", "-", "-"], body["n2"]
