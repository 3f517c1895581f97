"""The seams between modules: narrow collaborators, one way to register a control, one way to
start a process's runtime.

- No module reaches into another object's private attribute or method (``obj._x`` where ``obj``
  is not ``self``, ``cls`` or ``super()``): a collaborator gets the public calls it needs, named
  in a protocol (``node/ports.py``, ``chaos/relay.py``'s ``KillNotes``, ``core/ref.py``'s
  ``RefSender``).
- ``Runtime.register_control`` is the one way to add a control handler; a name taken twice is
  an error, and ``control_handlers`` is read-only.
- ``process_runtime`` is the one place a process builds its runtime over ZeroMQ.
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

import pytest

from troupe.runtime.chaos.relay import ChaosRelay
from troupe.runtime.core.runtime import Runtime, process_runtime
from troupe.runtime.node.config import NodeConfig
from troupe.runtime.node.master_link import MasterLink
from troupe.runtime.node.node import Node
from troupe.runtime.node.ports import LinkedNode, NodeView, SupervisedNode
from troupe.runtime.supervision.node_side import NodeSupervision
from troupe.runtime.transports.base import MemoryHub
from troupe.runtime.transports.zmq import ZmqTransport

ROOT = Path(__file__).resolve().parents[2]
SOURCES = ("src", "tools")

# (file relative to the repository, the access as ast.unparse writes it): why it is needed.
ALLOWED: dict[tuple[str, str], str] = {
    # pytest's own pytest_pyfunc_call reads the test's arguments here; there is no public name.
    ("src/runtime/testing/plugin.py", "pyfuncitem._fixtureinfo"): "pytest",
    # the standard library's exit without cleanup, after a second stop signal.
    ("tools/stop_signals.py", "os._exit"): "stdlib",
    # a benchmark stopped midway leaves without the wind-down its abandoned threads would block.
    ("tools/bench/stopping.py", "os._exit"): "stdlib",
    # a benchmark's child whose benchmark is gone before exec: no Python cleanup in a fork's copy.
    ("tools/bench/bench_children.py", "os._exit"): "stdlib",
    # the template's intermediate fork ends without the template's cleanup (it is a copy of it).
    ("src/runtime/node/template.py", "os._exit"): "stdlib",
    # the template stopped: no teardown of its imports (torch's alone takes seconds).
    ("src/runtime/node/deferred_stop.py", "os._exit"): "stdlib",
    # a node's child's exit: what the interpreter's own exit runs, without the modules' teardown.
    ("src/runtime/node/child.py", "threading._shutdown"): "stdlib",
    ("src/runtime/node/child.py", "atexit._run_exitfuncs"): "stdlib",
    ("src/runtime/node/child.py", "os._exit"): "stdlib",
}


def _is_dunder(name: str) -> bool:
    return name.startswith("__") and name.endswith("__")


def _own_instances(func: ast.AST) -> set[str]:
    """Names a function binds to ``cls(...)``: a classmethod's new instance of its own class
    (``book = cls()`` in a ``restore``), whose privates are the class's own."""
    own: set[str] = set()
    for node in ast.walk(func):
        if (
            isinstance(node, ast.Assign)
            and isinstance(node.value, ast.Call)
            and isinstance(node.value.func, ast.Name)
            and node.value.func.id == "cls"
        ):
            own.update(t.id for t in node.targets if isinstance(t, ast.Name))
    return own


def _private_reaches(path: Path) -> list[tuple[int, str]]:
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    own_by_node: dict[int, set[str]] = {}
    for func in ast.walk(tree):
        if isinstance(func, (ast.FunctionDef, ast.AsyncFunctionDef)):
            own = _own_instances(func)
            for node in ast.walk(func):
                own_by_node.setdefault(id(node), set()).update(own)
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Attribute) or not node.attr.startswith("_") or _is_dunder(node.attr):
            continue
        target = node.value
        if isinstance(target, ast.Name) and target.id in ("self", "cls", *own_by_node.get(id(node), ())):
            continue
        if isinstance(target, ast.Call) and isinstance(target.func, ast.Name) and target.func.id == "super":
            continue
        found.append((node.lineno, ast.unparse(node)))
    return found


