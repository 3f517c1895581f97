"""``troupe ctl drain N --wait``: the drain, then the wait until N holds no task.

``ctl drain`` returns as the master takes the drain, and the node goes on with the tasks it
holds: an operator who then stopped it (README "Upgrading a cluster": drain, stop, ...) had
nothing to wait on but polling ``ctl status --json``, and one who stopped it at once had its
tasks run again elsewhere (report mt 4). ``--wait`` asks the master's ``status`` every
:data:`POLL_S` until N's workers hold no lease, saying what they hold whenever that changes.

A drain stops neither a pipeline's replicas on N (``troupe run --cluster``'s) nor waits for
them: they run on until their run ends, or are started elsewhere once N stops (their items run
again). Where N runs processes besides its task workers, the last line says so.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import anyio

from troupe.runtime.errors import TroupeError

from .master_client import master_call, master_status
from .stop_signals import say_stopping

__all__ = ["BEAT_WAIT_S", "POLL_S", "Held", "drain_and_wait", "held_on"]

POLL_S = 1.0
"""Seconds between two looks at the master's ``status`` while a drain is waited for."""

BEAT_WAIT_S = 10.0
"""How long a drained node's next beat is waited for before its processes are said (a node
beats every second by default)."""


@dataclass(frozen=True, slots=True)
class Held:
    """What the master's ``status`` says of one node while it drains.

    Attributes:
        state: ``alive``, ``stopped``, ``dead``, or ``unlisted`` (the master does not list it).
        draining: whether the master has it draining.
        leases: tasks held, by worker (only workers that hold one).
        others: its running processes besides its task workers (a pipeline's replicas), as its
            last beat says (0 where not alive).
        beat_age_s: how old its last beat was as the master answered (None: a master that does
            not say, or a node it does not list).
    """

    state: str
    draining: bool
    leases: dict[str, int]
    others: int
    beat_age_s: float | None = None

    def said(self) -> str:
        """``3 tasks (node-a/w1: 2, node-a/w2: 1)``."""
        total = sum(self.leases.values())
        each = ", ".join(f"{worker}: {n}" for worker, n in sorted(self.leases.items()))
        return f"{total} task{'' if total == 1 else 's'} ({each})"


def held_on(status: dict[str, Any], node: str) -> Held:
    """What ``status`` (a master's reply) says ``node`` holds."""
    nodes = [n for n in status.get("nodes") or () if isinstance(n, dict) and n.get("node") == node]
    entry = nodes[0] if nodes else None
    workers = [w for w in status.get("workers") or () if isinstance(w, dict) and w.get("node") == node]
    leases = {str(w["worker_id"]): int(w["used"]) for w in workers if int(w.get("used") or 0) > 0}
    if entry is None:
        return Held("unlisted", False, leases, 0)
    alive = bool(entry.get("alive"))
    state = "alive" if alive else "stopped" if entry.get("left") else "dead"
    processes = entry.get("processes")
    others = max(0, processes - len(workers)) if alive and isinstance(processes, int) else 0
    age = entry.get("last_beat_age_s")
    age = float(age) if isinstance(age, (int, float)) else None
    return Held(state, bool(entry.get("draining")), leases, others, age)


async def drain_and_wait(
    master: str,
    node: str,
    reply_s: float,
    wait_s: float | None,
    say: Callable[[str], None],
    poll_s: float = POLL_S,
) -> str:
    """Drain ``node``, then wait until it holds no task; return the line that says it is done.

    Args:
        master: the master's endpoint.
        node: the node's name.
        reply_s: how long each of the master's replies may take.
        wait_s: how long to wait for the drain in all (None: until it is done, or Ctrl-C).
        say: prints a line of progress (what the node still holds, when that changes).
        poll_s: the pause between two looks.

    Raises:
        TroupeError: the wait ran out (naming what the node still holds), or the drain ended
            meanwhile (an undrain); or as ``master_call``.
    """
    await master_call(master, "drain", {"node": node}, reply_s)
    waited = anyio.current_time()
    last: Held | None = None
    try:
        with anyio.move_on_after(wait_s if wait_s is not None else float("inf")) as waiting:
            while True:
                held = held_on(await master_status(master, reply_s), node)
                if held.state != "alive" or not held.leases:
                    if held.others:
                        held = await _after_a_beat(master, node, reply_s, poll_s, held)
                    return _done(node, held)
                if not held.draining:
                    raise TroupeError(
                        f"node {node} does not drain any more (an undrain ended it?) and holds "
                        f"{held.said()}; drain it again to wait for it"
                    )
                if last is None or held.leases != last.leases:
                    say(f"node {node} still holds {held.said()}")
                last = held
                await anyio.sleep(poll_s)
    except anyio.get_cancelled_exc_class():  # Ctrl-C: the drain is the master's, and stays
        say_stopping(
            f"node {node} stays draining (the wait stopped, not the drain): `troupe ctl status` "
            f"follows it; `troupe ctl undrain {node}` ends it"
        )
        raise
    assert waiting.cancel_called
    still = f"holds {last.said()}" if last is not None else "had not said what it holds"
    raise TroupeError(
        f"node {node} still {still} after {anyio.current_time() - waited:.0f} s of --wait; it drains "
        "on: wait again, or see `troupe ctl status` (stopped now, those tasks run again elsewhere)"
    )


async def _after_a_beat(master: str, node: str, reply_s: float, poll_s: float, held: Held) -> Held:
    """``held`` as the node's first beat after now says it: the drain stopped the node's task
    workers, which the master drops from its list as each leaves, while its node's last beat may
    still count their processes (a drained node was said to run another process, a replica, one
    try in three: report mv 3). A master that does not say its beats' age (older), or no beat
    within :data:`BEAT_WAIT_S`: ``held`` as it is."""
    since = anyio.current_time()
    with anyio.move_on_after(BEAT_WAIT_S):
        while True:
            now = held_on(await master_status(master, reply_s), node)
            if now.beat_age_s is None:
                return held
            if now.beat_age_s < anyio.current_time() - since:  # a beat sent since: its count is now's
                return now
            await anyio.sleep(poll_s)
    return held


def _done(node: str, held: Held) -> str:
    if held.state == "unlisted":
        return f"node {node} is not listed by the master (any more): it holds no task"
    if held.state != "alive":  # a stopped or dead node's tasks went back to the queue
        return f"node {node} is {held.state}: it holds no task"
    line = f"node {node} is drained: it holds no task; stop it now (`troupe ctl undrain {node}` resumes it)"
    if held.others:
        others = "1 other process runs" if held.others == 1 else f"{held.others} other processes run"
        line += (
            f"; {others} there (a `troupe run --cluster`'s replicas, which a drain does not stop: "
            "once the node stops they are started elsewhere and their items run again)"
        )
    return line
