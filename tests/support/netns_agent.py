"""A test's hands inside a network namespace: control calls and asks, one JSON line each.

A test process lives in the machine's own network and cannot reach a namespace's addresses;
it starts this agent inside one (``ip netns exec NS python -m support.netns_agent``) and writes
requests to its stdin, one JSON object a line; each answer is one JSON line on stdout:

    {"control": ENDPOINT, "type": T, "payload": P, "timeout": S}  -> {"ok": reply}
    {"ask": NODE_ENDPOINT, "actor": NAME, "type": T, "payload": P, "timeout": S} -> {"ok": reply}
    failure of either                                             -> {"error": "Type: text"}

With ``TROUPE_KEYS`` in its environment it presents that directory's operator key (CURVE), as
``troupe ctl --keys`` does. It exits at the end of its stdin.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

import anyio

from troupe.runtime.core.client import connect
from troupe.runtime.core.runtime import process_runtime


def _install_keys() -> None:
    directory = os.environ.get("TROUPE_KEYS")
    if not directory:
        return
    from troupe.runtime.security.process import install, keys_for

    install(keys_for(directory, None))


async def _serve() -> None:
    async with process_runtime("agent", f"agent-{os.getpid()}", drain_timeout=0.1) as runtime:
        for line in sys.stdin:
            request = json.loads(line)
            answer: dict[str, Any]
            try:
                answer = {"ok": await _one(runtime, request)}
            except Exception as exc:
                answer = {"error": f"{type(exc).__name__}: {exc}"}
            print(json.dumps(answer), flush=True)


async def _one(runtime: Any, request: dict[str, Any]) -> Any:
    timeout = float(request.get("timeout", 10.0))
    if "control" in request:
        return await runtime.control(
            request["control"], request["type"], request.get("payload"), timeout=timeout
        )
    async with connect(request["ask"]) as client:
        return await client.ref(request["actor"]).ask(
            request["type"], request.get("payload"), timeout=timeout
        )


def main() -> None:
    """Entry point of ``python -m support.netns_agent``."""
    _install_keys()
    anyio.run(_serve)


if __name__ == "__main__":
    main()
