"""Indoor scenes made of axis-aligned boxes, generated from a seed.

World frame: metres, z up; the floor plan covers ``[0, W] x [0, D]`` at ``z = 0``; exterior walls
stand just outside it. A binary split of the rectangle makes the rooms: each split adds one
interior wall across the room it splits, with one door gap, so the rooms form a tree joined by
doors. Furniture is placed only where it keeps every free cell of the occupancy grid (at
``SceneConfig.clearance``) reachable from every other and keeps a zone in front of each door
clear: with a planner of that radius, any free start can reach any free goal.

A scene is plain frozen data (tuples and floats): equal seeds give equal scenes, and it
serialises as is. :func:`scene_boxes_tensor` turns it into the arrays the renderer takes.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from troupe.runtime.errors import ConfigError

from .occupancy import DEFAULT_Z_BAND, footprint_mask, is_connected

__all__ = [
    "Box",
    "BoxKind",
    "Door",
    "FurnitureRules",
    "RenderParams",
    "Room",
    "Scene",
    "SceneConfig",
    "Texture",
    "generate_scene",
    "scene_boxes_tensor",
]

Vec2 = tuple[float, float]
Vec3 = tuple[float, float, float]


class BoxKind(enum.StrEnum):
    """What a box is; the randomizer colours each kind differently."""

    WALL = "wall"
    FLOOR = "floor"
    CEILING = "ceiling"
    FURNITURE = "furniture"


class Texture(enum.IntEnum):
    """Procedural texture ids; the values are the renderer's (``troupe.models.raycast``)."""

    NONE = 0
    CHECKER = 1
    STRIPES = 2


@dataclass(frozen=True)
class Box:
    """An axis-aligned box with its look.

    Attributes:
        lo: minimum corner (x, y, z) in metres.
        hi: maximum corner; strictly greater than ``lo`` on every axis.
        color: RGB albedo in [0, 1].
        kind: what the box is.
        texture: procedural pattern modulating the albedo.
        texture_scale: pattern period in metres.
    """

    lo: Vec3
    hi: Vec3
    color: Vec3 = (0.7, 0.7, 0.7)
    kind: BoxKind = BoxKind.FURNITURE
    texture: Texture = Texture.NONE
    texture_scale: float = 0.5

    def __post_init__(self) -> None:
        if not all(a < b for a, b in zip(self.lo, self.hi, strict=True)):
            raise ValueError(f"box lo {self.lo} must be below hi {self.hi} on every axis")
        if not all(0.0 <= c <= 1.0 for c in self.color) or self.texture_scale <= 0:
            raise ValueError(f"colour must be in [0, 1] and texture_scale > 0: {self}")


@dataclass(frozen=True)
class Room:
    """A room's rectangle, between wall centre lines (or exterior walls' inner faces)."""

    lo: Vec2
    hi: Vec2


@dataclass(frozen=True)
class Door:
    """A door gap in a wall.

    Attributes:
        axis: 0 for a wall at ``x = at`` running along y, 1 for a wall at ``y = at``.
        at: the wall's centre line.
        lo: where the gap starts along the wall.
        hi: where it ends.
    """

    axis: int
    at: float
    lo: float
    hi: float


@dataclass(frozen=True)
class RenderParams:
    """Camera and light for rendering a scene.

    Attributes:
        width: image width in pixels.
        height: image height in pixels.
        fov_deg: horizontal field of view; pixels are square.
        cam_height: camera height above the floor in metres.
        light_dir: unit vector from a surface towards the (directional) light, world frame.
        light_intensity: diffuse (Lambert) weight.
        ambient: constant light added to the diffuse term.
    """

    width: int = 96
    height: int = 72
    fov_deg: float = 75.0
    cam_height: float = 1.3
    light_dir: Vec3 = (0.3, 0.2, 0.9327379053088815)
    light_intensity: float = 0.7
    ambient: float = 0.3


