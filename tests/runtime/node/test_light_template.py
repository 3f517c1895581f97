"""The light template: the sibling a template forks once the actor classes are imported, before
what they preload (torch, say), so that workers needing no more start at once.

Real nodes (in this process), templates and workers on loopback; the long import is a module
that waits for a gate file (``support.gated_import``), opened by the test. What a user relies
on: a worker of classes that preload nothing serves while the template still imports, without
the module it has no use for; a worker that needs it is forked once the template has it; the
class check is answered meanwhile; the light template goes with its template, reaped; and a
light template that died is a shortcut lost, not a worker lost.
"""

from __future__ import annotations

import os
import signal
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import psutil
import pytest

from support.local_node import echo_node_config, running_node
from support.processes import gone_within
from troupe.runtime.core.client import connect
from troupe.runtime.node.config import ActorSpec, NodeConfig, WorkerSpec
from troupe.runtime.node.node import Node
from troupe.runtime.node.template_link import TemplateLink
from troupe.runtime.testing.plugin import import_path

PLAIN = ActorSpec(name="a", cls="support.light_stages:Plain")
HEAVY = ActorSpec(name="a", cls="support.light_stages:Heavy")
WITHIN_S = 60.0  # a bound on a start or a stop on a loaded machine, not on speed


@pytest.fixture
def gate(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The gate file ``support.gated_import`` waits for (closed until the test creates it)."""
    monkeypatch.setenv("PYTHONPATH", import_path())  # the template imports support.* as workers do
    path = tmp_path / "gate"
    monkeypatch.setenv("TROUPE_TEST_GATE", str(path))
    return path


def _config(tmp_path: Path, *workers: WorkerSpec) -> NodeConfig:
    """A node of ``workers`` (``Heavy``'s started once the gate is open: the node waits for
    its workers as it starts)."""
    return echo_node_config(tmp_path, "lt", workers=workers)


async def _ready(node: Node, worker: str) -> None:
    with anyio.fail_after(WITHIN_S):
        await node.workers[worker].ready_event.wait()


async def _where(cfg: NodeConfig, worker: str) -> dict[str, Any]:
    async with connect(cfg.endpoint, cfg.name) as rt:
        answer: dict[str, Any] = await rt.ref(f"{worker}/a").ask("where", None, timeout=30)
        return answer


async def test_a_worker_that_needs_no_preload_serves_while_the_template_still_imports(
    tmp_path: Path, gate: Path
) -> None:
    cfg = echo_node_config(
        tmp_path, "lt", workers=(WorkerSpec(name="plain", actors=(PLAIN,)),), preload=(HEAVY.cls,)
    )
    async with running_node(cfg) as node:  # its workers serve: "plain" did, the gate closed
        assert node.template is not None and node.template.describe()["ready"] is False
        plain = await _where(cfg, "plain")
        assert plain == {"gated": False, "ppid": os.getpid()}, "forked from the light one, the node's child"
        assert node.template.describe()["light_pid"] is not None
        gate.touch()
        heavy = {"name": "heavy", "actors": [HEAVY.model_dump(by_alias=True)]}
        assert node.runtime is not None
        await node.runtime.control(node.runtime.address, "spawn_worker", heavy, timeout=WITHIN_S)
        assert await _where(cfg, "heavy") == {"gated": True, "ppid": os.getpid()}, "forked from the template"


async def test_the_light_template_answers_the_class_check_while_the_template_imports(gate: Path) -> None:
    checks = [("stages.a.actor", "support.light_stages:Plain", "actor", [], {})]
    link = TemplateLink("lt", [PLAIN.cls, HEAVY.cls], checks=checks)
    async with anyio.create_task_group() as tg:
        await link.start(tg)
        try:
            with anyio.fail_after(WITHIN_S):
                found = await link.checked()
            assert found is not None and found.failure is None
            assert link.describe()["ready"] is False, "the gate is closed: the template still imports"
        finally:
            with anyio.CancelScope(shield=True):
                await link.stop()
            tg.cancel_scope.cancel()


@asynccontextmanager
async def _node_with_light(tmp_path: Path, gate: Path) -> AsyncIterator[tuple[Node, int]]:
    """A node of a plain and a heavy worker, the gate open (both serve as it starts), and the
    pid of its template's light sibling."""
    gate.touch()
    cfg = _config(
        tmp_path, WorkerSpec(name="plain", actors=(PLAIN,)), WorkerSpec(name="heavy", actors=(HEAVY,))
    )
    async with running_node(cfg) as node:
        assert node.template is not None
        # The gate open, the template may be ready, and the workers forked from it, before its
        # light sibling's hello comes (CI: ``light_pid`` still None here).
        with anyio.fail_after(WITHIN_S):
            while (light := node.template.describe()["light_pid"]) is None:
                await anyio.sleep(0.01)  # a bounded poll of in-process state
        yield node, light


async def test_the_light_template_goes_with_the_node_and_is_reaped(tmp_path: Path, gate: Path) -> None:
    async with _node_with_light(tmp_path, gate) as (node, light):
        assert node.template is not None
        assert psutil.Process(light).ppid() == node.template.describe()["pid"], "the template's child"
    assert gone_within(light, WITHIN_S, reaped=True), (
        "the light template outlived its node, or was left a zombie"
    )


async def test_a_dead_light_template_leaves_the_forks_to_the_template(tmp_path: Path, gate: Path) -> None:
    async with _node_with_light(tmp_path, gate) as (node, light):
        os.kill(light, signal.SIGKILL)
        first = node.workers["plain"].pid
        assert first is not None
        os.kill(first, signal.SIGKILL)  # restarted at once: by a fork, of the template now
        with anyio.fail_after(WITHIN_S):
            while (
                node.workers["plain"].pid in (None, first) or not node.workers["plain"].ready_event.is_set()
            ):
                await anyio.sleep(0.01)  # a bounded poll of in-process state
        again = await _where(node.config, "plain")
        assert again["ppid"] == os.getpid()
        assert again["gated"] is True, "forked from the template, which has imported the preload"
        assert node.template is not None and node.template.describe()["light_pid"] is None
