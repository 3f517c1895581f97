"""A pipeline's items as a job of a master: submitted once under the pipeline's name, then
leased by the engine (``MasterSource``).

A rerun submits the same job again: the master answers that it has it (same tasks, same
policy), and the run goes on with what the job has left. A job of that name made with other
items (``--items``, ``seed_start``, ``max_attempts``) is refused before anything moves: its
tasks are not this run's, and running them would quietly give the user another dataset than
the one asked for.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio

from troupe.runtime.core.client import answers
from troupe.runtime.core.runtime import Runtime
from troupe.runtime.errors import ConfigError, TaskError, TroupeError, UnknownMessageType
from troupe.runtime.library_logging import get_logger
from troupe.runtime.node.spawn_owners import MASTER_OWNER, OWNER_SILENT_S, master_verdict
from troupe.runtime.process_identity import gone_here
from troupe.runtime.security.roles import NotPermitted
from troupe.runtime.tasks.state import FINAL_STATES

from .config import PipelineConfig
from .source import MasterSource

__all__ = ["LEASE_S", "master_source"]

log = get_logger(__name__)

_ALIVE_S = 2.0  # how long another run's registration is given to answer before it counts as gone


# The job's reference naming the run's --out: a later run of the job given another one would
# finish the dataset there, with the episodes of the earlier runs in the first.
OUT_REF = "out"

LEASE_S = 120  # a pipeline job's lease time; the run renews its leases every third of it


def _job(cfg: PipelineConfig, out: Path | None) -> dict[str, Any]:
    return {
        "job": {
            **({"refs": {OUT_REF: str(out)}} if out is not None else {}),
            "name": cfg.name,
            "kind": cfg.name,
            "count": cfg.items,
            "seed_start": cfg.seed_start,
            "max_attempts": cfg.max_attempts,
            "lease_s": LEASE_S,
            "backoff_base_s": 0.2,
            "backoff_max_s": 5.0,
            "speculation": {"enabled": False},
        }
    }


def _other_job(job_id: str, known: dict[str, Any], cfg: PipelineConfig, why: str, own: bool) -> ConfigError:
    """``own``: the master is the run's own, its journal in ``--out``: --fresh starts it anew."""
    anew = (
        "--fresh to start anew (what --out holds is made again)"
        if own
        else ("give the pipeline another [pipeline] name for a new job")
    )
    return ConfigError(
        f"the master's job {job_id!r} was made with other items ({known.get('total')} tasks; this "
        f"run asks items={cfg.items}, seed_start={cfg.seed_start}, max_attempts={cfg.max_attempts}"
        f"{': ' + why if why else ''}): run it as it was made, or {anew}"
    )


