"""The encoder actor in a real node: tagged groups answered one by one, identical to encoding
in-process, cache hits, a shared disk tier, bad payloads refused without harm."""

from __future__ import annotations

import asyncio
import re
import sys
from pathlib import Path
from typing import Any

import anyio
import numpy as np
import pytest
import torch

from troupe import RemoteError
from troupe.actors.encoders.encoder_actor import EncoderActor, video_vae_encoder
from troupe.actors.encoders.light import LightEncoder
from troupe.runtime import ConfigError

LIGHT = "troupe.actors.encoders.light:LightEncoder"

ENCODER = """
[[workers]]
name = "w-{name}"

[[workers.actors]]
name = "{name}"
class = "troupe.actors.encoders.encoder_actor:EncoderActor"

[workers.actors.kwargs]
{kwargs}
"""
LIGHT_KWARGS = """encoder = "troupe.actors.encoders.light:LightEncoder"
encoder_kwargs = {{ seed = 3 }}
memory_mb = 4
disk_mb = 4
cache_dir = "{cache}"
"""
VAE_KWARGS = "encoder_kwargs = { base_channels = 4, seed = 7 }"


def _two_encoders(cache: Path) -> str:
    kwargs = LIGHT_KWARGS.format(cache=cache)
    return ENCODER.format(name="encode-a", kwargs=kwargs) + ENCODER.format(name="encode-b", kwargs=kwargs)


def _video(seed: int, shape: tuple[int, ...] = (2, 3, 4, 16, 16)) -> torch.Tensor:
    return torch.randint(0, 256, shape, generator=torch.Generator().manual_seed(seed), dtype=torch.uint8)


