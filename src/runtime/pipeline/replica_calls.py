"""One call to a replica with a batch of items, and what its answer makes of them.

The call is ``process`` (items inline) or, on the direct data plane, ``process_direct`` (where
held inputs are, and asking to hold outputs), with what this process receives whole; of a batch
that passes what the replica receives whole, or the engine's own limits, what fits is sent
(``call_fit.py``). Its answer is an outcome per item, handed to ``item_outcomes.py``, those that
did not fit one reply asked for with ``process_rest`` (``outcome_parts.py``); a replica that
dies, hangs or answers nonsense fails the call's items (they are retried) and is replaced, and a
call that only waited behind the one a lost replica was working on puts its items back with no
attempt counted, as one that found no actor at its replica does (a bounded number of times).
The stage's meter times each call.

:class:`ReplicaCalls` is the part of :class:`~troupe.runtime.pipeline.engine.PipelineEngine`
that makes these calls; which items go to which replica, and when, is ``dispatch.py``.
"""

from __future__ import annotations

import itertools
import time
from typing import Any

import anyio

from troupe.runtime.errors import (
    MessageTooLarge,
    PeerLost,
    ProtocolError,
    TroupeError,
    UnknownActor,
    Unreachable,
)
from troupe.runtime.library_logging import get_logger

from .call_fit import CALL_HEADROOM, CallLimits, fit_call
from .first_output import FirstOutput
from .handoff import payload_weight
from .lost_holders import LostHolders
from .records import Handle, Item, Replica, StageState

__all__ = ["ReplicaCalls"]

log = get_logger(__name__)

_CALL_S = 600.0  # how long one call to a replica may take before its items are retried
_MOST_KEY = 2**64 - 1  # the longest a hold key's number is, as a call is weighed (``_what_fits``)
# Calls of an item in one stage that may find their replica's actor missing (``_undelivered``)
# before the next such call costs it an attempt: a stage whose actor is never there still ends.
_UNDELIVERED_MOST = 3


