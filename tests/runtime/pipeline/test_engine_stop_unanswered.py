"""A run stopped (Ctrl-C) while it waits for a node to answer the stop of a replica ends then,
not when that answer times out (30 s). Without processes: a fake node that never answers
``stop_worker``, and a finalize hook held until the stop is asked.

What a user relies on: Ctrl-C during a run's finalisation took 30 s to exit now and then, its own
node stopped already, the run waiting on stops that node would never answer.
"""

from __future__ import annotations

from typing import Any

import anyio

from troupe.runtime.errors import AskTimeout
from troupe.runtime.pipeline.config import PipelineConfig
from troupe.runtime.pipeline.engine import PipelineEngine
from troupe.runtime.pipeline.source import LocalSource

HANG_GUARD_S = 60  # a bound on a hang; the stop itself is a cancellation, not a wait
ANSWERED_STOP_S = 30  # what a replica's stop waits for its node's answer (replicas.py)


class SilentStops:
    """A node whose replicas answer every item ok, whose store stage has a finalize hook that
    waits for ``release``, and that never answers ``stop_worker``."""

    def __init__(self) -> None:
        self.spawns: list[str] = []
        self.stop_asked = anyio.Event()
        self.finalizing = anyio.Event()
        self.release = anyio.Event()

    async def control(self, endpoint: str, kind: str, payload: Any, timeout: float | None = None) -> Any:
        if kind == "spawn_worker":
            self.spawns.append(payload["name"])
        elif kind == "stop_worker":
            self.stop_asked.set()
            if timeout is not None and timeout < ANSWERED_STOP_S:
                return {}  # a cancelled run's tell (send_unanswered): it waits for no answer
            await anyio.sleep_forever()  # its node stopped (the run's own, on Ctrl-C)
        elif kind == "supervision":
            return {"workers": [{"name": n, "state": "running"} for n in self.spawns]}
        return {}

    def ref(self, path: str) -> Any:
        return _Replica(self, finalizes="-store-" in path)


class _Replica:
    def __init__(self, node: SilentStops, finalizes: bool) -> None:
        self.node = node
        self.finalizes = finalizes

    async def ask(self, kind: str, payload: Any, timeout: float | None = None) -> Any:
        if kind == "stage_info":
            return {"hooks": ["finalize"] if self.finalizes else []}
        if kind == "stage_finalize":
            self.node.finalizing.set()
            await self.node.release.wait()
            return {}
        return {"outcomes": [{"ok": it} for it in payload["items"]]}


async def test_a_run_stopped_while_a_replica_s_stop_is_unanswered_ends_at_once() -> None:
    cfg = PipelineConfig.model_validate(
        {
            "name": "p",
            "items": 3,
            "scale_interval_s": 3600.0,
            "stages": [{"name": "load", "actor": "m:Stage"}, {"name": "store", "actor": "m:Stage"}],
        }
    )
    node = SilentStops()
    engine = PipelineEngine(cfg, node, "tcp://fake:1", source=LocalSource(cfg.name, cfg.items))  # type: ignore[arg-type]
    ended = anyio.Event()

    async def run() -> None:
        try:
            await engine.run()
        finally:
            ended.set()

    with anyio.fail_after(HANG_GUARD_S):
        async with anyio.create_task_group() as tg:
            tg.start_soon(run)
            await node.finalizing.wait()  # every item done: load's replica (no hook) is stopping
            await node.stop_asked.wait()
            tg.cancel_scope.cancel()  # Ctrl-C
        assert ended.is_set()
    assert not node.release.is_set()  # the finalize never went on: the stop ended the run


class UnansweredOnceFinalized(SilentStops):
    """A node that answers the stops asked before the finalize hooks returned, and not those
    asked after (the replicas' stop as the run ends): each of those is given up after its
    timeout, as a real runtime gives up (``AskTimeout``), unless the run ends the wait first."""

    def __init__(self) -> None:
        super().__init__()
        self.release.set()  # the finalize hook returns at once
        self.finalized = anyio.Event()
        self.late_stop_asked = anyio.Event()
        self.waits_ended = 0
        self.waits_timed_out = 0

    async def control(self, endpoint: str, kind: str, payload: Any, timeout: float | None = None) -> Any:
        if kind != "stop_worker":
            return await super().control(endpoint, kind, payload, timeout)
        if not self.finalized.is_set():
            return {}  # a stop during the run (the finalize hook's replica stays): answered
        self.late_stop_asked.set()
        if timeout is not None and timeout < ANSWERED_STOP_S:
            return {}  # a cancelled run's tell (send_unanswered): nobody waits for its answer
        try:
            await anyio.sleep(ANSWERED_STOP_S if timeout is None else timeout)
        except anyio.get_cancelled_exc_class():
            self.waits_ended += 1
            raise
        self.waits_timed_out += 1
        raise AskTimeout(f"no reply to 'stop_worker' within {timeout}s")


async def test_a_run_stopped_as_its_replicas_stop_after_its_finalisation_waits_for_no_answer() -> None:
    """Ctrl-C once the finalize hooks returned, as the replicas stop: a run on a cluster's nodes
    (its runtime reads no replies once stopped) waited out 30 s per replica stop before it
    exited. The stop ends those waits; the nodes stop the workers they were told to."""
    cfg = PipelineConfig.model_validate(
        {
            "name": "p",
            "items": 3,
            "scale_interval_s": 3600.0,
            "stages": [{"name": "load", "actor": "m:Stage"}, {"name": "store", "actor": "m:Stage"}],
        }
    )
    node = UnansweredOnceFinalized()
    engine = PipelineEngine(
        cfg,
        node,  # type: ignore[arg-type]
        "tcp://fake:1",
        source=LocalSource(cfg.name, cfg.items),
        on_finalized=lambda _: node.finalized.set(),
    )

    async def run() -> None:
        await engine.run()

    with anyio.fail_after(HANG_GUARD_S):
        async with anyio.create_task_group() as tg:
            tg.start_soon(run)
            await node.late_stop_asked.wait()  # the finalize hooks returned; a replica is stopping
            tg.cancel_scope.cancel()  # Ctrl-C
    assert node.waits_timed_out == 0
    assert node.waits_ended >= 1
