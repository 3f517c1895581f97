"""Actors' own figures in Prometheus: what an actor's ``metrics()`` returns, per actor and worker.

An actor may define ``def metrics(self) -> Mapping[str, float]`` (plain, not async; cheap: it
runs on the worker's event loop once per scrape). The worker's ``status`` reply carries every
actor's figures (:func:`read_actor_metrics`), and the node's collector exports them
(:func:`actor_metric_families`) as two families, one sample per figure:

- a name ending in ``_total`` is a counter, ``troupe_actor_counter_total{worker, actor, name}``,
  its ``name`` label without the ``_total`` (so ``rate()`` and ``increase()`` apply);
- any other name is a gauge, ``troupe_actor_gauge{worker, actor, name}``.

A figure is kept only if its name is a Prometheus-style name (``[a-zA-Z_][a-zA-Z0-9_]*``, at
most 64 characters) and its value a finite number; an actor gives at most 64 figures. An actor
whose ``metrics()`` raises gives none in that scrape (logged once per actor and error type), so
one broken actor never hides another's; figures left out are logged once per actor
(``actor_metrics_dropped``).

No prometheus-client here at import: the worker side runs in every worker process.
"""

from __future__ import annotations

import inspect
import math
import re
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import structlog

if TYPE_CHECKING:
    from .families import Families

__all__ = ["MAX_FIGURES", "actor_metric_families", "read_actor_metrics"]

log = structlog.get_logger(__name__)

MAX_FIGURES = 64  # per actor: each is a series in every scrape
_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]{0,63}")
_COUNTER = "troupe_actor_counter_total"
_COUNTER_DOC = "An actor's own counter (its metrics() names ending in _total), by name."
_GAUGE = "troupe_actor_gauge"
_GAUGE_DOC = "An actor's own gauge (its metrics() names), by name."
_RULE = f"names [a-zA-Z_][a-zA-Z0-9_]*, at most 64 characters; finite numbers; at most {MAX_FIGURES}"
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
        if not callable(method) or inspect.iscoroutinefunction(method):
            continue
        try:
            raw = method()
            figures = _figures(raw)
        except Exception as exc:  # one actor's bug must not hide the others' figures
            if (name, type(exc).__name__) not in _warned:
                _warned.add((name, type(exc).__name__))
                log.warning("actor_metrics_failed", actor=name, error=repr(exc))
            continue
        dropped = [str(k) for k in raw if k not in figures] if isinstance(raw, Mapping) else []
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
