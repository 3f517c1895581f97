"""The two ends of a cluster run's mailbox, for a test across network namespaces (one process
in each): ``master KEYS ENDPOINT`` listens with the cluster pair, as a master does, and calls
``cancel_lease`` at each address it reads on stdin; ``run KEYS MASTER`` connects to it as
``troupe run --cluster`` does (``run_keys.connect_run``), says its mailbox's address and its
warnings, and exits once the master's ``cancel_lease`` reached it. One JSON object a line on
stdout; every wait is bounded.

    python -m support.run_mailbox_peer master KEYS tcp://10.213.7.1:49010
    python -m support.run_mailbox_peer run KEYS tcp://10.213.7.1:49010
"""

from __future__ import annotations

import json
import sys
from typing import Any

import anyio

from troupe.runtime.core.runtime import process_runtime
from troupe.runtime.pipeline.run_keys import connect_run
from troupe.runtime.security.keys import load_keys

WAIT_S = 60.0


def _say(**what: Any) -> None:
    print(json.dumps(what), flush=True)


async def master(keys: str, endpoint: str) -> None:
    async with process_runtime("m", "master", bind=endpoint, security=load_keys(keys)) as rt:
        _say(ready=rt.address)
        while line := (await anyio.to_thread.run_sync(sys.stdin.readline)).strip():
            try:
                _say(answer=await rt.control(line, "cancel_lease", {"reason": "job cancelled"}, timeout=10.0))
            except Exception as exc:  # the test reads what it was
                _say(error=f"{type(exc).__name__}: {exc}")


async def run(keys: str, master_endpoint: str) -> None:
    warnings: list[str] = []
    cancelled = anyio.Event()

    async def cancel_lease(_: Any) -> str:
        cancelled.set()
        return "cancelled"

    async with connect_run(master_endpoint, keys, warnings.append) as rt:
        rt.register_control("cancel_lease", cancel_lease)
        _say(address=rt.address, warnings=warnings)
        with anyio.fail_after(WAIT_S):
            await cancelled.wait()
        _say(cancelled=True)


if __name__ == "__main__":
    role, keys_dir, where = sys.argv[1:4]
    anyio.run(master if role == "master" else run, keys_dir, where)
