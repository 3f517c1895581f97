"""A worker's retries of one report, queued while its link was cut, arrive together: they are
one stale report, counted (and logged) once, not once per retry."""

from __future__ import annotations

from pathlib import Path

from structlog.testing import capture_logs

from support.memory_master import master_in_memory

WORKER = {"worker_id": "n1/w1", "node": "n1", "endpoint": "mem://nowhere", "slots": 1, "kinds": ["k"]}


async def test_retries_of_one_stale_report_are_counted_once(tmp_path: Path) -> None:
    async with master_in_memory(tmp_path) as m:
        await m.call("register_worker", WORKER)
        await m.call("submit", {"job": {"job": {"name": "j", "kind": "k", "count": 1}}, "source": "t"})
        (lease,) = (await m.call("request_task", {"worker_id": "n1/w1", "free_slots": 1}))["leases"]
        report = {"worker_id": "n1/w1", "task_id": lease["task_id"], "lease_id": lease["lease_id"]}
        await m.call("complete", {**report, "result_ref": "out://a"})
        with capture_logs() as logs:
            for _ in range(8):  # the same complete, sent again and again while cut off
                await m.call("complete", {**report, "result_ref": "out://a"})
        stale = (await m.call("status"))["stale_reports"]
        assert stale == {"complete_duplicate": 1}, stale
        assert [e["event"] for e in logs].count("stale_report_dropped") == 1
