"""The direct data plane: a stage's outputs go from replica to replica, not through the engine.

A replica whose stage feeds another keeps each output it makes (``HeldOutputs``) and answers the
engine with its size only (``{"held": key, "bytes": n}``). The engine queues that handle for the
next stage, and the replica it picks there fetches the payload itself, with one ``stage_take``
ask per holder (``pull_inputs``): the frames go mailbox to mailbox, zero-copy as any message,
and the engine sees ids, sizes, timings and outcomes. The holder keeps the output until the
engine says the item is settled downstream (``stage_release``), so a downstream failure retries
from the same output; a holder that is gone (its node died) makes the item ``lost``, and the
engine runs it again from the first stage. An output that cannot be encoded fails its item
alone: refused before it is held (``payload_weight`` finds what may not encode), or, where the
walk vouched for it, answered under ``refused`` when taken (``Outbox.reply_instead``).

A take's reply is one message, under the message bound: the holder answers the outputs that fit
it (by the sizes it weighed as it held them) and names the rest under ``later``, still held, and
the taker asks again for those until each arrived once. Outputs that each fit the bound but
together passed it failed their whole take. The taker says what it receives whole with each take
(its message bound and its ``max_frames``); to a taker that receives less than the holder, the
holder answers by what the outputs encode to, which its own codec would have let go.

Small outputs (under ``inline_below`` bytes, counted by :func:`payload_bytes`) still travel
inline through the engine: an extra round trip would cost them more than their bytes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import anyio

from troupe.runtime.core.actor import Actor, handles
from troupe.runtime.errors import AskTimeout, DeliveryError, MessageTooLarge, ProtocolError, TroupeError
from troupe.runtime.wire.codec import Codec

__all__ = [
    "GONE",
    "HELD",
    "INLINE_BELOW",
    "OUTBOX_CLASS",
    "PULLS",
    "PULL_TIMEOUT_S",
    "TAKE_HEADROOM",
    "HeldOutputs",
    "Outbox",
    "ReplyLimits",
    "encoded_size",
    "outcome_lost",
    "payload_bytes",
    "payload_weight",
    "pull_inputs",
    "refused_output",
    "reply_envelope",
    "too_large_output",
    "too_many_frames",
    "unsendable_output",
]

INLINE_BELOW = 4096
"""Outputs smaller than this (bytes) go inline through the engine by default."""

PULL_TIMEOUT_S = 60.0
"""How long a replica waits for a holder to hand over a batch's inputs: a few large frames take
a second; a holder whose node died never answers (its items then run again)."""

TAKE_HEADROOM = 1024
"""Bytes of a take's reply kept for what surrounds its outputs: the envelope (the holder's
process name, at most 201 characters, and the ids) and the reply's maps. Each key the take
names, and each refusal's text, is counted besides (``_room``)."""

_STR_HEADER = 5  # msgpack's largest str header
_SCALAR_BYTES = 9  # msgpack's largest fixed-size scalar
_INT_LOWEST, _INT_HIGHEST = -(2**63), 2**64 - 1  # the ints msgpack holds


def payload_bytes(obj: Any) -> int:
    """About what ``obj`` weighs on the wire: buffers (arrays, tensors, bytes) by their size,
    strings by their length, containers by their contents."""
    return payload_weight(obj)[0]


