"""``troupe logs tail --master``: the live log streams of a cluster's nodes, in time order.

The master's ``status`` lists the nodes and where each publishes its log stream
(``log_endpoint``, see :mod:`troupe.runtime.log_publisher`), and says where the master publishes
its own (``log_endpoint`` beside ``master``; an older master, or one inside a node, whose lines
the node's stream has, says none): one SUB socket connects to every one of them. The master's
stream is one more, named as its lines name it (the master's name), its ``log_recent`` asked
at the master's endpoint. The master is asked again every :data:`REASK_S`: a node that joins
is connected, and a node or master that restarted on another port is connected there (ZeroMQ
reconnects by itself to an endpoint that comes back).

The history (``-n N``) is the last N lines of the nodes and the master together, taken in turns
(:func:`latest_in_turns`): each one's latest line, then each one's line before it, and so on,
so that a host whose clock is ahead does not push every other host out of it.

Each node's lines are numbered within its incarnation. The first line from an incarnation,
and a gap in the numbers (lines the stream dropped for a slow reader, or sent before the
subscription took), make the reader fetch what it missed from the node's ``log_recent``
control (its last lines, in memory); live lines of that node wait meanwhile. Lines from every
node wait :data:`WINDOW_S` in a reorder buffer and leave it in timestamp order.
"""

from __future__ import annotations

import heapq
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar, cast

import anyio
import zmq
import zmq.asyncio

from troupe.runtime.core.runtime import Runtime
from troupe.runtime.errors import AskTimeout, TroupeError, Unreachable
from troupe.runtime.log_publisher import RECENT_LINES, log_socket
from troupe.runtime.node.reach import advertised_endpoint, endpoint_host

from .cli_runtime import cli_runtime
from .log_filters import parse_record
from .log_stream_refusals import HANDSHAKE_EVENTS, StreamRefusals
from .master_client import keys_hint

__all__ = ["REASK_S", "WINDOW_S", "ClusterLogs", "ReorderBuffer", "latest_in_turns", "stamped"]

REASK_S = 1.0
WINDOW_S = 0.3
_CALL_S = 5.0

Accept = Callable[[str, str], bool]  # (line, node) -> shown?
Emit = Callable[[str, str], None]  # (node, line)
T = TypeVar("T")


def stamped(lines: list[str], last: str = "") -> list[tuple[str, str]]:
    """``(timestamp, line)`` of each of one source's lines; a line without one (not JSON) takes
    the stamp of the line before it (``last`` before the first)."""
    out = []
    for line in lines:
        rec = parse_record(line)
        stamp = rec.get("timestamp") if rec is not None else None
        last = stamp if isinstance(stamp, str) else last
        out.append((last, line))
    return out


def latest_in_turns(sources: list[list[tuple[str, T]]], n: int) -> list[T]:
    """The last ``n`` of several sources' stamped lines (each oldest first), in time order.

    The lines are taken in turns: every source's last line, then every source's line before
    it, and so on, the newer first within a turn. A timestamp is its host's own clock: taking
    the newest ``n`` of all of them showed only the host whose clock was ahead. Then they are
    interleaved by timestamp: a stable sort, not a merge, for the lines of one file written by
    several processes may be a little out of time order themselves.
    """
    if n <= 0:
        return []
    turns = [  # (turn, stamp, source, position): turn 0 is each source's last line
        (len(lines) - 1 - pos, stamp, s, pos)
        for s, lines in enumerate(sources)
        for pos, (stamp, _) in enumerate(lines)
    ]
    turns.sort(key=lambda t: t[1], reverse=True)  # the newer first within a turn...
    turns.sort(key=lambda t: t[0])  # ...turn by turn (a stable sort keeps the first order)
    chosen = {(s, pos) for _, _, s, pos in turns[:n]}
    picked = [line for s, lines in enumerate(sources) for pos, line in enumerate(lines) if (s, pos) in chosen]
    picked.sort(key=lambda sl: sl[0])
    return [item for _, item in picked]


