"""Occupancy grids, A*, path shortening and camera trajectories."""

from __future__ import annotations

import heapq
import itertools
import math

import numpy as np
import pytest

from troupe.actors.datagen.astar import astar, octile_cost, octile_distance
from troupe.actors.datagen.errors import PlanFailed
from troupe.actors.datagen.occupancy import Grid, component_labels, occupancy_grid
from troupe.actors.datagen.pose import (
    ego_action,
    rotation_from_6d,
    rotation_from_yaw_pitch,
    rotation_to_6d,
)
from troupe.actors.datagen.scene import Box, BoxKind, Scene, generate_scene
from troupe.actors.datagen.trajectory import (
    PlanConfig,
    line_of_sight,
    plan_episode,
    plan_path,
    shorten_path,
    supercover,
)
from troupe.runtime.errors import ItemFailed, error_class

T = 0.1  # wall thickness of the hand-built scenes


def _room(w: float, d: float, *extra: Box) -> Scene:
    """A closed w x d room with floor, ceiling and four walls, plus ``extra`` boxes."""
    boxes = (
        Box((-T, -T, -T), (w + T, d + T, 0.0), kind=BoxKind.FLOOR),
        Box((-T, -T, 2.6), (w + T, d + T, 2.7), kind=BoxKind.CEILING),
        Box((-T, -T, 0.0), (0.0, d + T, 2.6), kind=BoxKind.WALL),
        Box((w, -T, 0.0), (w + T, d + T, 2.6), kind=BoxKind.WALL),
        Box((0.0, -T, 0.0), (w, 0.0, 2.6), kind=BoxKind.WALL),
        Box((0.0, d, 0.0), (w, d + T, 2.6), kind=BoxKind.WALL),
        *extra,
    )
    return Scene(seed=0, size=(w, d), ceiling=2.6, rooms=(), doors=(), boxes=boxes)


def _split_room() -> Scene:
    """A 4 x 2 m room cut in two halves by a full wall at x = 2."""
    return _room(4.0, 2.0, Box((1.95, 0.0, 0.0), (2.05, 2.0, 2.6), kind=BoxKind.WALL))


def _dijkstra(occupied: np.ndarray, start: tuple[int, int], goal: tuple[int, int]) -> float:
    """Reference cost of the best 8-connected path with no corner cutting."""
    nx, ny = occupied.shape
    dist = {start: 0.0}
    heap = [(0.0, start)]
    while heap:
        c, (i, j) = heapq.heappop(heap)
        if (i, j) == goal:
            return c
        if c > dist[(i, j)]:
            continue
        for di in (-1, 0, 1):
            for dj in (-1, 0, 1):
                a, b = i + di, j + dj
                if (di, dj) == (0, 0) or not (0 <= a < nx and 0 <= b < ny) or occupied[a, b]:
                    continue
                if di and dj and (occupied[i + di, j] or occupied[i, j + dj]):
                    continue
                nc = c + (math.sqrt(2) if di and dj else 1.0)
                if nc < dist.get((a, b), math.inf):
                    dist[(a, b)] = nc
                    heapq.heappush(heap, (nc, (a, b)))
    return math.inf


# --- occupancy ---------------------------------------------------------------------------------


def test_inflation_keeps_every_point_of_free_cells_clear() -> None:
    """A free cell lies wholly farther than the radius from an obstacle; an occupied one does not."""
    box = Box((1.03, 0.57, 0.0), (1.61, 1.12, 0.8))
    scene = _room(3.0, 2.0, box)
    r = 0.2
    grid = occupancy_grid(scene, cell=0.1, robot_radius=r)
    nx, ny = grid.shape
    for i in range(nx):
        for j in range(ny):
            x0, y0 = grid.origin[0] + i * 0.1, grid.origin[1] + j * 0.1
            gx = max(box.lo[0] - (x0 + 0.1), x0 - box.hi[0], 0.0)
            gy = max(box.lo[1] - (y0 + 0.1), y0 - box.hi[1], 0.0)
            near_box = math.hypot(gx, gy) < r - 1e-9
            if near_box:
                assert grid.occupied[i, j]
            inside = 0.1 + r < x0 < 2.9 - r - 0.1 and 0.1 + r < y0 < 1.9 - r - 0.1
            if inside and math.hypot(gx, gy) > r + 1e-9:
                assert not grid.occupied[i, j]


def test_boxes_outside_the_height_band_are_not_obstacles() -> None:
    """Floor, ceiling and a lintel above the band leave the cells under them free."""
    lintel = Box((1.0, 0.0, 2.05), (1.1, 2.0, 2.6), kind=BoxKind.WALL)
    grid = occupancy_grid(_room(3.0, 2.0, lintel))
    assert grid.free.sum() > 0
    i, j = grid.world_to_cell([1.05, 1.0])
    assert grid.is_free(int(i), int(j))
    assert component_labels(grid.free)[1] == 1


