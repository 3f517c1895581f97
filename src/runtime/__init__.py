"""troupe's runtime: actors, messaging, nodes and task dispatch. No domain words, no torch.

This module is the public API. Wire-level names for experts (the codec, envelopes, mailboxes,
transports) are in ``troupe.runtime.lowlevel``. The subpackages, each saying what it may import:
core, wire, transports, node, supervision, chaos, tasks (and tasks.master), pipeline, testing.
"""

from __future__ import annotations

from .core.actor import Actor, MessageContext, handles
from .core.client import connect
from .core.ref import ActorAddress, ActorRef
from .core.runtime import Runtime
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
from .pipeline.stage import StageActor
from .tasks.content_store import ContentStore
from .tasks.output_store import OutputStore
from .tasks.task_actor import LeasedTask, TaskActor

__all__ = [
    "Actor",
    "ActorAddress",
    "ActorRef",
    "ActorStopped",
    "AskTimeout",
    "BadFrame",
    "ContentStore",
    "ConfigError",
    "DeliveryError",
    "LeasedTask",
    "MailboxFull",
    "MessageContext",
    "MessageTooLarge",
    "OutputStore",
    "ProtocolError",
    "RemoteError",
    "Runtime",
    "StageActor",
    "TaskActor",
    "TroupeError",
    "UnknownActor",
    "UnknownMessageType",
    "Unreachable",
    "VersionMismatch",
    "connect",
    "handles",
]