@dataclass(frozen=True)
class SceneConfig:
    """How scenes are generated. Ranges are inclusive ``(low, high)`` pairs.

    Attributes:
        footprint: range of each side of the floor plan, metres.
        rooms: range of the number of rooms aimed at (fewer when no split fits).
        ceiling: ceiling height.
        furniture: range of the number of pieces aimed at (fewer when no place fits).
        furniture_size: range of a piece's footprint sides.
        furniture_height: range of a piece's height.
        wall_thickness: thickness of every wall.
        door_width: width of each door gap.
        door_height: height of a door gap; a lintel closes the wall above it.
        min_room: smallest side of a room.
        clearance: robot radius for which free space must stay connected; keep it equal to
            the planner's ``robot_radius`` (or larger).
        cell: occupancy cell size used for that check; keep it equal to the planner's.
        door_zone: depth kept free of furniture on each side of a door.
        tries: placement attempts per split and per piece of furniture.
        render: render parameters of the generated (not yet randomized) scene.
    """

    footprint: Vec2 = (5.0, 8.0)
    rooms: tuple[int, int] = (2, 5)
    ceiling: float = 2.6
    furniture: tuple[int, int] = (3, 10)
    furniture_size: Vec2 = (0.4, 1.6)
    furniture_height: Vec2 = (0.4, 2.0)
    wall_thickness: float = 0.1
    door_width: float = 0.9
    door_height: float = 2.05
    min_room: float = 2.0
    clearance: float = 0.2
    cell: float = 0.1
    door_zone: float = 0.7
    tries: int = 20
    render: RenderParams = field(default_factory=RenderParams)

    def __post_init__(self) -> None:
        for name in ("footprint", "rooms", "furniture", "furniture_size", "furniture_height"):
            lo, hi = getattr(self, name)
            if not 0 <= lo <= hi:
                raise ConfigError(f"SceneConfig.{name}={(lo, hi)} must satisfy 0 <= low <= high")
        if self.rooms[0] < 1:
            raise ConfigError("SceneConfig.rooms must allow at least one room")
        if self.footprint[0] < 2 * self.min_room and self.rooms[0] > 1:
            raise ConfigError(
                f"footprint {self.footprint[0]} m cannot hold two rooms of {self.min_room} m; "
                "raise SceneConfig.footprint or lower min_room"
            )
        if self.door_width + 2 * _JAMB > self.min_room:
            raise ConfigError(f"door_width + {2 * _JAMB} m of jambs must fit in min_room")
        if self.door_height >= self.ceiling or self.cell <= 0 or self.wall_thickness <= 0:
            raise ConfigError("need door_height < ceiling, cell > 0 and wall_thickness > 0")


_JAMB = 0.3  # wall kept on each side of a door, so a corner's inflation cannot close it


@dataclass(frozen=True)
class _Wall:
    """An interior wall: its door and its extent along its own direction."""

    door: Door
    lo: float
    hi: float


@dataclass(frozen=True)
class Scene:
    """A generated indoor scene.

    Attributes:
        seed: the layout seed it was generated from.
        size: floor plan ``(W, D)`` in metres.
        ceiling: ceiling height.
        rooms: the rooms.
        doors: the door gaps of the interior walls.
        boxes: every box: walls, floor, ceiling, furniture.
        render: camera and light parameters.
        variant: seed of the randomization applied, None for the raw layout.
    """

    seed: int
    size: Vec2
    ceiling: float
    rooms: tuple[Room, ...]
    doors: tuple[Door, ...]
    boxes: tuple[Box, ...]
    render: RenderParams = field(default_factory=RenderParams)
    variant: int | None = None

    @property
    def furniture(self) -> tuple[Box, ...]:
        """The furniture boxes, in placement order."""
        return tuple(b for b in self.boxes if b.kind is BoxKind.FURNITURE)


def scene_boxes_tensor(
    scene: Scene,
) -> tuple[npt.NDArray[np.float32], npt.NDArray[np.float32], npt.NDArray[np.float32]]:
    """The scene's boxes as renderer input arrays.

    Returns:
        ``(bounds, colors, textures)``: ``(N, 6)`` ``[xmin, ymin, zmin, xmax, ymax, zmax]``,
        ``(N, 3)`` RGB in [0, 1], and ``(N, 2)`` ``[texture id, texture scale]``, all float32.
    """
    bounds = np.array([b.lo + b.hi for b in scene.boxes], np.float32).reshape(-1, 6)
    colors = np.array([b.color for b in scene.boxes], np.float32).reshape(-1, 3)
    textures = np.array([(float(b.texture), b.texture_scale) for b in scene.boxes], np.float32).reshape(-1, 2)
    return bounds, colors, textures


def _r(x: float) -> float:
    return round(float(x), 3)


def _overlap(a0: float, a1: float, b0: float, b1: float) -> bool:
    return a0 < b1 and b0 < a1


