"""A pipeline's job on a master: a rerun goes on with the job the master has; a run that asks
for other items than the job was made with is refused, before anything moves."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import anyio
import pytest

from support.memory_master import MASTER, master_in_memory
from troupe.actors.datagen.config import default_pipeline
from troupe.runtime.core.runtime import Runtime
from troupe.runtime.errors import ConfigError
from troupe.runtime.node import spawn_owners
from troupe.runtime.pipeline import master_job
from troupe.runtime.pipeline.master_job import master_source
from troupe.runtime.pipeline.source import MasterSource
from troupe.runtime.process_identity import gone_here, process_identity
from troupe.runtime.security.roles import NotPermitted
from troupe.runtime.tasks.task_actor import LeasedTask

pytestmark = pytest.mark.anyio


async def _lease_every_item(source: MasterSource, items: int) -> list[str]:
    """Run ``source`` until it leased ``items`` items (bounded); their task ids."""
    taken: list[str] = []
    async with anyio.create_task_group() as tg:
        tg.start_soon(source.run, lambda: None)
        with anyio.fail_after(15):
            while len(taken) < items:
                taken += [item.task_id for item in source.take(items)]
                await anyio.sleep(0.01)
        tg.cancel_scope.cancel()
    return taken


async def test_a_rerun_goes_on_with_the_same_job(tmp_path: Path) -> None:
    cfg = default_pipeline(items=8)
    async with master_in_memory(tmp_path) as m:
        _, before = await master_source(m.client, MASTER, cfg)
        assert before == 0
        _, again = await master_source(m.client, MASTER, cfg)  # the master has it: kept
        jobs = await m.call("jobs")
        assert [(j["job_id"], j["total"]) for j in jobs] == [(cfg.name, 8)]
        assert again == 0


@pytest.mark.parametrize(
    ("change", "named"),
    [
        ({"items": 12}, "items=12"),
        ({"seed_start": 100}, "seed_start=100"),
        ({"max_attempts": 5}, "max_attempts=5"),
    ],
)
async def test_other_items_under_the_same_name_are_refused(
    tmp_path: Path, change: dict[str, int], named: str
) -> None:
    cfg = default_pipeline(items=8)
    async with master_in_memory(tmp_path) as m:
        await master_source(m.client, MASTER, cfg)
        with pytest.raises(ConfigError) as refused:
            await master_source(m.client, MASTER, cfg.model_copy(update=change))
        message = str(refused.value)
        assert f"the master's job {cfg.name!r} was made with other items (8 tasks" in message
        assert named in message and "another [pipeline] name" in message
        jobs = await m.call("jobs")
        assert [(j["job_id"], j["total"]) for j in jobs] == [(cfg.name, 8)]  # left as it was


async def test_the_run_leases_its_own_jobs_tasks_only(tmp_path: Path) -> None:
    """Another job on the same master (a user's, another pipeline's) is never the run's."""
    cfg = default_pipeline(items=4)
    async with master_in_memory(tmp_path) as m:
        await m.submit("other", 4)
        source, _ = await master_source(m.client, MASTER, cfg)
        taken = await _lease_every_item(source, cfg.items)
        jobs = {j["job_id"]: j for j in await m.call("jobs")}
        assert len(taken) == cfg.items and all(t.startswith(f"{cfg.name}-") for t in taken), taken
        assert jobs["other"]["counts"].get("leased", 0) == 0, jobs["other"]


async def test_a_second_live_run_of_the_job_is_refused_and_a_dead_ones_record_is_not(tmp_path: Path) -> None:
    """Two runs of one job at once would each write part of it; a killed run's registration
    (it outlives the run) does not block the next."""
    cfg = default_pipeline(items=4)
    async with master_in_memory(tmp_path) as m:
        async with Runtime("elsewhere", "run", m.hub.transport()) as other:
            registration = {"node": "elsewhere", "endpoint": other.address, "slots": 4, "kinds": [cfg.name]}
            await m.call("register_worker", {"worker_id": "elsewhere/pipeline-1", **registration})
            with pytest.raises(ConfigError) as refused:
                await master_source(m.client, MASTER, cfg)
            assert "is being run by another troupe run (elsewhere/pipeline-1 at" in str(refused.value)
        _, before = await master_source(m.client, MASTER, cfg)  # that run is gone: its record stays
        assert before == 0


