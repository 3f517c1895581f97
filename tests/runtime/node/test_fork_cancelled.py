"""A fork from the template whose caller is cancelled mid-request (a worker's restart that its
node's stop cancels) still hands back the worker it made: the template forks once the request
is out, and a reply nobody read left a worker no node knew of, running on after its node
(CI: a replica's restart cancelled as its run ended outlived the test).

A real template process, stopped (SIGSTOP) while the request waits in its socket, so that the
cancellation lands, deterministically, while the launch waits for the reply.
"""

from __future__ import annotations

import os
import signal

import anyio
import psutil

from support.local_node import ready_template
from support.processes import gone_within
from troupe.runtime.node.child import child_env
from troupe.runtime.node.forked_process import ForkedProcess
from troupe.runtime.node.template_link import TemplateLink

WITHIN_S = 60.0  # a bound on a hang, not on speed


async def _forked(before: set[int]) -> list[psutil.Process]:
    """Our children not in ``before``, once there is one (the template forks as it reads the
    request, whether or not anyone reads its reply)."""
    with anyio.move_on_after(WITHIN_S):
        while True:
            made = [p for p in psutil.Process().children() if p.pid not in before]
            if made:
                return made
            await anyio.sleep(0.01)  # a bounded poll of the process table
    return []


async def test_a_fork_cancelled_while_it_waits_for_the_reply_returns_its_worker() -> None:
    link = TemplateLink("fcancel", [])
    async with ready_template(link) as template:
        template_pid = template.describe()["pid"]
        before = {p.pid for p in psutil.Process().children()}
        got: list[ForkedProcess | None] = []
        os.kill(template_pid, signal.SIGSTOP)  # the request waits in its socket, unread
        try:
            with anyio.fail_after(WITHIN_S):
                async with anyio.create_task_group() as tg:

                    async def launch() -> None:
                        with anyio.CancelScope() as scope:
                            cancel.append(scope)
                            got.append(await template.launch(child_env({}), ()))

                    cancel: list[anyio.CancelScope] = []
                    tg.start_soon(launch)
                    await anyio.wait_all_tasks_blocked()  # sent, and waiting for the reply
                    cancel[0].cancel()
                    os.kill(template_pid, signal.SIGCONT)
        finally:
            os.kill(template_pid, signal.SIGCONT)
            made = await _forked(before)
            for child in made:  # the worker (its spec is missing: it exits, or is killed here)
                child.kill()
            psutil.wait_procs(made, timeout=WITHIN_S)
            for forked in got:
                if forked is not None and forked.stderr is not None:
                    await forked.stderr.aclose()
        assert len(made) == 1, f"expected the one forked worker, found {made}"
        assert got and got[0] is not None, "the cancelled launch lost the worker it forked"
        assert got[0].pid == made[0].pid
    assert gone_within(template_pid, WITHIN_S)