class ReplicaCalls(LostHolders):
    """Calls replicas with batches and hands on their outcomes (a part of the engine)."""

    _keys: itertools.count[int]  # numbers the outputs a call asks its replica to hold
    _first_output: FirstOutput  # told before the run may first make something

    def _limits(self) -> dict[str, int]:
        """What this process receives whole, said with each call so that a replica answers its
        outcomes in parts rather than a reply the engine cannot take (``outcome_parts``).
        Nothing where the runtime has no codec (a test's stand-in, whose calls never encode)."""
        codec = getattr(self.runtime, "codec", None)
        return {} if codec is None else {"budget": codec.max_message_bytes, "frames": codec.max_frames}

    def _request(self, stage: StageState, batch: list[Item]) -> tuple[str, dict[str, Any]]:
        """The call for ``batch``: ``process`` with the items inline, or, on the direct data
        plane, ``process_direct`` naming where held inputs are and asking to hold outputs;
        either with this process's limits."""
        if not self._direct:
            return "process", {"items": [it.data for it in batch], **self._limits()}
        items: list[Any] = []
        sources: list[list[str] | None] = []
        for it in batch:
            item, source = _inline(it)
            items.append(item)
            sources.append(source)
        payload: dict[str, Any] = {"items": items}
        if any(sources):
            payload["from"] = sources
        if self.config.downstream(stage.index):
            payload["hold"] = [_hold_key(it, stage, next(self._keys)) for it in batch]
            payload["inline_below"] = self.config.inline_below
        return ("process_direct" if len(payload) > 1 else "process"), {**payload, **self._limits()}

    def _what_fits(self, stage: StageState, replica: Replica, batch: list[Item]) -> list[Item]:
        """What of ``batch`` one call to ``replica`` holds (``call_fit``): the items past it go
        back to the front of the stage's queue, no attempt counted, and one that alone cannot
        fit is its error, retried as any. Weighed only where the call may not fit: where the
        replica receives less than this process's codec lets go (that codec, as it encodes the
        call, cannot see it), or where the items' weights near the engine's own bound; a call
        that still passes it is weighed as its encode fails (``_ask_within``)."""
        limits = self._call_limits(stage, replica)
        if limits is None or not (limits.below_codec() or _near(batch, limits)):
            return batch
        return self._fitted(stage, batch, limits)

    def _call_limits(self, stage: StageState, replica: Replica) -> CallLimits | None:
        """What a call of ``stage`` to ``replica`` must fit; None where the runtime has no codec
        (a test's stand-in, whose calls never encode)."""
        codec = getattr(self.runtime, "codec", None)
        if codec is None:
            return None
        source = self.config.upstream(stage.index)
        made = self.stages[stage.index if source is None else source].cfg.name
        return CallLimits.of(codec, replica.receives, f"stage {stage.cfg.name}", f"stage {made}")

    def _fitted(self, stage: StageState, batch: list[Item], limits: CallLimits) -> list[Item]:
        """The first items of ``batch`` that fit one call under ``limits``, in order, the first
        always: the others go back to the front of the stage's queue, no attempt counted, and
        one that alone cannot fit is its error, retried as any."""
        if self._direct:
            downstream = bool(self.config.downstream(stage.index))
            entries = [
                [*_inline(it), _hold_key(it, stage, _MOST_KEY) if downstream else None] for it in batch
            ]
        else:
            entries = [it.data for it in batch]
        fits, refused = fit_call(entries, limits)
        for i, error in refused.items():
            self._retry(stage, batch[i], error, "")
        if refused:  # failed attempts as a call's errors are, which only ``finished`` counted
            assert stage.meter is not None
            stage.meter.refused(len(refused))
        for item in reversed(batch[fits:]):
            stage.queue.appendleft(item)
        if refused or fits < len(batch):  # the dispatch loop looks again at what was put back
            self._changed.set()
        return [it for i, it in enumerate(batch[:fits]) if i not in refused]

    async def _ask_within(self, stage: StageState, replica: Replica, batch: list[Item]) -> Any:
        """``replica``'s reply to a call of ``batch``. A call the engine's own codec refuses as
        it encodes it (items that each fit, together past its bound or ``max_frames``, which
        ``_what_fits`` sent unweighed) is weighed then: ``batch`` is narrowed, in place, to what
        fits one call (``_fitted``) and that is sent; the rest went back to the queue, or, one
        that alone cannot fit, to its retry. A refusal the weighing does not bear out (each item
        fits one call, or the call was weighed already) is not the call's size (the replica
        answered it) and fails the call as any."""
        assert replica.ref is not None
        limits: CallLimits | None = None
        while True:
            msg_type, payload = self._request(stage, batch)
            try:
                return await replica.ref.ask(msg_type, payload, timeout=_CALL_S)
            except MessageTooLarge:
                if limits is not None or (limits := self._call_limits(stage, replica)) is None:
                    raise
                sent = self._fitted(stage, list(batch), limits)
                if len(sent) == len(batch):
                    raise
            unsent = len(batch) - len(sent)
            batch[:] = sent
            replica.busy -= unsent
            assert stage.meter is not None
            stage.meter.undispatched(unsent, len(stage.queue), time.monotonic())
            if not batch:  # each was refused alone: nothing to send
                return {"outcomes": []}

    async def _call(self, stage: StageState, replica: Replica, batch: list[Item]) -> None:
        assert replica.ref is not None and stage.meter is not None
        if not self.config.downstream(stage.index):  # it commits the items' outputs
            await self._first_output.coming()  # the run's code recorded first (first_output.py)
        if replica.gone_why:  # given up between its dispatch and now: nothing was sent to it
            self._waited_behind(stage, replica, batch)
            return
        t0 = time.monotonic()
        actor_s: float | None = None
        failure: TroupeError | None = None
        handled = False
        with anyio.CancelScope() as scope:  # cancelled when the replica's node dies
            replica.scopes.append(scope)
            try:
                reply = await self._ask_within(stage, replica, batch)  # may narrow ``batch``
                results, actor_s = _outcomes(reply, len(batch), stage.cfg.name)
                handled = True
            except PeerLost as exc:
                failure = exc
                # Its process went. The engine's watch of its node, asked now, says why (killed
                # as hung, say) and gives up its calls together, telling the one it was working
                # on from those that only waited behind it: until then, this call waits.
                self.suspect(replica)
                await anyio.sleep(max(0.0, t0 + _CALL_S - time.monotonic()))
            except TroupeError as exc:
                failure = exc
            finally:
                replica.scopes.remove(scope)
        if scope.cancelled_caught:
            if replica.working_on is not None and replica.working_on is not scope:
                self._waited_behind(stage, replica, batch)
                return
            # The stage, not the replica: the run's report groups dead items by their error,
            # and a cause that killed items in several replicas is one line (the replica's
            # name is in the stage_call_failed line of the log).
            failure = Unreachable(f"a replica of stage {stage.cfg.name}: {replica.gone_why or 'gone'}")
        elif isinstance(failure, UnknownActor):  # none of its items ran: they go to another replica
            batch = self._undelivered(stage, replica, batch, failure)
        if failure is not None:  # the replica died, hung or answered nonsense: retry the items
            log.warning("stage_call_failed", stage=stage.cfg.name, replica=replica.name, error=str(failure))
            results = [{"error": f"{type(failure).__name__}: {failure}", "traceback": ""}] * len(batch)
            if not isinstance(failure, ProtocolError):  # a reply it made that cannot travel: it is well
                self._replace(stage, replica)
        elif handled and any("later" in result for result in results):
            await self._rest(stage, replica, results)
        now = time.monotonic()
        # The actor takes calls one at a time: this one's service began when the one before it
        # answered (or when it was sent, if the replica was idle). Time queued behind it is not
        # the stage's latency.
        begun = max(t0, replica.last_reply)
        replica.last_reply = now
        ok = pruned = errors = 0
        for item, result in zip(batch, results, strict=True):
            if "ok" in result:
                ok += 1
                self._consumed(item)
                self._forward(stage, item, result["ok"], now)
            elif "held" in result and not replica.lost:
                ok += 1
                self._consumed(item)
                replica.held += 1
                self._forward(
                    stage, item, Handle(replica, str(result["held"]), _int(result.get("bytes"))), now
                )
            elif "pruned" in result:
                pruned += 1
                self._consumed(item)
                self._settle(item, "pruned", str(result["pruned"]))
            elif "lost" in result or "held" in result:  # its input, or its output, is gone
                errors += 1
                if "lost" in result:
                    self._holder_gone(item)
                self._restart(item, str(result.get("lost", f"replica {replica.name} is gone")))
            else:
                errors += 1
                self._retry(stage, item, str(result.get("error")), str(result.get("traceback", "")))
        # A batch call handles its items together: the latency per item is amortised over them.
        n = len(batch)
        if n:
            stage.meter.finished(
                ok, pruned, errors, (now - begun) / n, now, None if actor_s is None else actor_s / n
            )
        replica.busy -= n
        replica.calls -= 1
        self._flush_releases()
        self._changed.set()

    async def _rest(self, stage: StageState, replica: Replica, results: list[dict[str, Any]]) -> None:
        """Fill in ``results``' outcomes that the reply named ``later`` (it held what fits one
        message: ``outcome_parts``), asking the replica with ``process_rest`` until each arrived
        once. One that does not arrive (the replica was lost meanwhile, or no longer has it) is
        its item's error, retried as any; those that arrived stand."""
        assert replica.ref is not None
        where = {str(result["later"]): i for i, result in enumerate(results) if "later" in result}
        keys = list(where)
        why = f"replica {replica.name} no longer has its outcome"
        # A scope of its own, after the calls sent since: its ask waits behind them in the
        # replica's mailbox, and a loss meanwhile tells the call worked on from this one.
        with anyio.CancelScope() as scope:
            replica.scopes.append(scope)
            try:
                while keys:
                    reply = await replica.ref.ask(
                        "process_rest", {"keys": keys, **self._limits()}, timeout=_CALL_S
                    )
                    keys = _read_rest(reply, keys, where, results)
            except PeerLost as exc:
                self.suspect(replica)
                why = f"{type(exc).__name__}: {exc}"
            except TroupeError as exc:
                why = f"{type(exc).__name__}: {exc}"
            finally:
                replica.scopes.remove(scope)
        if scope.cancelled_caught:
            why = f"replica {replica.name}: {replica.gone_why or 'gone'}"
        error = f"the rest of stage {stage.cfg.name}'s reply did not arrive: {why}"
        for i in where.values():
            if "later" in results[i]:
                results[i] = {"error": error, "traceback": ""}

    def _waited_behind(self, stage: StageState, replica: Replica, batch: list[Item]) -> None:
        """A lost replica's call that only waited in its mailbox behind the one it was working
        on: its items go back to the stage's queue with no attempt counted (a hung item took
        the innocent ones behind it down with it, attempt after attempt)."""
        self._put_back(stage, replica, batch, replica.gone_why)
        replica.calls -= 1
        self._changed.set()

    def _undelivered(
        self, stage: StageState, replica: Replica, batch: list[Item], failure: UnknownActor
    ) -> list[Item]:
        """A call that found no actor at its replica (``UnknownActor``: its worker was killed
        and restarted by its node, and the new process had not spawned its actor yet): it was
        never delivered, so its items go back to the stage's queue with no attempt counted, for
        another replica (this one is replaced). It cost each an attempt, and dead-lettered one
        that never ran on its last. Not for ever: an item that found the actor missing
        ``_UNDELIVERED_MOST`` times in this stage is not put back but returned, and the call's
        failure costs it an attempt, as any call's."""
        back = [item for item in batch if item.undelivered < _UNDELIVERED_MOST]
        counted = [item for item in batch if item.undelivered >= _UNDELIVERED_MOST]
        for item in back:
            item.undelivered += 1
        if counted:
            log.warning(
                "stage_call_undelivered_counted",
                **_call_named(stage, replica, counted),
                times=_UNDELIVERED_MOST,
                error=str(failure),
                why=f"its replicas' actor was missing {_UNDELIVERED_MOST} times: this call costs an attempt",
            )
        if back:
            self._put_back(stage, replica, back, f"{type(failure).__name__}: {failure}")
        return counted

    def _put_back(self, stage: StageState, replica: Replica, items: list[Item], why: str) -> None:
        """``items`` of a call to ``replica`` that none of them reached go back to the front of
        the stage's queue, no attempt counted."""
        log.info("stage_call_requeued", **_call_named(stage, replica, items), why=why)
        for item in reversed(items):
            stage.queue.appendleft(item)
        assert stage.meter is not None  # back unsent: neither new in nor still in flight
        stage.meter.undispatched(len(items), len(stage.queue), time.monotonic())
        replica.busy -= len(items)