async def test_a_live_run_that_answers_no_ping_is_refused_by_what_the_master_heard(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run on another host (its loopback), or one whose CURVE server key is its operator's,
    answers no ping: it was taken for killed, and a second run of the job went ahead until its
    replicas' names clashed. It beats to the master, which says it lives; one that never beat
    since the master started (killed before, say) is gone at once."""
    monkeypatch.setattr(master_job, "_ALIVE_S", 0.2)  # nobody answers the ping there: not waited out
    monkeypatch.setattr(spawn_owners, "_VERDICT_POLL_S", 0.05)
    cfg = default_pipeline(items=4)
    async with master_in_memory(tmp_path) as m:
        registration = {"node": "far", "endpoint": "mem://nobody-answers", "slots": 4, "kinds": [cfg.name]}
        await m.call("register_worker", {"worker_id": "far/pipeline-7", **registration})
        await m.call("owner_beat", {"owner": "master:far/pipeline-7"})

        async def beating() -> None:  # as its engine does, every OWNER_BEAT_S
            while True:
                await anyio.sleep(0.05)
                await m.call("owner_beat", {"owner": "master:far/pipeline-7"})

        async with anyio.create_task_group() as tg:
            tg.start_soon(beating)
            with anyio.fail_after(60), pytest.raises(ConfigError) as refused:
                await master_source(m.client, MASTER, cfg)
            tg.cancel_scope.cancel()
        assert "another troupe run (far/pipeline-7 at mem://nobody-answers)" in str(refused.value)
    (tmp_path / "again").mkdir()
    async with master_in_memory(tmp_path / "again") as m:
        await m.call("register_worker", {"worker_id": "far/pipeline-8", **registration})  # never beat
        with anyio.fail_after(60):
            await master_source(m.client, MASTER, cfg)


async def test_a_run_registers_its_process_for_a_rerun_on_its_host_to_check(tmp_path: Path) -> None:
    cfg = default_pipeline(items=4)
    async with master_in_memory(tmp_path) as m:
        source, _ = await master_source(m.client, MASTER, cfg)
        await _lease_every_item(source, cfg.items)  # it registers as it starts
        (worker,) = [w for w in (await m.call("status"))["workers"] if w["worker_id"] == source.worker_id]
        assert worker["process"] == process_identity() and not gone_here(worker["process"])


async def test_a_run_killed_on_this_host_is_gone_at_once_whatever_the_master_heard(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A rerun right after a cluster run was killed on the same host waited for the master's
    verdict (20 s of silence and more: the killed run had beaten a moment before). Its
    registration names its process (``process_identity``): the rerun sees that it is gone, and
    goes on at once, even while the master still hears beats under its name."""
    monkeypatch.setattr(master_job, "_ALIVE_S", 0.2)  # nobody answers the ping there: not waited out
    killed = subprocess.Popen([sys.executable, "-c", "pass"])
    identity = process_identity(killed.pid)
    killed.wait(timeout=60)
    assert identity and gone_here(identity)
    cfg = default_pipeline(items=4)
    said: list[str] = []
    async with master_in_memory(tmp_path) as m:
        registration = {"node": "here", "endpoint": "mem://nobody-answers", "slots": 4, "kinds": [cfg.name]}
        await m.call("register_worker", {"worker_id": "here/pipeline-3", "process": identity, **registration})
        (worker,) = [w for w in (await m.call("status"))["workers"] if w["worker_id"] == "here/pipeline-3"]
        assert worker["process"] == identity

        async def beating() -> None:  # the master would say it lives for as long as this goes on
            while True:
                await m.call("owner_beat", {"owner": "master:here/pipeline-3"})
                await anyio.sleep(0.05)

        async with anyio.create_task_group() as tg:
            tg.start_soon(beating)
            with anyio.fail_after(60):
                await master_source(m.client, MASTER, cfg, on_event=said.append)
            tg.cancel_scope.cancel()
        # The nodes holding its replicas' names ask the master: gone now, not 20 s from now.
        seen = await m.call("owner_seen", {"owner": "master:here/pipeline-3"})
        assert seen["silent_s"] > spawn_owners.OWNER_SILENT_S, seen
    assert not any("waiting for the master" in line for line in said), said


async def test_a_killed_runs_leases_come_back_when_the_next_run_starts(tmp_path: Path) -> None:
    """A run killed with SIGKILL gives nothing back: its leases held the items for their 120 s,
    and the next run stood still that long, saying nothing. The next run finds it gone (it does
    not answer) and has the master requeue them at once (``worker_left``)."""
    cfg = default_pipeline(items=4)
    async with master_in_memory(tmp_path) as m:
        async with Runtime("elsewhere", "run", m.hub.transport()) as killed:
            first, _ = await master_source(killed, MASTER, cfg)
            await _lease_every_item(first, cfg.items)  # then no release: as if killed
        (job,) = await m.call("jobs")
        assert job["counts"].get("leased") == cfg.items, job
        await master_source(m.client, MASTER, cfg)
        (job,) = await m.call("jobs")
        assert job["counts"].get("leased", 0) == 0 and job["counts"].get("pending") == cfg.items, job


async def test_starting_anew_is_refused_once_the_master_has_the_job(tmp_path: Path) -> None:
    """A job's tasks run once: a fresh run would drop the outputs and then run nothing."""
    cfg = default_pipeline(items=4)
    async with master_in_memory(tmp_path) as m:
        await master_source(m.client, MASTER, cfg, fresh=True)  # no such job yet: it is made
        with pytest.raises(
            ConfigError, match=r"--fresh: the master has the job 'indoor-nav' already \(4 tasks"
        ):
            await master_source(m.client, MASTER, cfg, fresh=True)


async def test_another_out_for_a_job_is_refused_naming_the_one_it_writes_to(tmp_path: Path) -> None:
    """A rerun given another --out would finish the dataset there, the episodes of the earlier
    runs left in the first: two incomplete datasets. The job keeps its --out; the same one goes on."""
    cfg = default_pipeline(items=4)
    first, second = tmp_path / "out1", tmp_path / "out2"
    async with master_in_memory(tmp_path) as m:
        await master_source(m.client, MASTER, cfg, out=first)
        with pytest.raises(ConfigError) as refused:
            await master_source(m.client, MASTER, cfg, out=second)
        message = str(refused.value)
        assert f"the master's job 'indoor-nav' writes to --out {first} (0 of 4 tasks ended there)" in message
        assert f"this run was given {second}" in message and "another [pipeline] name" in message
        _, before = await master_source(m.client, MASTER, cfg, out=first)  # the same --out goes on
        assert before == 0
        (job,) = await m.call("jobs")
        assert job["refs"] == {"out": str(first)}


async def test_a_job_made_without_an_out_goes_on_with_any(tmp_path: Path) -> None:
    """A job from before jobs kept their --out (or submitted without one): nothing to compare."""
    cfg = default_pipeline(items=4)
    async with master_in_memory(tmp_path) as m:
        await master_source(m.client, MASTER, cfg)
        _, before = await master_source(m.client, MASTER, cfg, out=tmp_path / "out")
        assert before == 0
        (job,) = await m.call("jobs")
        assert job["refs"] == {}


async def test_a_job_cancelled_before_the_run_leased_anything_halts_the_run(tmp_path: Path) -> None:
    """Cancelled while the run started its replicas: no lease was taken back, so no cancel_lease
    came, and the run read the job's end as its finish: it finalised nothing ("no committed
    episodes") rather than saying the job was cancelled."""
    cfg = default_pipeline(items=4)
    async with master_in_memory(tmp_path) as m:
        source, _ = await master_source(m.client, MASTER, cfg)
        await m.call("cancel", {"job_id": cfg.name})
        with anyio.fail_after(15):
            await source.run(lambda: None)
        halted = source.halted()
        assert halted is not None and f"the master's job {cfg.name!r} was cancelled" in halted
        assert source.exhausted()


class _ReaderKeyed:
    """A run's runtime whose keys are a reader's: the master lists its jobs, refuses the submit."""

    async def control(self, master: str, msg_type: str, payload: object = None, **_: object) -> object:
        if msg_type == "jobs":
            return []
        raise NotPermitted(f"{msg_type} needs an operator key; this peer has a reader key (reader:bob)")


async def test_a_run_with_a_reader_key_says_what_the_run_needs(tmp_path: Path) -> None:
    """It said ``submit needs an operator key``: a control the user never sent."""
    with pytest.raises(ConfigError) as refused:
        await master_source(_ReaderKeyed(), MASTER, default_pipeline(items=4))  # type: ignore[arg-type]
    said = str(refused.value)
    assert said.startswith("a run on the cluster submits its job to the master and takes its items")
    assert "its keys are a reader key (reader:bob)" in said and "--operator NAME" in said


async def test_retry_dead_runs_an_earlier_runs_dead_items_again(tmp_path: Path) -> None:
    """An earlier run's dead items stay dead for a plain rerun (counted ended, not this run's);
    ``retry_dead`` puts them back, and the run leases them."""
    cfg = default_pipeline(items=3).model_copy(update={"max_attempts": 1})

    async def disk_full(task: LeasedTask) -> str:
        raise OSError(28, "No space left on device")

    async with master_in_memory(tmp_path) as m:
        await master_source(m.client, MASTER, cfg)
        async with m.worker("w", disk_full):
            job = await m.call("wait_job", {"job_id": cfg.name, "timeout_s": 10.0}, timeout=15)
        # gone, its long poll with it: else the master leases it a retried task
        await m.call("worker_left", {"worker_id": "n1/w", "reason": "test over"})
        assert (job["state"], job["counts"]["dead"]) == ("failed", 3)
        plain, before = await master_source(m.client, MASTER, cfg)
        assert (before, len(plain.dead_before)) == (3, 3)
        said: list[str] = []
        source, before = await master_source(m.client, MASTER, cfg, on_event=said.append, retry_dead=True)
        assert (before, source.dead_before) == (0, set())
        assert said == ["--retry-dead: 3 dead items of an earlier run run again"]
        taken = await _lease_every_item(source, 3)
    assert sorted(taken) == [f"{cfg.name}-{n:06d}" for n in range(3)]
