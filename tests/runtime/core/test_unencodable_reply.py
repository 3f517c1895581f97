"""A handler's result that cannot travel (a lambda, an object, nesting past the recursion limit):
the asker learns which actor's which handler made it, and that its own request was delivered
and handled; the worker logs it and counts the message failed. The asker got "no wire encoding
for function", naming nothing (as if its own send had failed), nothing was logged, and status
counted the message handled."""

from __future__ import annotations

from typing import Any

import anyio
import anyio.lowlevel
import pytest
import structlog

from troupe import Actor, handles
from troupe.runtime import Runtime
from troupe.runtime.errors import EncodeError
from troupe.runtime.lowlevel import MemoryHub

BOUND = 10.0


def _deep() -> list[Any]:
    root: list[Any] = []
    inner = root
    for _ in range(100_000):
        inner.append([])
        inner = inner[0]
    return root


RESULTS = {"lambda": lambda: lambda: 1, "object": object, "recursion": _deep}


class Unsendable(Actor):
    @handles("plain")
    def plain(self, what: str) -> Any:
        return RESULTS[what]()

    @handles("later")
    async def later(self, what: str) -> Any:
        await anyio.lowlevel.checkpoint()
        return RESULTS[what]()

    @handles("fine")
    def fine(self, _: Any) -> str:
        return "ok"


@pytest.mark.parametrize("what", sorted(RESULTS))
@pytest.mark.parametrize("handler", ["plain", "later"])
async def test_an_unencodable_reply_names_the_actor_and_handler_is_logged_and_counted_failed(
    handler: str, what: str
) -> None:
    hub = MemoryHub()
    ta, tb = hub.transport(name="a"), hub.transport(name="b")
    with anyio.fail_after(BOUND), structlog.testing.capture_logs() as logs:
        async with Runtime("n", "a", ta) as a, Runtime("n", "b", tb, drain_timeout=0.5) as b:
            await b.spawn(Unsendable, "u")
            a.directory.learn("n/b/u", b.cells["u"].endpoint)
            ref = a.ref("n/b/u")
            with pytest.raises(EncodeError) as caught:
                await ref.ask(handler, what)
            said = str(caught.value)
            assert f"the reply of actor n/b/u's {handler!r} handler could not be sent" in said, said
            assert "the request was delivered and handled" in said, said
            assert await ref.ask("fine") == "ok"  # the actor goes on
            assert b.cells["u"].failed == 1
    warned = [e for e in logs if e["event"] == "reply_unencodable"]
    assert len(warned) == 1 and warned[0]["log_level"] == "warning", warned
    assert (warned[0]["actor"], warned[0]["type"]) == ("u", handler)
