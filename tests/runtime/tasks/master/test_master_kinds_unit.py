"""The master with real TaskGetters over the in-memory transport: task kinds, late commits, resubmits."""

from __future__ import annotations

from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import anyio.lowlevel
import pytest

from troupe.cli.master_client import submit_job
from troupe.runtime.core.runtime import Runtime
from troupe.runtime.errors import AskTimeout, ConfigError, TaskError
from troupe.runtime.tasks.getter import TaskGetter
from troupe.runtime.tasks.getter_config import GetterConfig
from troupe.runtime.tasks.getter_start import install_task_control
from troupe.runtime.tasks.master.journal_open import open_journal
from troupe.runtime.tasks.master.master import Master
from troupe.runtime.tasks.master.master_config import MasterConfig
from troupe.runtime.tasks.task_actor import LeasedTask
from troupe.runtime.tasks.task_runner import KindNotRun
from troupe.runtime.testing.plugin import free_endpoint
from troupe.runtime.transports.base import MemoryHub
from troupe.runtime.transports.zmq import ZmqTransport

MASTER = "mem://master"
Runner = Callable[[LeasedTask], Awaitable[str | None]]


class Cluster:
    """A master, a client runtime, and the getters started so far."""

    def __init__(self, hub: MemoryHub, master: Master, client: Runtime) -> None:
        self.hub = hub
        self.master = master
        self.client = client
        self.getters: dict[str, TaskGetter] = {}

    async def call(self, msg_type: str, payload: Any = None, timeout: float = 5.0) -> Any:
        return await self.client.control(MASTER, msg_type, payload, timeout=timeout)

    async def submit(self, job: dict[str, Any], tasks: list[dict[str, Any]] | None = None) -> Any:
        doc: dict[str, Any] = {"job": job}
        if tasks is not None:
            doc["tasks"] = tasks
        return await self.call("submit", {"job": doc, "source": "test.toml"})

    async def job(self, job_id: str) -> dict[str, Any]:
        return next(j for j in await self.call("jobs") if j["job_id"] == job_id)

    @asynccontextmanager
    async def worker(self, name: str, runner: Runner, *kinds: str) -> AsyncIterator[TaskGetter]:
        """One getter ``name/w`` in a runtime of its own, advertising ``kinds``."""
        async with Runtime(name, "w", self.hub.transport()) as rt:
            install_task_control(rt, self.getters)
            getter = TaskGetter(
                rt,
                MASTER,
                GetterConfig(
                    f"{name}/w", name, slots=2, kinds=kinds, wait_s=0.3, call_timeout_s=1.0, retry_s=0.02
                ),
                runner,
            )
            self.getters[getter.worker_id] = getter
            rt.start_soon(getter.run)
            await until(lambda: getter.worker_id in self.master.workers())
            yield getter


async def until(condition: Callable[[], Any], timeout: float = 10.0) -> None:
    """A bounded poll of a condition, yielding to the loop between looks."""
    with anyio.fail_after(timeout):
        while not condition():
            await anyio.sleep(0.005)


class FakeClock:
    """The master's monotonic clock (its leases' clock), driven by the test."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@asynccontextmanager
async def cluster(tmp_path: Path, clock: FakeClock | None = None) -> AsyncIterator[Cluster]:
    hub = MemoryHub()
    journal, book = open_journal(tmp_path / "journal.db", new=True)
    master = Master(
        MasterConfig(tick_s=0.01),
        journal,
        book,
        transport=hub.transport(name="master"),
        **({"clock": clock} if clock is not None else {}),
    )
    async with anyio.create_task_group() as tg:
        tg.start_soon(master.run)
        await master.ready.wait()
        async with Runtime("client", "client", hub.transport()) as client:
            yield Cluster(hub, master, client)
            master.stop()
            tg.cancel_scope.cancel()
    journal.close()


def recorder(ran: list[tuple[str, str, int]], node: str) -> Runner:
    async def run(task: LeasedTask) -> str:
        ran.append((task.task_id, node, task.attempt))
        await anyio.lowlevel.checkpoint()
        return f"out://{task.task_id}"

    return run


def both_kinds(n: int) -> list[dict[str, Any]]:
    return [{"id": f"t{i}", "seed": i, "kind": ("plan", "render")[i % 2]} for i in range(n)]


async def test_two_workers_of_different_kinds_share_a_job_of_both_without_wasting_an_attempt(
    tmp_path: Path,
) -> None:
    """A job of two kinds on two single-kind workers: each task runs once, on its kind's worker."""
    ran: list[tuple[str, str, int]] = []
    async with (
        cluster(tmp_path) as c,
        c.worker("planner", recorder(ran, "planner"), "plan"),
        c.worker("renderer", recorder(ran, "renderer"), "render"),
    ):
        await c.submit({"name": "mix", "kind": "plan", "max_attempts": 1}, both_kinds(40))
        job = await c.call("wait_job", {"job_id": "mix", "timeout_s": 10}, 15)
        status = await c.call("status")
    assert job["state"] == "done" and job["counts"]["done"] == 40
    assert Counter(t for t, _, _ in ran) == Counter({f"t{i}": 1 for i in range(40)})
    assert all(attempt == 1 for _, _, attempt in ran)
    assert {t for t, node, _ in ran if node == "planner"} == {f"t{i}" for i in range(0, 40, 2)}
    assert {w["worker_id"]: w["kinds"] for w in status["workers"]} == {
        "planner/w": ["plan"],
        "renderer/w": ["render"],
    }


