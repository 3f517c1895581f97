"""Where the encoder actor encodes: short encodes on the event loop (no thread hop per group),
long ones on a worker thread; and no cache work when the cache has no tier."""

from __future__ import annotations

import threading
import time

import pytest
import torch

from troupe.actors.encoders.encoder_actor import EncoderActor
from troupe.actors.encoders.light import LightEncoder
from troupe.actors.training.train_config import load_train_config
from troupe.runtime import ConfigError

LIGHT = "troupe.actors.encoders.light:LightEncoder"


def _video(seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (2, 3, 4, 16, 16), generator=gen, dtype=torch.uint8)


def _expected(video: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return LightEncoder(seed=3).eval()(video.float() / 127.5 - 1.0)


def _actor(**kwargs: object) -> EncoderActor:
    return EncoderActor(encoder=LIGHT, encoder_kwargs={"seed": 3}, device="cpu", **kwargs)  # type: ignore[arg-type]


def _record_threads(actor: EncoderActor, seen: list[int], pause_s: float = 0.0) -> None:
    """Wrap the actor's encode path to note the thread each group is encoded on."""
    encode_frames = actor.encode_frames

    def recording(video: torch.Tensor) -> torch.Tensor:
        seen.append(threading.get_ident())
        if pause_s:
            time.sleep(pause_s)  # an encode at least this long
        return encode_frames(video)

    actor.encode_frames = recording  # type: ignore[method-assign]


async def test_short_encodes_run_on_the_event_loop_after_the_first() -> None:
    threads_seen: list[int] = []
    actor = _actor(memory_mb=0, disk_mb=0, inline_below_ms=60_000)
    _record_threads(actor, threads_seen)
    loop_thread = threading.get_ident()
    try:
        for i in range(3):
            reply = await actor.encode({"tag": i, "video": _video(i)})
            assert reply["tag"] == i and torch.equal(reply["latents"], _expected(_video(i)))
    finally:
        actor.cache.close()
    # The first group's time is unknown: a thread; the next ones took less than the bound.
    assert threads_seen[0] != loop_thread and threads_seen[1:] == [loop_thread, loop_thread]
    assert actor.counts["inline"] == 2 and actor.counts["groups"] == 3


@pytest.mark.parametrize(("inline_below_ms", "pause_s"), [(0.0, 0.0), (50.0, 0.1)])
async def test_long_encodes_or_a_zero_bound_use_a_worker_thread(
    inline_below_ms: float, pause_s: float
) -> None:
    threads_seen: list[int] = []
    actor = _actor(memory_mb=0, disk_mb=0, inline_below_ms=inline_below_ms)
    _record_threads(actor, threads_seen, pause_s)
    loop_thread = threading.get_ident()
    try:
        for i in range(3):
            reply = await actor.encode({"tag": i, "video": _video(i)})
            assert torch.equal(reply["latents"], _expected(_video(i)))
    finally:
        actor.cache.close()
    assert len(threads_seen) == 3 and loop_thread not in threads_seen
    assert actor.counts["inline"] == 0


async def test_without_a_cache_tier_nothing_is_looked_up() -> None:
    actor = _actor(memory_mb=0, disk_mb=0)
    try:
        assert not actor.cache.enabled
        for _ in range(2):
            reply = await actor.encode({"tag": "same", "video": _video(0)})
            assert reply["cached"] is False and torch.equal(reply["latents"], _expected(_video(0)))
    finally:
        actor.cache.close()
    stats = actor.cache.stats()
    assert stats["lookups"] == 0 and stats["memory"]["items"] == 0
    assert actor.counts["encoded"] == 2


async def test_with_a_memory_tier_the_same_group_hits() -> None:
    actor = _actor(memory_mb=1, disk_mb=0)
    try:
        assert actor.cache.enabled
        first = await actor.encode({"tag": 1, "video": _video(0)})
        again = await actor.encode({"tag": 2, "video": _video(0)})
    finally:
        actor.cache.close()
    assert first["cached"] is False and again["cached"] is True
    assert torch.equal(again["latents"], first["latents"]) and actor.counts["encoded"] == 1


def _train_data(**encoders: object) -> dict[str, object]:
    return {
        "train": {"dataset": "{out}/data", "steps": 4, "clip_frames": 4, "size": [16, 16]},
        "model": {"d_model": 32, "layers": 1, "heads": 2},
        "encoders": {"encoder": LIGHT, **encoders},
    }


def test_the_train_config_sets_the_inline_bound() -> None:
    assert load_train_config(_train_data()).encoders.inline_below_ms == 50.0
    assert load_train_config(_train_data(inline_below_ms=0)).encoders.inline_below_ms == 0.0
    with pytest.raises(ConfigError) as info:
        load_train_config(_train_data(inline_below_ms=-5))
    assert "encoders.inline_below_ms" in str(info.value) and "\n" not in str(info.value)
