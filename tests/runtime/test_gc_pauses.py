"""The collector's pauses, counted for the master's status, and the master's thresholds."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from troupe.runtime.gc_pauses import (
    MASTER_GC_THRESHOLDS,
    GcPauses,
    collector_paused,
    gc_pauses,
    use_master_gc_thresholds,
)


@pytest.fixture
def thresholds() -> Iterator[None]:
    before = gc.get_threshold()
    try:
        yield
    finally:
        gc.set_threshold(*before)


def test_every_collection_is_counted_by_generation_with_its_pause() -> None:
    pauses = GcPauses()
    gc.callbacks.append(pauses.on_gc)
    try:
        gc.collect(2)
        gc.collect(0)
        gc.collect(0)
    finally:
        gc.callbacks.remove(pauses.on_gc)
    figures = pauses.figures()
    # Other collections may run meanwhile (this test allocates): at least ours are counted.
    assert figures["collections"][2] >= 1 and figures["collections"][0] >= 2
    assert figures["pause_s"] >= figures["longest_pause_s"] > 0


def test_the_process_has_one_watcher_hooked_once() -> None:
    first = gc_pauses()
    assert gc_pauses() is first
    assert gc.callbacks.count(first.on_gc) == 1
    before = first.collections[2]
    gc.collect(2)
    assert first.collections[2] == before + 1


def test_a_master_collects_less_often_than_cpython_s_default(thresholds: None) -> None:
    gc.set_threshold(700, 10, 10)
    use_master_gc_thresholds()
    assert gc.get_threshold() == MASTER_GC_THRESHOLDS
    assert GcPauses().figures()["thresholds"] == list(MASTER_GC_THRESHOLDS)
    # Fewer passes over a master's tables: every generation waits longer than the default's.
    assert all(ours >= default for ours, default in zip(MASTER_GC_THRESHOLDS, (700, 10, 10), strict=True))
    assert MASTER_GC_THRESHOLDS[0] > 700


def test_no_collection_runs_while_paused_and_the_collector_is_as_it_was_after() -> None:
    """A big batch of allocations inside the pause sets off no collection; the collector is on
    again after (also when the block raises), and stays off if it was off."""
    pauses = GcPauses()
    gc.callbacks.append(pauses.on_gc)
    try:
        before = sum(pauses.figures()["collections"])
        with collector_paused():
            kept = [[i] for i in range(50_000)]  # five times the master's first threshold
            inside = sum(pauses.figures()["collections"])
            assert not gc.isenabled()
        assert inside == before and len(kept) == 50_000  # (they run again from here)
        assert gc.isenabled()
        with pytest.raises(RuntimeError), collector_paused():
            raise RuntimeError("inside")
        assert gc.isenabled()
        gc.disable()
        try:
            with collector_paused():
                pass
            assert not gc.isenabled()
        finally:
            gc.enable()
    finally:
        gc.callbacks.remove(pauses.on_gc)
