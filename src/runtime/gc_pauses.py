"""The garbage collector's pauses in this process, and the thresholds a master runs with.

A master holds every task of its jobs as Python objects, a few per task, all long-lived. With
CPython's default thresholds (700, 10, 10) its collector walked them about once a second while
it dispatched: in ``troupe bench scale --workers 1000 --tasks 100`` (2026-12-03) 40 full
collections of about 136 ms of CPU each, and 7.8 s of the master's 41 s of CPU went to the
collector. Every lease the master grants waits behind such a pause. With
:data:`MASTER_GC_THRESHOLDS` the same run spent 1.2 s in it (35 s in all). What the collector
frees (reference cycles; everything else goes by reference counting) waits longer: ten
thousand allocations rather than seven hundred for the youngest, about a tenth of a second of a
master dispatching 5,000 tasks a second (some 90,000 allocations a second).

Worker processes keep CPython's defaults: a cycle there may hold a tensor (an exception's
traceback does), and freeing it later holds memory longer.

:func:`collector_paused` holds the collector off while a big batch of long-lived objects is
made (the master's book taking in a job of a million tasks): none of them is garbage, and the
collections their allocations set off, each walking everything made so far, were half of that
work (4.2 s per million tasks against 2.2 s, 2026-12-03).

:class:`GcPauses` counts every collection of the process and the wall time it took (through
``gc.callbacks``); the master's ``status`` shows its figures (``gc``).
"""

from __future__ import annotations

import gc
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

__all__ = ["MASTER_GC_THRESHOLDS", "GcPauses", "collector_paused", "gc_pauses", "use_master_gc_thresholds"]

MASTER_GC_THRESHOLDS = (10_000, 10, 10)


def use_master_gc_thresholds() -> None:
    """Collect as a master should (see the module's doc): call once, in the master's process."""
    gc.set_threshold(*MASTER_GC_THRESHOLDS)


@contextmanager
def collector_paused() -> Iterator[None]:
    """No automatic collection inside (see the module's doc); the collector is as it was after.
    Only for code that makes long-lived objects and no garbage cycles, and ends: a cycle made
    inside waits for the next collection after."""
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


class GcPauses:
    """Collections of this process, by generation, and how long they stopped it.

    A collection holds the GIL from its start to its end, so one start time serves every
    thread that may trigger one.
    """

    def __init__(self) -> None:
        self.collections = [0, 0, 0]
        self.pause_s = 0.0
        self.longest_pause_s = 0.0
        self._started = 0.0

    def on_gc(self, phase: str, info: dict[str, Any]) -> None:
        """The ``gc.callbacks`` hook."""
        if phase == "start":
            self._started = time.perf_counter()
            return
        pause = time.perf_counter() - self._started
        self.collections[info["generation"]] += 1
        self.pause_s += pause
        if pause > self.longest_pause_s:
            self.longest_pause_s = pause

    def figures(self) -> dict[str, Any]:
        """The thresholds in force, collections by generation, and the pauses, in seconds."""
        return {
            "thresholds": list(gc.get_threshold()),
            "collections": list(self.collections),
            "pause_s": round(self.pause_s, 6),
            "longest_pause_s": round(self.longest_pause_s, 6),
        }


_pauses: GcPauses | None = None


def gc_pauses() -> GcPauses:
    """This process's :class:`GcPauses`, hooked into the collector on the first call."""
    global _pauses
    if _pauses is None:
        _pauses = GcPauses()
        gc.callbacks.append(_pauses.on_gc)
    return _pauses
