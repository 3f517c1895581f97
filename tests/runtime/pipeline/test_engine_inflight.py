"""The engine's calls per replica, without processes: a fake node and fake replicas whose
``process`` calls wait until the test answers them, so every interleaving is the test's choice.

What a user relies on: with ``inflight = 2`` a replica's next item is already sent while it
works on one (it never idles waiting for the engine), with ``inflight = 1`` never; credits still
bound every queue; the latency the engine reports is service time, not time queued behind the
call before; and a replica that answers in the old list form, or answers nonsense, does not
crash the run.
"""

from __future__ import annotations

import types
from collections import defaultdict
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import anyio
import anyio.abc
import numpy as np
import pytest

from troupe.runtime.errors import MessageTooLarge, PeerLost
from troupe.runtime.pipeline import call_fit, dispatch, item_outcomes, replica_calls
from troupe.runtime.pipeline import engine as engine_module
from troupe.runtime.pipeline import replicas as replicas_module
from troupe.runtime.pipeline.config import PipelineConfig
from troupe.runtime.pipeline.engine import PipelineEngine, PipelineResult
from troupe.runtime.pipeline.model import PipelineMetrics
from troupe.runtime.wire.codec import K_ASK, Codec

WAIT_S = 10  # bound on every wait for the engine to do something; never an upper bound on speed
DEFAULT = object()


@dataclass
class Call:
    """One outstanding ``process`` call: its replica, its items, and how the test answers it."""

    replica: str
    items: list[Any]
    answered: anyio.Event = field(default_factory=anyio.Event)
    reply: Any = None

    @property
    def stage(self) -> str:
        return self.replica.split("-")[1]  # "{pipeline}-{stage}-{n}"

    def answer(self, reply: Any = DEFAULT, actor_s: float | None = None) -> None:
        """Answer with ``reply``; by default every item ok as it came, in the current form."""
        if reply is DEFAULT:
            reply = {"outcomes": [{"ok": it} for it in self.items]}
            if actor_s is not None:
                reply["actor_s"] = actor_s
        self.reply = reply
        self.answered.set()


class FakeNode:
    """A runtime whose node starts and stops replicas at once, and whose replicas hand every
    ``process`` call to the test (``calls``), counting the outstanding ones per replica."""

    def __init__(self) -> None:
        self.calls: list[Call] = []
        self.outstanding: dict[str, int] = defaultdict(int)
        self.most_outstanding: dict[str, int] = defaultdict(int)
        self.spawned: list[str] = []
        self.stopped: list[str] = []
        self.exited: dict[str, str] = {}  # replica -> how its worker exited, as its node says
        self.restarts: dict[str, int] = defaultdict(int)  # replica -> its worker's restarts
        self.arrived = anyio.Event()
        self.rest_asks: list[Any] = []
        self.rest: Callable[[Any], Any] = lambda payload: pytest.fail(f"process_rest {payload}")
        self.said: dict[str, Any] = {}  # what the replicas' stage_info adds: what they receive whole
        self.receiver: Codec | None = None  # the replicas' codec, as they receive each call

    async def control(self, endpoint: str, kind: str, payload: Any, timeout: float | None = None) -> Any:
        if kind == "spawn_worker":
            self.spawned.append(payload["name"])
            return {"incarnation": 0}
        elif kind == "stop_worker":
            self.stopped.append(payload["name"])
        elif kind == "supervision":  # the engine's look at its replicas' workers
            running = [
                {"name": n, "state": "running", "incarnation": self.restarts[n]}
                for n in self.spawned
                if n not in self.stopped
            ]
            gone = [{"name": n, "state": "exited", "exit": why} for n, why in self.exited.items()]
            return {"workers": running + gone}
        elif kind != "ping":  # a stop's look at whether the node lives (runtime/worker_stop.py)
            raise AssertionError(f"unexpected control {kind!r}")
        return {}

    def ref(self, path: str) -> FakeRef:
        return FakeRef(self, path.split("/")[0])

    def pending(self, stage: str | None = None) -> list[Call]:
        return [c for c in self.calls if not c.answered.is_set() and stage in (None, c.stage)]

    async def wait_for(self, what: str, done: Callable[[], bool]) -> None:
        """Until ``done()`` holds, woken by each new call (bounded)."""
        with anyio.fail_after(WAIT_S):
            while not done():
                await self.arrived.wait()
                self.arrived = anyio.Event()
        assert done(), what


