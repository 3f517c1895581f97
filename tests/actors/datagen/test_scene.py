"""Scene generation and domain randomization."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np
import pytest

from troupe.actors.datagen.occupancy import component_labels, occupancy_grid
from troupe.actors.datagen.randomize import RandomizeConfig, randomize
from troupe.actors.datagen.scene import (
    BoxKind,
    SceneConfig,
    Texture,
    generate_scene,
    scene_boxes_tensor,
)
from troupe.runtime.errors import ConfigError

SEEDS = range(30)


def _overlaps(
    lo_a: Sequence[float], hi_a: Sequence[float], lo_b: Sequence[float], hi_b: Sequence[float]
) -> bool:
    """Whether two axis-aligned boxes (of any dimension) share volume."""
    return all(a0 < b1 and b0 < a1 for a0, a1, b0, b1 in zip(lo_a, hi_a, lo_b, hi_b, strict=True))


def test_same_seed_gives_identical_scene() -> None:
    """Generating twice from one seed gives equal scenes."""
    for seed in (0, 7, 123456789):
        assert generate_scene(seed) == generate_scene(seed)


def test_different_seeds_give_different_scenes() -> None:
    """Distinct seeds give distinct scenes."""
    scenes = [generate_scene(seed) for seed in range(10)]
    assert len({s.boxes for s in scenes}) == 10


def test_generation_ignores_and_keeps_global_rng() -> None:
    """The global numpy RNG neither changes the scene nor is advanced by generation."""
    np.random.seed(1)
    before = np.random.get_state()[1].copy()  # type: ignore[index]
    a = generate_scene(3)
    after = np.random.get_state()[1]  # type: ignore[index]
    np.random.seed(2)
    assert a == generate_scene(3)
    assert np.array_equal(before, after)


@pytest.mark.parametrize("seed", SEEDS)
def test_scene_respects_config_ranges(seed: int) -> None:
    """Footprint, rooms, furniture counts and box placement stay within the config."""
    config = SceneConfig()
    scene = generate_scene(seed, config)
    w, d = scene.size
    assert config.footprint[0] <= w <= config.footprint[1]
    assert config.footprint[0] <= d <= config.footprint[1]
    assert config.rooms[0] <= len(scene.rooms) <= config.rooms[1]
    assert len(scene.doors) == len(scene.rooms) - 1
    assert len(scene.furniture) <= config.furniture[1]
    assert sum((r.hi[0] - r.lo[0]) * (r.hi[1] - r.lo[1]) for r in scene.rooms) == pytest.approx(w * d)
    for room in scene.rooms:
        assert min(room.hi[0] - room.lo[0], room.hi[1] - room.lo[1]) >= config.min_room - 1e-9
    for box in scene.furniture:
        assert box.lo[0] >= 0 and box.hi[0] <= w and box.lo[1] >= 0 and box.hi[1] <= d
        assert box.lo[2] == 0.0 and box.hi[2] < scene.ceiling
    kinds = [b.kind for b in scene.boxes]
    assert kinds.count(BoxKind.FLOOR) == 1 and kinds.count(BoxKind.CEILING) == 1


def test_scenes_have_furniture_on_average() -> None:
    """Placement succeeds often enough that scenes average at least the minimum piece count."""
    counts = [len(generate_scene(seed).furniture) for seed in SEEDS]
    assert np.mean(counts) >= SceneConfig().furniture[0]


@pytest.mark.parametrize("seed", SEEDS)
def test_free_space_is_one_component_and_doors_are_open(seed: int) -> None:
    """At the default robot radius every free cell reaches every other, through every door."""
    scene = generate_scene(seed)
    grid = occupancy_grid(scene)
    labels, count = component_labels(grid.free)
    assert count == 1
    for door in scene.doors:
        a, o = door.axis, 1 - door.axis
        centre = [0.0, 0.0]
        centre[a], centre[o] = door.at, (door.lo + door.hi) / 2
        i, j = grid.world_to_cell(centre)
        assert labels[i, j] == 0, f"door {door} is blocked"
        for box in scene.furniture:  # no furniture in front of a door
            zone_lo, zone_hi = list(centre), list(centre)
            zone_lo[a] -= 0.5
            zone_hi[a] += 0.5
            zone_lo[o], zone_hi[o] = door.lo, door.hi
            assert not _overlaps(box.lo[:2], box.hi[:2], zone_lo, zone_hi)


def test_furniture_never_overlaps() -> None:
    """No two pieces of furniture share volume."""
    for seed in SEEDS:
        pieces = generate_scene(seed).furniture
        for k, a in enumerate(pieces):
            for b in pieces[k + 1 :]:
                assert not _overlaps(a.lo, a.hi, b.lo, b.hi)


def test_scene_boxes_tensor_shapes_and_texture_ids() -> None:
    """The renderer arrays have one float32 row per box and the renderer's texture ids."""
    from troupe.models import raycast

    assert (Texture.NONE, Texture.CHECKER, Texture.STRIPES) == (
        raycast.TEXTURE_NONE,
        raycast.TEXTURE_CHECKER,
        raycast.TEXTURE_STRIPES,
    )
    scene = randomize(generate_scene(4), 4)
    bounds, colors, textures = scene_boxes_tensor(scene)
    n = len(scene.boxes)
    assert bounds.shape == (n, 6) and colors.shape == (n, 3) and textures.shape == (n, 2)
    assert bounds.dtype == colors.dtype == textures.dtype == np.float32
    assert np.all(bounds[:, 3:] > bounds[:, :3])
    assert set(textures[:, 0].tolist()) <= {0.0, 1.0, 2.0}


