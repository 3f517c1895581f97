"""The moment a run may first have made something in its folder, told before it comes.

A run's folder records the troupe code that made what it holds (``made_by``, ``run_code.py``).
Recorded as the run was planned, a run under other code that was stopped before it made
anything still stood there, and every later run said the folder "mixes both" (report rg 6):
the one line that matters, false for ever. The code is recorded now as the run may first make
something: before it first hands an item to a stage that ends the pipeline (the last: its
answer settles the item, so it is the stage that commits an item's output, as the dataset
writer does), and before it calls the first ``finalize`` hook (the dataset's files). Before, not
after: a stopped run's last stage finishes what it was handed (the writer commits the episodes
it holds as its replica stops), and a SIGKILL right after a commit must find the code recorded.
A run SIGKILLed between the record and its first commit is recorded having made nothing: the
safe side, as a commit may have come.

:class:`FirstOutput` calls the run's ``on_making`` once, and every call of the engine that may
make something waits for it to have returned.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import anyio

__all__ = ["FirstOutput"]


class FirstOutput:
    """Calls ``on_making`` once, the first time the run may make something; later callers wait
    until it returned.

    Args:
        on_making: what the run does before it may first make something (records its code:
            ``RunDir.note_code``); None where there is nothing to do (no ``out``).
    """

    def __init__(self, on_making: Callable[[], Awaitable[None]] | None) -> None:
        self.on_making = on_making
        self._begun = False
        self._told = anyio.Event()

    async def coming(self) -> None:
        """Return once ``on_making`` has returned (called now where it was not yet). The first
        caller goes on without yielding to the others, so that the calls keep their order (and
        where there is no ``on_making``, none yields at all). Where it raised, those that waited
        on it wait on until the run's failure cancels them."""
        if self._told.is_set():
            return
        if self._begun:
            await self._told.wait()
            return
        self._begun = True
        if self.on_making is not None:
            await self.on_making()
        self._told.set()
