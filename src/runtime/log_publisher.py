"""A process's log stream: every line of its log file, published on a ZeroMQ PUB socket.

Two kinds of process publish one: a node, for every process of it, and a master started on its
own (``troupe master start``; a master inside a node logs to the node's file, which the node
streams). Every process of a node (the node, its supervisor, its workers) already appends its
JSON lines to ``<logs>/<node>.jsonl``, the master to ``<logs>/<master>.jsonl``. The publishing
process follows that file and publishes each complete line (:class:`LogPublisher`), rather than
each process publishing its own: the file is the one place all of them write to already, a
worker that crashes mid-line publishes nothing half-written, and no worker needs a socket or a
connection for its logs. The cost is a poll's delay (:data:`POLL_S`). Every writer rotates the
file by size itself, before a line that would take it past (:mod:`troupe.runtime.log_files`);
for a node the same poll rotates it as well, under the writers' lock, where a process that does
not rotate (a program running a node in its own process) wrote it past its size.

The socket binds the process's host on a free port (a node's where its workers bind, see
``node.reach``). A node's endpoint goes to the master in its beat (``log_endpoint``), the
master's own is in its ``status`` (``log_endpoint``), so ``troupe logs tail --master`` finds
every stream through the master. A message is four frames:

    name (utf-8, the topic: the node's, or the master's, as its lines name it) | incarnation
    (ascii: new each time the process starts) | sequence number (decimal ascii, 1 for the first
    line of the incarnation) | the JSON line (utf-8, no newline)

The stream never blocks the process and never grows without bound: past ``SNDHWM`` lines queued
for a subscriber, ZeroMQ drops that subscriber's lines. The process keeps its last
:data:`RECENT_LINES` lines (at most :data:`RECENT_BYTES`) in memory, and its ``log_recent
{after?, limit?}`` control (:meth:`LogPublisher.answer`) answers ``{incarnation, seq, lines:
[[seq, line], ...]}`` (the kept lines numbered above ``after``, the last ``limit`` of them): a
reader fetches its history there, and the lines that a gap in the numbers cost it (a slow
reader, a restart, the moment before its subscription took). The files are the complete
record; the stream is for watching.

The stream's last lines are the process's stop: its owner closes it (:meth:`LogPublisher.close`)
after its last line (``node_stopped``, ``master_stopped``), and the close reads the file once
more, publishes what it found and lets those lines leave for up to :data:`LAST_LINGER_MS`. A
close that dropped its socket at once, with no last read, lost every line since the last poll:
a tail never saw why a node's workers went away, nor a node that lived a few seconds at all.
"""

from __future__ import annotations

import secrets
from collections import deque
from pathlib import Path
from typing import Any

import anyio
import zmq

from troupe.runtime.core.control_payloads import ControlPayload
from troupe.runtime.errors import BadRequest
from troupe.runtime.library_logging import get_logger
from troupe.runtime.log_files import rotate_if_larger
from troupe.runtime.log_follower import FileFollower
from troupe.runtime.security.auth import gate_for
from troupe.runtime.security.process import installed
from troupe.runtime.start_limits import in_thread

from .node.reach import advertised_endpoint

__all__ = [
    "LAST_LINGER_MS",
    "POLL_S",
    "RECENT_BYTES",
    "RECENT_LINES",
    "SNDHWM",
    "LogPublisher",
    "decode_log_recent",
    "log_socket",
]

log = get_logger(__name__)

POLL_S = 0.2
SNDHWM = 10_000  # lines queued per subscriber before ZeroMQ drops that subscriber's lines
RECENT_LINES = 1000  # lines kept in memory for log_recent (a few hundred kB)
RECENT_BYTES = 4 << 20  # and at most this much of them, however long the lines
LAST_LINGER_MS = 200
"""How long a closing stream waits for its last lines to leave: bounded, as a stop must be."""


def log_socket(context: zmq.Context[Any], kind: int) -> zmq.Socket[Any]:
    """A socket of the log stream (PUB on a node or master, SUB in ``troupe logs tail``).

    The one place where the log stream's socket options are set. With the process's CURVE keys
    installed (``security.process``) the PUB is a CURVE server, in the context of the process's
    gate (its authenticator admits only authorised keys, reader keys included), and a SUB
    presents the process's key to the cluster's server key, as every other socket does.
    """
    sock: zmq.Socket[Any] = context.socket(kind)
    sock.setsockopt(zmq.LINGER, 0)
    if kind == zmq.SUB:  # reads nodes at IPv6 addresses too; a connect is said as given either way
        sock.setsockopt(zmq.IPV6, 1)
    keys = installed()
    if kind == zmq.PUB:
        sock.setsockopt(zmq.SNDHWM, SNDHWM)
        if keys is not None:
            sock.curve_secretkey = keys.secret
            sock.curve_publickey = keys.public
            sock.curve_server = True
    else:
        sock.setsockopt(zmq.RCVHWM, SNDHWM)
        if keys is not None:
            sock.curve_serverkey = keys.server_public
            sock.curve_publickey = keys.public
            sock.curve_secretkey = keys.secret
    return sock


def decode_log_recent(payload: Any) -> tuple[int, int]:
    """``(after, limit)`` of a ``log_recent {after?, limit?}`` control.

    Raises:
        BadRequest: not a map, or ``after`` or ``limit`` is not a count.
    """
    p = ControlPayload("log_recent", payload if payload is not None else {})
    after, limit = p.optional("after", int, 0), p.optional("limit", int, RECENT_LINES)
    if after < 0 or limit < 0:
        raise BadRequest(f"control 'log_recent': after and limit must be 0 or more, got {after}, {limit}")
    return after, limit


