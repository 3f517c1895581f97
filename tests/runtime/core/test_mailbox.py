"""The bounded mailbox: FIFO order, backpressure, MailboxFull, close and statistics."""

from __future__ import annotations

from typing import Any, TypeVar

import anyio
import pytest

from troupe.runtime.core.mailbox import Mailbox, MailboxStats
from troupe.runtime.errors import ActorStopped, DeliveryError, MailboxFull

BOUND = 2.0  # seconds; every wait in this file is bounded by it and normally takes microseconds


T = TypeVar("T")


async def _put(mb: Mailbox[T], item: T, *, task_status: Any = anyio.TASK_STATUS_IGNORED) -> None:
    """Put ``item``; started with ``tg.start`` the caller resumes once this put is waiting."""
    task_status.started()
    await mb.put(item)


async def _get_into(mb: Mailbox[T], out: list[T], *, task_status: Any = anyio.TASK_STATUS_IGNORED) -> None:
    task_status.started()
    out.append(await mb.get())


def test_capacity_must_be_positive() -> None:
    """A mailbox that could hold nothing is refused with a message saying the minimum."""
    with pytest.raises(ValueError, match="at least 1"):
        Mailbox(0)


def test_fresh_statistics() -> None:
    """A new mailbox reports its capacity and zero counters."""
    assert Mailbox(3, "m").statistics() == MailboxStats(3, 0, 0, 0, 0, 0, 0, False)


async def test_put_and_get_keep_fifo_order() -> None:
    """Items come out in the order they went in."""
    mb: Mailbox[int] = Mailbox(10)
    for i in range(5):
        await mb.put(i)
    mb.put_nowait(5)
    assert len(mb) == 6
    with anyio.fail_after(BOUND):
        got = [await mb.get() for _ in range(3)]
    got += [mb.get_nowait() for _ in range(3)]
    assert got == [0, 1, 2, 3, 4, 5]
    assert mb.get_nowait() is None


async def test_put_nowait_raises_mailbox_full_at_capacity() -> None:
    """At its bound put_nowait raises MailboxFull, counts the refusal and keeps the items."""
    mb: Mailbox[str] = Mailbox(2, "worker-a")
    mb.put_nowait("a")
    mb.put_nowait("b")
    with pytest.raises(MailboxFull, match=r"worker-a.*full") as info:
        mb.put_nowait("c")
    assert isinstance(info.value, DeliveryError)
    stats = mb.statistics()
    assert (stats.depth, stats.refused_puts, stats.put) == (2, 1, 2)
    assert [mb.get_nowait(), mb.get_nowait()] == ["a", "b"]
    mb.put_nowait("d")  # room again
    assert mb.get_nowait() == "d"