class FakeRef:
    def __init__(self, node: FakeNode, replica: str) -> None:
        self.node = node
        self.replica = replica

    async def tell(self, kind: str, payload: Any) -> None:
        pass  # to an outbox (a holder lost, outputs released): nothing is held here

    async def ask(self, kind: str, payload: Any, timeout: float | None = None) -> Any:
        if kind == "stage_info":
            return {"hooks": [], **self.node.said}
        if kind == "process_rest":  # the outcomes its reply named ``later``
            self.node.rest_asks.append(payload)
            return self.node.rest(payload)
        assert kind in ("process", "process_direct"), kind
        node = self.node
        # The engine's runtime encodes the call as it sends it, refusing one past its codec's
        # limits (MessageTooLarge, nothing sent); the replica refuses one past its own unread.
        sender = getattr(node, "codec", None)
        if isinstance(sender, Codec):
            sender.encode_message(K_ASK, 1, "local/client-1", "stage", kind, 0.0, None, None, payload)
        if node.receiver is not None:
            _received(node.receiver, kind, payload)
        call = Call(self.replica, list(payload["items"]))
        node.outstanding[self.replica] += 1
        node.most_outstanding[self.replica] = max(
            node.most_outstanding[self.replica], node.outstanding[self.replica]
        )
        node.calls.append(call)
        node.arrived.set()
        try:
            await call.answered.wait()
        finally:
            node.outstanding[self.replica] -= 1
        if isinstance(call.reply, BaseException):  # its process went: the connection ended
            raise call.reply
        return call.reply


def _received(codec: Codec, kind: str, payload: Any) -> None:
    """Fail where a replica of ``codec`` would refuse this call on receipt, unread: the engine
    would wait out the call's 600 s, hearing nothing."""
    try:
        codec.encode_message(K_ASK, 1, "local/client-1", "stage", kind, 0.0, None, {"ttl": 600.0}, payload)
    except MessageTooLarge as exc:
        pytest.fail(f"the replica refuses the engine's {kind!r} on receipt: {exc}")


def _pipeline(items: int, *stages: dict[str, Any], **fields: Any) -> PipelineConfig:
    # The scaler looks once an hour: replicas stay as declared, only failures replace them.
    return PipelineConfig.model_validate(
        {"name": "p", "items": items, "scale_interval_s": 3600.0, **fields, "stages": list(stages)}
    )


def _stage(name: str, **fields: Any) -> dict[str, Any]:
    return {"name": name, "actor": "fake.module:Stage", **fields}


class FakeClock:
    """Stands in for the engine's ``time.monotonic`` (only the engine's: the event loop keeps its own)."""

    def __init__(self) -> None:
        self.now = 100.0

    def monotonic(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeClock]:
    fake = FakeClock()
    # The engine's parts each read the clock through their own module (``engine.py`` names them).
    for module in (engine_module, replicas_module, dispatch, replica_calls, item_outcomes):
        monkeypatch.setattr(module, "time", types.SimpleNamespace(monotonic=fake.monotonic))
    yield fake


async def _run(
    cfg: PipelineConfig,
    node: FakeNode,
    drive: Callable[[], Awaitable[None]],
    samples: list[PipelineMetrics] | None = None,
    keep_outputs: bool = False,
) -> PipelineResult:
    """Run the engine on ``node`` while ``drive()`` answers its calls; stop ``drive`` once the
    run ends; both bounded."""
    engine = PipelineEngine(
        cfg,
        node,  # type: ignore[arg-type]
        "tcp://fake:1",
        on_change=samples.append if samples is not None else None,
        on_change_every_s=0.0,  # every change: the tests look at each queue depth
        keep_outputs=keep_outputs,
    )
    with anyio.fail_after(WAIT_S * 3):
        async with anyio.create_task_group() as tg:
            tg.start_soon(drive)
            result = await engine.run()
            tg.cancel_scope.cancel()
    return result


async def _answer_every_call(node: FakeNode) -> None:
    """Answer every call, oldest first, until cancelled (the run ended)."""
    while True:
        await node.wait_for("a call to answer", lambda: bool(node.pending()))
        node.pending()[0].answer()


# -- calls in flight per replica --------------------------------------------------------------


