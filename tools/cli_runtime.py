"""The runtime a CLI command talks to nodes and masters through.

A CLI client hosts no actors and takes no tensors: its codec imports no extension's library for
a peer (a torch value in a reply is refused, not a reason to import torch), and its limits are
no option a user could raise.
"""

from __future__ import annotations

import os

from troupe.runtime.core.runtime import Runtime, process_runtime
from troupe.runtime.wire.codec import Codec

__all__ = ["cli_runtime"]


def cli_runtime(process: str = "cli") -> Runtime:
    """A client runtime named ``<process>-<pid>`` on the pseudo-node ``cli``; enter it with
    ``async with``."""
    return process_runtime(
        "cli",
        f"{process}-{os.getpid()}",
        codec=Codec(node_limits=False, no_extension_imports="CLI"),
        drain_timeout=0.1,
    )
