"""A node's ``resolve`` errors show a peer's address cut: a 100 KB address came back whole, in
the error's message (and again in its traceback)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from troupe.runtime.core.ref import ActorAddress
from troupe.runtime.errors import TroupeError, UnknownActor, Unreachable
from troupe.runtime.node.config import NodeConfig
from troupe.runtime.node.node import Node

HUGE = "x" * 100_000


@pytest.mark.parametrize(
    ("address", "error"),
    [
        (ActorAddress("", "", HUGE), UnknownActor),
        (ActorAddress("", HUGE, "echo"), UnknownActor),
        (ActorAddress(HUGE, "w", "echo"), Unreachable),
        (ActorAddress("", "node", HUGE), UnknownActor),
    ],
    ids=["actor", "process", "node", "node-process-actor"],
)
def test_a_huge_address_is_shown_cut(address: ActorAddress, error: type[TroupeError]) -> None:
    node = Node(NodeConfig(name="n1"), handle_signals=False)
    node.runtime = SimpleNamespace(cells={}, address="tcp://127.0.0.1:47651")  # type: ignore[assignment]
    with pytest.raises(error) as refused:
        node._resolve_here(address)
    said = str(refused.value)
    assert "xxx..." in said and len(said) < 600, said


def test_a_malformed_address_is_shown_cut() -> None:
    with pytest.raises(ValueError, match=r"^bad actor address 'x/x/.{0,200}\.\.\.: use node/") as refused:
        ActorAddress.parse("x/" * 50_000)
    assert len(str(refused.value)) < 300
