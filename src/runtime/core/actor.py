"""The Actor base class: handlers per message type and lifecycle hooks.

An actor handles one message at a time, in arrival order. A handler is a method marked with
``@handles("type")``; it receives the payload and returns the reply (for an ask) or None.
Handlers may be plain functions (CPU work runs on the process's event loop, which is why an
actor gets a worker process of its own) or coroutines.

Example::

    class Greeter(Actor):
        @handles("greet")
        def greet(self, payload):
            return f"hello {payload['name']}"
"""

from __future__ import annotations

import contextvars
import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar

if TYPE_CHECKING:
    from troupe.runtime.errors import ProtocolError

    from .cell import Cell
    from .ref import ActorAddress, ActorRef
    from .runtime import Runtime

__all__ = ["Actor", "Handler", "MessageContext", "handles"]

F = TypeVar("F", bound=Callable[..., Any])

_HANDLES_ATTR = "__troupe_handles__"

CURRENT_CELL: contextvars.ContextVar[Cell | None] = contextvars.ContextVar("troupe_cell", default=None)
"""The cell whose actor runs now (``Cell.current``); here so that an actor need not import its cell."""


@dataclass(frozen=True, slots=True)
class MessageContext:
    """What an actor knows about the message it is handling."""

    type: str
    msg_id: int
    sender: str
    trace: str | None
    headers: dict[str, Any] | None
    is_ask: bool


def handles(msg_type: str) -> Callable[[F], F]:
    """Mark a method as the handler of ``msg_type`` messages."""
    if not msg_type or not isinstance(msg_type, str):
        raise ValueError("a message type must be a non-empty string")

    def mark(fn: F) -> F:
        setattr(fn, _HANDLES_ATTR, msg_type)
        return fn

    return mark


@dataclass(frozen=True, slots=True)
class Handler:
    """A resolved handler: the function and whether it must be awaited."""

    fn: Callable[..., Any]
    is_async: bool


class Actor:
    """Base class of every actor.

    Subclasses declare handlers with ``@handles``. The runtime sets ``address`` and
    ``runtime`` before ``started`` runs. Override the hooks as needed:

    - ``started()``: after the actor is registered, before its first message;
    - ``restarted(reason)``: instead of ``started`` when the actor's process was restarted
      after a failure; the reason says why, so the actor can recover its context;
    - ``stopping()``: after the mailbox has been drained at shutdown;
    - ``reply_instead(msg_type, result, error)``: what to answer instead of a result that
      could not be encoded (by default nothing: the asker gets the ``EncodeError``);
    - ``handler_said(msg_type)``: how an error names the handler of ``msg_type`` where it runs
      a method of another name (by default the message type names it).

    Class attributes:
        mailbox_capacity: the bound of the actor's mailbox.
        kind: the actor kind that supervision policies are keyed by (default: class name).

    A class may also check the values of its constructor's keyword arguments before any of its
    processes starts: ``check_kwargs(kwargs)``, a classmethod given the config's kwargs (those
    given, not the defaults), raising ``ValueError`` (``ConfigError``) with the reason. A config
    is checked against the constructor's annotations too (``kwargs_values``).
    """

    mailbox_capacity: ClassVar[int] = 1000
    kind: ClassVar[str] = ""
    _handlers: ClassVar[dict[str, Handler]] = {}

    address: ActorAddress
    runtime: Runtime

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        table: dict[str, Handler] = {}
        for klass in reversed(cls.__mro__):
            for value in vars(klass).values():
                msg_type = getattr(value, _HANDLES_ATTR, None)
                if msg_type is not None:
                    table[msg_type] = Handler(value, inspect.iscoroutinefunction(value))
        cls._handlers = table
        if not cls.__dict__.get("kind"):
            cls.kind = cls.__name__

    @classmethod
    def check_kwargs(cls, kwargs: dict[str, Any]) -> None:
        """Refuse kwargs whose values the constructor would refuse (see the class docstring).

        Raises:
            ValueError: a value is wrong; the message says which and why.
        """

    @classmethod
    def message_types(cls) -> list[str]:
        """Return the message types this actor handles."""
        return sorted(cls._handlers)

    @classmethod
    def handler_table(cls) -> dict[str, Handler]:
        """Return this actor class's handlers, by message type (what its cell dispatches on)."""
        return cls._handlers

    @property
    def context(self) -> MessageContext | None:
        """The message being handled now, or None outside a handler."""
        cell = CURRENT_CELL.get()
        return cell.context() if cell is not None else None

    def ref(self, address: str) -> ActorRef:
        """Return a reference to another actor (``node/process/actor``, or a shorter name)."""
        return self.runtime.ref(address)

    def progress(self, n: int = 1, note: str | None = None) -> None:
        """Report progress inside long work so the supervisor knows the actor is not stuck."""
        self.runtime.progress(n, note)

    def reply_instead(self, msg_type: str, result: Any, error: ProtocolError) -> Any:
        """What to answer an ask of ``msg_type`` whose ``result`` could not be encoded
        (``error``). The runtime calls this only then, so a reply that travels pays nothing for
        it. By default nothing else: ``error`` is raised, and the asker is told that its reply
        could not be sent. A stage replica answers its batch's outcomes instead, each one that
        cannot travel made that item's error (pipeline/stage.py)."""
        raise error

    def handler_said(self, msg_type: str) -> str | None:
        """What an error names the handler of ``msg_type`` by, where it runs a method a user
        wrote under another name (a stage's ``process``, run by the internal
        ``process_direct``); None (the default): the message type names it."""
        return None

    async def started(self) -> None:
        """Called once before the first message."""

    async def restarted(self, reason: str) -> None:
        """Called instead of ``started`` after a restart; ``reason`` says what failed."""

    def stop_requested(self) -> None:
        """Called at shutdown before the mailbox is drained: the moment to end waits that would
        hold the drain up to its deadline (a wait on a peer that may be stopping too)."""

    async def stopping(self) -> None:
        """Called at shutdown after the mailbox has been drained."""
