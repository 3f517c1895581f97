"""The actor side of a pipeline stage: items in, items out, failures per item, and its lifecycle.

A stage replica is an actor that answers ``process`` asks carrying a batch of items. It handles
each item with ``process`` (or the whole batch with ``process_batch``) and answers one outcome
per item, in order, with the time the batch took inside the actor:

- ``{"ok": item}``: the item goes on to the next stage;
- ``{"pruned": reason}``: the item failed for good (ItemFailed) and is dropped, counted;
- ``{"error": message, "traceback": text}``: something broke (a full disk, a bug); the engine
  retries the item up to the pipeline's ``max_attempts``;
- ``{"later": key}``: the outcome did not fit the reply (the outcomes together pass what the
  engine said it receives whole); the engine takes it with ``process_rest`` (``outcome_parts``).

The lifecycle of a stage in one pipeline run (each hook optional, plain or async):

1. the constructor, in every replica, with the stage's ``kwargs``;
2. ``start(run)``, once per run, on the first replica, before any item moves: it may return
   the ids of items whose output is committed already (an earlier, interrupted run), which
   the engine then keeps without running any stage on them. A class whose
   ``start_lists_every_output`` is True (the dataset writer) names every output it holds: an
   item that earlier runs ended ok and the list lacks (its output deleted since) is made again;
3. ``process(item)`` per item, in any replica (several replicas of a stage run at once);
4. ``finalize(run)``, once per run, after every item has its outcome, on one replica (started
   for it if the stage has none left): end-of-run work such as writing a dataset's index. What
   it returns (a msgpack-able dict) is the run's ``finals[stage]``; a ``"summary"`` string in it
   is what ``troupe run`` prints. Not called where every item died (earlier runs' dead among
   them): the run made nothing to finalise.

A stage that commits outputs may also define ``committed_among(task_ids)``, returning those of
the ids whose output is committed (plain or async): the engine asks it, on a replica that is up,
before it retries, runs again or dead-letters an item this stage failed (or lost) on, and an
item it names ends ok (its output was committed before the failure: ``committed_check.py``).
"""

from __future__ import annotations

import inspect
import time
import traceback
from dataclasses import asdict, dataclass
from typing import Any

import anyio

from troupe.runtime.core.actor import Actor, Handler, handles
from troupe.runtime.errors import EncodeError, ItemFailed, ProtocolError
from troupe.runtime.tasks.jobspec import generated_task_id
from troupe.runtime.wire.map_keys import key_refusal, refused_key

from .handoff import (
    HELD,
    INLINE_BELOW,
    TAKE_HEADROOM,
    ReplyLimits,
    encoded_size,
    outcome_lost,
    payload_weight,
    pull_inputs,
    refused_output,
    reply_envelope,
    too_large_output,
)
from .hook_returns import committed_ids, final_summary
from .outcome_parts import ENGINE, OutcomeParts

__all__ = [
    "HOOKS",
    "StageActor",
    "StageRun",
    "batch_outcomes",
    "outcome_error",
    "outcome_ok",
    "outcome_pruned",
]

_PULL_TICK_S = 5.0  # well under any progress timeout a supervision config would set
_MOST_ID = 2**64 - 1  # the longest a reply's message id encodes to

HOOKS = ("start", "finalize", "committed_among")
"""The run-wide hooks a stage class may define."""


def outcome_ok(item: Any) -> dict[str, Any]:
    """The item passed."""
    return {"ok": item}


def outcome_pruned(reason: str) -> dict[str, Any]:
    """The item failed for good and is pruned."""
    return {"pruned": reason}


def outcome_error(exc: BaseException) -> dict[str, Any]:
    """The item hit an error worth retrying."""
    return {
        "error": f"{type(exc).__qualname__}: {exc}",
        "traceback": "".join(traceback.format_exception(exc)),
    }


def _outcome_of_failure(exc: Exception) -> dict[str, Any]:
    """ItemFailed prunes the item; any other error has it retried."""
    return outcome_pruned(str(exc)) if isinstance(exc, ItemFailed) else outcome_error(exc)


_OUTCOME_FORMS = '{"ok": output}, {"pruned": reason} or {"error": message}'


