"""What a master's driver does with an event, for tests of the journal without a master: the
book handles it, its records go to the journal first, the rest comes back."""

from __future__ import annotations

from troupe.runtime.tasks.book import TaskBook, split_commands
from troupe.runtime.tasks.journal import Journal
from troupe.runtime.tasks.state import Command, Event, Lease


def drive(book: TaskBook, journal: Journal, event: Event, now: float) -> list[Command]:
    """Persist the records first, then hand back the rest."""
    records, others = split_commands(book.handle(event, now))
    journal.append(records)
    return others


def leases(commands: list[Command]) -> list[Lease]:
    return [c for c in commands if isinstance(c, Lease)]
