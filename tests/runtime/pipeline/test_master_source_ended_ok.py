"""What earlier runs of a job made (``MasterSource.ended_ok``): the master's done tasks among
those asked, pruned ones left out (done, but with no output to miss), asked a chunk at a time;
a master older than the question leaves nothing to compare instead of failing the run."""

from __future__ import annotations

from typing import Any

import pytest

from support.master_source_run import RuntimeControls
from troupe.runtime.errors import UnknownMessageType
from troupe.runtime.pipeline import source as source_module
from troupe.runtime.pipeline.source import MasterSource

pytestmark = pytest.mark.anyio


class _Book(RuntimeControls):
    """A master whose job has ``done`` (task id -> result ref); ``knows`` False: no such control."""

    node = "n"
    address = "tcp://127.0.0.1:1"

    def __init__(self, done: dict[str, str], knows: bool = True) -> None:
        super().__init__()
        self.done, self.knows = done, knows
        self.asked: list[list[str]] = []

    async def control(self, master: str, msg_type: str, payload: Any = None, *, timeout: float = 5.0) -> Any:
        assert msg_type == "done_tasks" and payload["job_id"] == "job", (msg_type, payload)
        if not self.knows:
            raise UnknownMessageType("no control message 'done_tasks'")
        self.asked.append(list(payload["task_ids"]))
        return {t: self.done[t] for t in payload["task_ids"] if t in self.done}


async def test_done_ones_with_an_output_are_named_and_pruned_ones_are_not(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(source_module, "_DONE_CHUNK", 2)
    book = _Book({"t0": "ok", "t1": "pruned", "t3": "ok", "t4": "ok"})
    source = MasterSource(book, "tcp://m:1", "job", slots=2)  # type: ignore[arg-type]
    assert await source.ended_ok(["t0", "t1", "t2", "t3", "t4"]) == {"t0", "t3", "t4"}
    assert book.asked == [["t0", "t1"], ["t2", "t3"], ["t4"]]


async def test_a_master_without_the_question_leaves_nothing_to_remake() -> None:
    source = MasterSource(_Book({"t0": "ok"}, knows=False), "tcp://m:1", "job", slots=2)  # type: ignore[arg-type]
    assert await source.ended_ok(["t0"]) == set()


async def test_nothing_is_asked_when_no_task_had_ended_as_the_run_began() -> None:
    """A job's first run (no task ended yet) asks nothing, and reads none of the ids: a job of
    a million items would otherwise send them all to the master at every first start."""
    book = _Book({"t0": "ok"})
    source = MasterSource(book, "tcp://m:1", "job", slots=2)  # type: ignore[arg-type]
    source.ended_before = 0

    def ids() -> Any:
        raise AssertionError("the ids were read")
        yield "t0"

    assert await source.ended_ok(ids()) == set()
    assert book.asked == []