def _call_named(stage: StageState, replica: Replica, items: list[Item]) -> dict[str, Any]:
    """A call's log fields: its stage, its replica and its items' task ids."""
    return {"stage": stage.cfg.name, "replica": replica.name, "task_ids": [it.task_id for it in items]}


def _near(batch: list[Item], limits: CallLimits) -> bool:
    """Whether ``batch``'s inline inputs weigh (``payload_weight``) near what one call holds
    under ``limits``: within an eighth of it, since the walk counts a short value's bytes and
    not the header msgpack adds to it. One item is never weighed: a call of it cannot be split,
    and one that alone cannot fit is found as its encode fails."""
    if len(batch) < 2:
        return False
    near = (limits.bound - CALL_HEADROOM) * 7 // 8
    weight = 0
    for item in batch:
        if not isinstance(item.data, Handle):
            weight += payload_weight(item.data)[0]
            if weight > near:
                return True
    return False


def _inline(item: Item) -> tuple[Any, list[str] | None]:
    """What a direct-plane call carries of ``item``: its input inline, or None and where the
    replica pulls it from (``[holder, key]``, and the holder's mailbox where known)."""
    if not isinstance(item.data, Handle):
        return item.data, None
    holder = item.data.holder
    return None, [holder.outbox, item.data.key, *([holder.outbox_at] if holder.outbox_at else [])]


