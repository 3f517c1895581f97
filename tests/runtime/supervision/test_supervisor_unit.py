"""The supervisor's driver, the worker-side wiring and the supervision config, in one process."""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import anyio
import msgpack
import psutil
import pytest
from structlog.testing import capture_logs

from troupe.runtime import Actor, RemoteError, Runtime, handles
from troupe.runtime.chaos.worker_side import WorkerChaos
from troupe.runtime.errors import ActorStopped, BadRequest, ConfigError, Partitioned
from troupe.runtime.lowlevel import MemoryHub
from troupe.runtime.node.config import NodeConfig, SupervisionConfig, load_node_config
from troupe.runtime.supervision.heartbeat import BEAT_MAGIC, HeartbeatReceiver, HeartbeatSender
from troupe.runtime.supervision.status import WorkerStatus
from troupe.runtime.supervision.supervisor import (
    Supervisor,
    SupervisorLaunch,
    kill_tree,
)
from troupe.runtime.supervision.worker_health import WorkerHealth
from troupe.runtime.transports.zmq import ZmqTransport

INTERVAL_S, TIMEOUT_S, PROGRESS_S = 0.05, 0.3, 0.3
BOUND = 10.0


@pytest.fixture
def sleeper() -> Iterator[subprocess.Popen[bytes]]:
    """A child process standing in for a worker; always reaped."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=5)


class _Node:
    """The node's side of the supervisor's control messages, recorded."""

    def __init__(self, runtime: Runtime, answer_after_s: float = 0.0) -> None:
        self.answer_after_s = answer_after_s  # a loaded machine's node answers late
        self.ready: dict[str, Any] | None = None
        self.kills: list[tuple[dict[str, Any], bool]] = []  # (report, process alive when told)
        self.got_ready = anyio.Event()
        self.got_kill = anyio.Event()
        runtime.register_controls({"supervisor_ready": self._ready, "worker_killed": self._killed})

    async def _ready(self, payload: Any) -> bool:
        self.ready = payload
        self.got_ready.set()
        return True

    async def _killed(self, payload: Any) -> bool:
        await anyio.sleep(self.answer_after_s)
        self.kills.append((payload, _alive(payload["pid"])))
        self.got_kill.set()
        return True


def _alive(pid: int) -> bool:
    """Running: neither gone nor killed and waiting to be reaped (a zombie)."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


async def _run_supervisor(
    hub: MemoryHub,
    body: Any,
    timeout_s: float = TIMEOUT_S,
    progress_s: float = PROGRESS_S,
    answer_after_s: float = 0.0,
    clock: Callable[[], float] = time.monotonic,
) -> None:
    cfg = SupervisionConfig(
        interval_s=INTERVAL_S, heartbeat_timeout_s=timeout_s, progress_timeout_s=progress_s
    )
    async with (
        Runtime("n", "node", hub.transport()) as node_rt,
        Runtime("n", "supervisor", hub.transport()) as rt,
    ):
        node = _Node(node_rt, answer_after_s)
        spec = SupervisorLaunch(node="n", node_endpoint=node_rt.address, supervision=cfg, reap_timeout_s=2.0)
        with HeartbeatReceiver() as receiver:
            supervisor = Supervisor(spec, rt, receiver, clock=clock)
            stop = anyio.Event()
            async with anyio.create_task_group() as tg:
                tg.start_soon(supervisor.run, stop)
                with anyio.fail_after(BOUND):
                    await node.got_ready.wait()
                await body(node_rt, rt, node, receiver)
                stop.set()


# The node answering the report ten beats late: as a loaded machine's did. The supervisor waited
# half a beat for the answer and killed; the node reaped and restarted the worker, then read the
# report, which named an old incarnation: dropped (test_hang_with_gil_..., test_supervision.py).
LATE_ANSWER_S = 10 * INTERVAL_S


