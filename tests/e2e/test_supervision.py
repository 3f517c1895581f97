"""Supervision end to end: each fault kind injected into a real worker serving messages."""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest

from support.cluster import ctl
from troupe.runtime import AskTimeout, ConfigError, PeerLost, RemoteError, UnknownActor
from troupe.runtime.testing import plugin as troupe_testing
from troupe.runtime.testing.plugin import ChaosEvent, Cluster, reap, start_cluster

pytestmark = pytest.mark.e2e

# The plugin's fixture, also when the `troupe` pytest11 entry point is not installed.
troupe_cluster = troupe_testing.troupe_cluster

TESTS_DIR = str(Path(__file__).resolve().parents[1])  # workers import support.cluster:Cruncher
INTERVAL_S, TIMEOUT_S, PROGRESS_S = 0.1, 0.6, 0.5


def _supervision(heartbeat_timeout_s: float, progress_timeout_s: float) -> str:
    return f"""
[node]
ask_timeout_s = 5
stop_grace_s = 2

[supervision]
interval_s = {INTERVAL_S}
heartbeat_timeout_s = {heartbeat_timeout_s}
progress_timeout_s = {progress_timeout_s}
"""


SUPERVISION = _supervision(TIMEOUT_S, PROGRESS_S)

# The shared node's workers are never meant to be killed: timeouts far above a beat, so a
# loaded machine's late beat or a slow message costs no restart.
SHARED_TIMEOUT_S, SHARED_PROGRESS_S = 5.0, 2.0
SLOW_S = SHARED_PROGRESS_S / 5  # a message slow, yet well below the progress timeout

SHARED = (
    _supervision(SHARED_TIMEOUT_S, SHARED_PROGRESS_S)
    + """
[[workers]]
name = "w-echo"
actors = [{ name = "echo", class = "troupe.actors.demo.actors:Echo" }]

[[workers]]
name = "w-relay"
actors = [{ name = "relay", class = "troupe.actors.demo.actors:Relay", kwargs = { target = "w-echo/echo" } }]
"""
)

ONE = (
    SUPERVISION
    + """
[restart]
backoff_base_s = 0.05
backoff_max_s = 0.2

[[workers]]
name = "w-one"
actors = [{ name = "echo", class = "troupe.actors.demo.actors:Echo" }]
"""
)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """One node shared by the tests whose faults restart no process (each leaves it healed).

    Faults that restart a worker get a node of their own (``troupe_cluster``): the suite's
    leak guard counts a restarted worker as a process the test left behind.
    """
    c = start_cluster(tmp_path_factory.mktemp("supervision"), SHARED, "sv")
    try:
        yield c
    finally:
        assert not reap(c.proc, c.descendants())


@pytest.fixture
def one(troupe_cluster: Any) -> Cluster:
    """A node of its own with one Echo worker, ``w-one``, restarted with a short backoff."""
    cluster: Cluster = troupe_cluster(ONE, "one")
    return cluster


def _watched(status: dict[str, Any]) -> bool:
    sup = status["supervision"].get("supervisor") or {}
    watched = sup.get("workers", {})
    return all(
        w["state"] == "running"
        and w["name"] in watched
        and watched[w["name"]]["pid"] == w["pid"]
        and not watched[w["name"]]["killed"]
        for w in status["workers"]
    )


async def _settled(cluster: Cluster) -> dict[str, Any]:
    return await cluster.wait_for(_watched, timeout=15)


async def _restarted(cluster: Cluster, worker: str, old_pid: int) -> dict[str, Any]:
    def done(status: dict[str, Any]) -> bool:
        w = Cluster.worker_in(status, worker)
        return w["state"] == "running" and w["pid"] != old_pid and _watched(status)

    return Cluster.worker_in(await cluster.wait_for(done, timeout=15), worker)


