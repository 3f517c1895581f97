"""A node whose beats a master never answered says what may be wrong: without keys, a master
that runs with CURVE keys ignores it (the node beat on for ever, logging only AskTimeout).
Keys are named only where they can be the matter: over a slow link a beat's reply comes late,
and a node told to drop or change its keys broke a working cluster (nw 2)."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest

from support.log_capture import module_logs
from troupe.runtime.errors import ActorStopped, AskTimeout, Unreachable
from troupe.runtime.node import master_link
from troupe.runtime.node.master_link import WARN_AFTER, MasterLink

pytestmark = pytest.mark.anyio


class _Runtime:
    address = "tcp://127.0.0.1:7470"

    def __init__(self) -> None:
        self.answer = False

    async def control(self, endpoint: str, msg_type: str, payload: Any = None, **_: Any) -> Any:
        if not self.answer:
            raise AskTimeout("no reply to 'node_beat' within 1.0s")
        return {}


@pytest.fixture
def listening() -> Iterator[str]:
    """A port that accepts connections and never answers a beat: a master that ignores us."""
    with socket.create_server(("127.0.0.1", 0)) as server:
        yield f"tcp://127.0.0.1:{server.getsockname()[1]}"


def _link(master: str) -> MasterLink:
    node = SimpleNamespace(
        name="n1", config=SimpleNamespace(advertise=None, tags=()), workers={}, drained=set()
    )
    return MasterLink(node, master)  # type: ignore[arg-type]


async def test_a_master_that_never_answered_gets_the_keys_hint(
    listening: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    link, runtime = _link(listening), _Runtime()
    with module_logs(monkeypatch, master_link) as logs:
        for _ in range(WARN_AFTER):
            await link._beat(runtime)  # type: ignore[arg-type]
    first, warned = [e for e in logs if e["event"] == "master_beat_failed"]
    assert "--keys DIR" in warned["hint"] and warned["log_level"] == "warning"
    assert f"or the link to it is slow (no reply within 3.33333s on {WARN_AFTER} beats" in warned["hint"]
    # One beat without a reply is a slow link's as well: said at info, keys not named.
    assert first["log_level"] == "info" and "keys" not in first["hint"]
    assert first["hint"].startswith("no reply within 3.33333s: the link to the master may be slow")


async def test_a_master_that_refused_the_nodes_key_is_said_at_once(
    listening: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A refused CURVE handshake fails the beat at once: keys are the matter for sure."""

    class _Refusing(_Runtime):
        async def control(self, endpoint: str, msg_type: str, payload: Any = None, **_: Any) -> Any:
            raise Unreachable(f"ask 'node_beat' to {endpoint}: the process refused this process's CURVE key")

    link = _link(listening)
    monkeypatch.setattr(master_link, "installed", lambda: object())  # this node runs with keys
    with module_logs(monkeypatch, master_link) as logs:
        await link._beat(_Refusing())  # type: ignore[arg-type]
    (failed,) = [e for e in logs if e["event"] == "master_beat_failed"]
    assert failed["log_level"] == "warning" and "may not be its cluster's" in failed["hint"]
    assert "slow" not in failed["hint"]


