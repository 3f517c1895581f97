"""Actors' own figures in Prometheus: what an actor's ``metrics()`` returns, per actor and worker.

An actor may define ``def metrics(self) -> Mapping[str, float]`` (plain, not async; cheap: it
runs on the worker's event loop on every ``status`` the worker answers, a scrape's, ``troupe ctl
status``'s and ``ctl top``'s alike). The worker's ``status`` reply carries every
actor's figures (:func:`read_actor_metrics`), and the node's collector exports them
(:func:`actor_metric_families`) as two families, one sample per figure:

- a name ending in ``_total`` is a counter, ``troupe_actor_counter_total{worker, actor, name}``,
  its ``name`` label without the ``_total`` (so ``rate()`` and ``increase()`` apply);
- any other name is a gauge, ``troupe_actor_gauge{worker, actor, name}``.

A figure is kept only if its name is a Prometheus-style name (``[a-zA-Z_][a-zA-Z0-9_]*``, at
most 64 characters) and its value a finite number, not negative for a counter (a counter only
grows); an actor gives at most 64 figures. An actor whose ``metrics()`` raises, returns
something other than a mapping, or is ``async def`` (nothing awaits it here) gives none in that
scrape, logged once per actor and cause (``actor_metrics_failed``), so one broken actor never
hides another's; figures left out are logged once per actor (``actor_metrics_dropped``). An
``async def metrics`` that is a message handler (``@handles``) is no figures, and said nothing.

No prometheus-client here at import: the worker side runs in every worker process.
"""

from __future__ import annotations

import inspect
import math
import re
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from troupe.runtime.library_logging import get_logger

if TYPE_CHECKING:
    from .families import Families

__all__ = ["MAX_FIGURES", "actor_metric_families", "read_actor_metrics"]

log = get_logger(__name__)

MAX_FIGURES = 64  # per actor: each is a series in every scrape
_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]{0,63}")
_COUNTER = "troupe_actor_counter_total"
_COUNTER_DOC = "An actor's own counter (its metrics() names ending in _total), by name."
_GAUGE = "troupe_actor_gauge"
_GAUGE_DOC = "An actor's own gauge (its metrics() names), by name."
_RULE = (
    "names [a-zA-Z_][a-zA-Z0-9_]*, at most 64 characters; finite numbers, not negative for a "
    f"counter (a name ending in _total); at most {MAX_FIGURES}"
)
_warned: set[tuple[str, str]] = set()


def _figures(raw: Any) -> dict[str, float]:
    """The valid figures of one ``metrics()`` answer (see the module), at most MAX_FIGURES."""
    out: dict[str, float] = {}
    if not isinstance(raw, Mapping):
        return out
    for name, value in raw.items():
        if len(out) >= MAX_FIGURES:
            break
        if not isinstance(name, str) or not _NAME.fullmatch(name):
            continue
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
            continue
        if value < 0 and name.endswith("_total"):  # a counter only grows: Prometheus takes a fall for a reset
            continue
        out[name] = float(value)
    return out


def read_actor_metrics(actors: Mapping[str, Any]) -> dict[str, dict[str, float]]:
    """Each actor's figures, by actor name, from those of ``actors`` that define ``metrics()``.

    Args:
        actors: actor name -> actor instance (a worker's hosted actors).
    """
    found: dict[str, dict[str, float]] = {}
    for name, actor in actors.items():
        method = getattr(actor, "metrics", None)
        if not callable(method) or _is_handler(actor, method):
            continue
        if inspect.iscoroutinefunction(method):
            _failed_once(name, "async", "metrics() is async def: nothing awaits it; make it a plain def")
            continue
        try:
            raw = method()
            if not isinstance(raw, Mapping):
                if inspect.iscoroutine(raw):
                    raw.close()  # never awaited, and said so: not Python's warning too
                _failed_once(
                    name,
                    "not_a_mapping",
                    f"metrics() returned {type(raw).__name__}, not a mapping of name -> number",
                )
                continue
            figures = _figures(raw)
        except Exception as exc:  # one actor's bug must not hide the others' figures
            _failed_once(name, type(exc).__name__, repr(exc))
            continue
        dropped = [str(k) for k in raw if k not in figures]
        if dropped and (name, "dropped") not in _warned:  # once per actor: a scrape runs often
            _warned.add((name, "dropped"))
            log.warning(
                "actor_metrics_dropped",
                actor=name,
                figures=dropped[:5],
                dropped=len(dropped),
                rule=_RULE,
            )
        found[name] = figures
    return found


def _failed_once(actor: str, cause: str, error: str) -> None:
    """Log that ``actor``'s ``metrics()`` gave nothing, once per actor and cause: a scrape runs often."""
    if (actor, cause) not in _warned:
        _warned.add((actor, cause))
        log.warning("actor_metrics_failed", actor=actor, error=error)


def _is_handler(actor: Any, method: Any) -> bool:
    """``metrics`` is the actor's handler of a message (``@handles``), not its figures."""
    table = getattr(type(actor), "handler_table", None)
    fn = getattr(method, "__func__", method)
    return callable(table) and any(handler.fn is fn for handler in table().values())


def actor_metric_families(f: Families, worker: str, reply: Mapping[str, Any]) -> None:
    """Add the figures of a worker's ``status`` reply (its ``actor_metrics``) to ``f``."""
    per_actor = reply.get("actor_metrics")
    if not isinstance(per_actor, Mapping):
        return  # an older worker, or one whose actors define no metrics()
    for actor, raw in sorted(per_actor.items(), key=lambda item: str(item[0])):
        for name, value in sorted(_figures(raw).items()):
            labels = {"worker": worker, "actor": str(actor)}
            if name.endswith("_total"):
                f.counter(_COUNTER, _COUNTER_DOC, value, {**labels, "name": name.removesuffix("_total")})
            else:
                f.gauge(_GAUGE, _GAUGE_DOC, value, {**labels, "name": name})
