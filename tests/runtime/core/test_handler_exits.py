"""A handler that exits its process (``sys.exit``, ``KeyboardInterrupt``) answers its asker at once.

The process ends as the handler asked; the asker gets ``ActorStopped`` rather than waiting out
its deadline, whether the handler ran where the message was read (synchronous) or in the
actor's task (async), and the error says why (a ``KeyboardInterrupt`` read as a plain stop).
"""

from __future__ import annotations

import anyio
import pytest

from support.actor_process import actor_process
from support.exiting_process import Quitter
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
