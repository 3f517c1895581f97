"""A master that is up and cannot start a thread (a process limit reached: threads count) serves
on: each call it makes in a thread (its code identity, a submit's parsing and room check, the
journal's commits, its look at the journal's file) runs on its loop instead, and is logged
(``thread_refused``). One refused thread ended the master with a 100-line ExceptionGroup
(report rs 6: ``master.py, in _read_code ... RuntimeError: can't start new thread``).
Thread starts are refused here by a fake; no limit is set."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest
from structlog.testing import capture_logs

from support.memory_master import master_in_memory, until
from troupe.runtime.code_identity import code_identity


async def test_a_master_that_cannot_start_a_thread_serves_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def refused(self: threading.Thread, *args: Any, **kwargs: Any) -> None:
        raise RuntimeError("can't start new thread")

    monkeypatch.setattr(threading.Thread, "start", refused)
    with capture_logs() as logs:
        async with master_in_memory(tmp_path) as m:
            await until(lambda: m.master.code)
            await m.submit("j", 3)
            status = await m.call("status")
            assert status["code"] == code_identity()
            assert [j["total"] for j in status["jobs"]] == [3]
            assert not m.master.dispatcher.failed
    refused_calls = {e["call"] for e in logs if e["event"] == "thread_refused"}
    assert {"code_identity", "submit_parse", "journal_commit"} <= refused_calls, refused_calls
