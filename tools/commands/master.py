"""``troupe master start``: run the cluster's master in the foreground; ``troupe master init``:
create its journal once, for a service that must never create one (configs/troupe-master.service).

The journal is required to exist unless ``--new`` is given: a master that quietly started on
an empty queue after a typo in the path would forget every job of the real journal. ``--new``
creates the journal when the file does not exist and resumes it when it does; a file that is
not a healthy troupe journal is refused either way (exit status 2, with the reason).
"""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Annotated

import anyio
import typer

from troupe.cli.client import fail, run_async
from troupe.cli.journal_notes import say_journal_notes
from troupe.cli.preflight import check_master_start
from troupe.runtime.errors import ConfigError, JournalError, TroupeError
from troupe.runtime.gc_pauses import use_master_gc_thresholds
from troupe.runtime.logs import check_log_level, configure_logging, log_file
from troupe.runtime.node.name_lock import NameHold, hold_name
from troupe.runtime.node.node import Node
from troupe.runtime.security.process import KEYS_ENV, keys_for
from troupe.runtime.tasks.book import TaskBook
from troupe.runtime.tasks.journal import Journal
from troupe.runtime.tasks.journal_lock import JournalBusy, refuse_held
from troupe.runtime.tasks.master.journal_open import check_folder, open_journal
from troupe.runtime.tasks.master.master import Master
from troupe.runtime.tasks.master.master_config import DEFAULT_MASTER_ENDPOINT, MasterConfig

from .keys_option import from_environment, insecure_with_keys, keys_directory
from .master_init_files import Made, is_empty_database, is_sqlite

__all__ = [
    "DEFAULT_JOURNAL",
    "InsecureOption",
    "KeysOption",
    "MetricsOption",
    "load_journal",
    "master_app",
    "run_node_with_master",
    "serve_master",
]

master_app = typer.Typer(no_args_is_help=True)

DEFAULT_JOURNAL = Path("troupe-journal.db")

JournalOption = Annotated[Path, typer.Option("--journal", help="The master's journal (SQLite).")]
NewOption = Annotated[bool, typer.Option("--new", help="Create the journal if it does not exist.")]
KeysOption = Annotated[
    Path | None,
    typer.Option(
        "--keys",
        envvar="TROUPE_KEYS",
        help="CURVE keys directory (troupe keys generate): authenticate and encrypt every socket.",
        parser=keys_directory,
        metavar="DIR",
    ),
]
MetricsOption = Annotated[
    str | None,
    typer.Option(
        "--metrics",
        metavar="HOST:PORT",
        help="Serve Prometheus metrics at http://HOST:PORT/metrics (docs/METRICS.md); default: none.",
    ),
]
InsecureOption = Annotated[
    bool | None,
    typer.Option("--insecure", help="Listen off loopback without keys (unauthenticated; logged loudly)."),
]


def load_journal(path: Path, new: bool) -> tuple[Journal, TaskBook]:
    """Open and replay the journal, or exit 2 with the reason (missing, corrupt, foreign, its
    ``-wal`` without it); an upgrade, or a journal not closed cleanly found without its ``-wal``,
    is said in a ``note:`` line.

    The process is a master's from here on (``master start``, or a node ``--with-master``): it
    collects garbage as one (runtime/gc_pauses.py) before the replay builds its tables."""
    use_master_gc_thresholds()
    try:
        opened = open_journal(path, new)
    except JournalError as exc:
        raise fail(str(exc), 2) from None
    say_journal_notes(opened[0], "this master")  # before the master serves
    return opened


@master_app.command("init")
def init(journal: JournalOption = DEFAULT_JOURNAL) -> None:
    """Create a new, empty journal for a master, and nothing else (once, before a service starts it)."""
    if journal.is_dir():
        raise fail(
            f"journal {journal} is a directory: give the journal's file, e.g. {journal / 'journal.db'}", 2
        )
    # An empty file or an empty database (a failed create's) is made a journal, as --new does.
    if journal.exists() and journal.stat().st_size > 0 and not is_empty_database(journal):
        if not is_sqlite(journal):
            raise fail(
                f"journal {journal} exists and is no journal (not an SQLite database): master start "
                "refuses it; nothing was changed (move it away to create one there)",
                2,
            )
        raise fail(f"journal {journal} exists already; nothing was changed (master start resumes it)", 2)
    try:
        check_folder(journal, new=True)  # said as master start says it
    except JournalError as exc:
        raise fail(str(exc), 2) from None
    made = Made(journal)
    try:
        opened, _ = open_journal(journal, new=True)
    except JournalError as exc:
        # Another process's files where it holds the journal; else what this init made, which
        # a rerun took for a journal ("exists already") and master start refused.
        undone = not isinstance(exc, JournalBusy) and made.take_back()
        raise fail(f"{exc}{' (init removed what it had made there)' if undone else ''}", 2) from None
    opened.close()
    served = f"troupe master start --journal {shlex.quote(str(journal))}"  # pasted whole, spaces too
    typer.echo(f"created the journal {journal}: `{served}` serves it")


