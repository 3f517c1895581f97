"""The cell around one actor: its mailbox, its task, and how one message is handled."""

from __future__ import annotations

import asyncio
import contextvars
import enum
import math
import time
from typing import TYPE_CHECKING, Any, ClassVar

import anyio
import structlog

from troupe.runtime.library_logging import get_logger

try:
    import sniffio
except ModuleNotFoundError:  # anyio works without it, then by asking asyncio for a running loop
    # mypy sees an error here only where sniffio is installed (newer anyio does not require it).
    sniffio = None  # type: ignore[assignment,unused-ignore]

from troupe.runtime.errors import ActorStopped, UnknownMessageType
from troupe.runtime.wire.codec import K_ASK, Kind
from troupe.runtime.wire.replies import error_payload, raise_error_payload

from .actor import CURRENT_CELL, Actor, Handler, MessageContext
from .mailbox import Mailbox

if TYPE_CHECKING:
    from .runtime import Runtime

__all__ = ["DROP", "PROCEED", "Cell", "Msg", "Verdict"]

log = get_logger(__name__)


class Verdict(enum.Enum):
    """What a before-handle hook tells the cell to do with a message (the one ``DROP``)."""

    PROCEED = "proceed"
    DROP = "drop"


PROCEED = Verdict.PROCEED
DROP = Verdict.DROP
"""Returned by a before-handle hook to lose the message on purpose (fault injection)."""


class Msg:
    """A message inside a process, whether it came off the wire or from a local sender.

    ``deadline`` is on this process's ``time.monotonic()`` clock (message_deadline.py), not
    the wire's wall clock."""

    __slots__ = (
        "deadline",
        "future",
        "headers",
        "kind",
        "msg_id",
        "payload",
        "route",
        "sender",
        "trace",
        "type",
    )

    def __init__(
        self,
        kind: Kind,
        msg_id: int,
        sender: str,
        type: str,
        deadline: float | None,
        trace: str | None,
        headers: dict[str, Any] | None,
        payload: Any,
        route: Any,
        future: asyncio.Future[Any] | None,
    ) -> None:
        self.kind = kind
        self.msg_id = msg_id
        self.sender = sender
        self.type = type
        self.deadline = deadline
        self.trace = trace
        self.headers = headers
        self.payload = payload
        self.route = route
        self.future = future


def _cancel_requested() -> bool:
    """Whether a cancel scope around the running task was cancelled: a CancelledError is then
    the runtime's own (its shutdown past the drain deadline cancels its task group's scope, or
    whatever encloses the runtime was cancelled), not the handler's.

    anyio's answer (``current_effective_deadline``: -inf where the current scope or one it does
    not shield from is cancelled), not ``Task.cancelling()``: that counts every ``Task.cancel``,
    a handler's of its own task (``asyncio.current_task().cancel()``) too, which ended the whole
    worker. A CancelledError the handler met with no scope cancelled (it cancelled itself, a
    task it awaited was cancelled elsewhere, or it raised one) is its own. Should the runtime's
    scope be cancelled in the same instant, it loses nothing: anyio delivers a scope's
    cancellation again at the task's next wait.
    """
    return anyio.current_effective_deadline() == -math.inf


def _forget_own_cancel() -> None:
    """Undo the cancellation requests the handler left on the cell's task (its own
    ``Task.cancel``): once judged the handler's, its cancel must not outlive it, where
    asyncio's and anyio's scopes would read the count as a cancellation of theirs."""
    task = asyncio.current_task()
    if task is not None:
        while task.cancelling():
            task.uncancel()


async def _raise(exc: BaseException) -> None:
    raise exc