@pytest.mark.parametrize(
    "bad",
    [
        {"footprint": (6.0, 5.0)},
        {"footprint": (3.0, 8.0)},
        {"rooms": (0, 2)},
        {"door_width": 1.9},
        {"door_height": 3.0},
    ],
)
def test_bad_scene_config_is_refused(bad: dict[str, object]) -> None:
    """An inconsistent SceneConfig raises ConfigError when built."""
    with pytest.raises(ConfigError):
        SceneConfig(**bad)  # type: ignore[arg-type]


def test_randomize_is_deterministic_per_seed() -> None:
    """The same scene and seed randomize identically; another seed differs."""
    scene = generate_scene(5)
    assert randomize(scene, 11) == randomize(scene, 11)
    assert randomize(scene, 11) != randomize(scene, 12)
    assert randomize(scene, 11).variant == 11


def test_randomize_keeps_layout_and_draws_within_ranges() -> None:
    """Rooms, doors and walls stay; furniture moves at most the shift; params stay in range."""
    config = RandomizeConfig(width=40, height=30)
    for seed in range(10):
        scene = generate_scene(seed)
        out = randomize(scene, seed + 100, config)
        assert (out.rooms, out.doors, out.size, out.seed) == (
            scene.rooms,
            scene.doors,
            scene.size,
            scene.seed,
        )
        geom = [(b.lo, b.hi, b.kind) for b in scene.boxes if b.kind is not BoxKind.FURNITURE]
        assert geom == [(b.lo, b.hi, b.kind) for b in out.boxes if b.kind is not BoxKind.FURNITURE]
        for a, b in zip(scene.furniture, out.furniture, strict=True):
            shift = np.subtract(b.lo, a.lo)
            assert np.all(np.abs(shift) <= config.furniture_shift + 1e-6)
            assert np.allclose(np.subtract(b.hi, b.lo), np.subtract(a.hi, a.lo))
        assert component_labels(occupancy_grid(out).free)[1] == 1
        r = out.render
        assert (r.width, r.height) == (40, 30)
        assert config.fov_deg[0] <= r.fov_deg <= config.fov_deg[1]
        assert config.cam_height[0] <= r.cam_height <= config.cam_height[1]
        assert config.ambient[0] <= r.ambient <= config.ambient[1]
        assert np.linalg.norm(r.light_dir) == pytest.approx(1.0, abs=1e-5) and r.light_dir[2] > 0


def test_randomize_without_shift_moves_nothing() -> None:
    """With furniture_shift=0 every box keeps its geometry."""
    scene = generate_scene(2)
    out = randomize(scene, 9, dataclasses.replace(RandomizeConfig(), furniture_shift=0.0))
    assert [(b.lo, b.hi) for b in out.boxes] == [(b.lo, b.hi) for b in scene.boxes]
