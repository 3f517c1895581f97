"""The master answers its workers without a task per message, and loses nothing doing so.

The workers' controls (register_worker, request_task, renew, complete, fail, decline) are plain
handlers: each queues its events with the driver and returns an Answer that the router sends
once the batch is journaled (troupe.runtime.core.router). These tests hold them to the
protocol: every task once, with real TaskGetters, and no task started for any worker control;
a report is read the same by its fast path as by the checked one; and an answer that waits on
several of the driver's futures gives every result, in order, whatever order they finish in.
"""

from __future__ import annotations

import asyncio
import gc
import logging
from collections import Counter
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import anyio.lowlevel
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from troupe.runtime.core.runtime import Runtime
from troupe.runtime.errors import BadRequest, JournalError
from troupe.runtime.tasks.book import TaskBook
from troupe.runtime.tasks.getter import TaskGetter
from troupe.runtime.tasks.getter_config import GetterConfig
from troupe.runtime.tasks.getter_start import install_task_control
from troupe.runtime.tasks.master.answers import after_all
from troupe.runtime.tasks.master.controls import ReportControl
from troupe.runtime.tasks.master.driver import Dispatcher
from troupe.runtime.tasks.master.journal_open import open_journal
from troupe.runtime.tasks.master.master import Master
from troupe.runtime.tasks.master.master_config import MasterConfig
from troupe.runtime.tasks.state import JobPolicy, SchedulerTick, SubmitJob, TaskSpec
from troupe.runtime.tasks.task_actor import LeasedTask
from troupe.runtime.transports.base import MemoryHub

MASTER = "mem://master"
WORKER_CONTROLS = {"register_worker", "request_task", "renew", "complete", "fail", "decline"}


@asynccontextmanager
async def _master(tmp_path: Path) -> AsyncIterator[tuple[Master, MemoryHub, Counter[str]]]:
    """A master over the memory transport, counting the controls it started a task for."""
    hub = MemoryHub()
    journal, book = open_journal(tmp_path / "journal.db", new=True)
    master = Master(MasterConfig(tick_s=0.01), journal, book, transport=hub.transport(name="master"))
    tasks: Counter[str] = Counter()
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(master.run)
            await master.ready.wait()
            runtime = master.runtime
            assert runtime is not None
            start_soon = runtime.start_soon

            def counting(fn: Any, *args: Any) -> None:
                if getattr(fn, "__name__", "") == "_await_control":
                    tasks[args[2]] += 1  # (route, msg_id, msg_type, coroutine)
                start_soon(fn, *args)

            runtime.start_soon = counting  # type: ignore[method-assign]
            yield master, hub, tasks
            master.stop()
            tg.cancel_scope.cancel()
    finally:
        journal.close()


async def test_every_task_runs_once_and_no_worker_control_starts_a_task(tmp_path: Path) -> None:
    ran: Counter[str] = Counter()

    async def run(task: LeasedTask) -> str:
        ran[task.task_id] += 1
        await anyio.lowlevel.checkpoint()
        return f"out/{task.task_id}"

    with anyio.fail_after(30):
        async with (
            _master(tmp_path) as (_, hub, tasks),
            Runtime("client", "client", hub.transport()) as client,
            Runtime("n1", "w", hub.transport()) as rt,
        ):
            getters: dict[str, TaskGetter] = {}
            install_task_control(rt, getters)
            for i in range(4):
                config = GetterConfig(f"n1/w{i}", "n1", wait_s=0.3, call_timeout_s=5.0, retry_s=0.02)
                getters[config.worker_id] = TaskGetter(rt, MASTER, config, run)
                rt.start_soon(getters[config.worker_id].run)
            job = {"job": {"job": {"name": "j", "kind": "k", "count": 200}}, "source": "test"}
            await client.control(MASTER, "submit", job, timeout=10)
            done = await client.control(MASTER, "wait_job", {"job_id": "j", "timeout_s": 20}, timeout=25)
    assert done["state"] == "done" and done["counts"]["done"] == 200
    assert len(ran) == 200 and set(ran.values()) == {1}
    assert tasks["submit"] == 1  # an operator's control is async: a task of its own, counted
    assert not WORKER_CONTROLS & set(tasks), tasks