@pytest.mark.parametrize("answer_after_s", [0.0, LATE_ANSWER_S])
async def test_silent_worker_is_reported_then_killed(
    sleeper: subprocess.Popen[bytes], answer_after_s: float
) -> None:
    """Once beats stop, the node hears why while the worker still lives (also when its answer
    comes late), then the worker is SIGKILLed (how soon, on a virtual clock: test_liveness.py)."""

    async def body(node_rt: Runtime, rt: Runtime, node: _Node, receiver: HeartbeatReceiver) -> None:
        assert node.ready is not None and node.ready["udp"][1] == receiver.address[1]
        status = WorkerStatus("w1", pid=sleeper.pid)
        sender = HeartbeatSender(status, receiver.address, INTERVAL_S)
        assert await node_rt.control(
            rt.address, "watch", {"worker_id": "w1", "pid": sleeper.pid, "kind": "default"}
        )
        sender.start()
        with anyio.fail_after(BOUND):
            while (await node_rt.control(rt.address, "status"))["workers"]["w1"]["last_beat_age_s"] is None:
                await anyio.sleep(0.01)
        sender.stop()
        with anyio.fail_after(BOUND):
            await node.got_kill.wait()
            while sleeper.poll() is None:
                await anyio.sleep(0.01)
        report, alive_when_told = node.kills[0]
        assert report["worker"] == "w1" and report["reason"] == "no_heartbeat"
        assert report["silent_s"] >= TIMEOUT_S  # how soon after: on a virtual clock, test_liveness.py
        assert report["last_status"]["pid"] == sleeper.pid
        assert alive_when_told  # reported before the kill: the node knows why when waitpid fires
        after = await node_rt.control(rt.address, "status")
        assert after["kills_by_reason"] == {"no_heartbeat": 1}

    with capture_logs() as logs:
        await _run_supervisor(MemoryHub(), body, answer_after_s=answer_after_s)
    assert any(e["event"] == "worker_killed" and e["reason"] == "no_heartbeat" for e in logs)
    assert not any(e["event"] == "kill_report_failed" for e in logs)


# Timeouts 20 beats long: a beat or a progress report that a loaded box runs late kills nobody.
BUSY_TIMEOUT_S = 20 * INTERVAL_S


async def test_busy_worker_that_reports_progress_is_not_killed(sleeper: subprocess.Popen[bytes]) -> None:
    """A busy worker beating with progress for several progress timeouts is left alone."""

    async def body(node_rt: Runtime, rt: Runtime, node: _Node, receiver: HeartbeatReceiver) -> None:
        status = WorkerStatus("w1", pid=sleeper.pid)
        status.begin_message("crunch")
        done = threading.Event()

        def work() -> None:
            while not done.wait(INTERVAL_S / 2):
                status.progress()

        thread = threading.Thread(target=work)
        await node_rt.control(rt.address, "watch", {"worker_id": "w1", "pid": sleeper.pid, "kind": "default"})
        with HeartbeatSender(status, receiver.address, INTERVAL_S):
            thread.start()
            try:
                t0 = time.monotonic()
                with anyio.fail_after(BOUND):
                    while time.monotonic() - t0 < 3 * BUSY_TIMEOUT_S:  # a bounded watch, not a wait
                        assert not node.kills and sleeper.poll() is None
                        await anyio.sleep(INTERVAL_S)
            finally:
                done.set()
                thread.join()
        assert await node_rt.control(rt.address, "unwatch", {"worker_id": "w1", "pid": sleeper.pid})

    await _run_supervisor(MemoryHub(), body, timeout_s=BUSY_TIMEOUT_S, progress_s=BUSY_TIMEOUT_S)


class _PausedClock:
    """The monotonic clock as a supervisor stopped with its node sees it: on the resume, its
    next tick finds ``paused_s`` gone at once (SIGSTOP of the node's tree, ``docker pause``)."""

    def __init__(self) -> None:
        self._skew = 0.0

    def __call__(self) -> float:
        return time.monotonic() + self._skew

    def pause(self, paused_s: float) -> None:
        self._skew += paused_s