class LogPublisher:
    """Follows a log file, publishes its lines, and rotates it by size if asked to.

    Args:
        name: the stream's name (the topic of every message): the node's, or the master's.
        path: the log file (``<logs>/<name>.jsonl``).
        bind: where the stream binds: the process's host, port ``*``.
        advertise: the host other hosts reach the process at (``[node] advertise``), if any.
        max_bytes: rotate the file once it holds this much (a node's); None: its writer alone
            rotates it (the master's).
        keep: rotated files kept.
    """

    def __init__(
        self,
        name: str,
        path: Path,
        bind: str,
        advertise: str | None = None,
        max_bytes: int | None = None,
        keep: int = 5,
    ) -> None:
        self.name = name
        self.path = path
        self.max_bytes = max_bytes
        self.keep = keep
        self.published = 0
        self.rotations = 0
        self._rotation_failing = False  # said once, until a rotation succeeds
        self.incarnation = secrets.token_hex(4)
        self._recent: deque[tuple[int, bytes]] = deque()
        self._recent_bytes = 0
        self._closed = False
        self._topic = name.encode()
        keys = installed()
        # With keys, the gate's context: its authenticator vets every subscriber.
        self._own_context = keys is None
        self._context: zmq.Context[Any] = zmq.Context() if keys is None else gate_for(keys).context
        self._socket = log_socket(self._context, zmq.PUB)
        try:
            if bind.startswith("tcp://["):  # only there: an IPv4 one would be said ::ffff:127.0.0.1
                self._socket.setsockopt(zmq.IPV6, 1)
            self._socket.bind(bind)
            bound = self._socket.getsockopt_string(zmq.LAST_ENDPOINT)
        except BaseException:
            self.close()
            raise
        self.endpoint = advertised_endpoint(bound, advertise)
        # Only what is logged from now on is streamed; what came before is in the files.
        self._follower = FileFollower(path, at_end=True)

    async def run(self) -> None:
        """Publish and rotate every :data:`POLL_S` until cancelled. The owner closes the stream
        after its last line (:meth:`close`), not this: its stop's lines come after this ends."""
        log.info("log_stream_started", log_endpoint=self.endpoint)
        while True:
            await self.poll()
            if not self._follower.behind:
                await anyio.sleep(POLL_S)

    async def poll(self) -> None:
        """Publish what was appended since the last poll; rotate the file if it is too large."""
        self._publish(await in_thread(self._follower.read_lines, what="log_read_lines"))
        problem = self._follower.new_problem()
        if problem is not None:  # a directory in its place, say: the process logs on regardless
            log.warning(
                "log_file_unreadable", path=str(self.path), error=problem, streamed="once it can be read"
            )
        gap = self._follower.new_gap()
        if gap is not None:  # rotated files it could not read: what is on disk holds their lines
            log.warning("log_lines_skipped", path=str(self.path), error=gap)
        if self.max_bytes is None:
            return
        try:
            rotated = rotate_if_larger(self.path, self.max_bytes, self.keep)
        except OSError as exc:
            if not self._rotation_failing:  # not every poll: the file grows while it fails
                log.warning("log_rotation_failed", path=str(self.path), error=str(exc))
            self._rotation_failing = True
            return
        self._rotation_failing = False
        if rotated:
            self.rotations += 1
            log.info("log_rotated", path=str(self.path), keep=self.keep)

    def _publish(self, lines: list[bytes]) -> None:
        incarnation = self.incarnation.encode()
        for line in lines:
            self.published += 1
            self._keep(line)
            # PUB never blocks: at SNDHWM, ZeroMQ drops the line for that subscriber.
            self._socket.send_multipart(
                [self._topic, incarnation, str(self.published).encode(), line], zmq.NOBLOCK
            )

    def _keep(self, line: bytes) -> None:
        self._recent.append((self.published, line))
        self._recent_bytes += len(line)
        while len(self._recent) > RECENT_LINES or self._recent_bytes > RECENT_BYTES:
            self._recent_bytes -= len(self._recent.popleft()[1])

    def recent(self, after: int = 0, limit: int = RECENT_LINES) -> dict[str, Any]:
        """The reply to ``log_recent`` (see the module): the kept lines numbered above ``after``,
        the last ``limit`` of them."""
        lines = [[seq, line.decode("utf-8", "replace")] for seq, line in self._recent if seq > after]
        return {
            "incarnation": self.incarnation,
            "seq": self.published,
            "lines": lines[len(lines) - limit :] if limit else [],
        }

    def answer(self, payload: Any) -> dict[str, Any]:
        """The reply to a ``log_recent {after?, limit?}`` control (its payload decoded).

        Raises:
            BadRequest: as :func:`decode_log_recent`.
        """
        return self.recent(*decode_log_recent(payload))

    def close(self) -> None:
        """Publish what the file received since the last poll (the process's stop), then close
        the socket, its lines given up to :data:`LAST_LINGER_MS` to leave, and the file
        (idempotent). Blocks for that long at most, once."""
        if self._closed:
            return
        self._closed = True
        linger = 0
        if hasattr(self, "_follower"):  # not where the bind failed: nothing was published
            self._publish(self._follower.read_lines())
            self._follower.close()
            linger = LAST_LINGER_MS
        self._socket.close(linger=linger)
        if self._own_context:
            self._context.term()
