"""A new replica's ``stage_info`` when the directory still names the process that had the
replica's name before (a node of an older troupe, which tells the master of a worker only with
its next beat): the ask there is given up after a try, the name resolved again, and the new
process answers. It was one ask of 60 s: a rerun after a killed run sat that minute out."""

from __future__ import annotations

from typing import Any

import pytest

from troupe.runtime.core.directory import Directory
from troupe.runtime.core.ref import ActorAddress
from troupe.runtime.errors import AskTimeout, UnknownActor
from troupe.runtime.pipeline.replica_stage_info import stage_info

STALE, FRESH = "tcp://127.0.0.1:1001", "tcp://127.0.0.1:1002"


class _Cluster:
    """A master's directory that names the stale endpoint until asked again; a stale process
    that never answers, and a fresh one that does."""

    def __init__(self, answers: dict[str, Any]) -> None:
        self.lookups = 0
        self.asked: list[str] = []
        self.answers = answers
        self.directory = Directory("engine", self.lookup)

    async def lookup(self, address: ActorAddress) -> tuple[ActorAddress, str]:
        self.lookups += 1
        full = ActorAddress("n1", address.process, address.actor)
        return full, STALE if self.lookups == 1 else FRESH

    async def ask(self, msg_type: str, payload: Any, timeout: float | None = None) -> Any:
        _, endpoint = await self.directory.resolve(ActorAddress("n1", "p-load-0", "stage"))
        self.asked.append(endpoint)
        answer = self.answers.get(endpoint)
        if answer is None:
            raise AskTimeout(f"no reply to {msg_type!r} within {timeout}s")
        return answer


async def test_a_stale_name_is_resolved_again_and_the_new_process_answers() -> None:
    cluster = _Cluster({FRESH: {"hooks": ["finalize"]}})
    info = await stage_info(cluster, lambda: cluster.directory.forget_process("n1/p-load-0"), try_s=0.01)  # type: ignore[arg-type]
    assert info == {"hooks": ["finalize"]}
    assert cluster.asked == [STALE, FRESH]  # the stale endpoint once, then the fresh one


async def test_an_unknown_name_is_not_waited_for_past_its_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    class Nobody:
        async def ask(self, msg_type: str, payload: Any, timeout: float | None = None) -> Any:
            raise UnknownActor("no running actor n1/p-load-0/stage")

    monkeypatch.setattr("troupe.runtime.pipeline.replica_stage_info.KNOWN_S", 0.0)
    with pytest.raises(UnknownActor):
        await stage_info(Nobody(), lambda: None)  # type: ignore[arg-type]
