"""Log lines say truthfully who logged them: event fields never overwrite node, process, pid or actor.

The JSON lines are written by a real process (configuring logging here would change this test
process's logging for the tests after it), then read back.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

from troupe.runtime.logs import identify

_SCRIPT = textwrap.dedent(
    """
    import os, sys
    from pathlib import Path

    import anyio, anyio.lowlevel, structlog
    from troupe.runtime import Actor, Runtime, handles
    from troupe.runtime.logs import configure_logging
    from troupe.runtime.transports.zmq import ZmqTransport

    log = structlog.get_logger("probe")

    def helper(where):
        log.info("in_helper", where=where)

    def in_thread():
        log.info("in_thread")

    class Teller(Actor):
        @handles("sync")
        def sync(self, _):
            log.info("in_sync_handler", pid=12345, node="n9", actor="someone-else")
            helper("sync")
            return True

        @handles("async")
        async def run(self, _):
            log.info("in_async_handler")
            helper("async")
            await anyio.to_thread.run_sync(in_thread)
            return True

    async def main():
        async with Runtime("n1", "a", ZmqTransport("tcp://127.0.0.1:*"), ask_timeout=10) as a, \\
                Runtime("n1", "w1", ZmqTransport("tcp://127.0.0.1:*"), drain_timeout=0.5) as b:
            await b.spawn(Teller, "teller")
            while not b.cells["teller"].idle():
                await anyio.lowlevel.checkpoint()
            a.directory.learn("n1/w1/teller", b.cells["teller"].endpoint)
            ref = a.ref("n1/w1/teller")
            assert await ref.ask("sync")
            assert await ref.ask("async")
            print(b.statistics().actors["teller"]["handled_at_once"])
        log.info("outside", pid=os.getppid(), node="n1", process="other")

    configure_logging("n1", "w1", Path(sys.argv[1]), console=False)
    anyio.run(main)
    """
)


def _lines(tmp_path: Path) -> tuple[dict[str, dict[str, Any]], int, int]:
    """Run the probe; return its lines by event, its pid, and how many messages it handled at once."""
    with subprocess.Popen(
        [sys.executable, "-c", _SCRIPT, str(tmp_path)], stdout=subprocess.PIPE, text=True
    ) as proc:
        out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0
    records = [json.loads(ln) for ln in (tmp_path / "n1.jsonl").read_text().splitlines()]
    by_event: dict[str, dict[str, Any]] = {}
    for rec in records:
        key = rec["event"] if rec["event"] != "in_helper" else f"in_helper_{rec['where']}"
        by_event[key] = rec
    return by_event, proc.pid, int(out.strip())


def test_identity_wins_and_a_colliding_event_field_is_kept_aside() -> None:
    """An event's pid, node or actor moves to event_<name>; equal values and unknown identities change
    nothing."""
    event = {"event": "worker_spawned", "pid": 7, "node": "n1", "actor": "x", "worker": "w"}
    out = identify(event, {"node": "n1", "process": "node", "pid": 100, "actor": None})
    assert out == {
        "event": "worker_spawned",
        "pid": 100,
        "event_pid": 7,
        "node": "n1",
        "process": "node",
        "actor": "x",
        "worker": "w",
    }
    out = identify({"event": "e", "actor": "x"}, {"actor": "teller"})
    assert out == {"event": "e", "actor": "teller", "event_actor": "x"}


def test_lines_logged_in_a_handler_and_code_it_calls_carry_the_actor_and_the_logger_s_pid(
    tmp_path: Path,
) -> None:
    """Handler lines (sync at once and async), a helper's and a to_thread thread's carry the actor; event
    fields do not overwrite who logged."""
    lines, pid, at_once = _lines(tmp_path)
    assert at_once >= 1  # the sync handler took the handle-at-once path
    for event in ("in_sync_handler", "in_helper_sync", "in_async_handler", "in_helper_async", "in_thread"):
        rec = lines[event]
        assert (rec["node"], rec["process"], rec["pid"], rec.get("actor")) == ("n1", "w1", pid, "teller"), rec
        assert "msg_id" in rec, rec
    sync = lines["in_sync_handler"]
    assert (sync["event_pid"], sync["event_node"], sync["event_actor"]) == (12345, "n9", "someone-else")
    outside = lines["outside"]
    assert (outside["pid"], outside["process"], outside["event_process"]) == (pid, "w1", "other")
    assert "event_pid" in outside and "event_node" not in outside and "actor" not in outside
