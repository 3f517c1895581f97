"""A raw ROUTER standing in for an asked process (a worker, a node, a master): the test decides
when it answers and when its connection ends, as the process's death would end it."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import zmq

from troupe.runtime.wire.codec import Codec

WITHIN_S = 30.0  # a bound on a hang, not on speed


class RawPeer:
    """A ROUTER on a context of its own, at a free loopback port; ``with`` it to have it gone at the end."""

    def __init__(self) -> None:
        self.ctx: zmq.Context[Any] = zmq.Context()
        self.sock = self.ctx.socket(zmq.ROUTER)
        self.endpoint = f"tcp://127.0.0.1:{self.sock.bind_to_random_port('tcp://127.0.0.1')}"

    def receive(self) -> tuple[bytes, int]:
        """The asker's identity and the ask's id, once it arrives (bounded)."""
        assert self.sock.poll(int(WITHIN_S * 1000)), "the ask never arrived"
        identity, *frames = self.sock.recv_multipart()
        return identity, Codec().decode(frames).msg_id

    def answer(self, identity: bytes, msg_id: int, payload: Any) -> None:
        self.sock.send_multipart([identity, *Codec().encode_reply(msg_id, "n/peer", payload)])

    def die(self) -> None:
        """What the process's death does to its connections: they close."""
        if not self.ctx.closed:
            self.sock.close(0)
            self.ctx.term()

    def __enter__(self) -> RawPeer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.die()  # gone by the end of the test, whatever happened


async def goes_mid_call(peer: RawPeer, call: Callable[[], Awaitable[Any]]) -> BaseException | None:
    """Run ``call`` (an ask to ``peer``), end the peer's connection once the ask arrived, and
    return what the call raised (None if it returned)."""
    ended: list[BaseException] = []

    async def ask() -> None:
        try:
            await call()
        except Exception as exc:
            ended.append(exc)

    with anyio.fail_after(WITHIN_S):
        async with anyio.create_task_group() as tg:
            tg.start_soon(ask)
            await anyio.to_thread.run_sync(peer.receive)
            peer.die()
    return ended[0] if ended else None
