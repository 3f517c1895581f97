"""Wire-level names, for experts: the codec and its extensions, envelopes, mailboxes, transports.

Actors and clients need none of these; they use ``troupe`` (or ``troupe.runtime``). A codec
extension (``register_extension``, ``BufferExtension``) or a custom transport starts here.
"""

from __future__ import annotations

from .core.mailbox import Mailbox, MailboxStats
from .transports.base import MemoryHub, MemoryTransport, Transport
from .wire.codec import BufferExtension, Codec, Envelope, Kind, register_extension

__all__ = [
    "BufferExtension",
    "Codec",
    "Envelope",
    "Kind",
    "Mailbox",
    "MailboxStats",
    "MemoryHub",
    "MemoryTransport",
    "Transport",
    "register_extension",
]
