"""A stage output holding a tensor the torch extension cannot send fails its own item alone.

A meta tensor (or a conjugate view, before the extension resolved it) made the extension raise a
RuntimeError or NotImplementedError, which escaped the replica's reply path: on the engine plane
the worker died with its whole batch, on the direct plane the take never got its answer (60 s
later every item of the batch ran again). Now the codec makes it an EncodeError, and only its
item fails, naming the stage; a conjugate view travels as the values it shows.
"""

from __future__ import annotations

from typing import Any

import anyio
import anyio.lowlevel
import pytest
import torch

from support.held_replica import held_replica
from troupe.runtime.pipeline.stage import StageActor

BOUND = 10.0
META = 5  # the seed whose output holds a meta tensor
CONJ = 6  # the seed whose output holds a conjugate view


class TensorStage(StageActor):
    def process(self, item: dict[str, Any]) -> dict[str, Any]:
        seed = item["seed"]
        if seed == META:
            return {"v": torch.empty(2, device="meta")}
        if seed == CONJ:
            return {"v": torch.tensor([1 + 2j, 3 - 1j]).conj()}
        return {"v": torch.full((2,), float(seed))}


def _keys() -> list[str]:
    return [f"p-{seed:06d}/a/0" for seed in range(4, 8)]


def _items() -> list[dict[str, Any]]:
    return [{"task_id": f"p-{seed:06d}", "seed": seed} for seed in range(4, 8)]


def _check(outcomes: dict[int, Any]) -> None:
    """The outputs by seed: the meta one an error naming the stage, the others their values."""
    error = outcomes[META]["error"]
    assert error.startswith("EncodeError: stage a: process returned an output that cannot be sent"), error
    assert "meta device holds no data" in error, error
    assert outcomes[CONJ]["ok"]["v"].tolist() == [1 - 2j, 3 + 1j]
    for seed in (4, 7):
        assert outcomes[seed]["ok"]["v"].tolist() == [float(seed)] * 2


async def test_on_the_engine_plane_only_the_meta_tensors_item_fails() -> None:
    with anyio.fail_after(BOUND):
        async with held_replica(TensorStage, _keys()) as (stage, _):
            reply = await stage.ask("process", {"items": _items()})
            again = await stage.ask("process", {"items": _items()})  # the replica goes on
    _check(dict(zip(range(4, 8), reply["outcomes"], strict=True)))
    _check(dict(zip(range(4, 8), again["outcomes"], strict=True)))


@pytest.mark.parametrize("inline_below", [0, 4096], ids=["held", "inline"])
async def test_on_the_direct_plane_only_the_meta_tensors_item_fails(inline_below: int) -> None:
    """Held outputs (``inline_below`` 0) are encoded when the next stage takes them: the take is
    answered at once, the meta tensor's key refused alone."""
    with anyio.fail_after(BOUND):
        async with held_replica(TensorStage, _keys()) as (stage, outbox):
            reply = await stage.ask(
                "process_direct", {"items": _items(), "hold": _keys(), "inline_below": inline_below}
            )
            outcomes = dict(zip(range(4, 8), reply["outcomes"], strict=True))
            held = {seed: o["held"] for seed, o in outcomes.items() if "held" in o}
            if held:
                taken = await outbox.ask("stage_take", {"keys": list(held.values())})
                for seed, key in held.items():
                    refused = taken["refused"].get(key)
                    outcomes[seed] = {"error": refused} if refused else {"ok": taken["items"][key]}
    assert bool(held) == (inline_below == 0), held
    _check(outcomes)