def payload_weight(obj: Any) -> tuple[int, bool]:
    """What ``obj`` weighs on the wire (as :func:`payload_bytes` counts it), and whether it may
    not encode: it holds a value of a type that does not always encode (a set, an object, an int
    past 64 bits) or a container twice (shared, or holding itself: each is walked once, so that
    the walk ends). A replica encodes such an output before it holds it, and the codec decides;
    an output of maps, lists, str, bytes, numbers, arrays and tensors is walked once, as its size
    needs anyway, and not encoded until the next stage takes it. A value whose ``nbytes`` raises
    (a sparse torch tensor's) is doubtful too, rather than the whole batch's error."""
    total = 0
    doubtful = False
    seen: set[int] = set()
    stack = [obj]
    while stack:
        o = stack.pop()
        kind = type(o)
        # The common types by identity first: a getattr that misses costs more than the rest.
        if kind is str or kind is bytes:
            total += len(o)
            continue
        if kind is float or kind is bool or o is None:
            total += _SCALAR_BYTES
            continue
        if kind is int:
            total += _SCALAR_BYTES
            doubtful = doubtful or not _INT_LOWEST <= o <= _INT_HIGHEST
            continue
        if kind is not dict and kind is not list and kind is not tuple:
            try:
                nbytes = getattr(o, "nbytes", None)  # arrays, tensors, numpy scalars
            except Exception:  # a sparse tensor's raises RuntimeError: the codec decides
                total += _SCALAR_BYTES
                doubtful = True
                continue
            if isinstance(nbytes, int):
                total += nbytes
                continue
            if isinstance(o, (bytes, bytearray, str)):
                total += len(o)
                continue
            if not isinstance(o, (dict, list, tuple)):  # a set, an object, an int subclass
                total += _SCALAR_BYTES
                doubtful = True
                continue
        if id(o) in seen:
            doubtful = True
            continue
        seen.add(id(o))
        if isinstance(o, dict):
            stack.extend(o.keys())
            stack.extend(o.values())
        else:
            stack.extend(o)
    return total, doubtful


def outcome_lost(why: str) -> dict[str, Any]:
    """The item's input is gone with its holder: it must run again from the first stage."""
    return {"lost": why}


def unsendable_output(where: str, exc: ProtocolError) -> str:
    """The error of an item whose output cannot travel: ``where`` it was made (``stage a``) and
    the codec's refusal (``exc``), with what does travel (a refusal by size says what to do)."""
    said = f"{type(exc).__name__}: {where}: process returned an output that cannot be sent: {exc}"
    if isinstance(exc, MessageTooLarge):
        return said
    return f"{said} (return maps, lists, str, numbers, bytes, None, numpy arrays or torch tensors)"


def refused_output(
    codec: Codec,
    where: str,
    exc: ProtocolError,
    output: Any,
    bound: int,
    whose: str,
    raise_it: str | None = None,
) -> str:
    """The error of an item whose ``output`` ``codec`` refused to encode (``exc``): one over
    ``bound`` (``whose``, ``raise_it``: as ``too_large_output`` takes them) said as every output
    that does not fit one message is, any other refusal by ``unsendable_output``. The codec's
    refusal by size names the whole reply's bytes and limit, a third wording for one case: an
    output a few bytes under the bound, or at it, was refused in other words than one over it.
    Its size is what ``payload_bytes`` counts where that passes the bound already (an output of
    large buffers, whose encoding only adds its keys: not encoded again), else what it encodes
    to under no bound (many short values: the count misjudges them)."""
    if not isinstance(exc, MessageTooLarge):
        return unsendable_output(where, exc)
    size = payload_bytes(output)
    if size <= bound - TAKE_HEADROOM:
        try:
            size = encoded_size(Codec(_NO_BOUND, codec.max_frames), output, reply_envelope(codec))[0]
        except ProtocolError:  # over its frames, not its bytes: the codec says so
            return unsendable_output(where, exc)
    return too_large_output(where, size, bound, whose, raise_it)


_NO_BOUND = 1 << 62  # a codec's bound that no output reaches: what it encodes to, measured
_RAISE_BOUND = "raise max_message_mb ([pipeline] of the pipeline's config, or [node] of the nodes')"
_RAISE_FRAMES = "raise max_frames ([node] of the nodes')"


def too_large_output(where: str, size: int, bound: int, whose: str, raise_it: str | None = None) -> str:
    """The error of an item whose output, ``size`` bytes (encoded, or as ``refused_output``
    counts one the codec refused by size), leaves no room in a reply
    under the message ``bound`` (``whose``: ``the`` replica's own, or its asker's: ``the taking
    replica's``, ``the engine's``) for what surrounds it (``TAKE_HEADROOM``); ``raise_it``: how
    to raise that bound (None: max_message_mb)."""
    return (
        f"MessageTooLarge: {where}: process returned an output of {size} bytes, which does not fit "
        f"one message: {whose} message bound is {bound} bytes, less {TAKE_HEADROOM} for the reply "
        f"around it; {raise_it or _RAISE_BOUND} or send the data by reference"
    )