async def test_kill_is_detected_restarted_and_serves_again(one: Cluster) -> None:
    """A SIGKILLed worker is noticed by waitpid, restarted with the reason, and answers again."""
    before = Cluster.worker_in(await _settled(one), "w-one")
    reply = await one.chaos("kill", "w-one")
    assert reply["killed"] == {"w-one": before["pid"]}
    after = await _restarted(one, "w-one", before["pid"])
    assert after["restarts"] == 1
    assert after["exit"].startswith("chaos_kill") and "SIGKILL" in after["exit"]
    async with one.client() as rt:
        assert await rt.ref("w-one/echo").ask("echo", "back") == "back"
        assert await rt.ref("w-one/echo").ask("pid") == after["pid"]


async def test_a_ref_held_across_its_workers_restart_reaches_the_new_process(one: Cluster) -> None:
    """A ref kept (as the README's client does) across its worker's kill and restart: its next
    ask goes to the restarted process (it went to the dead one and waited out its deadline),
    and so does a tell (it was lost without a word)."""
    before = Cluster.worker_in(await _settled(one), "w-one")
    async with one.client() as rt:
        echo = rt.ref("w-one/echo")
        assert await echo.ask("pid") == before["pid"]
        await one.chaos("kill", "w-one")
        after = await _restarted(one, "w-one", before["pid"])
        assert await echo.ask("pid", timeout=10) == after["pid"]
        await one.chaos("kill", "w-one")
        again = await _restarted(one, "w-one", after["pid"])
        await echo.tell("echo", "told")  # resolves afresh too: it reaches the new process
        assert await echo.ask("pid", timeout=10) == again["pid"]


async def test_an_ask_to_a_worker_killed_before_it_answered_ends_then_not_at_its_deadline(
    one: Cluster,
) -> None:
    """A handler that makes no progress gets its worker killed by the supervisor; the asker
    learns of it from its connection: PeerLost (an AskTimeout) then, where before it waited out
    the ask's whole timeout (an hour here)."""
    before = Cluster.worker_in(await _settled(one), "w-one")
    async with one.client() as rt:
        echo = rt.ref("w-one/echo")
        assert await echo.ask("pid") == before["pid"]  # connected, its handshake done
        with anyio.fail_after(60), pytest.raises(PeerLost) as lost:  # a bound on a hang, not on speed
            await echo.ask("sleep", 3600, timeout=3600)
        assert "ended before the reply came" in str(lost.value), lost.value
        assert isinstance(lost.value, AskTimeout)  # what code that catches timeouts already handles
        status = await one.wait_for(lambda s: "w-one" in s["supervision"]["kills"], timeout=15)
        assert status["supervision"]["kills"]["w-one"]["reason"] == "no_progress"
        after = await _restarted(one, "w-one", before["pid"])
        assert await rt.ref("w-one/echo").ask("pid") == after["pid"]  # the next ask finds the new one


async def test_the_ask_after_a_peer_lost_reaches_the_restarted_process_not_the_dead_one(
    troupe_cluster: Any,
) -> None:
    """An ask in flight ends with PeerLost as its worker is killed; the same ref's next ask
    reaches the restarted process (or hears UnknownActor while it restarts). The node's
    directory still named the dead process's endpoint until it had reaped it, the ask went
    there, and waited out its whole deadline (4 rounds in 6, in the report): several rounds,
    more than the default ``max_restarts``."""
    one: Cluster = troupe_cluster(ONE.replace("[restart]", "[restart]\nmax_restarts = 20"), "one")
    async with one.client() as rt:
        echo = rt.ref("w-one/echo")
        for _ in range(6):
            before = Cluster.worker_in(await _settled(one), "w-one")
            assert await echo.ask("pid", timeout=10) == before["pid"]  # connected, its handshake done
            with anyio.fail_after(60):  # bounds on a hang, not on speed
                async with anyio.create_task_group() as tg:

                    async def in_flight() -> None:
                        with pytest.raises(PeerLost):
                            await echo.ask("sleep", 3600, timeout=3600)

                    tg.start_soon(in_flight)
                    await one.chaos("kill", "w-one")
                while True:  # an AskTimeout here (the dead endpoint's silence) fails the test
                    try:
                        now = await echo.ask("pid", timeout=20)
                        break
                    except UnknownActor:  # between two incarnations: the caller tries again
                        await anyio.sleep(0.05)
            assert now != before["pid"]


