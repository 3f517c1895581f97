"""A new replica's first answer (``stage_info``): asked until its name resolves to the process
that answers.

On a cluster the engine resolves a replica's name through the master's directory, which a
node of an older troupe tells of a worker it started only with its next beat (a second later),
so a name not known yet is asked for again for :data:`KNOWN_S`. Until that beat the directory
may also still hold the endpoint of the process that had the name before (a replica of a
killed run that the node stopped to start this one): an ask sent there waits for an answer
that never comes. It was one ask of 60 s, and a rerun after a killed run on such a node sat
that minute out, then tried the start again. The first ask now waits :data:`TRY_S`, the name's
cached endpoint is dropped, and it is resolved again, for :data:`ANSWER_S` in all: a replica
that registered answers ``stage_info`` at once.

Each ask after a miss waits twice the last: an ask that times out drops its connection, and
the next opens a new one, whose handshakes (TCP's and, with keys, CURVE's: five round trips)
come before the ask is even read. Over a link of a second's round trip they take about seven
seconds, and asks of 5 s each, each on a new connection, never got an answer: the replica of a
cluster run's finalize never came up, and the run failed after every item was done.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import anyio

from troupe.runtime.core.ref import ActorRef
from troupe.runtime.errors import AskTimeout, UnknownActor

__all__ = ["ANSWER_S", "KNOWN_S", "TRY_S", "stage_info"]

KNOWN_S = 10.0  # a cluster's directory learns of a worker an older node started with its next beat
TRY_S = 5.0  # a replica that registered answers at once; past this, its name may be stale
ANSWER_S = 60.0  # in all, as the single ask waited before
_clock = time.monotonic  # a test's slow link moves its own


async def stage_info(
    ref: ActorRef, forget: Callable[[], object], try_s: float = TRY_S, *, stage: str = ""
) -> Any:
    """``ref``'s answer to ``stage_info``, which tells the replica its ``stage``'s name (what an
    item's error names); ``forget`` drops the endpoints cached for the replica's process
    (``Directory.forget_process``), so that the next ask resolves it anew.
    The first ask waits ``try_s``, each after a miss twice the last (within :data:`ANSWER_S`).

    Raises:
        UnknownActor: the name was still unknown after :data:`KNOWN_S`.
        AskTimeout: no answer came in :data:`ANSWER_S`.
    """
    now = _clock()
    known_by, answered_by = now + KNOWN_S, now + ANSWER_S
    wait_s = try_s
    while True:
        try:
            return await ref.ask("stage_info", {"stage": stage}, timeout=wait_s)
        except UnknownActor:
            if _clock() >= known_by:
                raise
            await anyio.sleep(0.1)
        except AskTimeout:
            left = answered_by - _clock()
            if left <= 0:
                raise
            forget()  # resolved again at the next ask
            # Long enough, in a try or two, for a new connection's handshakes over a slow link.
            wait_s = max(try_s, min(2 * wait_s, left))