PAUSE_S = 5 * BUSY_TIMEOUT_S


async def _pause_the_node(
    node_rt: Runtime,
    rt: Runtime,
    node: _Node,
    receiver: HeartbeatReceiver,
    pid: int,
    clock: _PausedClock,
    logs: list[dict[str, Any]],
) -> WorkerStatus:
    """Watch a beating worker, then stop it and its supervisor for ``PAUSE_S``; return once
    the supervisor has ticked after the resume (it said so, or it killed)."""
    status = WorkerStatus("w1", pid=pid)
    await node_rt.control(rt.address, "watch", {"worker_id": "w1", "pid": pid, "kind": "default"})
    with HeartbeatSender(status, receiver.address, INTERVAL_S):
        with anyio.fail_after(BOUND):
            while (await node_rt.control(rt.address, "status"))["beats_received"] < 2:
                await anyio.sleep(0.01)
    clock.pause(PAUSE_S)  # no beat since the sender stopped: the worker was stopped too
    with anyio.fail_after(BOUND):
        while not (node.kills or any(e["event"] == "supervisor_resumed" for e in logs)):
            await anyio.sleep(0.01)
    return status


async def test_a_paused_node_kills_no_healthy_worker_on_its_resume(sleeper: subprocess.Popen[bytes]) -> None:
    """rs 3: a node's whole tree stopped for several heartbeat timeouts, then continued. Every
    worker was killed as no_heartbeat on the resume; now the supervisor takes the silence it
    did not hear for none, says so, and the worker beating again lives on."""
    clock = _PausedClock()

    async def body(node_rt: Runtime, rt: Runtime, node: _Node, receiver: HeartbeatReceiver) -> None:
        status = await _pause_the_node(node_rt, rt, node, receiver, sleeper.pid, clock, logs)
        assert node.kills == []
        with HeartbeatSender(status, receiver.address, INTERVAL_S):  # continued: it beats again
            seen = (await node_rt.control(rt.address, "status"))["beats_received"]
            with anyio.fail_after(BOUND):  # a heartbeat timeout's worth of beats, and more
                while (await node_rt.control(rt.address, "status"))["beats_received"] < seen + 25:
                    await anyio.sleep(0.01)
        assert node.kills == [] and sleeper.poll() is None

    with capture_logs() as logs:
        await _run_supervisor(MemoryHub(), body, timeout_s=BUSY_TIMEOUT_S, clock=clock)
    [said] = [e for e in logs if e["event"] == "supervisor_resumed"]
    assert said["gap_s"] >= PAUSE_S and said["log_level"] == "warning"


async def test_a_worker_silent_after_the_resume_is_killed_for_its_own_silence(
    sleeper: subprocess.Popen[bytes],
) -> None:
    """A worker that does not beat again once its node is continued is hung: killed, its
    silence counted from the resume (the pause is not in it)."""
    clock = _PausedClock()

    async def body(node_rt: Runtime, rt: Runtime, node: _Node, receiver: HeartbeatReceiver) -> None:
        await _pause_the_node(node_rt, rt, node, receiver, sleeper.pid, clock, logs)
        with anyio.fail_after(BOUND):
            await node.got_kill.wait()
        report, _ = node.kills[0]
        assert report["reason"] == "no_heartbeat"
        assert BUSY_TIMEOUT_S <= report["silent_s"] < PAUSE_S

    with capture_logs() as logs:
        await _run_supervisor(MemoryHub(), body, timeout_s=BUSY_TIMEOUT_S, clock=clock)


