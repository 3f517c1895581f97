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
from .client import connect
from .commit import OutputStore
from .content_store import ContentStore
from .host import Runtime
from .mailbox import Mailbox, MailboxStats
from .ref import ActorAddress, ActorRef
from .stage import StageActor
from .task_actor import LeasedTask, TaskActor
from .transport import MemoryHub, MemoryTransport, Transport

__all__ = [
    "Actor",
    "ActorAddress",
    "ActorRef",
    "ActorStopped",
    "AskTimeout",
    "BadFrame",
    "BufferExtension",
    "ContentStore",
    "Codec",
    "ConfigError",
    "DeliveryError",
    "Envelope",
    "Kind",
    "LeasedTask",
    "Mailbox",
    "MailboxFull",
    "MailboxStats",
    "MemoryHub",
    "MemoryTransport",
    "MessageContext",
    "MessageTooLarge",
    "OutputStore",
    "ProtocolError",
    "RemoteError",
    "Runtime",
    "StageActor",
    "TaskActor",
    "Transport",
    "TroupeError",
    "UnknownActor",
    "UnknownMessageType",
    "Unreachable",
    "VersionMismatch",
    "connect",
    "handles",
    "register_extension",
]
