"""Actor semantics over the in-memory transport, and the same semantics on the local fast path.

Most tests run twice: ``remote`` sends from one Runtime to an actor of another through the
codec and a MemoryTransport; ``local`` sends to an actor of the same Runtime (no codec, no
transport). Both must give the same results and raise the same errors.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import anyio
import msgpack
import numpy as np
import pytest
import structlog

from troupe.runtime import (
    Actor,
    ActorRef,
    ActorStopped,
    AskTimeout,
    MailboxFull,
    RemoteError,
    Runtime,
    UnknownActor,
    UnknownMessageType,
    handles,
)
from troupe.runtime.errors import EncodeError, MessageTooLarge, TroupeError
from troupe.runtime.lowlevel import Codec, Envelope, Kind, MemoryHub, MemoryTransport

BOUND = 5.0  # seconds; every wait is bounded by it and normally takes milliseconds
NODE = "n"
PATHS = ["local", "remote"]


def explode_on_purpose(payload: Any) -> None:
    """Raise from a function whose name the remote traceback must show."""
    raise ValueError(f"asked to fail: {payload}")


class Recorder(Actor):
    """Records tells, echoes asks, fails on request, and can be held on an event."""

    def __init__(self, log: list[str] | None = None) -> None:
        self.seen: list[Any] = []
        self.log = log if log is not None else []
        self.entered = anyio.Event()
        self.release = anyio.Event()

    @handles("rec")
    def rec(self, payload: Any) -> None:
        self.seen.append(payload)
        self.log.append(f"rec:{payload}")

    @handles("seen")
    def get_seen(self, _: Any) -> list[Any]:
        return list(self.seen)

    @handles("echo")
    def echo(self, payload: Any) -> Any:
        return payload

    @handles("fail")
    def fail(self, payload: Any) -> None:
        explode_on_purpose(payload)

    @handles("fail_troupe")
    def fail_troupe(self, _: Any) -> None:
        raise UnknownActor("a nested lookup inside the handler failed")

    @handles("context")
    def describe(self, _: Any) -> dict[str, Any]:
        ctx = self.context
        assert ctx is not None
        return {"type": ctx.type, "sender": ctx.sender, "headers": ctx.headers, "is_ask": ctx.is_ask}

    @handles("block")
    async def block(self, payload: Any) -> Any:
        self.entered.set()
        await self.release.wait()
        self.seen.append(payload)
        return payload

    async def started(self) -> None:
        self.log.append("started")

    async def restarted(self, reason: str) -> None:
        self.log.append(f"restarted:{reason}")

    async def stopping(self) -> None:
        self.log.append("stopping")


class SmallRecorder(Recorder):
    """A Recorder whose mailbox holds two messages."""

    mailbox_capacity = 2


class BrokenStart(Actor):
    """Fails in its started hook."""

    @handles("x")
    def x(self, _: Any) -> None:
        return None

    async def started(self) -> None:
        raise RuntimeError("cannot open my resource")


@dataclass
class Pair:
    """Two runtimes on one hub: ``a`` sends, ``b`` hosts the actors under test."""

    hub: MemoryHub
    a: Runtime
    b: Runtime

    def ref(self, path: str, name: str) -> ActorRef:
        """A reference to ``name`` in ``b``: from ``a`` (remote) or from ``b`` itself (local).

        For ``remote`` the directory of ``a`` learns the actor's own mailbox, as a node's
        ``resolve`` would answer; a name ``b`` does not host points at ``b``'s process mailbox.
        """
        if path == "remote":
            cell = self.b.cells.get(name)
            self.a.directory.learn(f"{NODE}/b/{name}", cell.endpoint if cell else self.b.address)
            return self.a.ref(f"{NODE}/b/{name}")
        return self.b.ref(name)


@asynccontextmanager
async def _pair(b_capacity: int = 1000, **b_options: Any) -> AsyncIterator[Pair]:
    # A short drain keeps a failing test (with an actor left blocked) from hiding behind a timeout.
    b_options.setdefault("drain_timeout", 0.5)
    hub = MemoryHub()
    ta = hub.transport(name="a")
    tb = hub.transport(capacity=b_capacity, name="b")
    async with Runtime(NODE, "a", ta, ask_timeout=BOUND) as a, Runtime(NODE, "b", tb, **b_options) as b:
        a.directory.learn(f"{NODE}/b", tb.address)
        b.directory.learn(f"{NODE}/a", ta.address)
        yield Pair(hub, a, b)


async def _collector(
    transport: MemoryTransport,
    out: list[Envelope],
    got: anyio.Event,
    want: list[int],
    *,
    task_status: Any = anyio.TASK_STATUS_IGNORED,
) -> None:
    """Serve a bare transport (a foreign client) and decode what comes back to it."""
    codec = Codec()

    async def on_message(_route: Any, frames: list[Any]) -> None:
        out.append(codec.decode(frames))
        if len(out) >= want[0]:
            got.set()

    await transport.serve(on_message, task_status=task_status)


# -- basic messaging ------------------------------------------------------------------------


@pytest.mark.parametrize("path", PATHS)
async def test_tells_are_handled_in_order(path: str) -> None:
    """Tells from one sender are handled one at a time in the order they were sent."""
    with anyio.fail_after(BOUND):
        async with _pair() as pair:
            await pair.b.spawn(Recorder, "rec")
            ref = pair.ref(path, "rec")
            for i in range(200):
                await ref.tell("rec", i)
            assert await ref.ask("seen") == list(range(200))


@pytest.mark.parametrize("path", PATHS)
async def test_ask_returns_the_handler_result(path: str) -> None:
    """An ask returns what the handler returned, arrays included."""
    payload = {"n": 1, "arr": np.arange(6, dtype=np.float32).reshape(2, 3), "s": ["x", None]}
    with anyio.fail_after(BOUND):
        async with _pair() as pair:
            await pair.b.spawn(Recorder, "rec")
            got = await pair.ref(path, "rec").ask("echo", payload)
    assert got["n"] == 1 and got["s"] == ["x", None]
    np.testing.assert_array_equal(got["arr"], payload["arr"])


@pytest.mark.parametrize("path", PATHS)
async def test_handler_sees_message_context(path: str) -> None:
    """A handler can read the type, sender, headers and ask-ness of its message."""
    with anyio.fail_after(BOUND):
        async with _pair() as pair:
            await pair.b.spawn(Recorder, "rec")
            got = await pair.ref(path, "rec").ask("context", headers={"credits": 2})
    sender = f"{NODE}/a" if path == "remote" else f"{NODE}/b"
    assert got == {"type": "context", "sender": sender, "headers": {"credits": 2}, "is_ask": True}


# -- timeouts -------------------------------------------------------------------------------


async def test_ask_timeout_discards_the_late_reply() -> None:
    """A tiny ask timeout raises AskTimeout; the late reply is counted and dropped; the actor goes on."""
    with anyio.fail_after(BOUND):
        async with _pair() as pair:
            actor = Recorder()
            await pair.b.spawn(actor, "rec")
            ref = pair.ref("remote", "rec")
            with pytest.raises(AskTimeout, match="block"):
                await ref.ask("block", "slow", timeout=0.1)
            assert actor.entered.is_set()  # it was handled, just not in time
            assert pair.a.statistics().pending_asks == 0
            actor.release.set()
            # replies travel in order: once this one is back, the late one has arrived too
            assert await ref.ask("echo", "after") == "after"
            stats = pair.a.statistics()
    assert stats.late_replies == 1
    assert actor.seen == ["slow"]


async def test_local_ask_timeout_leaves_the_actor_serving() -> None:
    """On the fast path an ask times out alike, and the actor's later result is dropped."""
    with anyio.fail_after(BOUND):
        async with _pair() as pair:
            actor = Recorder()
            ref = await pair.b.spawn(actor, "rec")
            with pytest.raises(AskTimeout):
                await ref.ask("block", "slow", timeout=0.1)
            actor.release.set()
            assert await ref.ask("echo", "after") == "after"
    assert actor.seen == ["slow"]