async def master_source(
    rt: Runtime,
    master: str,
    cfg: PipelineConfig,
    master_outlives_run: bool = True,
    fresh: bool = False,
    out: Path | None = None,
    on_event: Callable[[str], None] | None = None,
    retry_dead: bool = False,
) -> tuple[MasterSource, int]:
    """Submit the pipeline's items as a job (the master keeps one it has), and lease them; also
    say how many of its tasks an earlier run ended (``master_outlives_run``: see MasterSource).
    ``out``: the run's output directory, kept with a new job (``OUT_REF``) and compared with a
    job's that the master has. ``on_event``: told when the run waits for the master's word on an
    earlier run of the job that does not answer (killed, most often: up to ``OWNER_SILENT_S``).
    ``retry_dead``: the job's dead-lettered tasks (an earlier run's dead items) run again, their
    attempts counted anew, once no other run runs the job (``troupe run --retry-dead``).

    Raises:
        ConfigError: the master has a job of the pipeline's name with other items, or made with
            another ``out``, or any job of that name when the run is to start anew (``fresh``),
            or another live run runs it.
    """
    job_id = cfg.name
    known = await _job_view(rt, master, job_id)
    if fresh and known is not None:
        # Its tasks ran once and stay run: starting anew would drop the outputs and run nothing.
        raise ConfigError(
            f"--fresh: the master has the job {job_id!r} already ({known.get('total')} tasks, "
            f"{known.get('state')}); a job's tasks run once, so it cannot start anew on this master: "
            "give the pipeline another [pipeline] name for a new job, or run without --fresh to resume"
        )
    if known is not None and known.get("total") != cfg.items:
        raise _other_job(job_id, known, cfg, "", not master_outlives_run)
    ended = {str(state) for state in FINAL_STATES}
    before = sum(int(n) for state, n in (known or {}).get("counts", {}).items() if state in ended)
    if known is not None:
        out = _same_out(job_id, known, out, before)
    try:
        await rt.control(
            master, "submit", {"job": _job(cfg, out), "source": "run_pipeline", "job_id": job_id}, timeout=60
        )
    except TaskError as exc:  # the book's refusal: the same name and count, another seed or policy
        if known is None:
            raise
        raise _other_job(job_id, known, cfg, str(exc), not master_outlives_run) from None
    except NotPermitted as exc:  # said as the command's need, not as a control the user never sent
        said = str(exc).partition("; ")[2] or str(exc)  # "this peer has a reader key (reader:bob)"
        raise ConfigError(
            f"a run on the cluster submits its job to the master and takes its items, which needs an "
            f"operator key, and {said.replace('this peer has', 'its keys are')}; run it with an "
            "operator's keys (`troupe keys generate DIR --operator NAME` adds one)"
        ) from None
    # Enough leases for every item the stages can hold at once, queued or in flight.
    slots = sum(s.queue + s.most * s.batch * s.inflight for s in cfg.stages)
    # A short poll: once every item is leased, the last one's report waits for the pending
    # request to come back empty, and the run's finalisation with it. Polls are held only
    # then (while tasks wait, a request is answered at once): a few dozen a second, locally.
    source = MasterSource(rt, master, job_id, slots, poll_s=0.05, master_outlives_run=master_outlives_run)
    source.cancelled_before = known is not None and known.get("state") == "cancelled"
    source.made = _made(job_id, known if known is not None else await _job_view(rt, master, job_id))
    alive, gone, killed_here = await _other_runs(rt, master, job_id, source.worker_id, on_event)
    if alive:
        raise ConfigError(
            f"the master's job {job_id!r} is being run by another troupe run ({alive[0]}): two runs "
            "would each write part of it; wait for that one to end, or stop it first"
        )
    dead_now = int((known or {}).get("counts", {}).get("dead", 0))
    if retry_dead and dead_now:
        retried = await _retry_dead(rt, master, job_id)
        before -= retried
        dead_now -= retried
        if on_event is not None and retried:
            items = f"{retried} dead item{'s' if retried > 1 else ''}"
            on_event(f"--retry-dead: {items} of an earlier run run again")
    source.ended_before = before
    if dead_now:  # an earlier run's dead: not this run's
        dead = await rt.control(master, "dead", {"job_id": job_id}, timeout=30)
        source.dead_before = {str(t.get("task_id")) for t in dead or [] if isinstance(t, dict)}
    for worker_id in gone:  # a killed run's leases come back now, not when they expire (minutes)
        reason = "its troupe run is gone (it does not answer); a new run of the job took over"
        await rt.control(master, "worker_left", {"worker_id": worker_id, "reason": reason}, timeout=30)
        log.info("pipeline_dead_run_left", job_id=job_id, worker=worker_id)
    for worker_id in killed_here:  # the nodes free its replicas' names now, not after 20 s of silence
        try:
            await rt.control(master, "owner_gone", {"owner": f"{MASTER_OWNER}{worker_id}"}, timeout=30)
        except TroupeError as exc:  # a master of before owner_gone: the nodes wait out the silence
            log.info("pipeline_owner_gone_unsaid", worker=worker_id, error=str(exc))
    return source, before


async def _retry_dead(rt: Runtime, master: str, job_id: str) -> int:
    """Run the job's dead tasks again; how many there were.

    Raises:
        ConfigError: the master runs a troupe from before ``retry_dead``.
    """
    try:
        reply = await rt.control(master, "retry_dead", {"job_id": job_id}, timeout=30)
    except UnknownMessageType:
        raise ConfigError(
            "--retry-dead: the master runs a troupe from before dead items could be retried; "
            "upgrade it (README: upgrading a cluster), or give the pipeline another [pipeline] name"
        ) from None
    return int(reply.get("retried", 0)) if isinstance(reply, dict) else 0


