"""An ask's timeout that no ask can wait is refused at the caller, at once, naming the argument
(report ap 6): -1 and nan waited for nothing and said AskTimeout, "the node may be busy, hung or
gone", of a healthy node; '5' raised a bare TypeError from deep in the runtime. ``connect()``
given a malformed endpoint says the form it takes, not Unreachable."""

from __future__ import annotations

import math
from typing import Any

import pytest

from troupe.runtime import ConfigError, connect
from troupe.runtime.core.ref import ActorAddress, ActorRef


class _Sender:
    """Records what reaches the runtime."""

    def __init__(self) -> None:
        self.sent: list[Any] = []

    def ask_ref(self, *args: Any) -> Any:
        self.sent.append(args)


def _ref(sender: _Sender) -> ActorRef:
    return ActorRef(sender, ActorAddress.parse("w/echo"))  # type: ignore[arg-type]


@pytest.mark.parametrize("timeout", [0, -1, 0.0, math.nan, math.inf, -math.inf])
def test_a_timeout_that_is_not_finite_and_positive_is_a_value_error(timeout: float) -> None:
    sender = _Sender()
    with pytest.raises(ValueError) as refused:
        _ref(sender).ask("echo", 1, timeout=timeout)
    assert str(refused.value) == f"timeout must be a finite number of seconds > 0, got {timeout!r}"
    assert sender.sent == []


@pytest.mark.parametrize(("timeout", "shown"), [("5", "str '5'"), ([1], "list [1]")])
def test_a_timeout_that_is_no_number_is_a_type_error(timeout: Any, shown: str) -> None:
    sender = _Sender()
    with pytest.raises(TypeError) as refused:
        _ref(sender).ask("echo", 1, timeout=timeout)
    assert str(refused.value) == f"timeout must be a number of seconds, got {shown}"
    assert sender.sent == []


@pytest.mark.parametrize("timeout", [None, 5, 0.25, 1e9])
def test_good_timeouts_reach_the_runtime_as_given(timeout: float | None) -> None:
    sender = _Sender()
    _ref(sender).ask("echo", 1, timeout=timeout)
    assert [args[3] for args in sender.sent] == [timeout]


@pytest.mark.parametrize(
    ("endpoint", "said"),
    [
        ("127.0.0.1:42300", "must be tcp://HOST:PORT"),
        ("tcp://127.0.0.1", "must be tcp://HOST:PORT"),
        ("tcp://127.0.0.1:99999", "must be tcp://HOST:PORT"),
        ("tcp://127.0.0.1:*", "names a wildcard (*)"),
        (42300, "must be a str like tcp://HOST:PORT, got int"),
    ],
)
async def test_connect_refuses_an_endpoint_it_cannot_connect_to(endpoint: Any, said: str) -> None:
    with pytest.raises(ConfigError) as refused:
        async with connect(endpoint):
            pass
    assert str(refused.value).startswith("connect(): ") and said in str(refused.value)
    assert isinstance(refused.value, ValueError)
