"""Whether a cluster's master and live nodes run the troupe code this process runs, and the line
that says who runs what where they do not.

A cluster is upgraded a host at a time, so for a while it mixes versions: runs work, but some
recoveries only apply where every part is new (README, "Upgrading a cluster"). The version alone
(``0.1.0``) does not tell checkouts apart; the code identity does (``code_identity.py``). A
master or node older than the identity says none: it counts as ``unknown``, another code.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import anyio

from troupe.runtime.code_identity import code_identity
from troupe.runtime.core.runtime import Runtime
from troupe.runtime.errors import TroupeError
from troupe.runtime.library_logging import get_logger
from troupe.runtime.placement import cluster_status

__all__ = ["NOT_RELAYED", "UNKNOWN", "mixed_code_line", "node_codes", "warn_if_mixed"]

log = get_logger(__name__)

UNKNOWN = "unknown (older troupe)"
"""What a master or node that does not say its code runs, as the line names it."""

NOT_RELAYED = "not known (the master is older: it does not say its nodes' code)"
"""What the nodes of a master older than the code field run, as the line names it."""


def mixed_code_line(status: Any, own: str) -> str | None:
    """None where the master and every live node of ``status`` (a master's ``status`` reply)
    run ``own`` (this process's code identity); else one line naming who runs what."""
    who: dict[str, list[str]] = {own: ["this command"]}
    master = status.get("code") if isinstance(status, dict) else None
    who.setdefault(_said(master), []).append("the master")
    for node, code in node_codes(status).items():
        who.setdefault(code, []).append(f"node {node}")
    if len(who) == 1:
        return None
    runs = "; ".join(f"{', '.join(names)} {code}" for code, names in who.items())
    return (
        f"this cluster runs mixed troupe code ({runs}): runs work, but some recoveries are "
        'slower or leak replicas on older nodes; see README, "Upgrading a cluster"'
    )


def node_codes(status: Any) -> dict[str, str]:
    """The code each live node of ``status`` (a master's ``status`` reply) runs, by node name, in
    :func:`mixed_code_line`'s words for a node that does not say it."""
    master = status.get("code") if isinstance(status, dict) else None
    unsaid = UNKNOWN if _said(master) != UNKNOWN else NOT_RELAYED
    # A master older than the code field keeps none of its nodes' either: a node it lists
    # without one may run any code, the newest too (nodes are upgraded first). A dead node runs
    # nothing of a run.
    nodes = status.get("nodes") if isinstance(status, dict) else None
    return {
        str(n.get("node")): _said(n.get("code"), unsaid)
        for n in (nodes if isinstance(nodes, list) else ())
        if isinstance(n, dict) and n.get("alive")
    }


def _said(code: Any, unsaid: str = UNKNOWN) -> str:
    return str(code) if isinstance(code, str) and code else unsaid


async def warn_if_mixed(runtime: Runtime, master: str, on_warning: Callable[[str], None] | None) -> None:
    """Ask the master at ``master`` who runs what, once; where the cluster is mixed, log it and
    tell ``on_warning`` the line. Advice only: a master that does not answer now fails nothing
    here (the run finds out on its own)."""
    own = await anyio.to_thread.run_sync(code_identity)  # tens of ms of reading, once a process
    try:
        line = mixed_code_line(await cluster_status(runtime, master), own)
    except TroupeError:
        return
    if line is not None:
        log.warning("mixed_cluster_code", master=master, detail=line)
        if on_warning is not None:
            on_warning(line)