class FurnitureRules:
    """Where furniture may stand in one layout: inside its room (off the walls), out of the
    door zones, off other furniture, and never splitting the free space in two.

    Args:
        size: the scene's floor plan.
        structure: walls, floor and ceiling (the boxes that are not furniture).
        doors: the scene's doors.
        config: the config the layout was generated with.
    """

    def __init__(self, size: Vec2, structure: list[Box], doors: list[Door], config: SceneConfig) -> None:
        t = config.wall_thickness
        self.config = config
        self.origin = (-t, -t)
        self.shape = (
            int(np.ceil((size[0] + 2 * t) / config.cell - 1e-9)),
            int(np.ceil((size[1] + 2 * t) / config.cell - 1e-9)),
        )
        z0, z1 = DEFAULT_Z_BAND
        fp = [(*b.lo[:2], *b.hi[:2]) for b in structure if b.lo[2] < z1 and b.hi[2] > z0]
        self.walls = self._mask(fp)
        half = t / 2 + config.door_zone
        # Door zones as (xmin, ymin, xmax, ymax).
        self.zones = [
            (d.at - half, d.lo - config.clearance, d.at + half, d.hi + config.clearance)
            if d.axis == 0
            else (d.lo - config.clearance, d.at - half, d.hi + config.clearance, d.at + half)
            for d in doors
        ]

    def _mask(self, footprints: Sequence[tuple[float, ...]]) -> npt.NDArray[np.bool_]:
        return footprint_mask(
            np.asarray(footprints, np.float64).reshape(-1, 4),
            self.origin,
            self.config.cell,
            self.shape,
            self.config.clearance,
        )

    def fits(self, box: Box, room: Room, others: list[Box]) -> bool:
        """Whether ``box`` may stand in ``room`` next to ``others`` (cheap tests first)."""
        inset = self.config.wall_thickness / 2
        (x0, y0, _), (x1, y1, _) = box.lo, box.hi
        if x0 < room.lo[0] + inset - 1e-9 or x1 > room.hi[0] - inset + 1e-9:
            return False
        if y0 < room.lo[1] + inset - 1e-9 or y1 > room.hi[1] - inset + 1e-9:
            return False
        for zx0, zy0, zx1, zy1 in self.zones:
            if _overlap(x0, x1, zx0, zx1) and _overlap(y0, y1, zy0, zy1):
                return False
        for o in others:
            if _overlap(x0, x1, o.lo[0], o.hi[0]) and _overlap(y0, y1, o.lo[1], o.hi[1]):
                return False
        fp = [(*b.lo[:2], *b.hi[:2]) for b in [*others, box]]
        return is_connected(~(self.walls | self._mask(fp)))

    def room_of(self, box: Box, rooms: tuple[Room, ...]) -> Room | None:
        """The first room holding the centre of ``box``'s footprint."""
        cx, cy = (box.lo[0] + box.hi[0]) / 2, (box.lo[1] + box.hi[1]) / 2
        for room in rooms:
            if room.lo[0] <= cx <= room.hi[0] and room.lo[1] <= cy <= room.hi[1]:
                return room
        return None


def _split(rng: np.random.Generator, rooms: list[Room], walls: list[_Wall], config: SceneConfig) -> bool:
    """Split the largest room that can take a wall; record the new wall. False if none can."""
    m = config.min_room
    margin = _JAMB + config.wall_thickness
    order = sorted(
        range(len(rooms)),
        key=lambda k: -(rooms[k].hi[0] - rooms[k].lo[0]) * (rooms[k].hi[1] - rooms[k].lo[1]),
    )
    for k in order:
        room = rooms[k]
        extent = (room.hi[0] - room.lo[0], room.hi[1] - room.lo[1])
        if max(extent) < 2 * m:
            continue
        axis = int(extent[1] > extent[0]) if extent[0] != extent[1] else int(rng.integers(2))
        other = 1 - axis
        for _ in range(config.tries):
            at = _r(rng.uniform(room.lo[axis] + m, room.hi[axis] - m))
            # The new wall ends on the two walls across it; a door there would be narrowed.
            if any(
                d.axis == other
                and d.at in (room.lo[other], room.hi[other])
                and _overlap(at - margin, at + margin, d.lo, d.hi)
                for d in (wall.door for wall in walls)
            ):
                continue
            half = config.door_width / 2
            centre = rng.uniform(room.lo[other] + _JAMB + half, room.hi[other] - _JAMB - half)
            door = Door(axis, at, _r(centre - half), _r(centre + half))
            walls.append(_Wall(door, room.lo[other], room.hi[other]))
            a_hi, b_lo = list(room.hi), list(room.lo)
            a_hi[axis] = b_lo[axis] = at
            rooms[k : k + 1] = [
                Room(room.lo, (a_hi[0], a_hi[1])),
                Room((b_lo[0], b_lo[1]), room.hi),
            ]
            return True
    return False


