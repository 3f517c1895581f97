"""The actor side of a pipeline stage: items in, items out, failures per item.

A stage replica is an actor that answers ``process`` asks carrying a batch of items. It handles
each item with ``process`` (or the whole batch with ``process_batch``) and answers one outcome
per item, in order:

- ``{"ok": item}``: the item goes on to the next stage;
- ``{"pruned": reason}``: the item failed for good (ItemFailed) and is dropped, counted;
- ``{"error": message, "traceback": text}``: something broke (a full disk, a bug); the engine
  retries the item up to the pipeline's ``max_attempts``.
"""

from __future__ import annotations

import inspect
import traceback
from typing import Any

from troupe.runtime.core.actor import Actor, handles
from troupe.runtime.errors import ItemFailed

__all__ = ["StageActor", "outcome_error", "outcome_ok", "outcome_pruned"]


def outcome_ok(item: Any) -> dict[str, Any]:
    """The item passed."""
    return {"ok": item}


def outcome_pruned(reason: str) -> dict[str, Any]:
    """The item failed for good and is pruned."""
    return {"pruned": reason}


def outcome_error(exc: BaseException) -> dict[str, Any]:
    """The item hit an error worth retrying."""
    return {
        "error": f"{type(exc).__qualname__}: {exc}",
        "traceback": "".join(traceback.format_exception(exc)),
    }


class StageActor(Actor):
    """Base of every stage replica. Override ``process`` (or ``process_batch``).

    ``process(item)`` may be a plain or an async method; raise ItemFailed (or a subclass) to
    prune the item, any other exception to have it retried.
    """

    mailbox_capacity = 16

    def process(self, item: Any) -> Any:
        """Handle one item and return the item for the next stage."""
        raise NotImplementedError(f"{type(self).__name__} must override process() or process_batch()")

    async def process_batch(self, items: list[Any]) -> list[dict[str, Any]]:
        """Handle a batch; by default item by item, each with its own outcome."""
        out: list[dict[str, Any]] = []
        for item in items:
            try:
                result = self.process(item)
                if inspect.isawaitable(result):
                    result = await result
                out.append(outcome_ok(result))
            except ItemFailed as exc:
                out.append(outcome_pruned(str(exc)))
            except Exception as exc:
                out.append(outcome_error(exc))
            self.progress()
        return out

    @handles("process")
    async def _process(self, payload: dict[str, Any]) -> list[dict[str, Any]]:
        items = payload["items"]
        try:
            return await self.process_batch(items)
        except ItemFailed as exc:
            return [outcome_pruned(str(exc))] * len(items)
        except Exception as exc:
            return [outcome_error(exc)] * len(items)
