"""The asyncio floor: a bare uvloop + pyzmq ask/echo, written without troupe, in two processes.

Blocking pyzmq (raw.py) never pays an event loop's wake-up; any asyncio program does. This is
the least such a program does for an ask: the client creates a future per ask, keeps it by id,
sends one msgpack frame ``[id, payload]`` on a DEALER with NOBLOCK, and awaits the future; a
reader callback on the socket's descriptor reads every reply, unpacks it and settles its future.
The server, a ROUTER on its own uvloop, unpacks each request and packs its answer from the
reader callback. Both watch ZeroMQ's edge-triggered descriptor as any correct program must:
readers drain until EAGAIN, and a send made outside a read schedules one look at ``EVENTS``
per loop turn. Same payload, process boundary and TCP loopback as troupe's ask figures; the
contexts' I/O threads run under SCHED_BATCH as troupe's do, so the ratio to this floor measures
the runtime's own work, not a context option.
"""

from __future__ import annotations

import asyncio
import multiprocessing as mp
import os
import time
from typing import Any, cast

import msgpack
import uvloop
import zmq

from .raw import CurvePairs, connect_curve, serve_curve
from .stopping import deaf_to_ctrl_c, start_deaf

__all__ = ["floor_echo_round_trips"]

_NOBLOCK = int(zmq.NOBLOCK)
_SNDMORE = int(zmq.SNDMORE)
_EVENTS = int(zmq.EVENTS)
_POLLIN = int(zmq.POLLIN)


def _context() -> zmq.Context[Any]:
    ctx: zmq.Context[Any] = zmq.Context()
    policy = getattr(os, "SCHED_BATCH", None)
    if policy is not None:
        try:
            ctx.set(zmq.THREAD_SCHED_POLICY, policy)
        except zmq.ZMQError:
            pass
    return ctx


def _small_payload(kind: str) -> bytes:
    if kind != "small":
        raise ValueError(f"the asyncio floor measures small asks only, got kind {kind!r}")
    return b"x" * 100


async def _serve(sock: zmq.Socket[bytes], stop_after: int) -> None:
    loop = asyncio.get_running_loop()
    done = loop.create_future()
    served = 0

    def readable() -> None:
        nonlocal served
        while True:
            try:
                identity = sock.recv(_NOBLOCK)
                body = sock.recv(_NOBLOCK)
            except zmq.Again:
                return
            msg_id, payload = msgpack.unpackb(body)
            sock.send(identity, _NOBLOCK | _SNDMORE)
            sock.send(msgpack.packb([msg_id, payload]), _NOBLOCK)
            served += 1
            if served == stop_after and not done.done():
                done.set_result(None)

    fd = sock.fileno()
    loop.add_reader(fd, readable)
    try:
        readable()  # anything that came before the reader was added
        await done
    finally:
        loop.remove_reader(fd)


def _echo(endpoint_q: Any, stop_after: int, curve: CurvePairs | None) -> None:
    ctx = _context()
    sock = ctx.socket(zmq.ROUTER)
    serve_curve(sock, curve)
    port = sock.bind_to_random_port("tcp://127.0.0.1")
    endpoint_q.put(f"tcp://127.0.0.1:{port}")
    try:
        uvloop.run(_serve(sock, stop_after))
    finally:
        sock.close(linger=-1)
        ctx.term()


async def _ask_loop(sock: zmq.Socket[bytes], n: int, window: int, payload: bytes) -> float:
    loop = asyncio.get_running_loop()
    pending: dict[int, asyncio.Future[Any]] = {}
    look_scheduled = False

    def readable() -> None:
        while True:
            try:
                body = sock.recv(_NOBLOCK)
            except zmq.Again:
                return
            msg_id, result = msgpack.unpackb(body)
            fut = pending.pop(msg_id, None)
            if fut is not None and not fut.done():
                fut.set_result(result)

    def look() -> None:
        # A send may have taken the descriptor's edge: see whether input waits.
        nonlocal look_scheduled
        look_scheduled = False
        if cast(int, sock.getsockopt(_EVENTS)) & _POLLIN:
            readable()

    ids = iter(range(1, n + 1))

    async def asker(count: int) -> None:
        nonlocal look_scheduled
        for _ in range(count):
            msg_id = next(ids)
            fut = loop.create_future()
            pending[msg_id] = fut
            sock.send(msgpack.packb([msg_id, payload]), _NOBLOCK)
            if not look_scheduled:
                look_scheduled = True
                loop.call_soon(look)
            await fut

    fd = sock.fileno()
    loop.add_reader(fd, readable)
    try:
        per = n // window
        t0 = time.perf_counter()
        async with asyncio.TaskGroup() as tg:
            for _ in range(window):
                tg.create_task(asker(per))
        return per * window / (time.perf_counter() - t0)
    finally:
        loop.remove_reader(fd)


def floor_echo_round_trips(n: int, window: int, kind: str, curve: CurvePairs | None = None) -> float:
    """Round trips per second of a bare uvloop + pyzmq ask through an echo, ``window`` outstanding.

    Raises:
        ValueError: ``kind`` is not ``small`` (asks are measured with small payloads only).
    """
    payload = _small_payload(kind)
    per = n // window
    mpctx = mp.get_context("spawn")
    endpoint_q = mpctx.Queue()
    # The server stops after the warm-up ask and the timed ones.
    asks = 1 + per * window
    echo = mpctx.Process(target=deaf_to_ctrl_c, args=(_echo, endpoint_q, asks, curve), daemon=True)
    start_deaf(echo)
    try:
        ctx = _context()
        sock = ctx.socket(zmq.DEALER)
        connect_curve(sock, curve)
        sock.connect(endpoint_q.get(timeout=30))
        try:
            # One ask before timing, as troupe's Source does: connected (and, with CURVE,
            # handshaken) before the clock starts.
            sock.send(msgpack.packb([0, payload]))
            sock.recv()
            return uvloop.run(_ask_loop(sock, per * window, window, payload))
        finally:
            sock.close(0)
            ctx.term()
    finally:
        echo.join(5)
        if echo.is_alive():
            echo.kill()
            echo.join(5)