def batch_outcomes(where: str, cls: str, items: list[Any], returned: Any) -> list[dict[str, Any]]:
    """What an override of ``process_batch`` (of class ``cls``, in stage ``where``) returned for
    ``items``, checked: one outcome per item, in order. An outcome of another form is that
    item's error; a return that is not a list (or a tuple) of one per item fails the batch. The
    engine read any other return as outcomes: outputs returned as they are died as ``None``, a
    list one short as ``coroutine raised StopIteration``.

    Raises:
        TypeError: the return is not a list of one outcome per item (the batch's error).
    """
    told = f"return one outcome per item, in order ({_OUTCOME_FORMS})"
    if not isinstance(returned, (list, tuple)):
        raise TypeError(f"{where}: {cls}.process_batch returned {_kind(returned)}, not a list: {told}")
    if len(returned) != len(items):
        raise TypeError(
            f"{where}: {cls}.process_batch returned {len(returned)} outcomes for {len(items)} items: {told}"
        )
    return [
        outcome
        if _is_outcome(outcome)
        else {
            "error": f"TypeError: {where}: {cls}.process_batch returned {_kind(outcome)} for item {i} of "
            f"the batch, not an outcome: {told}",
            "traceback": "",
        }
        for i, outcome in enumerate(returned)
    ]


def _is_outcome(value: Any) -> bool:
    """``value`` is one of the outcomes ``process_batch`` returns (``_OUTCOME_FORMS``)."""
    if type(value) is not dict or (len(value) != 1 and set(value) != {"error", "traceback"}):
        return False
    if "ok" in value:
        return True
    if "pruned" in value:
        return isinstance(value["pruned"], str)
    return isinstance(value.get("error"), str) and isinstance(value.get("traceback", ""), str)


def _kind(value: Any) -> str:
    """``value`` named by its type (a dict by its first keys), short enough for an item's error."""
    if isinstance(value, dict):
        keys = ", ".join(repr(k)[:40] for k in list(value)[:3])
        return f"a dict of keys {keys}{', ...' if len(value) > 3 else ''}" if value else "an empty dict"
    return "None" if value is None else f"a {type(value).__qualname__}"


@dataclass(frozen=True, slots=True)
class StageRun:
    """What a stage's ``start`` and ``finalize`` hooks are told about the run.

    Attributes:
        pipeline: the pipeline's name (also its job's id).
        stage: this stage's name.
        items: the items of the run.
        seed_start: the first item's seed.
        out: the run's output directory (what ``{out}`` in kwargs became), or None.
        fresh: the run starts anew (``--fresh``): ``start`` drops what earlier runs left
            wherever the stage keeps it, and names nothing as committed.
    """

    pipeline: str
    stage: str
    items: int
    seed_start: int
    out: str | None = None
    fresh: bool = False

    def task_ids(self) -> list[str]:
        """The ids of the run's items, in order, as its source names them (``{pipeline}-000000``
        ...): what a stage's outputs of this run are keyed by, and another run's are not."""
        return [generated_task_id(self.pipeline, i) for i in range(self.items)]

    def to_wire(self) -> dict[str, Any]:
        """As a msgpack-able dict."""
        return asdict(self)

    @classmethod
    def from_wire(cls, data: dict[str, Any]) -> StageRun:
        """From :meth:`to_wire`'s form."""
        out = data.get("out")
        return cls(
            str(data["pipeline"]),
            str(data["stage"]),
            int(data["items"]),
            int(data["seed_start"]),
            None if out is None else str(out),
            bool(data.get("fresh", False)),
        )


async def _call(fn: Any, *args: Any) -> Any:
    """Run a hook: an async one on the loop, a plain one on a thread (it may take minutes, and
    the replica's mailbox and supervision must stay live meanwhile)."""
    if inspect.iscoroutinefunction(fn):
        return await fn(*args)
    return await anyio.to_thread.run_sync(fn, *args)


