"""Import actor classes by path (``package.module:Class``), with errors that say the fix."""

from __future__ import annotations

import importlib

from .actor import Actor
from .errors import ConfigError

__all__ = ["load_actor_class"]


def load_actor_class(path: str) -> type[Actor]:
    """Import ``module:Class`` (or ``module.Class``) and check it is an Actor subclass.

    Raises:
        ConfigError: the module or class does not exist, or is not an Actor.
    """
    module_name, sep, attr = path.partition(":")
    if not sep:
        module_name, _, attr = path.rpartition(".")
    if not module_name or not attr:
        raise ConfigError(f"actor class {path!r} must be written as 'package.module:ClassName'")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError(f"cannot import module {module_name!r} for actor {path!r}: {exc}") from exc
    cls = getattr(module, attr, None)
    if not isinstance(cls, type) or not issubclass(cls, Actor):
        raise ConfigError(f"{path!r} is not an Actor subclass (found {cls!r})")
    return cls
