"""The default pipeline of ``troupe run`` as plain data (``config.default_pipeline`` validates it).

Plain data with no imports, so that ``troupe run`` can name its stage classes to the template it
starts at its entry, before its own imports (``troupe.cli.entry``).
"""

from __future__ import annotations

from typing import Any

__all__ = ["DEFAULT_PIPELINE"]

DEFAULT_PIPELINE: dict[str, Any] = {
    "name": "indoor-nav",
    "items": 64,
    "seed_start": 0,
    "slots": 5,  # one replica per stage and a second render (configs/datagen.toml says why)
    "max_attempts": 3,
    "scale_interval_s": 0.5,
    "stages": [
        {
            "name": "load",
            "actor": "troupe.actors.datagen.lifecycle:SceneLoader",
            "replicas": 1,
            "max_replicas": 1,
            "queue": 4,
            "kwargs": {"width": 96, "height": 72},
        },
        {
            "name": "plan",
            "actor": "troupe.actors.datagen.lifecycle:NavPlanner",
            "replicas": 1,
            "max_replicas": 1,
            "queue": 4,
            "kwargs": {"fps": 10, "max_frames": 60},
        },
        {
            "name": "render",
            "actor": "troupe.actors.datagen.lifecycle:RaycastRenderer",
            "replicas": 1,
            "max_replicas": 2,
            "queue": 4,
            "resources": {"cpu": 1, "gpu": 0},
        },
        {
            "name": "store",
            "actor": "troupe.actors.datagen.lifecycle:LeRobotWriter",
            "replicas": 1,
            "max_replicas": 2,
            "queue": 4,
            "kwargs": {"store": "{out}/.troupe/episodes"},
        },
    ],
}
