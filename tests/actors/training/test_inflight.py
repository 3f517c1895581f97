"""One trainer rank's in-flight pipeline: the same losses as encoding inside the trainer, at most K
batches in flight, equal load over the encoder actors, and no batch trained with a hole when an
actor dies or hangs."""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Iterator
from typing import Any

import anyio
import pytest
import torch

from troupe.actors.encoders.encoder_actor import EncoderActor, video_vae_encoder
from troupe.actors.encoders.light import LightEncoder
from troupe.actors.training.inflight import (
    GroupFailed,
    InflightConfig,
    SampleGroup,
    actor_encoder,
    encode_video,
    train_local,
    train_remote,
)
from troupe.models.world_model import ACTION_DIM, FlowBatch, WorldModel, WorldModelConfig
from troupe.runtime import Unreachable

B, FRAMES, SIDE = 4, 8, 16  # latents (B, 4, 4, 4, 4) from the VAE and the light encoder alike


def _batches(n: int, seed: int = 0, batch: int = B) -> list[dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    return [
        {
            "video": torch.randint(0, 256, (batch, 3, FRAMES, SIDE, SIDE), generator=g, dtype=torch.uint8),
            "actions": torch.randn((batch, FRAMES, ACTION_DIM), generator=g),
            "action_mask": torch.rand((batch, FRAMES, ACTION_DIM), generator=g) > 0.3,
        }
        for _ in range(n)
    ]


def _world_model_step() -> Any:
    """A train step of a tiny world model: first latent frame and first actions given, the rest
    predicted; noise and flow times drawn from a generator seeded by the step."""
    torch.manual_seed(0)
    model = WorldModel(WorldModelConfig(latent_channels=4, d_model=32, layers=2, heads=2))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    steps = [0]

    def step(batch: dict[str, Any]) -> torch.Tensor:
        lat = batch["latents"]
        b, tl, ta = lat.shape[0], lat.shape[2], batch["actions"].shape[1]
        lat_cond = torch.zeros((b, tl), dtype=torch.bool)
        lat_cond[:, 0] = True
        act_cond = torch.zeros((b, ta), dtype=torch.bool)
        act_cond[:, :2] = True
        actions, valid = batch["actions"], batch["action_mask"]
        flow = FlowBatch(lat, lat_cond, ~lat_cond, actions, valid, act_cond, ~act_cond)
        loss = model.loss(flow, generator=torch.Generator().manual_seed(steps[0])).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
        steps[0] += 1
        return loss.detach()

    return step


def _light_fakes(counts: Counter[int] | None = None) -> Any:
    """In-process encoder actors that all run one light encoder, counting the asks each gets."""
    module = LightEncoder(seed=3).eval()

    async def encode(index: int, group: SampleGroup) -> torch.Tensor:
        if counts is not None:
            counts[index] += 1
        await anyio.lowlevel.checkpoint()  # replies come back interleaved, as over the wire
        return encode_video(module, group.video)

    return encode


async def test_losses_through_encoder_actors_equal_encoding_inside_the_trainer() -> None:
    batches = _batches(5)
    config = InflightConfig(inflight=2, group_size=2, rank=1)
    local = train_local(batches, _world_model_step(), video_vae_encoder(base_channels=4, seed=7), config)

    # Encoder actors in this process: the actor's own handler, cache and all, on the same VAE.
    vae = {"base_channels": 4, "seed": 7}
    actors = [EncoderActor(encoder_kwargs=vae, device="cpu", disk_mb=0) for _ in range(3)]

    async def encode(index: int, group: SampleGroup) -> torch.Tensor:
        reply = await actors[index].encode({"tag": list(group.tag), "video": group.video})
        assert reply["tag"] == list(group.tag)
        return reply["latents"]

    try:
        remote = await train_remote(batches, _world_model_step(), encode, n_actors=3, config=config)
    finally:
        for actor in actors:
            actor.cache.close()
    assert len(local.losses) == 5 and torch.equal(torch.tensor(remote.losses), torch.tensor(local.losses))
    assert remote.requests == [3, 4, 3] and remote.retries == 0  # 10 groups: 1, 2, 0, 1, ...; 1 last
    assert remote.timings.steps == 5 and remote.timings.samples == 5 * B
    assert remote.timings.samples_per_s > 0 and local.timings.samples_per_s > 0
    stages = remote.timings.as_dict()
    assert 0 <= stages["train_s"] <= stages["wall_s"] and stages["read_s"] >= 0 and stages["wait_s"] >= 0


async def test_at_most_k_batches_are_in_flight_and_reading_waits_at_the_bound() -> None:
    k, total = 3, 10
    batches = _batches(total, batch=2)
    state = {"read": 0, "encoded": 0, "trained": 0, "most": 0}
    cond = threading.Condition()
    module = LightEncoder(seed=3).eval()

    def reader() -> Iterator[dict[str, torch.Tensor]]:
        for batch in batches:
            with cond:
                state["read"] += 1
                state["most"] = max(state["most"], state["read"] - state["trained"])
                cond.notify_all()
            yield batch

    async def encode(index: int, group: SampleGroup) -> torch.Tensor:
        await anyio.lowlevel.checkpoint()
        with cond:
            state["encoded"] += 1
            cond.notify_all()
        return encode_video(module, group.video)

    def settled() -> bool:
        # Reading filled the bound (or the data ran out) and every group read came back: a
        # producer that ignored the bound would have read on meanwhile.
        full = state["read"] >= min(state["trained"] + k, total)
        return full and state["encoded"] == 2 * state["read"]

    def slow_step(batch: dict[str, Any]) -> float:
        with cond:
            assert cond.wait_for(settled, timeout=60), state
            if state["trained"] == 0:
                # A window for a producer that ignored the bound to read one batch too many
                # (no such read comes, so this wait runs out: it only gives a bug its chance).
                cond.wait_for(lambda: state["read"] > k, timeout=0.5)
            state["trained"] += 1
        return 0.0

    config = InflightConfig(inflight=k, group_size=1)
    result = await train_remote(reader(), slow_step, encode, n_actors=2, config=config)
    assert state["most"] == k and state["trained"] == total and len(result.losses) == total


async def test_16_ranks_over_40_actors_load_every_actor_equally() -> None:
    counts: Counter[int] = Counter()
    encode = _light_fakes(counts)
    batches = _batches(20, batch=8)  # 80 groups of 2 per rank: 2 per actor from every rank
    tiny = [{**b, "video": b["video"][:, :, :2, :4, :4]} for b in batches]
    results: dict[int, Any] = {}

    async def rank(r: int) -> None:
        config = InflightConfig(inflight=4, group_size=2, rank=r)
        results[r] = await train_remote(tiny, lambda _: 0.0, encode, n_actors=40, config=config)

    async with anyio.create_task_group() as tg:
        for r in range(16):
            tg.start_soon(rank, r)
    assert sorted(counts) == list(range(40))
    assert set(counts.values()) == {16 * 80 // 40}  # deviation 0
    assert all(len(res.losses) == 20 and res.retries == 0 for res in results.values())


async def test_each_rank_starts_its_round_robin_at_its_own_offset() -> None:
    # 3 groups per rank over 8 actors: only the offsets spread them (from 0, actors 0-2 get all).
    counts: Counter[int] = Counter()
    encode = _light_fakes(counts)
    batches = _batches(1, batch=3)

    async def rank(r: int) -> None:
        await train_remote(batches, lambda _: 0.0, encode, n_actors=8, config=InflightConfig(rank=r))

    async with anyio.create_task_group() as tg:
        for r in range(8):
            tg.start_soon(rank, r)
    assert counts == Counter(dict.fromkeys(range(8), 3))


async def test_an_encoder_that_dies_mid_epoch_never_leaves_a_hole() -> None:
    module = LightEncoder(seed=3).eval()
    served: list[tuple[int, tuple[int, int]]] = []
    failed: list[tuple[int, int]] = []

    async def encode(index: int, group: SampleGroup) -> torch.Tensor:
        await anyio.lowlevel.checkpoint()
        if index == 1 and sum(1 for a, _ in served if a == 1) >= 2:
            failed.append(group.tag)
            raise Unreachable("encoder 1 is gone")
        served.append((index, group.tag))
        return encode_video(module, group.video)

    trained: list[dict[str, Any]] = []

    def step(batch: dict[str, Any]) -> float:
        trained.append(batch)
        return float(batch["latents"].mean())

    batches = _batches(12)
    config = InflightConfig(inflight=3, group_size=1)
    result = await train_remote(batches, step, encode, n_actors=4, config=config)

    assert len(trained) == 12
    for batch, sent in zip(trained, batches, strict=True):
        assert batch["video"] is sent["video"]
        assert torch.equal(batch["latents"], encode_video(module, sent["video"]))
    assert failed and result.retries == len(failed)
    tags = [tag for _, tag in served]
    assert sorted(tags) == sorted({(b, g) for b in range(12) for g in range(B)})  # each group once
    assert all(index != 1 for index, tag in served if tag in failed)


async def test_a_group_that_misses_its_deadline_goes_to_the_next_actor() -> None:
    module = LightEncoder(seed=3).eval()
    hang = anyio.Event()  # never set: actor 0 takes the ask and never answers

    async def encode(index: int, group: SampleGroup) -> torch.Tensor:
        if index == 0:
            await hang.wait()
        return encode_video(module, group.video)

    batches = _batches(2, batch=2)
    config = InflightConfig(inflight=2, group_size=1, deadline_s=0.2)
    result = await train_remote(batches, lambda b: float(b["latents"].sum()), encode, 2, config)
    local = train_local(batches, lambda b: float(b["latents"].sum()), module, config)
    assert result.losses == local.losses and result.retries == 2 and result.requests == [2, 4]


async def test_a_group_every_actor_fails_stops_the_run_before_its_batch_is_trained() -> None:
    async def encode(index: int, group: SampleGroup) -> torch.Tensor:
        if group.batch == 1:
            raise Unreachable(f"encoder {index} is gone")
        return group.video.float()

    trained: list[int] = []
    with pytest.raises(GroupFailed, match=r"group 0 of batch 1: every encoder actor failed it \(2 tried\)"):
        await train_remote(
            _batches(3, batch=1), lambda b: trained.append(1) or 0.0, encode, 2, InflightConfig(inflight=1)
        )
    assert len(trained) == 1


async def test_bad_batches_and_settings_are_named() -> None:
    with pytest.raises(ValueError, match=r"batch 0: expected a dict with 'video', got \['frames'\]"):
        await train_remote([{"frames": 1}], lambda _: 0.0, _light_fakes(), 1)
    with pytest.raises(
        ValueError, match=r"batch 0: 'video' must be a \(B, C, T, H, W\) tensor, got \(2, 3\)"
    ):
        train_local([{"video": torch.zeros(2, 3)}], lambda _: 0.0, LightEncoder())
    with pytest.raises(ValueError, match=r"InflightConfig\.inflight=0"):
        InflightConfig(inflight=0)
    with pytest.raises(ValueError, match="n_actors=0"):
        await train_remote(_batches(1), lambda _: 0.0, _light_fakes(), 0)


ENCODER = """
[[workers]]
name = "w-{name}"

[[workers.actors]]
name = "{name}"
class = "troupe.actors.encoders.encoder_actor:EncoderActor"

[workers.actors.kwargs]
encoder = "troupe.actors.encoders.light:LightEncoder"
encoder_kwargs = {{ seed = 3 }}
disk_mb = 0
"""


@pytest.mark.e2e
async def test_real_encoder_actors_give_the_losses_of_local_encoding(troupe_cluster: Any) -> None:
    cluster = troupe_cluster(ENCODER.format(name="encode-a") + ENCODER.format(name="encode-b"))
    batches = _batches(3)
    config = InflightConfig(inflight=2, group_size=2)
    local = train_local(batches, _world_model_step(), LightEncoder(seed=3), config)
    async with cluster.client() as rt:
        encode = actor_encoder(rt, ["encode-a", "encode-b"], timeout=60)
        remote = await train_remote(batches, _world_model_step(), encode, n_actors=2, config=config)
        stats = [await rt.ref(name).ask("stats", timeout=30) for name in ("encode-a", "encode-b")]
    assert torch.equal(torch.tensor(remote.losses), torch.tensor(local.losses))
    assert [s["groups"] for s in stats] == [3, 3] and remote.retries == 0
