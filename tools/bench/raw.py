"""The raw ceilings: plain blocking pyzmq, no runtime, in two processes.

Each function runs in a child process (multiprocessing) and reports through a queue, so the
ceiling pays the same process boundary and TCP loopback as troupe does. Given ``curve`` keys
(``bench messaging --curve``), every socket authenticates and encrypts with CURVE, as troupe's
do with keys: the ceiling of the same work, encrypted.
"""

from __future__ import annotations

import multiprocessing as mp
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import zmq

from .stopping import deaf_to_ctrl_c, start_deaf

__all__ = ["CurvePairs", "connect_curve", "raw_echo_round_trips", "raw_one_way", "run_apart", "serve_curve"]

CurvePairs = tuple[bytes, bytes, bytes, bytes]
"""CURVE keys (Z85) for a raw pair of sockets: server public, server secret, client public,
client secret. Plain bytes, so that they travel to the measuring processes."""


def serve_curve(sock: zmq.Socket[bytes], curve: CurvePairs | None) -> None:
    """Make ``sock`` a CURVE server with the pairs' server keys (nothing without ``curve``)."""
    if curve is not None:
        sock.curve_publickey, sock.curve_secretkey = curve[0], curve[1]
        sock.curve_server = True


def connect_curve(sock: zmq.Socket[bytes], curve: CurvePairs | None) -> None:
    """Make ``sock`` a CURVE client of the pairs' server (nothing without ``curve``)."""
    if curve is not None:
        sock.curve_serverkey = curve[0]
        sock.curve_publickey, sock.curve_secretkey = curve[2], curve[3]


# Sent as a buffer. numpy declares an ndarray's ``__buffer__`` for Python 3.12 on only, so on 3.11
# mypy finds no overload of ``Socket.send`` for it: hence the ``type: ignore[call-overload]``s.
def _payload(kind: str) -> bytes | np.ndarray:
    if kind == "large":
        return np.ones(1 << 17, dtype=np.float64)  # 1 MiB
    return b"x" * 100


def _sink(endpoint_q: Any, result_q: Any, n: int, curve: CurvePairs | None = None) -> None:
    ctx = zmq.Context()
    sock = ctx.socket(zmq.ROUTER)
    sock.setsockopt(zmq.RCVHWM, 1000)
    serve_curve(sock, curve)
    port = sock.bind_to_random_port("tcp://127.0.0.1")
    endpoint_q.put(f"tcp://127.0.0.1:{port}")
    sock.recv_multipart(copy=False)
    t0 = time.perf_counter()
    for _ in range(n - 1):
        sock.recv_multipart(copy=False)
    result_q.put((n - 1) / (time.perf_counter() - t0))
    sock.close(0)
    ctx.term()


def _source(endpoint: str, n: int, kind: str, curve: CurvePairs | None = None) -> None:
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.SNDHWM, 1000)
    connect_curve(sock, curve)
    sock.connect(endpoint)
    payload = _payload(kind)
    for _ in range(n):
        sock.send(payload, copy=False)  # type: ignore[call-overload]
    sock.close(linger=-1)
    ctx.term()


def raw_one_way(n: int, kind: str, curve: CurvePairs | None = None) -> float:
    """Messages per second from a blocking DEALER to a blocking ROUTER in another process."""
    mpctx = mp.get_context("spawn")
    endpoint_q, result_q = mpctx.Queue(), mpctx.Queue()
    sink = mpctx.Process(target=deaf_to_ctrl_c, args=(_sink, endpoint_q, result_q, n, curve), daemon=True)
    start_deaf(sink)
    try:
        endpoint = endpoint_q.get(timeout=30)
        _source(endpoint, n, kind, curve)
        return float(result_q.get(timeout=120))
    finally:
        sink.join(5)
        if sink.is_alive():
            sink.kill()
            sink.join(5)


def _echo(endpoint_q: Any, stop_after: int, curve: CurvePairs | None = None) -> None:
    ctx = zmq.Context()
    sock = ctx.socket(zmq.ROUTER)
    serve_curve(sock, curve)
    port = sock.bind_to_random_port("tcp://127.0.0.1")
    endpoint_q.put(f"tcp://127.0.0.1:{port}")
    for _ in range(stop_after):
        frames = sock.recv_multipart(copy=False)
        sock.send_multipart(frames, copy=False)
    sock.close(linger=-1)
    ctx.term()


def raw_echo_round_trips(n: int, window: int, kind: str, curve: CurvePairs | None = None) -> float:
    """Round trips per second through a blocking ROUTER echo, with ``window`` outstanding."""
    mpctx = mp.get_context("spawn")
    endpoint_q = mpctx.Queue()
    echo = mpctx.Process(target=deaf_to_ctrl_c, args=(_echo, endpoint_q, n, curve), daemon=True)
    start_deaf(echo)
    try:
        ctx = zmq.Context()
        sock = ctx.socket(zmq.DEALER)
        connect_curve(sock, curve)
        sock.connect(endpoint_q.get(timeout=30))
        payload = _payload(kind)
        sent = got = 0
        t0 = time.perf_counter()
        while got < n:
            while sent < n and sent - got < window:
                sock.send(payload, copy=False)  # type: ignore[call-overload]
                sent += 1
            sock.recv(copy=False)
            got += 1
        rate = n / (time.perf_counter() - t0)
        sock.close(0)
        ctx.term()
        return rate
    finally:
        echo.join(5)
        if echo.is_alive():
            echo.kill()
            echo.join(5)


def _call_and_send(fn: Callable[[], float], conn: Any) -> None:
    conn.send(fn())
    conn.close()


def run_apart(fn: Callable[[], float], timeout_s: float = 300.0) -> float:
    """Call ``fn`` in a process of its own and return its result.

    The messaging benchmark takes raw and troupe runs in turn while its node is up; run in the
    benchmark's own process, a raw client would share the GIL with that node's event loop.
    """
    mpctx = mp.get_context("spawn")
    receiver, sender = mpctx.Pipe(duplex=False)
    # Not daemonic: fn starts a peer.
    proc = mpctx.Process(target=deaf_to_ctrl_c, args=(_call_and_send, fn, sender))
    start_deaf(proc)
    sender.close()
    try:
        if not receiver.poll(timeout_s):
            raise TimeoutError(f"raw measurement gave no result within {timeout_s} s")
        return float(receiver.recv())
    finally:
        receiver.close()
        proc.join(10)
        if proc.is_alive():
            proc.kill()
            proc.join(5)