@dataclass(order=True)
class _Held:
    stamp: str
    order: int
    arrived: float = field(compare=False)
    node: str = field(compare=False)
    line: str = field(compare=False)


class ReorderBuffer:
    """Lines of several streams, each released once it has waited ``window_s``, in timestamp
    order (a line waits as well for any earlier-stamped line that arrived after it).

    A line without a timestamp (not JSON) takes the stamp of the line before it from its node.
    """

    def __init__(self, window_s: float = WINDOW_S, clock: Callable[[], float] = time.monotonic) -> None:
        self.window_s = window_s
        self.clock = clock
        self._heap: list[_Held] = []
        self._order = 0
        self._last_stamp: dict[str, str] = {}

    def __len__(self) -> int:
        return len(self._heap)

    def add(self, node: str, line: str) -> None:
        """Hold ``line`` of ``node``."""
        rec = parse_record(line)
        stamp = rec.get("timestamp") if rec is not None else None
        if isinstance(stamp, str):
            self._last_stamp[node] = stamp
        else:
            stamp = self._last_stamp.get(node, "")
        self._order += 1
        heapq.heappush(self._heap, _Held(stamp, self._order, self.clock(), node, line))

    def release(self, everything: bool = False) -> list[tuple[str, str]]:
        """The lines whose wait is over (all with ``everything``), in timestamp order."""
        cutoff = self.clock() - self.window_s
        out = []
        while self._heap and (everything or self._heap[0].arrived <= cutoff):
            held = heapq.heappop(self._heap)
            out.append((held.node, held.line))
        return out


@dataclass
class _NodeStream:
    endpoint: str = ""
    incarnation: str = ""
    last: int = 0
    catching_up: bool = False
    # Its recent lines could not be fetched at the start: its first live line starts it, rather
    # than a catch-up that would print old lines as new.
    unfetched: bool = False
    waiting: list[tuple[int, str]] = field(default_factory=list)  # live lines during a catch-up


