"""troupe: an actor runtime over ZeroMQ for embodied-AI data and training pipelines.

The names a user writes actors and clients with come from here::

    from troupe import Actor, handles, connect, TaskActor, StageActor, RemoteError
    from troupe import run_pipeline_sync

They are loaded on first use (PEP 562): ``import troupe`` alone stays light, because every
worker process starts through ``troupe.lean_start``, which must import structlog before the
runtime does (see that module).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .runtime import (
        Actor,
        ActorRef,
        ActorStopped,
        AskTimeout,
        ConfigError,
        ContentStore,
        DeliveryError,
        ItemFailed,
        LeasedTask,
        MailboxFull,
        MessageContext,
        OutputStore,
        PeerLost,
        PipelineConfig,
        PipelineResult,
        RemoteError,
        Runtime,
        StageActor,
        StageFailed,
        StageRun,
        TaskActor,
        TroupeError,
        UnknownActor,
        Unreachable,
        connect,
        handles,
        load_pipeline,
        run_pipeline,
        run_pipeline_sync,
    )

__all__ = [
    "Actor",
    "ActorRef",
    "ActorStopped",
    "AskTimeout",
    "ConfigError",
    "ContentStore",
    "DeliveryError",
    "ItemFailed",
    "LeasedTask",
    "MailboxFull",
    "MessageContext",
    "OutputStore",
    "PeerLost",
    "PipelineConfig",
    "PipelineResult",
    "RemoteError",
    "Runtime",
    "StageActor",
    "StageFailed",
    "StageRun",
    "TaskActor",
    "TroupeError",
    "UnknownActor",
    "Unreachable",
    "connect",
    "handles",
    "load_pipeline",
    "run_pipeline",
    "run_pipeline_sync",
]


def __getattr__(name: str) -> Any:
    if name in __all__:
        value = getattr(importlib.import_module(".runtime", __name__), name)
        globals()[name] = value  # once loaded, a plain attribute
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    # The public names once each, loaded or not, and the module's own dunders: not its imports.
    return sorted({*__all__, *(n for n in globals() if n.startswith("__") and n.endswith("__"))})