def _hold_key(item: Item, stage: StageState, n: int) -> str:
    """The key ``item``'s output is held under by ``stage``'s replica, ``n`` the call's number."""
    return f"{item.task_id}/{stage.cfg.name}/{n}"


def _int(value: Any) -> int:
    return value if type(value) is int and value >= 0 else 0


def _read_rest(
    reply: Any, keys: list[str], where: dict[str, int], results: list[dict[str, Any]]
) -> list[str]:
    """Put the outcomes a ``process_rest`` ``reply`` (to ``keys``) handed over in ``results`` (at
    ``where`` their key says); the keys to ask for again (its ``later``).

    Raises:
        ProtocolError: it handed none over and named some for later (asking again would go on
            for ever).
    """
    outcomes = reply.get("outcomes") if isinstance(reply, dict) else None
    handed = 0
    if isinstance(outcomes, dict):
        for key, outcome in outcomes.items():
            if key in where and isinstance(outcome, dict) and "later" in results[where[key]]:
                results[where[key]] = outcome
                handed += 1
    later = reply.get("later") if isinstance(reply, dict) else None
    if not isinstance(later, list) or not later:
        return []
    if not handed:
        raise ProtocolError("it handed none of the outcomes asked for over, naming all for later")
    asked = set(keys)
    return [key for key in later if key in asked and "later" in results[where[key]]]


def _outcomes(reply: Any, n: int, stage: str) -> tuple[list[dict[str, Any]], float | None]:
    """The outcomes of a ``process`` call and the time it took inside the actor (if told)."""
    actor_s: float | None = None
    results = reply
    if isinstance(reply, dict):
        results = reply.get("outcomes")
        told = reply.get("actor_s")
        actor_s = float(told) if isinstance(told, (int, float)) and told >= 0 else None
    if not isinstance(results, list) or len(results) != n or not all(isinstance(r, dict) for r in results):
        size = len(results) if isinstance(results, list) else type(results).__name__
        raise TroupeError(f"stage {stage} answered {size} outcomes for {n} items")
    return results, actor_s
