"""Telling a node that the master ended its drain (``master_undrained``), now or at its next beat.

``troupe ctl undrain`` ends a drain in the book at once; the node itself learns it from a
``master_undrained`` that carries a new token, and starts again the workers the drain stopped.
A node the master has as stopped or dead is not asked: an ask of it waited 10 s and failed the
undrain that had taken effect, and the CLI blamed a hung master (report mt 3). Nor is one kept
waiting that does not answer within :data:`UNDRAIN_ASK_S`. Either way the node is owed the
undrain (``NodeTable.owe_undrain``): a node started again is not drained (its drain was the
master's), and one that comes back drained (a cut link) is told at its next beat instead of
being drained again.
"""

from __future__ import annotations

import secrets
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from troupe.runtime.core.runtime import Runtime

    from .nodes import NodeTable

__all__ = ["UNDRAIN_ASK_S", "tell_undrained"]

UNDRAIN_ASK_S = 5.0
"""How long a live node may take to answer ``master_undrained``: within the CLI's default 10 s."""


async def tell_undrained(runtime: Runtime, nodes: NodeTable, node: str, endpoint: str) -> list[str]:
    """Send ``node`` at ``endpoint`` its undrain; return the workers it starts again.

    Raises:
        TroupeError: it did not take it (no answer, or an error); it is owed the undrain then.
    """
    # The node's beats say this token once it took the undrain: one sent before says a
    # drain this undrain ended, and must not bring it back (NodeTable.says_drained).
    token = secrets.token_hex(16)
    nodes.undrain_sent(node, token)
    try:
        restarted = await runtime.control(
            endpoint, "master_undrained", {"node": node, "token": token}, timeout=UNDRAIN_ASK_S
        )
    except BaseException:  # not taken (or not known to be): its next beat that says drained is told
        nodes.owe_undrain(node)
        raise
    return [str(name) for name in restarted] if isinstance(restarted, list) else []