def test_world_cell_round_trip() -> None:
    """A cell's centre maps back to the same cell."""
    grid = Grid(np.zeros((30, 20), np.bool_), (-0.1, -0.1), 0.1)
    cells = np.array([[0, 0], [29, 19], [7, 13]])
    assert np.array_equal(grid.world_to_cell(grid.cell_to_world(cells)), cells)
    assert not grid.contains(30, 0) and grid.is_free(29, 19)


def test_component_labels_match_a_flood_fill() -> None:
    """Run-based labelling finds the same 4-connected components as a flood fill."""
    rng = np.random.default_rng(0)
    for _ in range(20):
        free = rng.random((23, 17)) < 0.55
        labels, count = component_labels(free)
        seen = np.full(free.shape, -1)
        n = 0
        for start in zip(*np.nonzero(free), strict=True):
            if seen[start] >= 0:
                continue
            stack = [start]
            seen[start] = n
            while stack:
                i, j = stack.pop()
                for a, b in ((i + 1, j), (i - 1, j), (i, j + 1), (i, j - 1)):
                    if 0 <= a < 23 and 0 <= b < 17 and free[a, b] and seen[a, b] < 0:
                        seen[a, b] = n
                        stack.append((a, b))
            n += 1
        assert count == n
        assert np.array_equal(labels, seen)


# --- A* ---------------------------------------------------------------------------------------


def test_astar_finds_the_optimal_octile_cost_on_a_hand_made_grid() -> None:
    """Around a wall with one gap, A* returns a path of the known optimal cost."""
    occ = np.zeros((7, 7), np.bool_)
    occ[3, :6] = True  # a wall along j at i = 3, open only at j = 6
    path = astar(occ, (0, 0), (6, 0))
    assert path is not None and path[0] == (0, 0) and path[-1] == (6, 0)
    # No diagonal into the gap past the wall's end, so: (0,0) -> (2,6) costs 4 + 2*sqrt2,
    # (2,6) -> (4,6) costs 2 straight through the gap, (4,6) -> (6,0) mirrors the first leg.
    expected = 2 * (4 + 2 * math.sqrt(2)) + 2
    assert expected == pytest.approx(_dijkstra(occ, (0, 0), (6, 0)))
    assert octile_cost(path) == pytest.approx(expected)
    assert all(not occ[c] for c in path)


def test_astar_matches_dijkstra_on_random_grids() -> None:
    """A*'s path cost equals a brute-force Dijkstra's on random obstacle fields."""
    rng = np.random.default_rng(1)
    for _ in range(30):
        occ = rng.random((25, 25)) < 0.3
        start, goal = (0, 0), (24, 24)
        occ[start] = occ[goal] = False
        path = astar(occ, start, goal)
        best = _dijkstra(occ, start, goal)
        if path is None:
            assert best == math.inf
        else:
            assert octile_cost(path) == pytest.approx(best)
            assert all(not occ[c] for c in path)


def test_astar_never_cuts_a_corner() -> None:
    """Two cells touching only at a corner block the diagonal between them."""
    occ = np.zeros((3, 3), np.bool_)
    occ[1, 0] = occ[0, 1] = True
    assert astar(occ, (0, 0), (1, 1)) is None
    occ[0, 1] = False
    path = astar(occ, (0, 0), (1, 1))
    assert path == [(0, 0), (0, 1), (1, 1)]


def test_astar_unreachable_and_occupied_endpoints() -> None:
    """A sealed goal or an occupied endpoint gives None; off-grid endpoints raise."""
    occ = np.zeros((5, 5), np.bool_)
    occ[2, :] = True
    assert astar(occ, (0, 0), (4, 4)) is None
    assert astar(occ, (2, 0), (0, 0)) is None
    assert astar(occ, (0, 0), (0, 0)) == [(0, 0)]
    with pytest.raises(ValueError, match="outside"):
        astar(occ, (0, 0), (5, 0))


def test_astar_solves_a_cluttered_100_by_100_grid() -> None:
    """A cluttered 100x100 grid is solved with a free path of the optimal cost."""
    rng = np.random.default_rng(2)
    occ = rng.random((100, 100)) < 0.25
    occ[20:80, 50] = True
    occ[0, 0] = occ[99, 99] = False
    path = astar(occ, (0, 0), (99, 99))
    assert path is not None
    assert path[0] == (0, 0) and path[-1] == (99, 99)
    assert not any(occ[x, y] for x, y in path)
    assert octile_distance((0, 0), (99, 99)) <= octile_cost(path)
    assert octile_cost(path) == pytest.approx(_dijkstra(occ, (0, 0), (99, 99)))


