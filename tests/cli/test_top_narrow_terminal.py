"""``troupe ctl top`` on a narrow terminal never cuts a figure (finding ob 7): at 80 columns a
mailbox of ``950/1000`` read ``950…``, and at 40 whole columns were drawn as empty cells. Names
wrap first; then the columns that matter least give way, and the table's title says which; a
terminal too narrow even then gets one line saying how wide it must be."""

from __future__ import annotations

import io
from typing import Any

import pytest
from rich.console import Console

from troupe.cli.commands.top import Look, frame
from troupe.cli.fitted_table import Column, FittedTable

NODE = "tcp://127.0.0.1:7470"
MASTER = "tcp://127.0.0.1:7471"


def _look() -> Look:
    actors = {"spam": {"handled": 123456, "mailbox_depth": 950, "mailbox_capacity": 1000, "busy": False}}
    workers = [
        {"name": f"render-replica-{i}", "kind": "render", "state": "running", "pid": 26288 + i,
         "rss_mib": 37.1, "restarts": 12, "runtime": {"actors": actors}}
        for i in range(2)
    ]  # fmt: skip
    stage = {"name": "render", "items_in": 12345, "items_out": 12000, "failed": 3, "latency_s": 0.5,
             "concurrency": 2.0, "throughput": 4.0, "queue_depth": 950, "queue_bound": 1000,
             "busy_fraction": 0.9, "replicas": 4}  # fmt: skip
    pipeline = {"lambda_measured": 1.0, "lambda_theory": 2.0, "lambda_succ": 1.0, "bottleneck": "render",
                "stages": [stage], "replicas": [{"stage": "render", "node": "gpu-node-02"}]}  # fmt: skip
    node = {
        "node": "gpu-node-02",
        "uptime_s": 3300.0,
        "rss_mib": 61.2,
        "workers": workers,
        "pipeline": pipeline,
    }
    nodes = [{"node": "gpu-node-02", "alive": True, "workers": 2, "last_beat_age_s": 0.4,
              "resources": {"load1": 1.23, "mem_available_mib": 20123}}]  # fmt: skip
    job = {"job_id": "idle", "state": "running", "total": 3, "counts": {"pending": 3}}
    return Look(0.0, node=node, master={"master": "m", "nodes": nodes, "jobs": [job]})


def _drawn(width: int, renderable: Any) -> str:
    out = io.StringIO()
    Console(file=out, width=width, color_system=None).print(renderable)
    return out.getvalue()


def _rows(text: str, name: str) -> list[list[str]]:
    """The cells of the table rows whose first cell begins with ``name``."""
    lines = [line.strip().strip("│") for line in text.splitlines() if "│" in line]
    rows = [[cell.strip() for cell in line.split("│")] for line in lines]
    return [row for row in rows if row[0].startswith(name)]


@pytest.mark.parametrize("width", [160, 100, 80, 60, 40])
def test_no_figure_is_cut_and_no_cell_drawn_empty(width: int) -> None:
    text = _drawn(width, frame(_look(), None, NODE, MASTER, None))
    assert "…" not in text, text
    assert max(len(line) for line in text.splitlines()) <= width, text
    # A name may wrap: its row's first line has the figures.
    workers = [row for row in _rows(text, "render-r") if "running" in row]
    assert len(workers) == 2, text
    for worker in workers:
        assert "" not in worker and {"running", "950/1000"} <= set(worker), text
    for figure in ("123456", "26288", "12345", "12000", "3300 s", "0.4 s ago"):
        assert figure in text or "narrow terminal: no" in text, (figure, text)


def test_at_80_columns_the_least_telling_columns_give_way_and_the_title_says_so() -> None:
    text = _drawn(80, frame(_look(), None, NODE, MASTER, None))
    assert "workers (narrow terminal: no kind, rss MiB, msg/s)" in " ".join(text.split()), text
    worker, _ = _rows(text, "render-replica")
    assert worker == ["render-replica-0", "running", "26288", "12", "123456", "950/1000", "no"], text


def test_too_narrow_even_so_is_one_line_that_says_how_wide() -> None:
    table = FittedTable("workers", [Column("worker", text=True), Column("mailbox")])
    table.add_row("w", "950/1000")
    text = _drawn(12, table)
    assert "…" not in text
    assert "workers: the terminal is too narrow (21 columns needed, 12 here)" in " ".join(text.split())
    assert _drawn(21, table).count("950/1000") == 1
