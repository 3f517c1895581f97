"""The learning-rate schedule of a training, across its runs: planned once, extended past its end.

A training's schedule is planned over the steps its first run asks (``train.steps`` or
``--steps``): ``train.warmup_steps`` of linear warmup, then a cosine to 0 at that step (or
``train.lr`` on, with ``train.schedule = "constant"``). Every checkpoint carries the plan, so a
run resumed from it follows the same one whatever ``--steps`` it asks: an interrupted and
resumed training is the training run in one go, and a run asking fewer steps stops at a point
of it (it had squeezed the cosine under the steps asked, silently).

Steps past the plan's end (a larger ``--steps``, as ``already complete`` advises) extend it by a
segment from that end to the steps asked: with cosine, a new cosine from ``train.lr`` down to 0
over the segment (a warm restart: the plan annealed the rate to 0, and training on at 0 would
change nothing), without warmup (the optimizer's moments are warm); with constant,
``train.lr``. The run says so in one line (:func:`plan_line`). The extended run is not a run of
that many steps in one go: that is ``--fresh``.

A plan is a list of segments ``[from, to]`` of scheduler steps (the LR of step ``s + 1`` is the
factor at ``s``): the first from 0, each next from the end of the one before.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

__all__ = ["extended", "plan_factor", "plan_line", "read_plan"]

Plan = list[list[int]]


def read_plan(saved: Any) -> Plan | None:
    """The plan a checkpoint carries; None for one that carries none (an older troupe's) or a
    malformed one."""
    if not isinstance(saved, list | tuple) or not saved:
        return None
    plan: Plan = []
    for segment in saved:
        if not (isinstance(segment, list | tuple) and len(segment) == 2):
            return None
        start, end = segment
        if not all(isinstance(v, int) and not isinstance(v, bool) for v in (start, end)):
            return None
        if start != (plan[-1][1] if plan else 0) or end <= start:
            return None
        plan.append([start, end])
    return plan


def extended(plan: Plan | None, steps: int) -> Plan:
    """``plan`` (None: a training that starts now, or whose checkpoint carries none) with a
    segment to ``steps`` where they go past its end."""
    if plan is None:
        return [[0, steps]]  # a checkpoint of an older troupe: its plan was this run's steps, as then
    end = plan[-1][1]
    return [*plan, [end, steps]] if steps > end else [list(s) for s in plan]


def plan_factor(plan: Sequence[Sequence[int]], warmup: int, cosine: bool) -> Callable[[int], float]:
    """The LR factor of scheduler step ``s`` under ``plan`` (see the module)."""
    first_end = plan[0][1]

    def factor(s: int) -> float:
        start, end = next((seg for seg in reversed(plan) if seg[0] <= s), plan[0])
        if start == 0:  # the plan's first segment: warmup, then the cosine to its end
            if s < warmup:
                return (s + 1) / warmup
            if not cosine:
                return 1.0
            done = min(1.0, (s - warmup) / max(1, first_end - warmup))
        else:  # an extension: no warmup
            if not cosine:
                return 1.0
            done = min(1.0, (s - start) / max(1, end - start))
        return 0.5 * (1.0 + math.cos(math.pi * done))

    return factor


def plan_line(plan: Plan, resumed_at: int, steps: int, warmup: int, cosine: bool) -> str | None:
    """What a run resumed at step ``resumed_at`` to ``steps`` under ``plan`` (extended) says of its
    schedule, where it is not the one a run of ``steps`` in one go follows; None where it is."""
    if not cosine or resumed_at == 0 or resumed_at >= steps:
        return None
    start, end = plan[-1]
    if start >= resumed_at and start > 0:  # this run's steps extend the plan
        ends = "ended" if resumed_at == start else "ends"
        return (
            f"steps {start + 1}-{end} extend the training past step {start}, where its cosine "
            f"schedule {ends} (the learning rate at 0): they follow a new cosine from train.lr down "
            f"to 0, a warm restart ({end} steps on one schedule: --fresh)"
        )
    if steps < end:
        rate = plan_factor(plan, warmup, cosine)(steps - 1)
        return (
            f"steps {resumed_at + 1}-{steps} follow the training's cosine schedule, which ends at "
            f"step {end}: the learning rate at step {steps} is {rate:.2f} x train.lr, not 0 (a "
            f"schedule to step {steps}: --fresh)"
        )
    return None
