"""A batch weighed against what its replica receives whole, before the engine sends it.

The engine sends a stage's items inline in its call (``process``; on the direct data plane
those under ``inline_below``, beside where held inputs are). Its own codec lets a call go up to
this process's limits, but a replica receives up to its own: a replica whose message bound, or
``max_frames``, is less than the engine's (its node's ``max_message_mb`` under the default
64 MiB, a node's smaller ``max_frames``) refused a call that passed them on receipt, unread (a
frame over its bound drops the connection), and the call waited out its timeout (600 s), its
items then retried into the same refusal. A replica says what it receives whole as it starts
(``stage_info``: ``budget``, ``frames``, as a take and a call say theirs); where that is less
than this process's codec lets go, the engine weighs each item of a batch by what it encodes
to, sends those that fit one call, in order, and puts the others back at the front of the
stage's queue, no attempt counted (the next call takes them). An item that alone cannot fit is
its error, naming both bounds, retried as any (another replica may receive more). A replica
that says nothing (an older one) is sent what the engine's codec lets go, as before.

A batch whose items each fit but together pass the engine's own limits (its bound is the
pipeline's ``max_message_mb``, the replicas' too) is split the same way, under those limits: its
call failed to encode, and every item of it failed. It is weighed only where it may not fit:
where the items' weights (``payload_weight``) near the bound, or where the call failed to
encode; a call well within it is encoded once. An item that alone cannot fit is then said as
every output over the engine's bound is (``too_large_output``), naming the stage that made it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from troupe.runtime.errors import ProtocolError
from troupe.runtime.wire.codec import Codec

from .handoff import (
    TAKE_HEADROOM,
    encoded_size,
    reply_envelope,
    too_large_output,
    too_many_frames,
    unsendable_output,
)
from .outcome_parts import ENGINE, RAISE_ENGINE_BOUND, SEND_FEWER_TO_ENGINE

__all__ = ["CALL_HEADROOM", "CallLimits", "fit_call", "said_receives"]

CALL_HEADROOM = TAKE_HEADROOM
"""Bytes of a call kept for what surrounds its items: the envelope (the engine's process name,
the ids, the deadline) and the payload's other keys (``inline_below``, ``budget``, ``frames``)."""

_RAISE_BOUND = "raise max_message_mb ([pipeline] of the pipeline's config, or [node] of the replica's node's)"
_NO_LIMIT = 1 << 62  # bytes and frames of the codec an item is weighed by: what it encodes to, whole


def said_receives(info: Any) -> tuple[int, int] | None:
    """What a replica's ``stage_info`` answer says it receives whole: its message bound in
    bytes and its ``max_frames``; None where it says none (an older replica)."""
    budget = info.get("budget") if isinstance(info, dict) else None
    frames = info.get("frames") if isinstance(info, dict) else None
    if type(budget) is not int or budget <= 0 or type(frames) is not int or frames <= 0:
        return None
    return budget, frames


@dataclass(frozen=True)
class CallLimits:
    """What one call to a replica must fit, each the smaller of what the replica receives whole
    and what the engine's ``codec`` lets go (``bound`` bytes, ``frames``), and how an item that
    alone cannot fit them is said: naming both where the replica's is the smaller, else as every
    output over the engine's limits is, naming the stage that ``made`` it. ``where``: the stage
    called."""

    codec: Codec
    bound: int
    frames: int
    where: str
    made: str

    @classmethod
    def of(cls, codec: Codec, receives: tuple[int, int] | None, where: str, made: str) -> CallLimits:
        """The limits of a call to a replica that said it receives ``receives`` whole (None: it
        said nothing, an older one: the engine's own)."""
        bound, frames = receives or (codec.max_message_bytes, codec.max_frames)
        return cls(codec, min(bound, codec.max_message_bytes), min(frames, codec.max_frames), where, made)

    def below_codec(self) -> bool:
        """The replica receives less than the engine's codec lets go: a call that codec encodes
        the replica may refuse on receipt, unread."""
        return self.bound < self.codec.max_message_bytes or self.frames < self.codec.max_frames

    def too_large(self, size: int) -> str:
        """The error of an item whose input encodes to ``size`` bytes, more than a call holds."""
        if self.bound < self.codec.max_message_bytes:
            return too_large_input(self.where, size, self.bound, self.codec.max_message_bytes)
        return too_large_output(self.made, size, self.bound, ENGINE, RAISE_ENGINE_BOUND)

    def too_many(self, arrays: int) -> str:
        """The error of an item whose input is ``arrays`` buffer frames, more than a call holds."""
        if self.frames < self.codec.max_frames:
            return too_many_input_frames(self.where, arrays, self.frames, self.codec.max_frames)
        return too_many_frames(self.made, arrays, self.frames, ENGINE, SEND_FEWER_TO_ENGINE)

    def unsendable(self, exc: ProtocolError) -> str:
        """The error of an item whose input has no encoding (``exc``, the codec's refusal)."""
        return unsendable_output(self.made, exc)


def fit_call(entries: list[Any], limits: CallLimits) -> tuple[int, dict[int, str]]:
    """How many of a batch's first items one call holds under ``limits``, and the error of each
    of those that alone cannot fit.

    ``entries``: what each item adds to the call (its inline value, and on the direct plane
    where its held input is and the key its output is held under), weighed by what it encodes
    to. Items are taken in order until one does not fit beside those before
    it: it and those after it are left for another call. The first that fits always goes, so
    that each call takes one item at least.
    """
    # Weighed under no limits: one past them alone is said in the words of whose limit it
    # passes (the codec's own refusal names a node option that does not raise the engine's).
    codec = Codec(_NO_LIMIT, _NO_LIMIT)
    envelope = reply_envelope(codec)
    room = limits.bound - CALL_HEADROOM
    refused: dict[int, str] = {}
    used = buffers = 0
    for i, entry in enumerate(entries):
        try:
            size, arrays = encoded_size(codec, entry, envelope)
        except ProtocolError as exc:  # a value with no encoding
            refused[i] = limits.unsendable(exc)
            continue
        if size > room:
            refused[i] = limits.too_large(size)
        elif arrays >= limits.frames:
            refused[i] = limits.too_many(arrays)
        elif used + size > room or buffers + arrays >= limits.frames:
            return i, refused
        else:
            used += size
            buffers += arrays
    return len(entries), refused


def too_large_input(where: str, size: int, bound: int, engine_bound: int) -> str:
    """The error of an item whose input, ``size`` bytes encoded, leaves no room in a call to
    a replica of message bound ``bound`` (the engine's: ``engine_bound``)."""
    return (
        f"MessageTooLarge: {where}: an input of {size} bytes does not fit one call to its replica: "
        f"the replica's message bound is {bound} bytes (the engine's {engine_bound}), less "
        f"{CALL_HEADROOM} for the call around it; {_RAISE_BOUND} or send the data by reference"
    )


def too_many_input_frames(where: str, arrays: int, frames: int, engine_frames: int) -> str:
    """The error of an item whose input, ``arrays`` buffer frames (arrays, tensors), needs more
    frames than a call to a replica of ``frames`` may have (the engine's: ``engine_frames``)."""
    return (
        f"MessageTooLarge: {where}: an input of {arrays} arrays does not fit one call to its "
        f"replica: the replica's max_frames is {frames} (the engine's {engine_frames}; the header "
        "and one frame per array or tensor); raise max_frames ([node] of the replica's node's) or "
        "send fewer, larger arrays"
    )