def too_many_frames(where: str, arrays: int, frames: int, whose: str, raise_it: str | None = None) -> str:
    """The error of an item whose output, ``arrays`` buffer frames (arrays, tensors), needs more
    frames than a message to its asker may have (``frames``, ``whose``: the taking replica's,
    the engine's); ``raise_it``: how to raise that limit (None: max_frames)."""
    return (
        f"MessageTooLarge: {where}: process returned an output of {arrays} arrays, which do not fit "
        f"one message: {whose} max_frames is {frames} (the header and one frame per array or "
        f"tensor); {raise_it or _RAISE_FRAMES} or send fewer, larger arrays"
    )


class ReplyLimits(NamedTuple):
    """What a reply must fit for its asker to receive it whole: the message bound in bytes and
    the frames, each the smaller of the asker's (as its ask said them) and this process's, and
    whose each is (``the``, or the asker's: ``the taking replica's``), as an item's error names
    it."""

    bound: int
    whose: str
    frames: int
    frames_whose: str

    @classmethod
    def said(cls, payload: Any, codec: Codec, asker: str) -> ReplyLimits | None:
        """The limits an ask's ``payload`` says its asker receives whole: ``budget`` (bytes), and
        ``frames`` (this process's where it says none, as an earlier troupe's asker), ``asker``
        naming whose they are. None where it says no budget: an older asker, which reads no
        ``later``."""
        budget = payload.get("budget") if isinstance(payload, dict) else None
        if type(budget) is not int or budget <= 0:
            return None
        frames = payload.get("frames")
        if type(frames) is not int or frames <= 0:
            frames = codec.max_frames
        own_bound, own_frames = codec.max_message_bytes, codec.max_frames
        return cls(
            *((budget, asker) if budget < own_bound else (own_bound, "the")),
            *((frames, asker) if frames < own_frames else (own_frames, "the")),
        )

    def tighter(self, codec: Codec) -> bool:
        """The asker receives less than ``codec`` lets go: a reply that ``codec`` encodes the
        asker may refuse on receipt, unread."""
        return self.bound < codec.max_message_bytes or self.frames < codec.max_frames


def reply_envelope(codec: Codec) -> int:
    """The bytes a reply's envelope adds to its payload's (``encoded_size`` subtracts them)."""
    return len(codec.encode_reply(0, "", None)[0]) - 1  # a payload of None encodes to 1 byte


def encoded_size(codec: Codec, value: Any, envelope: int) -> tuple[int, int]:
    """What ``value`` encodes to as a reply's payload: its bytes (less ``envelope``, from
    ``reply_envelope``) and its buffer frames (arrays, tensors).

    Raises:
        ProtocolError: ``codec`` refuses it (a value with no encoding, past its limits alone).
    """
    frames = codec.encode_reply(0, "", value)
    return sum(memoryview(frame).nbytes for frame in frames) - envelope, len(frames) - 1


def _room(bound: int, keys: list[str]) -> int:
    """What the outputs of a take's reply under ``bound`` may weigh together: the bound less
    ``TAKE_HEADROOM`` and each key the take names (each is answered once: an output, a refusal,
    or ``later``)."""
    return bound - TAKE_HEADROOM - sum(map(len, map(str.encode, keys))) - _STR_HEADER * len(keys)


def _refusals_bytes(refused: dict[str, str]) -> int:
    return sum(len(text.encode()) + _STR_HEADER for text in refused.values())