# -- errors ---------------------------------------------------------------------------------


@pytest.mark.parametrize("path", PATHS)
async def test_handler_exception_becomes_remote_error(path: str) -> None:
    """A raising handler gives RemoteError with type, message and traceback; the actor goes on."""
    with anyio.fail_after(BOUND):
        async with _pair() as pair:
            await pair.b.spawn(Recorder, "rec")
            ref = pair.ref(path, "rec")
            with pytest.raises(RemoteError) as info:
                await ref.ask("fail", "now")
            assert await ref.ask("echo", 5) == 5
            stats = pair.b.statistics().actors["rec"]
    err = info.value
    assert err.remote_type == "builtins.ValueError"
    assert err.remote_message == "asked to fail: now"
    assert "explode_on_purpose" in err.remote_traceback
    assert err.actor == f"{NODE}/b/rec"
    assert err.code == "remote_error"
    assert stats["failed"] == 1 and stats["handled"] == 2


@pytest.mark.parametrize("path", PATHS)
async def test_handler_troupe_error_is_not_a_delivery_error(path: str) -> None:
    """A TroupeError raised inside a handler arrives as RemoteError, not as that delivery error."""
    with anyio.fail_after(BOUND):
        async with _pair() as pair:
            await pair.b.spawn(Recorder, "rec")
            with pytest.raises(RemoteError) as info:
                await pair.ref(path, "rec").ask("fail_troupe")
    assert info.value.remote_type == "troupe.runtime.errors.UnknownActor"


