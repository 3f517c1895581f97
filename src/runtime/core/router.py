"""What a runtime does with what arrives: decode, validate, route, answer.

Every received message is decoded and validated first. A bad frame is logged with its reason,
counted, answered with an ERROR where the sender can be reached, and dropped; a peer that sends
more bad frames than its allowance is throttled (core/throttle.py): its messages are dropped
unread for a while. Replies settle pending asks; control messages run as tasks of their own;
tells and asks go to the target actor's mailbox, whose bound pushes back on the sender's socket
when full.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import structlog

from troupe.runtime.errors import (
    ActorStopped,
    DeliveryError,
    ProtocolError,
    TroupeError,
    UnknownActor,
    UnknownMessageType,
)
from troupe.runtime.security.roles import actor_message_refusal, control_refusal
from troupe.runtime.wire.codec import K_ASK, K_CONTROL, K_ERROR, K_REPLY, Codec, Envelope, Kind
from troupe.runtime.wire.replies import error_payload, raise_error_payload

from .cell import Cell, Msg
from .peer_limits import PeerLogGate
from .throttle import PeerThrottle, describe_peer

if TYPE_CHECKING:
    from troupe.runtime.transports.base import Transport

    from .runtime import ControlHandler

__all__ = ["Inbound"]

log = structlog.get_logger(__name__)


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
        if kind is K_REPLY or kind is K_ERROR:
            self._settle_reply(kind, f[3], f[10])
            return True
        if kind is K_CONTROL or not self._accepting:
            return False
        target = f[5]
        if self._guarded and actor_message_refusal(route, target) is not None:
            return False  # refused with its reason on the full path
        cell = self.cells.get(target)
        if cell is None:
            return False
        msg_type = f[6]
        handler = cell.handlers.get(msg_type)
        if handler is None or cell.mailbox.full():
            return False
        # kind, msg_id, sender, type, deadline, trace, headers, payload
        msg = Msg(kind, f[2], f[4], msg_type, f[7], f[8], f[9], f[10], route, None)
        if not handler.is_async and not self.before_handle and cell.idle():
            cell.handle_now(msg, handler)
        else:
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
            if route is None:  # a peer we connected to: nobody to answer, nor to throttle
                if self._reply_junk_log.should_log(None):
                    log.warning("bad_reply_dropped", reason=str(exc), code=exc.code)
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
            self.start_soon(self._run_control, route, env)
            return
        refused = actor_message_refusal(route, env.target) if self._guarded else None
        if refused is not None:
            log.warning("message_refused", target=env.target, type=env.type, reason=str(refused))
            await self.reply_error(route, env.msg_id, env.target, refused)
            return
        cell = self.cells.get(env.target)
        if cell is None:
            log.warning("unknown_actor", target=env.target, type=env.type, sender=env.sender)
            await self.reply_error(
                route,
                env.msg_id,
                env.target,
                UnknownActor(
                    f"no actor named {env.target!r} in {self.node}/{self.process}; "
                    f"actors here: {sorted(self.cells)}"
                ),
            )
            return
        if env.type not in cell.handlers:
            log.warning("unknown_message_type", actor=env.target, type=env.type)
            await self.reply_error(
                route,
                env.msg_id,
                env.target,
                UnknownMessageType(
                    f"actor {env.target!r} has no handler for {env.type!r}; "
                    f"it handles {sorted(cell.handlers)}"
                ),
            )
            return
        msg = Msg(
            kind,
            env.msg_id,
            env.sender,
            env.type,
            env.deadline,
            env.trace,
            env.headers,
            env.payload,
            route,
            None,
        )
        try:
            await cell.deliver(msg, True)
        except ActorStopped as exc:
            await self.reply_error(route, env.msg_id, env.target, exc)

    async def _run_control(self, route: Any, env: Envelope) -> None:
        refused = control_refusal(route, env.type) if self._guarded else None
        if refused is not None:
            log.warning("control_refused", type=env.type, reason=str(refused))
            await self.reply_error(route, env.msg_id, "", refused)
            return
        handler = self.control_handlers.get(env.type)
        if handler is None:
            await self.reply_error(
                route,
                env.msg_id,
                "",
                UnknownMessageType(
                    f"no control message {env.type!r}; known: {sorted(self.control_handlers)}"
                ),
            )
            return
        try:
            result = await handler(env.payload)
        except Exception as exc:
            log.warning("control_failed", type=env.type, error=repr(exc))
            await self.reply_error(route, env.msg_id, "", exc)
            return
        await self.reply(route, env.msg_id, result)

    async def reply(self, route: Any, msg_id: int, result: Any) -> None:
        """Send a handler's result back through ``route``."""
        try:
            frames = self.codec.encode_reply(msg_id, self._process_key, result)
        except ProtocolError as exc:
            await self.reply_error(route, msg_id, "", exc)
            return
        await self.transport.reply(route, frames)

    def reply_now(self, route: Any, msg_id: int, result: Any) -> None:
        """Send a handler's result back without waiting (the transport holds a reply that cannot
        leave at once for a bounded retry, or drops and counts it); one that fails to encode is
        left to a task."""
        try:
            frames = self.codec.encode_reply(msg_id, self._process_key, result)
        except ProtocolError as exc:
            self.start_soon(self.reply_error, route, msg_id, "", exc)
            return
        self.transport.try_reply(route, frames)

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


def _error_from(payload: Any) -> TroupeError:
    try:
        raise_error_payload(payload)
    except TroupeError as exc:
        return exc
    except RecursionError:  # a peer's error nested deeper than str() goes
        return DeliveryError("malformed error reply: nested too deep to read")
    return DeliveryError(f"malformed error reply: {payload!r}")