def _in_process(module: torch.nn.Module, video: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return module.eval()(video.float() / 127.5 - 1.0)


async def test_groups_come_back_tagged_identical_and_cached(troupe_cluster: Any, tmp_path: Path) -> None:
    cache = tmp_path / "latents"
    cluster = troupe_cluster(_two_encoders(cache))
    local = LightEncoder(seed=3)
    videos = {"g0": _video(0), "g1": _video(1)}
    async with cluster.client() as rt:
        a, b = rt.ref("encode-a"), rt.ref("encode-b")
        replies = await asyncio.gather(
            *(a.ask("encode", {"tag": tag, "video": v}, timeout=60) for tag, v in videos.items())
        )
        for reply, (tag, video) in zip(replies, videos.items(), strict=True):
            assert reply["tag"] == tag and reply["cached"] is False
            assert torch.equal(reply["latents"], _in_process(local, video))
        assert tuple(replies[0]["latents"].shape) == (2, 4, 2, 4, 4)

        again = await a.ask("encode", {"tag": "again", "video": videos["g0"]}, timeout=60)
        assert again["cached"] is True and torch.equal(again["latents"], replies[0]["latents"])
        stats = await a.ask("stats", timeout=30)
        assert stats["encoded"] == 2 and stats["groups"] == 3 and stats["samples"] == 6
        assert stats["samples_encoded"] == 4  # each sample is an entry of its own: hits count samples
        assert stats["cache"]["memory_hits"] == 2 and stats["switches"]["bf16"] is False

        # The other process of this host finds both groups' samples on the shared disk tier.
        with anyio.fail_after(30):
            while (await a.ask("stats", timeout=30))["cache"]["disk_writes"] < 4:
                await anyio.sleep(0.05)
        shared = await b.ask("encode", {"tag": 5, "video": videos["g1"]}, timeout=60)
        assert shared["cached"] is True and torch.equal(shared["latents"], replies[1]["latents"])
        b_stats = await b.ask("stats", timeout=30)
        assert b_stats["encoded"] == 0 and b_stats["cache"]["disk_hits"] == 2

        # Other preprocessing named by the sender: another key, encoded again.
        other = await a.ask("encode", {"tag": "p", "video": videos["g0"], "params": {"crop": 1}}, timeout=60)
        assert other["cached"] is False and torch.equal(other["latents"], replies[0]["latents"])


async def test_a_bad_payload_gets_a_clear_error_and_the_actor_goes_on(
    troupe_cluster: Any, tmp_path: Path
) -> None:
    cluster = troupe_cluster(
        ENCODER.format(name="encode-a", kwargs=LIGHT_KWARGS.format(cache=tmp_path / "c"))
    )
    bad = [
        ({"tag": 1}, "no 'video'"),
        ([1, 2], "must be a map"),
        ({"tag": 1, "video": "frames"}, "tensor or ndarray, got str"),
        (
            {"tag": 1, "video": np.zeros((3, 4, 4), dtype=np.uint8)},
            r"\(B, C, T, H, W\), got shape \(3, 4, 4\)",
        ),
        ({"tag": 1, "video": torch.zeros(1, 3, 2, 4, 4, dtype=torch.int32)}, "uint8 or floating point"),
        ({"tag": 1, "video": torch.zeros(1, 5, 2, 4, 4)}, "channels"),  # the encoder's own error
        ({"tag": 1, "video": torch.full((1, 3, 4, 16, 16), torch.nan)}, r"nan or inf \(3072 of 3072 "),
        ({"tag": 1, "video": _video(0).float().index_fill_(2, torch.tensor(1), torch.inf)}, "1536 of 6144"),
        ({"tag": 1, "video": _video(0), "params": [1]}, "'params' must be a map"),
        ({"tag": 1, "video": _video(0), "params": {"crop": b"x"}}, "'params' must be JSON data"),
    ]
    async with cluster.client() as rt:
        ref = rt.ref("encode-a")
        for payload, message in bad:
            with pytest.raises(RemoteError) as err:
                await ref.ask("encode", payload, timeout=30)
            assert err.value.remote_message and re.search(message, err.value.remote_message)
        ok = await ref.ask("encode", {"tag": "ok", "video": _video(2).numpy()}, timeout=60)
    assert ok["tag"] == "ok" and torch.equal(ok["latents"], _in_process(LightEncoder(seed=3), _video(2)))


async def test_the_default_encoder_is_troupes_vae(troupe_cluster: Any) -> None:
    cluster = troupe_cluster(ENCODER.format(name="encode", kwargs=VAE_KWARGS))
    video = _video(4, (1, 3, 8, 16, 16))
    async with cluster.client() as rt:
        reply = await rt.ref("encode").ask("encode", {"tag": None, "video": video}, timeout=60)
        unit = video.float() / 127.5 - 1.0  # float frames are taken as they are
        as_float = await rt.ref("encode").ask("encode", {"tag": 1, "video": unit}, timeout=60)
    local = video_vae_encoder(base_channels=4, seed=7)
    assert torch.equal(reply["latents"], _in_process(local, video))
    assert torch.equal(as_float["latents"], reply["latents"]) and as_float["cached"] is False
    assert tuple(reply["latents"].shape) == (1, 4, 4, 4, 4)


def test_the_encoder_is_frozen_and_the_gpu_switches_are_off_on_cpu() -> None:
    actor = EncoderActor(encoder=LIGHT, device="cpu", compile=True, cudnn_benchmark=True, bf16=True)
    assert not any(p.requires_grad for p in actor.module.parameters()) and not actor.module.training
    assert actor.switches == {"compile": False, "cudnn_benchmark": False, "bf16": False}
    actor.cache.close()


def test_weights_and_kwargs_change_the_fingerprint(tmp_path: Path) -> None:
    weights = tmp_path / "w.pt"
    torch.save(LightEncoder(seed=9).state_dict(), weights)
    fingerprints = {
        EncoderActor(encoder=LIGHT, device="cpu").fingerprint,
        EncoderActor(encoder=LIGHT, encoder_kwargs={"seed": 1}, device="cpu").fingerprint,
        EncoderActor(encoder=LIGHT, weights=str(weights), device="cpu").fingerprint,
    }
    assert len(fingerprints) == 3
    assert EncoderActor(encoder=LIGHT, device="cpu").fingerprint in fingerprints  # stable
    loaded = EncoderActor(encoder=LIGHT, weights=str(weights), device="cpu")
    assert torch.equal(loaded.module.conv.weight, LightEncoder(seed=9).conv.weight)


FACTORY = """
import torch
from torch import nn
from {layers} import Squash
STRIDE = {stride}
def factory(seed: int = 0):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Conv3d(3, 4, 3, stride=(1, STRIDE, STRIDE), padding=1), nn.{act}(), Squash())
"""
LAYERS = """
import torch
from torch import nn
class Squash(nn.Module):
    def forward(self, x):
        return torch.{squash}(x)
"""


def _edited_factory(monkeypatch: pytest.MonkeyPatch, folder: Path, name: str, **code: str) -> str:
    """A factory module of torch's own layers and a parameter-free layer of a file of its own,
    written as ``code`` says and imported afresh, as a user's edited file is by the next run."""
    folder.mkdir(exist_ok=True)
    (folder / f"{name}_layers.py").write_text(LAYERS.format(squash=code.get("squash", "tanh")))
    stride, act = code.get("stride", "1"), code.get("act", "Tanh")
    (folder / f"{name}.py").write_text(FACTORY.format(layers=f"{name}_layers", stride=stride, act=act))
    monkeypatch.syspath_prepend(str(folder))
    for module in (name, f"{name}_layers"):
        monkeypatch.delitem(sys.modules, module, raising=False)
    return f"{name}:factory"


@pytest.mark.parametrize(
    "edit",
    [{"stride": "2"}, {"act": "ReLU"}, {"squash": "sigmoid"}],
    ids=["stride-in-factory-file", "activation-layer", "layer-class-in-another-file"],
)
def test_an_edited_factory_is_encoded_again_not_found_in_the_cache(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, edit: dict[str, str]
) -> None:
    """No weight changes here (the state dict is the same): only the code, which the cache must
    not answer for with the old code's latents (of another shape, for a stride)."""
    cache = {"memory_mb": 4, "disk_mb": 4, "cache_dir": str(tmp_path / "latents"), "device": "cpu"}
    video = _video(1)
    before = EncoderActor(encoder=_edited_factory(monkeypatch, tmp_path / "src", "enc_edit"), **cache)
    before._encode_group(video, {})
    before.cache.close()
    after = EncoderActor(encoder=_edited_factory(monkeypatch, tmp_path / "src", "enc_edit", **edit), **cache)
    latents, cached = after._encode_group(video, {})
    assert not cached and torch.equal(latents, _in_process(after.module, video))
    assert after.fingerprint != before.fingerprint
    after.cache.close()
    again = EncoderActor(encoder=_edited_factory(monkeypatch, tmp_path / "src", "enc_edit", **edit), **cache)
    assert again.fingerprint == after.fingerprint and again._encode_group(video, {})[1]  # stable: hits
    again.cache.close()


@pytest.mark.parametrize(
    ("encoder", "message"),
    [
        ("troupe.actors.encoders.nowhere:X", "cannot import 'troupe.actors.encoders.nowhere:X'"),
        ("troupe.actors.encoders.light", "must name a class or factory"),
        ("troupe.actors.encoders.latent_cache:cache_key", "cannot build .*cache_key.*missing"),
        ("troupe.actors.encoders.latent_cache:_MAGIC", "must name a class or factory"),
        ("troupe.actors.encoders.light:__doc__", "must name a class or factory"),
    ],
)
def test_a_bad_encoder_path_is_a_config_error(encoder: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        EncoderActor(encoder=encoder, device="cpu")


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"memory_mb": -1}, "memory_mb"),
        ({"disk_mb": -2}, "-2"),
        ({"threads": 0}, "threads"),
        ({"inline_below_ms": -1}, "inline_below_ms must be >= 0, got -1"),
        ({"disk_mb": 0.01, "cache_dir": "/nowhere"}, r"disk_mb = 0.01: .* keeps nothing: its index alone"),
    ],
)
def test_bad_bounds_are_config_errors(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        EncoderActor(encoder=LIGHT, device="cpu", **kwargs)
