"""resolve_live: a directory's answer that names an endpoint whose connection ended (its process
died, and the node has not reaped it yet) is asked again, not believed; fake lookups."""

from __future__ import annotations

import pytest

from troupe.runtime.core.directory import Directory
from troupe.runtime.core.live_lookup import resolve_live
from troupe.runtime.core.ref import ActorAddress
from troupe.runtime.errors import UnknownActor

DEAD, NEW = "tcp://127.0.0.1:1", "tcp://127.0.0.1:2"
FULL = ActorAddress("n", "w", "echo")


class Lookup:
    """A node's ``resolve``: each call gives the next answer (an endpoint, or an error)."""

    def __init__(self, *answers: str | Exception) -> None:
        self.answers = list(answers)
        self.calls = 0

    async def __call__(self, address: ActorAddress) -> tuple[ActorAddress, str]:
        self.calls += 1
        answer = self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]
        if isinstance(answer, Exception):
            raise answer
        return FULL, answer


async def test_a_stale_answer_is_asked_again_until_the_restarted_process_is_named() -> None:
    lookup = Lookup(DEAD, DEAD, NEW)
    directory = Directory("n", lookup)
    directory.learn(str(FULL), DEAD)  # the cache holds the dead endpoint too
    assert await resolve_live(directory, {DEAD: None}, ActorAddress("", "w", "echo")) == (FULL, NEW)
    assert lookup.calls == 3  # the cache's stale answer was dropped, not returned
    assert await directory.resolve(FULL) == (FULL, NEW)


async def test_not_running_while_it_restarts_is_said_at_once() -> None:
    directory = Directory("n", Lookup(DEAD, UnknownActor("no running actor n/w/echo")))
    with pytest.raises(UnknownActor, match="no running actor"):
        await resolve_live(directory, {DEAD: None}, FULL)


async def test_a_directory_that_keeps_naming_the_lost_endpoint_is_believed_the_next_time() -> None:
    """Past the bound it may be right (a new process on the same port): this lookup says so
    in one line, and the next one sends there."""
    lost = {DEAD: None}
    directory = Directory("n", Lookup(DEAD))
    with pytest.raises(UnknownActor, match=r"still names .*connection there ended.*try again"):
        await resolve_live(directory, lost, FULL, within=0.05)
    assert DEAD not in lost
    assert await resolve_live(directory, lost, FULL, within=0.05) == (FULL, DEAD)


async def test_an_endpoint_not_lost_is_returned_as_the_directory_gives_it() -> None:
    lookup = Lookup(NEW)
    assert await resolve_live(Directory("n", lookup), {DEAD: None}, FULL) == (FULL, NEW)
    assert lookup.calls == 1


async def test_a_route_only_taught_stays_as_taught() -> None:
    """No directory to ask (the engine's replicas, taught their routes): the cache's answer."""
    directory = Directory("n")
    directory.learn(str(FULL), DEAD)
    assert await resolve_live(directory, {DEAD: None}, FULL) == (FULL, DEAD)


async def test_a_directory_that_does_not_answer_is_bounded_by_the_asks_timeout() -> None:
    """A client of a node that died: its ask of 0.2 s waited the lookup's own 5 s (here, a
    lookup that never answers: for ever); it ends at the ask's timeout, saying what it waited for."""
    import anyio

    from troupe.runtime.errors import AskTimeout

    async def silent(address: ActorAddress) -> tuple[ActorAddress, str]:
        await anyio.sleep_forever()
        raise AssertionError("unreachable")

    with anyio.fail_after(10), pytest.raises(AskTimeout) as raised:  # a bound on a hang
        await resolve_live(Directory("n", silent), {}, ActorAddress("", "w", "echo"), within=0.2)
    assert "no answer from the directory (its node) on where it runs within 0.2s" in str(raised.value)
