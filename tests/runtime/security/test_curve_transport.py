"""CURVE between runtimes of one process: who gets in, and what each role may send.

Every runtime here is a real ZeroMQ transport on loopback with keys generated into tmp_path;
the server's runtime and each client's use separate key objects, hence separate contexts and
authenticators, as separate processes would.
"""

from __future__ import annotations

import dataclasses
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
import zmq
from structlog.testing import capture_logs

from support.port_range import test_endpoint
from troupe.runtime import Actor, AskTimeout, PeerLost, Unreachable, handles
from troupe.runtime.core.runtime import process_runtime
from troupe.runtime.security.auth import gate_for
from troupe.runtime.security.keys import CurveKeys, generate_keys, load_keys
from troupe.runtime.security.roles import NotPermitted

WAIT_S = 30.0  # bound of every poll; never a bound on how fast anything is


class Echo(Actor):
    @handles("echo")
    def echo(self, value: Any) -> Any:
        return value


@dataclasses.dataclass
class Keys:
    cluster: CurveKeys
    operator: CurveKeys
    reader: CurveKeys
    stranger: CurveKeys  # a pair of another cluster, presented to this cluster's server key
    stale: CurveKeys  # this cluster's operator pair, holding another cluster's server key


@pytest.fixture
def keys(tmp_path: Path) -> Iterator[Keys]:
    generate_keys(tmp_path / "k")
    generate_keys(tmp_path / "other")
    cluster = load_keys(tmp_path / "k")
    other = load_keys(tmp_path / "other")
    stranger = dataclasses.replace(other, server_public=cluster.public)
    operator = load_keys(tmp_path / "k", "operator")
    stale = dataclasses.replace(operator, server_public=other.public)
    yield Keys(cluster, operator, load_keys(tmp_path / "k", "reader"), stranger, stale)


async def _mutate(_: Any) -> str:
    return "changed"


async def _until(predicate: Any) -> None:
    with anyio.fail_after(WAIT_S):
        while not predicate():
            await anyio.sleep(0.01)


async def test_cluster_and_operator_keys_may_send_anything(keys: Keys) -> None:
    async with process_runtime("n", "server", security=keys.cluster) as server:
        await server.spawn(Echo, "echo")
        server.register_control("mutate", _mutate)
        echo = server.cells["echo"].endpoint
        for who in (keys.cluster, keys.operator):
            async with process_runtime("n", f"client-{who.name}", security=who) as client:
                assert await client.control(server.address, "mutate", timeout=WAIT_S) == "changed"
                ref = client.ref("n/server/echo")
                client.directory.learn("n/server/echo", echo)
                assert await ref.ask("echo", {"x": [1, 2]}, timeout=WAIT_S) == {"x": [1, 2]}
    assert gate_for(keys.cluster).refused == 0


async def test_a_reader_key_may_read_but_not_change_anything(keys: Keys) -> None:
    async with process_runtime("n", "server", security=keys.cluster) as server:
        await server.spawn(Echo, "echo")
        server.register_control("mutate", _mutate)
        server.register_control("status", _mutate)  # read-only by name (security.roles)
        async with process_runtime("n", "reader", security=keys.reader) as client:
            assert await client.control(server.address, "status", timeout=WAIT_S) == "changed"
            with capture_logs() as logs, pytest.raises(NotPermitted) as refused:
                await client.control(server.address, "mutate", timeout=WAIT_S)
            assert str(refused.value) == "mutate needs an operator key; this peer has a reader key (reader)"
            assert [e["event"] for e in logs if e["log_level"] == "warning"] == ["control_refused"]
            client.directory.learn("n/server/echo", server.cells["echo"].endpoint)
            with pytest.raises(NotPermitted, match="messages to actors need an operator key"):
                await client.ref("n/server/echo").ask("echo", 1, timeout=WAIT_S)
            assert server.cells["echo"].statistics()["handled"] == 0  # nothing delivered


