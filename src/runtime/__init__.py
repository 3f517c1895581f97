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

import importlib
from typing import TYPE_CHECKING, Any

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
    JobCancelled,
    JournalDamaged,
    JournalError,
    MailboxFull,
    MessageTooLarge,
    NameTaken,
    Partitioned,
    PeerLost,
    ProtocolError,
    RemoteError,
    StageFailed,
    TaskError,
    TroupeError,
    UnknownActor,
    UnknownMessageType,
    UnknownWorker,
    Unreachable,
    VersionMismatch,
)
from .pipeline.stage import StageActor, StageRun
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
    "JobCancelled",
    "JournalDamaged",
    "JournalError",
    "LeasedTask",
    "MailboxFull",
    "MessageContext",
    "MessageTooLarge",
    "NameTaken",
    "OutputStore",
    "OutputStoreStats",
    "Partitioned",
    "PeerLost",
    "PipelineConfig",
    "PipelineMetrics",
    "PipelineResult",
    "ProtocolError",
    "RemoteError",
    "Resources",
    "RunStart",
    "Runtime",
    "RuntimeStats",
    "StageActor",
    "StageConfig",
    "StageFailed",
    "StageMetrics",
    "StageRun",
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
    "load_pipeline",
    "run_pipeline",
    "run_pipeline_sync",
]

if TYPE_CHECKING:
    from .pipeline.config import PipelineConfig, Resources, StageConfig, load_pipeline
    from .pipeline.result import PipelineMetrics, PipelineResult, StageMetrics
    from .pipeline.runner import RunStart, run_pipeline, run_pipeline_sync
    from .tasks.content_store import ContentStore, ContentStoreStats

# Loaded on first use: the runner brings the node and the master, which an actor's worker
# process (it imports this package for Actor) never needs; nor does it need a pipeline's
# config (pydantic models, and the job specs' and task events' dataclasses with it), a run's
# result or the content store, which cost a node's template about 10 ms before its workers fork.
_LAZY = {
    "ContentStore": ".tasks.content_store",
    "ContentStoreStats": ".tasks.content_store",
    "PipelineConfig": ".pipeline.config",
    "PipelineMetrics": ".pipeline.result",
    "PipelineResult": ".pipeline.result",
    "Resources": ".pipeline.config",
    "RunStart": ".pipeline.runner",
    "StageConfig": ".pipeline.config",
    "StageMetrics": ".pipeline.result",
    "load_pipeline": ".pipeline.config",
    "run_pipeline": ".pipeline.runner",
    "run_pipeline_sync": ".pipeline.runner",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name], __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
