"""troupe's runtime: actors, messaging, nodes and task dispatch. No domain words, no torch."""

from __future__ import annotations

from .actor import Actor, MessageContext, handles
from .codec import BufferExtension, Codec, Envelope, Kind, register_extension
from .errors import (
    ActorStopped,
    AskTimeout,
    BadFrame,
    ConfigError,
    DeliveryError,
    MailboxFull,
    MessageTooLarge,
    ProtocolError,
    RemoteError,
    TroupeError,
    UnknownActor,
    UnknownMessageType,
    Unreachable,
    VersionMismatch,
)
from .host import Runtime
from .mailbox import Mailbox, MailboxStats
from .ref import ActorAddress, ActorRef
from .transport import MemoryHub, MemoryTransport, Transport

__all__ = [
    "Actor",
    "ActorAddress",
    "ActorRef",
    "ActorStopped",
    "AskTimeout",
    "BadFrame",
    "BufferExtension",
    "Codec",
    "ConfigError",
    "DeliveryError",
    "Envelope",
    "Kind",
    "Mailbox",
    "MailboxFull",
    "MailboxStats",
    "MemoryHub",
    "MemoryTransport",
    "MessageContext",
    "MessageTooLarge",
    "ProtocolError",
    "RemoteError",
    "Runtime",
    "Transport",
    "TroupeError",
    "UnknownActor",
    "UnknownMessageType",
    "Unreachable",
    "VersionMismatch",
    "handles",
    "register_extension",
]