class HeldOutputs:
    """The outputs a replica keeps for the next stage, by key, until released."""

    def __init__(self) -> None:
        self._items: dict[str, tuple[Any, int]] = {}  # key -> (output, its size)
        self.bytes = 0
        self.made_by = "a stage"  # where an output that cannot be handed over was made: "stage a"

    def __len__(self) -> int:
        return len(self._items)

    def put(self, key: str, item: Any, size: int) -> None:
        self.release([key])  # a retried call makes the same key again
        self._items[key] = (item, size)
        self.bytes += size

    def take(self, keys: list[str], room: int | None = None) -> tuple[dict[str, Any], list[str]]:
        """The held items of ``keys`` (those still held) whose sizes together stay within
        ``room`` bytes (None: all), and the held keys left for a later take; all stay held. The
        first held one is taken whatever its size: a size is what ``payload_weight`` counts, not
        what the item encodes to, and one that does not fit fails alone."""
        items: dict[str, Any] = {}
        later: list[str] = []
        seen: set[str] = set()
        used = 0
        for key in keys:
            held = self._items.get(key)
            if held is None or key in seen:
                continue
            seen.add(key)
            if items and room is not None and used + held[1] > room:
                later.append(key)
                continue
            items[key] = held[0]
            used += held[1]
        return items, later

    def size(self, key: str) -> int:
        """The size ``key``'s item was held with (0 where none is held)."""
        held = self._items.get(key)
        return 0 if held is None else held[1]

    def release(self, keys: list[str]) -> None:
        """Forget ``keys`` (those not held are ignored: a release may follow a restart)."""
        for key in keys:
            held = self._items.pop(key, None)
            if held is not None:
                self.bytes -= held[1]


async def pull_inputs(
    ask: Callable[[str, str, Any, float], Any],
    items: list[Any],
    sources: list[Any],
    budget: int | None = None,
    frames: int | None = None,
) -> tuple[list[Any], dict[int, str], dict[int, str]]:
    """The batch's items with each pulled one filled in from its holder; the indexes whose
    holder is gone or no longer has it (lost: the engine runs them again from the first stage);
    and those whose holder answered with an error (failed: an item error, retried here, such as
    an output that cannot be sent, or any where the whole take failed), each with why.

    A holder answers what fits one reply and names the rest ``later``: they are asked for again,
    one take after another, each bounded by ``PULL_TIMEOUT_S``.

    Args:
        ask: ``ask(actor, msg_type, payload, timeout)``, an awaitable (the actor's runtime).
        items: the batch as the engine sent it (None where the item is pulled).
        sources: per item, ``[holder actor, key]`` or None (the item came inline).
        budget: the most bytes a message to this process may have (its message bound): a
            holder of a larger bound keeps its replies under it. None: the holder's own.
        frames: the most frames a message to this process may have (its ``max_frames``): a
            holder that takes more keeps its replies to as many. None: the holder's own.
    """
    by_holder: dict[str, list[tuple[int, str]]] = {}
    for i, source in enumerate(sources):
        if source is not None:
            by_holder.setdefault(str(source[0]), []).append((i, str(source[1])))
    filled = list(items)
    lost: dict[int, str] = {}
    failed: dict[int, str] = {}
    bounded: dict[str, Any] = {} if budget is None else {"budget": budget}
    if frames is not None:
        bounded["frames"] = frames

    async def fetch(holder: str, wanted: list[tuple[int, str]]) -> None:
        got: dict[str, Any] = {}
        refused: dict[str, Any] = {}
        why = f"holder {holder} no longer holds it"
        error = ""
        # Stopping, or from a holder the engine lost: nothing is pulled, and not asked either;
        # the items count as lost (run again).
        ended = _STOPPING[0] or holder in GONE
        if not ended:
            with anyio.CancelScope() as scope:  # cancelled when the engine says the holder is gone
                PULLS.setdefault(holder, set()).add(scope)
                try:
                    keys = [k for _, k in wanted]
                    while keys:  # what one reply could not hold is asked for again
                        reply = await ask(holder, "stage_take", {**bounded, "keys": keys}, PULL_TIMEOUT_S)
                        keys = _read_take(reply, keys, got, refused)
                except _NothingHanded:
                    error = f"holder {holder} handed none of the outputs asked over, naming all for later"
                except (DeliveryError, AskTimeout) as exc:  # gone, or not answering
                    why = f"holder {holder} did not hand over its outputs: {type(exc).__name__}: {exc}"
                except TroupeError as exc:  # it answered, with an error (the outputs stay held)
                    error = f"holder {holder} could not hand over its outputs: {type(exc).__name__}: {exc}"
                finally:
                    PULLS[holder].discard(scope)
                    if not PULLS[holder]:
                        del PULLS[holder]
            ended = scope.cancelled_caught
        if ended:
            why = (
                "this replica is stopping"
                if _STOPPING[0]
                else f"holder {holder} is gone (the engine lost its replica)"
            )
        for i, key in wanted:
            if key in got:
                filled[i] = got[key]
            elif key in refused:
                failed[i] = str(refused[key])
            elif error:
                failed[i] = error
            else:
                lost[i] = why

    async with anyio.create_task_group() as tg:
        for holder, wanted in by_holder.items():
            tg.start_soon(fetch, holder, wanted)
    return filled, lost, failed


