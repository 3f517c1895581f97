"""The engine's call holds what its replica receives whole (``call_fit``).

A replica of a smaller message bound, or fewer ``max_frames``, than the engine refused a call
that passed them on receipt, unread, and the engine waited out the call's 600 s. A replica now
says what it receives whole as it starts (``stage_info``), and the engine sends, of a batch, the
items that fit one call, in order; an item that alone cannot fit is its error, naming both
bounds. The engine's side over fake replicas is in ``test_engine_inflight.py``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from troupe.runtime import Runtime
from troupe.runtime.lowlevel import MemoryHub
from troupe.runtime.pipeline.call_fit import CALL_HEADROOM, CallLimits, fit_call, said_receives
from troupe.runtime.pipeline.stage import StageActor
from troupe.runtime.wire.codec import Codec

WAIT_S = 10.0
BOUND = 64 << 10
ENGINE = Codec(1 << 20)


def _replica(bound: int = BOUND, frames: int = 1024) -> CallLimits:
    """A call from an engine of ENGINE's codec to a replica that receives ``bound``, ``frames``."""
    return CallLimits.of(ENGINE, (bound, frames), "stage b", "stage a")


class Stage(StageActor):
    def process(self, item: Any) -> Any:
        return item


async def test_a_replica_says_what_it_receives_whole_as_it_starts() -> None:
    """``stage_info`` answers the replica's message bound and ``max_frames``, which the engine
    reads as what its calls must fit."""
    hub = MemoryHub()
    async with (
        Runtime("n", "a", hub.transport(name="a"), ask_timeout=WAIT_S) as a,
        Runtime("n", "b", hub.transport(name="b"), codec=Codec(BOUND, 8), drain_timeout=0.5) as b,
    ):
        await b.spawn(Stage, "stage")
        a.directory.learn("n/b/stage", b.cells["stage"].endpoint)
        info = await a.ref("n/b/stage").ask("stage_info", {"stage": "s"})
    assert info == {"hooks": [], "budget": BOUND, "frames": 8}
    assert said_receives(info) == (BOUND, 8)


def test_a_replica_that_says_nothing_is_read_as_an_older_one() -> None:
    for info in (
        {"hooks": []},
        None,
        {"budget": BOUND},
        {"budget": "1", "frames": 8},
        {"budget": 0, "frames": 8},
    ):
        assert said_receives(info) is None, info


def test_the_items_that_fit_one_call_go_in_order_the_first_always() -> None:
    """Inputs of 30,000 bytes to a replica of 64 KiB: two fit a call, the third and after are
    left for the next; one that fills a call alone goes alone."""
    entries = [bytes(30_000)] * 5
    assert fit_call(entries, _replica()) == (2, {})
    assert fit_call(entries[:1], _replica()) == (1, {})
    # Just under the room: one alone fits, and nothing beside it.
    alone = [bytes(BOUND - CALL_HEADROOM - 16), bytes(100)]
    assert fit_call(alone, _replica()) == (1, {})


def test_an_input_that_alone_cannot_fit_is_its_error_naming_both_bounds() -> None:
    entries = [b"x", bytes(BOUND), b"y", bytes(40_000), bytes(40_000)]
    fits, refused = fit_call(entries, _replica())
    assert fits == 4  # the one refused takes no room; the second of 40,000 does not fit beside the first
    assert list(refused) == [1]
    assert refused[1].startswith(f"MessageTooLarge: stage b: an input of {BOUND + 5} bytes"), refused[1]
    assert f"message bound is {BOUND} bytes (the engine's {1 << 20})" in refused[1]


def test_a_call_holds_the_arrays_the_replicas_frames_allow() -> None:
    """A replica of 4 frames receives a header and three arrays; an input of four arrays never."""
    entries = [{"x": np.zeros(2)}] * 5
    assert fit_call(entries, _replica(frames=4)) == (3, {})
    fits, refused = fit_call([[np.zeros(1)] * 4, {"x": np.zeros(1)}], _replica(frames=4))
    assert fits == 2 and list(refused) == [0]
    assert "an input of 4 arrays" in refused[0] and "max_frames is 4 (the engine's 1024" in refused[0]


def test_an_input_past_the_engines_own_limits_is_said_as_an_output_over_them() -> None:
    """Where the replica receives as much as the engine (or says nothing), what a call holds is
    the engine's own limits, and an input that alone passes them is said in the one line of
    every output over the engine's bound, naming the stage that made it."""
    codec = Codec(BOUND, 4)
    for receives in ((BOUND, 4), (1 << 20, 1024), None):
        limits = CallLimits.of(codec, receives, "stage b", "stage a")
        assert (limits.bound, limits.frames, limits.below_codec()) == (BOUND, 4, False)
        fits, refused = fit_call([b"x", bytes(BOUND - 100), [np.zeros(1)] * 4, b"y"], limits)
        assert fits == 4 and list(refused) == [1, 2]
        assert refused[1].startswith("MessageTooLarge: stage a: process returned an output of "), refused[1]
        assert f"the engine's message bound is {BOUND} bytes, less 1024 for the reply" in refused[1]
        assert "raise max_message_mb ([pipeline] of the pipeline's config" in refused[1]
        assert "stage a: process returned an output of 4 arrays" in refused[2]
        assert "the engine's max_frames is 4" in refused[2] and "no option raises" in refused[2]
    # One past the engine's bound by itself, which its codec would refuse: the same line.
    fits, refused = fit_call([bytes(BOUND + 10)], CallLimits.of(codec, None, "stage b", "stage a"))
    assert fits == 1 and refused[0].startswith("MessageTooLarge: stage a: process returned an output of")
    assert f"the engine's message bound is {BOUND} bytes" in refused[0]