class StageActor(Actor):
    """Base of every stage replica. Override ``process`` (or ``process_batch``).

    ``process(item)`` may be a plain or an async method; raise ItemFailed (or a subclass) to
    prune the item, any other exception to have it retried. Define ``start(run)`` and
    ``finalize(run)`` for run-wide work (see the module docstring).
    """

    mailbox_capacity = 16
    start_lists_every_output = False
    """``start`` names every output the stage holds (see the module docstring), not some."""
    _stage_name = ""  # the pipeline's name for this stage, once the engine has said it (stage_info)
    _asker: ReplyLimits | None = None  # what the engine said it receives whole, with the call in hand
    _outcome_parts: OutcomeParts | None = None  # outcomes kept for the engine's process_rest
    finalize_kwargs: tuple[str, ...] = ()
    """The kwargs only ``finalize`` reads (where a dataset goes, what it declares): they decide
    no item's output, so a rerun with them changed finalises again instead of being refused as
    made with another pipeline. The run learns them from the hook's answer (its
    ``finalize_kwargs`` entry): a run that never finalised holds them as it holds the rest."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        # A plain ``process`` under the default batch loop needs no task: a synchronous handler
        # is run as the message arrives when the actor is idle, which saves waking the actor's
        # task for every call (most of what a small item costs besides its work).
        # A plain ``process_batch`` is run as a plain ``process`` is.
        batch = cls.process if cls.process_batch is StageActor.process_batch else cls.process_batch
        if not inspect.iscoroutinefunction(batch):
            cls._handlers = {**cls._handlers, "process": Handler(cls.process_plain, False)}

    def process(self, item: Any) -> Any:
        """Handle one item and return the item for the next stage."""
        raise NotImplementedError(f"{type(self).__name__} must override process() or process_batch()")

    async def process_batch(self, items: list[Any]) -> list[dict[str, Any]]:
        """Handle a batch; by default item by item, each with its own outcome.

        An override (plain or async) returns a list of one outcome per item, in order:
        ``{"ok": output}``, ``{"pruned": reason}`` or ``{"error": message}`` (``batch_outcomes``
        checks it); raising ItemFailed prunes the whole batch, any other exception has every
        item of it retried."""
        out: list[dict[str, Any]] = []
        for item in items:
            try:
                result = self.process(item)
                if inspect.isawaitable(result):
                    result = await result
                out.append(outcome_ok(result))
            except Exception as exc:
                out.append(_outcome_of_failure(exc))
            self.progress()
        return out

    @classmethod
    def check_stages(cls, kwargs: dict[str, Any], others: dict[str, tuple[type, dict[str, Any]]]) -> None:
        """Refuse kwargs that do not fit the pipeline's other stages, before any replica starts
        (after each stage's own ``check_kwargs``): ``others`` holds each other stage of the
        pipeline checked here, by name, as (its class, its config's kwargs, ``{out}``
        unresolved). A writer's frame rate that is not its planner's, say, failed the run's
        finalize after every item was made.

        Raises:
            ValueError: they do not fit; the message says which and why (``ConfigError``).
        """

    @classmethod
    def hooks(cls) -> list[str]:
        """The run-wide hooks this class defines."""
        return [name for name in HOOKS if callable(getattr(cls, name, None))]

    @handles("process")
    async def _process(self, payload: dict[str, Any]) -> dict[str, Any]:
        return self._fitted(payload, await self._processed(payload["items"]))

    async def _processed(self, items: list[Any]) -> dict[str, Any]:
        """The reply to a batch of ``items``: an outcome each, and the time they took."""
        t0 = time.perf_counter()
        outcomes: list[dict[str, Any]]
        try:
            returned: Any = self.process_batch(items)
            if inspect.isawaitable(returned):  # not a plain override (run here where not held)
                returned = await returned
            if type(self).process_batch is StageActor.process_batch:
                outcomes = returned
            else:
                outcomes = batch_outcomes(self._where(), type(self).__qualname__, items, returned)
        except ItemFailed as exc:
            outcomes = [outcome_pruned(str(exc))] * len(items)
        except Exception as exc:
            outcomes = [outcome_error(exc)] * len(items)
        return {"outcomes": self._keys_checked(outcomes), "actor_s": time.perf_counter() - t0}

    def process_plain(self, payload: dict[str, Any]) -> dict[str, Any]:
        """The ``process`` message's handler for a plain ``process`` method under the default
        batch loop, or a plain ``process_batch``: the same outcomes as the async handler,
        without awaiting."""
        return self._fitted(payload, self._plain_processed(payload["items"]))

    def _plain_processed(self, items: list[Any]) -> dict[str, Any]:
        t0 = time.perf_counter()
        if type(self).process_batch is not StageActor.process_batch:  # a plain override
            try:
                returned = self.process_batch(items)
                outcomes = batch_outcomes(self._where(), type(self).__qualname__, items, returned)
            except ItemFailed as exc:
                outcomes = [outcome_pruned(str(exc))] * len(items)
            except Exception as exc:
                outcomes = [outcome_error(exc)] * len(items)
            return {"outcomes": self._keys_checked(outcomes), "actor_s": time.perf_counter() - t0}
        outcomes = []
        for item in items:
            try:
                outcomes.append(outcome_ok(self.process(item)))
            except Exception as exc:
                outcomes.append(_outcome_of_failure(exc))
            self.progress()
        return {"outcomes": self._keys_checked(outcomes), "actor_s": time.perf_counter() - t0}

    def _fitted(self, payload: dict[str, Any], reply: dict[str, Any]) -> dict[str, Any]:
        """``reply`` to the batch call ``payload``, as the engine receives it whole
        (``outcome_parts``): the limits the call said are kept for ``reply_instead``, which
        fits a reply that passes this process's own; one that passes only the engine's
        (smaller) is fitted here, where this process's codec would let it go."""
        self._asker = None
        if "budget" in payload:  # an older engine says none, and reads no ``later``
            codec = self.runtime.codec
            self._asker = ReplyLimits.said(payload, codec, ENGINE)
            if self._asker is not None and self._asker.tighter(codec):
                reply["outcomes"] = self._parts().fit(codec, reply["outcomes"], self._asker, self._where())
        return reply

    def _parts(self) -> OutcomeParts:
        """The outcomes kept for the engine's ``process_rest`` (made on first use: a stage's
        constructor need not call this class's)."""
        if self._outcome_parts is None:
            self._outcome_parts = OutcomeParts()
        return self._outcome_parts

    @handles("process_rest")
    def _process_rest(self, payload: dict[str, Any]) -> dict[str, Any]:
        """The outcomes of an earlier batch that its reply named ``later`` (``keys``): those that
        fit one reply under the engine's limits (``budget``, ``frames``), the others ``later``
        again."""
        codec = self.runtime.codec
        limits = ReplyLimits.said(payload, codec, ENGINE)
        if limits is None:  # an engine that reads ``later`` says its limits
            limits = ReplyLimits(codec.max_message_bytes, "the", codec.max_frames, "the")
        return self._parts().rest([str(k) for k in payload.get("keys", ())], limits)

    def _keys_checked(self, outcomes: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """``outcomes``, each output with a map key the reader refuses (a tuple, None, a float,
        a bool: msgpack packs them, the reader refuses the whole reply) made that item's
        error, so that the batch's other items go on. Walked here, where a batch's reply is
        built, rather than in the codec, which would walk every payload of every message: a
        few containers per output, well under what encoding it costs."""
        for i, outcome in enumerate(outcomes):
            if type(outcome) is dict and "ok" in outcome and (refused := refused_key(outcome["ok"])):
                outcomes[i] = self._unsendable_outcome(EncodeError(key_refusal(refused[0])), outcome["ok"])
        return outcomes

    def _learn_holders(self, sources: list[Any]) -> None:
        """Teach this process's directory the holders' mailboxes the engine named, so that a
        pull asks no directory first. The cluster's directory (the master) knows each holder by
        then too: its node beat before it answered the holder's start (a node of an older
        troupe did not, and the run waited for its next beat, ``replicas._stage_info``), so a
        replica of an older troupe, which ignores these endpoints and asks, finds it as well."""
        runtime = getattr(self, "runtime", None)
        if runtime is None:
            return
        for source in sources:
            named = isinstance(source, list) and len(source) == 3 and all(isinstance(x, str) for x in source)
            if named and source[0].count("/") == 2:  # node/process/actor: the directory's own keys
                runtime.directory.learn(source[0], source[2])

    @handles("process_direct")
    async def _process_direct(self, payload: dict[str, Any]) -> dict[str, Any]:
        """``process`` on the direct data plane (see ``handoff``): inputs pulled from the
        replicas that hold them (``from``: ``[holder, key]`` per item, or None where the item
        came inline; ``[holder, key, endpoint]`` where the engine knows the holder's mailbox,
        which a cluster's directory may not know yet), and, with ``hold`` (a key per item), each
        output of at least ``inline_below`` bytes kept here for the next stage and answered by
        its size."""
        t0 = time.perf_counter()
        items: list[Any] = list(payload["items"])
        sources = payload.get("from")
        hold = payload.get("hold")
        lost: dict[int, str] = {}
        failed: dict[int, str] = {}
        if sources:
            self._learn_holders(sources)
            async with anyio.create_task_group() as tg:
                tg.start_soon(self._alive_while_pulling)
                codec = self.runtime.codec  # its holders' replies must fit what it receives
                items, lost, failed = await pull_inputs(
                    self._ask, items, list(sources), codec.max_message_bytes, codec.max_frames
                )
                tg.cancel_scope.cancel()
        run = [item for i, item in enumerate(items) if i not in lost and i not in failed]
        if not run:
            done: list[dict[str, Any]] = []
        elif hold and self._handlers["process"].fn is StageActor.process_plain:
            # Off the loop: the Outbox beside this actor hands over earlier outputs meanwhile.
            done = await anyio.to_thread.run_sync(self._plain_outcomes, run)
        else:
            done = (await self._processed(run))["outcomes"]
        ran = iter(done)
        outcomes = [
            outcome_lost(lost[i])
            if i in lost
            else {"error": failed[i], "traceback": ""}
            if i in failed
            else next(ran)
            for i in range(len(items))
        ]
        if hold:
            self._hold(outcomes, hold, int(payload.get("inline_below", INLINE_BELOW)))
        return self._fitted(payload, {"outcomes": outcomes, "actor_s": time.perf_counter() - t0})

    def _hold(self, outcomes: list[dict[str, Any]], hold: list[Any], below: int) -> None:
        """Keep each ok output of at least ``below`` bytes here for the next stage, under its key
        in ``hold``, its outcome made its size. One that cannot be encoded becomes that item's
        error now, as on the engine plane, rather than when the next stage takes it, which failed
        every item of that take; so is one over the message bound (its error this stage's, not
        the taking one's). Only an output whose walk finds a value that may not encode
        (``payload_weight``), or that weighs within twice a take's headroom of the bound, is
        encoded here (as the reply to a take of it alone); the others are encoded once, when
        taken (where one that cannot be is still that item's error alone:
        ``Outbox.reply_instead``)."""
        HELD.made_by = self._where()
        near = self.runtime.codec.max_message_bytes - 2 * TAKE_HEADROOM  # a take's reply may not fit
        for i, outcome in enumerate(outcomes):
            if "ok" not in outcome:
                continue
            size, doubtful = payload_weight(outcome["ok"])
            if size < below:
                continue
            if (doubtful or size > near) and (refusal := self._refusal(outcome["ok"], str(hold[i]))):
                outcomes[i] = {"error": refusal, "traceback": ""}
                continue
            HELD.put(str(hold[i]), outcome["ok"], size)
            outcomes[i] = {"held": str(hold[i]), "bytes": size}

    def _refusal(self, output: Any, key: str) -> str | None:
        """Why ``output``, to be held under ``key``, could not be handed over (its item's error),
        or None where it can: the codec refuses to encode it, or the reply to a take of it
        alone (this process's outbox answering, as ``Outbox._take`` does). Such an output was
        held all the same and refused when taken, that item's error counted as the taking
        stage's, not this one's."""
        codec = self.runtime.codec
        sender = f"{self.address.node}/{self.address.process}"  # a reply's sender: the process
        try:
            codec.encode_reply(_MOST_ID, sender, {"items": {key: output}})
        except ProtocolError as exc:
            return refused_output(codec, self._where(), exc, output, codec.max_message_bytes, "the")
        return None

    async def _alive_while_pulling(self) -> None:
        """A pull waits on another process (a holder whose node may have just died, until the
        engine hears of it): that is no hang, and the supervisor must not take it for one."""
        while True:
            await anyio.sleep(_PULL_TICK_S)
            self.progress(1, "waiting for inputs")

    async def _ask(self, actor: str, msg_type: str, payload: Any, timeout: float) -> Any:
        return await self.ref(actor).ask(msg_type, payload, timeout=timeout)

    def _plain_outcomes(self, items: list[Any]) -> list[dict[str, Any]]:
        outcomes: list[dict[str, Any]] = self._plain_processed(items)["outcomes"]
        return outcomes

    def reply_instead(self, msg_type: str, result: Any, error: ProtocolError) -> Any:
        """A batch's outcomes whose reply could not be encoded (an output holding a set, say,
        or outputs that each fit the message bound and together pass it), each outcome encoded
        alone now: one that cannot be becomes that item's error, retried as any, and the others
        go on, those that fit one reply in it and the rest kept for the engine's
        ``process_rest`` (``outcome_parts``). The whole batch failed with it, naming the internal
        ``process_direct``. Called only once the reply failed (for the call just handled: an
        actor handles one message at a time), so a batch that travels is encoded once. An older
        engine, which says no limits with its call and reads no ``later``, is answered every
        outcome that travels, in one reply, as before; one that travels alone but leaves no room
        for the reply around it (``TAKE_HEADROOM``) is its item's error, in the words an output
        over the bound gets, rather than the whole reply's failure in the router's."""
        outcomes = result.get("outcomes") if isinstance(result, dict) else None
        if msg_type not in ("process", "process_direct") or not isinstance(outcomes, list):
            raise error
        if self._asker is not None:
            return {
                **result,
                "outcomes": self._parts().fit(self.runtime.codec, outcomes, self._asker, self._where()),
            }
        codec = self.runtime.codec
        envelope = reply_envelope(codec)
        room = codec.max_message_bytes - TAKE_HEADROOM  # one alone fits where it leaves this
        answered = []
        for outcome in outcomes:
            try:
                size = encoded_size(codec, outcome, envelope)[0]
            except ProtocolError as exc:
                outcome = self._unsendable_outcome(exc, outcome.get("ok", outcome))
            else:
                if size > room:
                    too_large = too_large_output(self._where(), size, codec.max_message_bytes, "the")
                    outcome = {"error": too_large, "traceback": ""}
            answered.append(outcome)
        return {**result, "outcomes": answered}

    def handler_said(self, msg_type: str) -> str | None:
        """A batch call is named by the method it runs: ``stage a's process`` (or its
        ``process_batch``), as the user wrote it."""
        if msg_type not in ("process", "process_direct"):
            return None
        method = "process" if type(self).process_batch is StageActor.process_batch else "process_batch"
        return f"{self._where()}'s {method}"

    def _unsendable_outcome(self, exc: ProtocolError, output: Any) -> dict[str, Any]:
        """The error of an item whose ``output`` cannot travel (``exc``: the codec's refusal),
        naming the stage and its ``process``; one over the message bound as every such one is."""
        codec = self.runtime.codec
        return {
            "error": refused_output(codec, self._where(), exc, output, codec.max_message_bytes, "the"),
            "traceback": "",
        }

    def _where(self) -> str:
        """This stage, as an item's error names it."""
        return f"stage {self._stage_name}" if self._stage_name else f"stage class {type(self).__qualname__}"

    @handles("stage_info")
    async def _stage_info(self, payload: Any) -> dict[str, Any]:
        if isinstance(payload, dict) and isinstance(payload.get("stage"), str):
            self._stage_name = payload["stage"]  # an older engine asks with None
        codec = self.runtime.codec  # what this process receives whole: the engine's calls fit it
        return {"hooks": self.hooks(), "budget": codec.max_message_bytes, "frames": codec.max_frames}

    @handles("stage_start")
    async def _stage_start(self, payload: dict[str, Any]) -> dict[str, Any]:
        hook = getattr(self, "start", None)
        committed = await _call(hook, StageRun.from_wire(payload)) if callable(hook) else None
        return {
            "committed": committed_ids(type(self).__qualname__, committed),
            "every": self.start_lists_every_output,
        }

    @handles("stage_committed")
    async def _stage_committed(self, payload: dict[str, Any]) -> dict[str, Any]:
        hook = getattr(self, "committed_among", None)
        ids = [str(t) for t in payload.get("task_ids") or ()]
        named = await _call(hook, ids) if callable(hook) and ids else None
        return {"committed": committed_ids(type(self).__qualname__, named, "committed_among")}

    @handles("stage_finalize")
    async def _stage_finalize(self, payload: dict[str, Any]) -> dict[str, Any]:
        hook = getattr(self, "finalize", None)
        summary = await _call(hook, StageRun.from_wire(payload)) if callable(hook) else None
        final = final_summary(type(self).__qualname__, summary)
        if self.finalize_kwargs:
            final["finalize_kwargs"] = sorted(self.finalize_kwargs)
        return final
