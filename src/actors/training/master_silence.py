"""Said once when a training run's master stops answering while the ranks train.

The run reaches its ranks and encoders through their nodes (``worker_addresses``), so a master
killed mid-run stops nothing: the ranks go on, and the run ends when they end. What the master
alone does, the run then goes without: a lost node is not replaced (the master says which nodes
live), and a rank restarted starts again on the node it ran on. Before, the run froze at the
master's death, took a live rank for lost two minutes later, and failed on the master's
``resolve``, though the rank had finished.
"""

from __future__ import annotations

from collections.abc import Callable

import anyio

from troupe.runtime.core.client import answers
from troupe.runtime.core.runtime import Runtime
from troupe.runtime.library_logging import get_logger

__all__ = ["watch_master"]

log = get_logger(__name__)

_PING_S = 5.0


async def watch_master(runtime: Runtime, master: str, say: Callable[[str], None], every_s: float) -> None:
    """Ping ``master`` now and every ``every_s`` until cancelled; say once that it does not
    answer (logged again, at info, when it answers again)."""
    silent = False
    said = False
    while True:
        alive = await answers(runtime, master, _PING_S)
        if not alive and not silent:
            log.warning("train_master_silent", master=master)
            if not said:
                said = True
                say(
                    f"the master at {master} does not answer; the ranks and encoders go on, "
                    "reached through their nodes (a node lost now is not replaced)"
                )
        elif alive and silent:
            log.info("train_master_answers_again", master=master)
        silent = not alive
        await anyio.sleep(every_s)
