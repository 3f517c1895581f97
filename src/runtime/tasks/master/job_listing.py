"""Which of a master's jobs a listing shows: the running ones and the last few finished.

A master keeps every job it was ever given (their ids guard a resubmit: the same job file is
"already submitted", other content under a used id refused), so a listing of all of them grew
for good: ``ctl status`` printed a row per job ever submitted (thousands after weeks) and the
master's ``status`` reply grew toward the message bound. The ``status`` reply, and ``ctl jobs
--last N`` / ``--running``, show the running jobs and the last finished ones instead, and say how
many finished jobs they leave out; ``ctl jobs`` (the ``jobs`` control with no ``last``) lists
them all. "Last" is in submit order, the order of every listing: a master knows when a job
finished only for those that finished since it started.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from troupe.runtime.core.control_payloads import ControlPayload
from troupe.runtime.errors import BadRequest

__all__ = ["STATUS_FINISHED_JOBS", "decode_jobs_last", "recent_jobs"]

STATUS_FINISHED_JOBS = 10
"""Finished jobs a ``status`` reply shows, besides every running one."""

T = TypeVar("T")


def recent_jobs(jobs: Sequence[T], running: Callable[[T], bool], last: int) -> tuple[list[T], int]:
    """The running jobs and the ``last`` finished ones submitted last, in their order; and how
    many finished jobs that leaves out."""
    finished = [i for i, job in enumerate(jobs) if not running(job)]
    kept = set(finished[len(finished) - last :]) if last > 0 else set()
    return [job for i, job in enumerate(jobs) if i in kept or running(job)], len(finished) - len(kept)


def decode_jobs_last(payload: Any) -> int | None:
    """``last`` of a ``jobs {last?}`` control: None (every job), or how many finished jobs to show.

    Raises:
        BadRequest: not a map, or ``last`` is not a count.
    """
    last: int | None = ControlPayload("jobs", payload).optional("last", int)
    if last is not None and last < 0:
        raise BadRequest(f"control 'jobs': last must be 0 or more, got {last}")
    return last
