"""``troupe master start``: run the cluster's master in the foreground.

The journal is required to exist unless ``--new`` is given: a master that quietly started on
an empty queue after a typo in the path would forget every job of the real journal. ``--new``
creates the journal when the file does not exist and resumes it when it does; a file that is
not a healthy troupe journal is refused either way (exit status 2, with the reason).
"""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Annotated

import anyio
import typer

from troupe.runtime.errors import JournalError, TroupeError
from troupe.runtime.journal import Journal
from troupe.runtime.logs import configure_logging
from troupe.runtime.master import DEFAULT_MASTER_ENDPOINT, Master, MasterConfig, open_journal
from troupe.runtime.node import Node
from troupe.runtime.taskbook import TaskBook

from .client import fail, run_async

__all__ = ["DEFAULT_JOURNAL", "load_journal", "master_app", "run_node_with_master"]

master_app = typer.Typer(no_args_is_help=True)

DEFAULT_JOURNAL = Path("troupe-journal.db")

JournalOption = Annotated[Path, typer.Option("--journal", help="The master's journal (SQLite).")]
NewOption = Annotated[bool, typer.Option("--new", help="Create the journal if it does not exist.")]


def load_journal(path: Path, new: bool) -> tuple[Journal, TaskBook]:
    """Open and replay the journal, or exit 2 with the reason (missing, corrupt, foreign)."""
    try:
        return open_journal(path, new)
    except JournalError as exc:
        raise fail(str(exc), 2) from None


@master_app.command("start")
def start(
    journal: JournalOption = DEFAULT_JOURNAL,
    new: NewOption = False,
    endpoint: Annotated[str, typer.Option(help="Where the master listens (loopback only).")] = DEFAULT_MASTER_ENDPOINT,
    log_dir: Annotated[Path, typer.Option("--logs", help="Directory of the JSON-lines logs.")] = Path("logs"),
    log_level: Annotated[str, typer.Option(help="debug, info, warning or error.")] = "info",
    name: Annotated[str, typer.Option(help="The master's name in logs and status.")] = "master",
    node_timeout: Annotated[float, typer.Option(help="Seconds of silence before a node is dead.")] = 10.0,
) -> None:
    """Start the master: jobs, leases, retries and the journal, until SIGTERM or Ctrl-C."""
    config = MasterConfig(endpoint=endpoint, name=name, node_timeout_s=node_timeout)
    configure_logging(name, "master", log_dir, console=True, level=log_level)
    opened, book = load_journal(journal, new)

    async def main() -> None:
        master = Master(config, opened, book)
        async with anyio.create_task_group() as tg:
            tg.start_soon(_stop_on_signal, master)
            await master.run()
            tg.cancel_scope.cancel()

    try:
        run_async(main)
    finally:
        opened.close()


async def _stop_on_signal(master: Master) -> None:
    with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        async for _ in signals:
            master.stop()
            break


async def run_node_with_master(node: Node, master: Master) -> None:
    """Run a node and a master in one process; the master stops when the node does.

    Raises:
        TroupeError: the master failed (bind, journal); the node is stopped first.
    """
    failure: list[TroupeError] = []
    settled = anyio.Event()  # the master is serving, or has failed

    async def run_master() -> None:
        try:
            await master.run()
        except TroupeError as exc:
            failure.append(exc)
            node.stopping.set()
        finally:
            settled.set()

    async def wait_ready() -> None:
        await master.ready.wait()
        settled.set()

    async with anyio.create_task_group() as tg:
        tg.start_soon(run_master)
        tg.start_soon(wait_ready)
        await settled.wait()
        if not failure:
            await node.run()
        master.stop()
        if failure:
            tg.cancel_scope.cancel()  # wait_ready would wait forever
    if failure:
        raise failure[0]
