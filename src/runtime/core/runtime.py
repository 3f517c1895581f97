"""The runtime of one process: it hosts actors, routes messages and owns every task.

``Runtime`` is entered as an async context manager. Inside, a task group owns the transport's
receive loops, one task per actor, and control handlers; nothing outlives the block. Leaving
it (or ``stop``) shuts down gracefully: stop accepting, drain mailboxes up to a deadline, run
``stopping`` hooks, fail pending asks with ActorStopped, close the transport.

Messages to actors of this same process take a local fast path: no codec, no socket, the
same mailbox bound and the same error semantics.

Two rules keep the seams few. A process starts its own runtime one way,
:func:`process_runtime` (a ZeroMQ transport, bound where given); ``Runtime(...)`` with another
transport is for tests. Control handlers are added one way, :meth:`Runtime.register_control`,
which refuses a name that is taken: two parts of a process cannot silently answer one control.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Protocol

import anyio

from troupe.runtime.errors import (
    ActorStopped,
    AskTimeout,
    MailboxFull,
    PeerLost,
    UnknownActor,
    Unreachable,
)
from troupe.runtime.library_logging import get_logger
from troupe.runtime.security.keys import CurveKeys
from troupe.runtime.security.process import installed
from troupe.runtime.transports.base import Transport
from troupe.runtime.transports.zmq import ZmqTransport
from troupe.runtime.wire.codec import K_ASK, K_TELL, Codec, Envelope, Kind

from .actor import Actor
from .cell import Cell, Msg
from .deadlines import AskDeadlines
from .directory import Directory
from .live_lookup import resolve_live
from .loading import load_actor_class
from .message_deadline import TTL
from .peer_limits import PeerLogGate
from .ref import ActorAddress, ActorRef
from .router import Inbound
from .throttle import PeerThrottle

__all__ = ["ControlHandler", "HandleObserver", "Runtime", "RuntimeStats", "process_runtime"]

log = get_logger(__name__)

ControlHandler = Callable[[Any], Awaitable[Any]]
"""A control's handler, payload in, reply out: an ``async`` function (run as a task of its own),
or a plain one that must not block and returns a :class:`~troupe.runtime.core.router.Answer`
(awaitable too: the router answers it from a callback, without a task)."""

# Bad frames that come back on our own connections (nobody to answer or throttle): one log line
# per this many seconds.
JUNK_LOG_INTERVAL_S = 10.0


_LOST_MOST = 4096  # ended endpoints remembered (a string each)


class HandleObserver(Protocol):
    """Told when an actor starts and ends handling a message (the worker's status record)."""

    def begin(self, actor: str, msg_type: str) -> None: ...

    def end(self) -> None: ...


@dataclass(frozen=True, slots=True)
class RuntimeStats:
    """Counters of one runtime, for ``ctl status`` and tests."""

    address: str
    actors: dict[str, Any]
    pending_asks: int
    bad_frames: int
    late_replies: int
    # Replies and errors dropped because the asker's connection would not take them (it did not
    # read for the transport's linger, or is gone), over every mailbox of the process; per actor
    # in ``actors``.
    replies_dropped: int = 0
    # Bad frames left unanswered: each one took a peer past its allowance and throttled it.
    errors_suppressed: int = 0
    # The throttle of peers that send bad frames (core/throttle.py): peers throttled now, times
    # a peer was throttled, and messages dropped unread because their peer was throttled.
    throttled_peers: int = 0
    throttles: int = 0
    dropped_from_throttled: int = 0


class Runtime(Inbound):
    """Hosts the actors of one process.

    Args:
        node: the node (host) name.
        process: this process's name, unique on its node.
        transport: how messages leave and arrive.
        directory: name resolution (defaults to a cache with no lookup).
        codec: wire codec (defaults to 64 MiB message limit).
        ask_timeout: default seconds an ask waits for its reply.
        drain_timeout: seconds shutdown waits for mailboxes to drain.
        throttle: the allowance of bad frames per peer (defaults to PeerThrottle's).
    """

    def __init__(
        self,
        node: str,
        process: str,
        transport: Transport,
        directory: Directory | None = None,
        codec: Codec | None = None,
        ask_timeout: float = 30.0,
        drain_timeout: float = 5.0,
        throttle: PeerThrottle | None = None,
    ) -> None:
        self.node = node
        self.process = process
        self.transport = transport
        self.directory = directory or Directory(node)
        self.codec = codec or Codec()
        self.ask_timeout = ask_timeout
        self.drain_timeout = drain_timeout
        self.cells: dict[str, Cell] = {}
        self._controls: dict[str, ControlHandler] = {}
        # Read-only: handlers are added with register_control, never written here.
        self.control_handlers: Mapping[str, ControlHandler] = MappingProxyType(self._controls)
        self.progress_hooks: list[Callable[[int, str | None], None]] = []
        self.before_handle: list[Callable[[str, str], Awaitable[Any]]] = []
        self.observer: HandleObserver | None = None
        self._pending: dict[int, asyncio.Future[Any]] = {}
        # The endpoint each pending remote ask went to: ended at once (PeerLost) when the
        # connection to that process ends (its transport's ``on_peer_lost``).
        self._asked: dict[int, str] = {}
        # Endpoints whose connection ended (their process died, or was restarted elsewhere): a
        # ref that still names one resolves afresh before it sends (oldest forgotten past the
        # bound). A ref held across its worker's restart sent its next ask to the dead process
        # and waited out the deadline, and a tell was lost without a word.
        self._lost: dict[str, None] = {}
        self._deadlines: AskDeadlines | None = None  # the timer of every ask, made on the running loop
        self._ids = itertools.count(1)
        self._tg: anyio.abc.TaskGroup | None = None
        self._accepting = False
        self._stopped = anyio.Event()
        self._bad_frames = 0
        self._late_replies = 0
        self._throttle = throttle or PeerThrottle()
        self._reply_junk_log = PeerLogGate(JUNK_LOG_INTERVAL_S)
        self._errors_suppressed = 0
        self._process_key = f"{node}/{process}"
        self._guarded = getattr(transport, "security", None) is not None  # roles apply (router)
        self.directory.learn(self._process_key, transport.address)

    @property
    def address(self) -> str:
        """The mailbox endpoint of this process."""
        return self.transport.address

    # -- control handlers ----------------------------------------------------------------------

    def register_control(self, name: str, handler: ControlHandler) -> None:
        """Answer the control message ``name`` with ``handler`` (payload in, reply out).

        Raises:
            ValueError: ``name`` has a handler already (two parts of the process would
                answer the same control), or is empty.
        """
        if not name:
            raise ValueError("a control message needs a name")
        if name in self._controls:
            raise ValueError(
                f"the control {name!r} is registered already in {self._process_key}: "
                f"{self._controls[name]!r}; unregister it first to replace it"
            )
        self._controls[name] = handler

    def register_controls(self, handlers: Mapping[str, ControlHandler]) -> None:
        """:meth:`register_control` for each of ``handlers``, by name (all checked first).

        Raises:
            ValueError: a name has a handler already; none of ``handlers`` is then added.
        """
        taken = sorted(set(handlers) & set(self._controls))
        if taken:
            raise ValueError(
                f"the controls {taken} are registered already in {self._process_key}; "
                "unregister them first to replace them"
            )
        for name, handler in handlers.items():
            self.register_control(name, handler)

    def unregister_control(self, name: str) -> ControlHandler:
        """Stop answering the control ``name``; return its handler.

        Raises:
            KeyError: no handler is registered under ``name``.
        """
        try:
            return self._controls.pop(name)
        except KeyError:
            raise KeyError(f"no control {name!r} is registered in {self._process_key}") from None

    # -- lifecycle ----------------------------------------------------------------------------

    async def __aenter__(self) -> Runtime:
        if self._stopped.is_set():  # its transport is closed: it sent nothing, and said EBADF
            raise self._closed_error()
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # anyio's trio backend: "no running event loop", said of nothing
            self.transport.close()  # no __aexit__ follows: its sockets would be left open
            raise RuntimeError(
                "troupe runs on asyncio (or uvloop) only; under anyio use anyio.run(..., backend='asyncio')"
            ) from None
        self._deadlines = AskDeadlines(loop)
        self._tg = anyio.create_task_group()
        await self._tg.__aenter__()
        # Accepting before serving: a message that arrives while the transport starts must be
        # delivered (or get UnknownActor), not be told that the process is shutting down.
        self._accepting = True
        if hasattr(self.transport, "sync_handler"):
            self.transport.sync_handler = self._on_frames_now
        if hasattr(self.transport, "on_peer_lost"):
            self.transport.on_peer_lost = self._peer_lost
        if hasattr(self.transport, "on_peer_refused"):
            self.transport.on_peer_refused = self._peer_refused
        try:
            await self._tg.start(self.transport.serve, self._on_frames)
        except BaseException:
            # A caller's move_on_after that ran out here (a test's wait_for on a loaded machine):
            # no __aexit__ follows a failed __aenter__, so the task group entered above must be
            # left now, or the caller's own scope is not the current one when it exits.
            self._accepting = False
            await self._leave()
            raise
        return self

    async def __aexit__(self, *exc: object) -> None:
        try:
            await self.stop()
        finally:
            await self._leave()

    async def _leave(self) -> None:
        assert self._tg is not None
        self._tg.cancel_scope.cancel()
        try:
            await self._tg.__aexit__(None, None, None)
        finally:
            # Also when a caller's cancellation (a move_on_after around the block) ends that
            # wait with its exception: the transport was then never closed, and its ZeroMQ
            # context, collected later with its sockets open, blocked the process in term().
            self.transport.close()
            if self._deadlines is not None:
                self._deadlines.close()
                self._deadlines = None  # an ask now is refused as one on a closed runtime
            self._stopped.set()

    async def stop(self) -> None:
        """Stop accepting, drain every mailbox up to ``drain_timeout``, run stopping hooks."""
        if not self._accepting:
            return
        self._accepting = False
        cells = list(self.cells.values())
        for cell in cells:
            cell.mailbox.close()
        for cell in cells:
            cell.stop_requested_hook()
        with anyio.move_on_after(self.drain_timeout):
            for cell in cells:
                await cell.done.wait()
        for cell in cells:
            for msg in cell.mailbox.drain():
                await self._fail(msg, ActorStopped(f"actor {cell.name} stopped before handling it"))
            await cell.stop_hook()
        for fut in self._pending.values():
            if not fut.done():
                fut.set_exception(ActorStopped("the runtime stopped before the reply came"))
        self._pending.clear()
        self._asked.clear()

    async def wait_stopped(self) -> None:
        """Wait until the runtime has shut down."""
        await self._stopped.wait()

    def start_soon(self, fn: Callable[..., Coroutine[Any, Any, Any]], *args: Any) -> None:
        """Run a background task owned by this runtime (cancelled at shutdown)."""
        if self._tg is None:
            raise RuntimeError("the runtime is not running; use 'async with Runtime(...)'")
        self._tg.start_soon(fn, *args)

    # -- actors -------------------------------------------------------------------------------

    async def spawn(
        self,
        actor: type[Actor] | Actor | str,
        name: str,
        *,
        kwargs: dict[str, Any] | None = None,
        restart_reason: str | None = None,
    ) -> ActorRef:
        """Start an actor in this process and return its reference.

        Args:
            actor: an Actor subclass, an instance, or an import path ``pkg.module:Class``.
            name: unique within this process.
            kwargs: constructor arguments (when a class or path is given).
            restart_reason: set when the process was restarted; runs ``restarted`` hook.

        Raises:
            ValueError: the name is taken or empty.
            ConfigError: the import path does not name an Actor subclass.
        """
        if not name or "/" in name:
            raise ValueError(f"bad actor name {name!r}: it must be non-empty and have no '/'")
        if name in self.cells:
            raise ValueError(f"an actor named {name!r} already runs in {self.process}")
        if isinstance(actor, str):
            actor = load_actor_class(actor)
        instance = actor(**(kwargs or {})) if isinstance(actor, type) else actor
        instance.address = ActorAddress(self.node, self.process, name)
        instance.runtime = self
        cell = Cell(self, instance, name)
        cell.endpoint = self.transport.open_mailbox()
        self.cells[name] = cell
        self.directory.learn(str(instance.address), cell.endpoint)
        try:
            if restart_reason is not None:
                await instance.restarted(restart_reason)
            else:
                await instance.started()
        except BaseException:
            del self.cells[name]
            raise
        self.start_soon(cell.run)
        log.info("actor_started", actor=name, cls=type(instance).__qualname__)
        return self.ref(name)

    def ref(self, address: str | ActorAddress) -> ActorRef:
        """Return a reference; local names resolve at once, others on first use."""
        addr = address if isinstance(address, ActorAddress) else ActorAddress.parse(address)
        ref = ActorRef(self, addr)
        if addr.actor in self.cells and addr.node in ("", self.node) and addr.process in ("", self.process):
            ref.cell = self.cells[addr.actor]
        return ref

    def progress(self, n: int = 1, note: str | None = None) -> None:
        """Forward an actor's progress report to the hooks (the heartbeat status record)."""
        for hook in self.progress_hooks:
            hook(n, note)

    def statistics(self) -> RuntimeStats:
        """Return a snapshot of this runtime."""
        dropped = self.transport.replies_dropped()
        return RuntimeStats(
            self.address,
            {
                name: {**cell.statistics(), "replies_dropped": dropped.get(cell.endpoint, 0)}
                for name, cell in self.cells.items()
            },
            len(self._pending),
            self._bad_frames,
            self._late_replies,
            sum(dropped.values()),
            self._errors_suppressed,
            self._throttle.throttled_now(),
            self._throttle.throttles,
            self._throttle.dropped,
        )

    # -- sending ------------------------------------------------------------------------------

    def _context(self) -> tuple[str, str | None]:
        cell = Cell.current.get()
        if cell is None:
            return self._process_key, None
        msg = cell.handling
        return cell.sender, msg.trace if msg is not None else None

    async def _resolve(self, ref: ActorRef, within: float | None = None) -> None:
        """Point ``ref`` at its actor's cell here or its process's endpoint; ``within``: the
        most seconds to wait while the directory still names a process known dead."""
        addr = ref.address
        if addr.actor in self.cells and addr.node in ("", self.node) and addr.process in ("", self.process):
            ref.cell = self.cells[addr.actor]
            return
        if not addr.process and self.directory.lookup is None:
            raise UnknownActor(f"no actor named {addr.actor!r} in {self.node}/{self.process}")
        full, endpoint = await resolve_live(self.directory, self._lost, addr, within)
        ref.address = full
        if full.node == self.node and full.process == self.process:
            cell = self.cells.get(full.actor)
            if cell is None:
                raise UnknownActor(f"no actor named {full.actor!r} in {self.node}/{self.process}")
            ref.cell = cell
        else:
            ref.endpoint = endpoint  # not one whose connection ended (``resolve_live``)

    async def _resolve_again(self, ref: ActorRef, within: float | None = None) -> None:
        """``ref`` names an endpoint whose connection ended: forget it and resolve afresh, where
        there is a directory to ask (a route only taught, as the engine's replicas, stays)."""
        if self.directory.lookup is None:
            return
        self._peer_gone(ref)
        await self._resolve(ref, within)

    async def tell_ref(
        self, ref: ActorRef, msg_type: str, payload: Any, block: bool, headers: dict[str, Any] | None
    ) -> None:
        """Send a tell through ``ref`` (``ActorRef.tell`` calls this; resolves ``ref`` first)."""
        if ref.cell is None and ref.endpoint is None:
            await self._resolve(ref)
        elif self._lost and ref.endpoint in self._lost:
            await self._resolve_again(ref)
        sender, trace = self._context()
        msg_id = next(self._ids)
        cell = ref.cell
        if cell is not None:
            msg = Msg(K_TELL, msg_id, sender, msg_type, None, trace, headers, payload, None, None)
            await cell.deliver(msg, block)
            return
        frames = self.codec.encode_message(
            K_TELL, msg_id, sender, ref.address.actor, msg_type, None, trace, headers, payload
        )
        if not self._try_send(ref, frames):  # most sends need no waiting, nor a coroutine
            await self._send(ref, frames, block)

    def _try_send(self, ref: ActorRef, frames: list[Any]) -> bool:
        """Send if the peer's queue has room now; False, having sent nothing, otherwise."""
        endpoint = ref.endpoint
        assert endpoint is not None
        try:
            return self.transport.try_send(endpoint, frames)
        except Unreachable:
            if self._stopped.is_set():
                raise self._closed_error() from None
            self._peer_gone(ref)
            raise

    async def _send(self, ref: ActorRef, frames: list[Any], block: bool) -> None:
        endpoint = ref.endpoint
        assert endpoint is not None
        try:
            if not self.transport.try_send(endpoint, frames):  # most sends need no waiting
                await self.transport.send(endpoint, frames, block=block)
        except Unreachable:
            if self._stopped.is_set():
                raise self._closed_error() from None
            self._peer_gone(ref)
            raise

    def _peer_gone(self, ref: ActorRef) -> None:
        if ref.endpoint is not None:
            self.transport.forget(ref.endpoint)
        self.directory.forget(str(ref.address))
        ref.invalidate()

    async def ask_ref(
        self,
        ref: ActorRef,
        msg_type: str,
        payload: Any,
        timeout: float | None,
        headers: dict[str, Any] | None,
    ) -> Any:
        """Send an ask through ``ref`` and await its reply (``ActorRef.ask`` calls this)."""
        timeout = self.ask_timeout if timeout is None else timeout
        if ref.cell is None and ref.endpoint is None:
            await self._resolve(ref, timeout)
        elif self._lost and ref.endpoint in self._lost:
            await self._resolve_again(ref, timeout)
        # Every ask comes here: ``_watched_future``, ``_context``, ``_try_send`` and
        # ``_settled`` are inlined (a Python call each less per ask), with the same semantics.
        deadlines = self._deadlines
        if deadlines is None:
            raise self._not_running()
        fut = deadlines.future(timeout, ref.address, msg_type)
        msg_id = next(self._ids)
        asker = Cell.current.get()
        if asker is None:
            sender, trace = self._process_key, None
        else:
            handling = asker.handling
            sender, trace = asker.sender, handling.trace if handling is not None else None
        deadline = time.monotonic() + timeout
        try:
            cell = ref.cell
            if cell is not None:
                msg = Msg(K_ASK, msg_id, sender, msg_type, deadline, trace, headers, payload, None, fut)
                await cell.deliver(msg, True)
            else:
                endpoint = ref.endpoint
                assert endpoint is not None
                self._pending[msg_id] = fut
                self._asked[msg_id] = endpoint
                # The wall-clock deadline for receivers older than the ttl (message_deadline.py).
                frames = self.codec.encode_message(
                    K_ASK,
                    msg_id,
                    sender,
                    ref.address.actor,
                    msg_type,
                    time.time() + timeout,
                    trace,
                    {TTL: timeout} if headers is None else {**headers, TTL: timeout},
                    payload,
                )
                try:
                    try:
                        sent = self.transport.try_send(endpoint, frames)
                    except Unreachable:
                        self._peer_gone(ref)
                        raise
                    if not sent:
                        await self._send(ref, frames, False)
                except MailboxFull:
                    with anyio.fail_after(max(0.0, deadline - time.monotonic())):
                        await self._send(ref, frames, True)
            return await fut
        except TimeoutError as exc:
            if not isinstance(exc, AskTimeout):
                raise AskTimeout(
                    f"ask {msg_type!r} to {ref.address}: mailbox stayed full for {timeout}s"
                ) from None
            if ref.endpoint is not None and self.directory.lookup is not None:
                self._peer_gone(ref)  # it may have restarted elsewhere: resolve afresh next time
            raise
        finally:
            # ``_settled``, inlined.
            self._pending.pop(msg_id, None)
            self._asked.pop(msg_id, None)
            if not fut.done():
                fut.cancel()  # the asker was cancelled: the deadline no longer concerns anyone
            elif not fut.cancelled():
                fut.exception()  # a timeout that fired while the send still waited: seen

    def _watched_future(self, timeout: float, target: object, msg_type: str) -> asyncio.Future[Any]:
        """A future for a reply, failed with AskTimeout ``timeout`` seconds from now."""
        deadlines = self._deadlines
        if deadlines is None:
            raise self._not_running()
        return deadlines.future(timeout, target, msg_type)

    def _not_running(self) -> RuntimeError:
        if self._stopped.is_set():
            return self._closed_error()
        return RuntimeError("the runtime is not running; use 'async with Runtime(...)'")

    def _closed_error(self) -> RuntimeError:
        """What a use of this runtime after its block ended is told: a usage error, not
        Unreachable (a ConnectionError, which a caller's retry loop would retry forever)."""
        return RuntimeError(
            f"this runtime ({self._process_key}) was closed (its 'async with connect(...)' ended); "
            "connect again for a new one"
        )

    def _peer_lost(self, endpoint: str) -> None:
        """The connection to the process at ``endpoint`` ended (it died or stopped), and the
        replies it sent first are in: the asks still waiting on it end now, not at their
        deadlines, and a ref that names it resolves afresh before its next send."""
        self._lost[endpoint] = None
        if len(self._lost) > _LOST_MOST:
            del self._lost[next(iter(self._lost))]
        self._fail_asks_to(
            endpoint,
            lambda target, msg_type: PeerLost(
                f"ask {msg_type!r} to {target}: the connection to {endpoint} ended before "
                "the reply came (its process died or stopped); whether it was handled is unknown"
            ),
        )

    def _peer_refused(self, endpoint: str, why: str) -> None:
        """The CURVE handshake with the process at ``endpoint`` failed for keys (``why``, the
        transport's words: this process's key is not authorised there, or the server key it
        holds is not that process's): the asks waiting on it end now, saying so, rather than at
        their deadlines (ZeroMQ tries again, refused again)."""
        self._fail_asks_to(
            endpoint, lambda target, msg_type: Unreachable(f"ask {msg_type!r} to {target}: {why}")
        )

    def _fail_asks_to(self, endpoint: str, error: Callable[[object, str], BaseException]) -> None:
        """End the asks waiting on ``endpoint`` now with ``error(target, msg_type)``."""
        pending = self._pending
        waiting = {pending[m] for m, peer in self._asked.items() if peer == endpoint and m in pending}
        if waiting and self._deadlines is not None:  # each ask's deadline knows what it asked of whom
            self._deadlines.fail(waiting, error)

    def _settled(self, msg_id: int, fut: asyncio.Future[Any]) -> None:
        self._pending.pop(msg_id, None)
        self._asked.pop(msg_id, None)
        if fut.done():
            if not fut.cancelled():
                fut.exception()  # a timeout that fired while the send still waited: seen
        else:
            fut.cancel()  # the asker was cancelled: the deadline no longer concerns anyone

    async def control(
        self, endpoint: str, msg_type: str, payload: Any = None, *, timeout: float = 5.0
    ) -> Any:
        """Send a control message to the process listening at ``endpoint`` and await the reply.

        A message the connection cannot take at once (the peer's queue at its high-water mark,
        or no connection up at this moment, as after a refused CURVE handshake) waits for room
        until the deadline: the timeout bounds the whole call, the send included.

        Raises:
            AskTimeout: nothing answered in time (is a node running there?).
            RemoteError, DeliveryError: the control handler failed.
        """
        fut = self._watched_future(timeout, endpoint, msg_type)
        msg_id = next(self._ids)
        self._pending[msg_id] = fut
        self._asked[msg_id] = endpoint
        sender, trace = self._context()
        env = Envelope(
            Kind.CONTROL, msg_id, 0, sender, "", msg_type, time.time() + timeout, trace, None, payload
        )
        try:
            frames = self.codec.encode(env)  # a payload it cannot encode settles fut (finally)
            try:
                await self.transport.send(endpoint, frames, block=False)
            except MailboxFull:
                with anyio.move_on_after(timeout):  # past it, the deadline fails fut
                    await self.transport.send(endpoint, frames, block=True)
            return await fut
        finally:
            self._settled(msg_id, fut)


def process_runtime(
    node: str,
    process: str,
    *,
    bind: str = "tcp://127.0.0.1:*",
    hwm: int = 1000,
    transport: Transport | None = None,
    directory: Directory | None = None,
    codec: Codec | None = None,
    ask_timeout: float = 30.0,
    drain_timeout: float = 5.0,
    throttle: PeerThrottle | None = None,
    security: CurveKeys | None = None,
) -> Runtime:
    """The runtime a process starts for itself (node, worker, supervisor, master, a client).

    The one place a process's own runtime and its ZeroMQ transport are built; enter the result
    with ``async with``.

    Args:
        node: the node (host) name.
        process: this process's name, unique on its node.
        bind: the endpoint its control socket binds (a free loopback port by default).
        hwm: the ZeroMQ high-water mark of its sockets.
        transport: a transport to use instead of ZeroMQ (a test's memory transport);
            ``bind`` and ``hwm`` are then unused.
        directory: name resolution (defaults to a cache with no lookup).
        codec: wire codec (defaults to 64 MiB message limit).
        ask_timeout: default seconds an ask waits for its reply.
        drain_timeout: seconds shutdown waits for mailboxes to drain.
        throttle: the allowance of bad frames per peer (defaults to PeerThrottle's).
        security: CURVE keys for every socket; defaults to the process's keys
            (security.process.install), None there meaning no CURVE.

    Raises:
        Unreachable: ``bind`` cannot be bound (callers say what to do: pick another endpoint).
    """
    codec = codec or Codec()
    if transport is None:
        # libzmq drops a connection that sends a frame over the limit before Python sees it.
        transport = ZmqTransport(
            bind=bind,
            hwm=hwm,
            max_message_bytes=codec.max_message_bytes,
            security=security or installed(),
        )
    return Runtime(
        node,
        process,
        transport,
        directory,
        codec,
        ask_timeout=ask_timeout,
        drain_timeout=drain_timeout,
        throttle=throttle,
    )
