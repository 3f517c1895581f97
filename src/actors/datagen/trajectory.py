"""From a scene to a camera trajectory: sample start and goal, A*, shorten, interpolate.

The A* path is shortened by line of sight: a waypoint is dropped when the straight segment that
skips it crosses only free cells. "Crosses" is decided by the segment's supercover, every cell
the segment touches, with both cells taken where it passes exactly through a grid corner, so a
shortened path never clips a corner the grid path went around. Every pose lies on a segment
between cell centres, and since a free cell is at least ``robot_radius`` from every obstacle at
every point (see :mod:`troupe.actors.datagen.occupancy`), so is every pose.

Poses move at a fixed speed and frame rate along the shortened path; the camera looks along the
direction of travel, turning at a bounded rate when ``max_yaw_rate_deg`` is set. The last frame
lies within one step (``speed / fps``) of the goal; an episode longer than ``max_frames`` is cut
there and marked ``truncated``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from troupe.actors.datagen.errors import PlanFailed
from troupe.runtime.errors import ConfigError

from .astar import Cell, astar
from .occupancy import DEFAULT_Z_BAND, Grid, occupancy_grid
from .pose import ego_action, rotation_from_yaw_pitch
from .scene import Scene

__all__ = [
    "Plan",
    "PlanConfig",
    "line_of_sight",
    "plan_episode",
    "plan_path",
    "shorten_path",
    "supercover",
]

FloatArray = npt.NDArray[np.float64]


@dataclass(frozen=True)
class PlanConfig:
    """How episodes are planned.

    Attributes:
        cell: occupancy cell size, metres.
        robot_radius: obstacles are inflated by it, metres.
        z_band: heights the robot's body occupies.
        speed: camera speed along the path, m/s.
        fps: frame rate.
        max_frames: frames per episode at most; longer paths are cut (bounds rendering).
        min_frames: fewer frames than this fails the plan.
        min_length: a shortened path shorter than this (metres) fails the plan.
        max_yaw_rate_deg: largest turn per second; None turns instantly at each waypoint.
        pitch_deg: constant camera pitch, positive up.
    """

    cell: float = 0.1
    robot_radius: float = 0.2
    z_band: tuple[float, float] = DEFAULT_Z_BAND
    speed: float = 1.0
    fps: float = 10.0
    max_frames: int = 120
    min_frames: int = 10
    min_length: float = 1.0
    max_yaw_rate_deg: float | None = 180.0
    pitch_deg: float = 0.0

    def __post_init__(self) -> None:
        if self.cell <= 0 or self.robot_radius < 0 or self.speed <= 0 or self.fps <= 0:
            raise ConfigError("PlanConfig needs cell, speed and fps > 0 and robot_radius >= 0")
        if not 1 <= self.min_frames <= self.max_frames:
            raise ConfigError(
                f"PlanConfig needs 1 <= min_frames <= max_frames, got {self.min_frames} and {self.max_frames}"
            )
        if self.max_yaw_rate_deg is not None and self.max_yaw_rate_deg <= 0:
            raise ConfigError("PlanConfig.max_yaw_rate_deg must be positive, or None")


@dataclass(frozen=True, eq=False)
class Plan:
    """A camera trajectory, one pose per frame. Arrays are float64.

    Attributes:
        positions: ``(T, 3)`` camera positions, world frame, metres.
        rotations: ``(T, 3, 3)`` camera-to-world rotations (columns forward, left, up).
        timestamps: ``(T,)`` seconds from the first frame.
        fps: frame rate.
        actions: ``(T, 9)`` ego actions, position + 6D rotation (:mod:`troupe.actors.datagen.pose`).
        waypoints: ``(K, 3)`` corners of the shortened path, start to goal, at camera height.
        length: length of the whole shortened path, metres (longer than the frames cover when
            truncated).
        truncated: the path was cut at ``max_frames``.
        start: start cell.
        goal: goal cell.
    """

    positions: FloatArray
    rotations: FloatArray
    timestamps: FloatArray
    fps: float
    actions: FloatArray
    waypoints: FloatArray
    length: float
    truncated: bool
    start: Cell
    goal: Cell

    @property
    def frames(self) -> int:
        """Number of frames T."""
        return int(self.positions.shape[0])


def supercover(a: Cell, b: Cell) -> list[Cell]:
    """Every cell the segment between the centres of ``a`` and ``b`` touches, in order.

    Where the segment passes exactly through a grid corner, both cells beside the corner are
    included, so a segment never slips diagonally between two cells.
    """
    (x, y), (x1, y1) = a, b
    dx, dy = x1 - x, y1 - y
    nx, ny = abs(dx), abs(dy)
    sx, sy = (1 if dx > 0 else -1), (1 if dy > 0 else -1)
    cells = [(x, y)]
    ix = iy = 0
    while ix < nx or iy < ny:
        # Sign of the crossing order of the next vertical and horizontal grid lines, in integers.
        decision = (1 + 2 * ix) * ny - (1 + 2 * iy) * nx
        if decision == 0:
            cells.append((x + sx, y))
            cells.append((x, y + sy))
            x, y, ix, iy = x + sx, y + sy, ix + 1, iy + 1
        elif decision < 0:
            x, ix = x + sx, ix + 1
        else:
            y, iy = y + sy, iy + 1
        cells.append((x, y))
    return cells


def line_of_sight(occupied: npt.NDArray[np.bool_], a: Cell, b: Cell) -> bool:
    """Whether every cell of the supercover from ``a`` to ``b`` is inside the grid and free."""
    nx, ny = occupied.shape
    return all(0 <= i < nx and 0 <= j < ny and not occupied[i, j] for i, j in supercover(a, b))


def shorten_path(occupied: npt.NDArray[np.bool_], path: Sequence[Cell]) -> list[Cell]:
    """Drop the waypoints a straight free segment can skip (greedy string pulling).

    From each kept waypoint the path goes straight to the farthest later cell still in line of
    sight along the way; start and goal are always kept.
    """
    if len(path) <= 2:
        return list(path)
    kept = [path[0]]
    anchor, k = 0, 1
    while k < len(path) - 1:
        if line_of_sight(occupied, path[anchor], path[k + 1]):
            k += 1
            continue
        kept.append(path[k])
        anchor, k = k, k + 1
    kept.append(path[-1])
    return kept


def _poses(xy: FloatArray, config: PlanConfig) -> tuple[FloatArray, FloatArray, float, bool]:
    """Positions ``(T, 2)`` and yaws ``(T,)`` at fixed speed along a polyline ``(K, 2)``."""
    seg = np.diff(xy, axis=0)
    seg_len = np.hypot(seg[:, 0], seg[:, 1])
    cum = np.concatenate([[0.0], np.cumsum(seg_len)])
    length = float(cum[-1])
    step = config.speed / config.fps
    n = math.floor(length / step + 1e-6) + 1  # a rounding error must not drop a frame
    truncated = n > config.max_frames
    n = min(n, config.max_frames)
    s = np.arange(n) * step
    pos = np.stack([np.interp(s, cum, xy[:, 0]), np.interp(s, cum, xy[:, 1])], axis=-1)
    k = np.clip(np.searchsorted(cum, s, side="right") - 1, 0, len(seg) - 1)
    target = np.arctan2(seg[k, 1], seg[k, 0])
    if config.max_yaw_rate_deg is None:
        return pos, target, length, truncated
    limit = math.radians(config.max_yaw_rate_deg) / config.fps
    yaw = np.empty_like(target)
    yaw[0] = target[0]
    for t in range(1, n):
        turn = (target[t] - yaw[t - 1] + math.pi) % (2 * math.pi) - math.pi
        yaw[t] = yaw[t - 1] + min(max(turn, -limit), limit)
    return pos, yaw, length, truncated


def plan_path(
    grid: Grid, start: Cell, goal: Cell, cam_height: float, config: PlanConfig | None = None
) -> Plan:
    """Plan a trajectory between two given cells of a grid.

    Args:
        grid: occupancy grid (its cell size wins over ``config.cell``).
        start: start cell.
        goal: goal cell.
        cam_height: camera z, metres.
        config: planning parameters, defaults to ``PlanConfig()``.

    Returns:
        The plan.

    Raises:
        PlanFailed: the goal cannot be reached, or the path is shorter than ``min_length`` or
            ``min_frames``.
        ValueError: ``start`` or ``goal`` is outside the grid.
    """
    config = config or PlanConfig()
    path = astar(grid.occupied, start, goal)
    if path is None:
        raise PlanFailed(
            f"goal {goal} cannot be reached from start {start} (occupied, or another component "
            "of free space); this item is pruned, try another seed"
        )
    cells = shorten_path(grid.occupied, path)
    xy = grid.cell_to_world(np.asarray(cells, np.int64))
    if len(cells) < 2:
        raise PlanFailed(f"start {start} equals goal {goal}; try another seed")
    pos2, yaw, length, truncated = _poses(xy, config)
    if length < config.min_length - 1e-9:
        raise PlanFailed(
            f"path of {length:.2f} m is under min_length={config.min_length} m; try another seed, "
            "or lower min_length (a planner kwarg; PlanConfig's field)"
        )
    if len(pos2) < config.min_frames:
        # Frames are the path's length over the speed, at fps: another seed rarely helps.
        raise PlanFailed(
            f"path of {length:.2f} m gives {len(pos2)} frames at speed={config.speed} m/s and "
            f"fps={config.fps:g}, under min_frames={config.min_frames}; lower speed or min_frames, "
            "or raise fps (the planner's kwargs; PlanConfig's fields)"
        )
    positions = np.concatenate([pos2, np.full((len(pos2), 1), cam_height)], axis=-1)
    rotations = rotation_from_yaw_pitch(yaw, math.radians(config.pitch_deg))
    return Plan(
        positions=positions,
        rotations=rotations,
        timestamps=np.arange(len(pos2)) / config.fps,
        fps=config.fps,
        actions=ego_action(positions, rotations),
        waypoints=np.concatenate([xy, np.full((len(xy), 1), cam_height)], axis=-1),
        length=length,
        truncated=truncated,
        start=start,
        goal=goal,
    )


def plan_episode(scene: Scene, seed: int, config: PlanConfig | None = None) -> Plan:
    """Plan a trajectory between a random free start and a random free goal of a scene.

    The start is a free cell drawn uniformly by a numpy ``PCG64`` stream seeded by ``seed``;
    the goal is drawn uniformly among the free cells at least ``min_length`` from it in a straight
    line (nearer goals could only fail). The camera flies at ``scene.render.cam_height``.

    Args:
        scene: the scene.
        seed: planning seed.
        config: planning parameters, defaults to ``PlanConfig()``.

    Returns:
        The plan.

    Raises:
        PlanFailed: fewer than two free cells, no goal far enough, goal unreachable, or path
            too short.
    """
    config = config or PlanConfig()
    grid = occupancy_grid(scene, config.cell, config.robot_radius, config.z_band)
    free = np.flatnonzero(grid.free)
    if len(free) < 2:
        raise PlanFailed(
            f"scene {scene.seed} has {len(free)} free cells at robot_radius="
            f"{config.robot_radius}; lower the radius or use another scene"
        )
    rng = np.random.Generator(np.random.PCG64(seed))
    ny = grid.shape[1]
    s = int(free[rng.integers(len(free))])
    start = (s // ny, s % ny)
    # Goals closer than min_length in a straight line could only fail; they are not drawn.
    cells = np.stack([free // ny, free % ny], axis=-1)
    far = free[np.hypot(*(cells - np.asarray(start)).T) * grid.cell >= config.min_length]
    if len(far) == 0:
        raise PlanFailed(
            f"no free cell lies {config.min_length} m from start {start} in scene {scene.seed}; "
            "lower min_length (a planner kwarg; PlanConfig's field) or use another seed"
        )
    g = int(far[rng.integers(len(far))])
    return plan_path(grid, start, (g // ny, g % ny), scene.render.cam_height, config)
