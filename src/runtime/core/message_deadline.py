"""How long an ask may wait for its handler, measured the same way on both sides of the wire.

The envelope's ``deadline`` is the sender's wall clock (protocol version 1): a receiver whose
clock ran ahead of the asker's by more than the ask's timeout dropped every ask as expired on
arrival, and the asker waited out its timeout blaming the target (hosts not yet synced by NTP
are enough). So an ask also carries its time to live, ``ttl`` in its headers (seconds from its
send), and a receiver counts it from the message's arrival on its own clock; the wall-clock
``deadline`` stays on the wire for receivers older than ``ttl``, and is read alone only where a
sender older than it left ``ttl`` out. Inside a process a deadline is ``time.monotonic()``
seconds, so a step of the wall clock (NTP, a resumed VM) expires nothing and keeps nothing
alive. The sender adds ``ttl`` inline (``Runtime.ask_ref``: one dict, no call, on the path of
every remote ask), and the router calls :func:`arrived` only for a message that has a deadline
or headers (a plain tell has neither). The time an ask waited in its sender's queue before it
left is not counted: a receiver may then start an ask its asker has just given up on, whose
reply is counted as late.
"""

from __future__ import annotations

import time
from typing import Any

__all__ = ["TTL", "arrived"]

TTL = "ttl"  # a reserved header key (PROTOCOL.md, section 5)


def arrived(wire_deadline: Any, headers: Any) -> tuple[float | None, Any]:
    """The deadline and headers of a message that arrived now, as its handler sees them.

    The deadline is the ``time.monotonic()`` moment past which the message has expired: from
    its ``ttl`` header, else from its wall-clock ``deadline`` read on this host's clock (a
    sender older than ``ttl``), else None (a tell: no deadline). ``ttl`` is taken out of the
    headers (a handler sees what its asker gave, the same remote as local; None where that was
    nothing); one that is no number (a peer's mistake) is ignored for the ``deadline`` beside
    it."""
    if headers is not None and TTL in headers:
        ttl = headers.pop(TTL)
        if not headers:
            headers = None
        if wire_deadline is not None and (type(ttl) is float or type(ttl) is int):
            return time.monotonic() + ttl, headers
    if wire_deadline is None:
        return None, headers
    return time.monotonic() + (wire_deadline - time.time()), headers
