"""The batched ray/box renderer, checked against geometry."""

from __future__ import annotations

import ast
import math
import pathlib

import numpy as np
import pytest
import torch

from troupe.models.camera import Intrinsics, camera_rays
from troupe.models.raycast import (
    CPU_PAIRS_PER_THREAD,
    CUDA_PAIRS,
    TEXTURE_CHECKER,
    Lighting,
    RaycastConfig,
    default_device,
    render,
)

SRC_MODELS = pathlib.Path(__file__).resolve().parents[2] / "src" / "models"


def _yaw(yaw: float) -> np.ndarray:
    """Camera-to-world rotation (columns forward, left, up) for a level camera."""
    c, s = math.cos(yaw), math.sin(yaw)
    return np.array([[c, -s, 0.0], [s, c, 0.0], [0.0, 0.0, 1.0]])


def _wall_facing_x(d: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A big wall whose near face is the plane x = d."""
    bounds = np.array([[d, -50.0, -50.0, d + 0.2, 50.0, 50.0]])
    return bounds, np.array([[0.8, 0.6, 0.4]]), np.array([[0.0, 1.0]])


def _render(bounds, colors, textures, positions, rotations, **kw):  # type: ignore[no-untyped-def]
    kw.setdefault("intrinsics", Intrinsics.from_fov(32, 24, 70.0))
    kw.setdefault("device", "cpu")
    rgb, depth = render(bounds, colors, textures, positions, rotations, **kw)
    return rgb.cpu().numpy(), depth.cpu().numpy()


@pytest.mark.parametrize(("width", "height"), [(32, 24), (33, 25)])
@pytest.mark.parametrize("d", [0.37, 2.5, 11.0])
def test_wall_at_known_distance_has_that_z_depth_everywhere(width: int, height: int, d: float) -> None:
    """A wall perpendicular to the optical axis at distance d has z-depth d in every pixel."""
    bounds, colors, textures = _wall_facing_x(d)
    _, depth = _render(
        bounds,
        colors,
        textures,
        [[0.0, 0.0, 1.0]],
        [_yaw(0.0)],
        intrinsics=Intrinsics.from_fov(width, height, 80.0),
    )
    assert depth.shape == (1, height, width) and depth.dtype == np.float32
    assert depth[0, height // 2, width // 2] == pytest.approx(d, rel=1e-4)
    assert np.allclose(depth, d, rtol=1e-4, atol=0)


def test_depth_is_along_the_optical_axis_for_a_turned_camera() -> None:
    """A camera turned to +y sees a wall at y = 3 from y = 1 at z-depth 2, not ray length."""
    bounds = np.array([[-50.0, 3.0, -50.0, 50.0, 3.1, 50.0]])
    _, depth = _render(bounds, [[1.0, 1.0, 1.0]], [[0, 1]], [[0.0, 1.0, 1.0]], [_yaw(math.pi / 2)])
    assert np.allclose(depth, 2.0, rtol=1e-4)


def test_rays_that_hit_nothing_get_miss_depth_and_background() -> None:
    """Looking away from the only box gives the configured miss depth and background."""
    bounds, colors, textures = _wall_facing_x(3.0)
    rgb, depth = _render(bounds, colors, textures, [[0.0, 0.0, 1.0]], [_yaw(math.pi)])
    assert np.all(np.isinf(depth)) and np.all(rgb == 0)
    config = RaycastConfig(miss_depth=0.0, background=(1.0, 0.5, 0.0))
    rgb, depth = _render(bounds, colors, textures, [[0.0, 0.0, 1.0]], [_yaw(math.pi)], config=config)
    assert np.all(depth == 0.0) and np.all(rgb == [255, 128, 0])


def test_hit_colour_follows_the_shading_formula() -> None:
    """An untextured face shows round(255 * albedo * (ambient + intensity * max(0, n.l)))."""
    bounds, colors, textures = _wall_facing_x(2.0)
    light = Lighting(direction=(-2.0, 1.0, 2.0), intensity=0.6, ambient=0.25)
    rgb, _ = _render(bounds, colors, textures, [[0.0, 0.0, 1.0]], [_yaw(0.0)], lighting=light)
    n_dot_l = 2.0 / 3.0  # normal (-1, 0, 0), light (-2, 1, 2) / 3
    expected = np.round(255 * np.clip(colors[0] * (0.25 + 0.6 * n_dot_l), 0, 1))
    assert np.all(np.abs(rgb.reshape(-1, 3).astype(int) - expected) <= 1)
    back = Lighting(direction=(1.0, 0.0, 0.0), intensity=0.6, ambient=0.25)  # behind the face
    rgb, _ = _render(bounds, colors, textures, [[0.0, 0.0, 1.0]], [_yaw(0.0)], lighting=back)
    assert np.all(np.abs(rgb.reshape(-1, 3).astype(int) - np.round(255 * colors[0] * 0.25)) <= 1)


def test_checker_texture_darkens_alternate_tiles() -> None:
    """A checker face shows exactly two shades, the darker one scaled by 1 - contrast."""
    bounds, _colors, _ = _wall_facing_x(2.0)
    textures = np.array([[TEXTURE_CHECKER, 0.3]])
    light = Lighting(direction=(-1.0, 0.0, 0.0), intensity=0.5, ambient=0.5)
    rgb, _ = _render(bounds, [[1.0, 1.0, 1.0]], textures, [[0.0, 0.0, 1.0]], [_yaw(0.0)], lighting=light)
    shades = set(np.unique(rgb[..., 0]).tolist())
    assert shades == {255, round(255 * (1 - RaycastConfig().texture_contrast))}


def test_nearest_box_wins_and_a_box_around_the_camera_is_unseen() -> None:
    """Of two boxes in line the nearer is seen; a box enclosing the camera is transparent."""
    bounds = np.array(
        [
            [5.0, -50, -50, 5.2, 50, 50],
            [2.0, -50, -50, 2.2, 50, 50],
            [-1.0, -1.0, 0.0, 1.0, 1.0, 2.0],  # contains the camera
        ]
    )
    colors = np.array([[1.0, 0, 0], [0, 1.0, 0], [0, 0, 1.0]])
    rgb, depth = _render(bounds, colors, np.zeros((3, 2)) + np.array([0, 1]), [[0.0, 0.0, 1.0]], [_yaw(0.0)])
    assert np.allclose(depth, 2.0, rtol=1e-4)
    assert np.all(rgb[..., 1] > 0) and np.all(rgb[..., 0] == 0) and np.all(rgb[..., 2] == 0)


def _scene_arrays() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """A small cluttered room and a few camera poses in it."""
    rng = np.random.default_rng(0)
    walls = [
        [-0.1, -0.1, -0.1, 5.1, 4.1, 0.0],
        [-0.1, -0.1, 2.6, 5.1, 4.1, 2.7],
        [-0.1, -0.1, 0.0, 0.0, 4.1, 2.6],
        [5.0, -0.1, 0.0, 5.1, 4.1, 2.6],
        [0.0, -0.1, 0.0, 5.0, 0.0, 2.6],
        [0.0, 4.0, 0.0, 5.0, 4.1, 2.6],
    ]
    lo = rng.uniform([0.5, 0.5, 0.0], [4.0, 3.0, 0.0], size=(8, 3))
    hi = lo + rng.uniform([0.3, 0.3, 0.4], [1.0, 1.0, 1.8], size=(8, 3))
    bounds = np.concatenate([np.array(walls), np.concatenate([lo, hi], axis=1)])
    colors = rng.uniform(0.1, 1.0, size=(len(bounds), 3))
    textures = np.stack([rng.integers(0, 3, len(bounds)), rng.uniform(0.2, 0.8, len(bounds))], -1)
    positions = np.stack([np.linspace(0.3, 4.7, 7), np.full(7, 0.3), np.full(7, 1.3)], -1)
    yaws = np.linspace(0.2, 2.8, 7)
    c, s, z, o = np.cos(yaws), np.sin(yaws), np.zeros(7), np.ones(7)
    rotations = np.stack([np.stack([c, s, z], -1), np.stack([-s, c, z], -1), np.stack([z, z, o], -1)], -1)
    return bounds, colors, textures, positions, rotations


def test_batched_render_equals_single_frame_renders() -> None:
    """Rendering T frames at once gives exactly the T single-frame images."""
    bounds, colors, textures, positions, rotations = _scene_arrays()
    rgb, depth = _render(bounds, colors, textures, positions, rotations)
    for t in range(len(positions)):
        rgb1, depth1 = _render(bounds, colors, textures, positions[t : t + 1], rotations[t : t + 1])
        assert np.array_equal(rgb[t], rgb1[0])
        assert np.array_equal(depth[t], depth1[0])


def test_torch_threads_do_not_change_the_result() -> None:
    """One and two torch threads (and the chunk sizes that follow from them) render the same
    bytes: a render replica's thread count never changes a dataset."""
    args = _scene_arrays()
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = _render(*args)
        torch.set_num_threads(2)
        two = _render(*args)
    finally:
        torch.set_num_threads(threads)
    assert np.array_equal(one[0], two[0]) and np.array_equal(one[1], two[1])


def test_chunking_does_not_change_the_result() -> None:
    """A tiny max_pairs (pixel chunks inside a frame) renders the same images as one chunk."""
    bounds, colors, textures, positions, rotations = _scene_arrays()
    big = _render(bounds, colors, textures, positions, rotations, config=RaycastConfig(max_pairs=1 << 24))
    small = _render(bounds, colors, textures, positions, rotations, config=RaycastConfig(max_pairs=500))
    assert np.array_equal(big[0], small[0]) and np.array_equal(big[1], small[1])
    assert np.isfinite(big[1]).all()  # a closed room: every ray hits something


def test_rendering_is_deterministic_and_typed() -> None:
    """Two calls give identical uint8 RGB and float32 depth of shapes (T, H, W[, 3])."""
    args = _scene_arrays()
    a, b = _render(*args), _render(*args)
    assert a[0].dtype == np.uint8 and a[0].shape == (7, 24, 32, 3) and a[1].shape == (7, 24, 32)
    assert np.array_equal(a[0], b[0]) and np.array_equal(a[1], b[1])


def test_read_only_arrays_render_as_writable_ones() -> None:
    """Arrays received from another process are read-only views: they render, with no warning."""
    args = _scene_arrays()
    frozen = []
    for a in args:
        a = np.array(a)
        a.flags.writeable = False
        frozen.append(a)
    got = _render(*frozen)  # filterwarnings=error: torch's non-writable warning would fail it
    want = _render(*args)
    assert np.array_equal(got[0], want[0]) and np.array_equal(got[1], want[1])


def test_bad_shapes_are_refused() -> None:
    """Boxes or poses of the wrong shape raise ValueError naming the input."""
    bounds, colors, textures = _wall_facing_x(1.0)
    with pytest.raises(ValueError, match="bounds"):
        _render(bounds[:, :5], colors, textures, [[0, 0, 1.0]], [_yaw(0)])
    with pytest.raises(ValueError, match="one row per frame"):
        _render(bounds, colors, textures, [[0, 0, 1.0]] * 2, [_yaw(0)])


def test_default_device_and_edge_ray_angle() -> None:
    """The default device is CUDA only when present; the edge rays span the horizontal fov."""
    assert default_device().type == ("cuda" if torch.cuda.is_available() else "cpu")
    k = Intrinsics.from_fov(64, 48, 90.0)
    rays = camera_rays(k, torch.eye(3, dtype=torch.float64)[None])
    # The image edge is at 45 degrees (fx = 32); the last pixel's centre is half a pixel in.
    edge = math.atan2(-rays[0, 24, 63, 1].item(), rays[0, 24, 63, 0].item())
    assert edge == pytest.approx(math.atan(31.5 / 32))
    assert torch.all(rays[..., 0] == 1.0)


def test_models_do_not_import_runtime_or_actors() -> None:
    """No module of troupe.models imports troupe.runtime or troupe.actors."""
    for path in SRC_MODELS.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                names = [node.module or ""]
            for name in names:
                assert not name.startswith(("troupe.runtime", "troupe.actors")), (path, name)


def test_generated_episodes_render_end_to_end() -> None:
    """generate -> randomize -> plan -> render gives a finite, non-flat image per frame on CPU."""
    from troupe.actors.datagen.randomize import RandomizeConfig, randomize
    from troupe.actors.datagen.scene import generate_scene, scene_boxes_tensor
    from troupe.actors.datagen.trajectory import PlanConfig, plan_episode

    def episode(seed: int) -> tuple[np.ndarray, np.ndarray, int]:
        scene = randomize(generate_scene(seed), seed, RandomizeConfig(width=48, height=36))
        plan = plan_episode(scene, seed, PlanConfig(max_frames=60))
        r = scene.render
        rgb, depth = _render(
            *scene_boxes_tensor(scene),
            plan.positions,
            plan.rotations,
            intrinsics=Intrinsics.from_fov(r.width, r.height, r.fov_deg),
            lighting=Lighting(r.light_dir, r.light_intensity, r.ambient),
        )
        return rgb, depth, plan.frames

    for seed in (1, 2, 3):
        rgb, depth, frames = episode(seed)
        assert rgb.shape == (frames, 36, 48, 3)
        assert np.isfinite(depth).all() and depth.min() > 0  # closed rooms: every ray hits
        assert rgb.std() > 5  # an image, not a flat colour


def test_a_cpu_chunk_grows_with_torch_threads_and_a_given_size_wins() -> None:
    """By default a CPU chunk holds CPU_PAIRS_PER_THREAD pairs per torch thread (a chunk's
    temporaries stay within the cores' caches), CUDA_PAIRS on CUDA; max_pairs overrides both."""
    threads = torch.get_num_threads()
    try:
        for n in (1, 2):
            torch.set_num_threads(n)
            assert RaycastConfig().pairs_on(torch.device("cpu")) == CPU_PAIRS_PER_THREAD * n
    finally:
        torch.set_num_threads(threads)
    assert RaycastConfig().pairs_on(torch.device("cuda")) == CUDA_PAIRS
    assert RaycastConfig(max_pairs=500).pairs_on(torch.device("cpu")) == 500
    with pytest.raises(ValueError, match="max_pairs >= 1"):
        RaycastConfig(max_pairs=0)