async def test_with_inflight_2_the_next_call_is_sent_before_the_first_answers() -> None:
    """A replica with inflight = 2 gets its second item while the first is still unanswered,
    and never has more than two calls outstanding."""
    node = FakeNode()
    cfg = _pipeline(6, _stage("a", inflight=2))

    async def drive() -> None:
        await node.wait_for("two calls to one replica", lambda: len(node.pending()) == 2)
        first, second = node.pending()
        assert first.replica == second.replica
        assert not first.answered.is_set()  # the second went out before the first answered
        await anyio.wait_all_tasks_blocked()
        assert len(node.pending()) == 2, "a third call went out while two were outstanding"
        await _answer_every_call(node)

    result = await _run(cfg, node, drive)
    assert result.counts() == {"ok": 6, "pruned": 0, "dead": 0, "kept": 0}
    assert dict(node.most_outstanding) == {node.spawned[0]: 2}


async def test_with_inflight_1_a_replica_never_has_two_calls() -> None:
    """inflight = 1: the next call goes out only once the previous one answered."""
    node = FakeNode()
    cfg = _pipeline(4, _stage("a", inflight=1))

    async def drive() -> None:
        for _ in range(4):
            await node.wait_for("a call", lambda: len(node.pending()) == 1)
            await anyio.wait_all_tasks_blocked()  # the engine had every chance to send another
            assert len(node.pending()) == 1
            node.pending()[0].answer()

    result = await _run(cfg, node, drive)
    assert result.counts()["ok"] == 4
    assert max(node.most_outstanding.values()) == 1


async def test_two_replicas_each_get_a_call_before_either_gets_a_second() -> None:
    """With two replicas and two items, each replica works (no replica hoards both)."""
    node = FakeNode()
    cfg = _pipeline(2, _stage("a", replicas=2, inflight=2))

    async def drive() -> None:
        await node.wait_for("two calls", lambda: len(node.pending()) == 2)
        assert {c.replica for c in node.pending()} == set(node.spawned)
        await _answer_every_call(node)

    result = await _run(cfg, node, drive)
    assert result.counts()["ok"] == 2


async def test_credits_bound_the_downstream_queue_with_calls_in_flight() -> None:
    """Behind a stuck stage, what its producer has in flight counts against its queue: no queue
    ever holds more than its bound, and the producer is given nothing more."""
    node = FakeNode()
    bound = 1  # below a's inflight: a's calls alone could overfill it if credit ignored them
    cfg = _pipeline(12, _stage("a", inflight=3, queue=4), _stage("b", inflight=2, queue=bound))
    samples: list[PipelineMetrics] = []

    async def drive() -> None:
        # "a"'s calls are answered together; "b" is stuck until the pipeline stops moving.
        with anyio.fail_after(WAIT_S):
            while True:
                for call in node.pending("a"):
                    call.answer()
                await anyio.wait_all_tasks_blocked()
                if not node.pending("a"):
                    break
        stuck_b = node.pending("b")
        assert len(stuck_b) == 2  # b's replica has its inflight calls
        b_queue = samples[-1].stages[1].queue_depth
        assert b_queue <= bound
        passed_a = sum(len(c.items) for c in node.calls if c.stage == "a")
        assert passed_a == len(stuck_b) + b_queue  # a got only what b's queue had room for
        await _answer_every_call(node)

    result = await _run(cfg, node, drive, samples)
    assert result.counts()["ok"] == 12
    samples.append(result.metrics)
    for m in samples:
        for s in m.stages:
            assert s.queue_depth <= s.queue_bound and s.queue_max <= s.queue_bound, s


# -- what the engine measures -----------------------------------------------------------------


async def test_latency_of_a_saturated_replica_excludes_time_queued_behind_the_previous_call(
    clock: FakeClock,
) -> None:
    """Both calls go out at t; the first answers at t+1, the second at t+3. The second's
    service began when the first answered: l_s = (1 + 2) / 2, not (1 + 3) / 2; the in-actor
    time is what the actor said."""
    node = FakeNode()
    cfg = _pipeline(2, _stage("a", inflight=2))

    async def drive() -> None:
        await node.wait_for("both calls", lambda: len(node.pending()) == 2)
        first, second = node.pending()
        clock.now += 1.0
        first.answer(actor_s=0.9)
        await anyio.wait_all_tasks_blocked()
        clock.now += 2.0
        second.answer(actor_s=1.9)

    result = await _run(cfg, node, drive)
    (stage,) = result.metrics.stages
    assert stage.latency_s == pytest.approx(1.5)
    assert stage.actor_latency_s == pytest.approx(1.4)
    assert result.metrics.elapsed_s == pytest.approx(3.0)


