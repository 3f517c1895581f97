"""A handler that exits its process (``sys.exit``, ``KeyboardInterrupt``, a BaseException of its
own) answers its asker at once.

The process ends as the handler asked; the asker gets ``ActorStopped`` rather than waiting out
its deadline, whether the handler ran where the message was read (synchronous) or in the
actor's task (async), and the error says why (a ``KeyboardInterrupt`` read as a plain stop; a
BaseException of the handler's own, as ``type: message``). A stage's names its ``process``, not
the internal message that ran it (``process_direct``).
"""

from __future__ import annotations

import anyio
import pytest

from support.actor_process import actor_process
from support.exiting_process import OwnBaseStage, Quitter
from troupe.runtime import ActorStopped, Runtime
from troupe.runtime.transports.zmq import ZmqTransport

# Long: the answer must come from the exit, not the deadline (an AskTimeout fails the test).
DEADLINE_S = 60.0


@pytest.mark.parametrize("handler", ["exit_sync", "exit_async"])
async def test_an_ask_whose_handler_exits_is_answered_actor_stopped(handler: str) -> None:
    with actor_process(Quitter, "quitter", "quitter") as (endpoint, proc), anyio.fail_after(DEADLINE_S * 2):
        async with Runtime("n", "asker", ZmqTransport("tcp://127.0.0.1:*")) as rt:
            rt.directory.learn("n/quitter/quitter", endpoint)
            with pytest.raises(ActorStopped, match=f"stopped while handling '{handler}'"):
                await rt.ref("n/quitter/quitter").ask(handler, 7, timeout=DEADLINE_S)
        await anyio.to_thread.run_sync(proc.join, DEADLINE_S)
        assert proc.exitcode == 7  # the process ended with the handler's code


@pytest.mark.parametrize("handler", ["interrupt_sync", "interrupt_async", "interrupt_in_thread"])
async def test_an_ask_whose_handler_raises_keyboard_interrupt_says_so(handler: str) -> None:
    with actor_process(Quitter, "quitter", "quitter") as (endpoint, proc), anyio.fail_after(DEADLINE_S * 2):
        async with Runtime("n", "asker", ZmqTransport("tcp://127.0.0.1:*")) as rt:
            rt.directory.learn("n/quitter/quitter", endpoint)
            with pytest.raises(
                ActorStopped, match=f"handling '{handler}': its handler raised KeyboardInterrupt"
            ):
                await rt.ref("n/quitter/quitter").ask(handler, None, timeout=DEADLINE_S)
        await anyio.to_thread.run_sync(proc.join, DEADLINE_S)
        assert proc.exitcode not in (None, 0)  # the interrupt ended the process


@pytest.mark.parametrize("handler", ["own_base_sync", "own_base_async"])
async def test_an_ask_whose_handler_raises_a_base_exception_of_its_own_says_its_type_and_message(
    handler: str,
) -> None:
    """And the actor's process ends, as the asker is told: one raised by a synchronous handler
    where the message was read had reached the event loop's handler of a callback's errors,
    which logged it and let the process, and the actor, go on."""
    with actor_process(Quitter, "quitter", "quitter") as (endpoint, proc), anyio.fail_after(DEADLINE_S * 2):
        async with Runtime("n", "asker", ZmqTransport("tcp://127.0.0.1:*")) as rt:
            rt.directory.learn("n/quitter/quitter", endpoint)
            with pytest.raises(ActorStopped) as raised:
                await rt.ref("n/quitter/quitter").ask(handler, None, timeout=DEADLINE_S)
        await anyio.to_thread.run_sync(proc.join, DEADLINE_S)
        assert proc.exitcode not in (None, 0)  # the exception ended the process
    assert str(raised.value) == (
        f"actor quitter stopped while handling '{handler}': its handler raised OwnBase: px base"
    )


@pytest.mark.parametrize(
    ("msg_type", "payload"),
    [
        ("process", {"items": [{"task_id": "p-000000", "seed": 0}]}),
        ("process_direct", {"items": [{"task_id": "p-000000", "seed": 0}], "hold": ["k"], "inline_below": 1}),
    ],
)
async def test_a_stage_whose_process_raises_a_base_exception_names_its_process(
    msg_type: str, payload: dict[str, object]
) -> None:
    with actor_process(OwnBaseStage, "gen-0", "stage") as (endpoint, proc), anyio.fail_after(DEADLINE_S * 2):
        async with Runtime("n", "engine", ZmqTransport("tcp://127.0.0.1:*")) as rt:
            rt.directory.learn("n/gen-0/stage", endpoint)
            stage = rt.ref("n/gen-0/stage")
            await stage.ask("stage_info", {"stage": "gen"}, timeout=DEADLINE_S)
            with pytest.raises(ActorStopped) as raised:
                await stage.ask(msg_type, payload, timeout=DEADLINE_S)
        await anyio.to_thread.run_sync(proc.join, DEADLINE_S)
        assert proc.exitcode not in (None, 0)  # as above: the replica's process ended
    assert str(raised.value) == "actor stage stopped: stage gen's process raised OwnBase: px base"