async def test_an_actor_spawned_by_control_message_is_named_and_restarted_with_its_worker(
    one: Cluster,
) -> None:
    """A worker's `spawn` control tells the node: the new actor resolves by its bare name, and a
    restart of its worker brings it back."""
    before = Cluster.worker_in(await _settled(one), "w-one")
    async with one.client() as rt:
        address = await rt.control(
            before["endpoint"], "spawn", {"name": "late", "class": "troupe.actors.demo.actors:Echo"}
        )
        assert address.endswith("/w-one/late")
        assert await rt.ref("late").ask("echo", "first") == "first"  # resolved through the node
    status = await one.wait_for(lambda s: "late" in Cluster.worker_in(s, "w-one")["actors"], timeout=5)
    assert Cluster.worker_in(status, "w-one")["actor_endpoints"]["late"]
    await one.chaos("kill", "w-one")
    after = await _restarted(one, "w-one", before["pid"])
    assert set(after["actor_endpoints"]) == {"echo", "late"}
    async with one.client() as rt:
        assert await rt.ref("late").ask("echo", "back") == "back"
        assert await rt.ref("late").ask("pid") == after["pid"]


async def test_hang_with_gil_is_killed_for_no_heartbeat_and_restarted(one: Cluster) -> None:
    """A C call holding the GIL stops the beats; the supervisor kills the worker and it restarts."""
    before = Cluster.worker_in(await _settled(one), "w-one")
    await one.chaos("hang_with_gil", "w-one", seconds=30)
    async with one.client() as rt:
        await rt.ref("w-one/echo").tell("echo", "freeze")
        status = await one.wait_for(lambda s: "w-one" in s["supervision"]["kills"], timeout=15)
    kill = status["supervision"]["kills"]["w-one"]
    assert kill["reason"] == "no_heartbeat" and kill["pid"] == before["pid"]
    assert kill["silent_s"] >= TIMEOUT_S  # how soon after: on a virtual clock, test_liveness.py
    after = await _restarted(one, "w-one", before["pid"])
    assert after["exit"].startswith("no_heartbeat")
    async with one.client() as rt:
        assert await rt.ref("w-one/echo").ask("echo", "thawed") == "thawed"
    # What fired went with the killed process: the heal says it restarted, not "nothing fired".
    healed = (await one.heal("w-one"))["workers"]["w-one"]
    assert healed["fired"] == {}
    assert healed["restarted_since_armed"]["kinds"] == ["hang_with_gil"]
    assert healed["restarted_since_armed"]["exit"].startswith("no_heartbeat")
    assert "restarted_since_armed" not in (await one.heal("w-one"))["workers"]["w-one"]  # said once


async def test_stall_is_killed_by_the_progress_timeout(one: Cluster) -> None:
    """A handler blocked on a lock keeps beating but makes no progress: killed for no_progress, restarted."""
    before = Cluster.worker_in(await _settled(one), "w-one")
    await one.chaos("stall", "w-one")
    async with one.client() as rt:  # open while waiting: closing drops an unsent tell (linger 0)
        await rt.ref("w-one/echo").tell("echo", "stall")
        after = await _restarted(one, "w-one", before["pid"])
    kill = (await one.supervision())["supervision"]["kills"]["w-one"]
    assert kill["reason"] == "no_progress" and kill["pid"] == before["pid"]
    assert kill["last_status"]["state"] == "busy" and kill["last_status"]["current"] == "echo/echo"
    assert after["exit"].startswith("no_progress")


