"""The encoder actor's latent cache holds one entry per sample, not one per group: the sampler pairs
a clip with other clips every epoch, so with ``group_size = 2`` an entry for the whole group almost
never came back (74 of 80 groups encoded where 22 clips were each seen 7 times). A sample is
found whatever group it comes in; the group's missing samples are encoded together."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from troupe.actors.encoders.encoder_actor import EncoderActor
from troupe.actors.encoders.latent_cache import LatentCache, cache_key

VAE = {"base_channels": 4, "seed": 7}  # troupe's VAE, small: its convolutions, GroupNorm and all
LIGHT = "troupe.actors.encoders.light:LightEncoder"


def _clips(n: int) -> torch.Tensor:
    """``n`` different clips (uint8, as trainers send them), one per seed."""
    seeded = (torch.Generator().manual_seed(s) for s in range(n))
    return torch.cat([torch.randint(0, 256, (1, 3, 4, 16, 16), generator=g, dtype=torch.uint8)
                      for g in seeded])  # fmt: skip


def _actor(**kwargs: Any) -> EncoderActor:
    return EncoderActor(encoder_kwargs=VAE, device="cpu", **{"memory_mb": 1, "disk_mb": 0, **kwargs})


async def _encode(actor: EncoderActor, video: torch.Tensor, tag: int = 0) -> dict[str, Any]:
    return await actor.encode({"tag": tag, "video": video})


async def test_a_group_whose_samples_were_cached_one_by_one_hits() -> None:
    clips = _clips(2)
    actor = _actor()
    try:
        alone = [await _encode(actor, clips[i : i + 1]) for i in range(2)]
        pair = await _encode(actor, clips)
    finally:
        actor.cache.close()
    assert [r["cached"] for r in alone] == [False, False] and pair["cached"] is True
    assert torch.equal(pair["latents"], torch.cat([r["latents"] for r in alone]))
    assert actor.counts["encoded"] == 2 and actor.counts["samples_encoded"] == 2
    stats = actor.cache.stats()
    assert (stats["memory_hits"], stats["misses"], stats["lookups"]) == (2, 2, 4)


async def test_a_clip_in_two_groups_is_encoded_once_and_put_back_in_its_place() -> None:
    a, b, c = _clips(3).split(1)
    actor, uncached = _actor(), _actor(memory_mb=0)
    try:
        first = await _encode(actor, torch.cat([a, b]))
        second = await _encode(actor, torch.cat([c, a]), tag=1)  # a again, second this time
        without_cache = await _encode(uncached, torch.cat([c, a]))
        c_alone = actor.encode_frames(c)  # the batch the missing sample was encoded in
    finally:
        actor.cache.close()
        uncached.cache.close()
    assert first["cached"] is False and second["cached"] is False  # c was not there
    assert actor.counts["encoded"] == 2 and actor.counts["samples_encoded"] == 3  # a once
    stats = actor.cache.stats()
    assert (stats["memory_hits"], stats["misses"]) == (1, 3)
    assert second["tag"] == 1 and tuple(second["latents"].shape) == (2, 4, 2, 4, 4)
    assert torch.equal(second["latents"][1], first["latents"][0])  # a, as it was encoded
    assert torch.equal(second["latents"][:1], c_alone)
    # Encoding the group again, uncached, gives the same to float rounding only: a convolution
    # on CPU rounds a batch of one otherwise than a larger one (README, Decisions).
    torch.testing.assert_close(second["latents"], without_cache["latents"], rtol=1e-5, atol=1e-5)


async def test_a_group_missing_every_sample_is_what_encoding_it_uncached_gives() -> None:
    clips = _clips(3)
    actor, uncached = _actor(), _actor(memory_mb=0)
    try:
        cached = await _encode(actor, clips)
        plain = await _encode(uncached, clips)
    finally:
        actor.cache.close()
        uncached.cache.close()
    assert cached["cached"] is False and torch.equal(cached["latents"], plain["latents"])
    assert uncached.counts["samples_encoded"] == 3 and uncached.cache.stats()["lookups"] == 0


async def test_samples_on_a_shared_disk_tier_hit_in_another_grouping(tmp_path: Path) -> None:
    a, b, c = _clips(3).split(1)
    writer = _actor(memory_mb=0, disk_mb=1, cache_dir=str(tmp_path))
    try:
        first = await _encode(writer, torch.cat([a, b]))
        writer.cache.flush()
    finally:
        writer.cache.close()
    reader = _actor(memory_mb=0, disk_mb=1, cache_dir=str(tmp_path))
    try:
        reply = await _encode(reader, torch.cat([b, c]))
        stats = reader.cache.stats()
    finally:
        reader.cache.close()
    assert torch.equal(reply["latents"][0], first["latents"][1])
    assert (stats["disk_hits"], stats["misses"]) == (1, 1)
    assert reader.counts["samples_encoded"] == 1 and reader.metrics()["samples_encoded_total"] == 1


async def test_an_entry_of_a_whole_group_from_an_older_troupe_is_never_taken(tmp_path: Path) -> None:
    """The group-keyed cache's entries stay in the folder until its bound culls them: a group of
    two is keyed on both samples together, which no lookup asks for now, and is never returned."""
    clips = _clips(2)
    actor = _actor(memory_mb=0, disk_mb=1, cache_dir=str(tmp_path))
    key_params = {"device": "cpu", "compile": False, "cudnn_benchmark": False, "bf16": False}
    old_key = cache_key(clips, key_params, actor.fingerprint)
    actor.cache.close()
    with LatentCache(0, 1 << 20, tmp_path) as old:
        old.put(old_key, torch.full((2, 4, 2, 4, 4), 9.0))  # what the old keying found for the group
        old.flush()
    actor = _actor(memory_mb=0, disk_mb=1, cache_dir=str(tmp_path))
    try:
        reply = await _encode(actor, clips)
        expected = actor.encode_frames(clips)
        stats = actor.cache.stats()
    finally:
        actor.cache.close()
    assert reply["cached"] is False and torch.equal(reply["latents"], expected)
    assert (stats["disk_hits"], stats["misses"], stats["corrupt"]) == (0, 2, 0)


async def test_an_encoder_that_does_not_keep_the_samples_apart_is_refused() -> None:
    """Each sample's latents are cached under its own key: an encoder whose output's first axis
    is not the batch's would have them cached under the wrong samples."""
    actor = EncoderActor(encoder=LIGHT, device="cpu", memory_mb=1, disk_mb=0)
    actor._encode_fn = lambda x: x.mean(dim=0, keepdim=True)
    try:
        with pytest.raises(ValueError, match=r"shape \(1, 3, 4, 16, 16\) for 2 samples: it must map each"):
            await _encode(actor, _clips(2))
    finally:
        actor.cache.close()
    assert actor.cache.stats()["memory"]["items"] == 0
