"""`troupe logs tail --master` interleaves the nodes' streams by timestamp after a short wait."""

from __future__ import annotations

import json

import anyio
import pytest

from troupe.cli import log_stream
from troupe.cli.log_stream import ClusterLogs, ReorderBuffer
from troupe.runtime import AskTimeout, Unreachable

WAIT_S = 30.0  # bound of every wait; never a bound on how fast anything is


def _line(second: int, event: str) -> str:
    return json.dumps({"timestamp": f"2026-01-01T00:00:{second:02d}Z", "event": event})


def test_lines_leave_in_time_order_once_they_have_waited_the_window() -> None:
    """A line that arrives late but is stamped earlier still comes out first; nothing leaves early."""
    now = [100.0]
    buffer = ReorderBuffer(window_s=0.3, clock=lambda: now[0])
    buffer.add("n1", _line(5, "n1-late-stamp"))
    now[0] += 0.1
    buffer.add("n2", _line(3, "n2-early-stamp"))
    buffer.add("n2", "not json: takes n2's last stamp")
    assert buffer.release() == []  # nothing has waited 0.3 s yet
    now[0] += 0.25  # n1's line has waited; n2's, stamped earlier, have not: all wait for them
    assert buffer.release() == []
    now[0] += 0.1
    assert [line for _, line in buffer.release()] == [
        _line(3, "n2-early-stamp"),
        "not json: takes n2's last stamp",
        _line(5, "n1-late-stamp"),
    ]
    assert len(buffer) == 0


def test_everything_releases_what_is_held_in_order() -> None:
    buffer = ReorderBuffer(window_s=60.0)
    buffer.add("a", _line(2, "b"))
    buffer.add("b", _line(1, "a"))
    assert [json.loads(line)["event"] for _, line in buffer.release(everything=True)] == ["a", "b"]


class _Sub:
    """Stands in for the SUB socket: records what it is connected to."""

    def __init__(self) -> None:
        self.connected: list[str] = []

    def connect(self, endpoint: str) -> None:
        self.connected.append(endpoint)

    def disconnect(self, endpoint: str) -> None:
        self.connected.remove(endpoint)


class _Node:
    """Stands in for the runtime the tail asks nodes' log_recent with: a node's kept lines (or the
    master's, at ``endpoint``)."""

    def __init__(self, endpoint: str = "tcp://n1") -> None:
        self.endpoint = endpoint
        self.incarnation = "A"
        self.kept: list[list[object]] = []
        self.asked: list[dict[str, int]] = []

    async def control(self, endpoint: str, msg_type: str, payload: dict[str, int], timeout: float) -> object:
        assert (endpoint, msg_type) == (self.endpoint, "log_recent")
        self.asked.append(payload)
        lines = [kept for kept in self.kept if int(str(kept[0])) > payload["after"]]
        return {"incarnation": self.incarnation, "seq": self.kept[-1][0], "lines": lines}


def _msg(incarnation: str, seq: int) -> list[bytes]:
    return [b"n1", incarnation.encode(), str(seq).encode(), _line(seq % 60, f"{incarnation}{seq}").encode()]


def test_a_first_line_a_gap_and_a_restart_fetch_what_was_missed_each_line_once() -> None:
    """Lines the stream did not bring (before the subscription took, dropped, before a restart) come
    from the node's recent lines; live lines that arrive meanwhile wait; none is shown twice."""
    notes: list[str] = []
    logs = ClusterLogs("tcp://master", frozenset(), lambda line, node: True, 0, notes.append)
    sub = _Sub()
    logs._connect(sub, {"nodes": [{"node": "n1", "endpoint": "tcp://n1", "log_endpoint": "tcp://n1:9"}]})  # type: ignore[arg-type]
    assert sub.connected == ["tcp://n1:9"]
    node = _Node()
    node.kept = [[k, _line(k, f"A{k}")] for k in range(4, 7)]

    def shown() -> list[str]:
        return [json.loads(line)["event"] for _, line in logs.buffer.release(everything=True)]

    assert logs.arrived(_msg("A", 5)) == ("n1", 0)  # a new incarnation: fetch what it kept
    assert logs.arrived(_msg("A", 6)) is None  # waits for the fetch
    anyio.run(logs.catch_up, node, "n1", 0)  # type: ignore[arg-type]
    assert shown() == ["A4", "A5", "A6"]

    assert logs.arrived(_msg("A", 7)) is None
    assert logs.arrived(_msg("A", 7)) is None  # a repeat is not shown again
    assert shown() == ["A7"]
    node.kept += [[k, _line(k, f"A{k}")] for k in range(7, 10)]
    assert logs.arrived(_msg("A", 9)) == ("n1", 7)  # 8 never came: fetch above 7
    anyio.run(logs.catch_up, node, "n1", 7)  # type: ignore[arg-type]
    assert shown() == ["A8", "A9"]

    node.incarnation, node.kept = "B", [[1, _line(30, "B1")]]  # the node restarted
    assert logs.arrived(_msg("B", 1)) == ("n1", 0)
    anyio.run(logs.catch_up, node, "n1", 0)  # type: ignore[arg-type]
    assert shown() == ["B1"]
    assert [a["after"] for a in node.asked] == [0, 7, 0]

    assert logs.arrived([b"n1", b"A"]) is None and logs.arrived([b"n1", b"A", b"x", b"{}"]) is None
    assert logs.bad_messages == 2 and notes == []