@pytest.mark.parametrize("path", PATHS)
async def test_failing_tell_is_logged_and_the_actor_goes_on(path: str) -> None:
    """A tell whose handler raises is logged with its traceback; later messages are handled."""
    with anyio.fail_after(BOUND), structlog.testing.capture_logs() as logs:
        async with _pair() as pair:
            await pair.b.spawn(Recorder, "rec")
            ref = pair.ref(path, "rec")
            await ref.tell("fail", "quietly")
            await ref.tell("rec", 1)
            assert await ref.ask("seen") == [1]
    failed = [e for e in logs if e["event"] == "handler_failed"]
    assert len(failed) == 1
    assert "explode_on_purpose" in failed[0]["traceback"]


@pytest.mark.parametrize("path", PATHS)
async def test_unknown_actor(path: str) -> None:
    """Asking an actor that does not exist raises UnknownActor."""
    with anyio.fail_after(BOUND):
        async with _pair() as pair:
            await pair.b.spawn(Recorder, "rec")
            with pytest.raises(UnknownActor, match="nobody"):
                await pair.ref(path, "nobody").ask("echo", 1)


async def test_unknown_local_name_without_directory() -> None:
    """A bare name that is not local and has no directory to ask raises UnknownActor at once."""
    with anyio.fail_after(BOUND):
        async with _pair() as pair:
            with pytest.raises(UnknownActor):
                await pair.b.ref("ghost").tell("rec", 1)


@pytest.mark.parametrize("path", PATHS)
async def test_unknown_message_type(path: str) -> None:
    """Asking for a type the actor has no handler for raises UnknownMessageType naming the known ones."""
    with anyio.fail_after(BOUND):
        async with _pair() as pair:
            await pair.b.spawn(Recorder, "rec")
            ref = pair.ref(path, "rec")
            with pytest.raises(UnknownMessageType, match=r"'dance'.*echo"):
                await ref.ask("dance")
            assert await ref.ask("echo", 1) == 1


