"""The leases a worker holds, and keeping them: the base of the task getter.

:class:`HeldLeases` holds every lease a :class:`~troupe.runtime.tasks.getter.TaskGetter` was
given (waiting in the worker for a slot, running, or being reported) and keeps them: one
``renew`` message renews them all whenever the first is due, a lease ahead that waited
``prefetch_wait_s`` for a slot goes back to the master, and a copy the master ends
(``cancel_lease``, a refused renewal) is stopped, or withdrawn if it never started. The getter
adds the asking, the running and the reporting on top, as
:class:`~troupe.runtime.tasks.book.TaskBook` adds the transitions on top of its tables; the
protocol both follow is told in :mod:`troupe.runtime.tasks.getter`.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections import deque
from typing import Any

import anyio

from troupe.runtime.core.runtime import Runtime
from troupe.runtime.errors import TaskError, TroupeError
from troupe.runtime.library_logging import get_logger

from .getter_config import GetterConfig, GetterStats
from .task_actor import LeasedTask

__all__ = ["HeldLease", "HeldLeases"]

log = get_logger(__name__)


class HeldLease:
    """One held lease: waiting for a slot, running, or reporting; what cancels it while it runs."""

    __slots__ = ("cancel_reason", "ended", "received", "renew_at", "stopper", "task", "ttl")

    def __init__(self, task: LeasedTask, now: float) -> None:
        self.task = task
        # While the runner runs: an asyncio timeout that never fires unless the copy must stop
        # (see _stop). A tenth of the cost of an anyio cancel scope per task.
        self.stopper: asyncio.Timeout | None = None
        self.cancel_reason = ""
        self.received = now
        self.ttl = task.ttl
        self.renew_at = now + _renew_period(task.ttl)
        self.ended = False  # the runner returned: no more renewals, the report is on its way


def _stop(run: HeldLease) -> None:
    """Stop a copy while its runner runs: its timeout fires now, the runner is cancelled and
    the copy ends unreported (no-op once the runner has returned)."""
    stopper = run.stopper
    if stopper is not None and not stopper.expired():
        stopper.reschedule(asyncio.get_running_loop().time())


def _renew_period(ttl: float) -> float:
    return max(ttl / 3.0, 0.01)


_NEVER = float("inf")


class HeldLeases:
    """Every lease one worker holds, renewed together; leases ahead given back when they wait.

    Args:
        runtime: the worker process's runtime (it sends the control messages).
        master: the master's endpoint.
        config: who the worker is and how it asks.
    """

    def __init__(self, runtime: Runtime, master: str, config: GetterConfig) -> None:
        self.runtime = runtime
        self.master = master
        self.config = config
        self.worker_id = config.worker_id
        # Every lease held, by id: waiting in _queue, running (_active of them), or reporting.
        self._held: dict[int, HeldLease] = {}
        self._queue: deque[HeldLease] = deque()
        self._active = 0
        # Leases ahead are asked for only while tasks are short: the last copy to end ran for
        # less than prefetch_wait_s (a longer one means a lease ahead would wait about as long,
        # then be given back), and no lease ahead was given back since it ended.
        self._ahead_ok = True
        self._want = asyncio.Event()  # the worker may ask for more: the getter's request loop wakes
        self._keeper_wake = asyncio.Event()
        self._keeper_until = 0.0  # when the lease keeper looks next, if not woken (monotonic)
        # Waiting leases are looked at this often: one given back has waited between
        # prefetch_wait_s and 1.5 times that, at one wake-up per look, not one per lease.
        self._look_s = config.prefetch_wait_s / 2.0
        self._tg: anyio.abc.TaskGroup | None = None
        self._counts = dict.fromkeys(
            (
                "started",
                "completed",
                "failed",
                "declined",
                "cancelled",
                "registrations",
                "requests",
                "lost_reports",
                "rejected",
                "given_back",
                "withdrawn",
                "renewals",
            ),
            0,
        )

    def cancel(self, lease_id: int, reason: str) -> bool:
        """Stop the copy under ``lease_id``, running or waiting; return whether one was held."""
        run = self._held.get(lease_id)
        if run is None:
            return False
        run.cancel_reason = reason
        if run in self._queue:  # never started: nothing runs, nothing to report
            self._drop_waiting(run, reason)
        else:
            _stop(run)
        return True

    def statistics(self) -> GetterStats:
        """Return a snapshot of the counters."""
        c = self._counts
        return GetterStats(
            self._active,
            c["started"],
            c["completed"],
            c["failed"],
            c["declined"],
            c["cancelled"],
            c["registrations"],
            c["requests"],
            c["lost_reports"],
            len(self._queue),
            c["given_back"],
            c["withdrawn"],
            c["renewals"],
            c["rejected"],
        )

    def _drop_waiting(self, run: HeldLease, reason: str) -> None:
        self._queue.remove(run)
        self._held.pop(run.task.lease_id, None)
        self._counts["withdrawn"] += 1
        log.info("waiting_lease_dropped", task_id=run.task.task_id, lease_id=run.task.lease_id, reason=reason)
        self._want.set()

    def _next_look(self, run: HeldLease, now: float) -> float:
        """When the keeper must look at a lease just received (see _keep_leases)."""
        return min(run.renew_at, now + self._look_s) if self.config.prefetch else run.renew_at

    # ------------------------------------------------------------------ keeping them

    async def _keep_leases(self) -> None:
        """Renew every held lease together, and give back leases ahead that waited too long.

        One renew message covers every lease held (running or waiting) whenever the first of
        them is due (a third of its TTL since it was received or last renewed).
        """
        while True:
            now = time.monotonic()
            for run in [r for r in self._queue if now - r.received >= self.config.prefetch_wait_s]:
                self._give_back(run)
            live = [r for r in self._held.values() if not r.ended]
            if any(r.renew_at <= now for r in live):
                await self._renew(live)
                continue
            until = min((r.renew_at for r in live), default=_NEVER)
            if self._queue or (live and self.config.prefetch):
                # a worker that may hold leases ahead looks every look_s while it holds
                # any, so that a lease ahead arriving does not wake it each time
                until = min(until, now + self._look_s)
            self._keeper_until = until
            if until == _NEVER:  # nothing held: a lease that comes wakes it (see _start)
                self._keeper_wake.clear()
                await self._keeper_wake.wait()
                continue
            self._keeper_wake.clear()
            # a bare loop timer, not a cancel scope: a thousand getters in one process look
            # about once a second each, and a scope that times out costs an exception
            timer = asyncio.get_running_loop().call_later(until - now, self._keeper_wake.set)
            try:
                await self._keeper_wake.wait()
            finally:
                timer.cancel()

    async def _renew(self, runs: list[HeldLease]) -> None:
        now = time.monotonic()
        for run in runs:  # answered or not, the next try is a period away
            run.renew_at = now + _renew_period(run.ttl)
        first, *more = runs
        payload: dict[str, Any] = {
            "worker_id": self.worker_id,
            "task_id": first.task.task_id,
            "lease_id": first.task.lease_id,
            "node": self.config.node_id,  # a restarted master requeues what it names if the node dies
            "pid": os.getpid(),  # ... or if another process registers under this worker's name
        }
        if more:
            payload["more"] = [[r.task.task_id, r.task.lease_id] for r in more]
        self._counts["renewals"] += 1
        registrations = self._counts["registrations"]
        try:
            reply = await self.runtime.control(
                self.master, "renew", payload, timeout=self.config.call_timeout_s
            )
        except TaskError as exc:  # unknown worker included: the leases are gone either way
            reply = {
                "outcome": "rejected",
                "reason": str(exc),
                "more": [
                    {"lease_id": r.task.lease_id, "outcome": "rejected", "reason": str(exc)} for r in more
                ],
            }
        except TroupeError as exc:  # down, restarting, or a passing fault: try next period
            log.info("renew_failed", error=str(exc))
            return
        if reply.get("known") is False and registrations == self._counts["registrations"]:
            # the master restarted and renewed what it held over for this worker: register
            # again (not when a registration came between: it may have passed this renew)
            self._forgotten()
        answers = {first.task.lease_id: reply}
        for answer in reply.get("more", ()):
            if isinstance(answer, dict) and type(answer.get("lease_id")) is int:
                answers[answer["lease_id"]] = answer
        for run in runs:
            answer = answers.get(run.task.lease_id)
            if answer is None or run.task.lease_id not in self._held:
                continue  # not answered (try next period), or ended meanwhile
            if answer.get("outcome") != "renewed":
                reason = f"renewal refused: {answer.get('reason', answer)}"
                run.cancel_reason = reason
                if run in self._queue:
                    self._drop_waiting(run, reason)
                elif not run.ended:
                    _stop(run)
                continue
            run.ttl = float(answer.get("ttl", run.ttl))
            run.renew_at = time.monotonic() + _renew_period(run.ttl)

    def _forgotten(self) -> None:
        """The master does not know this worker (it restarted): the getter registers again."""

    def _give_back(self, run: HeldLease) -> None:
        """Return a lease ahead that waited ``prefetch_wait_s``: another worker may run it now."""
        assert self._tg is not None
        self._queue.remove(run)
        run.ended = True
        self._ahead_ok = False
        self._counts["given_back"] += 1
        log.info(
            "prefetched_lease_given_back",
            task_id=run.task.task_id,
            lease_id=run.task.lease_id,
            waited_s=round(time.monotonic() - run.received, 3),
        )
        self._tg.start_soon(self._return_lease, run)

    async def _return_lease(self, run: HeldLease) -> None:
        task = run.task
        payload = {
            "worker_id": self.worker_id,
            "task_id": task.task_id,
            "lease_id": task.lease_id,
            "reason": f"waited {self.config.prefetch_wait_s}s in the worker for a slot",
            "given_back": True,
            "request": 0,
        }
        try:
            # one try: a lease the master never hears of expires there and is leased again
            await self.runtime.control(self.master, "decline", payload, timeout=self.config.call_timeout_s)
        except TroupeError as exc:
            log.info("give_back_failed", task_id=task.task_id, error=str(exc))
        finally:
            self._held.pop(task.lease_id, None)
            self._want.set()
