"""A replica's answer to a batch in parts: the outcomes that fit one reply to the engine, and the
rest kept here until the engine asks for them (``process_rest``).

A batch's outcomes go back to the engine inline, in the reply to its call (``process``, or
``process_direct`` for a stage's outputs under ``inline_below`` and a last stage's). Outcomes that
each fit the message bound but together passed it failed the whole batch: the reply could not be
encoded, and every item of it was retried (made again, a last stage's committed again), then dead.
Where the engine says what it receives whole with its call (``budget``, ``frames``: its message
bound and ``max_frames``), a reply that would pass it holds the outcomes that fit, in order, and
names each other one ``{"later": key}``, kept here; the engine asks for those with
``process_rest`` until each arrived once, and each is forgotten here as it goes. An outcome that
alone passes the bound is that item's error. An older engine, which says no budget and reads no
``later``, is answered whole, as before.

A reply is weighed only where it may not fit: where it failed to encode under this process's own
limits (``StageActor.reply_instead``, only then), or where the engine receives less than this
process's codec lets go (a smaller bound or fewer frames), which that codec cannot see.
"""

from __future__ import annotations

import itertools
from typing import Any

from troupe.runtime.errors import ProtocolError
from troupe.runtime.wire.codec import Codec

from .handoff import (
    TAKE_HEADROOM,
    ReplyLimits,
    encoded_size,
    refused_output,
    reply_envelope,
    too_large_output,
    too_many_frames,
)

__all__ = ["ENGINE", "LATER_SLOT", "RAISE_ENGINE_BOUND", "SEND_FEWER_TO_ENGINE", "OutcomeParts"]

ENGINE = "the engine's"
"""Whose limits an engine's call says (``ReplyLimits.whose``), as an item's error names them."""

RAISE_ENGINE_BOUND = (
    "raise max_message_mb ([pipeline] of the pipeline's config, which the engine's process takes too)"
)
"""How an item's error says to raise the engine's message bound."""

SEND_FEWER_TO_ENGINE = (
    "keep what the engine takes inline (a last stage's outputs; every stage's on "
    'data_plane = "engine") within it, since no option raises the engine\'s,'
)
"""How an item's error says to keep within the engine's ``max_frames`` (no option raises it)."""

LATER_SLOT = 32
"""Bytes an outcome named for later takes in a batch's reply (``{"later": key}``, a key of at most
20 digits): kept for each outcome of the batch, since any of them may be."""


class OutcomeParts:
    """The outcomes a replica keeps for the engine's ``process_rest``, by key, each with what it
    encodes to (bytes, buffer frames)."""

    def __init__(self) -> None:
        self._kept: dict[str, tuple[dict[str, Any], int, int]] = {}
        self._keys = itertools.count()

    def __len__(self) -> int:
        return len(self._kept)

    def fit(
        self, codec: Codec, outcomes: list[dict[str, Any]], limits: ReplyLimits, where: str
    ) -> list[dict[str, Any]]:
        """``outcomes`` as one reply under ``limits`` holds them, in order: each encoded alone,
        one ``codec`` refuses, or that alone passes ``limits``, made that item's error (naming
        ``where`` its output was made: ``stage a``); those that fit together as they are, and
        each other one ``{"later": key}``, kept here. The first that fits always stays, so each
        reply answers one at least."""
        envelope = reply_envelope(codec)
        # Including an outcome costs its size less the slot it would take as ``later``; one
        # alone in the reply, every other one ``later``, has the room the first one has.
        free = limits.bound - TAKE_HEADROOM - LATER_SLOT * len(outcomes)
        alone = free + LATER_SLOT
        answered: list[dict[str, Any]] = []
        buffers = 0
        for outcome in outcomes:
            outcome, size, frames = _weighed(codec, outcome, envelope, limits, alone, where)
            if size - LATER_SLOT <= free and buffers + frames < limits.frames:
                answered.append(outcome)
                free -= size - LATER_SLOT
                buffers += frames
            else:
                key = str(next(self._keys))
                self._kept[key] = (outcome, size, frames)
                answered.append({"later": key})
        return answered

    def rest(self, keys: list[str], limits: ReplyLimits) -> dict[str, Any]:
        """The answer to ``process_rest``: the kept outcomes of ``keys`` that fit one reply under
        ``limits``, forgotten here as they go, and the others, still kept, under ``later``; a
        key not kept (answered already) is in neither. The first kept always goes (it fitted a
        reply alone when it was kept)."""
        room = limits.bound - TAKE_HEADROOM - LATER_SLOT * len(keys)
        outcomes: dict[str, Any] = {}
        later: list[str] = []
        used = buffers = 0
        for key in dict.fromkeys(keys):
            kept = self._kept.get(key)
            if kept is None:
                continue
            _, size, frames = kept
            if outcomes and (used + size > room or buffers + frames >= limits.frames):
                later.append(key)
                continue
            outcomes[key] = self._kept.pop(key)[0]
            used += size
            buffers += frames
        return {"outcomes": outcomes, "later": later} if later else {"outcomes": outcomes}


def _weighed(
    codec: Codec, outcome: dict[str, Any], envelope: int, limits: ReplyLimits, room: int, where: str
) -> tuple[dict[str, Any], int, int]:
    """``outcome`` (or, where its output cannot travel in ``room`` bytes and ``limits``' frames,
    that item's error instead) with what it encodes to: bytes and buffer frames."""
    # The engine's bound is the pipeline's max_message_mb (the default where it sets none); its
    # max_frames no option raises.
    raise_it = RAISE_ENGINE_BOUND if limits.whose == ENGINE else None
    try:
        size, frames = encoded_size(codec, outcome, envelope)
    except ProtocolError as exc:
        output = outcome.get("ok", outcome)
        error = refused_output(codec, where, exc, output, limits.bound, limits.whose, raise_it)
    else:
        if size <= room and frames < limits.frames:
            return outcome, size, frames
        if size > room:
            error = too_large_output(where, size, limits.bound, limits.whose, raise_it)
        else:
            send_fewer = SEND_FEWER_TO_ENGINE if limits.frames_whose == ENGINE else None
            error = too_many_frames(where, frames, limits.frames, limits.frames_whose, send_fewer)
    failed = {"error": error, "traceback": ""}
    return failed, *encoded_size(codec, failed, envelope)