@master_app.command("start")
def start(
    ctx: typer.Context,
    journal: JournalOption = DEFAULT_JOURNAL,
    new: NewOption = False,
    endpoint: Annotated[
        str, typer.Option(help="Where the master listens (off loopback: --keys or --insecure).")
    ] = DEFAULT_MASTER_ENDPOINT,
    log_dir: Annotated[Path, typer.Option("--logs", help="Directory of the JSON-lines logs.")] = Path("logs"),
    log_level: Annotated[str, typer.Option(help="debug, info, warning or error.")] = "info",
    name: Annotated[str, typer.Option(help="The master's name in logs and status.")] = "master",
    node_timeout: Annotated[float, typer.Option(help="Seconds of silence before a node is dead.")] = 10.0,
    keys: KeysOption = None,
    insecure: InsecureOption = None,
    metrics: MetricsOption = None,
) -> None:
    """Start the master: jobs, leases, retries and the journal, until SIGTERM or Ctrl-C."""
    if insecure and keys is not None:
        named = f"${KEYS_ENV} ({keys})" if from_environment(ctx, "keys") else f"--keys {keys}"
        raise fail(insecure_with_keys("--insecure", named), 2)
    try:
        config = MasterConfig(
            endpoint=endpoint,
            name=name,
            node_timeout_s=node_timeout,
            keys=keys,
            insecure=bool(insecure),
            metrics=metrics,
            log_file=log_file(log_dir, name),  # configure_logging's file: the master streams it
        )
        if keys is not None:
            keys_for(keys)  # bad keys are refused before the journal is touched
    except ConfigError as exc:
        raise fail(str(exc), 2) from None
    try:
        check_log_level(log_level)
    except ValueError as exc:
        raise fail(f"--log-level: {exc}", 2) from None
    check_master_start(endpoint, log_dir, metrics, name)
    # Held for the master's life, taken before its log is opened or its journal touched: two
    # masters of one --name and --logs (their journals apart) both ran, and wrote one log.
    with _held_log_name(log_dir, name, journal):
        # The master is its file's only writer: it rotates master.jsonl itself (64 MB, 5 kept).
        configure_logging(name, "master", log_dir, console=True, level=log_level, rotate_at_bytes=64 << 20)
        opened, book = load_journal(journal, new)

        async def main() -> None:
            try:
                await serve_master(Master(config, opened, book))
            finally:
                opened.close()

        # SIGINT, SIGTERM, SIGHUP: the master stops, the journal is closed, exit 130 / 143 / 129
        run_async(main)


def _held_log_name(log_dir: Path, name: str, journal: Path) -> NameHold:
    """The master's name in ``log_dir``, held as a node holds its own (``node/name_lock.py``: one
    lock per ``<name>.jsonl``, a master's and a node's alike), or exit 2 naming its holder; where
    that holder holds ``journal`` too (a second master on it), the journal's refusal is said."""
    hold = hold_name(log_dir, name)
    if hold.holder is not None:
        try:
            refuse_held(journal)
        except JournalBusy as exc:
            raise fail(str(exc), 2) from None
        raise fail(
            f"master {name!r}: its name is held in {log_dir} by pid {hold.holder} (a master or node "
            f"running under it): both would write {name}.jsonl; stop it, or give this master "
            "another --name or --logs",
            2,
        )
    return hold  # not held where no lock can be had (another user's file, no flock): as before


async def serve_master(master: Master) -> None:
    """Run ``master`` until it stops by itself or this call is cancelled (the command's Ctrl-C).

    Cancelled, it stops the way :meth:`Master.stop` does, shielded: the batch in hand is
    journaled and answered, then the master shuts down.
    """
    async with anyio.create_task_group() as tg:

        async def serve() -> None:
            with anyio.CancelScope(shield=True):
                await master.run()
            tg.cancel_scope.cancel()  # it stopped by itself (a shutdown message)

        tg.start_soon(serve)
        try:
            await anyio.sleep_forever()
        finally:
            master.stop()


async def run_node_with_master(node: Node, master: Master) -> None:
    """Run a node and a master in one process; the master stops when the node does.

    Raises:
        TroupeError: the master failed (bind, journal); the node is stopped first.

    Cancelled (the command's Ctrl-C), the node stops its workers first, then the master stops.
    """
    failure: list[TroupeError] = []
    settled = anyio.Event()  # the master is serving, or has failed

    async def run_master() -> None:
        try:
            with anyio.CancelScope(shield=True):  # it outlives the node; master.stop() ends it
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
        try:
            await settled.wait()
            if not failure:
                await node.run()
        finally:
            master.stop()  # after the node: its workers' last reports have reached the master
            if failure:
                tg.cancel_scope.cancel()  # wait_ready would wait forever
    if failure:
        raise failure[0]
