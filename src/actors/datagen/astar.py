"""A* search on an occupancy grid: 8-connected, octile heuristic, no corner cutting.

A diagonal step is allowed only when both orthogonal cells it passes between are free, so a
path never squeezes between two obstacles that touch at a corner. Steps cost 1 (orthogonal) and
sqrt(2) (diagonal) in cells; the octile distance is then admissible and consistent, and the
first time the goal is popped its cost is optimal.
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

__all__ = ["Cell", "astar", "octile_cost", "octile_distance"]

Cell = tuple[int, int]

_SQRT2 = math.sqrt(2.0)


def octile_distance(a: Cell, b: Cell) -> float:
    """Cost of the cheapest 8-connected path between two cells on an empty grid."""
    dx, dy = abs(a[0] - b[0]), abs(a[1] - b[1])
    return (dx + dy) + (_SQRT2 - 2.0) * min(dx, dy)


def octile_cost(path: Sequence[Cell]) -> float:
    """Cost of a path of adjacent cells (1 per orthogonal step, sqrt(2) per diagonal step).

    Raises:
        ValueError: two consecutive cells are not 8-neighbours.
    """
    total = 0.0
    for (i0, j0), (i1, j1) in itertools.pairwise(path):
        di, dj = abs(i1 - i0), abs(j1 - j0)
        if max(di, dj) != 1:
            raise ValueError(f"cells {(i0, j0)} and {(i1, j1)} are not neighbours")
        total += _SQRT2 if di and dj else 1.0
    return total


def astar(occupied: npt.NDArray[np.bool_], start: Cell, goal: Cell) -> list[Cell] | None:
    """Shortest 8-connected path from ``start`` to ``goal`` through free cells.

    Args:
        occupied: ``(nx, ny)`` bool array, True where the path may not go.
        start: ``(i, j)`` cell.
        goal: ``(i, j)`` cell.

    Returns:
        The cells from ``start`` to ``goal`` inclusive, or None when the goal cannot be reached
        (also when ``start`` or ``goal`` is occupied).

    Raises:
        ValueError: ``start`` or ``goal`` lies outside the grid.
    """
    nx, ny = occupied.shape
    for name, (i, j) in (("start", start), ("goal", goal)):
        if not (0 <= i < nx and 0 <= j < ny):
            raise ValueError(f"{name} {(i, j)} is outside the {nx}x{ny} grid")
    # A one-cell occupied border lets the inner loop skip bounds checks; flat indices and Python
    # lists are several times faster than numpy scalar indexing in this loop.
    w = ny + 2
    blocked = np.ones((nx + 2, w), np.bool_)
    blocked[1:-1, 1:-1] = occupied
    wall = blocked.ravel().tolist()
    s = (start[0] + 1) * w + start[1] + 1
    g = (goal[0] + 1) * w + goal[1] + 1
    if wall[s] or wall[g]:
        return None

    gi, gj = divmod(g, w)
    inf = math.inf
    cost = [inf] * len(wall)
    came = [-1] * len(wall)
    done = bytearray(len(wall))
    cost[s] = 0.0
    straight = (w, -w, 1, -1)
    # (offset, the two orthogonal offsets it passes between)
    diagonal = ((w + 1, w, 1), (w - 1, w, -1), (-w + 1, -w, 1), (-w - 1, -w, -1))
    k = _SQRT2 - 2.0

    def h(n: int) -> float:
        ni, nj = divmod(n, w)
        dx, dy = abs(ni - gi), abs(nj - gj)
        return dx + dy + k * (dx if dx < dy else dy)

    # Ties on f prefer the smaller h (deeper nodes), then the smaller index: deterministic.
    hs = h(s)
    heap: list[tuple[float, float, int]] = [(hs, hs, s)]
    while heap:
        _, _, n = heapq.heappop(heap)
        if done[n]:
            continue
        if n == g:
            break
        done[n] = 1
        cn = cost[n]
        for off in straight:
            m = n + off
            if wall[m] or done[m]:
                continue
            c = cn + 1.0
            if c < cost[m]:
                cost[m] = c
                came[m] = n
                hm = h(m)
                heapq.heappush(heap, (c + hm, hm, m))
        for off, a, b in diagonal:
            m = n + off
            if wall[m] or done[m] or wall[n + a] or wall[n + b]:
                continue
            c = cn + _SQRT2
            if c < cost[m]:
                cost[m] = c
                came[m] = n
                hm = h(m)
                heapq.heappush(heap, (c + hm, hm, m))
    else:
        return None

    path: list[Cell] = []
    n = g
    while n != -1:
        i, j = divmod(n, w)
        path.append((i - 1, j - 1))
        n = came[n]
    path.reverse()
    return path
