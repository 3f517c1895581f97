"""A ``complete`` whose result reference is no reference is refused by the master itself (lo 1).

The worker checks what its ``run_task`` returns (at most ``RESULT_REF_MOST_BYTES`` of UTF-8), but
a foreign or older worker speaking the protocol could send the output itself as the reference:
the master kept megabytes in its journal and in memory for the done task, and sent them with
every ``done_tasks``. Now such a complete is answered ``rejected``, saying why, and its attempt
fails as the worker's own check fails it: retried, then dead-lettered, nothing of it kept.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from structlog.testing import capture_logs

from support.memory_master import master_in_memory
from troupe.runtime.tasks.state import TaskState
from troupe.runtime.tasks.task_actor import RESULT_REF_MOST_BYTES

WORKER = {"worker_id": "n1/w1", "node": "n1", "endpoint": "mem://nowhere", "slots": 1, "kinds": ["k"]}
REFUSED = "the master refused this attempt's complete report: its result_ref is "


async def test_a_complete_with_no_reference_as_its_result_fails_its_attempt_and_keeps_nothing(
    tmp_path: Path,
) -> None:
    async with master_in_memory(tmp_path) as m:
        await m.call("register_worker", WORKER)
        job = {"name": "j", "kind": "k", "count": 2, "max_attempts": 2, "backoff_base_s": 0.0}
        await m.call("submit", {"job": {"job": job}, "source": "t"})

        async def complete(result_ref: Any) -> tuple[str, dict[str, Any]]:
            request = {"worker_id": "n1/w1", "free_slots": 1, "wait_s": 5.0}
            (lease,) = (await m.call("request_task", request))["leases"]
            report = {"worker_id": "n1/w1", "task_id": lease["task_id"], "lease_id": lease["lease_id"]}
            return lease["task_id"], await m.call("complete", {**report, "result_ref": result_ref})

        with capture_logs() as logs:
            task_id, reply = await complete("x" * (4 << 20))  # the output itself, 4 MiB
        assert reply["outcome"] == "rejected", reply
        assert reply["reason"].startswith(f"{REFUSED}a str of 4,194,304 characters"), reply
        assert f"at most {RESULT_REF_MOST_BYTES} bytes of UTF-8" in reply["reason"], reply
        assert [e["event"] for e in logs].count("complete_refused") == 1, logs
        info = m.master.book.task(task_id)
        assert (info.state, info.attempts, info.result_ref) == (TaskState.PENDING, 1, None), info

        again, reply = await complete(42)  # no str: its last attempt, so dead
        assert again == task_id and reply["outcome"] == "rejected", reply
        (letter,) = await m.call("dead", {"job_id": "j"})
        assert letter["error"] == f"{REFUSED}42 (int), not a str", letter

        # a reference of the most bytes it may have is taken, as the worker takes it
        other, reply = await complete("\u00e9" * (RESULT_REF_MOST_BYTES // 2))
        assert other != task_id and reply["outcome"] == "committed", reply
        done = await m.call("done_tasks", {"job_id": "j", "task_ids": [task_id, other]})
        assert done == {other: "\u00e9" * (RESULT_REF_MOST_BYTES // 2)}
        assert not (await m.call("status"))["stale_reports"]  # refused, not stale