async def test_an_unauthorised_key_gets_nothing_delivered_and_is_counted_and_logged(keys: Keys) -> None:
    gate = gate_for(keys.cluster)
    async with process_runtime("n", "server", security=keys.cluster) as server:
        await server.spawn(Echo, "echo")
        calls: list[Any] = []

        async def mutate(payload: Any) -> str:
            calls.append(payload)
            return "changed"

        server.register_control("mutate", mutate)
        with capture_logs() as logs:
            async with process_runtime("n", "stranger", security=keys.stranger) as client:
                # The asker hears of the refusal (zmq_peer_loss.py): its asks end saying so, well
                # before their deadline (they waited it out in silence: two minutes, for a replica).
                with anyio.fail_after(WAIT_S), pytest.raises(Unreachable) as refused_control:
                    await client.control(server.address, "mutate", timeout=3600)
                client.directory.learn("n/server/echo", server.cells["echo"].endpoint)
                with anyio.fail_after(WAIT_S), pytest.raises(Unreachable) as refused_ask:
                    await client.ref("n/server/echo").ask("echo", 1, timeout=3600)
                for refusal in (refused_control.value, refused_ask.value):
                    assert "refused this process's CURVE key" in str(refusal), refusal
                    assert not isinstance(refusal, AskTimeout)  # nothing was delivered: no doubt
            await _until(lambda: gate.gatekeeper.refused >= 2)  # the mailbox and the actor's
        assert calls == [] and server.cells["echo"].statistics()["handled"] == 0
        refused = [e for e in logs if e["event"] == "peer_refused"]
        assert refused and refused[0]["peer_key"] == keys.stranger.public.decode()
        assert refused[0]["peer_address"] == "127.0.0.1"
        assert gate.refused >= 2


async def test_a_server_key_that_is_not_the_peer_s_ends_the_asks_saying_so(keys: Keys) -> None:
    """An operator holding a rotated (or another cluster's) cluster.key: the server cannot open
    its hello and hangs up, try after try. Its asks waited out their deadlines, and the CLI then
    called a healthy master busy, paused or hung (report mt 1); they now end saying which key."""
    async with process_runtime("n", "server", security=keys.cluster) as server:
        server.register_control("mutate", _mutate)
        async with process_runtime("n", "stale", security=keys.stale) as client:
            with anyio.fail_after(WAIT_S), pytest.raises(Unreachable) as refused:
                await client.control(server.address, "mutate", timeout=3600)
    said = str(refused.value)
    assert not isinstance(refused.value, AskTimeout), said  # nothing was delivered: no doubt
    assert f"the CURVE handshake with {server.address} failed" in said, said
    assert f"not the one in {keys.stale.directory / 'cluster.key'} (rotated? another cluster's?" in said


async def test_a_keyed_client_of_a_keyless_process_is_told_at_once_every_time(keys: Keys) -> None:
    """Whichever side sees the mismatch of mechanisms first (the keyless side hangs up; or this
    side fails the handshake, and libzmq gives the connection up for good), each ask ends at
    once, the second one too (the given-up connection is made again)."""
    async with (
        process_runtime("n", "keyless") as keyless,
        process_runtime("n", "keyed", security=keys.operator) as keyed,
    ):
        keyless.register_control("mutate", _mutate)
        for _ in range(2):
            with anyio.fail_after(WAIT_S), pytest.raises(Unreachable, match="without CURVE keys"):
                await keyed.control(keyless.address, "mutate", timeout=3600)


async def test_a_listener_that_hangs_up_is_blamed_on_the_keys_each_side_holds(keys: Keys) -> None:
    """With keys, hang-ups in the handshake name the server key held; without, the keys this
    process lacks (a keyed peer hangs up on a keyless one), or a listener that is no ZeroMQ
    peer, which the CLI's look at the greeting tells apart."""
    endpoint = test_endpoint()
    host, port = endpoint.removeprefix("tcp://").rsplit(":", 1)
    with socket.create_server((host, int(port))) as listener:
        listener.settimeout(WAIT_S)

        async def hang_up(n: int) -> None:  # accept and close, as a peer that refuses does
            for _ in range(n):
                conn, _ = await anyio.to_thread.run_sync(listener.accept)
                conn.close()

        async with (
            process_runtime("n", "keyed", security=keys.operator) as keyed,
            anyio.create_task_group() as tg,
        ):
            tg.start_soon(hang_up, 2)
            with anyio.fail_after(WAIT_S), pytest.raises(Unreachable, match="hung up on every try"):
                await keyed.control(endpoint, "ping", timeout=3600)
        async with process_runtime("n", "plain") as plain, anyio.create_task_group() as tg:
            tg.start_soon(hang_up, 2)
            with anyio.fail_after(WAIT_S), pytest.raises(Unreachable) as hung_up:
                await plain.control(endpoint, "ping", timeout=3600)
            assert "as a troupe process with CURVE keys does to one without any" in str(hung_up.value)
            assert "or a listener that is no ZeroMQ peer" in str(hung_up.value)