class _NothingHanded(Exception):
    """A holder's reply to a take answered none of its keys and named some for later: asking
    again would go on for ever."""


def _read_take(reply: Any, keys: list[str], got: dict[str, Any], refused: dict[str, Any]) -> list[str]:
    """Add what a take's ``reply`` (to ``keys``) handed over to ``got`` and what it refused to
    ``refused``; the keys to ask for again (its ``later``: held, left out of this reply)."""
    if not isinstance(reply, dict):
        return []
    answered = len(got) + len(refused)
    items = reply.get("items")
    if isinstance(items, dict):
        got.update(items)
    if isinstance(reply.get("refused"), dict):
        refused.update(reply["refused"])
    later = reply.get("later")
    if not isinstance(later, list) or not later:
        return []
    if len(got) + len(refused) == answered:
        raise _NothingHanded
    asked = set(keys)
    return [key for key in later if key in asked and key not in got and key not in refused]


HELD = HeldOutputs()
"""This process's held outputs: a replica's worker process hosts one stage actor, which puts
them here, and one :class:`Outbox`, which hands them over."""

OUTBOX_CLASS = "troupe.runtime.pipeline.handoff:Outbox"

PULLS: dict[str, set[anyio.CancelScope]] = {}
"""This process's pulls in progress, by holder: the engine ends those from a holder it lost
(``stage_holder_gone``) rather than leave them waiting ``PULL_TIMEOUT_S`` for a dead process."""

GONE: set[str] = set()
"""The holders the engine told this process it lost. A call already sent here that pulls from
one later (queued behind the call in progress when the engine told) pulls nothing: the process
behind that name is dead, or is its node's restart of it, empty, at an endpoint this process may
not know; either way the ask would wait ``PULL_TIMEOUT_S`` for nothing. The engine names no
lost replica again (a replacement gets a new name)."""

_STOPPING: list[bool] = [False]
"""This process stops (``Outbox.stop_requested``): the calls its stage still drains pull nothing;
their holders may be stopping too, and waiting on them would hold the stop up to its deadline."""