async def test_a_forged_beat_far_ahead_is_logged_and_kills_nobody(sleeper: subprocess.Popen[bytes]) -> None:
    """The report's repro: one datagram with the worker's pid and seq 2**62 had the supervisor
    ignore every real beat after it and kill the worker for silence."""

    async def body(node_rt: Runtime, rt: Runtime, node: _Node, receiver: HeartbeatReceiver) -> None:
        status = WorkerStatus("w1", pid=sleeper.pid)
        await node_rt.control(rt.address, "watch", {"worker_id": "w1", "pid": sleeper.pid, "kind": "default"})
        with HeartbeatSender(status, receiver.address, INTERVAL_S):
            with anyio.fail_after(BOUND):
                while (await node_rt.control(rt.address, "status"))["beats_received"] < 2:
                    await anyio.sleep(0.01)
            forged = [BEAT_MAGIC, 1, "w1", sleeper.pid, "idle", None, 0, 0, None, 2**62, 0]
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as attacker:
                attacker.sendto(msgpack.packb(forged), receiver.address)
            with anyio.fail_after(BOUND):  # the real beats are taken again (and it is said)
                while not any(e["event"] == "heartbeat_seq_went_back" for e in logs):
                    await anyio.sleep(0.01)
            seen = (await node_rt.control(rt.address, "status"))["beats_received"]
            with anyio.fail_after(BOUND):  # and go on being taken: a timeout's worth of them
                while (await node_rt.control(rt.address, "status"))["beats_received"] < seen + 25:
                    await anyio.sleep(0.01)
        after = await node_rt.control(rt.address, "status")
        assert after["kills_by_reason"] == {} and node.kills == []
        assert after["workers"]["w1"]["last_beat_age_s"] < BUSY_TIMEOUT_S

    with capture_logs() as logs:
        await _run_supervisor(MemoryHub(), body, timeout_s=BUSY_TIMEOUT_S)
    [said] = [e for e in logs if e["event"] == "heartbeat_seq_went_back"]
    assert said["last_seq"] == 2**62 and said["worker_pid"] == sleeper.pid and said["log_level"] == "warning"


async def test_unwatch_of_an_old_incarnation_keeps_the_new_watch(sleeper: subprocess.Popen[bytes]) -> None:
    """An unwatch naming a previous pid does not drop the watch of the worker's current process."""

    async def body(node_rt: Runtime, rt: Runtime, node: _Node, receiver: HeartbeatReceiver) -> None:
        await node_rt.control(rt.address, "watch", {"worker_id": "w1", "pid": sleeper.pid, "kind": "default"})
        assert not await node_rt.control(
            rt.address, "unwatch", {"worker_id": "w1", "pid": sleeper.pid + 99999}
        )
        assert "w1" in (await node_rt.control(rt.address, "status"))["workers"]
        assert await node_rt.control(rt.address, "unwatch", {"worker_id": "w1", "pid": sleeper.pid})
        assert "w1" not in (await node_rt.control(rt.address, "status"))["workers"]

    await _run_supervisor(MemoryHub(), body)


def test_kill_tree_kills_children_and_the_parent() -> None:
    """kill_tree SIGKILLs a worker and the processes it started, and returns no survivor."""
    parent = subprocess.Popen(["/bin/sh", "-c", "sleep 60 & wait"])
    try:
        proc = psutil.Process(parent.pid)
        deadline = time.monotonic() + BOUND
        while not proc.children() and time.monotonic() < deadline:
            time.sleep(0.01)  # polling for the grandchild to exist, bounded
        children = proc.children(recursive=True)
        assert children
        assert kill_tree(proc, reap_timeout_s=5.0) == []
        assert not any(c.is_running() and c.status() != psutil.STATUS_ZOMBIE for c in children)
    finally:
        if parent.poll() is None:
            parent.kill()
        parent.wait(timeout=5)


class _Echo(Actor):
    @handles("echo")
    def echo(self, payload: Any) -> Any:
        return payload

    @handles("long")
    def long(self, payload: Any) -> int:
        for i in range(int(payload)):
            self.progress(1, note=f"step {i}")
        return int(payload)


