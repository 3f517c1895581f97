"""Node config tables of encoder actor workers for tests: one ``EncoderActor`` per worker,
the light encoder (seed 3) unless told otherwise, with the actor's other kwargs as given."""

from __future__ import annotations

import json
from typing import Any

__all__ = ["ENCODER_ACTOR", "LIGHT_ENCODER", "encoder_worker", "worker_table"]

ENCODER_ACTOR = "troupe.actors.encoders.encoder_actor:EncoderActor"
LIGHT_ENCODER = "troupe.actors.encoders.light:LightEncoder"


def encoder_worker(name: str, **kwargs: Any) -> str:
    """The ``[[workers]]`` table of worker ``w-{name}`` running the encoder actor ``name``.

    ``kwargs`` are the actor's (``memory_mb``, ``disk_mb``, ``cache_dir``, ``threads``, ...); its
    ``encoder`` is the light encoder and ``encoder_kwargs`` ``{seed = 3}`` unless they say otherwise.
    """
    return worker_table(
        name, ENCODER_ACTOR, **{"encoder": LIGHT_ENCODER, "encoder_kwargs": {"seed": 3}, **kwargs}
    )


def worker_table(name: str, cls: str, **kwargs: Any) -> str:
    """The ``[[workers]]`` table of worker ``w-{name}`` running one actor ``name`` of ``cls``."""
    lines = ["", "[[workers]]", f"name = {_toml(f'w-{name}')}", "", "[[workers.actors]]"]
    lines += [f"name = {_toml(name)}", f"class = {_toml(cls)}"]
    if kwargs:
        lines += ["", "[workers.actors.kwargs]", *(f"{k} = {_toml(v)}" for k, v in kwargs.items())]
    return "\n".join(lines) + "\n"


def _toml(value: Any) -> str:
    """A TOML value: strings (a path, too) as JSON writes them, maps as inline tables."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, dict):
        if not value:
            return "{}"
        return "{ " + ", ".join(f"{k} = {_toml(v)}" for k, v in value.items()) + " }"
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    return json.dumps(str(value))
