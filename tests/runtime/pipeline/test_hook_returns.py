"""A stage's ``start`` and ``finalize`` returning the wrong type: the error names the hook, what
it must return and what it returned. It failed far from the hook (``'int' object is not
iterable``), and a ``start`` that returned one id as a bare ``str`` had each character taken for
an item id, without a word. Checked as the functions and through a stage actor's hooks."""

from __future__ import annotations

from typing import Any

import pytest

from troupe.runtime.core.runtime import Runtime
from troupe.runtime.errors import RemoteError
from troupe.runtime.pipeline.hook_returns import committed_ids, final_summary
from troupe.runtime.pipeline.stage import StageActor, StageRun
from troupe.runtime.transports.base import MemoryHub

RUN = StageRun(pipeline="p", stage="sink", items=4, seed_start=0).to_wire()


@pytest.mark.parametrize(
    ("value", "got"),
    [
        (42, "got int 42"),
        ("p-000001", "got str 'p-000001'"),
        (b"p-1", "got bytes b'p-1'"),
        (1.5, "got float"),
    ],
)
def test_start_returning_no_ids_is_refused_naming_the_hook(value: Any, got: str) -> None:
    with pytest.raises(TypeError, match=r"^Sink\.start\(\) must return the ids of the items") as refused:
        committed_ids("Sink", value)
    assert "(an iterable of str, such as a list or set) or None" in str(refused.value)
    assert got in str(refused.value)


def test_start_returning_ids_or_none_is_taken_as_before() -> None:
    assert committed_ids("Sink", None) == []
    assert committed_ids("Sink", {"p-000002", "p-000001"}) == ["p-000001", "p-000002"]
    assert committed_ids("Sink", (f"p-{i:06d}" for i in (1, 0))) == ["p-000000", "p-000001"]


@pytest.mark.parametrize(("value", "got"), [("not a dict", "got str 'not a dict'"), ([("a", 1)], "got list")])
def test_finalize_returning_no_dict_is_refused_naming_the_hook(value: Any, got: str) -> None:
    with pytest.raises(TypeError, match=r"^Sink\.finalize\(\) must return a dict") as refused:
        final_summary("Sink", value)
    assert got in str(refused.value)


def test_finalize_returning_a_dict_or_none_is_taken_as_before() -> None:
    assert final_summary("Sink", None) == {}
    assert final_summary("Sink", {"summary": "4 items"}) == {"summary": "4 items"}


class _OneIdSink(StageActor):
    def start(self, run: StageRun) -> str:
        return "p-000001"  # one id, not a list of them

    def finalize(self, run: StageRun) -> str:
        return "done"


async def test_the_stage_actors_hooks_say_it() -> None:
    async with Runtime("node", "sink", MemoryHub().transport()) as runtime:
        stage = await runtime.spawn(_OneIdSink(), "stage")
        with pytest.raises(RemoteError, match=r"_OneIdSink\.start\(\) must return .* got str 'p-000001'"):
            await stage.ask("stage_start", RUN, timeout=30)
        with pytest.raises(RemoteError, match=r"_OneIdSink\.finalize\(\) must return a dict .* got str"):
            await stage.ask("stage_finalize", RUN, timeout=30)
