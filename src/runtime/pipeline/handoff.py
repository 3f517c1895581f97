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

Small outputs (under ``inline_below`` bytes, counted by :func:`payload_bytes`) still travel
inline through the engine: an extra round trip would cost them more than their bytes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import anyio

from troupe.runtime.core.actor import Actor, handles
from troupe.runtime.errors import AskTimeout, DeliveryError, ProtocolError, TroupeError

__all__ = [
    "GONE",
    "HELD",
    "INLINE_BELOW",
    "OUTBOX_CLASS",
    "PULLS",
    "PULL_TIMEOUT_S",
    "HeldOutputs",
    "Outbox",
    "outcome_lost",
    "payload_bytes",
    "payload_weight",
    "pull_inputs",
    "unsendable_output",
]

INLINE_BELOW = 4096
"""Outputs smaller than this (bytes) go inline through the engine by default."""

PULL_TIMEOUT_S = 60.0
"""How long a replica waits for a holder to hand over a batch's inputs: a few large frames take
a second; a holder whose node died never answers (its items then run again)."""

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
    needs anyway, and not encoded until the next stage takes it."""
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
            nbytes = getattr(o, "nbytes", None)  # arrays, tensors, numpy scalars
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
    the codec's refusal (``exc``), with what does travel."""
    return (
        f"{type(exc).__name__}: {where}: process returned an output that cannot be sent: {exc} "
        "(return maps, lists, str, numbers, bytes, None, numpy arrays or torch tensors)"
    )


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

    def take(self, keys: list[str]) -> dict[str, Any]:
        """The held items of ``keys`` (those still held); they stay held."""
        return {k: self._items[k][0] for k in keys if k in self._items}

    def release(self, keys: list[str]) -> None:
        """Forget ``keys`` (those not held are ignored: a release may follow a restart)."""
        for key in keys:
            held = self._items.pop(key, None)
            if held is not None:
                self.bytes -= held[1]


async def pull_inputs(
    ask: Callable[[str, str, Any, float], Any], items: list[Any], sources: list[Any]
) -> tuple[list[Any], dict[int, str], dict[int, str]]:
    """The batch's items with each pulled one filled in from its holder; the indexes whose
    holder is gone or no longer has it (lost: the engine runs them again from the first stage);
    and those whose holder answered with an error (failed: an item error, retried here, such as
    an output that cannot be sent, or any where the whole take failed), each with why.

    Args:
        ask: ``ask(actor, msg_type, payload, timeout)``, an awaitable (the actor's runtime).
        items: the batch as the engine sent it (None where the item is pulled).
        sources: per item, ``[holder actor, key]`` or None (the item came inline).
    """
    by_holder: dict[str, list[tuple[int, str]]] = {}
    for i, source in enumerate(sources):
        if source is not None:
            by_holder.setdefault(str(source[0]), []).append((i, str(source[1])))
    filled = list(items)
    lost: dict[int, str] = {}
    failed: dict[int, str] = {}

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
                    reply = await ask(holder, "stage_take", {"keys": [k for _, k in wanted]}, PULL_TIMEOUT_S)
                    if isinstance(reply, dict):
                        got = reply.get("items", {})
                        refused = reply["refused"] if isinstance(reply.get("refused"), dict) else {}
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

    @handles("stage_take")
    def _take(self, payload: dict[str, Any]) -> dict[str, Any]:
        return {"items": HELD.take([str(k) for k in payload.get("keys", ())])}

    def reply_instead(self, msg_type: str, result: Any, error: ProtocolError) -> Any:
        """A take whose reply could not be encoded, each output encoded alone now: one that
        cannot be (one the holder's walk vouched for, ``payload_weight``: a str with a lone
        surrogate, a numpy object array; or one over the message bound) is answered under
        ``refused`` with why, its item's error at the taker, and the others of the take arrive.
        The whole take failed with it. Called only once the reply failed, so a take that
        travels is encoded once."""
        items = result.get("items") if isinstance(result, dict) else None
        if msg_type != "stage_take" or not isinstance(items, dict):
            raise error
        encode = self.runtime.codec.encode_reply
        sendable: dict[str, Any] = {}
        refused: dict[str, str] = {}
        for key, item in items.items():
            try:
                encode(0, "", item)
            except ProtocolError as exc:
                refused[key] = unsendable_output(HELD.made_by, exc)
                continue
            sendable[key] = item
        return {"items": sendable, "refused": refused}

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