# --- line of sight and shortening -------------------------------------------------------------


def test_supercover_takes_both_cells_at_a_corner() -> None:
    """A segment through a grid corner covers both cells beside it, in either direction."""
    assert set(supercover((0, 0), (1, 1))) == {(0, 0), (1, 0), (0, 1), (1, 1)}
    assert set(supercover((0, 0), (3, 0))) == {(0, 0), (1, 0), (2, 0), (3, 0)}
    for a, b in (((0, 0), (5, 2)), ((4, 1), (-3, 7)), ((2, 2), (2, -4))):
        assert set(supercover(a, b)) == set(supercover(b, a))
        cells = supercover(a, b)
        assert cells[0] == a and cells[-1] == b
        # Every step moves to a 4-neighbour (or the corner's pair): no cell is skipped.
        assert all(abs(p[0] - q[0]) + abs(p[1] - q[1]) <= 2 for p, q in itertools.pairwise(cells))


def test_shortened_path_keeps_line_of_sight_around_obstacles() -> None:
    """Shortening an L-shaped detour keeps the corner and every kept segment is free."""
    occ = np.zeros((10, 10), np.bool_)
    occ[3:7, 0:7] = True
    path = astar(occ, (0, 0), (9, 0))
    assert path is not None
    short = shorten_path(occ, path)
    assert short[0] == (0, 0) and short[-1] == (9, 0) and 3 <= len(short) < len(path)
    assert all(line_of_sight(occ, a, b) for a, b in itertools.pairwise(short))


# --- episodes ---------------------------------------------------------------------------------


def _assert_poses_free(grid: Grid, positions: np.ndarray) -> None:
    """Every point on every segment between consecutive poses lies in a free cell."""
    xy = positions[:, :2]
    for a, b in itertools.pairwise(xy):
        n = max(2, int(np.ceil(np.linalg.norm(b - a) / (grid.cell / 10))) + 1)
        pts = a + np.linspace(0.0, 1.0, n)[:, None] * (b - a)
        cells = grid.world_to_cell(pts)
        assert not grid.occupied[cells[:, 0], cells[:, 1]].any()


@pytest.mark.parametrize("seed", range(30))
def test_planned_episodes_never_cross_occupied_cells(seed: int) -> None:
    """Across seeds, start and goal are free and every pose segment stays in free cells."""
    config = PlanConfig()
    scene = generate_scene(seed)
    grid = occupancy_grid(scene, config.cell, config.robot_radius)
    plan = plan_episode(scene, seed, config)
    assert grid.is_free(*plan.start) and grid.is_free(*plan.goal) and plan.start != plan.goal
    _assert_poses_free(grid, plan.positions)
    _assert_poses_free(grid, plan.waypoints)
    assert config.min_frames <= plan.frames <= config.max_frames
    steps = np.linalg.norm(np.diff(plan.positions[:, :2], axis=0), axis=1)
    # Constant speed along the path: a step cuts a corner only where it spans a waypoint.
    assert np.all(steps <= config.speed / config.fps + 1e-9)
    assert np.median(steps) == pytest.approx(config.speed / config.fps)
    assert np.allclose(plan.positions[:, 2], scene.render.cam_height)
    assert np.allclose(plan.timestamps, np.arange(plan.frames) / config.fps)
    assert np.allclose(plan.actions, ego_action(plan.positions, plan.rotations))
    if not plan.truncated:
        assert np.linalg.norm(plan.positions[-1] - plan.waypoints[-1]) < config.speed / config.fps


def test_plan_episode_is_deterministic() -> None:
    """The same scene and seed give the same trajectory."""
    scene = generate_scene(1)
    a, b = plan_episode(scene, 4), plan_episode(scene, 4)
    assert np.array_equal(a.positions, b.positions) and np.array_equal(a.actions, b.actions)


def test_camera_looks_along_the_direction_of_travel() -> None:
    """With instant turns the forward axis points along each step's motion."""
    scene = generate_scene(3)
    plan = plan_episode(scene, 3, PlanConfig(max_yaw_rate_deg=None))
    steps = np.diff(plan.positions, axis=0)
    forward = plan.rotations[:-1, :, 0]
    cos = np.sum(steps * forward, axis=1) / np.linalg.norm(steps, axis=1)
    # Steps that straddle a waypoint bend; all others are exactly aligned.
    assert np.mean(np.isclose(cos, 1.0)) > 0.8


