"""The master's record of the runs that own replicas on the nodes: when it last heard each.

What a node relies on: a run that beats is seen as silent for no longer than since its last
beat; one the master never heard from counts as silent since the master started (a restarted
master must not call every run gone at once, nor keep one that never beats for ever); the
record is bounded in count and age.
"""

from __future__ import annotations

import pytest

from support.fake_clock import Clock
from troupe.runtime.tasks.master import run_owners
from troupe.runtime.tasks.master.run_owners import RunOwners


def test_silence_counts_from_the_last_beat_or_from_the_masters_start() -> None:
    clock = Clock()
    owners = RunOwners(clock)
    clock.now += 30
    owners.beat("master:a")
    clock.now += 4
    assert owners.silent_s("master:a") == 4
    assert owners.silent_s("master:never") == 34  # never heard: since the master started
    owners.beat("master:a")
    assert owners.silent_s("master:a") == 0


def test_the_record_forgets_the_longest_silent_past_its_bounds(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(run_owners, "MOST", 3)
    clock = Clock()
    owners = RunOwners(clock)
    for name in "abcd":
        owners.beat(f"master:{name}")
        clock.now += 1
    assert owners.silent_s("master:a") == clock.now - 1000.0  # forgotten: as if never heard
    assert owners.silent_s("master:b") == 3
    clock.now += run_owners.FORGET_AFTER_S + 1
    owners.beat("master:e")  # the others, silent past an hour, go
    assert owners.silent_s("master:d") == clock.now - 1000.0
    assert owners.silent_s("master:e") == 0


def test_an_owner_said_gone_is_silent_past_every_bound_until_it_beats(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A rerun that saw the run killed on its host says so: the nodes free its replicas' names
    at once rather than after 20 s of silence; a beat after that (it lives) counts as ever. The
    record of such owners is bounded too."""
    monkeypatch.setattr(run_owners, "MOST", 2)
    clock = Clock()
    owners = RunOwners(clock)
    owners.beat("master:killed")
    owners.gone("master:killed")
    assert owners.silent_s("master:killed") == run_owners.FORGET_AFTER_S
    clock.now += 5
    owners.beat("master:other")  # another owner's beat does not bring it back
    assert owners.silent_s("master:killed") == run_owners.FORGET_AFTER_S
    owners.beat("master:killed")
    assert owners.silent_s("master:killed") == 0
    for name in "abc":
        owners.gone(f"master:{name}")
    assert owners.silent_s("master:c") == run_owners.FORGET_AFTER_S
    assert owners.silent_s("master:a") == clock.now - 1000.0  # forgotten: as if never heard