async def test_dead_supervisor_is_restarted_and_watches_again(one: Cluster) -> None:
    """The node restarts a killed supervisor, which watches every worker again and still kills hangs."""
    status = await _settled(one)
    old = status["supervision"]["supervisor_pid"]
    await one.chaos("kill", "supervisor")
    status = await one.wait_for(
        lambda s: s["supervision"]["supervisor_starts"] == 2 and _watched(s), timeout=15
    )
    assert status["supervision"]["supervisor_pid"] != old
    # The node's template was ready (its workers are forks of it): the new one is a fork too,
    # and the hang below shows that it judges as a spawned one did.
    assert status["supervision"]["supervisor_start"] == "fork"
    before = Cluster.worker_in(status, "w-one")
    await one.chaos("hang_with_gil", "w-one", seconds=30)
    async with one.client() as rt:  # open while waiting: closing drops an unsent tell (linger 0)
        await rt.ref("w-one/echo").tell("echo", "freeze")
        await _restarted(one, "w-one", before["pid"])
    assert (await one.supervision())["supervision"]["kills"]["w-one"]["reason"] == "no_heartbeat"


# The node asks its supervisor every beat whether it answers; silent this long, it is killed.
SILENT_SUPERVISOR = SUPERVISION + "supervisor_timeout_s = 1.0\n" + ONE[len(SUPERVISION) :]


async def test_a_supervisor_that_stops_answering_is_killed_and_started_again(troupe_cluster: Any) -> None:
    """A SIGSTOPped (hung) supervisor watched nothing and the node said nothing: the node
    warns, SIGKILLs it after ``supervisor_timeout_s`` and starts another, which kills hangs."""
    one: Cluster = troupe_cluster(SILENT_SUPERVISOR, "one")
    status = await _settled(one)
    old = status["supervision"]["supervisor_pid"]
    os.kill(old, signal.SIGSTOP)  # a hung supervisor; killed by the node, reaped by it
    status = await one.wait_for(
        lambda s: s["supervision"]["supervisor_starts"] == 2 and _watched(s), timeout=30
    )
    assert status["supervision"]["supervisor_pid"] != old
    events = [json.loads(line) for line in (one.log_dir / "one.jsonl").read_text().splitlines()]
    silent = [e for e in events if e.get("event") == "supervisor_not_answering"]
    assert silent and silent[0]["level"] == "warning", silent
    before = Cluster.worker_in(status, "w-one")
    await one.chaos("hang_with_gil", "w-one", seconds=30)
    async with one.client() as rt:  # open while waiting: closing drops an unsent tell (linger 0)
        await rt.ref("w-one/echo").tell("echo", "freeze")
        await _restarted(one, "w-one", before["pid"])
    assert (await one.supervision())["supervision"]["kills"]["w-one"]["reason"] == "no_heartbeat"


CRUNCH = (
    SUPERVISION
    + """
[[workers]]
name = "w-crunch"
actors = [{ name = "cruncher", class = "support.cluster:Cruncher" }]
"""
)


async def test_progress_reports_keep_a_long_computation_alive(troupe_cluster: Any) -> None:
    """Pure-Python work longer than the progress timeout survives when it calls progress(), not otherwise."""
    crunch: Cluster = troupe_cluster(CRUNCH, "crunch", env={"PYTHONPATH": TESTS_DIR})
    before = Cluster.worker_in(await _settled(crunch), "w-crunch")
    async with crunch.client() as rt:
        rounds = await rt.ref("w-crunch/cruncher").ask(
            "crunch", {"seconds": 2.5 * PROGRESS_S, "progress": True}
        )
        assert rounds > 0
        assert (await crunch.worker("w-crunch"))["pid"] == before["pid"]
        await rt.ref("w-crunch/cruncher").tell("crunch", {"seconds": 30, "progress": False})
        await _restarted(crunch, "w-crunch", before["pid"])
    assert (await crunch.supervision())["supervision"]["kills"]["w-crunch"]["reason"] == "no_progress"
    async with crunch.client() as rt:  # the restarted actor was told why
        assert await rt.ref("w-crunch/cruncher").ask("reason") == "no_progress"


