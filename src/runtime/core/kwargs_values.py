"""The values of an actor's kwargs, checked before any of its processes starts.

A config names kwargs by name (``loading.kwargs_problem`` checks those); a wrong value (a string
for an int, a negative size) used to pass every check and stop each replica as it started, after
the run had made its output directory. Here the values are checked where the class is imported
anyway (a run's template, or the check's child), two ways:

- against the constructor's annotations, with pydantic in lax mode: ``60`` passes for a float,
  a list for a tuple, ``"sixty"`` does not for an int, nor ``"60"`` (the constructor would be
  given the string: TOML has numbers, and a quoted one is a mistake). An annotation that cannot
  be resolved or turned into a schema (a torch type, say) is skipped: the replica will say;
- by the class's own ``check_kwargs`` (``Actor.check_kwargs``), for what an annotation cannot say
  (an image size must be positive).
"""

from __future__ import annotations

import json
import typing
from collections.abc import Mapping
from typing import Any

from pydantic import TypeAdapter, ValidationError

from .config_messages import short_repr

__all__ = ["json_safe", "kwargs_values_problem"]


def json_safe(kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """The kwargs whose values travel as JSON to the process that checks them (a TOML date
    does not: it is left to the replica)."""
    safe = {}
    for name, value in kwargs.items():
        try:
            json.dumps(value)
        except (TypeError, ValueError):
            continue
        safe[name] = value
    return safe


def kwargs_values_problem(cls: type, kwargs: Mapping[str, Any]) -> str | None:
    """Why ``cls(**kwargs)`` would refuse these values; None when nothing here says so."""
    try:
        hints = typing.get_type_hints(cls.__init__)  # type: ignore[misc]
    except Exception:  # a forward reference it cannot resolve: nothing to check against
        hints = {}
    for name, value in kwargs.items():
        hint = hints.get(name)
        if hint is None:
            continue
        try:
            adapter: TypeAdapter[Any] = TypeAdapter(hint)
        except Exception:  # a type pydantic has no schema for
            continue
        try:
            taken = adapter.validate_python(value)
        except ValidationError as exc:
            return f"kwargs.{name} = {short_repr(value)}: {exc.errors()[0]['msg']}"
        if isinstance(value, str) and isinstance(taken, int | float):  # bool is an int
            # Lax mode reads "60" as 60; the constructor would get the string all the same.
            takes = _named(hint)
            return f"kwargs.{name} = {short_repr(value)}: a string, where the constructor takes {takes}"
    check = getattr(cls, "check_kwargs", None)
    if callable(check):
        try:
            check(dict(kwargs))
        except (ValueError, TypeError) as exc:  # ConfigError is a ValueError
            return str(exc)
    return None


def _named(hint: Any) -> str:
    return hint.__name__ if isinstance(hint, type) else str(hint).replace("typing.", "")
