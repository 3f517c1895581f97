"""Why a log stream of ``troupe logs tail --master`` brings nothing: its handshake is refused.

A node restarted without this follower's key (revoked), or on another cluster pair (rotated),
refuses the SUB socket's handshake at each of ZeroMQ's retries; the follower followed it in
silence, its lines gone without a word, while ``ctl`` with the same keys said why at once. The
SUB socket's monitor is read for those refusals, told apart as every connection of the runtime
tells them (``transports/zmq_peer_loss.py``), and each is said once per stream.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import zmq
import zmq.asyncio
from zmq.utils.monitor import parse_monitor_message

from troupe.runtime.security.process import installed
from troupe.runtime.transports.zmq_peer_loss import PeerLossWatch
from troupe.runtime.transports.zmq_socket import Watched

__all__ = ["HANDSHAKE_EVENTS", "StreamRefusals"]

HANDSHAKE_EVENTS = (
    zmq.EVENT_HANDSHAKE_SUCCEEDED
    | zmq.EVENT_HANDSHAKE_FAILED_AUTH
    | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL
    | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
)


class StreamRefusals:
    """Says, through ``warn``, each log stream whose handshake refuses this follower.

    Args:
        sub: the follower's SUB socket.
        warn: where the line goes.
        name_of: the stream (node or master) connected at an endpoint, None if none is.
    """

    def __init__(
        self, sub: zmq.Socket[Any], warn: Callable[[str], None], name_of: Callable[[str], str | None]
    ) -> None:
        keys = installed()
        server_key = keys.directory / "cluster.key" if keys is not None else None
        self._watch = PeerLossWatch(lambda _: None, self._refused, server_key)
        self._sub = sub
        self._warn = warn
        self._name_of = name_of
        self._peers: dict[str, Watched] = {}
        self._said: set[tuple[str, str]] = set()

    def heard(self, endpoint: str, kind: object, value: object) -> None:
        """One event of the SUB socket's monitor, on its connection to ``endpoint``."""
        peer = self._peers.get(endpoint)
        if peer is None:
            peer = self._peers[endpoint] = Watched(self._sub, endpoint, is_router=False)
        self._watch.heard(peer, kind, value)

    async def read(self, monitor: zmq.asyncio.Socket) -> None:
        """Take every event of ``monitor`` (the SUB socket's) until cancelled."""
        while True:
            event = parse_monitor_message(await monitor.recv_multipart())
            self.heard(event["endpoint"].decode(), event["event"], event["value"])

    def _refused(self, peer: Watched, why: str, _: bool) -> None:
        name = self._name_of(peer.peer)
        if name is None or (name, why) in self._said:
            return
        self._said.add((name, why))
        self._warn(
            f"{name}: its log stream refuses this follower ({why}); its lines are not shown "
            "until its keys and these agree"
        )
