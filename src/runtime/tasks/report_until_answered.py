"""A lease's report to the master (``complete``, ``fail``, ``decline``), sent until a master
answers it: the workers' getter sends each of its reports so, and so does a pipeline run's
source of a cluster's job (``pipeline/source.py``), which sent each once and lost one sent while
the master was down (its item ran again once the lease ran out: report pl 3).

A master that does not answer (down, restarting) is sent the report again, however long it is
away: the one restarted on its journal holds the lease over for its holder, takes the report, and
the task runs once (report jx 3; ``report_for_s`` bounds it where set: a report dropped leaves
the lease to run out there, and the task to run again). So is one that answers with a
``JournalError``: its journal failed to keep the batch that held the call and it is stopping, and
the master restarted on that journal takes the report sent again (a complete sent as a fail
instead cost a task an attempt, its last one dead-lettered with its output committed: report
jx 1). A master that forgot the sender (``unknown_worker``: it restarted) has the sender say
what that means to it (register again), and is sent the report again. A ``complete`` the master
refuses (a result reference that is not a str), or that the sender's codec cannot send, is sent
again as a ``fail`` carrying the refusal, worded as the master's or as the sender's own: the
attempt fails at once, instead of holding the task until its lease expired and blaming the
lease. Any other refusal is final: sending it again changes nothing.

A master away is said in the log (``report_failed``) at the first try it did not answer, then at
most every :data:`SAY_EVERY_S` with the tries so far, and the report's landing once after that
(``report_landed``): said at each try (every ``retry_s``, half a second), an outage of an hour
was seven thousand lines a report.
"""

from __future__ import annotations

import math
import time
from collections.abc import Awaitable, Callable
from typing import Any

import anyio

from troupe.runtime.core.runtime import Runtime
from troupe.runtime.errors import (
    ActorStopped,
    AskTimeout,
    JournalError,
    TroupeError,
    UnknownWorker,
    Unreachable,
)
from troupe.runtime.library_logging import get_logger

__all__ = ["SAY_EVERY_S", "TRANSIENT", "report_until_answered"]

log = get_logger(__name__)

# The master is down, restarting, or stopping after its journal failed (see the docstring).
TRANSIENT = (AskTimeout, Unreachable, ActorStopped, JournalError)
SAY_EVERY_S = 30.0  # the least time between two lines of one report's tries that failed

Payload = dict[str, Any]


def _as_is(payload: Payload) -> None:
    """Nothing to change before a report is sent (again)."""


def _heard(payload: Payload, exc: TroupeError) -> None:
    """Nothing to do when the master did not answer but the log line."""


async def report_until_answered(
    runtime: Runtime,
    master: str,
    kind: str,
    payload: Payload,
    *,
    timeout: float,
    retry_s: float,
    forgotten: Callable[[Payload], Awaitable[None]],
    ids: dict[str, Any],
    report_for_s: float | None = None,
    before: Callable[[Payload], None] = _as_is,
    unanswered: Callable[[Payload, TroupeError], None] = _heard,
) -> tuple[str, Any] | None:
    """Send report ``kind`` with ``payload`` to ``master`` until it answers.

    Args:
        timeout: how long each try waits for the answer.
        retry_s: the pause between tries the master did not answer.
        forgotten: awaited when the master does not know the sender (``unknown_worker``),
            before the report is sent again.
        ids: the report's task and lease, for the log.
        report_for_s: give the report up after this long (None: never).
        before: called with the payload before each try (the sender's request for work).
        unanswered: called after each try the master did not answer.

    Returns:
        The kind of report the master answered (``fail`` for a ``complete`` it refused) and its
        answer; None where the report was given up (refused, or past ``report_for_s``).
    """
    began = time.monotonic()
    deadline = None if report_for_s is None else began + report_for_s
    failed = 0  # tries the master did not answer
    said = -math.inf  # when they were last said
    while True:
        before(payload)
        try:
            reply = await runtime.control(master, kind, payload, timeout=timeout)
        except UnknownWorker:
            await forgotten(payload)
        except TRANSIENT as exc:
            failed += 1
            if time.monotonic() - said >= SAY_EVERY_S:
                said = time.monotonic()
                log.info("report_failed", report=kind, error=str(exc), tries=failed, **ids)
            unanswered(payload, exc)
        except TroupeError as exc:  # refused outright: sending it again changes nothing
            log.warning("report_refused", report=kind, error=str(exc), **ids)
            if kind != "complete":
                return None
            kind, payload = "fail", _refused_as_fail(payload, exc)
            continue
        else:
            if failed:
                waited = round(time.monotonic() - began, 3)
                log.info("report_landed", report=kind, tries_failed=failed, after_s=waited, **ids)
            return kind, reply
        if deadline is not None and time.monotonic() >= deadline:
            log.warning("report_dropped", report=kind, after_s=report_for_s, **ids)
            return None
        await anyio.sleep(retry_s)


def _refused_as_fail(payload: Payload, refusal: TroupeError) -> Payload:
    """The ``fail`` report that stands for a ``complete`` refused: by the master, or by the
    sender's own codec before anything was sent (its result reference has no encoding, or is
    over the message bound), which was worded as the master's refusal (report px 7)."""
    kept = {k: v for k, v in payload.items() if k not in ("result_ref", "run_s")}
    who = "the master refused this attempt's" if refusal.from_reply else "this worker could not send its"
    error = f"{who} complete report: {type(refusal).__name__}: {refusal}"
    return {**kept, "error": error, "traceback": ""}