class Cell:
    """Runs one actor: takes messages from its mailbox one at a time and handles them."""

    current: ClassVar[contextvars.ContextVar[Cell | None]] = CURRENT_CELL

    def __init__(self, runtime: Runtime, actor: Actor, name: str) -> None:
        self.runtime = runtime
        self.actor = actor
        self.name = name
        self.handlers = type(actor).handler_table()
        self.mailbox: Mailbox[Msg] = Mailbox(type(actor).mailbox_capacity, name)
        self.handling: Msg | None = None
        self.endpoint = ""  # the actor's own mailbox socket, set by the runtime
        self.sender = str(actor.address)
        self.done = anyio.Event()
        # The actor task's context (Cell.current and the log binding), once the task runs:
        # what a message handled outside the task runs in.
        self._context: contextvars.Context | None = None
        self.handled = 0
        self.handled_at_once = 0  # of ``handled``: outside the task, by ``handle_now``
        self.failed = 0
        self.expired = 0
        self.dropped = 0
        # Counters a layer above adds to the status (a task actor's tasks: tasks/task_runner.py).
        self.more_counts: dict[str, int] = {}

    def context(self) -> MessageContext | None:
        """Describe the message being handled now."""
        msg = self.handling
        if msg is None:
            return None
        return MessageContext(msg.type, msg.msg_id, msg.sender, msg.trace, msg.headers, msg.kind is K_ASK)

    def statistics(self) -> dict[str, Any]:
        """Counters and mailbox state, as plain data for status replies."""
        mb = self.mailbox.statistics()
        return {
            "kind": type(self.actor).kind,
            "endpoint": self.endpoint,
            "handled": self.handled,
            "handled_at_once": self.handled_at_once,
            "failed": self.failed,
            "expired": self.expired,
            "dropped": self.dropped,
            "mailbox_depth": mb.depth,
            "mailbox_capacity": mb.capacity,
            "mailbox_high_water": mb.high_water,
            "busy": self.handling is not None,
            **self.more_counts,
        }

    async def deliver(self, msg: Msg, block: bool) -> None:
        """Queue a message; a local sender learns of an unknown type at once."""
        if msg.route is None and msg.type not in self.handlers:
            raise UnknownMessageType(
                f"actor {self.name!r} has no handler for {msg.type!r}; it handles {sorted(self.handlers)}"
            )
        if block:
            await self.mailbox.put(msg)
        else:
            self.mailbox.put_nowait(msg)

    async def run(self) -> None:
        """Handle messages until the mailbox is closed and drained."""
        Cell.current.set(self)
        structlog.contextvars.bind_contextvars(actor=self.name)
        self._context = contextvars.copy_context()
        if sniffio is not None:
            # Outside a task anyio cannot tell which event loop runs (it asks sniffio, which
            # looks for a current task): say it here, so a handler run by ``handle_now`` may use
            # anyio (an Event, the runtime's start_soon) as it could in the task.
            self._context.run(sniffio.current_async_library_cvar.set, "asyncio")
        mailbox = self.mailbox
        try:
            while True:
                msg = mailbox.get_nowait()
                if msg is None:
                    msg = await mailbox.get()
                await self._handle(msg)
        except ActorStopped:
            pass
        finally:
            self.done.set()

    def idle(self) -> bool:
        """True when the actor's task waits for its next message and none is queued."""
        return self.handling is None and self._context is not None and self.mailbox.consumer_parked()

    def handle_now(self, msg: Msg, handler: Handler) -> bool:
        """Handle a message whose handler is synchronous right here, outside the actor's task,
        if the actor is idle (see ``idle``); return whether it was handled.

        Only an idle actor, so one message at a time and arrival order still hold. The
        transport's reader callback calls this: it saves waking the actor's task, which is most
        of what a small message costs. The handler runs in the task's context, so
        ``Actor.context`` and the log binding are what they would be in the task.
        """
        context = self._context  # ``idle``, inline: this runs for every message
        if self.handling is not None or context is None or not self.mailbox.consumer_parked():
            return False
        context.run(self._handle_sync, msg, handler)
        return True

    def _handle_sync(self, msg: Msg, handler: Handler) -> None:
        deadline = msg.deadline
        if deadline is not None and deadline < time.monotonic() and self._expired(msg):
            return
        self.handled_at_once += 1
        self.handling = msg
        observer = self.runtime.observer
        if observer is not None:
            observer.begin(self.name, msg.type)
        try:
            result = handler.fn(self.actor, msg.payload)
        except (Exception, asyncio.CancelledError) as exc:
            # A CancelledError here is the handler's own: it awaits nothing, so no cancellation
            # of the runtime's can reach it.
            self.failed += 1
            self.runtime.start_soon(self._answer_failure, msg, exc)
        except BaseException as exc:
            # The handler ends its actor (sys.exit, KeyboardInterrupt, a BaseException of its
            # own): the asker learns at once, as from an async handler, rather than waiting out
            # its deadline.
            if msg.kind is K_ASK:
                self.runtime.reply_error_now(msg.route, msg.msg_id, self._stopped_while(msg, exc))
            if isinstance(exc, (SystemExit, KeyboardInterrupt)):
                raise  # the event loop lets these through: the process ends
            # Any other, raised from this reader's callback, reached the event loop's handler of
            # a callback's errors, which logs it and goes on: the process ran on, its actor
            # too, while the asker was told it stopped. Raised in a task of the runtime's, it
            # ends the runtime as one from an async handler does (out of the actor's task).
            self.runtime.start_soon(_raise, exc)
        else:
            if msg.kind is K_ASK and not self.runtime.reply_now(
                msg.route, msg.msg_id, result, self.name, msg.type
            ):
                self.failed += 1  # its result could not travel: the asker got an error, not it
        finally:
            self.handling = None
            self.handled += 1
            if observer is not None:
                observer.end()

    def _expired(self, msg: Msg) -> bool:
        now = time.monotonic()
        if msg.deadline is not None and msg.deadline < now:
            self.expired += 1
            log.info(
                "message_expired",
                type=msg.type,
                msg_id=msg.msg_id,
                sender=msg.sender,
                late_by_s=round(now - msg.deadline, 3),
            )
            return True
        return False

    async def _handle(self, msg: Msg) -> None:
        runtime = self.runtime
        if self._expired(msg):
            return
        handler = self.handlers[msg.type]
        self.handling = msg
        observer = runtime.observer
        if observer is not None:
            observer.begin(self.name, msg.type)
        try:
            for hook in runtime.before_handle:
                if await hook(self.name, msg.type) is DROP:
                    self.dropped += 1
                    return
            result = handler.fn(self.actor, msg.payload)
            if handler.is_async:
                result = await result
        except Exception as exc:
            self.failed += 1
            await self._answer_failure(msg, exc)
        except asyncio.CancelledError as exc:
            if _cancel_requested():
                await self._answer_stopped(msg, exc)
                raise
            # The handler's own doing (it cancelled itself, awaited a task cancelled elsewhere,
            # or raised it): a failure like any other, not the runtime's shutdown, which ended
            # the whole worker.
            _forget_own_cancel()
            self.failed += 1
            await self._answer_failure(msg, exc)
        except BaseException as exc:
            await self._answer_stopped(msg, exc)
            raise
        else:
            if msg.kind is K_ASK:
                if msg.future is not None:
                    if not msg.future.done():
                        msg.future.set_result(result)
                elif not await runtime.reply(msg.route, msg.msg_id, result, self.name, msg.type):
                    self.failed += 1  # its result could not travel: the asker got an error, not it
        finally:
            self.handling = None
            self.handled += 1
            if observer is not None:
                observer.end()

    async def _answer_stopped(self, msg: Msg, exc: BaseException) -> None:
        """Tell the asker of ``msg`` that its handler ended with the actor (cancelled by the
        shutdown past its drain deadline, or ``sys.exit``): at once, a local one through its
        future, a remote one through an ERROR sent while shielded."""
        stopped = self._stopped_while(msg, exc)
        if msg.future is not None:
            if not msg.future.done():
                msg.future.set_exception(stopped)
        elif msg.kind is K_ASK:
            with anyio.CancelScope(shield=True), anyio.move_on_after(1.0):
                await self.runtime.reply_error(msg.route, msg.msg_id, self.name, stopped)

    def _stopped_while(self, msg: Msg, exc: BaseException) -> ActorStopped:
        """What the asker of ``msg`` learns when its handler ended the actor: cancelled (the
        runtime's stop), or the handler's own doing, said as such: ``sys.exit``, or any other
        BaseException as ``type: message`` (one of a stage's own read as a plain stop, its
        type and message left out). The handler is named as the actor's class names it
        (``Actor.handler_said``: a stage's ``process``, not the ``process_direct`` that ran it)."""
        named = self.actor.handler_said(msg.type)
        did = ""
        if isinstance(exc, SystemExit):
            did = f"called sys.exit({exc.code!r})"
        elif not isinstance(exc, asyncio.CancelledError):
            did = (
                f"raised {type(exc).__qualname__}: {exc}" if str(exc) else f"raised {type(exc).__qualname__}"
            )
        if named is not None:
            said = f": {named} {did}" if did else f" while running {named}"
            return ActorStopped(f"actor {self.name} stopped{said}")
        why = f": its handler {did}" if did else ""
        return ActorStopped(f"actor {self.name} stopped while handling {msg.type!r}{why}")

    async def _answer_failure(self, msg: Msg, exc: BaseException) -> None:
        payload = error_payload(exc, str(self.actor.address), from_handler=True)
        if msg.kind is not K_ASK:
            log.error(
                "handler_failed",
                type=msg.type,
                msg_id=msg.msg_id,
                error=payload["message"],
                exc_type=payload["type"],
                traceback=payload["traceback"],
            )
            return
        log.info("handler_raised", type=msg.type, msg_id=msg.msg_id, error=payload["message"])
        if msg.future is not None:
            if not msg.future.done():
                try:
                    raise_error_payload(payload)
                except Exception as remote:
                    msg.future.set_exception(remote)
            return
        await self.runtime.reply_error_payload(msg.route, msg.msg_id, payload)

    def stop_requested_hook(self) -> None:
        """Run the actor's ``stop_requested`` hook, logging (not raising) its failure."""
        try:
            self.actor.stop_requested()
        except Exception as exc:
            log.error("stop_requested_hook_failed", actor=self.name, error=repr(exc))

    async def stop_hook(self) -> None:
        """Run the actor's ``stopping`` hook, logging (not raising) its failure."""
        try:
            await self.actor.stopping()
        except Exception as exc:
            log.error("stopping_hook_failed", actor=self.name, error=repr(exc))