REPORT_VALUES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-5, 2**40),
    st.floats(allow_nan=True),
    st.text(max_size=5),
    st.lists(st.integers(), max_size=2),
)
REPORT_KEYS = st.sampled_from(
    ["worker_id", "task_id", "lease_id", "request", "result_ref", "error", "traceback", "reason",
     "kind", "given_back", "run_s", "unknown"]
)  # fmt: skip
GOOD = {"worker_id": "n/w0", "task_id": "j/1", "lease_id": 7}


def _read(decode: Any, payload: Any) -> Any:
    try:
        return decode("complete", payload)
    except BadRequest as exc:
        return ("bad_request", str(exc))


@settings(max_examples=300, deadline=None, database=None)
@given(
    base=st.sampled_from([{}, GOOD]),
    fields=st.dictionaries(REPORT_KEYS, REPORT_VALUES, max_size=6),
)
def test_a_report_reads_the_same_by_its_fast_path_as_by_the_checked_one(
    base: dict[str, Any], fields: dict[str, Any]
) -> None:
    payload = {**base, **fields}
    assert _read(ReportControl.decode, payload) == _read(ReportControl.decode_checked, payload)


@pytest.mark.parametrize(
    "payload",
    [
        {**GOOD, "request": 1, "run_s": 0.25, "result_ref": "out://x"},
        {**GOOD, "run_s": 3},  # an int is a number of seconds too
        {**GOOD, "request": None, "error": None, "given_back": True, "unknown": [1]},
        {**GOOD, "lease_id": True},  # a bool is never an int on the wire
        {**GOOD, "run_s": float("inf")},
        {**GOOD, "worker_id": None},
        None,
        [],
    ],
    ids=["full", "int-run_s", "nils", "bool-lease", "inf-run_s", "nil-required", "nil", "list"],
)
def test_the_reports_a_worker_sends_read_alike_either_way(payload: Any) -> None:
    assert _read(ReportControl.decode, payload) == _read(ReportControl.decode_checked, payload)


async def test_an_answer_on_several_futures_gives_every_result_in_their_order() -> None:
    loop = asyncio.get_running_loop()
    first: asyncio.Future[Any] = loop.create_future()
    second: asyncio.Future[Any] = loop.create_future()
    answer = after_all([first, second], lambda results: results)
    second.set_result(["b"])  # the last one first: the earlier one is waited for still
    loop.call_soon(first.set_result, ["a"])
    with anyio.fail_after(5):
        assert await answer == [["a"], ["b"]]


class _FailingJournal:
    path = Path("failing.db")

    def stage(self, records: Any) -> bool:
        return True

    def commit(self) -> None:
        raise JournalError("journal failing.db: append failed: disk full")

    def rollback(self) -> None:
        pass


async def test_an_answer_on_events_of_a_failed_journal_raises_and_logs_nothing_lost(
    caplog: pytest.LogCaptureFixture,
) -> None:
    driver = Dispatcher(TaskBook(), _FailingJournal(), lambda _: None)  # type: ignore[arg-type]
    job = SubmitJob("j", [TaskSpec("j-0", "k", 0)], JobPolicy(lease_s=30))
    futures = [driver.put(job), driver.put(SchedulerTick()), driver.put(SchedulerTick())]
    answer = after_all(futures, lambda results: results)
    with caplog.at_level(logging.ERROR, logger="asyncio"), anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            tg.start_soon(_run_until_it_fails, driver)
            with pytest.raises(JournalError, match="disk full"):
                await answer
        del futures, answer
        gc.collect()
    assert "never retrieved" not in caplog.text


async def _run_until_it_fails(driver: Dispatcher) -> None:
    with pytest.raises(JournalError):
        await driver.run()
