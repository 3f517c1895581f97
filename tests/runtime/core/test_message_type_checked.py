"""A message type that is no string is refused at the caller, at once: the receiver refused it
(``sender, target and type must be strings``) and the ask waited out its whole deadline."""

from __future__ import annotations

from typing import Any

import pytest

from troupe.runtime.core.ref import ActorAddress, ActorRef


class _Sender:
    """Records what reaches the runtime (nothing should)."""

    def __init__(self) -> None:
        self.sent: list[Any] = []

    def tell_ref(self, *args: Any) -> Any:
        self.sent.append(args)

    def ask_ref(self, *args: Any) -> Any:
        self.sent.append(args)


@pytest.mark.parametrize("msg_type", [5, None, b"echo"])
def test_ask_and_tell_refuse_a_message_type_that_is_no_string(msg_type: Any) -> None:
    sender = _Sender()
    ref = ActorRef(sender, ActorAddress.parse("w/echo"))  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="msg_type must be a str"):
        ref.ask(msg_type, 1)
    with pytest.raises(TypeError, match="msg_type must be a str"):
        ref.tell(msg_type, 1)
    assert sender.sent == []