async def test_a_beat_whose_reply_comes_a_second_late_counts(
    listening: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Over a link of a second's round trip the master took every beat, and its reply came
    after the beat's bound of one second: the node warned every few seconds. A beat waits a
    third of the master's node timeout (its answer says it), at least a beat, at most 4 s."""
    waited: list[float] = []

    class _Slow(_Runtime):
        """A master whose replies come ``late_s`` after the beat, and whose node timeout is ``said``."""

        late_s, said = 1.5, 10.0

        async def control(self, endpoint: str, msg_type: str, payload: Any = None, **kw: Any) -> Any:
            waited.append(kw["timeout"])
            if kw["timeout"] < self.late_s:
                raise AskTimeout(f"no reply to 'node_beat' within {kw['timeout']}s")
            return {"ok": True, "node_timeout_s": self.said}

    link, runtime = _link(listening), _Slow()
    with module_logs(monkeypatch, master_link) as logs:
        await link._beat(runtime)  # type: ignore[arg-type]
        runtime.said = 60.0
        await link._beat(runtime)  # type: ignore[arg-type]
        runtime.said, runtime.late_s = 1.5, 0.1  # a master that declares nodes dead fast
        await link._beat(runtime)  # type: ignore[arg-type]
        await link._beat(runtime)  # type: ignore[arg-type]
    assert not [e for e in logs if e["event"] == "master_beat_failed"]
    assert link.beats == 4
    assert waited == pytest.approx([10 / 3, 10 / 3, 4.0, 1.0])


async def test_a_master_nobody_listens_for_is_said_so_not_the_keys(monkeypatch: pytest.MonkeyPatch) -> None:
    """A node given a master that does not exist logged the keys hint, as if a keyed master
    ignored it; nothing listens there."""
    with socket.create_server(("127.0.0.1", 0)) as server:
        nobody = f"tcp://127.0.0.1:{server.getsockname()[1]}"  # closed below: refused from then on
    link, runtime = _link(nobody), _Runtime()
    with module_logs(monkeypatch, master_link) as logs:
        await link._beat(runtime)  # type: ignore[arg-type]
    (failed,) = [e for e in logs if e["event"] == "master_beat_failed"]
    assert failed["hint"].startswith(f"nothing accepts connections at {nobody}: start the master")


async def test_a_master_that_answered_before_and_stopped_gets_no_keys_hint(
    listening: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    link, runtime = _link(listening), _Runtime()
    runtime.answer = True
    await link._beat(runtime)  # type: ignore[arg-type]
    runtime.answer = False
    with module_logs(monkeypatch, master_link) as logs:
        await link._beat(runtime)  # type: ignore[arg-type]
    (failed,) = [e for e in logs if e["event"] == "master_beat_failed"]
    # It was down or restarting, or the link is slow: keys were not the matter.
    assert failed["log_level"] == "info"
    assert failed["hint"].startswith("the master answered this node before, so keys are not the matter")
    assert "--keys" not in failed["hint"]


async def test_a_report_the_stopping_node_cannot_hear_answered_is_no_warning(
    listening: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Every clean node stop logged `master_report_failed ActorStopped` as a warning: its
    workers' exits are told as the runtime stops reading replies."""

    class _Stopping(_Runtime):
        async def control(self, endpoint: str, msg_type: str, payload: Any = None, **_: Any) -> Any:
            raise ActorStopped("the runtime stopped before the reply came")

    link = _link(listening)
    link.node.runtime = _Stopping()  # type: ignore[attr-defined]
    with module_logs(monkeypatch, master_link) as logs:
        await link._tell("worker_left", {"worker_id": "n1/w1"})
    assert [(e["event"], e["log_level"]) for e in logs] == [("master_report_unanswered", "info")]


async def test_a_node_with_keys_a_master_never_answered_is_told_they_may_be_another_clusters(
    listening: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    link, runtime = _link(listening), _Runtime()
    monkeypatch.setattr(master_link, "installed", lambda: object())  # this node runs with keys
    with module_logs(monkeypatch, master_link) as logs:
        for _ in range(WARN_AFTER):
            await link._beat(runtime)  # type: ignore[arg-type]
    failed = [e for e in logs if e["event"] == "master_beat_failed"][-1]
    assert "may not be its cluster's" in failed["hint"]
    # A master without keys ignores a keyed node too, and logs no peer_refused: said first.
    assert "it may run without keys (start this node without --keys)" in failed["hint"]
    assert "a master with keys then logs peer_refused" in failed["hint"]


async def test_a_host_reading_that_fails_is_no_end_of_the_node(
    listening: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A node out of file descriptors failed to read /proc/meminfo in its beat, and the error
    stopped the whole node. It beats on, with the last reading, and says why."""
    link, runtime = _link(listening), _Runtime()
    runtime.answer = True
    beats: list[dict[str, Any]] = []

    async def control(endpoint: str, msg_type: str, payload: Any = None, **_: Any) -> Any:
        beats.append(payload)
        return {}

    monkeypatch.setattr(runtime, "control", control)
    await link._beat(runtime)  # type: ignore[arg-type]

    def out_of_descriptors() -> dict[str, Any]:
        raise OSError(24, "Too many open files", "/proc/meminfo")

    monkeypatch.setattr(master_link, "host_resources", out_of_descriptors)
    with module_logs(monkeypatch, master_link) as logs:
        await link._beat(runtime)  # type: ignore[arg-type]
    assert [e["event"] for e in logs] == ["host_resources_failed"]
    assert len(beats) == 2 and beats[1]["resources"] == beats[0]["resources"] and beats[0]["resources"]