async def test_latency_of_an_idle_replica_starts_when_its_call_is_sent(clock: FakeClock) -> None:
    """A replica idle since its last answer: its next call's service starts when it is sent,
    not at its last answer (idle time is not latency either). "b" answers its first item after
    1 s, waits 3 s idle for "a", then answers its second 0.5 s after it came: l_s = 0.75."""
    node = FakeNode()
    cfg = _pipeline(2, _stage("a", inflight=1, queue=1), _stage("b", inflight=1))

    async def next_call(stage: str) -> Call:
        await node.wait_for(f"a call to {stage}", lambda: bool(node.pending(stage)))
        (call,) = node.pending(stage)
        return call

    async def drive() -> None:
        (await next_call("a")).answer()
        b1 = await next_call("b")
        clock.now += 1.0
        b1.answer()
        a2 = await next_call("a")
        await anyio.wait_all_tasks_blocked()
        clock.now += 3.0  # b is idle meanwhile
        a2.answer()
        b2 = await next_call("b")
        clock.now += 0.5
        b2.answer()

    result = await _run(cfg, node, drive)
    assert result.counts()["ok"] == 2
    assert result.metrics.stages[1].latency_s == pytest.approx(0.75)


# -- replies old and bad ----------------------------------------------------------------------


async def test_a_reply_in_the_old_list_form_still_works() -> None:
    """A replica answering a bare list of outcomes (before ``actor_s``) passes its items; its
    in-actor time is taken as the engine's."""
    node = FakeNode()
    cfg = _pipeline(3, _stage("a", inflight=1))

    async def drive() -> None:
        for _ in range(3):
            await node.wait_for("a call", lambda: bool(node.pending()))
            call = node.pending()[0]
            call.answer([{"ok": it} for it in call.items])

    result = await _run(cfg, node, drive)
    assert result.counts()["ok"] == 3
    (stage,) = result.metrics.stages
    assert stage.actor_latency_s == pytest.approx(stage.latency_s)
    assert stage.errors == 0


@pytest.mark.parametrize(
    "bad",
    [
        pytest.param(lambda items: [], id="too-few-outcomes"),
        pytest.param(lambda items: [{"ok": 1}] * (len(items) + 1), id="too-many-outcomes"),
        pytest.param(lambda items: ["ok"] * len(items), id="outcomes-not-dicts"),
        pytest.param(lambda items: {"outcomes": "ok", "actor_s": 0.1}, id="outcomes-not-a-list"),
        pytest.param(lambda items: None, id="nothing"),
    ],
)
async def test_a_malformed_reply_retries_its_items_on_a_new_replica(bad: Callable[[list[Any]], Any]) -> None:
    """A replica that answers nonsense is replaced and its items retried: the run ends ok,
    the stage counts the errors, and the replica's worker is stopped."""
    node = FakeNode()
    cfg = _pipeline(2, _stage("a", inflight=1, batch=2))

    async def drive() -> None:
        await node.wait_for("the first call", lambda: bool(node.pending()))
        first = node.pending()[0]
        first.answer(bad(first.items))
        await node.wait_for("the retry", lambda: bool(node.pending()))
        retry = node.pending()[0]
        assert retry.replica != first.replica
        assert sorted(it["task_id"] for it in retry.items) == sorted(it["task_id"] for it in first.items)
        retry.answer()

    result = await _run(cfg, node, drive)
    assert result.counts() == {"ok": 2, "pruned": 0, "dead": 0, "kept": 0}
    assert result.metrics.stages[0].errors == 2
    assert node.stopped[0] == node.spawned[0]  # the nonsense replica's worker was stopped first
    assert len(node.spawned) == 2


