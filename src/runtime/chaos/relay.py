"""The node's ``chaos`` and ``heal`` control messages: fault injection against its workers.

``chaos`` ``{"kind", "target", "seconds", "probability", "count", "after", "message_type",
"peers", "seed"}`` (None or absent = the fault's default):

- ``target`` is ``WORKER``, ``WORKER/ACTOR`` (the fault fires only on that actor's messages),
  or ``*`` / the node's name for every running worker of the node. ``supervisor`` is a valid
  target of ``kill`` only.
- ``kill`` is done by the node itself: SIGKILL of the worker process, at once; the exit is
  reported with the reason ``chaos_kill`` and the worker is restarted under its policy.
- every other kind is validated here (:class:`~.faults.FaultSpec`), then relayed to each target
  worker as the worker control ``chaos`` (see ``chaos/worker_side.py``); it fires on the next
  matching message.
- ``partition`` takes ``peers``: endpoints (``tcp://...``), worker names of this node (all of
  that worker's mailboxes), ``WORKER/ACTOR`` (that actor's mailbox) or ``node`` (this node's
  endpoint). A target worker then refuses traffic to them and the replies coming from them.
  On one host that is the whole of it: a node-wide partition (``--target '*'``) cuts every
  worker of this node off the listed peers (give another node's endpoints to cut the node off
  that node); requests the peers send in still arrive unless they are partitioned too.

The reply has each target worker's answer, or ``{"error": ...}`` where it gave none; with
``"skipped": True`` where it was no longer running when its turn came (the targets are taken
once, then relayed to in turn: a worker killed meanwhile is being restarted), and nothing armed.
A ``message_type`` that no actor of a target handles is refused by that worker (the fault would
never fire): skipped with that error, and the whole ``chaos`` refused when every target refused.
``kill``'s reply is ``{"killed": {worker: pid}}``, with ``"skipped": {worker: why}`` for a
process this relay killed already that is not restarted yet (dead, not yet reaped).

``heal`` ``{"target"}`` clears every fault of the target workers and returns what fired. What
fired is the worker process's own record: a worker that a fault killed (``hang_with_gil`` found
by its supervisor, ``crash`` with a restart) took it with it. The relay keeps the incarnation
each worker's faults were armed in, so a heal of a worker restarted since says so
(``restarted_since_armed``: the kinds armed and how the process ended) rather than that nothing
had fired.
"""

from __future__ import annotations

import os
import signal
from typing import TYPE_CHECKING, Any, Protocol

from troupe.runtime.core.control_payloads import ControlPayload
from troupe.runtime.errors import ConfigError, UnknownActor
from troupe.runtime.library_logging import get_logger
from troupe.runtime.node.worker_handles import HandleState, WorkerHandle

from .faults import FaultKind, FaultSpec

if TYPE_CHECKING:
    from troupe.runtime.core.runtime import Runtime
    from troupe.runtime.node.ports import NodeView

__all__ = ["ChaosRelay", "KillNotes"]

log = get_logger(__name__)

_ADDRESSING = ("kind", "target", "seed")  # what the fault is and where; the rest is its spec
_RELAY_TIMEOUT_S = 2.0
_SKIPPED = "skipped"  # in a target's reply: it was not running any more when its turn came


class KillNotes(Protocol):
    """What the relay needs of the node's supervision (``NodeSupervision``): the supervisor's
    pid, and a note of why a worker is about to be killed, so that its exit carries the reason."""

    @property
    def pid(self) -> int | None: ...

    def note_kill(self, pid: int | None, reason: str) -> None: ...