def test_a_node_the_master_has_for_dead_is_not_asked_for_its_lines() -> None:
    """Each tail waited 5 s on a node dead for minutes, then said its lines could not be
    fetched; it says the node is dead, at once. Back alive, it is asked again."""
    notes: list[str] = []
    logs = ClusterLogs("tcp://master", frozenset(), lambda line, node: True, 0, notes.append)
    sub = _Sub()
    dead = {"node": "n1", "endpoint": "tcp://n1", "log_endpoint": "tcp://n1:9", "alive": False}
    logs._connect(sub, {"nodes": [dead]})  # type: ignore[arg-type]
    node = _Node()
    node.kept = [[1, _line(1, "A1")]]
    anyio.run(logs.catch_up, node, "n1", 0)  # type: ignore[arg-type]
    assert node.asked == [] and notes == [
        "node n1: the master has it for dead: not asked; its files have its lines"
    ]
    logs._connect(sub, {"nodes": [{**dead, "alive": True}]})  # type: ignore[arg-type]
    anyio.run(logs.catch_up, node, "n1", 0)  # type: ignore[arg-type]
    assert len(node.asked) == 1 and len(notes) == 1


def test_the_master_s_own_stream_is_followed_where_its_status_says() -> None:
    """A master that says its `log_endpoint` is one more stream, named as its lines name it and
    asked for its lines at the master's endpoint; bound on every interface, it is reached at the
    host the tail reached the master at. An older master (no field) leaves the tail as it was."""
    notes: list[str] = []
    logs = ClusterLogs("tcp://10.0.0.1:7480", frozenset({"m1"}), lambda line, node: True, 0, notes.append)
    sub = _Sub()
    logs._connect(sub, {"master": "m1", "nodes": []})  # type: ignore[arg-type]
    assert sub.connected == [] and notes == ["--node m1: the master knows no such node (yet); waiting for it"]
    status = {"master": "m1", "log_endpoint": "tcp://0.0.0.0:7999", "nodes": []}
    logs._connect(sub, status)  # type: ignore[arg-type]
    assert sub.connected == ["tcp://10.0.0.1:7999"]
    logs._connect(sub, {**status, "log_endpoint": "tcp://0.0.0.0:8000"})  # type: ignore[arg-type]
    assert sub.connected == ["tcp://10.0.0.1:8000"]  # restarted: its new stream, not both
    master = _Node("tcp://10.0.0.1:7480")  # its log_recent is asked at the master's endpoint
    master.kept = [[1, _line(1, "M1")]]
    assert logs.arrived([b"m1", b"A", b"1", _line(1, "M1").encode()]) == ("m1", 0)
    anyio.run(logs.catch_up, master, "m1", 0)  # type: ignore[arg-type]
    assert len(master.asked) == 1
    assert [json.loads(line)["event"] for _, line in logs.buffer.release(everything=True)] == ["M1"]

    others = ClusterLogs("tcp://10.0.0.1:7480", frozenset({"n1"}), lambda line, node: True, 0, notes.append)
    others._connect(sub, status)  # type: ignore[arg-type]
    assert sub.connected == ["tcp://10.0.0.1:8000"]  # --node n1: the master's stream is not followed


def test_a_node_the_master_does_not_know_is_not_waited_for_without_following() -> None:
    """`--no-follow` ends at once: it said it was "waiting for it" and exited."""
    notes: list[str] = []
    logs = ClusterLogs("tcp://10.0.0.1:7480", frozenset({"nosuch"}), lambda line, node: True, 0, notes.append)
    logs.following = False
    logs._connect(_Sub(), {"master": "m1", "nodes": []})  # type: ignore[arg-type]
    assert notes == ["--node nosuch: the master knows no such node: no lines of it to show"]


class _Master:
    """Stands in for the runtime the tail asks the master's status with: it answers from
    ``said`` in turn (an exception is raised), then cancels ``done``."""

    def __init__(self, said: list[object], done: anyio.CancelScope) -> None:
        self.said, self.done = said, done

    async def control(self, endpoint: str, msg_type: str, payload: object, timeout: float) -> object:
        assert msg_type == "status"
        if not self.said:
            self.done.cancel()
            await anyio.sleep_forever()
        answer = self.said.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer


def test_a_master_back_on_other_keys_is_said_to_refuse_the_follower(monkeypatch: pytest.MonkeyPatch) -> None:
    """Restarted on a rotated pair, the master was said not to answer, and then nothing more
    (its lines gone for good, its handshakes refused); now the refusal and its why are said,
    once, and so is the master taking these keys again."""
    monkeypatch.setattr(log_stream, "REASK_S", 0)
    notes: list[str] = []
    logs = ClusterLogs("tcp://10.0.0.1:7480", frozenset(), lambda line, node: True, 0, notes.append)
    refused = Unreachable("the CURVE handshake with tcp://10.0.0.1:7480 failed: ... (rotated? ...)")
    said: list[object] = [AskTimeout("no reply to 'status'"), refused, refused, {"master": "m1", "nodes": []}]

    async def follow() -> None:
        with anyio.fail_after(WAIT_S), anyio.CancelScope() as done:
            await logs._rediscover(_Master(said, done), _Sub())  # type: ignore[arg-type]

    anyio.run(follow)
    assert notes == [
        "the master at tcp://10.0.0.1:7480 does not answer (no reply to 'status'); following the nodes known",
        f"the master at tcp://10.0.0.1:7480 refuses this follower ({refused}); following the nodes "
        "known, and the master's lines again once its keys and these agree",
        "the master at tcp://10.0.0.1:7480 answers again",
    ]