async def test_put_waits_until_a_get_makes_room() -> None:
    """A put into a full mailbox waits, and completes once the consumer takes an item."""
    mb: Mailbox[int] = Mailbox(1)
    mb.put_nowait(1)
    done = anyio.Event()

    async def producer(*, task_status: Any = anyio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        await mb.put(2)
        done.set()

    with anyio.fail_after(BOUND):
        async with anyio.create_task_group() as tg:
            await tg.start(producer)
            assert not done.is_set()
            assert mb.statistics().waited_puts == 1
            assert len(mb) == 1
            assert await mb.get() == 1
            await done.wait()
    assert mb.get_nowait() == 2
    assert mb.statistics().high_water == 1


async def test_waiting_putters_are_served_in_order() -> None:
    """Several producers blocked on a full mailbox enter it in the order they arrived."""
    mb: Mailbox[int] = Mailbox(1)
    mb.put_nowait(0)
    with anyio.fail_after(BOUND):
        async with anyio.create_task_group() as tg:
            for i in range(1, 6):
                await tg.start(_put, mb, i)
            assert mb.statistics().waited_puts == 5
            got = [await mb.get() for _ in range(6)]
    assert got == [0, 1, 2, 3, 4, 5]
    assert mb.statistics().high_water == 1


async def test_get_waits_for_an_item() -> None:
    """A get on an empty mailbox waits until a producer puts something."""
    mb: Mailbox[str] = Mailbox(4)
    got: list[str] = []
    with anyio.fail_after(BOUND):
        async with anyio.create_task_group() as tg:
            await tg.start(_get_into, mb, got)
            assert got == []
            mb.put_nowait("x")
    assert got == ["x"]


async def test_cancelled_putter_leaves_no_trace() -> None:
    """A producer cancelled while waiting neither enqueues its item nor holds up the next one."""
    mb: Mailbox[int] = Mailbox(1)
    mb.put_nowait(0)
    doomed = anyio.CancelScope()

    async def doomed_put(*, task_status: Any = anyio.TASK_STATUS_IGNORED) -> None:
        with doomed:
            task_status.started()
            await mb.put(1)

    with anyio.fail_after(BOUND):
        async with anyio.create_task_group() as tg:
            await tg.start(doomed_put)
            await tg.start(_put, mb, 99)
            doomed.cancel()
            assert await mb.get() == 0
            assert await mb.get() == 99
    assert mb.get_nowait() is None
    assert doomed.cancelled_caught


async def test_close_keeps_queued_items_for_draining() -> None:
    """After close, queued items can still be taken; then get raises ActorStopped."""
    mb: Mailbox[int] = Mailbox(5, "m")
    for i in range(3):
        mb.put_nowait(i)
    mb.close()
    assert mb.statistics().closed
    with anyio.fail_after(BOUND):
        assert await mb.get() == 0
        assert mb.drain() == [1, 2]
        with pytest.raises(ActorStopped):
            await mb.get()
    assert mb.statistics().got == 3


async def test_close_refuses_new_items() -> None:
    """A closed mailbox refuses put and put_nowait with ActorStopped, even when not full."""
    mb: Mailbox[int] = Mailbox(5, "gone")
    mb.close()
    with pytest.raises(ActorStopped, match="gone"):
        mb.put_nowait(1)
    with anyio.fail_after(BOUND), pytest.raises(ActorStopped):
        await mb.put(1)
    assert len(mb) == 0


async def test_close_wakes_a_waiting_consumer() -> None:
    """A consumer waiting on an empty mailbox gets ActorStopped when it is closed."""
    mb: Mailbox[int] = Mailbox(1)
    outcome: list[BaseException] = []

    async def consumer(*, task_status: Any = anyio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        try:
            await mb.get()
        except ActorStopped as exc:
            outcome.append(exc)

    with anyio.fail_after(BOUND):
        async with anyio.create_task_group() as tg:
            await tg.start(consumer)
            mb.close()
    assert len(outcome) == 1


async def test_close_fails_waiting_producers() -> None:
    """Producers waiting for space get ActorStopped at close and their items are not queued."""
    mb: Mailbox[int] = Mailbox(1)
    mb.put_nowait(0)
    failures: list[int] = []

    async def producer(i: int, *, task_status: Any = anyio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        try:
            await mb.put(i)
        except ActorStopped:
            failures.append(i)

    with anyio.fail_after(BOUND):
        async with anyio.create_task_group() as tg:
            await tg.start(producer, 1)
            await tg.start(producer, 2)
            mb.close()
    assert sorted(failures) == [1, 2]
    assert mb.drain() == [0]


async def test_statistics_count_everything() -> None:
    """put, got, waited, refused, depth and high-water reflect what happened, as a frozen snapshot."""
    mb: Mailbox[int] = Mailbox(3)
    for i in range(3):
        mb.put_nowait(i)
    with pytest.raises(MailboxFull):
        mb.put_nowait(3)
    with anyio.fail_after(BOUND):
        async with anyio.create_task_group() as tg:
            await tg.start(_put, mb, 4)
            mb.get_nowait()
    mb.get_nowait()
    stats = mb.statistics()
    assert stats == MailboxStats(
        capacity=3, depth=2, high_water=3, put=4, got=2, waited_puts=1, refused_puts=1, closed=False
    )
    with pytest.raises(AttributeError):
        stats.depth = 0  # type: ignore[misc]


async def test_capacity_holds_when_put_nowait_races_a_woken_putter() -> None:
    """The depth never exceeds the capacity, even when put_nowait runs right after a get."""
    mb: Mailbox[int] = Mailbox(1)
    mb.put_nowait(0)
    with anyio.fail_after(BOUND):
        async with anyio.create_task_group() as tg:
            await tg.start(_put, mb, 1)
            assert mb.get_nowait() == 0  # wakes the putter, which has not run yet
            with pytest.raises(MailboxFull):
                mb.put_nowait(2)  # the freed slot is promised to the waiting putter
    assert mb.statistics().high_water <= mb.capacity
    assert [mb.get_nowait(), mb.get_nowait()] == [1, None]