async def test_a_kind_nobody_runs_waits_visibly_then_runs_when_its_worker_joins(tmp_path: Path) -> None:
    """`jobs` names the kind a pending task waits for; a worker of that kind joining runs it."""
    ran: list[tuple[str, str, int]] = []
    async with cluster(tmp_path) as c, c.worker("planner", recorder(ran, "planner"), "plan"):
        await c.submit({"name": "later", "kind": "render", "count": 3, "max_attempts": 1})
        await c.submit({"name": "gpu", "kind": "plan", "count": 1, "needs": {"gpu": 1}})
        job = await c.job("later")
        assert job["state"] == "running" and job["counts"]["pending"] == 3
        assert [(w["kind"], w["tasks"], w["reason"]) for w in job["waiting"]] == [
            ("render", 3, "waiting for kind render: no live worker runs it")
        ]
        gpu = await c.job("gpu")
        assert [w["reason"] for w in gpu["waiting"]] == ["waiting for gpu=1: no worker has it"]
        assert gpu["waiting"][0]["needs"] == {"cpu": 1.0, "gpu": 1}
        async with c.worker("renderer", recorder(ran, "renderer"), "render"):
            job = await c.call("wait_job", {"job_id": "later", "timeout_s": 10}, 15)
    assert job["state"] == "done" and job["waiting"] == []
    assert sorted(ran) == [(f"later-00000{i}", "renderer", 1) for i in range(3)]


async def test_a_worker_that_cannot_run_a_kind_declines_it_without_costing_an_attempt(
    tmp_path: Path,
) -> None:
    """A runner raising KindNotRun returns the task (no attempt); the master leases it elsewhere."""
    declined = anyio.Event()

    async def wrong(task: LeasedTask) -> str:
        declined.set()
        raise KindNotRun(f"no actor runs {task.kind}")

    ran: list[tuple[str, str, int]] = []
    async with cluster(tmp_path) as c, c.worker("liar", wrong) as liar:
        await c.submit({"name": "once", "kind": "render", "count": 1, "max_attempts": 1})
        with anyio.fail_after(10):
            await declined.wait()
        await until(lambda: liar.statistics().declined == 1)
        job = await c.job("once")
        assert job["counts"]["pending"] == 1 and not job["counts"].get("dead")
        assert [w["reason"] for w in job["waiting"]] == ["waiting for kind render: no live worker runs it"]
        async with c.worker("renderer", recorder(ran, "renderer"), "render"):
            job = await c.call("wait_job", {"job_id": "once", "timeout_s": 10}, 15)
    assert job["state"] == "done"
    assert ran == [("once-000000", "renderer", 1)]
    assert liar.statistics().failed == 0


async def test_a_lease_given_to_a_worker_of_other_kinds_is_declined_by_the_getter(
    tmp_path: Path,
) -> None:
    """The getter itself refuses a lease outside its advertised kinds, before the runner sees it."""
    ran: list[tuple[str, str, int]] = []
    async with cluster(tmp_path) as c, c.worker("planner", recorder(ran, "planner"), "plan") as g:
        # the master no longer sends such a lease: play one, as a confused master would
        g._start(
            [
                {
                    "task_id": "x",
                    "job_id": "j",
                    "kind": "render",
                    "seed": 0,
                    "attempt": 1,
                    "lease_id": 1,
                    "backup": False,
                    "ttl": 60.0,
                }
            ]
        )
        await until(lambda: g.statistics().declined == 1)
    assert ran == []


