"""Whose ``stop_worker`` a spawned worker heeds.

A pipeline's replicas are named ``PIPELINE-STAGE-N``, the same names in every run of that
pipeline. A run's stop came by name alone: one that arrived late (a run stopped, its stop sent
again) after a rerun on the same node had started a replica of the same name stopped the
rerun's replica. A stop may now name its sender's process (``owner_process``, as
``spawn_worker`` does): a worker started for another process is not stopped by it.

Where either side did not say (an older run's stop, a worker spawned without one, a host where
no identity can be told), nobody can tell whose the worker is: the stop goes on, as before.
"""

from __future__ import annotations

from troupe.runtime.errors import UnknownActor

__all__ = ["heeds", "not_its_owner"]


def heeds(worker_process: str, stop_process: str) -> bool:
    """Whether a worker started for ``worker_process`` is stopped by a stop from ``stop_process``
    (either "": not said)."""
    return not worker_process or not stop_process or worker_process == stop_process


def not_its_owner(name: str, node: str, worker_process: str, stop_process: str) -> UnknownActor:
    """The answer to a stop from another process than the worker's: no worker of the sender's
    runs under that name here (its own stopped or never started; another run's has it now)."""
    return UnknownActor(
        f"worker {name!r} on node {node} was started for another process ({worker_process}), not "
        f"for the stop's ({stop_process}): not stopped (a late stop of an earlier run?)"
    )
