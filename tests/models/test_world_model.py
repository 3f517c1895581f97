"""The flow-matching world-action model: shapes, masked loss, time positions, and that it learns."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from troupe.models.world_model import (
    ACTION_DIM,
    FlowBatch,
    WorldModel,
    WorldModelConfig,
    action_times,
    flow_matching_loss,
    latent_times,
)

B, C, TL, H, W, TA = 2, 4, 4, 4, 4, 8


def _model(**kw: int) -> WorldModel:
    torch.manual_seed(0)
    base: dict[str, int] = {"latent_channels": C, "d_model": 32, "layers": 2, "heads": 2}
    return WorldModel(WorldModelConfig(**{**base, **kw}))


def _batch(seed: int = 0) -> FlowBatch:
    g = torch.Generator().manual_seed(seed)
    valid = torch.rand((B, TA, ACTION_DIM), generator=g) > 0.3
    lat_cond = torch.zeros((B, TL), dtype=torch.bool)
    lat_cond[:, :2] = True
    act_cond = torch.zeros((B, TA), dtype=torch.bool)
    act_cond[:, :4] = True
    return FlowBatch(
        latents=torch.randn((B, C, TL, H, W), generator=g),
        latent_condition=lat_cond,
        latent_target=~lat_cond,
        actions=torch.randn((B, TA, ACTION_DIM), generator=g),
        action_valid=valid,
        action_condition=act_cond,
        action_target=~act_cond,
    )


def _noise(seed: int = 5) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn((B, C, TL, H, W), generator=g), torch.randn((B, TA, ACTION_DIM), generator=g)


T = torch.tensor([0.3, 0.7])


def _loss(model: WorldModel, batch: FlowBatch, noise: tuple[torch.Tensor, torch.Tensor] | None = None):
    with torch.no_grad():
        return model.loss(batch, noise=noise or _noise(), t=T)


def test_shapes() -> None:
    model, batch = _model(), _batch()
    v_lat, v_act = model.velocity(batch.latents, batch.actions, T, batch)
    assert v_lat.shape == batch.latents.shape
    assert v_act.shape == batch.actions.shape
    out = model.loss(batch, generator=torch.Generator().manual_seed(0))
    assert out.loss.ndim == 0 and torch.isfinite(out.loss)
    assert out.latent_count == B * C * (TL - 2) * H * W
    assert out.action_count == int(batch.action_valid[:, 4:].sum())
    lat, act = model.sample(batch, steps=2, generator=torch.Generator().manual_seed(0))
    assert lat.shape == batch.latents.shape and act.shape == batch.actions.shape
    assert torch.equal(lat[:, :, :2], batch.latents[:, :, :2])  # conditions come back as given
    assert torch.equal(act[:, :4][batch.action_valid[:, :4]], batch.actions[:, :4][batch.action_valid[:, :4]])
    assert not act[~batch.action_valid].any()


def test_invalid_action_elements_change_nothing() -> None:
    model, batch = _model(), _batch()
    base = _loss(model, batch)
    garbage = torch.where(batch.action_valid, batch.actions, torch.full_like(batch.actions, float("nan")))
    lat_noise, act_noise = _noise()
    act_noise = torch.where(batch.action_valid, act_noise, torch.full_like(act_noise, 1e6))
    other = _loss(model, replace(batch, actions=garbage), noise=(lat_noise, act_noise))
    assert torch.equal(other.loss, base.loss)
    out = model.loss(replace(batch, actions=garbage), noise=(lat_noise, act_noise), t=T)
    out.loss.backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters())


def test_noise_at_condition_tokens_is_never_used() -> None:
    model, batch = _model(), _batch()
    base = _loss(model, batch)
    lat_noise, act_noise = _noise()
    lat_noise[:, :, :2] = 123.0  # latent frames 0-1 and action steps 0-3 are conditions
    act_noise[:, :4] = -77.0
    assert torch.equal(_loss(model, batch, noise=(lat_noise, act_noise)).loss, base.loss)


def test_a_valid_target_changes_the_loss() -> None:
    model, batch = _model(), _batch()
    base = _loss(model, batch)
    actions = batch.actions.clone()
    b, step, k = (batch.action_valid[:, 4:].nonzero()[0] + torch.tensor([0, 4, 0])).tolist()
    actions[b, step, k] += 5.0
    assert _loss(model, replace(batch, actions=actions)).action_loss != base.action_loss
    latents = batch.latents.clone()
    latents[0, 0, 3, 0, 0] += 5.0
    assert _loss(model, replace(batch, latents=latents)).latent_loss != base.latent_loss


def test_flow_matching_loss_takes_only_masked_elements() -> None:
    pred = torch.tensor([1.0, 2.0, float("nan"), 4.0], requires_grad=True)
    target = torch.tensor([0.0, 0.0, 0.0, float("inf")])
    mask = torch.tensor([True, True, False, False])
    loss = flow_matching_loss(pred, target, mask)
    assert loss.item() == pytest.approx((1.0 + 4.0) / 2)
    loss.backward()
    assert pred.grad is not None and torch.equal(pred.grad, torch.tensor([1.0, 2.0, 0.0, 0.0]))
    empty = flow_matching_loss(pred, target, torch.zeros(4, dtype=torch.bool))
    assert empty.item() == 0.0
    empty.backward()  # the zero-denominator guard still gives a graph


def test_a_batch_with_no_valid_target_has_zero_loss() -> None:
    model, batch = _model(), _batch()
    none = torch.zeros_like(batch.action_target)
    batch = replace(
        batch,
        latent_target=torch.zeros_like(batch.latent_target),
        action_target=none,
    )
    out = model.loss(batch, noise=_noise(), t=T)
    assert out.loss.item() == 0.0 and out.latent_count == out.action_count == 0
    out.loss.backward()


def test_latent_and_action_positions_line_up_by_sample_rate() -> None:
    fps, tc = 12.0, 4
    lat, act = latent_times(3, fps, tc), action_times(12, fps)
    for i in range(3):
        assert lat[i] == act[i * tc]  # latent i and action i * tc share a time
    assert torch.allclose(lat[1:] - lat[:-1], torch.full((2,), 1 / (fps / tc), dtype=torch.float64))
    model = _model(temporal_compression=2)
    model.config = replace(model.config, fps=fps)
    times = model.token_times(latent_frames=2, action_steps=4, patches_per_frame=3)
    expected = [0.0, 0.0, 0.0, 2 / fps, 2 / fps, 2 / fps, 0.0, 1 / fps, 2 / fps, 3 / fps]
    assert times.tolist() == pytest.approx(expected)


def test_positions_reach_the_model() -> None:
    """Two action steps with equal values and masks differ only by their time: outputs differ."""
    model, batch = _model(), _batch()
    actions = batch.actions.clone()
    actions[:, 5] = actions[:, 6]
    valid = batch.action_valid.clone()
    valid[:, 5] = valid[:, 6]
    batch = replace(batch, actions=actions, action_valid=valid)
    with torch.no_grad():
        _, v_act = model.velocity(batch.latents, batch.actions, T, batch)
    assert not torch.allclose(v_act[:, 5], v_act[:, 6])


def test_padding_tokens_do_not_reach_other_tokens() -> None:
    model, batch = _model(), _batch()
    padded = batch.action_target.clone()
    padded[:, 7] = False  # step 7: neither condition nor target
    batch = replace(batch, action_target=padded)
    base = _loss(model, batch)
    actions = batch.actions.clone()
    actions[:, 7] += 3.0
    assert torch.equal(_loss(model, replace(batch, actions=actions)).loss, base.loss)


def test_a_few_steps_reduce_the_loss() -> None:
    model, batch = _model(), _batch()
    noise = _noise()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    before = _loss(model, batch, noise).loss.item()
    for _ in range(15):
        out = model.loss(batch, noise=noise, t=T)
        opt.zero_grad()
        out.loss.backward()
        opt.step()
    assert _loss(model, batch, noise).loss.item() < 0.8 * before


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("latents", torch.zeros(B, C + 1, TL, H, W), "FlowBatch.latents shape"),
        ("latents", torch.zeros(B, C, TL, 3, W), "FlowBatch.latents height=3"),
        ("actions", torch.zeros(B, TA, 58), "FlowBatch.actions shape"),
        ("action_valid", torch.ones(B, TA, ACTION_DIM), "FlowBatch.action_valid"),
        ("latent_target", torch.ones(B, TL, dtype=torch.bool), "both condition and target"),
        ("action_condition", torch.ones(B, TA + 1, dtype=torch.bool), "FlowBatch.action_condition"),
    ],
)
def test_bad_batch_names_the_field(field: str, value: torch.Tensor, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        _model().loss(replace(_batch(), **{field: value}))


@pytest.mark.parametrize(
    ("field", "value"), [("d_model", 30), ("heads", 0), ("fps", 0.0), ("temporal_compression", 0)]
)
def test_bad_config_names_the_field(field: str, value: float) -> None:
    with pytest.raises(ValueError, match=f"WorldModelConfig.{field}="):
        WorldModelConfig(**{field: value})  # type: ignore[arg-type]
