"""The node config of encoder actors for a test cluster (``troupe_cluster``): one worker per
name, hosting an ``EncoderActor`` of that name with the given kwargs (TOML lines)."""

from __future__ import annotations

__all__ = ["encoder_workers"]

_WORKER = """
[[workers]]
name = "w-{name}"

[[workers.actors]]
name = "{name}"
class = "troupe.actors.encoders.encoder_actor:EncoderActor"

[workers.actors.kwargs]
{kwargs}
"""


def encoder_workers(*names: str, kwargs: str) -> str:
    """``[[workers]]`` tables, one per name, whose encoder actors take ``kwargs``."""
    return "".join(_WORKER.format(name=name, kwargs=kwargs.strip()) for name in names)