def test_yaw_turns_no_faster_than_the_limit() -> None:
    """Consecutive yaws differ by at most max_yaw_rate / fps."""
    config = PlanConfig(max_yaw_rate_deg=90.0)
    for seed in range(10):
        plan = plan_episode(generate_scene(seed), seed, config)
        yaw = np.arctan2(plan.rotations[:, 1, 0], plan.rotations[:, 0, 0])
        turn = np.abs((np.diff(yaw) + np.pi) % (2 * np.pi) - np.pi)
        assert np.all(turn <= math.radians(90.0) / config.fps + 1e-9)


def test_unreachable_goal_raises_plan_failed() -> None:
    """A wall splitting the scene makes a goal on the other side fail the plan."""
    scene = _split_room()
    grid = occupancy_grid(scene)
    left = tuple(int(v) for v in grid.world_to_cell([0.8, 1.0]))
    right = tuple(int(v) for v in grid.world_to_cell([3.2, 1.0]))
    with pytest.raises(PlanFailed, match="cannot be reached"):
        plan_path(grid, left, right, 1.2)  # type: ignore[arg-type]
    outcomes = []
    for seed in range(20):
        try:
            plan = plan_episode(scene, seed, PlanConfig(min_length=0.2, min_frames=2))
        except PlanFailed:
            outcomes.append(False)
            continue
        sides = {plan.positions[0, 0] < 2.0, plan.waypoints[-1, 0] < 2.0}
        assert len(sides) == 1
        outcomes.append(True)
    assert True in outcomes and False in outcomes


def test_too_short_path_raises_plan_failed() -> None:
    """A path under min_length or min_frames fails the plan, and the error is an ItemFailed."""
    grid = occupancy_grid(_room(3.0, 2.0))
    a = tuple(int(v) for v in grid.world_to_cell([1.0, 1.0]))
    b = tuple(int(v) for v in grid.world_to_cell([1.5, 1.0]))
    with pytest.raises(PlanFailed, match="min_length") as info:
        plan_path(grid, a, b, 1.2)  # type: ignore[arg-type]
    assert isinstance(info.value, ItemFailed) and info.value.code == "plan_failed"
    assert error_class("plan_failed") is PlanFailed
    with pytest.raises(
        PlanFailed, match=r"gives 6 frames at speed=1.0 m/s and fps=10, under min_frames=20; lower speed"
    ):
        plan_path(grid, a, b, 1.2, PlanConfig(min_length=0.1, min_frames=20))  # type: ignore[arg-type]
    plan = plan_path(grid, a, b, 1.2, PlanConfig(min_length=0.1, min_frames=2))  # type: ignore[arg-type]
    assert plan.frames == 6


def test_long_paths_are_cut_at_max_frames() -> None:
    """A path longer than max_frames allows is truncated to exactly max_frames."""
    grid = occupancy_grid(_room(6.0, 1.0))
    a = tuple(int(v) for v in grid.world_to_cell([0.5, 0.5]))
    b = tuple(int(v) for v in grid.world_to_cell([5.5, 0.5]))
    plan = plan_path(grid, a, b, 1.2, PlanConfig(max_frames=20))  # type: ignore[arg-type]
    assert plan.truncated and plan.frames == 20 and plan.length == pytest.approx(5.0, abs=0.11)


# --- pose -------------------------------------------------------------------------------------


def test_rotations_are_proper_and_6d_round_trips() -> None:
    """Yaw/pitch rotations are orthonormal with det 1 and survive the 6D representation."""
    rng = np.random.default_rng(3)
    yaw, pitch = rng.uniform(-np.pi, np.pi, 50), rng.uniform(-1.2, 1.2, 50)
    rot = rotation_from_yaw_pitch(yaw, pitch)
    assert rot.shape == (50, 3, 3)
    assert np.allclose(rot @ np.swapaxes(rot, 1, 2), np.eye(3))
    assert np.allclose(np.linalg.det(rot), 1.0)
    assert np.allclose(rotation_from_6d(rotation_to_6d(rot)), rot)
    r0 = rotation_from_yaw_pitch(math.pi / 2)
    assert np.allclose(r0[:, 0], [0, 1, 0]) and np.allclose(r0[:, 2], [0, 0, 1])
    assert rotation_from_yaw_pitch(0.0, 0.3)[2, 0] > 0  # positive pitch looks up


def test_ego_action_layout() -> None:
    """The ego action is the position then the forward and left columns."""
    rot = rotation_from_yaw_pitch(0.4, 0.1)
    act = ego_action([1.0, 2.0, 3.0], rot)
    assert act.shape == (9,)
    assert np.allclose(act[:3], [1, 2, 3])
    assert np.allclose(act[3:6], rot[:, 0]) and np.allclose(act[6:9], rot[:, 1])