async def test_a_lost_replicas_call_that_only_waited_behind_another_costs_no_attempt() -> None:
    """With inflight 2 a replica has the item it works on and the next in its mailbox. When it
    is lost (killed as hung by its node), the item it worked on is retried as an attempt; the one
    that waited behind it goes back to the queue with none (it had used its attempts up on the
    hung item's account, and died with it)."""
    node = FakeNode()
    cfg = _pipeline(2, _stage("a", inflight=2))
    attempts: dict[str, list[Any]] = {}

    async def drive() -> None:
        await node.wait_for("two calls to one replica", lambda: len(node.pending()) == 2)
        lost = node.spawned[0]
        node.stopped.append(lost)  # its worker is gone: the engine's next look at the node sees it

        def again() -> list[Call]:  # the lost replica's cancelled calls stay unanswered
            return [c for c in node.pending() if c.replica != lost]

        await node.wait_for("both items again, on a new replica", lambda: len(again()) == 2)
        for call in again():
            for it in call.items:
                attempts.setdefault(it["task_id"], []).append(it.get("attempt"))
        await _answer_every_call(node)

    result = await _run(cfg, node, drive)
    assert result.counts() == {"ok": 2, "pruned": 0, "dead": 0, "kept": 0}
    assert attempts == {"p-000000": [1], "p-000001": [0]}, attempts
    # The item put back is not counted as a new one in (the stage's figures said 3 in, 2 out).
    (a,) = result.metrics.stages
    assert a.items_in == 2 and a.items_out == 2 and a.queue_depth == 0, a


async def test_items_a_dead_worker_killed_in_two_replicas_share_one_error() -> None:
    """The run's report groups dead items by their error: two replicas whose workers died of the
    same cause give their items one error, naming the stage and the cause, not the replica (one
    line per replica, 50 for 50 hung items)."""
    node = FakeNode()
    cfg = _pipeline(2, _stage("a", replicas=2, inflight=1), max_attempts=1)

    async def drive() -> None:
        await node.wait_for("a call to each replica", lambda: len(node.pending()) == 2)
        for call in node.pending():
            node.exited[call.replica] = "exit 4"  # os._exit(4) in its process
            node.stopped.append(call.replica)
            call.answer(PeerLost("the connection ended"))

    result = await _run(cfg, node, drive)
    assert result.counts() == {"ok": 0, "pruned": 0, "dead": 2, "kept": 0}
    assert set(result.errors.values()) == {
        "Unreachable: a replica of stage a: its worker has exited (exit 4)"
    }


async def test_items_of_replicas_restarted_unequally_often_share_one_error() -> None:
    """Their workers restarted by their nodes (once, and twice): the error named the restart's
    incarnation, and one cause gave a line per count of restarts."""
    node = FakeNode()
    cfg = _pipeline(2, _stage("a", replicas=2, inflight=1), max_attempts=1)

    async def drive() -> None:
        await node.wait_for("a call to each replica", lambda: len(node.pending()) == 2)
        for i, call in enumerate(node.pending()):
            node.restarts[call.replica] = i + 1
            call.answer(PeerLost("the connection ended"))

    result = await _run(cfg, node, drive)
    assert result.counts() == {"ok": 0, "pruned": 0, "dead": 2, "kept": 0}
    assert set(result.errors.values()) == {
        "Unreachable: a replica of stage a: its worker was restarted, without what it held"
    }, result.errors


# -- a reply in parts ---------------------------------------------------------------------------


async def test_outcomes_a_reply_names_later_are_asked_for_until_each_arrived_none_made_again() -> None:
    """A replica answers one outcome of three and names two ``later`` (they did not fit one
    message): the engine asks for them with ``process_rest``, with its limits, again for what a
    rest left for later; every item ends ok, made once (one ``process`` call)."""
    node = FakeNode()
    rests = [{"outcomes": {"k1": {"ok": "one"}}, "later": ["k2"]}, {"outcomes": {"k2": {"ok": "two"}}}]
    node.rest = lambda payload: rests.pop(0)
    cfg = _pipeline(3, _stage("a", batch=3))

    async def drive() -> None:
        await node.wait_for("the batch", lambda: bool(node.pending()))
        (call,) = node.pending()
        call.answer({"outcomes": [{"ok": "zero"}, {"later": "k1"}, {"later": "k2"}]})

    engine_limits = {"budget": 1 << 20, "frames": 16}
    node.codec = types.SimpleNamespace(max_message_bytes=1 << 20, max_frames=16)  # type: ignore[attr-defined]
    result = await _run(cfg, node, drive, keep_outputs=True)
    assert result.counts() == {"ok": 3, "pruned": 0, "dead": 0, "kept": 0}, result.errors
    assert sorted(result.outputs.values()) == ["one", "two", "zero"]
    assert len(node.calls) == 1  # nothing made again
    assert node.rest_asks == [{"keys": ["k1", "k2"], **engine_limits}, {"keys": ["k2"], **engine_limits}]