async def test_crash_answers_an_error_and_the_actor_keeps_serving(cluster: Cluster) -> None:
    """An injected crash reaches the asker as an error; the same process then answers normally."""
    before = Cluster.worker_in(await _settled(cluster), "w-echo")
    await cluster.chaos("crash", "w-echo/echo", count=1)
    async with cluster.client() as rt:
        echo = rt.ref("w-echo/echo")
        with pytest.raises(RemoteError) as info:
            await echo.ask("echo", 1)
        assert info.value.remote_type.endswith("FaultInjected")
        assert await echo.ask("echo", 2) == 2
    healed = await cluster.heal("w-echo")
    assert healed["workers"]["w-echo"]["fired"] == {"crash": 1}
    assert (await cluster.worker("w-echo"))["pid"] == before["pid"]


async def test_slow_worker_is_not_killed(cluster: Cluster) -> None:
    """Messages delayed below the progress timeout keep the worker alive: beats flow and work completes."""
    before = Cluster.worker_in(await _settled(cluster), "w-echo")
    await cluster.chaos("slow", "w-echo", seconds=SLOW_S, count=3)
    async with cluster.client() as rt:
        t0 = time.monotonic()
        for i in range(4):
            assert await rt.ref("w-echo/echo").ask("echo", i) == i
        assert time.monotonic() - t0 >= 3 * SLOW_S
    await cluster.heal("w-echo")
    after = await cluster.worker("w-echo")
    assert after["pid"] == before["pid"] and after["restarts"] == before["restarts"]


async def test_dropped_message_is_lost_and_counted(cluster: Cluster) -> None:
    """A dropped ask is never answered (the asker times out) and the actor counts it."""
    await _settled(cluster)
    await cluster.chaos("drop", "w-echo/echo", count=1)
    async with cluster.client() as rt:
        with pytest.raises(AskTimeout):
            await rt.ref("w-echo/echo").ask("echo", "lost", timeout=0.5)
    async with cluster.client() as rt:  # a fresh client: the timed-out one forgot the route
        assert await rt.ref("w-echo/echo").ask("echo", "kept") == "kept"
    healed = await cluster.heal("w-echo")
    assert healed["workers"]["w-echo"]["fired"] == {"drop": 1}
    assert healed["workers"]["w-echo"]["dropped"] == {"echo": 1}


async def test_partition_refuses_traffic_until_healed(cluster: Cluster) -> None:
    """A partitioned worker cannot reach its peer (a clear error, nothing corrupted) until healed."""
    await _settled(cluster)
    reply = await cluster.chaos("partition", "w-relay", peers=["w-echo"])
    assert reply["workers"]["w-relay"]["partitioned_peers"]
    async with cluster.client() as rt:
        relay = rt.ref("w-relay/relay")
        with pytest.raises(RemoteError) as info:
            await relay.ask("relay", "cut")
        assert info.value.remote_type.endswith("Partitioned")
        healed = await cluster.heal("w-relay")
        assert sum(healed["workers"]["w-relay"]["refused"].values()) >= 1
        assert await relay.ask("relay", "whole again") == "whole again"


@pytest.mark.parametrize(
    ("kind", "options", "named"),
    [
        ("crash", {"probabilty": 0.1}, "probabilty not allowed"),  # it fired on every message
        ("drop", {"message_typ": "echo"}, "message_typ not allowed"),
        ("slow", {"seconds": 0.1, "cnt": 1}, "cnt not allowed"),
        ("crash", {"peers": ["w-relay"]}, "peers not allowed"),
        ("kill", {"after": 3, "count": 1}, "after, count not allowed: kill is a SIGKILL"),  # killed at once
    ],
)
async def test_a_fault_option_misspelled_or_not_the_kinds_is_refused(
    cluster: Cluster, kind: str, options: dict[str, Any], named: str
) -> None:
    """An option a fault does not take is refused, naming it, and nothing is armed or killed:
    dropped, a typo'd ``probabilty`` armed a crash that fired on every message."""
    await _settled(cluster)
    before = await cluster.worker("w-echo")
    with pytest.raises(ConfigError, match=named):
        await cluster.chaos(kind, "w-echo", **options)
    async with cluster.client() as rt:
        assert await rt.ref("w-echo/echo").ask("echo", "still") == "still"
    assert (await cluster.worker("w-echo"))["pid"] == before["pid"]
    assert (await cluster.heal("w-echo"))["workers"]["w-echo"]["fired"] == {}