async def _job_view(rt: Runtime, master: str, job_id: str) -> dict[str, Any] | None:
    """The master's view of the job ``job_id`` (``jobs``), or None where it has none."""
    jobs = await rt.control(master, "jobs", None, timeout=30)
    return next((j for j in jobs or [] if isinstance(j, dict) and j.get("job_id") == job_id), None)


def _made(job_id: str, view: dict[str, Any] | None) -> dict[str, Any] | None:
    """What tells the job from another of its name: its id and submission time (journaled, so a
    master that restarts on its journal keeps it); None where the master does not say."""
    submitted = view.get("submitted_at") if view is not None else None
    if not isinstance(submitted, (int, float)):
        return None
    return {"job_id": job_id, "submitted_at": submitted}


def _same_out(job_id: str, known: dict[str, Any], out: Path | None, before: int) -> Path | None:
    """``out`` as the master's job has it: None when the job keeps none (made before jobs kept
    theirs, or its tasks compacted away: nothing to compare).

    Raises:
        ConfigError: the job was made with another ``out``.
    """
    refs = known.get("refs")
    made_with = refs.get(OUT_REF) if isinstance(refs, dict) else None
    if not isinstance(made_with, str):
        return None
    if out is None:  # a run that writes no files: the job stays as it was made
        return Path(made_with)
    if made_with != str(out):
        raise ConfigError(
            f"the master's job {job_id!r} writes to --out {made_with} ({before} of "
            f"{known.get('total')} tasks ended there); this run was given {out}: run with that "
            "--out to resume or finalise it, or give the pipeline another [pipeline] name for a "
            "new job"
        )
    return out


async def _other_runs(
    rt: Runtime, master: str, job_id: str, me: str, on_event: Callable[[str], None] | None = None
) -> tuple[list[str], list[str], list[str]]:
    """The other runs registered for the job (workers of its kind): those that still answer, or
    that the master heard from (worker id and endpoint), the worker ids of those that do not,
    and of those the worker ids of the runs killed on this host. One that does not answer is a
    run that was killed: its registration outlives it, and it is no reason to refuse. One that
    ran on this host is judged at once by its process (its registration's ``process``:
    ``process_identity.py``); for another host's, the master's verdict on one killed a moment
    ago takes up to 25 s."""
    status = await rt.control(master, "status", None, timeout=30)
    workers = status.get("workers", []) if isinstance(status, dict) else []
    others = [
        w
        for w in workers
        if isinstance(w, dict)
        and job_id in (w.get("kinds") or [])
        and w.get("worker_id") != me
        and w.get("endpoint")
    ]
    alive: list[str] = []
    gone: list[str] = []
    killed_here: list[str] = []

    async def look(worker: dict[str, Any]) -> None:
        # A run on another host (listening on its loopback), or one whose CURVE server key is
        # its operator's, answers no ping: the master it beats to says (spawn_owners.py).
        owner = f"{MASTER_OWNER}{worker.get('worker_id')}"
        if gone_here(worker.get("process")):  # killed on this host: no ping's wait for it
            gone.append(str(worker.get("worker_id")))
            killed_here.append(str(worker.get("worker_id")))
            return
        pinged = await answers(rt, str(worker["endpoint"]), _ALIVE_S)
        if not pinged and on_event is not None:  # the verdict may take OWNER_SILENT_S: say why
            on_event(
                f"an earlier run of the job {job_id!r} ({worker.get('worker_id')} at "
                f"{worker['endpoint']}) does not answer: waiting for the master to count it gone "
                f"(no beat from it for {OWNER_SILENT_S:g} s; it was killed, or runs on another "
                "host); Ctrl-C stops"
            )
        if pinged or await master_verdict(rt, master, owner, unheard_is_gone=True) is False:
            alive.append(f"{worker.get('worker_id')} at {worker['endpoint']}")
        else:
            gone.append(str(worker.get("worker_id")))

    async with anyio.create_task_group() as tg:
        for worker in others:
            tg.start_soon(look, worker)
    return alive, gone, killed_here
