"""Small helpers the collectors share: metric families with fixed labels, and reading numbers
out of status replies that may lack a field (an older peer, a helper not wired yet)."""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

__all__ = ["Families", "Family", "number", "reason_label"]

Family = GaugeMetricFamily | CounterMetricFamily

_REASON = re.compile(r"[a-z][a-z0-9_]{0,39}")


class Families:
    """The families of one scrape, made on first use and yielded in the order first used.

    ``fixed`` labels (the node's or the master's name) come first on every sample; a family's
    other label names are those of its first sample (or of :meth:`declare`).
    """

    def __init__(self, fixed: Mapping[str, str]) -> None:
        self._fixed = dict(fixed)
        self._families: dict[str, tuple[Family, list[str]]] = {}

    def declare(self, kind: str, name: str, doc: str, labels: Sequence[str] = ()) -> None:
        """Make the family exist, with no sample yet, so that every scrape lists it.

        ``kind`` is ``gauge`` or ``counter`` (whose ``name`` ends in ``_total``).
        """
        if name not in self._families:
            cls = GaugeMetricFamily if kind == "gauge" else CounterMetricFamily
            names = [*self._fixed, *labels]
            self._families[name] = (cls(name, doc, labels=names), names)

    def gauge(self, name: str, doc: str, value: float, labels: Mapping[str, str] | None = None) -> None:
        """Add one gauge sample."""
        self._add("gauge", name, doc, value, labels or {})

    def counter(self, name: str, doc: str, value: float, labels: Mapping[str, str] | None = None) -> None:
        """Add one counter sample; ``name`` ends in ``_total``."""
        self._add("counter", name, doc, value, labels or {})

    def _add(self, kind: str, name: str, doc: str, value: float, labels: Mapping[str, str]) -> None:
        self.declare(kind, name, doc, list(labels))
        family, names = self._families[name]
        values = {**self._fixed, **labels}
        family.add_metric([str(values.get(n, "")) for n in names], value)

    def all(self) -> list[Family]:
        """Every family made, in order."""
        return [family for family, _ in self._families.values()]


def number(data: Any, key: str, default: float | None = None) -> float | None:
    """``data[key]`` as a finite float, or ``default`` when missing, not a number, or not finite."""
    if not isinstance(data, Mapping):
        return default
    value = data.get(key)
    if isinstance(value, bool) or not isinstance(value, int | float):
        return default
    value = float(value)
    return value if math.isfinite(value) else default


def reason_label(reason: str) -> str:
    """A short, bounded label for why a worker exited.

    ``no_heartbeat (killed by SIGKILL)`` -> ``no_heartbeat``; ``killed by SIGKILL`` ->
    ``SIGKILL``; ``exit 3`` -> ``exit_3``; anything else -> ``other`` (a label value must not
    carry free text: every distinct value is a series).
    """
    head = reason.split(" (", 1)[0].strip()
    if head.startswith("killed by "):
        sig = head.removeprefix("killed by ").replace(" ", "_")
        return sig if re.fullmatch(r"SIG[A-Z0-9]{1,10}|signal_\d{1,3}", sig) else "other"
    if re.fullmatch(r"exit -?\d{1,3}", head):
        return head.replace(" ", "_")
    return head if _REASON.fullmatch(head) else "other"