async def test_outcomes_that_do_not_arrive_are_retried_and_those_that_did_stand() -> None:
    """The replica's process went while the engine asked for the rest: the outcome that had not
    arrived is its item's error, retried (a second call with that item alone); the items whose
    outcomes arrived end ok, made once."""
    node = FakeNode()

    def lost(payload: Any) -> Any:
        raise PeerLost("the connection ended")

    node.rest = lost
    cfg = _pipeline(2, _stage("a", batch=2))

    async def drive() -> None:
        await node.wait_for("the batch", lambda: bool(node.pending()))
        (call,) = node.pending()
        call.answer({"outcomes": [{"ok": call.items[0]}, {"later": "k1"}]})
        await _answer_every_call(node)

    result = await _run(cfg, node, drive)
    assert result.counts() == {"ok": 2, "pruned": 0, "dead": 0, "kept": 0}, result.errors
    assert [len(c.items) for c in node.calls] == [2, 1]  # only the one whose outcome was lost ran again
    assert node.calls[1].items[0]["task_id"] == node.calls[0].items[1]["task_id"]


# -- a call within what the replica receives whole ----------------------------------------------

REPLICA_BOUND = 64 << 10  # bytes: a node's max_message_mb = 0.0625
ENGINE_BOUND = 1 << 20
BLOB = 30_000  # two fit one call under REPLICA_BOUND, three do not


def _bound_replicas(node: FakeNode, bound: int = REPLICA_BOUND, frames: int = 1024) -> None:
    """The engine's codec is of ENGINE_BOUND; its replicas receive ``bound`` bytes and
    ``frames`` frames whole, and say so as they start."""
    node.codec = Codec(ENGINE_BOUND)  # type: ignore[attr-defined]
    node.said = {"budget": bound, "frames": frames}
    node.receiver = Codec(bound, frames)


async def _a_answers(node: FakeNode, output: Callable[[Any], Any]) -> None:
    """Answer stage ``a``'s calls with ``output(item)`` per item and ``b``'s with what came,
    until cancelled (the run ended)."""
    while True:
        await node.wait_for("a call to answer", lambda: bool(node.pending()))
        call = node.pending()[0]
        if call.stage == "a":
            call.answer({"outcomes": [{"ok": output(it)} for it in call.items]})
        else:
            call.answer()


@pytest.mark.parametrize("plane", ["engine", "direct"])
async def test_a_batch_is_sent_in_calls_the_replica_receives_whole(plane: str) -> None:
    """Stage ``b``'s replicas receive 64 KiB whole (their node's bound), the engine 1 MiB:
    a batch of six inputs of 30,000 bytes, 180 KB inline, was one call the replica refused on
    receipt, unread, and the engine waited out its 600 s. Now each call holds what the replica
    receives (two), the rest go in the next calls: every item ends ok, each sent to ``b`` once,
    no attempt counted."""
    node = FakeNode()
    _bound_replicas(node)
    cfg = _pipeline(6, _stage("a", batch=6), _stage("b", batch=6, queue=6), data_plane=plane, max_attempts=1)
    result = await _run(cfg, node, lambda: _a_answers(node, lambda it: {**it, "blob": bytes(BLOB)}))

    assert result.counts() == {"ok": 6, "pruned": 0, "dead": 0, "kept": 0}, result.errors
    sent = [it["task_id"] for call in node.calls if call.stage == "b" for it in call.items]
    assert sorted(sent) == [f"p-{i:06d}" for i in range(6)]
    assert [len(c.items) for c in node.calls if c.stage == "b"] == [2, 2, 2]


