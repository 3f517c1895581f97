"""AskDeadlines: one timer for every ask in flight, driven here by a fake clock."""

from __future__ import annotations

import asyncio
import gc
import weakref
from typing import Any

import pytest

from troupe.runtime.core.deadlines import _SLACK, AskDeadlines
from troupe.runtime.errors import AskTimeout


class FakeTimer:
    def __init__(self, at: float, fn: Any) -> None:
        self.at, self.fn, self.cancelled = at, fn, False

    def cancel(self) -> None:
        self.cancelled = True


class FakeClock:
    """The loop methods AskDeadlines uses, with time moved by hand; futures of the real loop."""

    def __init__(self) -> None:
        self.now = 0.0
        self.timers: list[FakeTimer] = []

    def time(self) -> float:
        return self.now

    def create_future(self) -> asyncio.Future[Any]:
        return asyncio.get_running_loop().create_future()

    def call_at(self, at: float, fn: Any) -> FakeTimer:
        timer = FakeTimer(at, fn)
        self.timers.append(timer)
        return timer

    def armed(self) -> list[FakeTimer]:
        return [t for t in self.timers if not t.cancelled]

    def advance(self, dt: float) -> None:
        self.now += dt
        for timer in list(self.timers):
            if not timer.cancelled and timer.at <= self.now:
                self.timers.remove(timer)
                timer.fn()


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


def _future() -> asyncio.Future[Any]:
    return asyncio.get_running_loop().create_future()


async def test_an_unanswered_ask_fails_at_its_deadline_and_an_answered_one_is_left_alone(
    clock: FakeClock,
) -> None:
    deadlines = AskDeadlines(clock)  # type: ignore[arg-type]
    answered, late = _future(), _future()
    deadlines.watch(answered, 1.0, "n/p/a", "echo")
    deadlines.watch(late, 2.0, "n/p/b", "work")
    answered.set_result("ok")
    clock.advance(1.5)
    assert not late.done()
    clock.advance(1.0)
    with pytest.raises(AskTimeout, match=r"'work' from n/p/b within 2.0s"):
        late.result()
    assert answered.result() == "ok"
    assert clock.armed() == []  # nothing left to wait for: no timer


async def test_one_timer_serves_many_asks_and_an_earlier_deadline_rearms_it(clock: FakeClock) -> None:
    deadlines = AskDeadlines(clock)  # type: ignore[arg-type]
    futs = [_future() for _ in range(100)]
    for fut in futs:
        deadlines.watch(fut, 30.0, "x", "long")
    assert len(clock.armed()) == 1
    short = _future()
    deadlines.watch(short, 0.5, "x", "short")
    assert [t.at for t in clock.armed()] == [0.5]
    clock.advance(0.5)
    assert isinstance(short.exception(), AskTimeout)
    assert not any(f.done() for f in futs)
    assert [t.at for t in clock.armed()] == [30.0]
    clock.advance(30.0)
    assert all(isinstance(f.exception(), AskTimeout) for f in futs)


async def test_answered_asks_do_not_pile_up(clock: FakeClock) -> None:
    """The heap stays proportional to the asks in flight, not to all asks ever made."""
    deadlines = AskDeadlines(clock)  # type: ignore[arg-type]
    in_flight = []
    for i in range(20_000):
        fut = _future()
        deadlines.watch(fut, 3600.0, "x", "t")
        if i % 100 == 0:
            in_flight.append(fut)
        else:
            fut.set_result(None)
    assert len(deadlines) <= 2 * len(in_flight) + 1024
    clock.advance(3600.0)
    assert all(isinstance(f.exception(), AskTimeout) for f in in_flight)


async def test_close_stops_the_timer(clock: FakeClock) -> None:
    deadlines = AskDeadlines(clock)  # type: ignore[arg-type]
    fut = _future()
    deadlines.watch(fut, 1.0, "x", "t")
    deadlines.close()
    clock.advance(2.0)
    assert not fut.done() and clock.armed() == [] and len(deadlines) == 0
    fut.cancel()


async def test_a_deadline_future_fails_at_its_deadline_unless_answered(clock: FakeClock) -> None:
    deadlines = AskDeadlines(clock)  # type: ignore[arg-type]
    answered = deadlines.future(1.0, "n/p/a", "echo")
    late = deadlines.future(2.0, "n/p/b", "work")
    answered.set_result("fine")
    clock.advance(2.0)
    assert answered.result() == "fine"
    with pytest.raises(AskTimeout, match=r"'work' from n/p/b within 2\.0s"):
        late.result()


async def test_an_answered_ask_is_let_go_after_a_bounded_number_of_asks(clock: FakeClock) -> None:
    """Its entry (the future, the reply it holds) goes within 2 x in-flight + slack asks: it
    must not live long enough to be promoted by the garbage collector."""
    deadlines = AskDeadlines(clock)  # type: ignore[arg-type]
    in_flight = [deadlines.future(60.0, "x", "t") for _ in range(64)]
    answered = deadlines.future(60.0, "x", "t")
    answered.set_result(b"reply")
    gone = weakref.ref(answered)
    del answered
    for _ in range(2 * len(in_flight) + _SLACK + 1):
        deadlines.future(60.0, "x", "t").set_result(None)
    gc.collect()  # only to rule out a cycle keeping it: the heap must not hold it
    assert gone() is None
    assert len(deadlines) <= 2 * len(in_flight) + _SLACK
    for fut in in_flight:
        fut.cancel()