async def test_status_record_follows_messages_and_progress() -> None:
    """The worker's status record counts handled messages and progress() calls made inside handlers."""
    async with Runtime("n", "w", MemoryHub().transport()) as rt:
        health = WorkerHealth(rt, "w", None, 0.5)
        ref = await rt.spawn(_Echo, "echo")
        assert await ref.ask("echo", 1) == 1
        assert await ref.ask("long", 5) == 5
        snap = health.status.snapshot()
        assert snap.messages_handled == 2 and snap.progress_count == 5
        assert snap.state.value == "idle" and snap.current is None
        health.stopping()
        assert health.status.snapshot().state.value == "stopping"
        health.close()


async def test_heartbeat_to_moves_the_beats_to_a_new_supervisor_port() -> None:
    """After heartbeat_to, the worker's beats go to the new address and no longer to the old one."""
    hub = MemoryHub()
    with HeartbeatReceiver() as old, HeartbeatReceiver() as new:
        async with Runtime("n", "w", hub.transport()) as rt, Runtime("n", "node", hub.transport()) as node:
            health = WorkerHealth(rt, "w", old.address, INTERVAL_S)
            assert await node.control(rt.address, "heartbeat_to", {"addr": list(new.address)})
            old.recv_all()  # what the first sender sent before it stopped
            with anyio.fail_after(BOUND):
                while not new.recv_all():
                    await anyio.sleep(0.01)
            health.close()
            assert old.recv_all() == []


async def test_worker_chaos_crash_and_drop_then_heal() -> None:
    """Chaos control messages arm a crash and a drop in a live runtime; heal clears them and reports what
    fired."""
    hub = MemoryHub()
    async with Runtime("n", "w", hub.transport()) as rt, Runtime("n", "ctl", hub.transport()) as ctl:
        chaos = WorkerChaos(rt)
        ref = await rt.spawn(_Echo, "echo")
        await ctl.control(rt.address, "chaos", {"faults": [{"kind": "crash", "count": 1}]})
        with pytest.raises(RemoteError):
            await ref.ask("echo", 1)
        await ctl.control(rt.address, "chaos", {"faults": [{"kind": "drop", "count": 1}]})
        with pytest.raises(TimeoutError):
            await ref.ask("echo", 2, timeout=0.1)
        assert await ref.ask("echo", 3) == 3
        healed = await ctl.control(rt.address, "heal")
        assert healed["fired"] == {"crash": 1, "drop": 1} and healed["dropped"] == {"echo": 1}
        assert rt.before_handle == []  # the hot path is back to no hook at all
        with pytest.raises(ConfigError):
            await chaos._chaos({"faults": [{"kind": "melt"}]})


async def test_partitioned_transport_refuses_sends_and_logs_once_per_peer() -> None:
    """While refuse() names a peer, sends to it raise Partitioned, counted, and logged once."""
    transport = ZmqTransport()
    try:
        peer = "tcp://127.0.0.1:9"
        transport.refuse = lambda address: address == peer
        with capture_logs() as logs:
            for _ in range(3):
                with pytest.raises(Partitioned, match="troupe ctl heal"):
                    await transport.send(peer, [b"x"], block=False)
        assert transport.refused_counts == {peer: 3}
        assert [e["event"] for e in logs].count("partition_refused") == 1
    finally:
        transport.close()


def test_supervision_and_restart_tables_load_with_per_kind_overrides(tmp_path: Path) -> None:
    """[supervision] with a per-kind table and [restart] load into policies; a kind inherits what it leaves
    out."""
    path = tmp_path / "node.toml"
    path.write_text(
        "[supervision]\ninterval_s = 0.2\nheartbeat_timeout_s = 2\nprogress_timeout_s = 10\n"
        "[supervision.kinds.render]\nheartbeat_timeout_s = 5\nprogress_timeout_s = 0\n"
        "[restart]\nmax_restarts = 2\nperiod_s = 30\n"
    )
    cfg = load_node_config(path)
    render, other = cfg.supervision.policy_for("render"), cfg.supervision.policy_for("planner")
    assert (render.interval_s, render.heartbeat_timeout_s, render.progress_timeout_s) == (0.2, 5, None)
    assert (other.heartbeat_timeout_s, other.progress_timeout_s) == (2, 10)
    assert cfg.restart.policy().max_restarts == 2 and cfg.restart.policy().period_s == 30
    assert NodeConfig().supervision.enabled


