"""Domain randomization: the look of a scene, apart from its layout.

:func:`randomize` keeps the rooms, walls and doors of a generated scene and redraws what a
renderer sees: colours and procedural textures, light direction and intensity, ambient light,
field of view and camera height, plus a small jitter of the furniture that keeps the layout
rules of :mod:`troupe.actors.datagen.scene`. It is a pure function of ``(scene, seed, config)``.
"""

from __future__ import annotations

import colorsys
import math
from dataclasses import dataclass, replace

import numpy as np

from troupe.runtime.errors import ConfigError

from .scene import (
    Box,
    BoxKind,
    FurnitureRules,
    RenderParams,
    Scene,
    SceneConfig,
    Texture,
)

__all__ = ["RandomizeConfig", "randomize"]

Range = tuple[float, float]


@dataclass(frozen=True)
class RandomizeConfig:
    """Ranges the randomizer draws from, inclusive ``(low, high)`` pairs.

    Attributes:
        width: image width in pixels (not randomized; small by default so tests are fast).
        height: image height in pixels.
        fov_deg: horizontal field of view.
        cam_height: camera height above the floor, metres.
        light_elevation_deg: angle of the light above the horizon.
        light_intensity: diffuse weight.
        ambient: ambient light.
        texture_prob: chance that a surface gets a checker or stripe pattern.
        texture_scale: pattern period, metres.
        furniture_shift: largest furniture jitter per axis, metres (0 disables it).
    """

    width: int = 96
    height: int = 72
    fov_deg: Range = (60.0, 90.0)
    cam_height: Range = (1.0, 1.6)
    light_elevation_deg: Range = (30.0, 80.0)
    light_intensity: Range = (0.5, 0.9)
    ambient: Range = (0.15, 0.4)
    texture_prob: float = 0.5
    texture_scale: Range = (0.15, 0.8)
    furniture_shift: float = 0.15

    def __post_init__(self) -> None:
        if self.width < 1 or self.height < 1:
            raise ConfigError(f"image size must be positive, got {self.width}x{self.height}")
        ranges = ("fov_deg", "cam_height", "light_elevation_deg", "light_intensity", "ambient")
        for name in (*ranges, "texture_scale"):
            lo, hi = getattr(self, name)
            if not 0 <= lo <= hi:
                raise ConfigError(f"RandomizeConfig.{name}={(lo, hi)} needs 0 <= low <= high")
        if not 0 < self.fov_deg[1] < 180 or self.texture_scale[0] <= 0:
            raise ConfigError("fov_deg must lie in (0, 180) and texture_scale above 0")
        if not 0 <= self.texture_prob <= 1 or self.furniture_shift < 0:
            raise ConfigError("texture_prob must be in [0, 1] and furniture_shift >= 0")


def _u(rng: np.random.Generator, r: Range) -> float:
    return round(float(rng.uniform(r[0], r[1])), 4)


def _color(rng: np.random.Generator, sat: Range, val: Range) -> tuple[float, float, float]:
    r, g, b = colorsys.hsv_to_rgb(float(rng.uniform()), _u(rng, sat), _u(rng, val))
    return (round(r, 4), round(g, 4), round(b, 4))


def _look(
    rng: np.random.Generator, color: tuple[float, float, float], config: RandomizeConfig
) -> tuple[tuple[float, float, float], Texture, float]:
    textured = bool(rng.uniform() < config.texture_prob)
    texture = Texture(int(rng.integers(1, 3))) if textured else Texture.NONE
    return color, texture, _u(rng, config.texture_scale)


def _jitter_furniture(
    scene: Scene, rng: np.random.Generator, max_shift: float, layout: SceneConfig
) -> tuple[Box, ...]:
    """All boxes, each piece of furniture shifted by up to ``max_shift`` per axis.

    A shift that would break a layout rule is dropped and the piece stays where it was.
    """
    structure = [b for b in scene.boxes if b.kind is not BoxKind.FURNITURE]
    rules = FurnitureRules(scene.size, structure, list(scene.doors), layout)
    placed = list(scene.furniture)
    for k, box in enumerate(placed):
        dx, dy = (round(float(v), 3) for v in rng.uniform(-max_shift, max_shift, size=2))
        moved = replace(
            box,
            lo=(round(box.lo[0] + dx, 3), round(box.lo[1] + dy, 3), box.lo[2]),
            hi=(round(box.hi[0] + dx, 3), round(box.hi[1] + dy, 3), box.hi[2]),
        )
        room = rules.room_of(box, scene.rooms)
        if room is not None and rules.fits(moved, room, placed[:k] + placed[k + 1 :]):
            placed[k] = moved
    shifted = iter(placed)
    return tuple(next(shifted) if b.kind is BoxKind.FURNITURE else b for b in scene.boxes)


def randomize(
    scene: Scene,
    seed: int,
    config: RandomizeConfig | None = None,
    layout: SceneConfig | None = None,
) -> Scene:
    """Redraw a scene's look; the same arguments always give the same scene.

    Walls share one look, and so do the floor and the ceiling; each piece of furniture gets its
    own. The draws come from a numpy ``PCG64`` stream seeded by ``seed`` alone.

    Args:
        scene: a generated scene.
        seed: randomization seed, stored as ``variant`` in the result.
        config: ranges to draw from, defaults to ``RandomizeConfig()``.
        layout: the ``SceneConfig`` the scene was generated with (its layout rules bound the
            furniture jitter), defaults to ``SceneConfig()``.

    Returns:
        A new scene with the same rooms and doors.
    """
    config = config or RandomizeConfig()
    rng = np.random.Generator(np.random.PCG64(seed))
    az = rng.uniform(0.0, 2 * math.pi)
    el = math.radians(_u(rng, config.light_elevation_deg))
    light = (math.cos(el) * math.cos(az), math.cos(el) * math.sin(az), math.sin(el))
    render = RenderParams(
        width=config.width,
        height=config.height,
        fov_deg=_u(rng, config.fov_deg),
        cam_height=_u(rng, config.cam_height),
        light_dir=(round(light[0], 6), round(light[1], 6), round(light[2], 6)),
        light_intensity=_u(rng, config.light_intensity),
        ambient=_u(rng, config.ambient),
    )
    looks = {
        BoxKind.WALL: _look(rng, _color(rng, (0.05, 0.35), (0.6, 0.95)), config),
        BoxKind.FLOOR: _look(rng, _color(rng, (0.1, 0.6), (0.3, 0.8)), config),
        BoxKind.CEILING: _look(rng, _color(rng, (0.0, 0.15), (0.8, 1.0)), config),
    }
    boxes = scene.boxes
    if config.furniture_shift > 0:
        boxes = _jitter_furniture(scene, rng, config.furniture_shift, layout or SceneConfig())
    out: list[Box] = []
    for box in boxes:
        look = looks.get(box.kind)
        if look is None:
            look = _look(rng, _color(rng, (0.2, 0.9), (0.25, 0.95)), config)
        color, texture, scale = look
        out.append(replace(box, color=color, texture=texture, texture_scale=scale))
    return replace(scene, boxes=tuple(out), render=render, variant=seed)
