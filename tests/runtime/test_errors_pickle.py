"""troupe's errors pickle and copy as they are (report ap 5): ``RemoteError`` was rebuilt from its
``args`` (the formatted message alone) and failed, so a ``RemoteError`` raised in a
``ProcessPoolExecutor`` job broke the user's whole pool (``BrokenProcessPool``), every pending
future with it; ``JournalDamaged`` came back with its reason lost."""

from __future__ import annotations

import copy
import inspect
import pickle
from typing import Any

import pytest

from troupe.runtime import errors
from troupe.runtime.errors import JournalDamaged, RemoteError, TroupeError


def _same(a: BaseException, b: BaseException) -> None:
    assert type(a) is type(b) and a.args == b.args and str(a) == str(b)
    assert vars(a) == vars(b)


@pytest.mark.parametrize("move", [lambda e: pickle.loads(pickle.dumps(e)), copy.copy, copy.deepcopy])
def test_a_remote_error_keeps_what_it_carries(move: Any) -> None:
    error = RemoteError("builtins.ValueError", "bad frame 7", "Traceback ...", "local/render")
    moved = move(error)
    _same(error, moved)
    assert moved.remote_type == "builtins.ValueError" and moved.remote_message == "bad frame 7"
    assert moved.remote_traceback == "Traceback ..." and moved.actor == "local/render"


def test_a_damaged_journal_keeps_its_reason() -> None:
    error = JournalDamaged("the journal at j.db is damaged: ...", "database disk image is malformed")
    _same(error, pickle.loads(pickle.dumps(error)))


def _classes() -> list[type[TroupeError]]:
    return [c for _, c in inspect.getmembers(errors, inspect.isclass) if issubclass(c, TroupeError)]


@pytest.mark.parametrize("cls", _classes(), ids=lambda c: c.__name__)
def test_every_error_pickles(cls: type[TroupeError]) -> None:
    """Built with strings for whatever its constructor asks (its own fields are strings or
    defaults), it comes back the same."""
    needed = [
        p
        for p in list(inspect.signature(cls.__init__).parameters.values())[1:]
        if p.default is inspect.Parameter.empty and p.kind is p.POSITIONAL_OR_KEYWORD
    ]
    error = cls(*[f"{p.name} value" for p in needed]) if needed else cls("a message")
    _same(error, pickle.loads(pickle.dumps(error)))
