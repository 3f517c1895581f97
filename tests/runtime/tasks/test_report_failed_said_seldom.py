"""A report kept while its master is away says so at the first try that fails, then at most
every 30 s with the tries so far, and once when it lands: it said ``report_failed`` at every try
(every half second), seven thousand lines a report for an hour's outage (session 45, pl 4).
The report's clock is moved a second on at each try, so the test does not wait the minutes."""

from __future__ import annotations

import time
from types import SimpleNamespace
from typing import Any

import pytest
from structlog.testing import capture_logs

from troupe.runtime.errors import Unreachable
from troupe.runtime.tasks import report_until_answered as report_module
from troupe.runtime.tasks.report_until_answered import report_until_answered

pytestmark = pytest.mark.anyio

AWAY_TRIES = 100  # tries the master does not answer, a second apart


class _AwayThenBack:
    """A master that does not answer ``away`` tries, each a second on the report's clock."""

    def __init__(self, away: int) -> None:
        self.away = away
        self.passed = 0.0
        self.tries = 0

    def clock(self) -> float:
        return time.monotonic() + self.passed

    async def control(self, master: str, msg_type: str, payload: Any = None, *, timeout: float = 5.0) -> Any:
        self.tries += 1
        if self.tries <= self.away:
            self.passed += 1.0
            raise Unreachable(f"no process listens at {master}")
        return {"outcome": "completed"}


async def _report(master: _AwayThenBack) -> tuple[str, Any] | None:
    async def forgotten(payload: dict[str, Any]) -> None:
        raise AssertionError("the master never forgets this sender here")

    payload = {"worker_id": "w", "task_id": "t", "lease_id": 1, "result_ref": "r", "request": 0}
    return await report_until_answered(
        master,  # type: ignore[arg-type]
        "mem://master",
        "complete",
        payload,
        timeout=1.0,
        retry_s=0.0,
        forgotten=forgotten,
        ids={"task_id": "t", "lease_id": 1},
    )


async def test_a_master_away_is_said_once_then_every_30_s_and_the_landing_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    master = _AwayThenBack(AWAY_TRIES)
    monkeypatch.setattr(report_module, "time", SimpleNamespace(monotonic=master.clock))
    with capture_logs() as logs:
        answered = await _report(master)
    assert answered == ("complete", {"outcome": "completed"})
    failed = [e for e in logs if e["event"] == "report_failed"]
    # tries a second apart, said 30 s apart at the most often
    assert [e.get("tries") for e in failed] == [1, 31, 61, 91]
    landed = [e for e in logs if e["event"] == "report_landed"]
    assert len(landed) == 1 and landed[0]["tries_failed"] == AWAY_TRIES, landed
    assert landed[0]["after_s"] >= AWAY_TRIES


async def test_a_report_answered_at_once_says_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    master = _AwayThenBack(0)
    with capture_logs() as logs:
        assert await _report(master) == ("complete", {"outcome": "completed"})
    assert [e["event"] for e in logs if e["event"].startswith("report_")] == []