async def test_a_complete_after_a_partition_longer_than_the_lease_turns_the_dead_task_done(
    tmp_path: Path,
) -> None:
    """max_attempts = 1: the lease expires while the worker is cut off and the job fails; the
    Complete after the heal makes the task and the job done, and a restarted master agrees.
    The master's monotonic clock is driven: the lease expires when the test moves it past the
    lease."""
    committed = anyio.Event()
    heal = anyio.Event()
    clock = FakeClock()

    async def commits_then_waits(task: LeasedTask) -> str:
        committed.set()  # the output is committed before the report (the TaskActor contract)
        await heal.wait()
        return f"out://{task.task_id}"

    async with cluster(tmp_path, clock) as c, c.worker("cut", commits_then_waits) as g:
        runtime = g.runtime
        master_rt = c.master.runtime
        assert master_rt is not None
        renew = master_rt.control_handlers["renew"]
        cancel = runtime.control_handlers["cancel_lease"]

        async def unheard_renew(payload: Any) -> Any:  # the partition: renewals never arrive
            await heal.wait()
            return await renew(payload)

        async def unheard_cancel(payload: Any) -> bool:  # ...nor does the master's cancel
            return False

        master_rt.unregister_control("renew")
        master_rt.register_control("renew", unheard_renew)
        runtime.unregister_control("cancel_lease")
        runtime.register_control("cancel_lease", unheard_cancel)
        await c.submit({"name": "cut", "kind": "k", "count": 1, "max_attempts": 1, "lease_s": 0.2})
        with anyio.fail_after(10):
            await committed.wait()
        clock.now += 1.0  # the partition outlasts the lease (0.2 s)
        await c.master.tick()
        failed = await c.call("wait_job", {"job_id": "cut", "timeout_s": 10}, 15)
        assert failed["state"] == "failed" and failed["counts"]["dead"] == 1
        master_rt.unregister_control("renew")
        master_rt.register_control("renew", renew)
        runtime.unregister_control("cancel_lease")
        runtime.register_control("cancel_lease", cancel)
        heal.set()
        await until(lambda: g.statistics().completed == 1)
        job = await c.job("cut")
        dead = await c.call("dead", {"job_id": "cut"})
        replayed = c.master.journal.replay()
    assert job["state"] == "done" and job["counts"]["done"] == 1 and not job["counts"]["dead"]
    assert dead == []
    assert str(replayed.task("cut-000000").state) == "done"
    assert [str(j.state) for j in replayed.jobs()] == ["done"]


async def test_submitting_the_same_job_again_says_it_is_there_and_other_content_is_refused(
    tmp_path: Path,
) -> None:
    """Same id and content: already submitted (success). Same id, other content: job id taken."""
    async with cluster(tmp_path) as c:
        job = {"name": "again", "kind": "k", "count": 5}
        first = await c.submit(job)
        second = await c.submit(job)
        with pytest.raises(TaskError, match="taken"):
            await c.submit({**job, "count": 6})
        jobs = await c.call("jobs")
    assert first == {"job_id": "again", "tasks": 5, "already": False, "state": None}
    assert second == {"job_id": "again", "tasks": 5, "already": True, "state": "running"}
    assert [j["job_id"] for j in jobs] == ["again"]


HOSTILE_JOBS = [
    ({"kind": "sl\x1b[2Jeep"}, "[job].kind 'sl\\x1b[2Jeep' is not a kind"),
    ({"priority": 2**64 - 1}, "[job].priority must be an integer between"),
    ({"refs": {"params": "not-a-ref"}}, "[job].refs.params must be a content reference"),
]


@pytest.mark.parametrize(("fields", "refusal"), HOSTILE_JOBS, ids=[r for _, r in HOSTILE_JOBS])
async def test_a_submit_control_a_job_file_would_refuse_is_refused_by_the_master(
    tmp_path: Path, fields: dict[str, Any], refusal: str
) -> None:
    """A peer that sends the submit control itself gets the job file's checks: nothing is taken."""
    async with cluster(tmp_path) as c:
        with pytest.raises(ConfigError) as refused:
            await c.submit({"name": "hostile", "kind": "k", "count": 1, **fields})
        assert refusal in str(refused.value)
        assert await c.call("jobs") == []


@asynccontextmanager
async def fake_master(
    ping_answers: bool, submitted: anyio.Event, dies_taking_it: bool = False
) -> AsyncIterator[str]:
    """A ZeroMQ endpoint whose ``submit`` never ends in time; ``ping`` answers if asked to (and,
    with ``dies_taking_it``, no more once a submit came)."""
    endpoint = free_endpoint()
    async with Runtime("fake", "master", ZmqTransport(bind=endpoint), drain_timeout=0.1) as rt:
        forever = anyio.Event()

        async def ping(_: Any) -> dict[str, Any]:
            if not ping_answers or (dies_taking_it and submitted.is_set()):
                await forever.wait()
            return {"master": "fake"}

        async def submit(_: Any) -> dict[str, Any]:
            submitted.set()
            await forever.wait()
            return {}

        rt.register_controls({"ping": ping, "submit": submit})
        yield endpoint
        forever.set()