async def test_an_input_that_alone_passes_the_replicas_bound_fails_alone_naming_both_bounds() -> None:
    """One input of 70,000 bytes cannot reach a replica of 64 KiB in any call: it is that item's
    error, naming the replica's bound and the engine's, and dead once its attempts are spent;
    the others go on, nothing hangs."""
    node = FakeNode()
    _bound_replicas(node)
    cfg = _pipeline(3, _stage("a", batch=3), _stage("b", batch=3), max_attempts=2)

    def output(item: Any) -> Any:
        return {**item, "blob": bytes(70_000 if item["seed"] == 1 else 100)}

    result = await _run(cfg, node, lambda: _a_answers(node, output))

    assert result.counts() == {"ok": 2, "pruned": 0, "dead": 1, "kept": 0}, result.errors
    error = result.errors["p-000001"]
    assert error.startswith("MessageTooLarge: stage b: an input of 700"), error
    assert f"the replica's message bound is {REPLICA_BOUND} bytes (the engine's {ENGINE_BOUND})" in error
    assert "raise max_message_mb" in error
    assert all(it["seed"] != 1 for c in node.calls if c.stage == "b" for it in c.items)


async def test_a_batch_is_sent_within_the_replicas_frames() -> None:
    """A replica of ``max_frames = 4`` receives a header and three arrays in a call: six inputs
    of one array each go in two calls of three, each item ok."""
    node = FakeNode()
    _bound_replicas(node, bound=ENGINE_BOUND, frames=4)
    cfg = _pipeline(6, _stage("a", batch=6), _stage("b", batch=6, queue=6), max_attempts=1)
    result = await _run(cfg, node, lambda: _a_answers(node, lambda it: {**it, "x": np.zeros(4)}))

    assert result.counts() == {"ok": 6, "pruned": 0, "dead": 0, "kept": 0}, result.errors
    assert [len(c.items) for c in node.calls if c.stage == "b"] == [3, 3]


async def test_a_replica_that_says_no_limits_is_sent_the_batch_whole() -> None:
    """An older replica says nothing of what it receives: the batch goes whole, as before."""
    node = FakeNode()
    node.codec = Codec(ENGINE_BOUND)  # type: ignore[attr-defined]
    cfg = _pipeline(6, _stage("a", batch=6), _stage("b", batch=6, queue=6), max_attempts=1)
    result = await _run(cfg, node, lambda: _a_answers(node, lambda it: {**it, "blob": bytes(BLOB)}))

    assert result.counts() == {"ok": 6, "pruned": 0, "dead": 0, "kept": 0}, result.errors
    assert [len(c.items) for c in node.calls if c.stage == "b"] == [6]


# -- a call within the engine's own limits ------------------------------------------------------

OWN_BOUND = 64 << 10  # bytes: a pipeline's max_message_mb = 0.0625, the engine's and the replicas'


def _own_bound(node: FakeNode, frames: int = 1024) -> None:
    """The engine's codec and its replicas' are alike (the pipeline's ``max_message_mb``): the
    replicas say so as they start, and the engine's codec refuses, as it encodes it, a call
    past them."""
    node.codec = Codec(OWN_BOUND, frames)  # type: ignore[attr-defined]
    node.said = {"budget": OWN_BOUND, "frames": frames}
    node.receiver = Codec(OWN_BOUND, frames)


def _sent_to_b(node: FakeNode) -> list[str]:
    return sorted(it["task_id"] for call in node.calls if call.stage == "b" for it in call.items)


@pytest.mark.parametrize("plane", ["engine", "direct"])
async def test_a_batch_past_the_engines_own_bound_is_sent_in_calls_that_fit(plane: str) -> None:
    """Six inputs of 30,000 bytes to stage ``b`` (``batch = 6``), the engine's bound 64 KiB as
    its replicas': each fits a call, together they do not. The engine's codec refused the call
    as it encoded it and every item failed, then died. Now, their weights near the bound, the
    engine sends calls of two, the rest in the next calls: each item ok, sent to ``b`` once."""
    node = FakeNode()
    _own_bound(node)
    cfg = _pipeline(6, _stage("a", batch=6), _stage("b", batch=6, queue=6), data_plane=plane, max_attempts=1)
    result = await _run(cfg, node, lambda: _a_answers(node, lambda it: {**it, "blob": bytes(BLOB)}))

    assert result.counts() == {"ok": 6, "pruned": 0, "dead": 0, "kept": 0}, result.errors
    assert _sent_to_b(node) == [f"p-{i:06d}" for i in range(6)]
    assert [len(c.items) for c in node.calls if c.stage == "b"] == [2, 2, 2]


