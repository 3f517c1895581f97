"""A replica whose run stopped while its node was still deciding whether it may start it (the
name held by another run's replica: one being stopped, or one whose owner the node asks about)
is never started: the run's stop cancels that start. Before, the stop found no worker of its own
(it stopped the other run's, or nothing), the start went on after the run had gone, and the
replica ran until the node's owner watch found its run gone (20 s and more), competing with the
rerun for CPU, GPU and memory, and listed by ``ctl status`` as a worker of a run that no longer
existed.

A real node in this process, asked over its control endpoint as a run's engine asks it
(``spawn_worker``, then ``stop_worker`` as ``_stop_all`` sends it). The start is held by an
event (the node's owner verdict) or by the other run's replica, stopped with SIGSTOP, that is
being stopped; the node reaps every worker on the way out, whatever the test's outcome.
"""

from __future__ import annotations

import contextlib
import os
import signal
from pathlib import Path
from typing import Any

import anyio
import pytest

from support.local_node import ECHO, running_node
from troupe.runtime.core.client import connect
from troupe.runtime.core.runtime import Runtime
from troupe.runtime.errors import ActorStopped, TroupeError
from troupe.runtime.node.config import NodeConfig, SupervisionConfig
from troupe.runtime.testing.plugin import free_endpoint

NAME = "nav-render-3"
START_S = 60.0  # a bound on a worker's start on a loaded machine, not on speed
GONE_WITHIN_S = 10.0  # the stop is prompt: the owner watch took 20 s and more


def _config(tmp_path: Path, stop_grace_s: float, supervision: SupervisionConfig | None = None) -> NodeConfig:
    return NodeConfig(
        name="race",
        endpoint=free_endpoint(),
        log_dir=tmp_path,
        log_level="warning",
        stop_grace_s=stop_grace_s,
        supervision=supervision or SupervisionConfig(),
    )


def _spec(owner: str) -> dict[str, Any]:
    return {"name": NAME, "actors": [ECHO.model_dump(by_alias=True)], "owner": owner, "timeout_s": START_S}


async def _states(run: Runtime, endpoint: str) -> list[str]:
    """The states of the node's workers of that name, as ``ctl status`` lists them."""
    status = await run.control(endpoint, "status", None, timeout=30)
    return [str(w["state"]) for w in status["workers"] if w["name"] == NAME]


async def _listed(run: Runtime, endpoint: str) -> list[str]:
    """Those still running or starting."""
    return [s for s in await _states(run, endpoint) if s in ("running", "starting")]


async def _not_listed_soon(run: Runtime, endpoint: str) -> None:
    with anyio.fail_after(GONE_WITHIN_S):
        while await _listed(run, endpoint):
            await anyio.sleep(0.1)


async def _spawn(run: Runtime, endpoint: str, owner: str, answers: list[Any]) -> None:
    try:
        answers.append(await run.control(endpoint, "spawn_worker", _spec(owner), timeout=START_S + 10))
    except TroupeError as exc:
        answers.append(exc)


async def _stop(run: Runtime, endpoint: str) -> None:
    """A run's stop of its replica, answered once the node has stopped what it stops."""
    await run.control(endpoint, "stop_worker", {"name": NAME}, timeout=130)


async def test_a_replica_whose_run_stopped_while_its_node_asked_about_the_name_never_starts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cfg = _config(tmp_path, stop_grace_s=5.0)
    async with running_node(cfg) as node, connect(cfg.endpoint) as run:
        # An earlier run, killed: its replica of the name runs on, its owner answers nobody.
        with anyio.fail_after(START_S):
            await run.control(cfg.endpoint, "spawn_worker", _spec(free_endpoint()), timeout=START_S + 10)
        asked, verdict = anyio.Event(), anyio.Event()

        # The master's verdict takes up to 25 s.
        async def held_verdict(owner: str, process: str = "") -> bool:
            asked.set()
            await verdict.wait()
            return True  # that run is gone: its replica's name may be taken

        monkeypatch.setattr(node.owners, "gone", held_verdict)
        answers: list[Any] = []
        with anyio.fail_after(START_S):
            async with anyio.create_task_group() as tg:
                tg.start_soon(_spawn, run, cfg.endpoint, run.address, answers)  # the rerun's replica
                await asked.wait()
                # The rerun stops (Ctrl-C) while the node still decides: its engine's stop.
                assert await run.control(cfg.endpoint, "stop_worker", {"name": NAME}, timeout=30) is True
                verdict.set()
        await _not_listed_soon(run, cfg.endpoint)
        assert isinstance(answers[0], ActorStopped), answers


async def test_a_replica_whose_run_stopped_while_it_waited_for_the_name_never_starts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A long grace, and no supervisor's kill: the earlier run's replica, stopped (SIGSTOP), stays
    # "stopping" until it is let go.
    unwatched = SupervisionConfig(heartbeat_timeout_s=300.0, progress_timeout_s=0.0)
    cfg = _config(tmp_path, stop_grace_s=120.0, supervision=unwatched)
    async with running_node(cfg) as node, connect(cfg.endpoint) as run:
        with anyio.fail_after(START_S):
            record = await run.control(
                cfg.endpoint, "spawn_worker", _spec("master:earlier"), timeout=START_S + 10
            )
        earlier_pid = record["pid"]
        asked = anyio.Event()

        # That run stops its replica itself: the node waits for it.
        async def lives(owner: str, process: str = "") -> bool:
            asked.set()
            return False

        monkeypatch.setattr(node.owners, "gone", lives)
        os.kill(earlier_pid, signal.SIGSTOP)  # it exits only once continued
        answers: list[Any] = []
        try:
            async with anyio.create_task_group() as tg:
                # The earlier run (Ctrl-C'd) stops its replica; its node waits out the grace.
                tg.start_soon(_stop, run, cfg.endpoint)
                with anyio.fail_after(START_S):
                    while "stopping" not in await _states(run, cfg.endpoint):
                        await anyio.sleep(0.05)
                # Its rerun asks for the name: the node waits for the earlier replica's exit.
                tg.start_soon(_spawn, run, cfg.endpoint, run.address, answers)
                with anyio.fail_after(START_S):
                    await asked.wait()
                # The rerun stops too, the name still held: its stop cancels the start at once.
                tg.start_soon(_stop, run, cfg.endpoint)
                with anyio.fail_after(GONE_WITHIN_S):  # before the earlier replica has exited
                    while not answers:
                        await anyio.sleep(0.05)
                os.kill(earlier_pid, signal.SIGCONT)
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.kill(earlier_pid, signal.SIGCONT)  # however it went: the node reaps it on its way out
        await _not_listed_soon(run, cfg.endpoint)
        assert isinstance(answers[0], ActorStopped), answers