@pytest.mark.parametrize("ping_answers", [True, False])
async def test_a_slow_submit_says_the_master_is_still_writing_not_that_nobody_answers(
    ping_answers: bool,
) -> None:
    """The CLI pings first: a master that answers but is slow to journal is not called absent."""
    submitted = anyio.Event()
    payload = {"job": {"job": {"name": "big"}}, "source": "big.toml", "job_id": None}
    async with fake_master(ping_answers, submitted) as endpoint:
        with pytest.raises(AskTimeout) as caught:
            await submit_job(endpoint, payload, 0.5)
    message = str(caught.value)
    if ping_answers:
        assert submitted.is_set()
        assert "answers, but is still writing job 'big'" in message and "ctl jobs" in message
        assert "no master answers" not in message
    else:
        assert not submitted.is_set()  # nothing was sent that could half-happen
        assert "did not answer" in message and "ping" in message
        assert "busy, paused (SIGSTOP) or hung" in message and "start one" not in message  # it runs


async def test_a_master_that_stops_answering_during_a_submit_is_not_said_to_be_writing() -> None:
    """The submit's reply and a second ping both fail: the CLI says the master went silent,
    where to look, and that submitting again is safe; not that it is still writing."""
    submitted = anyio.Event()
    payload = {"job": {"job": {"name": "big"}}, "source": "big.toml", "job_id": None}
    async with fake_master(True, submitted, dies_taking_it=True) as endpoint:
        with pytest.raises(AskTimeout) as caught:
            await submit_job(endpoint, payload, 0.5)
    message = str(caught.value)
    assert submitted.is_set()
    assert "has not answered the submit of job 'big' in " in message and "nor a ping since" in message
    assert "may or may not have the job" in message
    assert "see its log" in message and "all of a job or none of it" in message
    assert "still writing" not in message


async def test_a_master_gone_during_a_submit_is_said_to_be_gone_after_the_seconds_waited() -> None:
    """The master's connection ends while it takes a job: the CLI says so when it happens,
    with the seconds it waited, not its timeout, and that the master may or may not have the
    job (it said the master took the job, after the whole timeout, and it had not)."""
    submitted, outcome = anyio.Event(), []
    payload = {"job": {"job": {"name": "big"}}, "source": "big.toml", "job_id": None}
    endpoint = free_endpoint()

    async def ping(_: Any) -> dict[str, Any]:
        return {"master": "fake"}

    async def submit_answered_never(_: Any) -> dict[str, Any]:
        submitted.set()
        await anyio.sleep_forever()
        return {}

    async def submit() -> None:
        try:
            await submit_job(endpoint, payload, 600.0)
        except AskTimeout as exc:
            outcome.append(exc)

    with anyio.fail_after(60):
        # the fake master goes (its runtime closes, the submit unanswered) before the group ends
        async with (
            anyio.create_task_group() as tg,
            Runtime("fake", "master", ZmqTransport(bind=endpoint), drain_timeout=0.1) as rt,
        ):
            rt.register_controls({"ping": ping, "submit": submit_answered_never})
            tg.start_soon(submit)
            await submitted.wait()
    (caught,) = outcome
    message = str(caught)
    assert isinstance(caught, AskTimeout)
    assert f"the connection to the master at {endpoint} ended " in message, message
    assert "s into the submit of job 'big'" in message and "600" not in message
    assert "may or may not have the job" in message and "ctl jobs" in message
    assert "took job" not in message


async def test_a_submit_stopped_after_it_was_sent_says_the_master_may_have_the_job(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Ctrl-C while a big job is taken in: the stop says the job may be at the master already
    and that submitting again is safe (it said only that it stopped, and the job was there)."""
    submitted = anyio.Event()
    payload = {"job": {"job": {"name": "big"}}, "source": "big.toml", "job_id": None}
    async with fake_master(True, submitted) as endpoint:
        with anyio.fail_after(30):
            async with anyio.create_task_group() as tg:
                tg.start_soon(submit_job, endpoint, payload, 600.0)
                await submitted.wait()
                tg.cancel_scope.cancel()  # what the command's stop does on Ctrl-C
    said = " ".join(capsys.readouterr().err.split())
    assert "the submit of job big was sent: the master may have it (`troupe ctl jobs` shows it)" in said, said
    assert "submitting the same file again is safe" in said
