"""A loopback endpoint for a test's node, within ``$TROUPE_TEST_PORTS`` (``LOW-HIGH``) where a
shared machine gives the suite a range of ports, else anywhere free (``free_endpoint``)."""

from __future__ import annotations

import os
import random
import socket

from troupe.runtime.testing.plugin import free_endpoint

__all__ = ["PORTS_ENV", "test_endpoint"]

PORTS_ENV = "TROUPE_TEST_PORTS"


def test_endpoint() -> str:
    """``tcp://127.0.0.1:PORT`` on a port free a moment ago, in the suite's range if it has one."""
    wanted = os.environ.get(PORTS_ENV, "")
    if not wanted:
        return free_endpoint()
    low, high = (int(p) for p in wanted.split("-", 1))
    for port in random.sample(range(low, high + 1), high + 1 - low):
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:  # taken: draw another
                continue
            return f"tcp://127.0.0.1:{port}"
    raise RuntimeError(f"no free port in ${PORTS_ENV} ({wanted})")


test_endpoint.__test__ = False  # type: ignore[attr-defined]  # not a test, whatever its name
