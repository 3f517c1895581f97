"""How a pipeline run's end reaches its caller: a stop that comes once the finalize hooks
returned is taken as stopping nothing (the run returns its result), and a troupe error alone
in the cluster's task groups is raised as itself rather than inside an ExceptionGroup.

Apart from ``runner`` because both are context managers around the run that know nothing of
pipelines but the list its result is kept in.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

import anyio

from troupe.runtime.errors import TroupeError, leaf_errors

from .result import PipelineResult

__all__ = ["kept_once_finalized", "lone_error_raised"]


@contextlib.asynccontextmanager
async def kept_once_finalized(done: list[PipelineResult]) -> AsyncIterator[None]:
    """A stop (the run's cancellation) that comes once ``done`` holds the run's result, its
    finalize hooks returned, taken as stopping nothing: the outputs are complete (and recorded
    so), so the run returns its result rather than raising. It lands as the replicas, the
    node or the master stop, which see to their own stop all the same. The stop is the
    caller's to see (its cancel scope stays cancelled): ``troupe run`` says the dataset was
    complete when it came, ``run_pipeline_sync`` returns rather than raising KeyboardInterrupt."""
    try:
        yield
    except anyio.get_cancelled_exc_class():
        if not done:
            raise


@contextlib.asynccontextmanager
async def lone_error_raised() -> AsyncIterator[None]:
    """A troupe error alone in the cluster's task groups (a port taken, say) raised as itself:
    the caller catches a ConfigError, not an ExceptionGroup holding one."""
    try:
        yield
    except BaseExceptionGroup as group:
        leaves = leaf_errors(group)
        if len(leaves) == 1 and isinstance(leaves[0], TroupeError):
            raise leaves[0] from None
        raise
