"""A running master's compaction: finished jobs folded into counts, as a restart leaves them.

A master started on its journal compacts the jobs that finished ``COMPACT_AFTER_S`` ago or more
(``journal_open.py``): their done and cancelled tasks are replayed as counts, not rows. A master
left up for days would otherwise keep every task of every job it ever ran, a Task object each
(about 0.9 KiB), until it was restarted. So every ``COMPACT_EVERY_S`` it does the same by itself,
to its journal and to its book at once: each such job's done and cancelled tasks leave both
(``Journal.compact``, ``TaskBook.fold``), their counts, their dead tasks and the job's digest
stay, and the book is the one a restart from that journal would read back.

The journal is not safe for concurrent use and the book must agree with it whenever a batch
reads them, so what touches either runs through the dispatcher between two batches
(``Dispatcher.exclusive``), and none of it holds the master's loop for long:

1. The journal names the jobs (a query, in a thread).
2. Each job's digest (what a submit of it again is compared by, ``job_digest.py``) is taken from
   the book's specs, ``DIGEST_SLICE`` tasks at a time on the loop, batches running between: a
   job's specs never change. The specs are those its rows were written from, so the digest is
   the one a compaction at start takes from the rows, at a third of the cost (no row decoded).
3. Jobs of ``FOLD_TASKS`` tasks or so at a time are folded in one exclusive step: the journal's
   transaction runs in a thread (SQLite deletes the rows with the GIL free), then the book
   drops those of the jobs the journal compacted (a job retried meanwhile is not), and forgets
   their ids ``FORGET_SLICE`` at a time, the loop let go between slices.

Measured on two cores (2026-12, a job of a million done tasks): see README, "Tasks: the master".
"""

from __future__ import annotations

import time
from functools import partial

import anyio
import anyio.lowlevel

from troupe.runtime.library_logging import get_logger
from troupe.runtime.start_limits import in_thread
from troupe.runtime.tasks.book import TaskBook
from troupe.runtime.tasks.job_digest import JobDigest
from troupe.runtime.tasks.journal import Compaction, Journal

from .driver import Dispatcher

__all__ = ["COMPACT_EVERY_S", "compact_finished"]

log = get_logger(__name__)

COMPACT_EVERY_S = 300.0
"""A running master compacts the jobs finished ``COMPACT_AFTER_S`` ago this often."""

DIGEST_SLICE = 4096  # specs digested before the loop is let go (about 20 ms)
FOLD_TASKS = 65_536  # a fold step takes jobs until they hold this many tasks
FORGET_SLICE = 32_768  # ids forgotten before the loop is let go (about 15 ms)


async def compact_finished(dispatcher: Dispatcher, finished_before: float) -> Compaction:
    """Compact the jobs that finished at or before ``finished_before`` (epoch seconds), in the
    journal and the book, as a restart on the journal would.

    Returns:
        What was compacted (the jobs retried meanwhile are not).

    Raises:
        JournalError: the journal failed (nothing of the step that failed is kept; the book is
            as it was), or the dispatcher stopped on a failure of its own.
    """
    journal, book = dispatcher.journal, dispatcher.book
    started = time.monotonic()

    async def finished() -> list[str]:
        return await in_thread(journal.compactable, finished_before, what="compactable")

    job_ids = await dispatcher.exclusive(finished)
    jobs = rows = tasks = 0
    ids: list[str] = []
    digests: dict[str, str] = {}
    for n, job_id in enumerate(job_ids, 1):
        digest, held = await _digest(book, job_id)
        digests[job_id] = digest
        tasks += held
        if tasks >= FOLD_TASKS or n == len(job_ids):
            done = await dispatcher.exclusive(partial(_fold, journal, book, finished_before, digests))
            jobs, rows, ids = jobs + done.jobs, rows + done.task_rows, ids + list(done.job_ids)
            digests, tasks = {}, 0
    if jobs:
        took_s = round(time.monotonic() - started, 3)
        log.info("finished_jobs_compacted", jobs=jobs, tasks=rows, took_s=took_s)
    return Compaction(jobs, rows, tuple(ids))


async def _digest(book: TaskBook, job_id: str) -> tuple[str, int]:
    """The job's digest and its task count, a slice of its specs at a time."""
    digest = JobDigest()
    start = 0
    while specs := book.job_specs(job_id, start, start + DIGEST_SLICE):
        digest.add(specs)
        start += len(specs)
        await anyio.lowlevel.checkpoint()
    return digest.hexdigest(), start


async def _fold(
    journal: Journal, book: TaskBook, finished_before: float, digests: dict[str, str]
) -> Compaction:
    done = await in_thread(journal.compact, finished_before, digests, what="compact")
    for job_id in done.job_ids:
        book.fold(job_id, digests[job_id])
        while book.forget_folded(FORGET_SLICE):
            await anyio.lowlevel.checkpoint()
    return done
