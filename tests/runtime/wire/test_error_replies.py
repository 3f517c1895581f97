"""A handler's exception becomes an error reply whatever it holds: one whose ``__str__`` raises,
or whose message is 80 MB, ended the worker as its reply was made (every actor of the process
gone, every ask in flight a PeerLost) instead of coming back as a RemoteError."""

from __future__ import annotations

import msgpack
import pytest

from troupe.runtime.errors import (
    BadFrame,
    JournalError,
    RemoteError,
    TaskError,
    TroupeError,
    UnknownActor,
    error_class,
)
from troupe.runtime.wire.replies import MESSAGE_MOST, TRACEBACK_MOST, error_payload, raise_error_payload


class Unprintable(Exception):
    def __str__(self) -> str:
        raise RuntimeError("str fails")


def _raised(exc: BaseException) -> BaseException:
    try:
        raise exc
    except BaseException as caught:
        return caught


def test_an_exception_whose_str_raises_is_still_an_error_reply() -> None:
    payload = error_payload(_raised(Unprintable()), "w/a", from_handler=True)
    assert payload["message"] == "<Unprintable: its str() raised RuntimeError>"
    assert payload["type"].endswith("Unprintable")
    with pytest.raises(RemoteError, match="its str\\(\\) raised RuntimeError"):
        raise_error_payload(payload)


def test_a_huge_message_is_cut_and_says_how_much() -> None:
    big = "x" * (80 * 2**20)
    payload = error_payload(_raised(ValueError(big)), "w/a", from_handler=True)
    assert payload["message"].startswith("x" * 100)
    assert payload["message"].endswith(f"... ({len(big) - MESSAGE_MOST} more characters cut)")
    assert len(payload["traceback"]) < TRACEBACK_MOST + 100
    assert len(msgpack.packb(payload)) < 2**20  # well within the wire's bound


def test_a_plain_error_is_unchanged() -> None:
    payload = error_payload(_raised(KeyError("boom")), "w/a", from_handler=True)
    assert payload["message"] == "'boom'" and "KeyError: 'boom'" in payload["traceback"]


def test_an_error_about_the_message_has_a_one_line_traceback() -> None:
    """A bad frame, a delivery error or a control's refusal shows the peer no file of the
    receiver's (a bad frame's answer carried 700 to 1,700 characters of them); a handler's
    failure keeps its traceback for its asker."""
    for exc in (_raised(BadFrame("header is not valid")), _raised(UnknownActor("no actor 'a'"))):
        payload = error_payload(exc, "")
        assert payload["traceback"] == f"{payload['type']}: {payload['message']}"
    handler = error_payload(_raised(UnknownActor("nested")), "w/a", from_handler=True)
    assert handler["code"] == "remote_error" and "Traceback (most recent call last)" in handler["traceback"]


def test_an_error_comes_back_as_its_own_class_not_a_subclass_of_it() -> None:
    """jx 2: a subclass that keeps its parent's code (JournalBusy, KindNotRun) took the code over,
    so a master's disk-full JournalError came back as JournalBusy, "another master holds the
    journal", and any TaskError as KindNotRun."""
    from troupe.runtime.tasks.journal_lock import JournalBusy
    from troupe.runtime.tasks.task_runner import KindNotRun

    for sent, kept in (
        (JournalError("append failed: [Errno 28] No space left on device"), JournalError),
        (TaskError("refused"), TaskError),
        (JournalBusy("journal j is held by another master (pid 1)"), JournalError),
        (KindNotRun("no actor runs kind 'k'"), TaskError),
    ):
        with pytest.raises(TroupeError) as came:
            raise_error_payload(error_payload(_raised(sent), "mem://master"))
        assert type(came.value) is kept and str(came.value) == str(sent)
    every: list[type[TroupeError]] = [TroupeError]
    for cls in every:  # grows as it goes: the whole tree
        every.extend(cls.__subclasses__())
        if "code" in vars(cls):
            assert error_class(cls.code) is cls, cls
