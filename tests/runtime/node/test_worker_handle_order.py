"""A worker's registration and its launch reach the node in either order.

A worker forked from the template can register (over its own connection) before the template's
reply with its pid has been recorded: the node must still see it running, with its endpoint,
not "starting" for good (a node that never reported ready until its caller gave up).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, cast

from troupe.runtime.node.config import ActorSpec, WorkerSpec
from troupe.runtime.node.worker_handles import HandleState, WorkerHandle

SPEC = WorkerSpec(name="w", actors=(ActorSpec(name="echo", cls="troupe.actors.demo.actors:Echo"),))
ACTORS = {"echo": "tcp://127.0.0.1:5001"}


@dataclass
class _Process:
    pid: int


def _launch(handle: WorkerHandle, pid: int) -> None:
    handle.launched(cast(Any, _Process(pid)))


async def test_a_registration_before_the_launch_is_recorded_stands() -> None:
    handle = WorkerHandle(SPEC)
    handle.registered("tcp://127.0.0.1:5001", 101, ACTORS)
    # Ready once launched: until the template's reply, how it started (and the template's count
    # of forks) lag, and a node whose start returned then said start "" on a loaded machine.
    assert handle.state is HandleState.STARTING and not handle.ready_event.is_set()
    _launch(handle, 101)
    assert handle.state is HandleState.RUNNING
    assert handle.endpoint == "tcp://127.0.0.1:5001"
    assert handle.ready_event.is_set()


async def test_the_usual_order_starts_then_runs() -> None:
    handle = WorkerHandle(SPEC)
    _launch(handle, 101)
    assert handle.state is HandleState.STARTING and handle.endpoint is None
    handle.registered("tcp://127.0.0.1:5001", 101, ACTORS)
    assert handle.state is HandleState.RUNNING


async def test_a_restart_registered_early_runs_and_waits_for_its_own_exit() -> None:
    handle = WorkerHandle(SPEC)
    _launch(handle, 101)
    handle.registered("tcp://127.0.0.1:5001", 101, ACTORS)
    handle.exited(1)
    assert handle.exited_event.is_set()
    handle.registered("tcp://127.0.0.1:5002", 202, ACTORS)
    assert not handle.ready_event.is_set()  # the old incarnation's readiness is not this one's
    _launch(handle, 202)
    assert handle.state is HandleState.RUNNING and handle.ready_event.is_set()
    assert handle.endpoint == "tcp://127.0.0.1:5002"
    assert not handle.exited_event.is_set()  # the old incarnation's exit is not this one's


async def test_an_old_incarnations_endpoint_does_not_count_as_the_new_ones() -> None:
    handle = WorkerHandle(SPEC)
    _launch(handle, 101)
    handle.registered("tcp://127.0.0.1:5001", 101, ACTORS)
    _launch(handle, 202)  # a new incarnation, not yet registered
    assert handle.state is HandleState.STARTING and handle.endpoint is None


async def test_a_stop_asked_before_the_launch_wins_over_an_early_registration() -> None:
    handle = WorkerHandle(SPEC)
    handle.stop_asked = True
    handle.registered("tcp://127.0.0.1:5001", 101, ACTORS)
    _launch(handle, 101)
    assert handle.state is HandleState.STOPPING
