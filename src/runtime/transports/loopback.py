"""Free endpoints, for processes that listen on a port nobody chose for them."""

from __future__ import annotations

import random
import socket
from collections import deque
from collections.abc import Callable
from typing import TypeVar

from troupe.runtime.errors import Unreachable

T = TypeVar("T")

__all__ = ["any_port", "bind_or_move", "free_endpoint", "moved_line"]

_LOWEST_PORT = 10000  # above the well-known and most registered services' ports
_HANDED: deque[int] = deque(maxlen=1024)  # this process's recent draws: two never coincide


def free_endpoint() -> str:
    """A loopback TCP endpoint on a port that was free a moment ago.

    Drawn below the kernel's ephemeral range where there is room: a port the kernel hands out
    (``bind`` to 0) may go to any outgoing connection on the machine before the process it is
    meant for binds it, seconds later; one below that range is never handed out.
    """
    low = _ephemeral_low()
    if low > _LOWEST_PORT + 1000:
        for _ in range(100):
            port = random.randrange(_LOWEST_PORT, low)
            if port in _HANDED:  # handed out already, perhaps not yet bound by its process
                continue
            with socket.socket() as s:
                try:
                    s.bind(("127.0.0.1", port))
                except OSError:  # taken, or in TIME_WAIT: draw again
                    continue
                _HANDED.append(port)
                return f"tcp://127.0.0.1:{port}"
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"tcp://127.0.0.1:{s.getsockname()[1]}"


def any_port(bind: str) -> str:
    """``bind``'s tcp interface with a port the kernel picks (``tcp://10.0.0.2:*``); loopback
    otherwise."""
    if not bind.startswith("tcp://") or ":" not in bind[6:]:
        return "tcp://127.0.0.1:*"
    return bind.rsplit(":", 1)[0] + ":*"


def bind_or_move(bind: Callable[[str], T], endpoint: str, may_move: bool) -> tuple[T, bool]:
    """``bind(endpoint)``, and whether it moved: an endpoint taken, that ``may_move`` (a default
    found free a moment ago, taken since by a second run started at once), is bound on a port
    of the same host that the kernel picks instead.

    Raises:
        Unreachable: ``endpoint`` cannot be bound, and may not move.
    """
    try:
        return bind(endpoint), False
    except Unreachable:
        if not may_move:
            raise
    return bind(any_port(endpoint)), True


def moved_line(
    wanted: str | None, endpoint: str, master_wanted: str | None = None, master: str | None = None
) -> str:
    """What a run says of its default endpoints taken as it bound them (:func:`bind_or_move`):
    which were (its node's ``wanted``, its own master's ``master_wanted``), and where the node
    and that master (``master``: None where the run started none) listen instead, and how to
    reach them. The master's is said even where only the node's moved, as the early note does
    (``troupe run``'s ``moved_note``): its ``ctl jobs``/``cancel`` need it."""
    pairs = ((wanted, endpoint), (master_wanted, master))
    taken = [w for w, got in pairs if w is not None and got is not None and got != w]
    verb = "were" if len(taken) > 1 else "was"
    where = f"this run's node listens on {endpoint}" + (f", its master on {master}" if master else "")
    return (
        f"{' and '.join(taken)} {verb} taken as the run started (another troupe run?): {where} "
        f"(troupe ctl status --node {endpoint})"
    )


def _ephemeral_low() -> int:
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range", encoding="ascii") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):  # not Linux: the kernel's choice, as before
        return 0
