"""The ``troupe`` command: a thin client over the runtime."""

from __future__ import annotations

import typer

from . import chaos_cmd  # noqa: F401  (adds `ctl chaos` and `ctl heal`)
from .bench_cmd import bench_app
from .ctl_cmd import ctl_app
from .logs_cmd import logs_app
from .master_cmd import master_app
from .node_cmd import node_app
from .run_cmd import demo, run

__all__ = ["app"]

app = typer.Typer(
    name="troupe",
    help="An actor runtime for embodied-AI data and training pipelines.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
app.add_typer(node_app, name="node", help="Start a node on this host.")
app.add_typer(master_app, name="master", help="Start the cluster's master (jobs, leases, journal).")
app.add_typer(ctl_app, name="ctl", help="Send control messages to a running cluster.")
app.add_typer(bench_app, name="bench", help="Measure troupe against its raw ceilings.")
app.add_typer(logs_app, name="logs", help="Follow the structured logs of the nodes.")
app.command("run")(run)
app.command("demo")(demo)

if __name__ == "__main__":
    app()