def test_a_kind_sets_its_own_bound_on_a_start(tmp_path: Path) -> None:
    """A slow-importing kind (a renderer) wants a longer start than the node's other workers: the
    kind table refused start_timeout_s ("unknown key"). The warnings name the setting to raise."""
    path = tmp_path / "node.toml"
    path.write_text(
        "[supervision]\nstart_timeout_s = 60\n[supervision.kinds.render]\nstart_timeout_s = 600\n"
        "[supervision.kinds.fast]\nstart_timeout_s = 0\n"
    )
    supervision = load_node_config(path).supervision
    assert supervision.start_timeout_for("render") == (600, "[supervision.kinds.render] start_timeout_s")
    assert supervision.start_timeout_for("fast") == (0, "[supervision.kinds.fast] start_timeout_s")
    assert supervision.start_timeout_for("planner") == (60, "[supervision] start_timeout_s")
    assert NodeConfig().supervision.start_timeout_for("render") == (180, "[supervision] start_timeout_s")


def test_inconsistent_supervision_is_one_clear_config_error(tmp_path: Path) -> None:
    """A heartbeat timeout not above its interval is refused at load time, naming the table and the fix."""
    path = tmp_path / "node.toml"
    path.write_text("[supervision]\ninterval_s = 1\n[supervision.kinds.gpu]\nheartbeat_timeout_s = 0.5\n")
    with pytest.raises(
        ConfigError, match=r"supervision.*heartbeat_timeout_s must be greater than interval_s"
    ):
        load_node_config(path)
    path.write_text("[supervision]\ninterval_s = 1\n[restarts]\n")
    with pytest.raises(ConfigError, match="unknown sections"):
        load_node_config(path)


async def test_a_watch_of_a_process_outside_the_node_is_refused() -> None:
    """The supervisor SIGKILLs the tree of a watched process that stops beating: a watch naming
    a process its node did not start (init, here) is refused, and nothing is watched."""

    async def body(node_rt: Runtime, rt: Runtime, node: _Node, receiver: HeartbeatReceiver) -> None:
        with pytest.raises(BadRequest, match="pid 1 is not a process of this supervisor's node"):
            await node_rt.control(rt.address, "watch", {"worker_id": "w1", "pid": 1, "kind": "default"})
        assert "w1" not in (await node_rt.control(rt.address, "status"))["workers"]

    await _run_supervisor(MemoryHub(), body)


async def test_a_node_that_is_shutting_down_as_the_supervisor_starts_ends_it_quietly() -> None:
    """A run that ended at once (its output closed, ``troupe run | head -1``) stopped its node
    as the supervisor reported ready: the node answered ``actor_stopped`` and the supervisor
    died with a traceback on the command's stderr. It ends as for a node already gone."""
    cfg = SupervisionConfig(
        interval_s=INTERVAL_S, heartbeat_timeout_s=TIMEOUT_S, progress_timeout_s=PROGRESS_S
    )
    hub = MemoryHub()
    async with (
        Runtime("n", "node", hub.transport()) as node_rt,
        Runtime("n", "supervisor", hub.transport()) as rt,
    ):

        async def shutting_down(_payload: Any) -> bool:
            raise ActorStopped("the process is shutting down")

        node_rt.register_controls({"supervisor_ready": shutting_down})
        spec = SupervisorLaunch(node="n", node_endpoint=node_rt.address, supervision=cfg, reap_timeout_s=2.0)
        with HeartbeatReceiver() as receiver, capture_logs() as logs, anyio.fail_after(BOUND):
            await Supervisor(spec, rt, receiver).run(anyio.Event())  # returns: never waits for its stop
    assert any(entry["event"] == "supervisor_node_gone" for entry in logs)