async def test_local_tell_of_unknown_type_fails_at_once() -> None:
    """On the fast path even a tell learns at once that the type is unknown."""
    with anyio.fail_after(BOUND):
        async with _pair() as pair:
            ref = await pair.b.spawn(Recorder, "rec")
            with pytest.raises(UnknownMessageType):
                await ref.tell("dance")


async def test_fast_path_and_remote_agree() -> None:
    """The same operations give the same results and the same error classes on both paths."""

    async def outcome(ref: ActorRef, msg_type: str, payload: Any) -> Any:
        try:
            return ("ok", await ref.ask(msg_type, payload))
        except TroupeError as exc:
            return (type(exc), exc.code, getattr(exc, "remote_type", None))

    cases = [("echo", [1, {"a": [2, 3]}]), ("fail", 1), ("dance", None), ("fail_troupe", None)]
    with anyio.fail_after(BOUND):
        async with _pair() as pair:
            await pair.b.spawn(Recorder, "rec")
            for msg_type, payload in cases:
                local = await outcome(pair.ref("local", "rec"), msg_type, payload)
                remote = await outcome(pair.ref("remote", "rec"), msg_type, payload)
                assert local == remote, msg_type
            assert await outcome(pair.ref("local", "nobody"), "echo", 1) == await outcome(
                pair.ref("remote", "nobody"), "echo", 1
            )


async def test_fast_path_passes_payloads_by_reference() -> None:
    """As the README says, the local fast path skips the codec: the payload object itself arrives (a set too),
    while the wire refuses a set."""
    with anyio.fail_after(BOUND):
        async with _pair() as pair:
            await pair.b.spawn(Recorder, "rec")
            with pytest.raises(EncodeError):
                await pair.ref("remote", "rec").ask("echo", {1, 2})
            payload = {1, 2}
            assert await pair.ref("local", "rec").ask("echo", payload) is payload


# -- backpressure ---------------------------------------------------------------------------


async def test_local_tell_without_blocking_raises_mailbox_full() -> None:
    """With the actor busy and its mailbox of 2 full, tell(block=False) raises; none accepted is lost."""
    with anyio.fail_after(BOUND):
        async with _pair() as pair:
            actor = SmallRecorder()
            ref = await pair.b.spawn(actor, "small")
            await ref.tell("block", 0, block=False)
            await actor.entered.wait()
            accepted = [0]
            refused = []
            for i in range(1, 6):
                try:
                    await ref.tell("block", i, block=False)
                    accepted.append(i)
                except MailboxFull:
                    refused.append(i)
            assert accepted == [0, 1, 2] and refused == [3, 4, 5]
            actor.release.set()
            assert await ref.ask("seen") == accepted
            stats = pair.b.statistics().actors["small"]
    assert stats["mailbox_high_water"] == 2
    assert stats["handled"] == 4


async def test_local_blocking_tell_waits_for_room() -> None:
    """A blocking tell to a full mailbox waits (backpressure) and is handled once there is room."""
    with anyio.fail_after(BOUND):
        async with _pair() as pair:
            actor = SmallRecorder()
            ref = await pair.b.spawn(actor, "small")
            await ref.tell("block", 0)
            await actor.entered.wait()
            await ref.tell("block", 1)
            await ref.tell("block", 2)
            done = anyio.Event()

            async def producer(*, task_status: Any = anyio.TASK_STATUS_IGNORED) -> None:
                task_status.started()
                await ref.tell("block", 3)
                done.set()

            async with anyio.create_task_group() as tg:
                await tg.start(producer)
                assert not done.is_set()
                assert pair.b.cells["small"].mailbox.statistics().waited_puts == 1
                actor.release.set()
                await done.wait()
            assert await ref.ask("seen") == [0, 1, 2, 3]


