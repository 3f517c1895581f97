"""Whether a pid that a control message names is a process this node started.

A worker's ``register`` and the supervisor's ``supervisor_ready`` name their pid, and the
supervisor SIGKILLs the process tree of a worker whose heartbeats stop. Taken on trust, a
spoofed ``register`` naming pid 1 had every process of the host killed. A process this node
started is its descendant: its child (spawned, or forked and reparented to the node, a child
subreaper), or, for a moment after a fork from the template, still under the template's
intermediate process. The supervisor watches its node's descendants (its siblings).
"""

from __future__ import annotations

import os

import psutil

__all__ = ["is_own_descendant"]


def is_own_descendant(pid: int, ancestor: int | None = None) -> bool:
    """Whether ``pid`` is a live process below ``ancestor`` (default: this process), never
    ``ancestor`` itself, and never below init (pid 1: every process is)."""
    ancestor = os.getpid() if ancestor is None else ancestor
    if pid <= 0 or pid == ancestor or ancestor <= 1:
        return False
    try:
        return any(parent.pid == ancestor for parent in psutil.Process(pid).parents())
    except psutil.Error:  # gone, or not ours to look at
        return False