class ChaosRelay:
    """Answers ``chaos`` and ``heal`` for a node.

    Args:
        node: the node whose workers are targets (its name, workers and runtime).
        supervision: told of the node's own kills, so the exit carries the reason.
    """

    def __init__(self, node: NodeView, supervision: KillNotes) -> None:
        self._node = node
        self._supervision = supervision
        # worker -> (the incarnation its faults were armed in, their kinds)
        self._armed: dict[str, tuple[int, list[str]]] = {}
        # worker -> (incarnation, pid) of the process this relay last SIGKILLed
        self._killed: dict[str, tuple[int, int]] = {}

    def install(self, runtime: Runtime) -> None:
        """Add the ``chaos`` and ``heal`` control handlers to the node's runtime."""
        runtime.register_controls({"chaos": self.inject, "heal": self.heal})

    async def inject(self, payload: Any) -> dict[str, Any]:
        """The ``chaos`` control: inject the fault ``payload`` describes (see the module)."""
        p = ControlPayload("chaos", payload)  # e.g. {"kind": "kill", "target": "w-echo"}
        kind, target, seed = p.require("kind", str), p.optional("target", str, ""), p.optional("seed", int)
        # Every option given goes to the spec's check: one dropped here (a typo, ``probabilty``)
        # would arm the fault without it, to fire on every message.
        given = {str(k): v for k, v in p.fields.items() if k not in _ADDRESSING and v is not None and v != []}
        if kind == FaultKind.KILL.value:
            if given:
                raise ConfigError(
                    f"chaos kill: field(s) {', '.join(sorted(given))} not allowed: kill is a SIGKILL "
                    "sent by the node at once; a fault that fires on a message is crash"
                )
            return self._kill(target)
        targets = self._targets(target)
        spec: dict[str, Any] = {"kind": kind, **given}
        if kind == FaultKind.PARTITION.value:
            peers = p.optional("peers", list, [])
            spec["peers"] = sorted({e for peer in peers for e in self._peer_endpoints(str(peer))})
        FaultSpec.from_dict(spec, f"chaos {kind}")  # refuse a bad spec before any worker sees it
        results: dict[str, Any] = {}
        refused: list[str] = []
        for handle, actor in targets:
            one = dict(spec, actor=actor) if actor and kind != FaultKind.PARTITION.value else spec
            try:
                result = await self._relay(
                    handle, "chaos", {"faults": [one], "seed": seed}, refusal=ConfigError
                )
            except ConfigError as exc:  # the worker refused the spec (no handler of its message type)
                refused.append(str(exc))
                result = {"error": str(exc), _SKIPPED: True}
            results[handle.spec.name] = result
            if not (isinstance(result, dict) and _SKIPPED in result):
                self._note_armed(handle, kind)
        if refused and len(refused) == len(targets):  # armed nowhere: refused, as a bad target is
            raise ConfigError(refused[0] if len(refused) == 1 else "; ".join(refused))
        log.warning("chaos_injected", kind=kind, target=target, spec=spec, workers=sorted(results))
        return {"kind": kind, "spec": spec, "workers": results}

    async def heal(self, payload: Any) -> dict[str, Any]:
        """The ``heal`` control: clear every fault of the target workers."""
        target = ControlPayload("heal", payload).optional("target", str) or "*"
        results: dict[str, Any] = {}
        for handle, _ in self._targets(target):
            healed = await self._relay(handle, "heal", None)
            armed = self._armed.pop(handle.spec.name, None)
            if armed is not None and armed[0] != handle.incarnation and isinstance(healed, dict):
                healed["restarted_since_armed"] = {"kinds": armed[1], "exit": handle.exit_reason}
            results[handle.spec.name] = healed
        log.info("chaos_healed", target=target, workers=sorted(results))
        return {"workers": results}

    def _note_armed(self, handle: WorkerHandle, kind: str) -> None:
        incarnation, kinds = self._armed.get(handle.spec.name, (handle.incarnation, []))
        if incarnation != handle.incarnation:  # armed again after a restart: this process's
            kinds = []
        self._armed[handle.spec.name] = (handle.incarnation, sorted({*kinds, kind}))

    def _kill(self, target: str) -> dict[str, Any]:
        if target == "supervisor":
            pid = self._supervision.pid
            if pid is None:
                raise UnknownActor(f"node {self._node.name} has no running supervisor to kill")
            _kill_pid(pid)
            log.warning("chaos_injected", kind="kill", target=target, worker_pid=pid)
            return {"kind": "kill", "killed": {"supervisor": pid}}
        killed: dict[str, int] = {}
        skipped: dict[str, str] = {}
        for handle, _ in self._targets(target, running=False):
            if handle.process is None or handle.returncode is not None or not handle.pid:
                continue
            name, pid = handle.spec.name, handle.pid
            # SIGKILLed by an earlier kill and not reaped yet (its returncode unset): dead, so
            # not killed again, and not said to be (a second ``kill '*'`` named the same pids)
            if self._killed.get(name) == (handle.incarnation, pid):
                skipped[name] = f"pid {pid} was killed already and is not restarted yet"
                continue
            self._supervision.note_kill(pid, "chaos_kill")
            handle.process.send_signal(signal.SIGKILL)
            self._killed[name] = (handle.incarnation, pid)
            killed[name] = pid
        if not killed and not skipped:
            raise UnknownActor(f"no live worker process matches {target!r} on node {self._node.name}")
        log.warning("chaos_injected", kind="kill", target=target, pids=killed, skipped=sorted(skipped))
        reply: dict[str, Any] = {"kind": "kill", "killed": killed}
        if skipped:
            reply["skipped"] = skipped
        return reply

    def _targets(self, target: str, running: bool = True) -> list[tuple[WorkerHandle, str | None]]:
        node = self._node
        names = sorted(node.workers)
        if target in ("*", node.name):
            return [
                (h, None)
                for h in node.workers.values()
                if not running or (h.state is HandleState.RUNNING and h.endpoint)
            ]
        worker, _, actor = target.partition("/")
        handle = node.workers.get(worker)
        if handle is None:
            raise UnknownActor(
                f"no worker {worker!r} on node {node.name}; workers: {names} "
                "(target is WORKER, WORKER/ACTOR or '*')"
            )
        if running and (handle.state is not HandleState.RUNNING or not handle.endpoint):
            raise UnknownActor(
                f"worker {worker!r} is {handle.state.value}, not running; "
                "see `troupe ctl status` and retry when it runs"
            )
        if actor and actor not in handle.actors and actor not in {a.name for a in handle.spec.actors}:
            raise UnknownActor(
                f"worker {worker!r} hosts no actor {actor!r}; it hosts {sorted(handle.actors)}"
            )
        return [(handle, actor or None)]

    def _peer_endpoints(self, peer: str) -> list[str]:
        node = self._node
        if "://" in peer:
            return [peer]
        if peer == "node" and node.runtime is not None:
            return [node.runtime.address]
        worker, _, actor = peer.partition("/")
        handle = node.workers.get(worker)
        if handle is None or not handle.endpoint:
            raise ConfigError(
                f"partition peer {peer!r} is neither an endpoint (tcp://HOST:PORT), 'node', nor a "
                f"running worker of node {node.name} (workers: {sorted(node.workers)})"
            )
        if actor:
            if actor not in handle.actors:
                raise ConfigError(
                    f"partition peer {peer!r}: worker {worker!r} hosts no actor "
                    f"{actor!r}; it hosts {sorted(handle.actors)}"
                )
            return [handle.actors[actor]]
        return [handle.endpoint, *handle.actors.values()]

    async def _relay(
        self, handle: WorkerHandle, msg_type: str, payload: Any, refusal: type[Exception] | None = None
    ) -> Any:
        runtime, endpoint = self._node.runtime, handle.endpoint
        if runtime is None or endpoint is None:
            # It was running when the targets were taken; it went while an earlier relay was
            # awaited (a killed replica being reaped and restarted): skipped, and said so.
            why = f"worker {handle.spec.name!r} is {handle.state.value} now, not running: skipped"
            return {"error": why, _SKIPPED: True}
        try:
            return await runtime.control(endpoint, msg_type, payload, timeout=_RELAY_TIMEOUT_S)
        except Exception as exc:  # a stalled or hung worker cannot answer; say so, go on
            if refusal is not None and isinstance(exc, refusal):
                raise
            return {"error": f"{type(exc).__name__}: {exc}"}


def _kill_pid(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
