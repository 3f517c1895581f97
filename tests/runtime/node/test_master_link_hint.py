"""A node whose beats a master never answered says what may be wrong: without keys, a master
that runs with CURVE keys ignores it (the node beat on for ever, logging only AskTimeout)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
from structlog.testing import capture_logs

from troupe.runtime.errors import AskTimeout
from troupe.runtime.node.master_link import MasterLink

pytestmark = pytest.mark.anyio


class _Runtime:
    address = "tcp://127.0.0.1:7470"

    def __init__(self) -> None:
        self.answer = False

    async def control(self, endpoint: str, msg_type: str, payload: Any = None, **_: Any) -> Any:
        if not self.answer:
            raise AskTimeout("no reply to 'node_beat' within 1.0s")
        return {}


def _link() -> MasterLink:
    node = SimpleNamespace(name="n1", config=SimpleNamespace(advertise=None, tags=()), workers={})
    return MasterLink(node, "tcp://127.0.0.1:7480")  # type: ignore[arg-type]


async def test_a_master_that_never_answered_gets_the_keys_hint() -> None:
    link, runtime = _link(), _Runtime()
    with capture_logs() as logs:
        await link._beat(runtime)  # type: ignore[arg-type]
    (failed,) = [e for e in logs if e["event"] == "master_beat_failed"]
    assert "--keys DIR" in failed["hint"]


async def test_a_master_that_answered_before_and_stopped_gets_no_hint() -> None:
    link, runtime = _link(), _Runtime()
    runtime.answer = True
    await link._beat(runtime)  # type: ignore[arg-type]
    runtime.answer = False
    with capture_logs() as logs:
        await link._beat(runtime)  # type: ignore[arg-type]
    (failed,) = [e for e in logs if e["event"] == "master_beat_failed"]
    assert "hint" not in failed  # it was down or restarting: keys were not the matter
