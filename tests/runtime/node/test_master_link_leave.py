"""A node that stops on purpose tells its master (``node_left``) and beats no more; a master
that does not answer holds the stop ``leave_s`` at most."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import anyio
import pytest

from support.log_capture import module_logs
from troupe.runtime.node import master_link
from troupe.runtime.node.master_link import MasterLink

pytestmark = pytest.mark.anyio

MASTER = "tcp://127.0.0.1:24480"


class _Runtime:
    """Records what reaches the master; ``hang`` makes it answer no ``node_left``."""

    address = "tcp://127.0.0.1:24470"

    def __init__(self, hang: bool = False) -> None:
        self.sent: list[str] = []
        self.timeouts: list[float] = []
        self.hang = hang

    async def control(self, endpoint: str, msg_type: str, payload: Any = None, **kw: Any) -> Any:
        self.sent.append(msg_type)
        self.timeouts.append(kw["timeout"])
        if msg_type == "node_left" and self.hang:
            await anyio.sleep_forever()
        return True


def _link(runtime: _Runtime, leave_s: float | None = 2.0) -> MasterLink:
    node = SimpleNamespace(
        name="n1",
        config=SimpleNamespace(advertise=None, tags=()),
        workers={},
        drained=set(),
        runtime=runtime,
    )
    return MasterLink(node, MASTER, leave_s=leave_s)  # type: ignore[arg-type]


async def test_a_stopping_node_says_it_leaves_and_beats_no_more() -> None:
    runtime = _Runtime()
    link = _link(runtime)
    await link.beat_now()
    await link.leave()
    await link.beat_now()  # a beat after the leave would make the node alive again at the master
    assert runtime.sent == ["node_beat", "node_left"]


async def test_a_master_that_does_not_answer_the_leave_holds_the_stop_leave_s_at_most(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    runtime = _Runtime(hang=True)
    link = _link(runtime, leave_s=0.05)
    await link.beat_now()
    with module_logs(monkeypatch, master_link) as logs, anyio.fail_after(5):
        await link.leave()
    (unanswered,) = [e for e in logs if e["event"] == "master_leave_unanswered"]
    assert unanswered["log_level"] == "info"
    assert runtime.sent == ["node_beat", "node_left"]


async def test_a_node_its_master_never_answered_says_nothing_as_it_stops() -> None:
    """No master may be there at all: the stop waits for none."""
    runtime = _Runtime()
    link = _link(runtime)
    await link.leave()
    assert runtime.sent == []


async def test_a_stopping_node_waits_for_the_leave_as_long_as_for_a_beat() -> None:
    """Over a slow link the master's answer to the leave comes as late as a beat's: a bound of
    2 s left the stopped node alive at the master for its node timeout (nw 2)."""
    runtime = _Runtime()
    link = _link(runtime, leave_s=None)
    await link.beat_now()
    await link.leave()
    assert runtime.sent == ["node_beat", "node_left"]
    assert runtime.timeouts == [link.reply_s, link.reply_s] and link.reply_s > 3
