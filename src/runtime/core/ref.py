"""Actor addresses and references.

An address names an actor anywhere: ``node/process/actor``. Shorter forms are resolved
against the caller: ``process/actor`` on the caller's node, and a bare ``actor`` through the
directory (this process first, then the node's directory). A reference caches what it
resolved; when the peer process restarts the cache is dropped and the name resolved again.
"""

from __future__ import annotations

from collections.abc import Coroutine
from dataclasses import dataclass
from typing import Any, Protocol

__all__ = ["ActorAddress", "ActorRef", "RefSender"]

# The most characters of an address an error message shows: a peer's ``resolve`` may name one of
# any length (100 KB came back twice in the error reply), and a real one is far shorter.
SHOWN_MOST = 200

_FOREVER = float("inf")


def _cut(text: str) -> str:
    return text if len(text) <= SHOWN_MOST else text[: SHOWN_MOST - 3] + "..."


@dataclass(frozen=True, slots=True)
class ActorAddress:
    """Where an actor lives: node, process and actor names (empty parts are unresolved)."""

    node: str
    process: str
    actor: str

    @classmethod
    def parse(cls, text: str) -> ActorAddress:
        """Parse ``node/process/actor``, ``process/actor`` or ``actor``.

        Raises:
            ValueError: empty parts or more than three parts.
        """
        parts = text.split("/")
        if len(parts) > 3 or not all(parts):
            raise ValueError(
                f"bad actor address {_cut(repr(text))}: use node/process/actor, process/actor or actor"
            )
        while len(parts) < 3:
            parts.insert(0, "")
        return cls(parts[0], parts[1], parts[2])

    def shown(self) -> str:
        """The address as an error message shows it: cut to ``SHOWN_MOST`` characters, with an
        ellipsis (it may be a peer's)."""
        return _cut(str(self))

    @property
    def process_key(self) -> str:
        """``node/process``, the key of the process in the directory."""
        return f"{self.node}/{self.process}"

    def __str__(self) -> str:
        return "/".join(p for p in (self.node, self.process, self.actor) if p)


class RefSender(Protocol):
    """What a reference needs of its runtime (``Runtime``): sending a tell and an ask to it."""

    def tell_ref(
        self, ref: ActorRef, msg_type: str, payload: Any, block: bool, headers: dict[str, Any] | None
    ) -> Coroutine[Any, Any, None]: ...

    def ask_ref(
        self,
        ref: ActorRef,
        msg_type: str,
        payload: Any,
        timeout: float | None,
        headers: dict[str, Any] | None,
    ) -> Coroutine[Any, Any, Any]: ...


class ActorRef:
    """A handle to send messages to one actor, wherever it lives.

    Obtain one with ``runtime.ref(address)`` or ``actor.ref(address)``; it is cheap to keep.
    ``cell`` and ``endpoint`` are what the runtime resolved (set and read by the runtime only).
    """

    __slots__ = ("_runtime", "address", "cell", "endpoint")

    def __init__(self, runtime: RefSender, address: ActorAddress) -> None:
        self._runtime = runtime
        self.address = address
        self.cell: Any = None  # the local cell, when the actor lives in this process
        self.endpoint: str | None = None  # the peer's mailbox, when it does not

    def __repr__(self) -> str:
        return f"ActorRef({str(self.address)!r})"

    def tell(
        self,
        msg_type: str,
        payload: Any = None,
        *,
        block: bool = True,
        headers: dict[str, Any] | None = None,
    ) -> Coroutine[Any, Any, None]:
        """Send a message without waiting for it to be handled (await the call).

        Args:
            msg_type: the handler to run.
            payload: msgpack-able data; numpy arrays travel as buffers without copies.
            block: wait while the target's mailbox is full (True), or raise MailboxFull.
            headers: optional envelope headers.

        Raises:
            MailboxFull: block=False and the mailbox is full.
            UnknownActor: the name cannot be resolved.
            Unreachable: the target process does not answer.
        """
        if not isinstance(msg_type, str):
            raise _not_a_type(msg_type)
        # The runtime's coroutine itself, not one wrapping it: a level less on every message.
        return self._runtime.tell_ref(self, msg_type, payload, block, headers)

    def ask(
        self,
        msg_type: str,
        payload: Any = None,
        *,
        timeout: float | None = None,
        headers: dict[str, Any] | None = None,
    ) -> Coroutine[Any, Any, Any]:
        """Send a message and wait for the handler's result (await the call).

        Args:
            msg_type: the handler to run.
            payload: msgpack-able data.
            timeout: seconds before AskTimeout (default: the runtime's ask timeout).
            headers: optional envelope headers.

        Raises:
            AskTimeout: no reply in time; a later reply is discarded.
            RemoteError: the handler raised; type, message and traceback are attached.
            UnknownActor, UnknownMessageType, ActorStopped: delivery failed.
            TypeError, ValueError: ``timeout`` is not a number, or not finite and > 0.
        """
        if not isinstance(msg_type, str):
            raise _not_a_type(msg_type)
        # One type test and two comparisons, where a timeout is given (nan fails both).
        if timeout is not None and not (isinstance(timeout, (int, float)) and 0 < timeout < _FOREVER):
            raise _bad_timeout(timeout)
        return self._runtime.ask_ref(self, msg_type, payload, timeout, headers)

    def invalidate(self) -> None:
        """Forget what was resolved; the next send resolves the name again."""
        self.cell = None
        self.endpoint = None


def _not_a_type(msg_type: object) -> TypeError:
    """A message type that is no string: refused here, at the caller, at once (the receiver
    refused it, and the ask waited out its deadline for a reply that never came)."""
    return TypeError(f"msg_type must be a str (a handler's name), got {type(msg_type).__name__} {msg_type!r}")


def _bad_timeout(timeout: object) -> TypeError | ValueError:
    """A timeout no ask can wait: refused at the caller, at once (-1 and nan waited for nothing and
    said AskTimeout, blaming the node; '5' raised a bare TypeError from deep in the runtime)."""
    if not isinstance(timeout, (int, float)):
        return TypeError(
            f"timeout must be a number of seconds, got {type(timeout).__name__} {_cut(repr(timeout))}"
        )
    return ValueError(f"timeout must be a finite number of seconds > 0, got {timeout!r}")
