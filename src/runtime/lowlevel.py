"""Wire-level names, for experts: the codec and its extensions, envelopes, frame constants,
error-reply helpers, mailboxes, transports and the runtime's hook protocols.

Actors and clients need none of these; they use ``troupe`` (or ``troupe.runtime``). A codec
extension (``register_extension``, ``BufferExtension``), a custom transport or a tool that
speaks the protocol itself starts here.
"""

from __future__ import annotations

from .core.actor import Handler
from .core.mailbox import Mailbox, MailboxStats
from .core.ref import RefSender
from .core.runtime import HandleObserver
from .transports.base import MemoryHub, MemoryTransport, Transport, TransportStats
from .wire.codec import (
    PROTOCOL_VERSION,
    BufferExtension,
    Codec,
    Envelope,
    Kind,
    load_imported_extensions,
    register_extension,
)
from .wire.replies import error_payload, raise_error_payload

__all__ = [
    "PROTOCOL_VERSION",
    "BufferExtension",
    "Codec",
    "Envelope",
    "HandleObserver",
    "Handler",
    "Kind",
    "Mailbox",
    "MailboxStats",
    "MemoryHub",
    "MemoryTransport",
    "RefSender",
    "Transport",
    "TransportStats",
    "error_payload",
    "load_imported_extensions",
    "raise_error_payload",
    "register_extension",
]