async def test_remote_tell_without_blocking_raises_mailbox_full() -> None:
    """Remote tells with block=False raise MailboxFull at the bound; accepted ones run once, in order."""
    with anyio.fail_after(BOUND):
        async with _pair(b_capacity=2) as pair:
            actor = SmallRecorder()
            await pair.b.spawn(actor, "small")
            ref = pair.ref("remote", "small")
            await ref.tell("block", 0, block=False)
            await actor.entered.wait()
            accepted = [0]
            with pytest.raises(MailboxFull):
                for i in range(1, 50):
                    await ref.tell("block", i, block=False)
                    accepted.append(i)
            assert 1 < len(accepted) < 50
            actor.release.set()
            assert await ref.ask("seen") == accepted


# -- lifecycle ------------------------------------------------------------------------------


async def test_lifecycle_hooks_run_in_order() -> None:
    """started runs before the first message and stopping after the last, at shutdown."""
    log: list[str] = []
    with anyio.fail_after(BOUND):
        async with _pair() as pair:
            ref = await pair.b.spawn(Recorder, "rec", kwargs={"log": log})
            assert log == ["started"]
            await ref.tell("rec", 1)
            assert await ref.ask("seen") == [1]
    assert log == ["started", "rec:1", "stopping"]


async def test_restart_reason_reaches_restarted() -> None:
    """An actor spawned with a restart reason gets restarted(reason) instead of started()."""
    log: list[str] = []
    with anyio.fail_after(BOUND):
        async with _pair() as pair:
            await pair.b.spawn(Recorder, "rec", kwargs={"log": log}, restart_reason="exit 3 (killed)")
    assert log == ["restarted:exit 3 (killed)", "stopping"]


async def test_failing_started_hook_does_not_register_the_actor() -> None:
    """spawn raises the started hook's error and leaves the name free."""
    with anyio.fail_after(BOUND):
        async with _pair() as pair:
            with pytest.raises(RuntimeError, match="resource"):
                await pair.b.spawn(BrokenStart, "broken")
            assert "broken" not in pair.b.cells
            await pair.b.spawn(Recorder, "broken")


async def test_spawn_refuses_bad_and_taken_names() -> None:
    """Names must be non-empty, free of '/', and unique within the process."""
    with anyio.fail_after(BOUND):
        async with _pair() as pair:
            await pair.b.spawn(Recorder, "rec")
            for bad in ("", "a/b", "rec"):
                with pytest.raises(ValueError):
                    await pair.b.spawn(Recorder, bad)


# -- shutdown -------------------------------------------------------------------------------


async def test_shutdown_drains_queued_messages() -> None:
    """Messages queued when the runtime stops are handled before the stopping hook runs."""
    log: list[str] = []
    with anyio.fail_after(BOUND):
        async with _pair(drain_timeout=BOUND) as pair:
            ref = await pair.b.spawn(Recorder, "rec", kwargs={"log": log})
            for i in range(5):
                await ref.tell("rec", i)  # queued: the actor has not run yet
            assert pair.b.statistics().actors["rec"]["mailbox_depth"] == 5
    assert log == ["started", "rec:0", "rec:1", "rec:2", "rec:3", "rec:4", "stopping"]