async def test_a_batch_whose_weights_miss_the_bound_is_split_as_its_encode_fails() -> None:
    """Inputs of 20,000 empty strings each weigh next to nothing by the walk, and encode to
    20 KB each (a header per string): six together pass 64 KiB, which only the encode finds.
    The call refused as it is encoded is weighed then: calls of three, each item ok, once."""
    node = FakeNode()
    _own_bound(node)
    cfg = _pipeline(6, _stage("a", batch=6), _stage("b", batch=6, queue=6), max_attempts=1)
    result = await _run(cfg, node, lambda: _a_answers(node, lambda it: {**it, "v": [""] * 20_000}))

    assert result.counts() == {"ok": 6, "pruned": 0, "dead": 0, "kept": 0}, result.errors
    assert _sent_to_b(node) == [f"p-{i:06d}" for i in range(6)]
    assert [len(c.items) for c in node.calls if c.stage == "b"] == [3, 3]
    assert result.metrics.stages[1].items_out == 6 and result.metrics.stages[1].errors == 0


async def test_a_batch_past_the_engines_own_frames_is_sent_in_calls_that_fit() -> None:
    """An engine of ``max_frames = 4`` sends a header and three arrays in a call: six inputs of
    one array each, which the walk does not count, go in two calls of three, each item ok."""
    node = FakeNode()
    _own_bound(node, frames=4)
    cfg = _pipeline(6, _stage("a", batch=6), _stage("b", batch=6, queue=6), max_attempts=1)
    result = await _run(cfg, node, lambda: _a_answers(node, lambda it: {**it, "x": np.zeros(4)}))

    assert result.counts() == {"ok": 6, "pruned": 0, "dead": 0, "kept": 0}, result.errors
    assert [len(c.items) for c in node.calls if c.stage == "b"] == [3, 3]


async def test_a_batch_well_within_the_engines_bound_is_encoded_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """Six inputs of 3,000 bytes, 18 KB under a bound of 64 KiB: the batch goes whole, never
    weighed item by item (an encode more of each) before its call is encoded."""
    weighed: list[int] = []

    def fit_call(entries: list[Any], limits: Any) -> Any:
        weighed.append(len(entries))
        return call_fit.fit_call(entries, limits)

    monkeypatch.setattr(replica_calls, "fit_call", fit_call)
    node = FakeNode()
    _own_bound(node)
    cfg = _pipeline(6, _stage("a", batch=6), _stage("b", batch=6, queue=6), max_attempts=1)
    result = await _run(cfg, node, lambda: _a_answers(node, lambda it: {**it, "blob": bytes(3_000)}))

    assert result.counts() == {"ok": 6, "pruned": 0, "dead": 0, "kept": 0}, result.errors
    assert [len(c.items) for c in node.calls if c.stage == "b"] == [6]
    assert weighed == []


@pytest.mark.parametrize("batch", [1, 3])
async def test_an_input_past_the_engines_own_bound_alone_is_its_error_in_the_one_line(batch: int) -> None:
    """An input of 70,000 bytes (stage ``a``'s output, which this fake did not refuse) fits no
    call under the engine's 64 KiB: its error is the one line of an output over the engine's
    bound, naming stage ``a`` (not the codec's 'message 'process' of N bytes exceeds'), dead
    once its attempts are spent; the others go on, nothing hangs. Each attempt refused counts in
    stage ``b``'s errors, weighed before its call (a batch of three) or as its encode failed
    (alone): it was retried, yet the errors said 0 (lo 3)."""
    node = FakeNode()
    _own_bound(node)
    cfg = _pipeline(3, _stage("a", batch=3), _stage("b", batch=batch), max_attempts=2)

    def output(item: Any) -> Any:
        return {**item, "blob": bytes(70_000 if item["seed"] == 1 else 100)}

    result = await _run(cfg, node, lambda: _a_answers(node, output))

    assert result.counts() == {"ok": 2, "pruned": 0, "dead": 1, "kept": 0}, result.errors
    error = result.errors["p-000001"]
    assert error.startswith("MessageTooLarge: stage a: process returned an output of 700"), error
    assert f"the engine's message bound is {OWN_BOUND} bytes, less 1024 for the reply" in error
    assert "raise max_message_mb ([pipeline] of the pipeline's config" in error
    assert _sent_to_b(node) == ["p-000000", "p-000002"]
    b = result.metrics.stages[1]
    assert (b.items_out, b.errors) == (2, 2), b  # its two attempts, neither sent