class ClusterLogs:
    """Follows the log streams of a cluster's nodes through its master.

    Args:
        master: the master's endpoint.
        nodes: only these nodes (empty: every node).
        accept: which lines to show, as ``accept(line, node)``.
        history: lines of recent history to show first, from all the nodes together.
        warn: where notes for the user go (a node that is not there, a master that went away).
    """

    def __init__(
        self, master: str, nodes: frozenset[str], accept: Accept, history: int, warn: Callable[[str], None]
    ) -> None:
        self.master = master
        self.nodes = nodes
        self.accept = accept
        self.history = history
        self.warn = warn
        self.buffer = ReorderBuffer()
        self.bad_messages = 0
        self._streams: dict[str, _NodeStream] = {}
        self._node_endpoints: dict[str, str] = {}
        self._master_down: str | None = None  # why the master is not followed, as last said
        self._warned_missing: set[str] = set()
        self._dead: set[str] = set()  # nodes the master has for dead: not asked for their lines
        self.following = True  # run's ``follow``: a node not there yet is waited for

    async def run(self, emit: Emit, follow: bool = True) -> None:
        """Print (through ``emit``) the history, then, with ``follow``, every new line until
        cancelled."""
        self.following = follow
        context = zmq.asyncio.Context()
        sub = cast(zmq.asyncio.Socket, log_socket(context, zmq.SUB))
        sub.setsockopt(zmq.SUBSCRIBE, b"")
        monitor: zmq.asyncio.Socket | None = None
        try:
            async with cli_runtime("cli-logs") as runtime:
                # Before any connect: a stream that refuses this follower's keys is said, not
                # followed in silence (log_stream_refusals.py).
                monitor = sub.get_monitor_socket(HANDSHAKE_EVENTS)
                refusals = StreamRefusals(sub, self.warn, self._stream_at)
                await self._start(runtime, sub, emit)
                if not follow:
                    return
                async with anyio.create_task_group() as tg:
                    tg.start_soon(refusals.read, monitor)
                    tg.start_soon(self._rediscover, runtime, sub)
                    tg.start_soon(self._flush, emit)
                    await self._receive(runtime, sub, tg)
        finally:
            if monitor is not None:
                sub.disable_monitor()
                monitor.close(linger=0)
            sub.close(linger=0)
            context.term()

    async def _start(self, runtime: Runtime, sub: zmq.Socket[Any], emit: Emit) -> None:
        """Connect to every node the master knows, and print their history, in time order."""
        try:
            status = await runtime.control(self.master, "status", None, timeout=_CALL_S)
        except AskTimeout as exc:  # as ctl says it: a keyed cluster ignores a peer without keys
            raise AskTimeout(f"{exc}{keys_hint()}") from None
        if not (isinstance(status, dict) and "master" in status):  # a node given as --master
            raise TroupeError(
                f"{self.master} answered, but not as a master (a node? --master takes the "
                "master's endpoint; a node's log is followed with --logs DIR on its host)"
            )
        self._connect(sub, status)
        found: dict[str, list[str]] = {}
        async with anyio.create_task_group() as tg:
            for node, stream in self._streams.items():
                tg.start_soon(self._fetch_history, runtime, node, stream, found)
        for node, line in latest_in_turns(
            [[(stamp, (node, line)) for stamp, line in stamped(found[node])] for node in sorted(found)],
            self.history,
        ):
            emit(node, line)

    async def _fetch_history(
        self, runtime: Runtime, node: str, stream: _NodeStream, found: dict[str, list[str]]
    ) -> None:
        reply = await self._recent(runtime, node, 0, RECENT_LINES if self.history else 0)
        if reply is None:
            stream.unfetched = True
            return
        stream.incarnation, stream.last = str(reply["incarnation"]), int(reply["seq"])
        lines = [line for _, line in reply["lines"] if self.accept(line, node)]
        found[node] = lines[len(lines) - self.history :] if self.history else []

    async def _recent(self, runtime: Runtime, node: str, after: int, limit: int) -> dict[str, Any] | None:
        endpoint = self._node_endpoints.get(node)
        if not endpoint:
            return None
        if node in self._dead:  # asked anyway, each call waited out its 5 s for nothing
            self.warn(f"node {node}: the master has it for dead: not asked; its files have its lines")
            return None
        try:
            reply = await runtime.control(
                endpoint, "log_recent", {"after": after, "limit": limit}, timeout=_CALL_S
            )
        except Exception as exc:  # gone, or an older node: the live stream still flows
            self.warn(f"node {node}: its recent lines could not be fetched ({exc}); the files have them")
            return None
        return reply if isinstance(reply, dict) else None

    def _connect(self, sub: zmq.Socket[Any], status: dict[str, Any]) -> None:
        known = set()
        for info in status.get("nodes", []):
            node, log_endpoint = str(info.get("node", "")), str(info.get("log_endpoint") or "")
            known.add(node)
            if info.get("alive") is False:
                self._dead.add(node)
            else:
                self._dead.discard(node)
            if self.nodes and node not in self.nodes:
                continue
            self._node_endpoints[node] = str(info.get("endpoint", ""))
            self._follow(sub, node, log_endpoint)
        master, log_endpoint = str(status.get("master", "")), str(status.get("log_endpoint") or "")
        if log_endpoint:
            known.add(master)
            if not self.nodes or master in self.nodes:
                self._node_endpoints[master] = self.master
                # A master bound on every interface says a wildcard: it is where we reach it.
                self._follow(sub, master, advertised_endpoint(log_endpoint, endpoint_host(self.master)))
        for node in sorted(self.nodes - known - self._warned_missing):
            self._warned_missing.add(node)
            self.warn(
                f"--node {node}: the master knows no such node (yet); waiting for it"
                if self.following
                else f"--node {node}: the master knows no such node: no lines of it to show"
            )

    def _stream_at(self, log_endpoint: str) -> str | None:
        """The stream followed at ``log_endpoint``, as the notes name it."""
        for name, stream in self._streams.items():
            if stream.endpoint == log_endpoint:
                return (
                    f"the master ({name})"
                    if self._node_endpoints.get(name) == self.master
                    else f"node {name}"
                )
        return None

    def _follow(self, sub: zmq.Socket[Any], name: str, log_endpoint: str) -> None:
        """Follow the stream ``name`` at ``log_endpoint`` (its new one, after a restart)."""
        stream = self._streams.setdefault(name, _NodeStream())
        if not log_endpoint or log_endpoint == stream.endpoint:
            return
        if stream.endpoint:
            sub.disconnect(stream.endpoint)
        sub.connect(log_endpoint)
        stream.endpoint = log_endpoint

    async def _rediscover(self, runtime: Runtime, sub: zmq.Socket[Any]) -> None:
        while True:
            await anyio.sleep(REASK_S)
            try:
                status = await runtime.control(self.master, "status", None, timeout=_CALL_S)
            except Exception as exc:
                # Said again when the why changes: a master restarted on a rotated pair is first
                # silent (down), then refuses these keys, which nothing else would say.
                why = "refused" if isinstance(exc, Unreachable) else "silent"
                if self._master_down != why:
                    self.warn(
                        f"the master at {self.master} refuses this follower ({exc}); following "
                        "the nodes known, and the master's lines again once its keys and these agree"
                        if why == "refused"
                        else f"the master at {self.master} does not answer ({exc}); following the nodes known"
                    )
                self._master_down = why
                continue
            if self._master_down:
                self.warn(f"the master at {self.master} answers again")
            self._master_down = None
            self._connect(sub, status)

    async def _flush(self, emit: Emit) -> None:
        while True:
            for node, line in self.buffer.release():
                emit(node, line)
            await anyio.sleep(0.05)

    async def _receive(self, runtime: Runtime, sub: zmq.asyncio.Socket, tg: anyio.abc.TaskGroup) -> None:
        while True:
            missed = self.arrived(await sub.recv_multipart())
            if missed is not None:
                tg.start_soon(self.catch_up, runtime, *missed)

    def arrived(self, frames: list[bytes]) -> tuple[str, int] | None:
        """Take one message of a stream: hold its line, or keep it while the lines before it are
        fetched. Returns ``(node, after)`` when that node's lines numbered above ``after`` must
        be fetched first (:meth:`catch_up`)."""
        try:
            node, incarnation, seq = (f.decode() for f in frames[:3])
            number, line = int(seq), frames[3].decode("utf-8", "replace")
            if len(frames) != 4:
                raise ValueError(f"{len(frames)} frames")
        except (ValueError, IndexError, UnicodeDecodeError):
            self.bad_messages += 1
            return None
        stream = self._streams.get(node)
        if stream is None:  # not one we asked for (a port another node had before)
            return None
        if stream.catching_up:
            stream.waiting.append((number, line))
        elif stream.unfetched:
            stream.unfetched = False
            stream.incarnation, stream.last = incarnation, number
            self._hold(node, line)
        elif incarnation != stream.incarnation or number > stream.last + 1:
            after = stream.last if incarnation == stream.incarnation else 0
            stream.incarnation, stream.catching_up = incarnation, True
            stream.waiting.append((number, line))
            return node, after
        elif number == stream.last + 1:
            stream.last = number
            self._hold(node, line)
        # else: a line already had from log_recent
        return None

    async def catch_up(self, runtime: Runtime, node: str, after: int) -> None:
        """Fetch ``node``'s lines numbered above ``after`` (its ``log_recent``), then release the
        live lines that waited for them, each line once."""
        stream = self._streams[node]
        reply = await self._recent(runtime, node, after, RECENT_LINES)
        last = after
        if reply is not None and str(reply["incarnation"]) == stream.incarnation:
            for number, line in reply["lines"]:
                if number > last:
                    last = number
                    self._hold(node, line)
        for number, line in sorted(stream.waiting):
            if number > last:
                last = number
                self._hold(node, line)
        stream.waiting.clear()
        stream.last, stream.catching_up = last, False

    def _hold(self, node: str, line: str) -> None:
        if self.accept(line, node):
            self.buffer.add(node, line)
