"""``troupe master compact``: fold the tasks of finished jobs into counts, so restarts stay fast.

A master replays every task row of its journal when it starts; compaction replaces the done and
cancelled task rows of finished jobs by one row of counts per job (dead tasks keep their rows
and errors, for ``ctl dead``). A master does this by itself for jobs finished an hour ago or
more, as it starts and every five minutes while it runs (to its memory too); this command does
it now, for a journal no master is serving (it takes the journal's lock, so it is refused while
a master runs on it). It then gives the disk the rows' room back (the file rewritten without its
free pages: ``journal_shrink.py``), where the disk has room for the rewrite, and says the file's
bytes before and after.
"""

from __future__ import annotations

import time
from typing import Annotated

import typer
from rich.console import Console

from troupe.cli.client import err_console, fail
from troupe.cli.journal_notes import say_journal_notes
from troupe.cli.literal import literal
from troupe.runtime.errors import JournalError
from troupe.runtime.logs import configure_logging
from troupe.runtime.tasks.journal import Journal
from troupe.runtime.tasks.master.journal_shrink import files_bytes, shrink

from .master import DEFAULT_JOURNAL, JournalOption, master_app

__all__ = ["compact"]

console = Console()


@master_app.command("compact")
def compact(
    journal: JournalOption = DEFAULT_JOURNAL,
    older_than: Annotated[
        float,
        typer.Option(
            "--older-than", min=0.0, help="Compact only jobs that finished at least this many seconds ago."
        ),
    ] = 0.0,
) -> None:
    """Fold the task rows of finished jobs into per-job counts (dead letters are kept); shrink the file."""
    configure_logging("master", "compact", None, console=True, level="warning")
    if not journal.exists():
        raise fail(f"journal {journal} does not exist; give the path of an existing journal", 2)
    before = files_bytes(journal)
    try:
        with Journal.open(journal, new_hint="give the path of an existing journal") as opened:
            say_journal_notes(opened, "this compaction")
            done = opened.compact(time.time() - older_than)
            not_shrunk = shrink(opened)
    except JournalError as exc:
        raise fail(str(exc), 2) from None
    after = files_bytes(journal)  # closed: its log checkpointed into the file and removed
    console.print(
        literal(
            f"compacted {done.jobs} finished job(s) of {journal}: "
            f"{done.task_rows} task rows folded into counts"
        ),
        highlight=False,
        soft_wrap=True,
    )
    console.print(
        literal(f"{journal}: {before} bytes before, {after} after"), highlight=False, soft_wrap=True
    )
    if not_shrunk is not None:
        err_console.print(
            literal(f"note: {journal} was not shrunk: {not_shrunk}"), highlight=False, soft_wrap=True
        )
