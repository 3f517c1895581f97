"""An echo actor in a process of its own, for tests of traffic between two processes."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from support.actor_process import actor_process
from troupe.runtime import Actor, handles

__all__ = ["Echoer", "echo_process"]


class Echoer(Actor):
    """Answers each ask with its payload, from the reader that read it (no async handler)."""

    @handles("echo")
    def echo(self, payload: Any) -> Any:
        return payload


@contextmanager
def echo_process(timeout: float = 30.0) -> Iterator[str]:
    """Start the echo process (its echoer is ``n/echo/echoer``); yield the echoer's mailbox
    endpoint; stop and reap it on the way out."""
    with actor_process(Echoer, "echo", "echoer", timeout) as (endpoint, _proc):
        yield endpoint