def _structure(size: Vec2, walls: list[_Wall], config: SceneConfig) -> list[Box]:
    """Floor, ceiling, exterior walls and interior walls with their door gaps and lintels."""
    w, d = size
    t, h = config.wall_thickness, config.ceiling
    grey = (0.8, 0.8, 0.78)
    boxes = [
        Box((-t, -t, -t), (w + t, d + t, 0.0), (0.55, 0.42, 0.3), BoxKind.FLOOR),
        Box((-t, -t, h), (w + t, d + t, h + t), (0.95, 0.95, 0.95), BoxKind.CEILING),
    ]
    for lo, hi in (
        ((-t, -t, 0.0), (0.0, d + t, h)),
        ((w, -t, 0.0), (w + t, d + t, h)),
        ((0.0, -t, 0.0), (w, 0.0, h)),
        ((0.0, d, 0.0), (w, d + t, h)),
    ):
        boxes.append(Box(lo, hi, grey, BoxKind.WALL))
    for wall in walls:
        door = wall.door
        a, o = door.axis, 1 - door.axis
        # Two segments beside the gap, and a lintel over it (above the robot's height band).
        for s0, s1, z0 in (
            (wall.lo, door.lo, 0.0),
            (door.hi, wall.hi, 0.0),
            (door.lo, door.hi, config.door_height),
        ):
            lo3, hi3 = [0.0, 0.0, z0], [0.0, 0.0, h]
            lo3[a], hi3[a] = _r(door.at - t / 2), _r(door.at + t / 2)
            lo3[o], hi3[o] = s0, s1
            box_lo, box_hi = (lo3[0], lo3[1], lo3[2]), (hi3[0], hi3[1], hi3[2])
            boxes.append(Box(box_lo, box_hi, grey, BoxKind.WALL))
    return boxes


def generate_scene(seed: int, config: SceneConfig | None = None) -> Scene:
    """Generate a scene; the same seed and config always give the same scene.

    Args:
        seed: layout seed (a numpy ``PCG64`` stream of its own; no global RNG is used).
        config: generation parameters, defaults to ``SceneConfig()``.

    Returns:
        The scene, with ``config.render`` as its render parameters and ``variant=None``.
    """
    config = config or SceneConfig()
    rng = np.random.Generator(np.random.PCG64(seed))
    size = (_r(rng.uniform(*config.footprint)), _r(rng.uniform(*config.footprint)))
    rooms: list[Room] = [Room((0.0, 0.0), size)]
    walls: list[_Wall] = []
    target = int(rng.integers(config.rooms[0], config.rooms[1] + 1))
    while len(rooms) < target and _split(rng, rooms, walls, config):
        pass
    doors = [wall.door for wall in walls]
    structure = _structure(size, walls, config)
    rules = FurnitureRules(size, structure, doors, config)
    furniture: list[Box] = []
    wanted = int(rng.integers(config.furniture[0], config.furniture[1] + 1))
    for _ in range(wanted):
        for _ in range(config.tries):
            room = rooms[int(rng.integers(len(rooms)))]
            box = _furniture_candidate(rng, room, config)
            if rules.fits(box, room, furniture):
                furniture.append(box)
                break
    return Scene(
        seed=seed,
        size=size,
        ceiling=config.ceiling,
        rooms=tuple(rooms),
        doors=tuple(doors),
        boxes=tuple(structure + furniture),
        render=config.render,
    )


def _furniture_candidate(rng: np.random.Generator, room: Room, config: SceneConfig) -> Box:
    """A random piece in ``room``, against one of its walls half of the time."""
    inset = config.wall_thickness / 2
    sx, sy = (_r(v) for v in rng.uniform(*config.furniture_size, size=2))
    h = _r(rng.uniform(*config.furniture_height))
    x0_min, y0_min = room.lo[0] + inset, room.lo[1] + inset
    x0_max, y0_max = room.hi[0] - inset - sx, room.hi[1] - inset - sy
    x0 = rng.uniform(x0_min, max(x0_min, x0_max))
    y0 = rng.uniform(y0_min, max(y0_min, y0_max))
    side = int(rng.integers(8))  # 0-3: against that wall; 4-7: free standing
    x0 = _r({0: x0_min, 1: x0_max}.get(side, x0))
    y0 = _r({2: y0_min, 3: y0_max}.get(side, y0))
    c = rng.uniform(0.2, 0.9, size=3)
    color = (_r(c[0]), _r(c[1]), _r(c[2]))
    return Box((x0, y0, 0.0), (_r(x0 + sx), _r(y0 + sy), h), color, BoxKind.FURNITURE)