def test_no_module_reaches_into_another_objects_privates() -> None:
    """``obj._x`` only where obj is self, cls, super() or the class's own new instance."""
    bad = []
    used = set()
    for source in SOURCES:
        for path in sorted((ROOT / source).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            for line, text in _private_reaches(path):
                if (rel, text) in ALLOWED:
                    used.add((rel, text))
                    continue
                bad.append(f"{rel}:{line}: {text}")
    assert not bad, (
        "private attributes reached from outside their object (make the call public on the "
        "provider and name it in the collaborator's protocol):\n" + "\n".join(bad)
    )
    assert used == set(ALLOWED), f"allow-list entries no longer needed: {sorted(set(ALLOWED) - used)}"


def test_the_walk_finds_a_private_reach(tmp_path: Path) -> None:
    """The check itself: it sees node._start, and lets self, cls, super() and cls() pass."""
    probe = tmp_path / "probe.py"
    probe.write_text(
        "class A:\n"
        "    def f(self, node):\n"
        "        self._a; super()._b; node.__dict__\n"
        "        return node._start()\n"
        "    @classmethod\n"
        "    def g(cls):\n"
        "        made = cls()\n"
        "        made._c = cls._d\n"
        "        return made\n"
    )
    assert _private_reaches(probe) == [(4, "node._start")]


# -- control handlers ---------------------------------------------------------------------------


async def _answer(payload: Any) -> Any:
    return payload


async def _other(payload: Any) -> Any:
    return None


def test_a_control_registered_twice_is_an_error() -> None:
    rt = Runtime("n", "p", MemoryHub().transport())
    rt.register_control("ping", _answer)
    with pytest.raises(ValueError, match="'ping' is registered already"):
        rt.register_control("ping", _other)
    assert rt.control_handlers["ping"] is _answer


def test_registering_many_controls_adds_none_when_one_is_taken() -> None:
    rt = Runtime("n", "p", MemoryHub().transport())
    rt.register_control("status", _answer)
    with pytest.raises(ValueError, match="status"):
        rt.register_controls({"ping": _answer, "status": _other})
    assert dict(rt.control_handlers) == {"status": _answer}


def test_control_handlers_is_read_only_and_unregister_frees_the_name() -> None:
    rt = Runtime("n", "p", MemoryHub().transport())
    rt.register_control("ping", _answer)
    with pytest.raises(TypeError):
        rt.control_handlers["ping"] = _other  # type: ignore[index]
    assert rt.unregister_control("ping") is _answer
    rt.register_control("ping", _other)
    assert rt.control_handlers["ping"] is _other
    with pytest.raises(KeyError):
        rt.unregister_control("absent")


def test_two_parts_of_a_node_cannot_answer_one_control(tmp_path: Path) -> None:
    """The node's own controls and its supervision's are registered side by side; installing
    the supervision a second time (a second owner of ``chaos``) is refused."""
    node = Node(NodeConfig(name="n1", log_dir=tmp_path), handle_signals=False)
    rt = Runtime("n1", "node", MemoryHub().transport())
    node._install_controls(rt)
    assert {"ping", "register", "supervisor_ready", "chaos", "heal"} <= set(rt.control_handlers)
    with pytest.raises(ValueError, match="registered already"):
        node.supervision.chaos.install(rt)


async def test_a_registered_control_answers() -> None:
    hub = MemoryHub()
    async with (
        Runtime("n", "server", hub.transport()) as server,
        Runtime("n", "client", hub.transport()) as client,
    ):
        server.register_control("echo", _answer)
        assert await client.control(server.address, "echo", {"x": 1}) == {"x": 1}


# -- the one way a process starts its runtime ----------------------------------------------------


def test_process_runtime_is_the_only_place_a_process_builds_a_zeromq_runtime() -> None:
    """``ZmqTransport(`` and ``Runtime(`` are called in core/runtime.py only (tests aside)."""
    calls = []
    for source in SOURCES:
        for path in sorted((ROOT / source).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if (
                    isinstance(node, ast.Call)
                    and isinstance(node.func, ast.Name)
                    and node.func.id in ("ZmqTransport", "Runtime")
                ):
                    calls.append((rel, node.func.id))
    assert sorted(calls) == [
        ("src/runtime/core/runtime.py", "Runtime"),
        ("src/runtime/core/runtime.py", "ZmqTransport"),
    ]


async def test_process_runtime_binds_where_asked_and_takes_the_options() -> None:
    rt = process_runtime("n", "p", bind="tcp://127.0.0.1:*", hwm=7, ask_timeout=3.0, drain_timeout=0.1)
    assert isinstance(rt.transport, ZmqTransport) and rt.transport.hwm == 7
    assert rt.ask_timeout == 3.0 and rt.drain_timeout == 0.1
    async with rt:
        assert rt.address.startswith("tcp://127.0.0.1:")
    given = MemoryHub().transport()
    assert process_runtime("n", "q", transport=given).transport is given


# -- narrow collaborators -----------------------------------------------------------------------


def test_the_node_satisfies_the_ports_its_collaborators_are_typed_with(tmp_path: Path) -> None:
    node = Node(NodeConfig(name="n1", log_dir=tmp_path), handle_signals=False)
    assert isinstance(node, SupervisedNode) and isinstance(node, LinkedNode) and isinstance(node, NodeView)
    assert isinstance(node.supervision, NodeSupervision)
    assert isinstance(node.supervision.chaos, ChaosRelay)
    MasterLink(node, "tcp://127.0.0.1:1")  # typed LinkedNode: the node fits


def test_collaborators_name_a_port_not_the_node() -> None:
    """The node's side of supervision, the chaos relay and the master link import no Node."""
    for rel in (
        "src/runtime/supervision/node_side.py",
        "src/runtime/chaos/relay.py",
        "src/runtime/node/master_link.py",
    ):
        tree = ast.parse((ROOT / rel).read_text(encoding="utf-8"))
        names = {
            alias.name for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) for alias in node.names
        }
        assert "Node" not in names, rel