async def test_shutdown_fails_queued_asks_with_actor_stopped() -> None:
    """Asks still queued when the drain timeout ends fail with ActorStopped."""
    results: list[Any] = []

    async def asker(ref: ActorRef, *, task_status: Any = anyio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        try:
            results.append(await ref.ask("echo", "queued"))
        except ActorStopped as exc:
            results.append(exc)

    with anyio.fail_after(BOUND):
        async with anyio.create_task_group() as tg, _pair(drain_timeout=0.01) as pair:
            actor = Recorder()
            ref = await pair.b.spawn(actor, "rec")
            await ref.tell("block", "stuck")
            await actor.entered.wait()
            await tg.start(asker, ref)
    assert len(results) == 1 and isinstance(results[0], ActorStopped)


async def test_stopping_runtime_fails_its_pending_remote_asks() -> None:
    """When the asking runtime stops, its asks still waiting for replies fail with ActorStopped."""
    hub = MemoryHub()
    tb = hub.transport(name="b")
    results: list[Any] = []
    actor = Recorder()

    async def asker(ref: ActorRef, *, task_status: Any = anyio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        try:
            results.append(await ref.ask("block", "never answered"))
        except ActorStopped as exc:
            results.append(exc)

    with anyio.fail_after(BOUND):
        async with Runtime(NODE, "b", tb) as b:
            await b.spawn(actor, "rec")
            async with anyio.create_task_group() as tg, Runtime(NODE, "a", hub.transport(name="a")) as a:
                a.directory.learn(f"{NODE}/b/rec", b.cells["rec"].endpoint)
                await tg.start(asker, a.ref(f"{NODE}/b/rec"))
                await actor.entered.wait()
                assert a.statistics().pending_asks == 1
            actor.release.set()
    assert len(results) == 1 and isinstance(results[0], ActorStopped)


async def test_messages_to_a_stopping_runtime_are_refused() -> None:
    """A remote ask that arrives while the target runtime shuts down fails with ActorStopped."""
    with anyio.fail_after(BOUND):
        async with _pair() as pair:
            await pair.b.spawn(Recorder, "rec")
            await pair.b.stop()
            with pytest.raises(ActorStopped):
                await pair.ref("remote", "rec").ask("echo", 1)
            with pytest.raises(ActorStopped):
                await pair.ref("local", "rec").tell("rec", 1)


async def test_in_flight_local_ask_fails_with_actor_stopped() -> None:
    """An ask whose handler is cut off by shutdown fails with ActorStopped, not a timeout."""
    results: list[Any] = []

    async def asker(ref: ActorRef, *, task_status: Any = anyio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        try:
            results.append(await ref.ask("block", "in flight", timeout=0.3))
        except TroupeError as exc:
            results.append(exc)

    with anyio.fail_after(BOUND):
        async with anyio.create_task_group() as tg, _pair(drain_timeout=0.01) as pair:
            actor = Recorder()
            ref = await pair.b.spawn(actor, "rec")
            await tg.start(asker, ref)
            await actor.entered.wait()
    assert len(results) == 1 and isinstance(results[0], ActorStopped), results


async def test_in_flight_remote_ask_fails_with_actor_stopped() -> None:
    """A remote ask whose handler is cut off by the target's shutdown fails with ActorStopped."""
    hub = MemoryHub()
    results: list[Any] = []
    actor = Recorder()

    async def asker(ref: ActorRef, *, task_status: Any = anyio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        try:
            results.append(await ref.ask("block", "in flight", timeout=0.3))
        except TroupeError as exc:
            results.append(exc)

    with anyio.fail_after(BOUND):
        async with (
            Runtime(NODE, "a", hub.transport(name="a")) as a,
            anyio.create_task_group() as tg,
            Runtime(NODE, "b", hub.transport(name="b"), drain_timeout=0.01) as b,
        ):
            await b.spawn(actor, "rec")
            a.directory.learn(f"{NODE}/b/rec", b.cells["rec"].endpoint)
            await tg.start(asker, a.ref(f"{NODE}/b/rec"))
            await actor.entered.wait()
    assert len(results) == 1 and isinstance(results[0], ActorStopped), results


# -- bad input ------------------------------------------------------------------------------


def _raw(
    kind: Kind, msg_id: int, target: str, msg_type: str, payload: Any = None, deadline: float | None = None
) -> list[Any]:
    env = Envelope(kind, msg_id, 0, "probe", target, msg_type, deadline, None, None, payload)
    return Codec().encode(env)


async def test_bad_frames_are_counted_answered_and_survived() -> None:
    """Bad frames are counted, answered with an ERROR (corr_id 0), and good traffic goes on."""
    good_header = _raw(Kind.ASK, 9, "rec", "echo")[0]
    bad_messages: list[list[Any]] = [
        [],
        [b"\x00\xffgarbage"],
        [good_header[: len(good_header) // 2]],
        [msgpack.packb([2, 1, 1, 0, "probe", "rec", "echo", None, None, None, None])],
        [msgpack.packb({"not": "an array"})],
        [good_header, b"unreferenced buffer"],
        [b"x" * 5000],
    ]
    expected_codes = [
        "bad_frame",
        "bad_frame",
        "bad_frame",
        "version_mismatch",
        "bad_frame",
        "bad_frame",
        "message_too_large",
    ]
    replies: list[Envelope] = []
    got = anyio.Event()
    want = [len(bad_messages)]
    with anyio.fail_after(BOUND), structlog.testing.capture_logs() as logs:
        async with _pair(codec=Codec(max_message_bytes=4096)) as pair:
            await pair.b.spawn(Recorder, "rec")
            probe = pair.hub.transport(name="probe")
            async with anyio.create_task_group() as tg:
                await tg.start(_collector, probe, replies, got, want)
                for frames in bad_messages:
                    await probe.send_raw(pair.b.address, frames)
                await got.wait()
                assert await pair.ref("remote", "rec").ask("echo", "still fine") == "still fine"
                assert pair.b.statistics().bad_frames == len(bad_messages)
                tg.cancel_scope.cancel()
            probe.close()
    assert [r.kind for r in replies] == [Kind.ERROR] * len(bad_messages)
    assert [r.payload["code"] for r in replies] == expected_codes
    assert all(r.corr_id == 0 and r.payload["message"] for r in replies)
    dropped = [e for e in logs if e["event"] == "bad_frame_dropped"]
    assert [e["code"] for e in dropped] == expected_codes


async def test_an_ask_over_the_receivers_bound_hears_why_at_once() -> None:
    """Refused unread for its size, the ask was answered with corr_id 0 and waited out its
    timeout as an AskTimeout (a pipeline's call: 600 s); it fails with the receiver's reason."""
    with anyio.fail_after(BOUND * 2):
        async with _pair(codec=Codec(max_message_bytes=4096)) as pair:
            await pair.b.spawn(Recorder, "rec")
            ref = pair.ref("remote", "rec")
            with pytest.raises(MessageTooLarge, match="exceeds the limit of 4096"):
                await ref.ask("echo", np.zeros(8000, dtype=np.uint8), timeout=BOUND)
            assert await ref.ask("echo", "still fine") == "still fine"


async def test_raw_client_gets_errors_correlated_and_expired_work_dropped() -> None:
    """A raw client's asks are answered by msg_id, bad targets get errors, expired asks are dropped."""
    replies: list[Envelope] = []
    got = anyio.Event()
    want = [3]
    with anyio.fail_after(BOUND):
        async with _pair() as pair:
            await pair.b.spawn(Recorder, "rec")
            probe = pair.hub.transport(name="probe")
            async with anyio.create_task_group() as tg:
                await tg.start(_collector, probe, replies, got, want)
                await probe.send_raw(pair.b.address, _raw(Kind.ASK, 11, "nobody", "echo"))
                await probe.send_raw(pair.b.address, _raw(Kind.ASK, 12, "rec", "dance"))
                await probe.send_raw(
                    pair.b.address, _raw(Kind.ASK, 13, "rec", "echo", "late", deadline=time.time() - 1)
                )
                await probe.send_raw(pair.b.address, _raw(Kind.ASK, 14, "rec", "echo", "on time"))
                await got.wait()
                tg.cancel_scope.cancel()
            probe.close()
            stats = pair.b.statistics().actors["rec"]
    answered = [(r.kind, r.corr_id) for r in replies]
    assert answered == [(Kind.ERROR, 11), (Kind.ERROR, 12), (Kind.REPLY, 14)]
    assert replies[0].payload["code"] == "unknown_actor"
    assert replies[1].payload["code"] == "unknown_message_type"
    assert replies[2].payload == "on time"
    assert stats["expired"] == 1 and stats["handled"] == 1
    assert stats["handled_at_once"] <= stats["handled"]  # an expired message is not counted as handled
