"""troupe's runtime: actors, messaging, nodes and task dispatch. No domain words, no torch.

This module is the public API: what actors, clients and task code are written with, every
error troupe raises, and the value types those return. Wire-level names for experts (the
codec, envelopes, frame constants, error-reply helpers, mailboxes, transports) are in
``troupe.runtime.lowlevel``. The rule (tests/runtime/test_exported_members.py): a module either
export takes a name from is an API module, and each public class it defines is exported by one
of the two; the other modules are the runtime's machinery, public to each other and to
troupe.cli, not to user code. The subpackages, each saying what it may import: core, wire,
transports, node, supervision, chaos, tasks (and tasks.master), pipeline, testing.
"""

from __future__ import annotations

from .core.actor import Actor, MessageContext, handles
from .core.client import connect
from .core.ref import ActorAddress, ActorRef
from .core.runtime import Runtime, RuntimeStats
from .errors import (
    ActorStopped,
    AskTimeout,
    BadFrame,
    BadRequest,
    CommitError,
    ConfigError,
    ContentError,
    DeliveryError,
    EncodeError,
    FaultInjected,
    InvalidTaskId,
    ItemFailed,
    JournalError,
    MailboxFull,
    MessageTooLarge,
    Partitioned,
    ProtocolError,
    RemoteError,
    TaskError,
    TroupeError,
    UnknownActor,
    UnknownMessageType,
    UnknownWorker,
    Unreachable,
    VersionMismatch,
)
from .pipeline.stage import StageActor
from .tasks.content_store import ContentStore, ContentStoreStats
from .tasks.output_store import OutputStore, OutputStoreStats, Staged
from .tasks.task_actor import LeasedTask, TaskActor

__all__ = [
    "Actor",
    "ActorAddress",
    "ActorRef",
    "ActorStopped",
    "AskTimeout",
    "BadFrame",
    "BadRequest",
    "CommitError",
    "ConfigError",
    "ContentError",
    "ContentStore",
    "ContentStoreStats",
    "DeliveryError",
    "EncodeError",
    "FaultInjected",
    "InvalidTaskId",
    "ItemFailed",
    "JournalError",
    "LeasedTask",
    "MailboxFull",
    "MessageContext",
    "MessageTooLarge",
    "OutputStore",
    "OutputStoreStats",
    "Partitioned",
    "ProtocolError",
    "RemoteError",
    "Runtime",
    "RuntimeStats",
    "StageActor",
    "Staged",
    "TaskActor",
    "TaskError",
    "TroupeError",
    "UnknownActor",
    "UnknownMessageType",
    "UnknownWorker",
    "Unreachable",
    "VersionMismatch",
    "connect",
    "handles",
]