HEAL_AT_S = 2.0  # the crash's window: an ask made once the crash is in lands inside it


async def test_faults_by_schedule(cluster: Cluster) -> None:
    """A schedule injects a crash, then heals: the asks in between see the crash, the ones after do not."""
    await _settled(cluster)
    events = [
        ChaosEvent(0.0, "crash", "w-echo/echo", {"message_type": "echo"}),
        ChaosEvent(HEAL_AT_S, "heal", "w-echo"),
    ]
    async with cluster.client() as rt, cluster.scheduled(events) as done:
        echo = rt.ref("w-echo/echo")
        with anyio.fail_after(30):
            while not done:
                await anyio.sleep(0.01)
        with pytest.raises(RemoteError):  # asked well before the heal is due
            await echo.ask("echo", 1)
        with anyio.fail_after(HEAL_AT_S + 30):
            while len(done) < 2:
                await anyio.sleep(0.01)
        assert await echo.ask("echo", 2) == 2
    assert [e.kind for e, _ in done] == ["crash", "heal"]


def test_ctl_chaos_and_heal_commands(cluster: Cluster) -> None:
    """`troupe ctl chaos` arms a fault through the node, `ctl heal` clears it, a bad kind exits 2."""
    armed = ctl(
        "ctl",
        "chaos",
        "slow",
        "--target",
        "w-echo/echo",
        "--seconds",
        "0.01",
        "--count",
        "1",
        "--node",
        cluster.endpoint,
    )
    assert armed.returncode == 0, armed.stderr
    assert "slow armed in w-echo" in armed.stdout
    # status shows the armed fault beside the worker's state (only a heal had told of it)
    shown = ctl("ctl", "status", "--node", cluster.endpoint)
    assert "running (faults: slow)" in " ".join(shown.stdout.split()), shown.stdout
    healed = ctl("ctl", "heal", "--target", "w-echo", "--json", "--node", cluster.endpoint)
    assert healed.returncode == 0, healed.stderr
    assert json.loads(healed.stdout)["workers"]["w-echo"]["plans"] == 1
    shown = ctl("ctl", "status", "--node", cluster.endpoint)
    assert "faults:" not in shown.stdout, shown.stdout
    bad = ctl("ctl", "chaos", "melt", "--target", "w-echo", "--node", cluster.endpoint)
    assert bad.returncode == 2 and "unknown fault kind" in bad.stderr


INTENSITY = (
    SUPERVISION
    + """
[restart]
max_restarts = 1
period_s = 60
backoff_base_s = 0.05

[[workers]]
name = "w-flaky"
actors = [{ name = "echo", class = "troupe.actors.demo.actors:Echo" }]

[[workers]]
name = "w-steady"
actors = [{ name = "echo", class = "troupe.actors.demo.actors:Echo" }]
"""
)


async def test_restart_intensity_exceeded_fails_the_worker_not_the_node(troupe_cluster: Any) -> None:
    """Past max_restarts the worker is reported failed; the node and its other workers keep serving."""
    cluster: Cluster = troupe_cluster(INTENSITY, "intensity")
    first = await cluster.worker("w-flaky")
    await cluster.chaos("kill", "w-flaky")
    second = await _restarted(cluster, "w-flaky", first["pid"])
    await cluster.chaos("kill", "w-flaky")
    status = await cluster.wait_for(lambda s: Cluster.worker_in(s, "w-flaky")["state"] == "failed")
    assert status["supervision"]["give_ups"] == 1
    assert Cluster.worker_in(status, "w-flaky")["pid"] == second["pid"]
    async with cluster.client() as rt:
        assert await rt.ref("w-steady/echo").ask("echo", "still here") == "still here"
    flaky = Cluster.worker_in(await cluster.status(), "w-flaky")  # the reply `ctl status` prints
    assert flaky["state"] == "failed" and flaky["restarts"] == 1
