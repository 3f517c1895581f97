"""What a runtime does with what arrives: decode, validate, route, answer.

Every received message is decoded and validated first. A bad frame is logged with its reason,
counted, answered with an ERROR where the sender can be reached, and dropped; a peer that sends
more bad frames than its allowance is throttled (core/throttle.py): its messages are dropped
unread for a while. Replies settle pending asks; tells and asks go to the target actor's
mailbox, whose bound pushes back on the sender's socket when full.

Control messages are handled where they are read. An ``async`` handler runs as a task of its
own (a slow one holds up nobody). A plain handler must not block: it is called at once and
returns an :class:`Answer`, the reply now or a future's result later, and costs no task: at a
thousand workers a task per request was a quarter of the master's CPU.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine, Generator, Mapping
from functools import partial
from inspect import iscoroutinefunction
from typing import TYPE_CHECKING, Any

from troupe.runtime.errors import (
    ActorStopped,
    BadFrame,
    DeliveryError,
    ProtocolError,
    TroupeError,
    UnknownActor,
    UnknownMessageType,
)
from troupe.runtime.library_logging import get_logger
from troupe.runtime.security.roles import actor_message_refusal, control_refusal
from troupe.runtime.wire.codec import K_ASK, K_CONTROL, K_ERROR, K_REPLY, Codec, Envelope, Kind
from troupe.runtime.wire.replies import error_payload, raise_error_payload

from .cell import Cell, Msg
from .control_payloads import clipped
from .message_deadline import arrived
from .peer_limits import PeerLogGate
from .throttle import PeerThrottle, describe_peer

if TYPE_CHECKING:
    from troupe.runtime.transports.base import Transport

    from .runtime import ControlHandler

__all__ = ["Answer", "Inbound"]

log = get_logger(__name__)


class Answer:
    """What a plain (non-``async``) control handler returns: its reply, now or later.

    ``Answer.now(value)``: the reply is ``value``. ``Answer(future, then)``: the reply is
    ``then(future.result())`` once the future is done; ``then`` may return another Answer, or
    raise (the asker then gets the error, as from any handler). The router sends the reply from
    the future's done callback, without a task. An Answer is awaitable too, so whoever calls a
    handler directly (a test, a wrapper) awaits it like an ``async`` handler's result.
    """

    __slots__ = ("future", "then", "value")

    def __init__(self, future: asyncio.Future[Any] | None, then: Callable[[Any], Any] | None = None) -> None:
        self.future = future
        self.then = then
        self.value: Any = None

    @classmethod
    def now(cls, value: Any) -> Answer:
        """The reply, ready."""
        answer = cls(None)
        answer.value = value
        return answer

    def __await__(self) -> Generator[Any, None, Any]:
        answer: Any = self
        while type(answer) is Answer:
            if answer.future is None:
                return answer.value
            result = yield from answer.future.__await__()
            answer = answer.then(result) if answer.then is not None else result
        return answer


class Inbound:
    """The receiving half of a Runtime (a mixin: it uses the runtime's fields)."""

    node: str
    process: str
    _process_key: str  # "node/process", the sender of replies
    codec: Codec
    transport: Transport
    cells: dict[str, Cell]
    control_handlers: Mapping[str, ControlHandler]  # read-only; Runtime.register_control adds
    _pending: dict[int, asyncio.Future[Any]]
    _accepting: bool
    _bad_frames: int
    _late_replies: int
    _throttle: PeerThrottle  # the allowance of bad frames per peer
    _reply_junk_log: PeerLogGate  # bad frames on our own connections to peers
    _errors_suppressed: int
    before_handle: list[Any]
    # CURVE is on: routes carry the sender's user id, and a reader's may be refused (roles).
    _guarded: bool = False

    start_soon: Any  # Runtime.start_soon: run a task owned by the runtime

    def _settle_reply(self, kind: Kind, corr_id: int, payload: Any) -> None:
        fut = self._pending.pop(corr_id, None)
        if fut is None or fut.done():
            self._late_replies += 1
            if kind is K_ERROR and isinstance(payload, dict):
                log.warning("error_reply_unclaimed", corr_id=corr_id, error=payload.get("message"))
            return
        if kind is K_REPLY:
            fut.set_result(payload)
        else:
            fut.set_exception(_error_from(payload))

    def _settle_unreadable(self, corr_id: int, exc: ProtocolError) -> None:
        fut = self._pending.pop(corr_id, None)
        if fut is not None and not fut.done():
            fut.set_exception(BadFrame(f"the reply could not be read: {exc}"))

    def _on_frames_now(self, route: Any, frames: list[Any]) -> bool:
        """Handle a message at once when that needs no waiting: a reply, or a tell or ask for
        a known actor whose mailbox has room. Return False, having changed nothing, otherwise:
        the message then takes the full path (``_on_frames``), errors and waiting included."""
        throttle = self._throttle
        if throttle.active and throttle.blocked(route):
            return True  # dropped unread, counted by the throttle
        try:
            # The fields, not an Envelope: one object less per message (codec.decode_fields).
            f = self.codec.decode_fields(frames)
        except ProtocolError:
            return False
        kind = f[1]
        if kind is K_REPLY:
            # ``_settle_reply`` of a REPLY, inlined (one per remote ask): the asker's future.
            fut = self._pending.pop(f[3], None)
            if fut is not None and not fut.done():
                fut.set_result(f[10])
            else:
                self._late_replies += 1
            return True
        if kind is K_ERROR:
            self._settle_reply(kind, f[3], f[10])
            return True
        if not self._accepting:
            return False
        if kind is K_CONTROL:
            control = self.control_handlers.get(f[6])
            if control is None or _is_async(control):
                return False  # an error, or a task of its own: both from the pump (a task)
            if self._guarded and control_refusal(route, f[6]) is not None:
                return False  # refused with its reason on the full path
            self._run_control(route, f[2], f[6], control, f[10])
            return True
        target = f[5]
        if self._guarded and actor_message_refusal(route, target) is not None:
            return False  # refused with its reason on the full path
        cell = self.cells.get(target)
        if cell is None:
            return False
        msg_type = f[6]
        handler = cell.handlers.get(msg_type)
        if handler is None:
            return False
        # kind, msg_id, sender, type, deadline, trace, headers, payload
        deadline, headers = f[7], f[9]
        if deadline is not None or headers is not None:  # a plain tell has neither: no call
            deadline, headers = arrived(deadline, headers)
        msg = Msg(kind, f[2], f[4], msg_type, deadline, f[8], headers, f[10], route, None)
        # An idle actor's mailbox has room (Mailbox.consumer_parked): only a queued message
        # needs the look at ``full``.
        if not handler.is_async and not self.before_handle and cell.handle_now(msg, handler):
            return True
        if cell.mailbox.full():
            return False
        cell.mailbox.put_nowait(msg)
        return True

    async def _on_frames(self, route: Any, frames: list[Any]) -> None:
        throttle = self._throttle
        if throttle.active and throttle.blocked(route):
            return
        try:
            env = self.codec.decode(frames)
        except ProtocolError as exc:
            self._bad_frames += 1
            ids = exc.envelope
            if route is None:  # a peer we connected to: nobody to answer, nor to throttle
                if self._reply_junk_log.should_log(None):
                    log.warning("bad_reply_dropped", reason=str(exc), code=exc.code)
                if ids is not None and (ids[0] is K_REPLY or ids[0] is K_ERROR):
                    self._settle_unreadable(ids[2], exc)  # the ask fails now, not at its deadline
                return
            # A peer flooding bad frames earns a few answers (and log lines), then is throttled.
            if not throttle.bad_frame(route, str(exc)):
                self._errors_suppressed += 1
                return
            log.warning(
                "bad_frame_dropped",
                reason=str(exc),
                code=exc.code,
                frames=len(frames),
                peer=describe_peer(route),
            )
            if ids is not None and (ids[0] is K_ASK or ids[0] is K_CONTROL):  # the asker hears why at once
                await self.reply_error(route, ids[1], ids[3], exc)
            else:
                await self.reply_error(route, 0, "", exc)
            return
        kind = env.kind
        if kind is K_REPLY or kind is K_ERROR:
            self._settle_reply(kind, env.corr_id, env.payload)
            return
        if not self._accepting:
            await self.reply_error(
                route, env.msg_id, env.target, ActorStopped("the process is shutting down")
            )
            return
        if kind is K_CONTROL:
            refused_control = control_refusal(route, env.type) if self._guarded else None
            if refused_control is not None:
                log.warning("control_refused", type=clipped(env.type), reason=str(refused_control))
                await self.reply_error(route, env.msg_id, "", refused_control)
                return
            handler = self.control_handlers.get(env.type)
            if handler is None:
                await self.reply_error(
                    route,
                    env.msg_id,
                    "",
                    UnknownMessageType(
                        f"no control message {clipped(env.type)}; known: {sorted(self.control_handlers)}"
                    ),
                )
                return
            self._run_control(route, env.msg_id, env.type, handler, env.payload)
            return
        refused = actor_message_refusal(route, env.target) if self._guarded else None
        if refused is not None:
            log.warning(
                "message_refused", target=clipped(env.target), type=clipped(env.type), reason=str(refused)
            )
            await self.reply_error(route, env.msg_id, env.target, refused)
            return
        cell = self.cells.get(env.target)
        if cell is None:
            log.warning(
                "unknown_actor",
                target=clipped(env.target),
                type=clipped(env.type),
                sender=clipped(env.sender),
            )
            await self.reply_error(
                route,
                env.msg_id,
                env.target,
                UnknownActor(
                    f"no actor named {clipped(env.target)} in {self.node}/{self.process}; "
                    f"actors here: {sorted(self.cells)}"
                ),
            )
            return
        if env.type not in cell.handlers:
            log.warning("unknown_message_type", actor=env.target, type=clipped(env.type))
            await self.reply_error(
                route,
                env.msg_id,
                env.target,
                UnknownMessageType(
                    f"actor {env.target!r} has no handler for {clipped(env.type)}; "
                    f"it handles {sorted(cell.handlers)}"
                ),
            )
            return
        deadline, headers = arrived(env.deadline, env.headers)
        msg = Msg(
            kind,
            env.msg_id,
            env.sender,
            env.type,
            deadline,
            env.trace,
            headers,
            env.payload,
            route,
            None,
        )
        try:
            await cell.deliver(msg, True)
        except ActorStopped as exc:
            await self.reply_error(route, env.msg_id, env.target, exc)

    def _run_control(
        self, route: Any, msg_id: int, msg_type: str, handler: ControlHandler, payload: Any
    ) -> None:
        """Call a control's handler (its caller checked the roles) and see that it is answered:
        at once, from a future's callback, or from a task of its own (see the module). An
        ``async`` handler comes here from the pump only: a task may start there."""
        try:
            answer = handler(payload)
        except Exception as exc:
            self._control_failed(route, msg_id, msg_type, exc)
            return
        if isinstance(answer, Coroutine) and _is_async(handler):  # a task of its own
            try:
                self.start_soon(self._await_control, route, msg_id, msg_type, answer)
            except RuntimeError:  # the runtime stopped serving meanwhile: nobody will answer
                answer.close()
            return
        self._answer(route, msg_id, msg_type, answer)

    def _answer(self, route: Any, msg_id: int, msg_type: str, answer: Any) -> None:
        while type(answer) is Answer:
            future = answer.future
            if future is None:
                answer = answer.value
                break
            if not future.done():
                future.add_done_callback(partial(self._answer_later, route, msg_id, msg_type, answer.then))
                return
            try:
                answer = self._then(answer.then, future)
            except asyncio.CancelledError:  # the runtime is stopping: nobody answers
                return
            except Exception as exc:
                self._control_failed(route, msg_id, msg_type, exc)
                return
        if isinstance(answer, asyncio.Future):
            self._answer(route, msg_id, msg_type, Answer(answer))
            return
        if isinstance(answer, Coroutine):  # where no task may start (a reader, a callback)
            answer.close()
            error = TypeError(f"control {msg_type!r}: a plain control handler returned a coroutine")
            self._control_failed(route, msg_id, msg_type, error)
            return
        self.reply_now(route, msg_id, answer, msg_type=msg_type)

    def _answer_later(
        self,
        route: Any,
        msg_id: int,
        msg_type: str,
        then: Callable[[Any], Any] | None,
        future: asyncio.Future[Any],
    ) -> None:
        try:
            answer = self._then(then, future)
        except asyncio.CancelledError:  # the runtime is stopping: its askers hear that from their side
            return
        except Exception as exc:
            self._control_failed(route, msg_id, msg_type, exc)
            return
        self._answer(route, msg_id, msg_type, answer)

    @staticmethod
    def _then(then: Callable[[Any], Any] | None, future: asyncio.Future[Any]) -> Any:
        result = future.result()
        return then(result) if then is not None else result

    async def _await_control(
        self, route: Any, msg_id: int, msg_type: str, answer: Coroutine[Any, Any, Any]
    ) -> None:
        try:
            result = await answer
        except Exception as exc:
            self._control_failed(route, msg_id, msg_type, exc)
            return
        self._answer(route, msg_id, msg_type, result)

    def _control_failed(self, route: Any, msg_id: int, msg_type: str, exc: Exception) -> None:
        # A troupe error is the handler's answer to the asker (an unknown job, a refused
        # option): the asker is told, and it is no warning here. Anything else is a fault.
        (log.info if isinstance(exc, TroupeError) else log.warning)(
            "control_failed", type=msg_type, error=repr(exc)
        )
        self.reply_error_now(route, msg_id, exc)

    async def reply(self, route: Any, msg_id: int, result: Any, actor: str = "", msg_type: str = "") -> bool:
        """Send a handler's result back through ``route``: ``actor``'s handler of ``msg_type``,
        named if the result cannot be encoded. False then: the asker got an error saying so."""
        try:
            frames = self.codec.encode_reply(msg_id, self._process_key, result)
        except ProtocolError as exc:
            instead = self._encode_instead(msg_id, actor, msg_type, result, exc)
            if instead is None:
                await self.reply_error(route, msg_id, actor, self._unsendable_reply(exc, actor, msg_type))
                return False
            frames = instead
        await self.transport.reply(route, frames)
        return True

    def reply_now(self, route: Any, msg_id: int, result: Any, actor: str = "", msg_type: str = "") -> bool:
        """Send a handler's result back without waiting (the transport holds a reply that cannot
        leave at once for a bounded retry, or drops and counts it); False, as ``reply``, for a
        result that cannot be encoded."""
        try:
            frames = self.codec.encode_reply(msg_id, self._process_key, result)
        except ProtocolError as exc:
            instead = self._encode_instead(msg_id, actor, msg_type, result, exc)
            if instead is None:
                self.reply_error_now(route, msg_id, self._unsendable_reply(exc, actor, msg_type), actor)
                return False
            frames = instead
        self.transport.try_reply(route, frames)
        return True

    def _encode_instead(
        self, msg_id: int, actor: str, msg_type: str, result: Any, exc: ProtocolError
    ) -> list[Any] | None:
        """The frames of what ``actor`` answers instead of a ``result`` that could not be
        encoded (``Actor.reply_instead``: a stage's batch, the outcomes that travel and an error
        for each one that does not), or None where it has nothing else to answer."""
        cell = self.cells.get(actor) if actor else None
        if cell is None:
            return None
        try:
            instead = cell.actor.reply_instead(msg_type, result, exc)
            return self.codec.encode_reply(msg_id, self._process_key, instead)
        except Exception as failed:
            if failed is not exc:  # the actor's answer instead failed too: the asker hears of the first
                log.warning("reply_instead_failed", actor=actor, type=msg_type, error=repr(failed))
            return None

    def _unsendable_reply(self, exc: ProtocolError, actor: str, msg_type: str) -> ProtocolError:
        """What the asker learns of a handler's result that cannot travel (a lambda, an object,
        nesting past the recursion limit, past the size bound): that the request was handled
        and which handler's reply failed. It said only "no wire encoding for function", as if
        the asker's own send had failed, and the worker logged nothing."""
        if actor:
            what = f"actor {self.node}/{self.process}/{actor}'s {msg_type!r} handler"
        else:
            what = f"control {msg_type!r}"
        log.warning("reply_unencodable", actor=actor, type=msg_type, error=str(exc))
        return type(exc)(
            f"the reply of {what} could not be sent (the request was delivered and handled; "
            f"change what the handler returns): {exc}"
        )

    def reply_error_now(self, route: Any, msg_id: int, exc: BaseException, actor: str = "") -> None:
        """Answer ``msg_id`` through ``route`` with an ERROR for ``exc``, without waiting (as
        ``reply_now``); nothing when no route."""
        if route is None:
            return
        payload = error_payload(exc, f"{self.node}/{self.process}/{actor}" if actor else "")
        env = Envelope(Kind.ERROR, 0, msg_id, self._process_key, "", "", None, None, None, payload)
        self.transport.try_reply(route, self.codec.encode(env))

    async def reply_error(self, route: Any, msg_id: int, actor: str, exc: BaseException) -> None:
        """Answer ``msg_id`` through ``route`` with an ERROR for ``exc`` (nothing when no route)."""
        if route is None:
            return
        payload = error_payload(exc, f"{self.node}/{self.process}/{actor}" if actor else "")
        await self.reply_error_payload(route, msg_id, payload)

    async def reply_error_payload(self, route: Any, msg_id: int, payload: dict[str, Any]) -> None:
        """Answer ``msg_id`` through ``route`` with an ERROR carrying ``payload`` as it is."""
        if route is None:
            return
        env = Envelope(Kind.ERROR, 0, msg_id, self._process_key, "", "", None, None, None, payload)
        await self.transport.reply(route, self.codec.encode(env))

    async def _fail(self, msg: Msg, exc: BaseException) -> None:
        """Answer a message that will never be handled: local asks at once, remote via route."""
        if msg.future is not None:
            if not msg.future.done():
                msg.future.set_exception(exc)
        elif msg.kind is K_ASK:
            await self.reply_error(msg.route, msg.msg_id, "", exc)


def _is_async(handler: Any) -> bool:
    """Whether calling ``handler`` makes a coroutine: an ``async`` function or method, a partial
    of one, or an object whose ``__call__`` is one."""
    return iscoroutinefunction(handler) or iscoroutinefunction(type(handler).__call__)


def _error_from(payload: Any) -> TroupeError:
    try:
        raise_error_payload(payload)
    except TroupeError as exc:
        return exc
    except RecursionError:  # a peer's error nested deeper than str() goes
        return DeliveryError("malformed error reply: nested too deep to read")
    return DeliveryError(f"malformed error reply: {payload!r}")
