"""A training's LR schedule across its runs (``lr_plan``): planned over its first run's steps,
carried by its checkpoints, extended past its end by a new cosine. A larger ``--steps`` had
recomputed the cosine over the new steps: the rate jumped from 0.003 to 0.345 x train.lr at the
resume, and the model was neither the 40-step one nor the 60-step one, without a word."""

from __future__ import annotations

import math

from troupe.actors.training.lr_plan import extended, plan_factor, plan_line, read_plan


def test_a_training_resumed_follows_the_plan_its_checkpoint_carries_whatever_the_steps() -> None:
    plan = extended([[0, 200]], 100)
    assert plan == [[0, 200]]
    factor, one_go = plan_factor(plan, 10, True), plan_factor([[0, 200]], 10, True)
    assert [factor(s) for s in range(200)] == [one_go(s) for s in range(200)]
    assert plan_line(plan, 20, 100, 10, True) == (
        "steps 21-100 follow the training's cosine schedule, which ends at step 200: the learning "
        "rate at step 100 is 0.55 x train.lr, not 0 (a schedule to step 100: --fresh)"
    )


def test_an_extension_is_a_new_cosine_from_the_full_rate_without_warmup() -> None:
    plan = extended([[0, 40]], 60)
    assert plan == [[0, 40], [40, 60]]
    factor = plan_factor(plan, 5, True)
    first = plan_factor([[0, 40]], 5, True)
    assert [factor(s) for s in range(40)] == [first(s) for s in range(40)]  # the past is the past
    assert factor(39) < 0.01 and factor(40) == 1.0
    assert factor(50) == 0.5 * (1 + math.cos(math.pi * 10 / 20)) and factor(60) == 0.0
    assert plan_line(plan, 40, 60, 5, True) == (
        "steps 41-60 extend the training past step 40, where its cosine schedule ended (the "
        "learning rate at 0): they follow a new cosine from train.lr down to 0, a warm restart "
        "(60 steps on one schedule: --fresh)"
    )
    assert plan_line(plan, 50, 60, 5, True) is None  # the extension resumed: nothing new
    assert extended(plan, 80) == [[0, 40], [40, 60], [60, 80]]


def test_a_constant_schedule_goes_on_at_the_rate_and_says_nothing() -> None:
    plan = extended([[0, 40]], 60)
    factor = plan_factor(plan, 5, False)
    assert [factor(s) for s in (0, 4, 39, 40, 59)] == [0.2, 1.0, 1.0, 1.0, 1.0]
    assert plan_line(plan, 40, 60, 5, False) is None


def test_a_training_with_no_plan_is_planned_over_this_run_s_steps() -> None:
    """A new training, or a checkpoint of an older troupe (which carries none): as before."""
    assert extended(None, 60) == [[0, 60]]
    assert plan_line([[0, 60]], 40, 60, 0, True) is None
    for bad in (None, [], [[0, 0]], [[1, 4]], [[0, 4], [5, 8]], [["0", 4]], "x"):
        assert read_plan(bad) is None, bad
    assert read_plan([[0, 4], [4, 8]]) == [[0, 4], [4, 8]]