async def test_a_peer_without_curve_fails_the_handshake_and_is_counted(keys: Keys) -> None:
    gate = gate_for(keys.cluster)
    async with process_runtime("n", "server", security=keys.cluster) as server:
        server.register_control("mutate", _mutate)
        with zmq.Context() as ctx, ctx.socket(zmq.DEALER) as raw:
            raw.setsockopt(zmq.LINGER, 0)
            raw.connect(server.address)
            raw.send(b"\xc1 junk")
            # Which side sees the mismatch first is a race: refused, or hung up during it.
            await _until(lambda: gate.handshakes_failed + gate.handshakes_incomplete >= 1)
            assert not raw.poll(0)
        async with process_runtime("n", "plain") as plain:  # a troupe client without keys
            with anyio.fail_after(WAIT_S), pytest.raises(Unreachable, match="CURVE keys"):
                await plain.control(server.address, "mutate", timeout=3600)
        assert server.statistics().bad_frames == 0  # nothing of it was even read


async def test_a_keyless_client_of_a_keyed_process_is_told_at_once_every_time(keys: Keys) -> None:
    """A keyless ``troupe run --master`` against a keyed cluster's master waited out its ask
    (5 s) and was told that no master answered (report dt 2); each ask now ends at once naming
    the keys it lacks, the second one too (libzmq gave the first connection up)."""
    async with (
        process_runtime("n", "keyed", security=keys.cluster) as keyed,
        process_runtime("n", "keyless") as keyless,
    ):
        keyed.register_control("mutate", _mutate)
        for _ in range(2):
            with anyio.fail_after(WAIT_S), pytest.raises(Unreachable) as refused:
                await keyless.control(keyed.address, "mutate", timeout=3600)
            said = str(refused.value)
            assert not isinstance(refused.value, AskTimeout), said
            # Which side sees the mismatch first is a race: the keyed side hangs up, or this one
            # fails the handshake; either way the keys this process lacks are named.
            assert f"the process at {keyed.address} " in said, said
            assert "CURVE keys" in said and "--keys DIR, or $TROUPE_KEYS" in said, said


async def test_a_port_probe_is_counted_and_logged_at_debug_only(keys: Keys) -> None:
    """Every ``troupe ctl`` first checks that something listens (a TCP connect, then a hang-up:
    ``master_client.reachable``); each put an info line "handshake_incomplete" in the master's
    and nodes' logs, which then held mostly those."""
    gate = gate_for(keys.cluster)
    async with process_runtime("n", "server", security=keys.cluster) as server:
        host, port = server.address.removeprefix("tcp://").rsplit(":", 1)
        with capture_logs() as logs:
            with socket.create_connection((host, int(port)), timeout=WAIT_S):
                pass
            await _until(lambda: gate.handshakes_incomplete >= 1)
    said = [e for e in logs if e["event"] == "handshake_incomplete"]
    assert said and {e["log_level"] for e in said} == {"debug"}, said


class Hang(Actor):
    @handles("hang")
    async def hang(self, _: Any) -> None:
        await anyio.sleep_forever()


async def test_an_ask_to_a_keyed_process_that_goes_ends_with_peer_lost(keys: Keys) -> None:
    """Over CURVE too, the end of a connection whose handshake had completed ends its asks."""
    ended: list[BaseException] = []
    async with process_runtime("n", "server", security=keys.cluster, drain_timeout=0.1) as server:
        await server.spawn(Hang, "hang")
        async with process_runtime("n", "client", security=keys.operator) as client:
            client.directory.learn("n/server/hang", server.cells["hang"].endpoint)

            async def ask() -> None:
                try:
                    await client.ref("n/server/hang").ask("hang", None, timeout=3600)
                except AskTimeout as exc:
                    ended.append(exc)

            with anyio.fail_after(WAIT_S):
                async with anyio.create_task_group() as tg:
                    tg.start_soon(ask)
                    await _until(lambda: server.cells["hang"].statistics()["busy"])
                    server.transport.close()  # what the process's death does to its sockets
    assert len(ended) == 1 and isinstance(ended[0], PeerLost), ended
