"""Fault injection inside a worker process: the ``chaos``, ``heal`` and ``faults`` controls.

The node relays ``troupe ctl chaos`` here as a control message ``chaos``
``{"faults": [spec, ...], "seed": int | None}`` (specs as :meth:`.faults.FaultSpec.from_dict`
takes them). Each message adds one :class:`~.faults.FaultPlan`; while any plan has faults for
handlers, a before-handle hook runs :func:`~.faults.apply_before_handle` before every handler,
and performs what fires:

- ``crash`` raises inside the handler: the asker gets the error and the actor keeps serving;
- ``drop`` loses the message (the cell counts it as ``dropped``; an asker times out);
- ``slow``, ``stall`` and ``hang_with_gil`` block the event loop's thread, as a stuck handler
  does (only ``hang_with_gil`` also stops the heartbeat thread);
- ``kill`` SIGKILLs the process.

A fault fires on the next matching message, not at once. ``partition`` makes the transport
refuse sends to the named peers and drop the replies that come back from them
(:class:`~.errors.Partitioned`); requests the peers send to this process still arrive, so a
symmetric cut partitions both sides.

``heal`` clears every plan, ends partitions and opens stall gates. It cannot reach a process
whose loop is blocked right now (stalled or hung): that fault ends when its seconds pass, or
the supervisor kills the process.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from troupe.runtime.core.control_payloads import ControlPayload
from troupe.runtime.errors import ConfigError
from troupe.runtime.library_logging import get_logger

from .faults import DROP, FaultPlan, apply_before_handle

if TYPE_CHECKING:
    from troupe.runtime.core.runtime import Runtime

__all__ = ["WorkerChaos"]

log = get_logger(__name__)


class WorkerChaos:
    """The fault plans of one worker process, wired into its runtime and transport.

    Args:
        runtime: the worker's runtime; its control handlers gain ``chaos``, ``heal`` and
            ``faults``.
    """

    def __init__(self, runtime: Runtime) -> None:
        self._runtime = runtime
        self._plans: list[FaultPlan] = []
        runtime.register_controls({"chaos": self._chaos, "heal": self._heal, "faults": self._faults})

    def add(self, plan: FaultPlan) -> None:
        """Put ``plan`` in force, next to the plans already in force."""
        self._plans.append(plan)
        if plan.active and self._before_handle not in self._runtime.before_handle:
            self._runtime.before_handle.append(self._before_handle)
        if plan.statistics().partitioned_peers and hasattr(self._runtime.transport, "refuse"):
            self._runtime.transport.refuse = self._refuses

    def heal(self) -> dict[str, Any]:
        """End every fault: clear the plans, end partitions, open stall gates.

        Returns:
            What the plans injected before they were cleared (see :meth:`statistics`).
        """
        stats = self.statistics()
        for plan in self._plans:
            plan.heal()
            plan.release_stalls()
        self._plans.clear()
        if self._before_handle in self._runtime.before_handle:
            self._runtime.before_handle.remove(self._before_handle)
        if getattr(self._runtime.transport, "refuse", None) is not None:
            self._runtime.transport.refuse = None  # type: ignore[attr-defined]
        log.info("faults_healed", fired=stats["fired"])
        return stats

    def armed(self) -> list[str]:
        """The kinds of the faults installed and not healed (a worker's status shows them: an
        operator saw them only by healing)."""
        kinds = {spec.kind.value for plan in self._plans for spec in plan.specs}
        return sorted(kinds)

    def statistics(self) -> dict[str, Any]:
        """Plain data: faults fired by kind, peers cut off, messages dropped and refused."""
        fired: Counter[str] = Counter()
        peers: set[str] = set()
        for plan in self._plans:
            st = plan.statistics()
            fired.update(st.fired_by_kind)
            peers |= st.partitioned_peers
        refused = getattr(self._runtime.transport, "refused_counts", {})
        return {
            "plans": len(self._plans),
            "fired": dict(fired),
            "partitioned_peers": sorted(peers),
            "refused": dict(refused),
            "dropped": {name: cell.dropped for name, cell in self._runtime.cells.items()},
        }

    async def _before_handle(self, actor: str, msg_type: str) -> object:
        # Plans are walked in order; the first drop wins, as within one plan.
        for plan in tuple(self._plans):
            if apply_before_handle(plan, actor, msg_type) is DROP:
                return DROP
        return None

    def _refuses(self, peer: str) -> bool:
        return any(plan.is_partitioned(peer) for plan in self._plans)

    async def _chaos(self, payload: Any) -> dict[str, Any]:
        p = ControlPayload("chaos", payload)
        plan = FaultPlan.from_dicts(p.require("faults", list), seed=p.optional("seed", int))
        for spec in plan.specs:
            self._check_handled(spec.kind.value, spec.actor, spec.message_type)
        self.add(plan)
        log.warning("faults_installed", faults=[s.kind.value for s in plan.specs])
        return self.statistics()

    def _check_handled(self, kind: str, actor: str | None, message_type: str | None) -> None:
        """Refuse a fault whose message type no actor in scope handles: armed, it would never
        fire, and a test that relied on it would pass without any fault injected.

        Raises:
            ConfigError: naming the message type and what each actor in scope handles.
        """
        if message_type is None:
            return
        cells = {n: c for n, c in self._runtime.cells.items() if actor is None or n == actor}
        for cell in cells.values():
            runs = getattr(cell.actor, "runs", None)  # a task actor: task kinds count too
            if message_type in cell.handlers or (callable(runs) and runs(message_type)):
                return
        handled = "; ".join(f"{n}: {_handled_by(c.actor, c.handlers)}" for n, c in sorted(cells.items()))
        raise ConfigError(
            f"chaos {kind}: no actor of worker {self._runtime.process!r} handles message type "
            f"{message_type!r}, so the fault would never fire; its handlers: {handled or 'none'}"
        )

    async def _heal(self, _: Any) -> dict[str, Any]:
        return self.heal()

    async def _faults(self, _: Any) -> dict[str, Any]:
        return self.statistics()


def _handled_by(actor: Any, handlers: Mapping[str, Any]) -> str:
    """What a fault's ``message_type`` may name for ``actor``: its handlers' message types, and
    a task actor's task kinds."""
    said = sorted(handlers)
    kinds = getattr(type(actor), "task_kinds", None) if callable(getattr(actor, "runs", None)) else None
    if kinds is not None:
        said.append(f"task kinds {', '.join(kinds)}" if kinds else "every task kind")
    return ", ".join(said) or "nothing"
