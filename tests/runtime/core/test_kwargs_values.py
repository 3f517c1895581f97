"""The values of an actor's kwargs, checked before any process starts (``kwargs_values``): what
the constructor's annotations refuse, and what the class's own ``check_kwargs`` refuses; what
they take is never refused (60 for a float, a TOML list for a tuple, a type pydantic has no
schema for)."""

from __future__ import annotations

import datetime
from typing import Any

import pytest

from troupe.actors.datagen.lifecycle import LeRobotWriter, NavPlanner, RaycastRenderer, SceneLoader
from troupe.runtime import Actor
from troupe.runtime.core.kwargs_values import json_safe, kwargs_values_problem
from troupe.runtime.errors import ConfigError


class Opaque:
    """A type pydantic has no schema for."""


class Typed(Actor):
    def __init__(
        self,
        count: int = 1,
        rate: float = 1.0,
        name: str = "x",
        size: tuple[int, int] = (1, 1),
        flag: bool = False,
        thing: Opaque | None = None,
        loose: Any = None,
    ) -> None:
        pass


class Checked(Actor):
    @classmethod
    def check_kwargs(cls, kwargs: dict[str, Any]) -> None:
        if kwargs.get("size", 1) < 1:
            raise ConfigError(f"size must be at least 1, got {kwargs['size']}")

    def __init__(self, size: int = 1) -> None:
        pass


@pytest.mark.parametrize(
    "kwargs",
    [
        {"count": 3, "rate": 60, "name": "n", "size": [2, 3], "flag": True},
        {"thing": "not checked", "loose": {"any": ["thing"]}},
        {},
    ],
)
def test_values_the_constructor_takes_pass(kwargs: dict[str, Any]) -> None:
    assert kwargs_values_problem(Typed, kwargs) is None


@pytest.mark.parametrize(
    ("kwargs", "said"),
    [
        ({"count": "sixty"}, "kwargs.count = 'sixty': Input should be a valid integer"),
        ({"count": "60"}, "kwargs.count = '60': a string, where the constructor takes int"),
        ({"rate": "fast"}, "kwargs.rate = 'fast': Input should be a valid number"),
        ({"flag": "true"}, "kwargs.flag = 'true': a string, where the constructor takes bool"),
        ({"name": 5}, "kwargs.name = 5: Input should be a valid string"),
        ({"size": [1, 2, 3]}, "kwargs.size = [1, 2, 3]: Tuple should have at most 2 items"),
    ],
)
def test_a_value_the_annotation_refuses_is_named_with_the_reason(kwargs: dict[str, Any], said: str) -> None:
    problem = kwargs_values_problem(Typed, kwargs)
    assert problem is not None and problem.startswith(said), problem


def test_the_class_check_refuses_what_no_annotation_can_say() -> None:
    assert kwargs_values_problem(Checked, {"size": 0}) == "size must be at least 1, got 0"
    assert kwargs_values_problem(Checked, {"size": 2}) is None


@pytest.mark.parametrize(
    ("cls", "kwargs", "said"),
    [
        (SceneLoader, {"width": -96}, "image size must be positive, got -96x72"),
        (NavPlanner, {"max_frames": 0}, "kwargs.max_frames must be at least 1, got 0"),
        (NavPlanner, {"speed": 0.0}, "kwargs.speed must be > 0, got 0.0"),
        (
            NavPlanner,
            {"max_frames": 20, "min_frames": 30},
            "kwargs.min_frames (30) must not exceed max_frames (20)",
        ),
        (NavPlanner, {"min_length": -1.0}, "kwargs.min_length must be >= 0 (metres), got -1.0"),
        (NavPlanner, {"min_frames": True}, "kwargs.min_frames must be a whole number, got True"),
        (RaycastRenderer, {"threads": -1}, "kwargs.threads must be at least 0, got -1"),
        (RaycastRenderer, {"device": "gpu"}, "kwargs.device = 'gpu': "),
        (LeRobotWriter, {"store": "s", "max_pending": 0}, "kwargs.max_pending must be at least 1, got 0"),
    ],
)
def test_the_data_generation_stages_refuse_values_they_cannot_run_with(
    cls: type[Actor], kwargs: dict[str, Any], said: str
) -> None:
    problem = kwargs_values_problem(cls, kwargs)
    assert problem is not None and problem.startswith(said), problem


def test_a_planner_with_fewer_frames_than_its_default_shortest_starts_and_plans() -> None:
    """``max_frames = 5`` failed every replica's start ("PlanConfig needs 1 <= min_frames <=
    max_frames, got 10 and 5"), a bound no kwarg could set: the shortest follows the longest."""
    assert kwargs_values_problem(NavPlanner, {"max_frames": 5}) is None
    assert NavPlanner(max_frames=5).config.min_frames == 5
    assert NavPlanner(max_frames=60, min_frames=3, min_length=0.5).config.min_length == 0.5


def test_the_default_pipelines_kwargs_pass() -> None:
    from troupe.actors.datagen.config import default_pipeline
    from troupe.runtime.core.loading import load_actor_class

    for stage in default_pipeline().stages:
        assert kwargs_values_problem(load_actor_class(stage.actor), stage.kwargs) is None, stage.name


def test_only_values_that_travel_as_json_are_checked() -> None:
    """A TOML date cannot reach the checking process: it is left to the replica."""
    assert json_safe({"n": 1, "when": datetime.date(2026, 12, 2), "s": "x"}) == {"n": 1, "s": "x"}
