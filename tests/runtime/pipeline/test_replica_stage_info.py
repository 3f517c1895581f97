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


async def test_a_replica_behind_a_slow_link_answers_once_a_try_outlasts_the_handshake(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Each ask that times out drops its connection, and the next opens a new one, whose
    handshakes (TCP's, CURVE's) take about seven seconds at a second's round trip: asks of 5 s
    each never got an answer, and a cluster run's finalize never got its replica (nw 4). Each
    try after a miss waits twice the last."""
    clock = [0.0]
    waited: list[float] = []

    class BehindASlowLink:
        async def ask(self, msg_type: str, payload: Any, timeout: float | None = None) -> Any:
            assert timeout is not None
            waited.append(timeout)
            if timeout < 7.0:  # a new connection: its handshakes come before the answer
                clock[0] += timeout
                raise AskTimeout(f"no reply to {msg_type!r} within {timeout}s")
            clock[0] += 7.0
            return {"hooks": ["finalize"]}

    monkeypatch.setattr("troupe.runtime.pipeline.replica_stage_info._clock", lambda: clock[0])
    info = await stage_info(BehindASlowLink(), lambda: None)  # type: ignore[arg-type]
    assert info == {"hooks": ["finalize"]}
    assert waited == [5.0, 10.0]


async def test_the_tries_grow_within_the_whole_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = [0.0]
    waited: list[float] = []

    class Silent:
        async def ask(self, msg_type: str, payload: Any, timeout: float | None = None) -> Any:
            assert timeout is not None
            waited.append(timeout)
            clock[0] += timeout
            raise AskTimeout(f"no reply to {msg_type!r} within {timeout}s")

    monkeypatch.setattr("troupe.runtime.pipeline.replica_stage_info._clock", lambda: clock[0])
    with pytest.raises(AskTimeout):
        await stage_info(Silent(), lambda: None)  # type: ignore[arg-type]
    assert waited == [5.0, 10.0, 20.0, 25.0] and sum(waited) == 60.0