class Outbox(Actor):
    """Hands a replica's held outputs to the replicas of the next stage, and ends its pulls from
    a holder the engine lost.

    An actor of its own beside the stage actor: the stage's mailbox takes one call at a time,
    and a render that takes seconds must not keep the next stage waiting for the frames it
    finished before.
    """

    mailbox_capacity = 256

    _limits: ReplyLimits | None = None  # what the take in hand's reply must fit (None: all)

    @handles("stage_take")
    def _take(self, payload: dict[str, Any]) -> dict[str, Any]:
        """The held outputs of ``keys`` that fit one reply under the taker's limits (``budget``,
        its message bound, and ``frames``, its ``max_frames``) and this process's, and the others
        under ``later``. The sizes the outputs were held with decide, where the taker takes what
        this process does; a taker that takes less (a smaller bound, fewer frames) is answered by
        what the outputs encode to (``_by_encoded_size``): it would refuse on receipt a reply
        this process's codec lets go (a str of multibyte characters weighs its length, an array
        one frame no weight shows), where under this process's own limits its codec finds one
        that does not fit (``reply_instead``). A taker that says no ``frames`` (of an earlier
        troupe) is taken to take this process's. An older taker says no budget and reads no
        ``later`` (it would count those items lost, and this holder with them): it is answered
        every output, in one reply, as before."""
        keys = [str(k) for k in payload.get("keys", ())]
        self._limits = limits = ReplyLimits.said(payload, self.runtime.codec, "the taking replica's")
        if limits is None:
            return {"items": HELD.take(keys)[0]}
        items, later = HELD.take(keys, _room(limits.bound, keys))
        if limits.tighter(self.runtime.codec):
            return self._by_encoded_size(items, later)
        return {"items": items, "later": later} if later else {"items": items}

    def reply_instead(self, msg_type: str, result: Any, error: ProtocolError) -> Any:
        """A take whose reply could not be encoded, answered by what each output encodes to
        (``_by_encoded_size``): the outputs its sizes misjudged (a str of multibyte characters,
        more arrays than a message has frames), or one the holder's walk vouched for that cannot
        be encoded (a str with a lone surrogate, a numpy object array), which is refused alone.
        The whole take failed with it. Called only once the reply failed (for the take just
        handled: an actor handles one message at a time, and this one's are plain), so a take
        that travels is encoded once."""
        items = result.get("items") if isinstance(result, dict) else None
        if msg_type != "stage_take" or not isinstance(items, dict):
            raise error
        later = result.get("later")
        return self._by_encoded_size(items, list(later) if isinstance(later, list) else [])

    def _by_encoded_size(self, items: dict[str, Any], later: list[str]) -> dict[str, Any]:
        """The answer to a take of ``items`` (``later``: those it leaves for the next take),
        each output encoded alone: one the codec refuses, or that leaves no room under the
        bound for the reply around it, under ``refused`` with why (its item's error at the
        taker); of the others, those that fit one reply together (bytes and frames), and the
        rest added to ``later``. Each key is answered once, and at least one per reply: the
        first that fits is sent, or some are refused."""
        codec = self.runtime.codec
        # An older taker, which reads no ``later``: all that travels, in one reply.
        bound, whose, frames, frames_whose = self._limits or ReplyLimits(
            codec.max_message_bytes, "the", codec.max_frames, "the"
        )
        envelope = reply_envelope(codec)
        refused: dict[str, str] = {}
        sized: list[tuple[str, Any, int, int]] = []  # key, output, encoded bytes, buffer frames
        for key, item in items.items():
            try:
                size, frames_of_it = encoded_size(codec, item, envelope)
            except ProtocolError as exc:
                refused[key] = refused_output(codec, HELD.made_by, exc, item, bound, whose)
                continue
            sized.append((key, item, size, frames_of_it))
        keys = [*items, *later]
        room = _room(bound, keys) - _refusals_bytes(refused)
        for key, _, size, frames_of_it in sized:
            if size > room:
                refused[key] = too_large_output(HELD.made_by, size, bound, whose)
            elif frames_of_it >= frames:  # more than the taker takes (this process's own: refused)
                refused[key] = too_many_frames(HELD.made_by, frames_of_it, frames, frames_whose)
        room = _room(bound, keys) - _refusals_bytes(refused)
        sendable: dict[str, Any] = {}
        used = buffers = 0
        for key, item, size, frames_of_it in sized:
            if key in refused:
                continue
            if self._limits is None or (used + size <= room and buffers + frames_of_it < frames):
                sendable[key] = item
                used += size
                buffers += frames_of_it
            else:
                later.append(key)  # it fits alone: the next take, with fewer keys and refusals
        answer: dict[str, Any] = {"items": sendable, "refused": refused}
        if later:
            answer["later"] = later
        return answer

    @handles("stage_release")
    def _release(self, payload: dict[str, Any]) -> None:
        HELD.release([str(k) for k in payload.get("keys", ())])

    @handles("stage_holder_gone")
    def _holder_gone(self, payload: dict[str, Any]) -> None:
        holder = str(payload.get("holder"))
        GONE.add(holder)
        for scope in list(PULLS.get(holder, ())):
            scope.cancel()

    @handles("stage_held")
    def _held(self, payload: Any) -> dict[str, int]:
        return {"items": len(HELD), "bytes": HELD.bytes}

    async def started(self) -> None:
        _STOPPING[0] = False  # a process's new replica (tests host several in one process)
        GONE.clear()

    def stop_requested(self) -> None:
        """The worker stops: pulls in progress end now, and later ones pull nothing; their
        items count as lost, and the engine, if it still runs, runs them again elsewhere."""
        _STOPPING[0] = True
        for scopes in list(PULLS.values()):
            for scope in list(scopes):
                scope.cancel()
