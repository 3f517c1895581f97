"""A tensor travels detached: its values, dtype and shape, not its autograd state.

``requires_grad``, a ``.grad`` and ``nn.Parameter`` were dropped on the wire without a word in
docs/PROTOCOL.md 6.2, which lists what a tensor keeps. They are still not carried (a received
tensor is a view of a frame, no leaf of the sender's graph), and the protocol says so; these
tests hold the codec to what it says.
"""

from __future__ import annotations

from pathlib import Path

import torch

from troupe.runtime.wire.codec import Codec

PROTOCOL = Path(__file__).resolve().parents[3] / "docs" / "PROTOCOL.md"


def _roundtrip(value: torch.Tensor) -> torch.Tensor:
    codec = Codec()
    got = codec.decode([bytes(f) for f in codec.encode_reply(1, "n/p", value)]).payload
    assert isinstance(got, torch.Tensor)
    return got


def test_a_tensor_that_requires_grad_arrives_detached_with_its_values() -> None:
    leaf = torch.ones(3, requires_grad=True)
    (leaf * 2).sum().backward()
    assert leaf.grad is not None
    got = _roundtrip(leaf)
    assert not got.requires_grad and got.grad is None and got.grad_fn is None
    assert torch.equal(got, torch.ones(3))


def test_a_non_leaf_of_a_graph_arrives_as_its_values() -> None:
    got = _roundtrip(torch.ones(3, requires_grad=True) * 2)
    assert not got.requires_grad and got.grad_fn is None
    assert torch.equal(got, torch.full((3,), 2.0))


def test_a_parameter_arrives_as_a_plain_tensor() -> None:
    got = _roundtrip(torch.nn.Parameter(torch.arange(4.0)))
    assert type(got) is torch.Tensor and not got.requires_grad
    assert torch.equal(got, torch.arange(4.0))


def test_the_protocol_says_a_tensor_travels_detached() -> None:
    said = " ".join(PROTOCOL.read_text(encoding="utf-8").split())
    assert "A tensor travels detached" in said
    assert "`requires_grad`, its `.grad` and `nn.Parameter` are not carried" in said
