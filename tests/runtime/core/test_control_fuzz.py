"""Every control message a node and a worker answer, fuzzed with hypothesis (tests/support/
control_fuzz.py): any payload gets a reply or a clear error, never a crash or a hang, and the
process still answers a valid request afterwards.

The handlers are called in-process, so that hundreds of payloads take seconds: those of a
node serving for real on loopback (joined to a master, so that its master link's controls are
there too; no supervisor, no template, and no worker process is started), and those a worker process
installs, on a runtime over the in-memory transport. The control names come from the running
processes themselves: a control added later is fuzzed without a change here.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest
from anyio.from_thread import BlockingPortal, start_blocking_portal
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from support.control_fuzz import REGRESSIONS, answer, field_names, payloads
from troupe.runtime.chaos.worker_side import WorkerChaos
from troupe.runtime.core.runtime import Runtime
from troupe.runtime.errors import ActorStopped
from troupe.runtime.node.config import ActorSpec, NodeConfig, SupervisionConfig, WorkerSpec
from troupe.runtime.node.node import Node
from troupe.runtime.node.worker_process import install_worker_controls
from troupe.runtime.supervision.worker_health import WorkerHealth
from troupe.runtime.tasks.getter_start import install_task_control
from troupe.runtime.tasks.master.journal_open import open_journal
from troupe.runtime.tasks.master.master import Master
from troupe.runtime.tasks.master.master_config import MasterConfig
from troupe.runtime.testing.plugin import free_endpoint
from troupe.runtime.transports.base import MemoryHub

FUZZ = settings(
    max_examples=30,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
# Fields of the payloads that are pydantic models (a worker spec, an actor spec), by alias.
MODEL_FIELDS = [
    f.alias or name for model in (WorkerSpec, ActorSpec) for name, f in model.model_fields.items()
]
NAMES = field_names(MODEL_FIELDS)


class Processes:
    """A node (serving for real, on loopback, joined to a master) and a worker's runtime,
    running on a portal's event loop across examples."""

    def __init__(self, portal: BlockingPortal, node: Node, worker_rt: Runtime) -> None:
        self.portal = portal
        self.node = node
        assert node.runtime is not None
        self.runtimes = {"node": node.runtime, "worker": worker_rt}


def _no_worker(*_: Any, **__: Any) -> Any:
    raise ActorStopped("the control fuzz starts no worker process")


def _node(tmp: Path, master: str) -> Node:
    config = NodeConfig(
        name="fz",
        endpoint=free_endpoint(),
        log_dir=tmp,
        master=master,
        supervision=SupervisionConfig(enabled=False),  # no supervisor process to start
        # Nor a template: it would start after the node reports ready, so within a test (which
        # then finds it left running), and there is no worker for it to fork.
        fast_start=False,
    )
    return Node(config, handle_signals=False)


async def _worker(ready: list[Runtime], stop: anyio.Event) -> None:
    """A worker's runtime with every control a worker process installs (over memory)."""
    async with Runtime("fz", "w", MemoryHub().transport(name="w"), drain_timeout=0.1) as rt:

        async def tell_node(_actor: ActorSpec, _endpoint: str) -> None:
            return None

        install_worker_controls(rt, anyio.Event(), tell_node)
        WorkerChaos(rt)
        health = WorkerHealth(rt, "w", None, 0.5)
        install_task_control(rt, {})
        ready.append(rt)
        try:
            await stop.wait()
        finally:
            health.close()


@contextmanager
def _serving(tmp: Path) -> Iterator[Processes]:
    """A master, a node that joins it, and a worker's runtime, served on a portal until exit."""
    journal, book = open_journal(tmp / "journal.db", new=True)
    master = Master(MasterConfig(endpoint=free_endpoint()), journal, book)
    node = _node(tmp, master.config.endpoint)
    with pytest.MonkeyPatch.context() as mp, start_blocking_portal() as portal:
        # A valid spawn_worker is refused after it is validated (the part fuzzed): no process.
        mp.setattr(Node, "start_worker", _no_worker)
        stop = portal.call(anyio.Event)
        workers: list[Runtime] = []
        running = [portal.start_task_soon(master.run)]
        try:
            portal.call(_until, master.ready.is_set)
            running.append(portal.start_task_soon(node.run))
            running.append(portal.start_task_soon(_worker, workers, stop))
            portal.call(_until, lambda: node.ready.is_set() and bool(workers))
            yield Processes(portal, node, workers[0])
        finally:
            portal.call(stop.set)
            portal.call(node.stopping.set)
            master.stop()
            for future in running:
                future.result(timeout=30)
            journal.close()


@pytest.fixture(scope="module")
def processes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Processes]:
    with _serving(tmp_path_factory.mktemp("control-fuzz")) as served:
        yield served


async def _until(condition: Callable[[], bool]) -> None:
    with anyio.fail_after(30):
        while not condition():
            await anyio.sleep(0.01)


# Controls that stop the process: fuzzed on a node of their own (test below). A worker's
# ``stop`` only sets an event here, so it is fuzzed with the rest.
STOPPING = {"shutdown"}


@pytest.mark.parametrize("process", ["node", "worker"])
@FUZZ
@given(data=st.data())
def test_every_control_answers_any_payload_with_a_reply_or_a_clear_error(
    processes: Processes, process: str, data: st.DataObject
) -> None:
    """Each example sends every control its own payload: a control registered later is
    fuzzed as well, with no list here to update."""
    handlers = processes.runtimes[process].control_handlers
    assert len(handlers) > 3, f"the {process} registers only {sorted(handlers)}"
    for control in sorted(set(handlers) - STOPPING):
        payload = data.draw(payloads(NAMES), label=control)
        processes.portal.call(answer, control, handlers[control], payload)


@pytest.mark.parametrize("process", ["node", "worker"])
def test_the_processes_still_answer_after_the_fuzzing(processes: Processes, process: str) -> None:
    runtime = processes.runtimes[process]
    reply = processes.portal.call(answer, "ping", runtime.control_handlers["ping"], None)
    assert reply == "reply"
    status = processes.portal.call(runtime.control_handlers["status"], None)
    assert isinstance(status, dict)


@pytest.mark.parametrize("process", ["node", "worker"])
@pytest.mark.parametrize("payload", REGRESSIONS, ids=lambda p: type(p).__name__)
def test_every_control_answers_the_payloads_fuzzing_once_crashed_it_on(
    processes: Processes, process: str, payload: Any
) -> None:
    handlers = processes.runtimes[process].control_handlers
    for control in sorted(set(handlers) - STOPPING):
        processes.portal.call(answer, control, handlers[control], payload)


@pytest.mark.parametrize("control", sorted(STOPPING))
@settings(FUZZ, max_examples=3)
@given(payload=payloads(NAMES))
def test_a_stopping_control_answers_any_payload_and_the_node_stops_cleanly(
    tmp_path_factory: pytest.TempPathFactory, control: str, payload: Any
) -> None:
    with _serving(tmp_path_factory.mktemp("control-stop")) as served:
        handler = served.runtimes["node"].control_handlers[control]
        served.portal.call(answer, control, handler, payload)
        served.portal.call(_until, served.node.stopped.is_set)
