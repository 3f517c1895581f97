"""Occupancy grids: where a round robot's centre may be, on a 2D grid over the floor.

Cells are indexed ``(i, j)`` with ``i`` along world x and ``j`` along world y, so the boolean
array has shape ``(nx, ny)`` and ``occupied[i, j]`` covers
``[x0 + i*cell, x0 + (i+1)*cell) x [y0 + j*cell, y0 + (j+1)*cell)``.

A cell is occupied when *any* point of it lies within ``robot_radius`` of an obstacle's
footprint (or inside it). That is stricter than testing the cell's centre, and it is what makes a
path through free cells safe everywhere along it, not only at the cell centres.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt

if TYPE_CHECKING:
    from .scene import Box, Scene

__all__ = [
    "DEFAULT_Z_BAND",
    "Grid",
    "component_labels",
    "footprint_mask",
    "is_connected",
    "obstacle_footprints",
    "occupancy_grid",
]

DEFAULT_Z_BAND = (0.05, 1.8)
"""Heights (m) the robot's body occupies: boxes that reach into this band are obstacles; the
floor (top at z=0), the ceiling and door lintels above it are not."""

BoolArray = npt.NDArray[np.bool_]
IntArray = npt.NDArray[np.int64]


@dataclass(frozen=True, eq=False)
class Grid:
    """A boolean occupancy grid and its placement in the world.

    Attributes:
        occupied: ``(nx, ny)`` bool array, True where the robot's centre may not be.
        origin: world ``(x, y)`` of the lower corner of cell ``(0, 0)``.
        cell: cell edge length in metres.
    """

    occupied: BoolArray
    origin: tuple[float, float]
    cell: float

    @property
    def shape(self) -> tuple[int, int]:
        """``(nx, ny)``."""
        nx, ny = self.occupied.shape
        return nx, ny

    @property
    def free(self) -> BoolArray:
        """The complement of :attr:`occupied`."""
        return ~self.occupied

    def contains(self, i: int, j: int) -> bool:
        """Whether cell ``(i, j)`` lies inside the grid."""
        nx, ny = self.occupied.shape
        return 0 <= i < nx and 0 <= j < ny

    def is_free(self, i: int, j: int) -> bool:
        """Whether cell ``(i, j)`` is inside the grid and free."""
        return self.contains(i, j) and not bool(self.occupied[i, j])

    def world_to_cell(self, xy: npt.ArrayLike) -> IntArray:
        """Cell indices ``(..., 2)`` holding world points ``(..., 2)`` (may lie off the grid)."""
        p = np.asarray(xy, np.float64)
        return np.floor((p - np.asarray(self.origin)) / self.cell).astype(np.int64)

    def cell_to_world(self, ij: npt.ArrayLike) -> npt.NDArray[np.float64]:
        """World ``(..., 2)`` centres of cells ``(..., 2)``."""
        c = np.asarray(ij, np.float64)
        return np.asarray(self.origin) + (c + 0.5) * self.cell


def obstacle_footprints(
    boxes: Iterable[Box], z_band: tuple[float, float] = DEFAULT_Z_BAND
) -> npt.NDArray[np.float64]:
    """Footprints ``(N, 4)`` as ``[xmin, ymin, xmax, ymax]`` of the boxes that reach into the band.

    Args:
        boxes: scene boxes.
        z_band: ``(zlo, zhi)``; a box is an obstacle when its z-range overlaps it.
    """
    rows = [
        (b.lo[0], b.lo[1], b.hi[0], b.hi[1]) for b in boxes if b.lo[2] < z_band[1] and b.hi[2] > z_band[0]
    ]
    return np.asarray(rows, np.float64).reshape(-1, 4)


def footprint_mask(
    footprints: npt.ArrayLike,
    origin: tuple[float, float],
    cell: float,
    shape: tuple[int, int],
    radius: float,
) -> BoolArray:
    """Cells any point of which lies inside a footprint or within ``radius`` of it.

    Args:
        footprints: ``(N, 4)`` rectangles ``[xmin, ymin, xmax, ymax]``.
        origin: world corner of cell ``(0, 0)``.
        cell: cell size in metres.
        shape: ``(nx, ny)``.
        radius: inflation in metres (the robot's radius).

    Returns:
        ``(nx, ny)`` bool mask.
    """
    fp = np.asarray(footprints, np.float64).reshape(-1, 4)
    nx, ny = shape
    mask = np.zeros(shape, np.bool_)
    ox, oy = origin
    for xmin, ymin, xmax, ymax in fp:
        # Only the window the inflated box can reach is tested.
        i0 = max(int(np.floor((xmin - radius - ox) / cell)) - 1, 0)
        i1 = min(int(np.ceil((xmax + radius - ox) / cell)) + 1, nx)
        j0 = max(int(np.floor((ymin - radius - oy) / cell)) - 1, 0)
        j1 = min(int(np.ceil((ymax + radius - oy) / cell)) + 1, ny)
        if i0 >= i1 or j0 >= j1:
            continue
        cx_lo = ox + np.arange(i0, i1) * cell
        cy_lo = oy + np.arange(j0, j1) * cell
        # Signed gaps between cell and box along each axis; negative means they overlap.
        gx = np.maximum(xmin - (cx_lo + cell), cx_lo - xmax)
        gy = np.maximum(ymin - (cy_lo + cell), cy_lo - ymax)
        overlap = (gx[:, None] < 0) & (gy[None, :] < 0)
        near = np.hypot(np.maximum(gx, 0)[:, None], np.maximum(gy, 0)[None, :]) < radius
        mask[i0:i1, j0:j1] |= overlap | near
    return mask


def occupancy_grid(
    scene: Scene,
    cell: float = 0.1,
    robot_radius: float = 0.2,
    z_band: tuple[float, float] = DEFAULT_Z_BAND,
) -> Grid:
    """Occupancy grid of a scene: walls and furniture in the body's height band, inflated.

    The grid spans the xy bounding box of all the scene's boxes, so a scene closed by exterior
    walls has no free cell on its border.

    Args:
        scene: the scene.
        cell: cell size in metres.
        robot_radius: the robot's radius; obstacles grow by it.
        z_band: heights the robot's body occupies.

    Returns:
        The grid.

    Raises:
        ValueError: ``cell`` is not positive, ``robot_radius`` is negative, or the scene has no box.
    """
    if cell <= 0 or robot_radius < 0:
        raise ValueError(f"need cell > 0 and robot_radius >= 0, got {cell=} {robot_radius=}")
    if not scene.boxes:
        raise ValueError("the scene has no boxes; generate it with generate_scene()")
    lo = np.min([b.lo[:2] for b in scene.boxes], axis=0)
    hi = np.max([b.hi[:2] for b in scene.boxes], axis=0)
    shape = (
        max(int(np.ceil((hi[0] - lo[0]) / cell - 1e-9)), 1),
        max(int(np.ceil((hi[1] - lo[1]) / cell - 1e-9)), 1),
    )
    origin = (float(lo[0]), float(lo[1]))
    fp = obstacle_footprints(scene.boxes, z_band)
    return Grid(footprint_mask(fp, origin, cell, shape, robot_radius), origin, cell)


def component_labels(free: BoolArray) -> tuple[IntArray, int]:
    """Label the 4-connected components of the free cells.

    4-connectivity is exactly what an 8-connected search that refuses to cut corners can
    reach. Runs of free cells along each column are merged across neighbouring columns with a
    union-find, which is far faster in Python than a cell-by-cell flood fill.

    Args:
        free: ``(nx, ny)`` bool array.

    Returns:
        ``(labels, count)``: labels are ``-1`` on occupied cells and ``0..count-1`` elsewhere,
        numbered in order of first appearance.
    """
    nx, ny = free.shape
    runs: list[list[tuple[int, int, int]]] = []  # per i: (j_start, j_stop, run_id)
    parent: list[int] = []

    def find(a: int) -> int:
        while parent[a] != a:
            parent[a] = parent[parent[a]]
            a = parent[a]
        return a

    for i in range(nx):
        col = np.concatenate([[0], free[i].astype(np.int8), [0]])
        edges = np.flatnonzero(np.diff(col))
        here = []
        for s, e in zip(edges[0::2].tolist(), edges[1::2].tolist(), strict=True):
            parent.append(len(parent))
            here.append((s, e, len(parent) - 1))
        if i > 0:
            prev, k = runs[-1], 0
            for s, e, rid in here:
                while k < len(prev) and prev[k][1] <= s:
                    k += 1
                m = k
                while m < len(prev) and prev[m][0] < e:
                    ra, rb = find(rid), find(prev[m][2])
                    if ra != rb:
                        parent[max(ra, rb)] = min(ra, rb)
                    m += 1
        runs.append(here)

    labels = np.full((nx, ny), -1, np.int64)
    roots: dict[int, int] = {}
    for i, here in enumerate(runs):
        for s, e, rid in here:
            labels[i, s:e] = roots.setdefault(find(rid), len(roots))
    return labels, len(roots)


def is_connected(free: BoolArray) -> bool:
    """Whether the free cells form one 4-connected component (vacuously true when none)."""
    return component_labels(free)[1] <= 1
